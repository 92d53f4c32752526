"""The per-step launcher (``StepLauncher``): host reads, one full check then the per-step
path, DP-idle steps, the null backend, staged host indices, binding the direct launch,
and what it binds on CUDA.

Expected lengths come from ``publish_gather_reference`` on a copy of the buffer (the
plain-torch definition of the step: scatter, then gather) or from literals; the launch
path taken is read from what the launcher documents (one full check for a combination it
then remembers, ``launches`` counting device launches, DP-idle steps launching nothing)."""

import pytest
import torch
from support.fake_triton import FakeCompiled, bound_launcher, cpu_direct

from spec_fused.kernels import backend as backend_mod
from spec_fused.kernels import checks, publish_gather, step_launcher
from spec_fused.kernels.checks import InputError, StaleHostMirrorError
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


# ----------------------------------------------------------------------------- host reads


def test_a_release_launcher_waits_once_for_a_row_not_yet_stamped():
    pg = StepLauncher(_buf(), backend="reference")
    pg.launch_checked(torch.tensor([1, 2]), None, None, True)
    stamp = pg.stamp
    pg.ring.np[stamp & 1, -1] = -5  # as a launch not yet complete would leave it
    waits = []

    def wait():
        waits.append(1)
        pg.ring.np[stamp & 1, -1] = stamp

    lens, total = pg.read_row(stamp, 2, wait)
    assert (lens.tolist(), total, waits) == ([101, 102], 203, [1])


@pytest.mark.parametrize("debug", [True, False])
def test_a_debug_launcher_never_waits_again(debug):
    pg = StepLauncher(_buf(), backend="reference", validate=debug)
    pg.launch_checked(torch.tensor([1, 2]), None, None, True)
    pg.ring.np[pg.stamp & 1, -1] = -5
    waits = []
    with pytest.raises(StaleHostMirrorError) as info:
        pg.read_row(pg.stamp, 2, lambda: waits.append(1))
    assert (info.value.cause, waits) == (("stale", []) if debug else ("stale after waiting", [1]))


# ----------------------------------------------------------------------------- one check


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("host", [False, True])
def test_one_full_check_then_none_whatever_the_batch_size(validations, backend, host):
    """``max_batch`` bounds host rows only; a full batch (``n == max_batch``) takes the
    per-step path like any other, and without a host row ``n`` may exceed it."""
    buf = _buf(32)
    ref = buf.clone()
    pg = StepLauncher(buf, max_batch=4, backend=backend)
    sizes = [4, 4, 2, 4] if host else [4, 9, 2, 12]
    for step, n in enumerate(sizes):
        gi = torch.arange(n) * 2
        pi, pv = torch.tensor([step]), torch.tensor([500 + step])
        want = publish_gather_reference(ref, gi, pi, pv)
        out = pg.launch(gi, pi, pv, host)
        assert out.tolist() == want.seq_lens.tolist()
        if host:
            lens, total = pg.read_row(pg.stamp, n)
            assert (lens.tolist(), total) == (want.seq_lens.tolist(), int(want.seq_lens_sum))
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
def test_a_dp_idle_step_launches_nothing_and_reads_back_empty(backend):
    pg = StepLauncher(_buf(), backend=backend)
    empty = torch.empty(0, dtype=torch.int64)
    for launch in (pg.launch_checked, pg.launch):
        out = launch(empty, None, None, True)
        assert out.dtype == torch.int64 and out.tolist() == []
        assert pg.launches == 0
        lens, total = pg.read_row(pg.stamp, 0)
        assert (lens.tolist(), total) == ([], 0)
    # and in the steady state (the host combination already launched once); the
    # reference's per-step path makes its (empty) torch ops all the same
    pg.launch(torch.tensor([1, 2]), None, None, True)
    launches = pg.launches
    out = pg.launch(empty, None, None, True)
    assert out.tolist() == [] and pg.read_row(pg.stamp, 0)[1] == 0
    if backend != "reference":
        assert pg.launches == launches


@pytest.mark.parametrize("backend", BACKENDS)
def test_each_launch_counts_once_and_has_its_own_stamp(backend):
    pg = StepLauncher(_buf(), backend=backend)
    stamps = []
    for step in range(4):
        pg.launch(torch.tensor([step]), None, None, True)
        stamps.append(pg.stamp)
        assert pg.launches == step + 1
    assert stamps == [0, 1, 2, 3]


# ----------------------------------------------------------------------------- null backend


