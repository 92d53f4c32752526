"""GPU-only checks (run by bench/gpu_check.sh on a lent H100/H200): the compiled kernel, the
direct launch, real streams and events, the exact step's host copies, CUDA-graph capture,
and what the profiler sees per step. Each CUDA-side finding of the stream-order tests
(tests/relay/test_stream_order.py, on a CPU stand-in) is checked here on real streams.

These test the relay's correctness wherever it can run, so exact host lengths on CUDA -
which spec_fused hands to SGLang until a GPU measures them level (spec_fused/measured.py)
- are relayed here with ``SPEC_FUSED_UNMEASURED=1``; the gate itself is tested last."""

import random
from types import SimpleNamespace

import pytest
import torch

# Each test has a limit of its own (pytest-timeout, carried to the GPU as a wheel), by the
# "thread" method: a test hung in a CUDA call never returns to Python, so "signal"'s SIGALRM
# handler would never run; the timer thread dumps every stack and ends the process. The
# outcomes before it are on disk already (bench/gpu_check.sh runs pytest -v, unbuffered).
TEST_TIMEOUT_S = 30
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    pytest.mark.timeout(TEST_TIMEOUT_S, method="thread"),
]

from spec_fused import log  # noqa: E402
from spec_fused import relay as relay_mod  # noqa: E402
from spec_fused.integration import sglang_patch, war_barrier  # noqa: E402
from spec_fused.kernels import backend as backend_mod  # noqa: E402
from spec_fused.kernels import canary as canary_mod  # noqa: E402
from spec_fused.kernels import publish_gather as kernel  # noqa: E402
from spec_fused.kernels.checks import PoisonedSlotError  # noqa: E402
from spec_fused.kernels.publish_gather import publish_gather, publish_gather_reference  # noqa: E402
from spec_fused.kernels.step_launcher import StepLauncher  # noqa: E402
from spec_fused.tools.traces import TraceConfig, decode_batch, make_future_map, run_trace  # noqa: E402

DEV = torch.device("cuda")


@pytest.fixture(autouse=True)
def relay_unmeasured(monkeypatch):
    monkeypatch.setenv("SPEC_FUSED_UNMEASURED", "1")


@pytest.fixture
def patched():
    log.reset()
    sglang_patch.apply()
    yield
    sglang_patch.remove()


# ----------------------------------------------------------------------- the kernel


def test_compiled_kernel_matches_reference_across_sizes(kernel_launches):
    assert backend_mod.backend_for(DEV) == "triton"
    g = torch.Generator().manual_seed(0)
    cases = [
        (1, 1, 1),
        (4096, 1, 0),
        (4096, 256, 256),
        (65536, 4096, 2048),
        (1 << 20, 70000, 50000),
        (17, 0, 5),
        (100, 3000, 0),
    ]
    for pool, n, m in cases:
        buf = torch.randint(0, 1 << 40, (pool,), generator=g)
        slots = torch.randperm(pool, generator=g)
        pub, vals = slots[:m], torch.randint(0, 1 << 30, (m,), generator=g, dtype=torch.int32)
        gat = torch.randint(0, pool, (n,), generator=g)
        want = publish_gather_reference(buf.clone(), gat, pub, vals)
        dbuf = buf.to(DEV)
        got = publish_gather(dbuf, gat.to(DEV), pub.to(DEV), vals.to(DEV))
        torch.cuda.synchronize()
        assert torch.equal(got.seq_lens.cpu(), want.seq_lens), (pool, n, m)
        assert int(got.seq_lens_sum) == int(want.seq_lens_sum)
        ref_buf = buf.clone()
        ref_buf[pub] = vals.long()
        assert torch.equal(dbuf.cpu(), ref_buf)
    assert kernel_launches.count == len(cases)


def test_a_row_reaches_the_host_in_one_copy_and_host_memory_is_refused(kernel_launches):
    """The exact step's launch writes a device row ``[*lens, sum]``; one copy of it is the
    host lengths. Host memory, pinned or not, is refused before anything is written."""
    buf = torch.arange(1000, device=DEV)
    pg = StepLauncher(buf)
    host_idx = torch.tensor([5, 7, 999], dtype=torch.int64)
    staged = pg.stage_host_indices(host_idx, host_idx.to(DEV))
    assert staged.is_pinned()
    gi = pg.upload_host_indices(staged)
    assert gi.device == buf.device
    row = pg.launch(gi, torch.tensor([7], device=DEV), torch.tensor([70], device=DEV), True)
    pg.row_to_host(row)
    torch.cuda.current_stream().synchronize()
    lens, total = pg.host_lengths(3)
    assert (lens.tolist(), total) == ([5, 70, 999], 1074) and kernel_launches.count == 1
    for host in (host_idx.pin_memory(), host_idx):
        with pytest.raises(ValueError, match="gather_indices is on cpu"):
            publish_gather(buf, host)
    assert kernel_launches.count == 1


