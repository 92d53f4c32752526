"""The per-step launcher (``StepLauncher``): one full check then the per-step path, rows
``[*lens, sum]``, DP-idle steps, the null backend, the exact step's host copies (staged
indices up, the row down), binding the direct launch, and what it binds on CUDA.

Expected lengths come from ``publish_gather_reference`` on a copy of the buffer (the
plain-torch definition of the step: scatter, then gather) or from literals; the launch
path taken is read from what the launcher documents (one full check for a combination it
then remembers, ``launches`` counting device launches, DP-idle steps launching nothing)."""

import pytest
import torch
from support.fake_triton import FakeCompiled, bound_launcher, cpu_direct

from spec_fused.kernels import backend as backend_mod
from spec_fused.kernels import checks, publish_gather, step_launcher
from spec_fused.kernels.checks import InputError
from spec_fused.kernels.publish_gather import publish_gather_reference
from spec_fused.kernels.step_launcher import StepLauncher

BACKENDS = ["interpreter", "reference"]


@pytest.fixture
def validations(monkeypatch):
    """The full checks run on a buffer: ``validations[id(buf)]`` (the launcher's own check
    of its buffer when it is made included)."""
    calls: dict = {}
    real = checks.validate

    def counted(buf, *args, **kwargs):
        calls[id(buf)] = calls.get(id(buf), 0) + 1
        return real(buf, *args, **kwargs)

    monkeypatch.setattr(checks, "validate", counted)
    return calls


def _buf(pool=16):
    return torch.arange(100, 100 + pool, dtype=torch.int64)


# ----------------------------------------------------------------------------- one check


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("row", [False, True])
def test_one_full_check_then_none_whatever_the_batch_size(validations, backend, row):
    """``max_batch`` only sizes the host buffers: any batch takes the per-step path once
    its combination was checked, a row ``[*lens, sum]`` or not."""
    buf = _buf(32)
    ref = buf.clone()
    pg = StepLauncher(buf, max_batch=4, backend=backend)
    sizes = [4, 9, 2, 12]
    for step, n in enumerate(sizes):
        gi = torch.arange(n) * 2
        pi, pv = torch.tensor([step]), torch.tensor([500 + step])
        want = publish_gather_reference(ref, gi, pi, pv)
        out = pg.launch(gi, pi, pv, row)
        assert out[:n].tolist() == want.seq_lens.tolist() and out.shape[0] == n + row
        if row:
            assert int(out[n]) == int(want.seq_lens_sum)
    # the buffer's check when the launcher was made, then one full check of the inputs
    assert validations[id(buf)] == 2 and pg.launches == len(sizes)


def test_one_full_check_then_none_through_the_direct_launch(monkeypatch):
    """The same, through the bound direct launch: the first step checked, the next four
    on the compiled kernel."""
    calls = []
    real = checks.validate
    buf = torch.zeros(64, dtype=torch.int64)
    compiled = FakeCompiled()
    launcher = bound_launcher(buf, compiled)
    monkeypatch.setattr(checks, "validate", lambda *a, **k: (calls.append(1), real(*a, **k)))
    idx = torch.tensor([1, 2, 3])
    for step in range(5):
        launcher.launch(idx, idx, idx + step, False)
    assert len(calls) == 1 and len(compiled.calls) == 4


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "pi_dtype, pv_dtype",
    [
        (torch.int64, torch.int64),
        (torch.int32, torch.int32),
        (torch.int32, torch.int64),
        (torch.int64, torch.int32),
        (torch.int64, torch.int16),
        (torch.int32, torch.int8),
    ],
)
def test_every_integer_combination_takes_the_per_step_path_after_one_check(
    validations, backend, pi_dtype, pv_dtype
):
    buf = _buf()
    ref = buf.clone()
    pg = StepLauncher(buf, backend=backend)
    for step in range(3):
        gi = torch.tensor([1, 3, 5])
        pi = torch.tensor([3, step + 6], dtype=pi_dtype)
        pv = torch.tensor([70 + step, 80], dtype=pv_dtype)
        want = publish_gather_reference(ref, gi, pi, pv)
        assert pg.launch(gi, pi, pv, False).tolist() == want.seq_lens.tolist()
    assert torch.equal(buf, ref)
    assert validations[id(buf)] == 1 + 1


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("which", ["publish_indices", "publish_values"])
def test_a_publish_off_the_buffers_device_takes_the_full_check(backend, which):
    buf = _buf()
    pg = StepLauncher(buf, backend=backend)
    idx = torch.tensor([1, 2, 3])
    pg.launch(idx, idx, idx + 50, False)
    before = buf.clone()
    pi, pv = idx, idx + 60
    if which == "publish_indices":
        pi = pi.to("meta")
    else:
        pv = pv.to("meta")
    with pytest.raises(InputError, match=f"{which} is on meta"):
        pg.launch(idx, pi, pv, False)
    assert torch.equal(buf, before)