def test_the_null_backend_does_no_device_work_but_keeps_the_rows_stamps():
    buf = _buf()
    before = buf.clone()
    pg = StepLauncher(buf, backend="null")
    pg.launch_checked(torch.tensor([1]), torch.tensor([1]), torch.tensor([7]), True)
    first = pg.stamp
    pg.launch(torch.tensor([2]), None, None, False)
    pg.launch(torch.tensor([3]), None, None, False)
    assert torch.equal(buf, before) and pg.launches == 0
    pg.read_row(first, 1)  # still launch ``first``'s row: the later launches had no host row


# ----------------------------------------------------------------------------- staging


def test_staged_host_indices_are_an_int64_copy_the_launch_gathers_through():
    buf = _buf()
    pg = StepLauncher(buf, max_batch=4, backend="interpreter")
    host = torch.tensor([5, 1, 2], dtype=torch.int32)
    view = pg.stage_host_indices(host)
    assert view is pg.staged and view.dtype == torch.int64 and view.tolist() == [5, 1, 2]
    host[0] = 9  # the staged copy is the launcher's own
    assert pg.launch(view, None, None, True).tolist() == [105, 101, 102]
    longer = pg.stage_host_indices(torch.arange(7))  # more than max_batch: a bigger buffer
    assert longer.tolist() == list(range(7)) and pg.staged is longer


# ----------------------------------------------------------------------------- binding


def test_binding_a_compiled_kernel_takes_every_parameter():
    fast = cpu_direct()
    assert fast.bind(FakeCompiled()) is not None and fast.blocked is None


def test_the_bound_launch_writes_the_stamp_at_the_rows_end():
    buf = _buf()
    ref = buf.clone()
    pg = bound_launcher(buf, FakeCompiled())
    for step in range(3):
        gi = torch.tensor([step, 4])
        want = publish_gather_reference(ref, gi)
        pg.launch(gi, None, None, True)
        row = pg.ring.rows[pg.stamp % 2]
        assert int(row[-1]) == pg.stamp and row[:3].tolist() == want.seq_lens.tolist() + [
            int(want.seq_lens_sum)
        ]


@pytest.mark.parametrize("backend", BACKENDS)
def test_sums_beyond_float_precision_are_exact(backend):
    buf = torch.tensor([2**40 + 1, 2**41 + 3, 5, 2**53 - 1], dtype=torch.int64)
    ref = buf.clone()
    pg = StepLauncher(buf, backend=backend)
    gi = torch.tensor([0, 1, 2])
    want = publish_gather_reference(ref, gi)
    for launch in (pg.launch_checked, pg.launch):
        out = launch(gi, None, None, True)
        lens, total = pg.read_row(pg.stamp, 3)
        assert out.tolist() == lens.tolist() == want.seq_lens.tolist()
        assert total == int(want.seq_lens_sum) == 2**40 + 2**41 + 9


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


def test_the_host_ring_is_pinned_exactly_on_cuda(monkeypatch):
    from spec_fused.kernels import step_launcher as mod

    pinned = []
    real = mod.HostRing

    def ring(max_batch, **kwargs):
        pinned.append(kwargs["pinned"])
        return real(max_batch, pinned=False)

    monkeypatch.setattr(mod, "HostRing", ring)
    StepLauncher(_buf(), backend="reference").ensure_host_ring()
    _pretend_cuda(StepLauncher(_buf(), backend="reference")).ensure_host_ring()
    assert pinned == [False, True]


def test_the_guard_accepts_inputs_on_the_buffers_device_and_the_staged_copy_only():
    """Gather indices on the buffer's device or the launcher's own staged (pinned) copy;
    publish indices and values on the buffer's device. A meta tensor stands for a tensor
    on another device."""
    pg = StepLauncher(_buf(), backend="reference")
    staged = pg.stage_host_indices(torch.tensor([1, 2]))
    elsewhere = torch.tensor([1, 2], device="meta")
    here = torch.tensor([1, 2])
    assert pg._key(staged, None, None, False) == (torch.int64, False)
    assert pg._key(elsewhere, None, None, False) is None
    assert pg._key(staged, elsewhere, elsewhere, False) is None
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
def test_a_launcher_on_the_host_yields_the_sum_without_a_mirror(backend):
    """A CPU relay's lengths are host lengths already: ``host=True`` asks the same launch
    for their sum, and no ring is made or written - an idle step's sum is 0."""
    buf = torch.arange(32, dtype=torch.int64) * 3
    pg = StepLauncher(buf, backend=backend, mirror=False)
    for launch in (pg.launch_checked, pg.launch, pg.launch):
        out = launch(torch.tensor([2, 5, 9]), torch.tensor([5]), torch.tensor([100]), True)
        assert out.tolist() == [6, 100, 27] and int(pg.out_sum) == 133
    pg.launch(torch.tensor([], dtype=torch.int64), None, None, True)
    assert int(pg.out_sum) == 0 and pg.ring is None


