"""The start-up canary catches a wrong launcher and a wrong kernel before serving.

On a CPU the direct launch is stood in for by a compiled-kernel stand-in that runs the
real kernel in the interpreter (tests/support/fake_triton.py); planting a fault in it is a wrong
launcher, planting one in the kernel's normal launch is a wrong kernel."""

import logging

import pytest
from support.fake_triton import FakeCompiled, bound_launcher

from spec_fused import log
from spec_fused import relay as relay_mod
from spec_fused.kernels import backend as backend_mod
from spec_fused.kernels import canary as canary_mod
from spec_fused.kernels import publish_gather as kernel
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

    with caplog.at_level(logging.WARNING, logger="spec_fused"):
        verdict, _ = _canary(monkeypatch, corrupt=off_by_one)
    assert verdict.backend == "interpreter" and not verdict.direct
    assert len(verdict.notes) == 1 and "direct launch failed the canary" in verdict.notes[0]
    lines = [r.getMessage() for r in caplog.records if "start-up canary" in r.getMessage()]
    assert len(lines) == 1 and "normal launch" in lines[0]


def test_a_wrong_kernel_is_caught_and_the_reference_serves(monkeypatch, caplog):
    real = kernel.launch_triton

    def wrong(a):
        compiled = real(a)
        a.out.mul_(2)
        return compiled

    monkeypatch.setattr(kernel, "launch_triton", wrong)
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


def test_a_wrong_host_row_is_caught(monkeypatch):
    """The kernel's host-mirror store is checked too, not only the lengths."""
    real = kernel.launch_triton

    def wrong_row(a):
        compiled = real(a)
        if a.host_out is not None and a.gather_indices.numel():
            a.host_out[0] += 5
        return compiled

    monkeypatch.setattr(kernel, "launch_triton", wrong_row)
    verdict = canary_mod.canary("cpu")
    assert verdict.backend == "reference" and "host row" in verdict.notes[-1]


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
    assert "published buffer" in verdict.notes[0]


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
    verdict = canary_mod.canary("cpu")
    assert verdict.seconds > 0
    assert f"in {verdict.seconds:.2f} s" in verdict.describe()