# ----------------------------------------------------------------------------- DP-idle


@pytest.mark.parametrize("backend", BACKENDS + ["null"])
@pytest.mark.parametrize("row", [False, True])
def test_a_dp_idle_step_launches_nothing_and_its_row_says_no_lengths(backend, row):
    pg = StepLauncher(_buf(), backend=backend)
    empty = torch.empty(0, dtype=torch.int64)
    for launch in (pg.launch_checked, pg.launch):
        out = launch(empty, None, None, row)
        assert out.dtype == torch.int64 and out.tolist() == ([0] if row else [])
        assert pg.launches == 0
    # and in the steady state (the combination already launched once)
    pg.launch(torch.tensor([1, 2]), None, None, row)
    launches = pg.launches
    assert pg.launch(empty, None, None, row).tolist() == ([0] if row else [])
    assert pg.launches == launches


@pytest.mark.parametrize("backend", BACKENDS)
def test_each_launch_counts_once(backend):
    pg = StepLauncher(_buf(), backend=backend)
    for step in range(4):
        pg.launch(torch.tensor([step]), None, None, step % 2 == 0)
        assert pg.launches == step + 1 and pg.step == step + 1


# ----------------------------------------------------------------------------- null backend


def test_the_null_backend_does_no_device_work():
    buf = _buf()
    before = buf.clone()
    pg = StepLauncher(buf, backend="null")
    pg.launch_checked(torch.tensor([1]), torch.tensor([1]), torch.tensor([7]), True)
    pg.launch(torch.tensor([2]), None, None, False)
    pg.launch(torch.tensor([3]), None, None, True)
    assert torch.equal(buf, before) and pg.launches == 0 and pg.step == 3


# ----------------------------------------------------------------------------- host copies


def test_staged_host_indices_are_an_int64_copy_the_launch_gathers_through():
    buf = _buf()
    pg = StepLauncher(buf, max_batch=4, backend="interpreter")
    host = torch.tensor([5, 1, 2], dtype=torch.int32)
    view = pg.stage_host_indices(host, torch.tensor([5, 1, 2]))
    assert view.dtype == torch.int64 and view.tolist() == [5, 1, 2]
    host[0] = 9  # the staged copy is the launcher's own
    gi = pg.upload_host_indices(view)
    assert gi is view  # on the host the staged copy is on the buffer's device already
    assert pg.launch(gi, None, None, True).tolist() == [105, 101, 102, 308]
    longer = pg.stage_host_indices(torch.arange(7), torch.arange(7))  # a bigger buffer
    assert longer.tolist() == list(range(7))


@pytest.mark.parametrize(
    "host, like",
    [
        (None, torch.tensor([1])),
        ([1], torch.tensor([1])),
        (torch.tensor([1.0]), torch.tensor([1])),
        (torch.tensor([1, 2]), torch.tensor([1])),
        (torch.tensor([1], device="meta"), torch.tensor([1])),
    ],
    ids=["none", "a list", "floats", "another shape", "not on the host"],
)
def test_host_indices_that_are_not_the_batchs_are_not_staged(host, like):
    """The relay then hands the step to SGLang: nothing is staged or launched."""
    pg = StepLauncher(_buf(), backend="interpreter")
    assert pg.stage_host_indices(host, like) is None and pg._staging is None