def test_poison_on_gpu_is_reported_by_the_launch_that_gathers_it():
    """Debug mode's consume-once check on CUDA: the first launch that gathers an unpublished
    slot (2, still -1) raises ``PoisonedSlotError(slot=2)``, after the sync that reads the
    kernel's flag. Synchronous on purpose: SGLang's check (``_DEBUG_ASSERT``) is a device
    assert (``torch._assert_async``), which kills the CUDA context and names no slot; ours
    costs a sync per step in debug mode only, names the slot, and the context lives on."""
    buf = torch.full((64,), -1, dtype=torch.int64, device=DEV)
    pg = StepLauncher(buf, poison=True)
    with pytest.raises(PoisonedSlotError) as info:
        pg.launch_checked(
            torch.tensor([1, 2], device=DEV),
            torch.tensor([1], device=DEV),
            torch.tensor([5], device=DEV),
            False,
        )
    assert info.value.slot == 2
    out = pg.launch_checked(
        torch.tensor([3], device=DEV),
        torch.tensor([3], device=DEV),
        torch.tensor([7], device=DEV),
        False,
    )
    assert out.cpu().tolist() == [7]  # the flag was reset, and the context serves on


# ----------------------------------------------------------------------- the direct launch


def test_the_canary_proves_the_direct_launch_here():
    backend_mod._verdicts.clear()
    verdict = canary_mod.canary(DEV)
    assert verdict.backend == "triton" and verdict.direct, verdict.describe()
    assert not verdict.notes and verdict.cases == 2 * len(canary_mod.CASES)


def test_bound_direct_launch_matches_the_reference_one_launch_per_step(kernel_launches):
    g = torch.Generator().manual_seed(5)
    for pool, n, m, row, vdtype in [
        (4096, 1, 1, False, torch.int64),
        (4096, 256, 256, True, torch.int32),
        (65536, 1024, 1100, True, torch.int64),
        (4096, 3000, 0, False, torch.int64),
    ]:
        buf = torch.randint(0, 1 << 40, (pool,), generator=g)
        ref = buf.clone()
        pg = StepLauncher(buf.to(DEV))
        kernel_launches.reset()
        steps = 6
        for step in range(steps):
            slots = torch.randperm(pool, generator=g)
            pub = slots[:m]
            vals = torch.randint(0, 1 << 30, (m,), generator=g, dtype=vdtype)
            gat = torch.randint(0, pool, (n,), generator=g)
            want = publish_gather_reference(ref, gat, pub if m else None, vals if m else None)
            out = pg.launch(
                gat.to(DEV), pub.to(DEV) if m else None, vals.to(DEV) if m else None, row
            )
            torch.cuda.synchronize()
            assert torch.equal(out[:n].cpu(), want.seq_lens), (pool, n, m, step)
            if row:
                assert int(out[n]) == int(want.seq_lens_sum)
        assert torch.equal(pg.buf.cpu(), ref)
        assert pg._direct is not None and pg._direct.blocked is None, pg._direct.blocked
        assert kernel_launches.count == steps and kernel_launches.direct == steps - 1


def test_an_empty_publish_keeps_the_direct_launch(kernel_launches):
    pg = StepLauncher(torch.zeros(64, dtype=torch.int64, device=DEV))
    gi, empty = torch.tensor([1, 2], device=DEV), torch.empty(0, dtype=torch.int64, device=DEV)
    for _ in range(4):
        pg.launch(gi, empty, empty, False)
    torch.cuda.synchronize()
    assert kernel_launches.count == 4 and kernel_launches.direct == 3


