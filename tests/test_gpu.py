"""GPU-only checks (run by bench/gpu_check.sh on an H200): real streams, pinned zero-copy
host mirrors, the double buffer under load, CUDA-graph capture of the fused launch."""

import random

import pytest
import torch

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

from spec_fused.kernels.publish_gather import (  # noqa: E402
    PoisonedSlotError,
    PublishGather,
    backend_for,
    publish_gather,
    publish_gather_reference,
)

DEV = torch.device("cuda")


def test_compiled_kernel_matches_reference_across_sizes(kernel_launches):
    assert backend_for(DEV) == "triton"
    g = torch.Generator().manual_seed(0)
    for pool, n, m in [(1, 1, 1), (4096, 1, 0), (4096, 256, 256), (65536, 4096, 2048),
                       (1 << 20, 70000, 50000), (17, 0, 5), (100, 3000, 0)]:
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


def test_pinned_host_out_is_written_by_the_same_launch(kernel_launches):
    buf = torch.arange(1000, device=DEV)
    gat = torch.tensor([5, 7, 999], device=DEV)
    host = torch.full((4,), -1, dtype=torch.int64, pin_memory=True)
    publish_gather(buf, gat, torch.tensor([7], device=DEV), torch.tensor([70], device=DEV),
                   host_out=host)
    torch.cuda.current_stream().synchronize()
    assert host.tolist() == [5, 70, 999, 1074] and kernel_launches.count == 1
    with pytest.raises(ValueError, match="pinned"):
        publish_gather(buf, gat, host_out=torch.empty(4, dtype=torch.int64))


