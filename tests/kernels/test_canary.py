"""The start-up canary catches a wrong launcher and a wrong kernel before serving.

On a CPU the direct launch is stood in for by a compiled-kernel stand-in that runs the
real kernel in the interpreter (tests/support/fake_triton.py); planting a fault in it is a wrong
launcher, planting one in the kernel's normal launch is a wrong kernel."""

import logging

import pytest
import torch
from support.fake_triton import FakeCompiled, bound_launcher

from spec_fused import log
from spec_fused import relay as relay_mod
from spec_fused.kernels import backend as backend_mod
from spec_fused.kernels import canary as canary_mod
from spec_fused.kernels import publish_gather as kernel
from spec_fused.kernels.step_launcher import StepLauncher
from spec_fused.tools.traces import TraceConfig, make_future_map, run_trace


@pytest.fixture(autouse=True)
def fresh_verdicts():
    backend_mod._verdicts.clear()
    log.reset()
    yield
    backend_mod._verdicts.clear()


def _launchers(monkeypatch, make):
    """The canary builds its launchers with ``make(buf, **options)``."""
    monkeypatch.setattr(canary_mod, "StepLauncher", make)


def _wrong_kernel(monkeypatch, spoil):
    """The kernel's normal launch, then ``spoil(args)``: a wrong kernel."""
    real = kernel.launch_triton

    def wrong(a):
        compiled = real(a)
        spoil(a)
        return compiled

    monkeypatch.setattr(kernel, "launch_triton", wrong)


def _canary(monkeypatch, corrupt=None):
    compiled = FakeCompiled(corrupt=corrupt)
    _launchers(monkeypatch, lambda buf, **kw: bound_launcher(buf, compiled, **kw))
    return canary_mod.canary("cpu"), compiled


def test_a_sound_launcher_passes_every_case_through_the_direct_launch(monkeypatch):
    verdict, compiled = _canary(monkeypatch)
    assert verdict.backend == "interpreter" and verdict.direct and not verdict.notes
    assert verdict.cases == 2 * len(canary_mod.CASES)
    assert len(compiled.calls) == len(canary_mod.CASES)  # every per-step launch was direct
    assert "match the torch reference" in verdict.describe()


def test_a_wrong_direct_launch_is_caught_and_the_normal_launch_used(monkeypatch, caplog):
    def off_by_one(out):
        out += 1

    with caplog.at_level(logging.INFO, logger="spec_fused"):
        verdict, _ = _canary(monkeypatch, corrupt=off_by_one)
    assert verdict.backend == "interpreter" and not verdict.direct
    assert len(verdict.notes) == 1
    assert verdict.notes[0].startswith("the direct launch failed the canary (lengths [")
    assert verdict.notes[0].endswith("): normal launch")
    lines = [r.getMessage() for r in caplog.records if "start-up canary" in r.getMessage()]
    assert lines == [
        "spec_fused: Triton's normal launch is used (the start-up canary failed the direct launch)",
        f"spec_fused: start-up canary on cpu: {verdict.notes[0]}",
    ]


def test_a_wrong_kernel_is_caught_and_the_reference_serves(monkeypatch, caplog):
    _wrong_kernel(monkeypatch, lambda a: a.out.mul_(2))
    with caplog.at_level(logging.WARNING, logger="spec_fused"):
        verdict = canary_mod.canary("cpu")
    assert verdict.backend == "reference" and verdict.notes
    # The kernel is wrong, not the direct launch: one step down, one line, no blame on
    # the direct launch.
    assert len(verdict.notes) == 1 and "fused kernel failed the canary" in verdict.notes[0]
    lines = [r.getMessage() for r in caplog.records if "start-up canary" in r.getMessage()]
    assert len(lines) == 1 and "torch reference" in lines[0]
    # From now on the device's backend is the reference, and serving is right.
    backend, why = backend_mod.explain_backend("cpu")
    assert backend == "reference" and "start-up canary" in why
    from spec_fused.integration import sglang_patch

    cfg = TraceConfig(seed=3, steps=20)
    want = run_trace(make_future_map("EAGLE", cfg), cfg)
    sglang_patch.apply()
    try:
        fm = make_future_map("EAGLE", cfg)
        got = run_trace(fm, cfg)
        assert relay_mod.relay_for(fm).launcher.backend == "reference"
    finally:
        sglang_patch.remove()
    assert got == want


def test_a_launch_that_raises_is_caught_like_a_wrong_one(monkeypatch):
    def boom(out):
        raise ValueError("the launcher's own failure: bad argument 9")

    verdict, _ = _canary(monkeypatch, corrupt=boom)
    assert not verdict.direct and "bad argument 9" in verdict.notes[0]


def test_the_reference_needs_no_canary(monkeypatch):
    monkeypatch.setenv("SPEC_FUSED_FORCE_REFERENCE", "1")
    verdict = canary_mod.canary("cpu")
    assert verdict.backend == "reference" and verdict.cases == 0 and not verdict.notes