def test_a_launch_hook_and_a_late_pre_run_hook_take_the_normal_path(kernel_launches):
    from triton import knobs

    pg = StepLauncher(torch.zeros(64, dtype=torch.int64, device=DEV))
    idx = torch.tensor([1, 2], device=DEV)
    pg.launch(idx, idx, idx + 1, False)
    seen = []
    hook = lambda *a, **k: seen.append(1)  # noqa: E731 - as a profiler's
    knobs.runtime.launch_enter_hook.add(hook)
    try:
        kernel_launches.reset()
        out = pg.launch(idx, idx, idx + 2, False)
    finally:
        knobs.runtime.launch_enter_hook.remove(hook)
    assert out.cpu().tolist() == [3, 4] and seen and kernel_launches.direct == 0
    pre = []
    kernel._publish_gather_kernel.add_pre_run_hook(lambda *a, **k: pre.append(1))
    try:
        kernel_launches.reset()
        out = pg.launch(idx, idx, idx + 3, False)
    finally:
        kernel._publish_gather_kernel.pre_run_hooks.clear()
    assert out.cpu().tolist() == [4, 5] and pre and kernel_launches.direct == 0
    kernel_launches.reset()
    pg.launch(idx, idx, idx + 4, False)
    assert kernel_launches.direct == 1


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_a_launch_from_another_current_device_runs_on_the_buffers():
    """Needs two GPUs, so the lent one-GPU machine skips it; the switch itself is held on
    a CPU stand-in (tests/test_direct_launch.py)."""
    pg = StepLauncher(torch.zeros(16, dtype=torch.int64, device="cuda:0"))
    idx = torch.tensor([1, 2], device="cuda:0")
    with torch.cuda.device(1):
        out = pg.launch(idx, idx, idx + 5, False)
    torch.cuda.synchronize(0)
    assert out.device.index == 0 and out.cpu().tolist() == [6, 7]


def test_tritons_own_launch_error_goes_down_the_reference_rung(patched, monkeypatch):
    """A pageable CPU pointer makes Triton's launcher raise ValueError: the relay takes it
    for the backend's failure and the torch reference serves, with the right lengths."""
    cfg = TraceConfig(pool=32)
    fm = make_future_map("EAGLE", cfg, device=DEV, needs_cpu_seq_lens=False)
    fm.publish(torch.tensor([1, 2], device=DEV), torch.tensor([10, 20], device=DEV))
    relay = relay_mod.relay_for(fm)

    def pageable(gi, pi, pv, row):
        out = relay.launcher.buf.new_empty(gi.numel())  # the launcher refuses, never writes
        buf, out_sum = relay.launcher.buf, relay.launcher.out_sum
        kernel.launch_triton(kernel.Args(buf, gi.cpu(), pi, pv, out, out_sum))
        return out

    relay.launcher.launch = pageable
    batch = decode_batch([1, 2], cfg, device=DEV)
    fm.resolve_seq_lens_cpu(batch)
    assert batch.seq_lens.cpu().tolist() == [10, 20]
    assert relay.launcher.backend == "reference"


# ----------------------------------------------------------------------- streams and events


@pytest.mark.parametrize("algo", ["EAGLE", "DFLASH"])
@pytest.mark.parametrize("needs_cpu", [True, False])
def test_traces_on_real_streams_match_upstream(algo, needs_cpu):
    cfg = TraceConfig(
        seed=7, steps=60, pool=512, max_running=64, p_mixed=0.2, verify_cycles=2_000_000
    )
    want = run_trace(make_future_map(algo, cfg, device=DEV, needs_cpu_seq_lens=needs_cpu), cfg)
    sglang_patch.apply()
    try:
        fm = make_future_map(algo, cfg, device=DEV, needs_cpu_seq_lens=needs_cpu)
        got = run_trace(fm, cfg)
        launcher = relay_mod.relay_for(fm).launcher
        assert launcher.backend == "triton" and launcher._direct.blocked is None
    finally:
        sglang_patch.remove()
    for step, (g, w) in enumerate(zip(got, want, strict=True)):
        assert g == w, f"step {step} ({w.kind}) differs"


def test_the_private_stream_is_none_of_sglangs_and_high_priority(patched):
    cfg = TraceConfig(pool=64)
    schedule = torch.cuda.Stream()
    with torch.cuda.stream(schedule):
        fm = make_future_map("EAGLE", cfg, device=DEV)
        fm.publish(torch.tensor([1], device=DEV), torch.tensor([5], device=DEV))
        fm.resolve_seq_lens_cpu(decode_batch([1], cfg, device=DEV))
    relay = relay_mod.relay_for(fm)
    assert relay.relay_stream.cuda_stream not in (
        schedule.cuda_stream,
        fm.fwd_prepare_d2h_stream.cuda_stream,
    )
    assert relay.relay_stream.priority < 0