@pytest.mark.parametrize("backend", ["interpreter", "reference"])
def test_a_rebound_launcher_keeps_its_backend_and_launches_into_the_new_buffer(backend):
    """FutureMap may swap its buffer (``_adopt_relay``): the same launcher, the same backend,
    every later step into the new buffer."""
    old, new = torch.zeros(16, dtype=torch.int64), torch.arange(16, dtype=torch.int64) * 10
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


def test_a_host_row_read_before_any_host_launch_is_refused_naming_the_step():
    pg = StepLauncher(_buf(), backend="interpreter")
    pg.launch(torch.tensor([1]), None, None, False)
    with pytest.raises(
        StaleHostMirrorError, match=r"^no host-mirror launch was made \(step 3\)$"
    ) as info:
        pg.read_row(3, 1)
    assert info.value.cause == "no ring"


def test_the_launchers_state_lives_on_its_buffers_device():
    """The sum and the debug flag are made on the buffer's device, whatever it is (a
    ``meta`` buffer here: a device other than the host, without CUDA)."""
    pg = StepLauncher(
        torch.zeros(8, dtype=torch.int64, device="meta"), poison=True, backend="reference"
    )
    assert pg.out_sum.device.type == "meta" and pg._flag.device.type == "meta"
    assert not pg.pinned


def _recording_pin_memory(monkeypatch, factory: str) -> list:
    """``torch.<factory>`` records its ``pin_memory`` and allocates unpinned (a CPU torch
    cannot pin)."""
    real, asked = getattr(torch, factory), []

    def allocate(*args, pin_memory=False, **kwargs):
        asked.append(pin_memory)
        return real(*args, **kwargs)

    monkeypatch.setattr(torch, factory, allocate)
    return asked


class _OnCudaFromTheStart(StepLauncher):
    """A launcher that is on CUDA (pinning, device rules) from its construction on."""

    _on_cuda = property(lambda self: True, lambda self, value: None)


def test_host_indices_are_staged_in_pinned_memory_exactly_on_cuda(monkeypatch):
    host, cuda = StepLauncher(_buf(), backend="reference"), _pretend_cuda(StepLauncher(_buf()))
    asked = _recording_pin_memory(monkeypatch, "empty")
    host.stage_host_indices(torch.tensor([1, 2]))
    cuda.stage_host_indices(torch.tensor([1, 2]))
    assert asked == [False, True]


def test_on_cuda_the_debug_flag_is_pinned_host_memory_the_kernel_writes_into(monkeypatch):
    """Pinned on the host (the host reads it without a copy), whatever the buffer's device
    (a ``meta`` buffer stands for a CUDA one here); without pinning, on the device."""
    asked = _recording_pin_memory(monkeypatch, "full")
    buf = torch.zeros(8, dtype=torch.int64, device="meta")
    pinned = _OnCudaFromTheStart(buf, poison=True, backend="reference")
    unpinned = _OnCudaFromTheStart(buf, poison=True, backend="reference", pinned=False)
    assert asked == [True, False]
    assert pinned._flag.device.type == "cpu" and unpinned._flag.device.type == "meta"


def test_on_cuda_a_consumed_read_is_reported_at_the_next_launch_not_by_waiting(monkeypatch):
    """The pinned flag is read when the host next touches the launcher (a launch, a row
    read), never right after the launch that set it: that would wait for the device."""
    from spec_fused.kernels.checks import PoisonedSlotError

    _recording_pin_memory(monkeypatch, "full")
    pg = _OnCudaFromTheStart(_buf(), poison=True, backend="reference")
    pg.launch_checked(torch.tensor([1]), None, None, False)
    pg.launch_checked(torch.tensor([1]), None, None, False)  # reads slot 1 consumed: flagged
    with pytest.raises(PoisonedSlotError) as info:
        pg.launch_checked(torch.tensor([2]), None, None, False)
    assert info.value.slot == 1


class _SaysCuda(torch.Tensor):
    """A CPU tensor that says it is on CUDA (what the reference step asks of its buffer)."""

    @property
    def is_cuda(self):
        return True


def test_the_release_reference_moves_only_the_staged_host_indices_to_the_device():
    buf = _buf().as_subclass(_SaysCuda)
    pg = StepLauncher(buf, backend="reference")
    pg.stage_host_indices(torch.tensor([1, 2]))
    gi = torch.tensor([3, 4])
    for _ in range(2):  # checked, then the lean reference step
        assert pg.launch(gi, None, None, False).tolist() == [103, 104]


def test_an_unknown_backend_is_refused_naming_the_known_ones():
    with pytest.raises(ValueError) as info:
        StepLauncher(_buf(), backend="cuda-graphs")
    assert str(info.value) == f"unknown backend 'cuda-graphs'; one of {backend_mod.BACKENDS}"