def test_a_canary_that_cannot_set_up_proves_nothing_and_the_reference_serves(monkeypatch, caplog):
    """Nothing checked is nothing proven: never a verdict of "direct launch" by default."""

    def broken(buf, **options):
        raise RuntimeError("CUDA error: out of memory")

    _launchers(monkeypatch, broken)
    with caplog.at_level(logging.WARNING, logger="spec_fused"):
        verdict = canary_mod.canary("cpu")
    assert (verdict.backend, verdict.direct, verdict.cases) == ("reference", False, 0)
    assert verdict.notes == [
        "the fused kernel failed the canary (RuntimeError: CUDA error: "
        "out of memory): torch reference"
    ]
    assert backend_mod.explain_backend("cpu")[0] == "reference"


def test_the_debug_canary_proves_the_poisoning_launcher_the_relay_builds():
    verdict = canary_mod.canary("cpu", debug=True)
    assert (verdict.backend, verdict.notes) == ("interpreter", [])
    assert verdict.cases == 2 * len(canary_mod.CASES)


def test_the_debug_canary_catches_a_kernel_that_does_not_poison(monkeypatch):
    """Consume-once poisoning is part of what debug mode launches; a kernel that skips
    it leaves the buffer unlike the reference's."""
    real = kernel.launch_triton
    monkeypatch.setattr(kernel, "launch_triton", lambda a: real(a._replace(poison=False)))
    assert canary_mod.canary("cpu").notes == []  # release mode does not poison
    backend_mod._verdicts.clear()
    verdict = canary_mod.canary("cpu", debug=True)
    assert verdict.backend == "reference"
    assert verdict.notes[0].startswith(
        "the fused kernel failed the canary (CanaryMismatch: published buffer ["
    )


def test_the_verdict_says_direct_only_for_launches_that_went_direct(monkeypatch):
    """A launch hook (a profiler) makes the per-step path take the normal launch while
    nothing blocks the direct one: the verdict reports what ran, not what was allowed."""
    compiled = FakeCompiled()

    def hooked(buf, **options):
        launcher = bound_launcher(buf, compiled, **options)
        launcher._direct.ready = lambda: False  # as DirectLaunch.ready() with a hook set
        return launcher

    _launchers(monkeypatch, hooked)
    verdict = canary_mod.canary("cpu")
    assert verdict.backend == "interpreter" and not verdict.notes
    assert not verdict.direct and compiled.calls == []
    assert verdict.describe().startswith("normal launch")


def test_one_verdict_per_physical_device(monkeypatch):
    """``cuda`` and ``cuda:0`` are one device when 0 is current: selftest's verdict is the
    one the relay on ``cuda:0`` reads, and a prewarm proves nothing twice."""
    import torch

    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    assert backend_mod.device_key("cuda") == backend_mod.device_key("cuda:0") == "cuda:0"
    assert backend_mod.device_key("cuda:1") == "cuda:1"
    verdict = backend_mod.record_verdict(backend_mod.Verdict("cuda", "triton", direct=True))
    assert backend_mod.verdict_for("cuda:0") is verdict and verdict.device == "cuda:0"
    assert backend_mod.verdict_for("cuda:1") is None


def test_the_verdict_says_what_proving_cost():
    import time

    started = time.perf_counter()
    verdict = canary_mod.canary("cpu")
    assert 0 < verdict.seconds <= time.perf_counter() - started
    assert f"in {verdict.seconds:.2f} s" in verdict.describe()


class _Recording(StepLauncher):
    """The launcher the canary builds, recording each launch: ``(gather dtype, publish
    values dtype or None, row)``."""

    def __init__(self, buf, **options):
        super().__init__(buf, **options)
        self.seen = []
        real_checked, real_launch = self.launch_checked, self.launch

        def record(real):
            def launch(gi, pi, pv, row):
                self.seen.append((gi.dtype, None if pv is None else pv.dtype, row))
                return real(gi, pi, pv, row)

            return launch

        self.launch_checked, self.launch = record(real_checked), record(real_launch)


@pytest.mark.parametrize("debug", [False, True])
def test_the_canary_launches_every_case_as_named_on_the_launcher_the_relay_builds(
    monkeypatch, debug
):
    """Debug mode as the relay will use it; each case's values dtype and row, first
    checked, then per step."""
    made = []

    def make(buf, **options):
        made.append((buf.device, options, _Recording(buf, **options)))
        return made[-1][2]

    _launchers(monkeypatch, make)
    verdict = canary_mod.canary("cpu", debug=debug)
    assert (verdict.backend, verdict.notes) == ("interpreter", [])
    ((device, options, launcher),) = made
    assert device == torch.device("cpu")
    assert options == {"poison": debug, "validate": debug}
    assert launcher.seen == [
        (torch.int64, values, row) for values, row, _ in canary_mod.CASES for _ in range(2)
    ]