def _publish_mid_forward(fm, forward, slots):
    """Forward N on ``forward``: its publish of ``slots`` (lengths slot + 10) early, then a
    long tail (~1 s); the event that the forward has ended."""
    idx = torch.tensor(slots, device=DEV)
    torch.cuda.synchronize()
    with torch.cuda.stream(forward):
        torch.cuda._sleep(1_000_000)
        fm.publish(idx, idx + 10)
        torch.cuda._sleep(2_000_000_000)  # the forward's long tail (~1 s)
        done = torch.cuda.Event()
        done.record()
    return done


def test_a_mixed_chunk_landing_is_gated_on_the_publish_not_the_forward(patched):
    """The pending publish of a mixed-chunk step lands on the private stream behind
    ``publish_ready``: the event completes at the publish point while the forward's long
    tail (and the schedule stream, which waits for all of it) is still running."""
    cfg = TraceConfig(pool=64)
    schedule, forward = torch.cuda.Stream(), torch.cuda.Stream()
    fm = make_future_map("EAGLE", cfg, device=DEV)
    done = _publish_mid_forward(fm, forward, [1, 2])
    schedule.wait_stream(forward)  # the coarse WAR barrier: all of the forward
    with torch.cuda.stream(schedule):
        fm.resolve_seq_lens_cpu(SimpleNamespace(spec_info=None))  # a mixed-chunk step
    fm.publish_ready.synchronize()  # what SGLang's mixed-tail resolve blocks the host on
    assert not done.query(), "the landing waited for the forward (the WAR barrier)"
    torch.cuda.synchronize()
    assert fm.__dict__["new_seq_lens_buf"][1:3].cpu().tolist() == [11, 12]


def test_a_bound_steps_exact_read_waits_for_the_publish_not_the_forward(patched):
    """The partition guard's replan reads the exact lengths in the resolve stream's order
    (``cuda_ops.read_later``), from the forward stream the plan runs on: it returns once
    the publish has landed, while the forward's long tail still runs."""
    from spec_fused.caps import HostBound, decide

    cfg = TraceConfig(pool=64)
    schedule, forward = torch.cuda.Stream(), torch.cuda.Stream()
    steps = []
    bound = HostBound("test", max_bs=8, window=4, expect=steps.append)
    fm = make_future_map("DFLASH", cfg, device=DEV, needs_cpu_seq_lens=True)
    fm.__dict__[relay_mod.CAPS_ATTR] = decide(
        "DFLASH", needs_cpu_seq_lens=True, env={}, host_bound=bound
    )
    done = _publish_mid_forward(fm, forward, [1, 2])
    batch = decode_batch([1, 2], cfg, device=DEV)
    batch.forward_mode = SimpleNamespace(is_decode=lambda: True)
    batch.seq_lens_cpu = torch.tensor([9, 10])  # the host's committed lengths
    with torch.cuda.stream(schedule):
        fm.resolve_seq_lens_cpu(batch)
    assert batch.seq_lens_cpu is None and steps[-1] is not None
    with torch.cuda.stream(forward):  # where the plan runs
        assert steps[-1].exact.tolist() == [15, 16]
    assert not done.query(), "the exact read waited for the forward"
    assert steps[-1].lower.tolist() == [13, 14]
    torch.cuda.synchronize()


def test_a_publish_under_graph_capture_is_sglangs_own_and_replays(patched):
    """SGLang (<= 0.5.23) never publishes under capture; were one to, the relay hands it
    to SGLang's own publish (a deferred write would never replay): the captured scatter
    lands at every replay, and the relay stays."""
    cfg = TraceConfig(pool=64)
    fm = make_future_map("EAGLE", cfg, device=DEV, needs_cpu_seq_lens=False)
    relay = relay_mod.relay_for(fm)
    idx = torch.tensor([3, 4], device=DEV)
    vals = torch.zeros(2, dtype=torch.int64, device=DEV)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fm.publish(idx, vals)
    assert relay.pending is None and fm.__dict__[relay_mod.RELAY_ATTR] is relay
    for k in range(3):
        vals.copy_(torch.tensor([100 + k, 200 + k]))
        graph.replay()
        torch.cuda.synchronize()
        assert fm.__dict__["new_seq_lens_buf"][3:5].cpu().tolist() == [100 + k, 200 + k]