def test_in_debug_mode_host_indices_unlike_future_indices_are_refused():
    """SGLang's FIXME says ``req_pool_indices_cpu`` equals ``future_indices``; debug mode
    holds it to that before anything is launched."""
    pg = StepLauncher(_buf(), backend="interpreter", validate=True)
    with pytest.raises(AssertionError, match="req_pool_indices_cpu differs from future_indices"):
        pg.stage_host_indices(torch.tensor([1, 2]), torch.tensor([1, 3]))
    assert pg.stage_host_indices(torch.tensor([1, 2]), torch.tensor([1, 2])).tolist() == [1, 2]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_row_copied_to_the_host_reads_back_as_lengths_and_their_sum(backend):
    """What the host gets of an exact step: a copy of the lengths (the host row is reused
    by the next step) and the sum, growing the host row for a batch beyond ``max_batch``."""
    buf = _buf(32)
    pg = StepLauncher(buf, max_batch=2, backend=backend)
    for gi in (torch.tensor([1, 2]), torch.tensor([3, 4, 5, 6])):
        pg.row_to_host(pg.launch(gi, None, None, True))
        lens, total = pg.host_lengths(gi.shape[0])
        assert lens.tolist() == (gi + 100).tolist() and total == int((gi + 100).sum())
        pg.row_to_host(torch.zeros(gi.shape[0] + 1, dtype=torch.int64))
        assert lens.tolist() == (gi + 100).tolist()  # a copy: the next row leaves it alone


# ----------------------------------------------------------------------------- binding


def test_binding_a_compiled_kernel_takes_every_parameter():
    fast = cpu_direct()
    assert fast.bind(FakeCompiled()) is not None and fast.blocked is None


def test_the_bound_launch_writes_the_sum_at_the_rows_end():
    buf = _buf()
    ref = buf.clone()
    compiled = FakeCompiled()
    pg = bound_launcher(buf, compiled)
    for step in range(3):
        gi = torch.tensor([step, 4])
        want = publish_gather_reference(ref, gi)
        row = pg.launch(gi, None, None, True)
        assert row.tolist() == want.seq_lens.tolist() + [int(want.seq_lens_sum)]
    assert len(compiled.calls) == 2


@pytest.mark.parametrize("backend", BACKENDS)
def test_sums_beyond_float_precision_are_exact(backend):
    buf = torch.tensor([2**40 + 1, 2**41 + 3, 5, 2**53 - 1], dtype=torch.int64)
    ref = buf.clone()
    pg = StepLauncher(buf, backend=backend)
    gi = torch.tensor([0, 1, 2])
    want = publish_gather_reference(ref, gi)
    for launch in (pg.launch_checked, pg.launch):
        out = launch(gi, None, None, True)
        pg.row_to_host(out)
        lens, total = pg.host_lengths(3)
        assert out[:3].tolist() == lens.tolist() == want.seq_lens.tolist()
        assert total == int(out[3]) == int(want.seq_lens_sum) == 2**40 + 2**41 + 9


# ----------------------------------------------------------------------------- CUDA binding
# A CPU has no CUDA device: these pretend the buffer is on one (``_on_cuda``, what the
# launcher derived from ``buf.device``) to read what the launcher binds there.


class _DirectLaunch:
    def __init__(self, device_index, kernel):
        self.device_index, self.kernel, self.blocked = device_index, kernel, None

    def block(self, why):
        self.blocked = why


def _pretend_cuda(pg):
    pg._on_cuda = True
    return pg


@pytest.mark.parametrize(
    "verdict, blocked",
    [
        (None, None),
        (dict(direct=True, notes=[]), None),
        (
            dict(direct=False, notes=["wrong lengths from the direct launch", "later note"]),
            "start-up canary: wrong lengths from the direct launch",
        ),
        (dict(direct=True, notes=["an earlier downgrade"]), None),
    ],
)
def test_compiled_triton_binds_a_direct_launch_unless_the_canary_disproved_it(
    monkeypatch, verdict, blocked
):
    from spec_fused.kernels import direct_launch

    monkeypatch.setattr(direct_launch, "DirectLaunch", _DirectLaunch)
    proven = None if verdict is None else backend_mod.Verdict("cuda:0", "triton", **verdict)
    buf = _buf()  # the verdict read is its device's (a CPU one stands for cuda:0 here)
    monkeypatch.setattr(step_launcher, "verdict_for", lambda d: proven if d == buf.device else None)
    pg = _pretend_cuda(StepLauncher(buf, backend="reference"))
    pg.backend = "triton"
    assert isinstance(pg._direct, _DirectLaunch) and pg._direct.device_index == -1
    assert pg._direct.kernel is publish_gather._publish_gather_kernel
    assert pg._direct.blocked == blocked
    pg.backend = "reference"
    assert pg._direct is None