def test_cuda_graph_capture_of_the_fused_launch():
    pool, n = 4096, 128
    buf = torch.zeros(pool, dtype=torch.int64, device=DEV)
    gat = torch.zeros(n, dtype=torch.int64, device=DEV)
    pub = torch.zeros(n, dtype=torch.int64, device=DEV)
    val = torch.zeros(n, dtype=torch.int32, device=DEV)
    pg = PublishGather(buf, max_batch=n, static_out=True)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        pg(gat, pub, val)  # warm up / compile outside capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        res = pg(gat, pub, val)
    for seed in range(5):
        r = random.Random(seed)
        slots = r.sample(range(pool), 2 * n)
        gat.copy_(torch.tensor(slots[n // 2: n // 2 + n]))
        pub.copy_(torch.tensor(slots[:n]))
        val.copy_(torch.tensor([r.randrange(1 << 20) for _ in range(n)], dtype=torch.int32))
        ref = buf.cpu()
        want = publish_gather_reference(ref, gat.cpu(), pub.cpu(), val.cpu())
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(res.seq_lens.cpu(), want.seq_lens)
        assert int(res.seq_lens_sum) == int(want.seq_lens_sum)


def test_pinned_host_gather_indices_are_read_zero_copy(kernel_launches):
    buf = torch.arange(100, device=DEV)
    host_idx = torch.tensor([3, 9, 3], dtype=torch.int64).pin_memory()
    host = torch.full((4,), -1, dtype=torch.int64, pin_memory=True)
    res = publish_gather(buf, host_idx, torch.tensor([9], device=DEV),
                         torch.tensor([90], device=DEV), host_out=host)
    torch.cuda.synchronize()
    assert res.seq_lens.cpu().tolist() == [3, 90, 3] and host.tolist() == [3, 90, 3, 96]
    assert kernel_launches.count == 1
    with pytest.raises(ValueError, match="gather_indices is on cpu"):
        publish_gather(buf, torch.tensor([1]))  # pageable host memory is refused


def test_poison_on_gpu_is_reported_after_a_sync():
    buf = torch.full((64,), -1, dtype=torch.int64, device=DEV)
    pg = PublishGather(buf, poison=True)
    res = pg(torch.tensor([1, 2], device=DEV), torch.tensor([1], device=DEV),
             torch.tensor([5], device=DEV))  # slot 2 never published
    torch.cuda.synchronize()
    with pytest.raises(PoisonedSlotError) as info:
        res.raise_if_poisoned()
    assert info.value.slot == 2


def test_bound_direct_launch_matches_the_reference_one_launch_per_step(kernel_launches):
    """The relay's lean path on compiled Triton: after the first (checked) step of each
    dtype combination every launch goes straight through the bound compiled kernel, and
    every result equals the reference."""
    g = torch.Generator().manual_seed(5)
    for pool, n, m, host, vdtype in [(4096, 1, 1, False, torch.int64),
                                     (4096, 256, 256, True, torch.int32),
                                     (65536, 1024, 1100, True, torch.int64),
                                     (4096, 3000, 0, False, torch.int64)]:
        buf = torch.randint(0, 1 << 40, (pool,), generator=g)
        ref = buf.clone()
        pg = PublishGather(buf.to(DEV))
        kernel_launches.reset()
        steps = 6
        for step in range(steps):
            slots = torch.randperm(pool, generator=g)
            pub = slots[:m]
            vals = torch.randint(0, 1 << 30, (m,), generator=g, dtype=vdtype)
            gat = torch.randint(0, pool, (n,), generator=g)
            want = publish_gather_reference(ref, gat, pub if m else None, vals if m else None)
            out = pg.launch(gat.to(DEV), pub.to(DEV) if m else None,
                            vals.to(DEV) if m else None, host)
            torch.cuda.synchronize()
            assert torch.equal(out.cpu(), want.seq_lens), (pool, n, m, step)
            if host:
                lens, total = pg.read_row(pg.stamp, n)
                assert torch.equal(lens, want.seq_lens) and total == int(want.seq_lens_sum)
        assert torch.equal(pg.buf.cpu(), ref)
        assert pg._fast is not None and pg._fast.blocked is None, pg._fast.blocked
        assert kernel_launches.count == steps and kernel_launches.direct == steps - 1


def test_bound_launch_under_a_launch_hook_takes_the_normal_path(kernel_launches):
    from triton import knobs

    pg = PublishGather(torch.zeros(64, dtype=torch.int64, device=DEV))
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
    pg.launch(idx, idx, idx + 3, False)
    assert kernel_launches.direct == 1


# ----------------------------------------------------------------------- real FutureMap, streams


def _future_map(algo_name, pool, monkeypatch, env=None):
    from types import SimpleNamespace

    from sglang.srt.managers.overlap_utils import FutureMap
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    for k, v in (env or {}).items():
        monkeypatch.setenv(k, v)
    pool_obj = SimpleNamespace(req_to_token=torch.zeros((pool, 8), dtype=torch.int32, device=DEV))
    return FutureMap(DEV, SpeculativeAlgorithm[algo_name], pool_obj, needs_cpu_seq_lens=True)


def _staged(values, dtype=torch.int64):
    """Host values to the device without blocking the host (pinned + non_blocking), so the
    host runs ahead of the forward as SGLang's scheduler does."""
    return torch.tensor(values, dtype=dtype).pin_memory().to(DEV, non_blocking=True)


def _overlap_loop(fm, *, steps=60, bs=64, pool=512, seed=0, barrier=True, sleep=10_000_000):
    """event_loop_overlap's stream pattern: resolve on the schedule stream, the forward on
    its own stream with a long verify, publish mid-forward, then draft-extend work."""
    from types import SimpleNamespace

    sched, fwd = torch.cuda.Stream(), torch.cuda.Stream()
    r = random.Random(seed)
    slots = r.sample(range(1, pool), bs)
    lens = {s: r.randint(1, 100) for s in slots}
    seen = []
    with torch.cuda.stream(fwd):
        fm.publish(_staged(slots), _staged([lens[s] for s in slots]))
    for _ in range(steps):
        with torch.cuda.stream(sched):
            fi = _staged(slots)
            batch = SimpleNamespace(spec_info=SimpleNamespace(future_indices=fi),
                                    req_pool_indices=fi,
                                    req_pool_indices_cpu=torch.tensor(slots),
                                    seq_lens=None, seq_lens_cpu=None, seq_lens_sum=None)
            fm.resolve_seq_lens_cpu(batch)
            host = None if batch.seq_lens_cpu is None else (batch.seq_lens_cpu.tolist(), batch.seq_lens_sum)
        fwd.wait_stream(sched)
        accept = [r.randint(1, 16) for _ in slots]
        with torch.cuda.stream(fwd):
            acc = _staged(accept)
            torch.cuda._sleep(sleep)  # verify
            seen.append((batch.seq_lens.clone(), host))
            fm.publish(fi, batch.seq_lens + acc)
            torch.cuda._sleep(sleep // 2)  # draft extend
        if barrier:
            sched.wait_stream(fwd)
        for s, a in zip(slots, accept):
            lens[s] += a
        if r.random() < 0.2:  # a request finishes, its slot is reused
            i = r.randrange(bs)
            new = r.choice([s for s in range(1, pool) if s not in lens])
            del lens[slots[i]]
            slots[i] = new
            lens[new] = r.randint(1, 100)
            with torch.cuda.stream(fwd):
                fm.publish(_staged([new]), _staged([lens[new]]))
    torch.cuda.synchronize()
    return [(d.cpu().tolist(), h) for d, h in seen]


@pytest.mark.parametrize("algo, env, barrier", [
    ("EAGLE", {}, True),
    ("DFLASH", {}, True),
    ("DFLASH", {"SPEC_FUSED_WAR_BARRIER": "0"}, False),
])
def test_patched_future_map_on_real_streams_matches_upstream(monkeypatch, algo, env, barrier):
    from spec_fused.integration import sglang_patch

    want = _overlap_loop(_future_map(algo, 512, monkeypatch), barrier=True)
    from spec_fused import relay as relay_mod

    sglang_patch.apply()
    try:
        fm = _future_map(algo, 512, monkeypatch, env)
        got = _overlap_loop(fm, barrier=barrier)
        launcher = relay_mod.relay_for(fm).launcher
        assert launcher.backend == "triton"  # no silent fallback
        assert launcher._fast.blocked is None  # and the direct launch in use
    finally:
        sglang_patch.remove()
    for step, ((gd, gh), (wd, wh)) in enumerate(zip(got, want, strict=True)):
        assert gd == wd, f"device lengths differ at step {step}"
        if algo == "EAGLE":
            assert gh == wh, f"host lengths differ at step {step}"
        else:
            assert gh is None


def test_war_guarded_makes_no_full_pool_copy_and_one_event_wait(monkeypatch):
    from spec_fused.integration import sglang_patch

    calls = {"stream_sync": 0, "event_sync": 0, "copies": []}
    real_stream_sync, real_event_sync = torch.cuda.Stream.synchronize, torch.cuda.Event.synchronize
    real_copy = torch.Tensor.copy_

    def stream_sync(self):
        calls["stream_sync"] += 1
        return real_stream_sync(self)

    def event_sync(self):
        calls["event_sync"] += 1
        return real_event_sync(self)

    def copy_(self, src, *a, **k):
        if self.device.type == "cpu" and src.device.type == "cuda":
            calls["copies"].append(src.numel())
        return real_copy(self, src, *a, **k)

    sglang_patch.apply()
    try:
        fm = _future_map("EAGLE", 65536, monkeypatch)
        monkeypatch.setattr(torch.cuda.Stream, "synchronize", stream_sync)
        monkeypatch.setattr(torch.cuda.Event, "synchronize", event_sync)
        monkeypatch.setattr(torch.Tensor, "copy_", copy_)
        _overlap_loop(fm, steps=10, bs=32, pool=65536, sleep=1_000_000)
    finally:
        monkeypatch.undo()
        sglang_patch.remove()
    assert calls["stream_sync"] == 0
    assert calls["event_sync"] == 10  # the host waits for the fused launch only
    assert not calls["copies"]  # lengths arrive zero-copy; never a pool-sized D2H