def test_the_direct_launch_of_a_row_can_be_captured():
    pg = StepLauncher(torch.zeros(256, dtype=torch.int64, device=DEV))
    gi = torch.zeros(16, dtype=torch.int64, device=DEV)
    pi = torch.zeros(16, dtype=torch.int64, device=DEV)
    pv = torch.zeros(16, dtype=torch.int32, device=DEV)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        pg.launch(gi, pi, pv, True)  # checked once, bound
        pg.launch(gi, pi, pv, True)  # direct
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = pg.launch(gi, pi, pv, True)
    for seed in range(3):
        r = random.Random(seed)
        slots = r.sample(range(256), 32)
        gi.copy_(torch.tensor(slots[8:24]))
        pi.copy_(torch.tensor(slots[:16]))
        pv.copy_(torch.tensor([r.randrange(1 << 20) for _ in range(16)], dtype=torch.int32))
        want = publish_gather_reference(pg.buf.cpu(), gi.cpu(), pi.cpu(), pv.cpu())
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out[:16].cpu(), want.seq_lens)
        assert int(out[16]) == int(want.seq_lens_sum)


def test_the_barrier_read_from_the_patched_scheduler_on_a_gpu_relay(tmp_path, monkeypatch):
    """The scheduler's decision with the relay on CUDA: the installed release's own
    ``_apply_war_barrier`` (read from its source), the whole matrix."""
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
    from support.upstream_rules import NEEDS_CPU, check_barrier_matrix, light_scheduler

    from spec_fused.integration.hooks import PatchSet

    module = light_scheduler(tmp_path)
    patches = PatchSet()
    war_barrier.patch(patches, module, sglang_patch._sglang_version())
    sglang_patch.apply()
    try:
        for algorithm in (SpeculativeAlgorithm.EAGLE, SpeculativeAlgorithm.DFLASH):
            for needs_cpu in NEEDS_CPU:
                check_barrier_matrix(
                    module.Scheduler,
                    algorithm,
                    needs_cpu=needs_cpu,
                    monkeypatch=monkeypatch,
                    device=DEV,
                    gates=(True,),
                )
    finally:
        sglang_patch.remove()
        patches.undo()


# ----------------------------------------------------------------------- what a step costs


def _profile_steps(step, steps=8):
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    counts = {"kernels": 0, "d2h": 0, "host_syncs": 0}
    for e in prof.events():
        name = e.name
        if "Memcpy DtoH" in name:
            counts["d2h"] += 1
        elif name in ("cudaStreamSynchronize", "cudaEventSynchronize"):
            counts["host_syncs"] += 1
        elif (
            getattr(e, "device_type", None) is not None
            and str(e.device_type).endswith("CUDA")
            and "Memcpy" not in name
            and "Memset" not in name
        ):
            counts["kernels"] += 1
    return {k: v / steps for k, v in counts.items()}


@pytest.mark.parametrize("needs_cpu", [True, False])
def test_the_profiler_sees_one_kernel_per_step_and_no_pool_copy(needs_cpu, monkeypatch):
    cfg = TraceConfig(pool=65536)
    idx = torch.randperm(cfg.pool - 1)[:64].add_(1)
    vals = torch.randint(1, 1000, (64,))

    def stepper(fm):
        fi, fv = idx.to(DEV), vals.to(DEV)

        def step():
            fm.publish(fi, fv)
            batch = decode_batch(idx.tolist(), cfg, device=DEV)
            batch.spec_info.future_indices = fi
            fm.resolve_seq_lens_cpu(batch)

        return step

    upstream = _profile_steps(
        stepper(make_future_map("EAGLE", cfg, device=DEV, needs_cpu_seq_lens=needs_cpu))
    )
    rows, real_row_to_host = [], StepLauncher.row_to_host

    def row_to_host(pg, row):
        rows.append(row.numel())
        real_row_to_host(pg, row)

    monkeypatch.setattr(StepLauncher, "row_to_host", row_to_host)
    sglang_patch.apply()
    try:
        ours = _profile_steps(
            stepper(make_future_map("EAGLE", cfg, device=DEV, needs_cpu_seq_lens=needs_cpu))
        )
    finally:
        sglang_patch.remove()
    assert ours["kernels"] == 1, ours
    # exact: one copy down of the row [*lens, sum] (65 values), never the 65,536-slot pool
    assert ours["d2h"] == (1 if needs_cpu else 0), ours
    assert set(rows) == ({65} if needs_cpu else set()), rows
    assert ours["host_syncs"] == (1 if needs_cpu else 0), ours  # the private stream's event
    assert upstream["kernels"] > ours["kernels"], upstream
    if needs_cpu:
        assert upstream["d2h"] >= 1 and upstream["host_syncs"] >= 1, upstream