def test_the_guard_accepts_inputs_on_the_buffers_device_only():
    """Gather indices, publish indices and values on the buffer's device. A meta tensor
    stands for a tensor on another device."""
    pg = StepLauncher(_buf(), backend="reference")
    elsewhere = torch.tensor([1, 2], device="meta")
    here = torch.tensor([1, 2])
    assert pg._key(here, None, None, False) == (torch.int64, False)
    assert pg._key(elsewhere, None, None, False) is None
    assert pg._key(here, elsewhere, elsewhere, False) is None
    assert pg._key(here, here, here, True) == (torch.int64,) * 3 + (True,)
    assert pg._key(torch.arange(4)[::2], None, None, False) is None  # read unstrided


def test_the_reference_backend_never_runs_the_kernel(kernel_launches):
    pg = StepLauncher(_buf(), backend="reference")
    for launch in (pg.launch_checked, pg.launch, pg.launch):
        launch(torch.tensor([1, 2]), torch.tensor([2]), torch.tensor([7]), True)
    assert pg.launches == 3 and kernel_launches.count == 0
    pg.backend = "interpreter"
    for launch in (pg.launch_checked, pg.launch):
        launch(torch.tensor([1, 2]), torch.tensor([2]), torch.tensor([8]), True)
    assert pg.launches == 5 and kernel_launches.count == 2


@pytest.mark.parametrize("backend", BACKENDS)
def test_in_the_steady_state_a_new_bad_combination_still_gets_the_full_check(backend):
    buf = _buf()
    pg = StepLauncher(buf, backend=backend)
    idx = torch.tensor([1, 2, 3])
    for step in range(3):  # checked once, then the per-step path: the steady state
        pg.launch(idx, idx, idx + step, False)
    before = buf.clone()
    with pytest.raises(TypeError, match="publish_values must be an integer tensor"):
        pg.launch(idx, idx, (idx + 9).float(), False)
    with pytest.raises(TypeError, match="publish_values must be an integer tensor"):
        pg.launch(idx, idx, (idx + 9).float(), True)
    assert torch.equal(buf, before)


def test_the_bound_launch_poisons_what_it_gathered_in_debug_mode():
    """Consume-once (debug): a gathered slot reads as consumed until it is published again,
    through the direct launch as through the checked one."""
    from spec_fused.kernels.checks import PoisonedSlotError

    buf = _buf()
    compiled = FakeCompiled()
    pg = bound_launcher(buf, compiled, poison=True)
    pg.launch_checked(torch.tensor([1, 2]), None, None, False)  # checked, binds
    assert pg._launch(torch.tensor([3, 4]), None, None, False).tolist() == [103, 104]  # direct
    assert len(compiled.calls) == 1
    assert buf[[1, 2, 3, 4]].tolist() == [-1, -1, -1, -1]
    pg.launch(torch.tensor([5]), torch.tensor([3]), torch.tensor([33]), False)
    with pytest.raises(PoisonedSlotError):
        pg.launch_checked(torch.tensor([4]), None, None, False)


@pytest.mark.parametrize("backend", ["interpreter", "reference"])
def test_a_rebound_launcher_keeps_its_backend_and_launches_into_the_new_buffer(backend):
    """FutureMap may swap its buffer (``_adopt_relay``): the same launcher, the same backend,
    every later step into the new buffer."""
    old, new = torch.zeros(16, dtype=torch.int64), torch.arange(16, dtype=torch.int64) * 10
    new[0] = 10**6  # a buffer holds lengths, not slots: any value is a buffer's to hold
    pg = StepLauncher(old, backend=backend)
    pg.launch_checked(torch.tensor([1]), torch.tensor([2]), torch.tensor([5]), False)
    pg.rebind(new)
    assert pg.backend == backend and pg.buf is new
    out = pg.launch(torch.tensor([2, 3]), torch.tensor([3]), torch.tensor([7]), False)
    assert out.tolist() == [20, 7] and new[3] == 7 and old[3] == 0