def test_a_wrong_sum_is_caught(monkeypatch):
    """The row's sum, the one value the host reads that is not a length."""

    def wrong_sum(a):
        if a.row:
            a.out[a.gather_indices.shape[0]] += 1

    _wrong_kernel(monkeypatch, wrong_sum)
    verdict = canary_mod.canary("cpu")
    assert verdict.backend == "reference"
    assert verdict.notes[-1].startswith("the fused kernel failed the canary (CanaryMismatch: sum ")


def test_a_wrong_kernel_is_blamed_on_the_kernel_where_the_direct_launch_is_bound(monkeypatch):
    """The normal launch of the first check is wrong: the kernel is, whatever launches it."""
    _wrong_kernel(monkeypatch, lambda a: a.out.mul_(2))
    verdict, _ = _canary(monkeypatch)
    assert (verdict.backend, verdict.direct, verdict.cases) == ("reference", False, 0)
    assert len(verdict.notes) == 1
    assert verdict.notes[0].startswith("the fused kernel failed the canary (CanaryMismatch: ")


def test_a_sticky_fault_surfacing_after_a_direct_launch_escapes_naming_the_canary(monkeypatch):
    """On CUDA a direct launch's fault surfaces at the next call that waits for it: here
    the copy of its result to the host. It escapes; nothing steps down."""
    compiled = FakeCompiled()

    class Faulting(torch.Tensor):
        def cpu(self, *args, **kwargs):
            raise RuntimeError("CUDA error: an illegal memory access was encountered")

    def faulting(buf, **options):
        launcher = bound_launcher(buf, compiled, **options)
        real_launch = launcher.launch

        def launch(*args):
            before = launcher.direct_launches
            out = real_launch(*args)
            return out.as_subclass(Faulting) if launcher.direct_launches > before else out

        launcher.launch = launch
        return launcher

    _launchers(monkeypatch, faulting)
    with pytest.raises(RuntimeError) as info:
        canary_mod.canary("cpu")
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert "a sticky device fault surfaced in spec_fused's start-up canary on cpu." in notes
    assert backend_mod.verdict_for("cpu").backend == "interpreter"  # never stepped down


def test_the_verdict_says_direct_only_if_every_per_step_launch_went_direct(monkeypatch):
    """One per-step launch that took the normal launch (a hook set for a moment) is
    enough: the verdict reports what ran."""
    compiled = FakeCompiled()

    def once_hooked(buf, **options):
        launcher = bound_launcher(buf, compiled, **options)
        ready, hooked = launcher._direct.ready, [True]

        def ready_unless_hooked():
            return False if hooked and hooked.pop() else ready()

        launcher._direct.ready = ready_unless_hooked
        return launcher

    _launchers(monkeypatch, once_hooked)
    verdict = canary_mod.canary("cpu")
    assert verdict.backend == "interpreter" and not verdict.notes
    assert len(compiled.calls) == len(canary_mod.CASES) - 1
    assert not verdict.direct and verdict.describe().startswith("normal launch")


def test_on_cuda_the_canary_runs_on_its_own_high_priority_stream_on_that_device(monkeypatch):
    """Under the device, on a fresh priority -1 stream made current, and each check waits
    for that stream only; debug mode handed on as asked."""
    events = []

    class Device:
        def __init__(self, device):
            self.device = device

        def __enter__(self):
            events.append(("device", str(self.device)))

        def __exit__(self, *exc):
            events.append(("device exit",))

    class Stream:
        def __init__(self, device, priority=0):
            events.append(("stream", str(device), priority))

        def synchronize(self):
            events.append(("synchronize",))

    class Current:
        def __init__(self, stream):
            self.stream = stream

        def __enter__(self):
            events.append(("current", type(self.stream).__name__))

        def __exit__(self, *exc):
            events.append(("current exit",))

    def prove(verdict, device, debug, sync):
        events.append(("prove", str(device), debug))
        sync()

    monkeypatch.setattr(canary_mod, "backend_for", lambda device: "triton")
    monkeypatch.setattr(torch.cuda, "device", Device)
    monkeypatch.setattr(torch.cuda, "Stream", Stream)
    monkeypatch.setattr(torch.cuda, "stream", Current)
    monkeypatch.setattr(canary_mod, "_prove", prove)
    verdict = canary_mod.canary("cuda:1", debug=True)
    assert (verdict.device, verdict.backend, verdict.notes) == ("cuda:1", "triton", [])
    assert events == [
        ("device", "cuda:1"),
        ("stream", "cuda:1", -1),
        ("current", "Stream"),
        ("prove", "cuda:1", True),
        ("synchronize",),
        ("current exit",),
        ("device exit",),
    ]