@pytest.mark.parametrize("algo", ["EAGLE", "DFLASH"])
def test_the_gpu_only_path_never_syncs(patched, algo):
    """PyTorch's own detector: no synchronizing op on the relay's GPU-only path."""
    cfg = TraceConfig(pool=256)
    fm = make_future_map(algo, cfg, device=DEV, needs_cpu_seq_lens=False)
    fi = torch.tensor([1, 2, 3], device=DEV)
    fm.publish(fi, fi + 10)
    fm.resolve_seq_lens_cpu(decode_batch([1, 2, 3], cfg, device=DEV))  # compile, bind
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for k in range(5):
            fm.publish(fi, fi + 20 + k)
            batch = SimpleNamespace(
                spec_info=SimpleNamespace(future_indices=fi),
                req_pool_indices_cpu=None,
                seq_lens=None,
                seq_lens_cpu=None,
                seq_lens_sum=None,
            )
            fm.resolve_seq_lens_cpu(batch)
            assert batch.seq_lens_cpu is None
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    assert batch.seq_lens.cpu().tolist() == [21 + 4, 22 + 4, 23 + 4]


# ------------------------------------------- what only CUDA tells apart


def test_the_launchers_state_lives_where_cuda_needs_it():
    """What a CPU cannot tell apart: the launcher's sum, idle row and poison flag on the
    buffer's device (the kernel touches device memory only), the empty result a real
    device pointer that aliases nothing."""
    buf = torch.zeros((64,), dtype=torch.int64, device=DEV)
    pg = StepLauncher(buf, poison=True, validate=True)
    assert pg.out_sum.device == pg._flag.device == pg._zero_row.device == buf.device
    assert pg.empty_out.device == buf.device and pg.empty_out.numel() == 0
    # (an empty CUDA tensor's data_ptr() is 0, seen on an H100: Triton's launcher takes it)
    assert pg.empty_out.data_ptr() != buf.data_ptr()


def test_the_reference_rung_serves_an_exact_step_from_the_uploaded_indices(patched):
    """The torch reference on CUDA, through the whole exact step: the uploaded indices on
    the device, the row down, the host lengths right."""
    cfg = TraceConfig(pool=64)
    fm = make_future_map("EAGLE", cfg, device=DEV)
    fm.publish(torch.tensor([5, 9], device=DEV), torch.tensor([50, 90], device=DEV))
    relay = relay_mod.relay_for(fm)
    relay.launcher.backend = "reference"
    for _ in range(2):  # checked, then the lean reference step
        batch = decode_batch([9, 5], cfg, device=DEV)
        fm.resolve_seq_lens_cpu(batch)
        assert batch.seq_lens.device.type == "cuda" and batch.seq_lens.cpu().tolist() == [90, 50]
        assert batch.seq_lens_cpu.tolist() == [90, 50] and batch.seq_lens_sum == 140
        fm.publish(torch.tensor([5, 9], device=DEV), torch.tensor([50, 90], device=DEV))


def test_debug_mode_checks_slot_values_on_cuda_too():
    """On a CPU every check is deep anyway; on CUDA only debug mode reads
    the index values (a sync) - an out-of-range slot is refused before anything is
    written."""
    from spec_fused.kernels.checks import InputError

    buf = torch.zeros((16,), dtype=torch.int64, device=DEV)
    for debug in (dict(validate=True), dict(poison=True)):
        pg = StepLauncher(buf, **debug)
        with pytest.raises(InputError):
            pg.launch_checked(torch.tensor([3, 99], device=DEV), None, None, False)
        assert torch.equal(buf.cpu(), torch.zeros(16, dtype=torch.int64))


# ----------------------------------------------------------------------- first contact