def test_direct_launches_count_once_each_like_every_launch():
    buf = _buf()
    compiled = FakeCompiled()
    pg = bound_launcher(buf, compiled)
    for step in range(4):  # the first is the checked one; then the bound path
        pg.launch(torch.tensor([1, 2]), torch.tensor([1]), torch.tensor([step]), False)
    assert (pg.launches, pg.direct_launches, len(compiled.calls)) == (4, 3, 3)


def test_the_launchers_state_lives_on_its_buffers_device():
    """The sum, an idle row and the debug flag are made on the buffer's device, whatever it
    is (a ``meta`` buffer here: a device other than the host, without CUDA): the kernel
    reads and writes device memory only."""
    pg = StepLauncher(
        torch.zeros(8, dtype=torch.int64, device="meta"), poison=True, backend="reference"
    )
    assert pg.out_sum.device.type == "meta" and pg._flag.device.type == "meta"
    assert pg._zero_row.device.type == "meta" and not pg.pinned


def _recording_pin_memory(monkeypatch, factory: str) -> list:
    """``torch.<factory>`` records its ``pin_memory`` and allocates unpinned (a CPU torch
    cannot pin)."""
    real, asked = getattr(torch, factory), []

    def allocate(*args, pin_memory=False, **kwargs):
        asked.append(pin_memory)
        return real(*args, **kwargs)

    monkeypatch.setattr(torch, factory, allocate)
    return asked


def test_on_cuda_the_staged_indices_go_up_into_the_launchers_own_device_copy():
    """Host staging first (host work only), then one copy up into a device buffer of the
    launcher's, on the buffer's device: the launch gathers by that, never by host memory.
    (A CPU launcher pretends to be on CUDA; a ``meta`` buffer stands for a device.)"""
    pg = _pretend_cuda(StepLauncher(_buf(), backend="reference", pinned=False))
    host = torch.tensor([5, 1, 2])
    staged = pg.stage_host_indices(host, host)
    gi = pg.upload_host_indices(staged)
    assert gi.tolist() == [5, 1, 2] and gi.data_ptr() != staged.data_ptr()
    assert gi.data_ptr() == pg._staging[1].data_ptr()
    assert pg.launch(gi, None, None, True).tolist() == [105, 101, 102, 308]
    meta = torch.zeros(8, dtype=torch.int64, device="meta")
    on_meta = _pretend_cuda(StepLauncher(meta, backend="reference", pinned=False))
    on_meta.stage_host_indices(host, host)
    assert [t.device.type for t in on_meta._staging] == ["cpu", "meta"]


@pytest.mark.parametrize("pinned", [True, False], ids=["pinned", "confidential computing"])
def test_the_host_copies_are_pinned_exactly_on_cuda_unless_the_host_forbids_it(monkeypatch, pinned):
    """The staged indices and the host row: pinned on CUDA (as SGLang's own staging), and
    pageable under Confidential Computing (as SGLang's ``is_pin_memory_available``); the
    device copy of the indices on the buffer's device."""
    on_host = StepLauncher(_buf(), backend="reference")
    on_cuda = _pretend_cuda(StepLauncher(_buf(), backend="reference", pinned=pinned))
    asked = _recording_pin_memory(monkeypatch, "empty")
    for pg in (on_host, on_cuda):
        pg.stage_host_indices(torch.tensor([1, 2]), torch.tensor([1, 2]))
        pg.row_to_host(torch.tensor([3, 4, 7]))
    assert asked == [False, False, False, pinned, False, pinned]  # (staging, device), row


def test_an_unknown_backend_is_refused_naming_the_known_ones():
    with pytest.raises(ValueError) as info:
        StepLauncher(_buf(), backend="cuda-graphs")
    assert str(info.value) == f"unknown backend 'cuda-graphs'; one of {backend_mod.BACKENDS}"