def test_the_canary_says_what_it_cost_here():
    backend_mod._verdicts.clear()
    verdict = canary_mod.canary(DEV)
    assert verdict.seconds > 0 and f"in {verdict.seconds:.2f} s" in verdict.describe()


def test_selftests_verdict_is_the_one_the_relay_reads(patched):
    backend_mod._verdicts.clear()
    verdict = canary_mod.canary(torch.device("cuda"))
    fm = make_future_map("EAGLE", TraceConfig(pool=64), device=DEV)
    relay_mod.relay_for(fm)
    assert backend_mod.verdict_for(fm.__dict__["new_seq_lens_buf"].device) is verdict


@pytest.mark.parametrize("needs_cpu", [True, False])
def test_without_matching_host_indices_sglangs_resolve_runs_the_step(needs_cpu):
    """Host indices that are not the batch's own (here shorter than future_indices): the
    relay hands the step to SGLang's resolve, which gives what it gives unpatched."""

    def step(fm):
        fm.publish(torch.tensor([3, 4], device=DEV), torch.tensor([30, 40], device=DEV))
        batch = decode_batch([3, 4], cfg, device=DEV)
        batch.req_pool_indices_cpu = torch.tensor([3])
        fm.resolve_seq_lens_cpu(batch)
        cpu = None if batch.seq_lens_cpu is None else batch.seq_lens_cpu.tolist()
        return batch.seq_lens.cpu().tolist(), cpu, batch.seq_lens_sum

    cfg = TraceConfig(pool=64)
    want = step(make_future_map("EAGLE", cfg, device=DEV, needs_cpu_seq_lens=needs_cpu))
    log.reset()
    sglang_patch.apply()
    try:
        fm = make_future_map("EAGLE", cfg, device=DEV, needs_cpu_seq_lens=needs_cpu)
        assert step(fm) == want and fm.__dict__[relay_mod.RELAY_ATTR] is not None
    finally:
        sglang_patch.remove()


def test_confidential_computing_pins_nothing_and_the_relay_serves_exact_lengths(monkeypatch):
    from sglang.srt.utils import common as sglang_common

    monkeypatch.setenv("SGLANG_FORCE_CONFIDENTIAL_COMPUTE", "1")
    sglang_common.is_confidential_compute.cache_clear()
    cfg = TraceConfig(seed=4, steps=30, pool=64)
    try:
        want = run_trace(make_future_map("EAGLE", cfg, device=DEV), cfg)
        log.reset()
        sglang_patch.apply()
        try:
            fm = make_future_map("EAGLE", cfg, device=DEV)
            got = run_trace(fm, cfg)
            relay = fm.__dict__[relay_mod.RELAY_ATTR]
        finally:
            sglang_patch.remove()
    finally:
        monkeypatch.delenv("SGLANG_FORCE_CONFIDENTIAL_COMPUTE")
        sglang_common.is_confidential_compute.cache_clear()
    assert got == want
    assert relay is not None and not relay.launcher.pinned and relay.launcher.launches > 0
    assert not relay.launcher._row[0].is_pinned()


def test_under_confidential_computing_the_canary_proves_the_compiled_kernel(monkeypatch):
    """The kernel touches device memory only, so nothing the canary launches is host
    memory Triton would refuse: the device is proven, not put on the reference."""
    from sglang.srt.utils import common as sglang_common

    monkeypatch.setenv("SGLANG_FORCE_CONFIDENTIAL_COMPUTE", "1")
    sglang_common.is_confidential_compute.cache_clear()
    backend_mod._verdicts.clear()
    try:
        verdict = canary_mod.canary(DEV)
    finally:
        monkeypatch.delenv("SGLANG_FORCE_CONFIDENTIAL_COMPUTE")
        sglang_common.is_confidential_compute.cache_clear()
    assert (verdict.backend, verdict.notes) == ("triton", []), verdict.describe()


def test_without_the_override_an_exact_future_map_keeps_sglangs_relay(monkeypatch, patched):
    """No GPU has measured the exact step level with SGLang's yet: SGLang's relay runs it,
    and gives SGLang's lengths; a GPU-only FutureMap is relayed."""
    monkeypatch.delenv("SPEC_FUSED_UNMEASURED")
    cfg = TraceConfig(pool=64)
    exact = make_future_map("EAGLE", cfg, device=DEV, needs_cpu_seq_lens=True)
    exact.publish(torch.tensor([3], device=DEV), torch.tensor([30], device=DEV))
    assert relay_mod.relay_for(exact) is None
    batch = decode_batch([3], cfg, device=DEV)
    exact.resolve_seq_lens_cpu(batch)
    assert batch.seq_lens_cpu.tolist() == [30] and batch.seq_lens_sum == 30
    gpu_only = make_future_map("EAGLE", cfg, device=DEV, needs_cpu_seq_lens=False)
    gpu_only.publish(torch.tensor([3], device=DEV), torch.tensor([30], device=DEV))
    assert relay_mod.relay_for(gpu_only) is not None


# ------------------------------------------ last: children whose CUDA context dies
# Last in the file, so a child that hangs costs only what follows it: nothing.
CHILD_TIMEOUT_S = 40
CHILD_LIMIT = pytest.mark.timeout(CHILD_TIMEOUT_S + 15, method="thread")  # the child, then us

_FAULTING_CHILD = """
import json, torch, triton, triton.language as tl
from spec_fused.faults import is_sticky_fault

@triton.jit
def far_store(ptr):
    tl.store(ptr + tl.full([1], 1 << 40, tl.int64), tl.full([1], 1, tl.int64))

x = torch.zeros(1, dtype=torch.int64, device="cuda")
seen = []
for step in ("fault", "next launch"):
    try:
        far_store[(1,)](x)
        torch.cuda.synchronize()
    except Exception as exc:
        seen.append({"step": step, "sticky": is_sticky_fault(exc), "type": type(exc).__name__,
                     "text": str(exc).splitlines()[0][:200]})
print(json.dumps({"seen": seen}), flush=True)  # the process may not exit cleanly
"""


def _child(tmp_path, source: str) -> str:
    """Run ``source`` in its own process from a file (Triton's ``@jit`` reads its source);
    what it printed. A child whose context died may hang on exit after printing its
    finding: it is killed at CHILD_TIMEOUT_S, and what it printed still counts."""
    import subprocess
    import sys

    script = tmp_path / "child.py"
    script.write_text(source)
    try:
        done = subprocess.run(
            [sys.executable, str(script)], capture_output=True, text=True, timeout=CHILD_TIMEOUT_S
        )
        out, err, how = done.stdout, done.stderr, f"rc {done.returncode}"
    except subprocess.TimeoutExpired as exc:  # its output so far, as bytes (a POSIX quirk)
        out, err, how = (_text(exc.stdout), _text(exc.stderr), f"killed at {CHILD_TIMEOUT_S} s")
    return out + f"\n[child: {how}]\n" + err[-2000:]


def _text(data) -> str:
    return data.decode(errors="replace") if isinstance(data, bytes) else (data or "")


@CHILD_LIMIT
def test_a_real_sticky_fault_is_recognised_as_one(tmp_path):
    """What a real illegal address raises here - at the synchronize, and from the next
    launch on the dead context - is what spec_fused.faults calls sticky."""
    import json

    printed = _child(tmp_path, _FAULTING_CHILD)
    found = [line for line in printed.splitlines() if line.startswith('{"seen"')]
    assert found, f"the child printed no finding: {printed}"
    seen = json.loads(found[-1])["seen"]
    assert seen and all(s["sticky"] for s in seen), seen


_FAULTING_CANARY = """
import torch, triton, triton.language as tl
from spec_fused.kernels import canary, publish_gather

@triton.jit
def far_store(ptr):
    tl.store(ptr + tl.full([1], 1 << 40, tl.int64), tl.full([1], 1, tl.int64))

publish_gather.launch_triton = lambda a: far_store[(1,)](a.out)
try:
    canary.canary("cuda:0")
except Exception as exc:
    print("\\n".join([str(exc), *getattr(exc, "__notes__", [])]), flush=True)
"""


@CHILD_LIMIT
def test_a_kernel_that_faults_in_the_canary_stops_start_up_naming_the_kill_switch(tmp_path):
    """In its own process (the context dies): the canary's fault escapes with the note
    that names spec_fused and SPEC_FUSED_DISABLE=1, before anything is served."""
    printed = _child(tmp_path, _FAULTING_CANARY)
    finding = printed.split("[child: ")[0]
    assert "start-up canary on cuda:0" in finding, printed
    assert "SPEC_FUSED_DISABLE=1" in finding
