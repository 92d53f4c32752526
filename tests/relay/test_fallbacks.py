"""Never break the server: each fault is injected, and SGLang's lengths still come out right.

The ladder is fused Triton kernel -> torch reference -> SGLang's own FutureMap method, per
FutureMap, with one log line per reason. The trace tests compare the patched run against
the real unpatched FutureMap on the same trace; the ones below "one relay, driven
directly" break one rung of a FusedRelay and read what lands in the buffer and the log,
and "hand-back" covers a relay given back to SGLang."""

import logging
from types import SimpleNamespace

import pytest
import torch
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
from support.fake_cuda import CFG as SMALL
from support.fake_cuda import EXACT, direct_relay, messages

from spec_fused import log
from spec_fused import relay as relay_mod
from spec_fused.integration import sglang_patch
from spec_fused.kernels import backend as backend_mod
from spec_fused.kernels import publish_gather as pg
from spec_fused.kernels import step_launcher
from spec_fused.tools.traces import TraceConfig, decode_batch, make_future_map, run_trace

CFG = TraceConfig(seed=7, steps=40, pool=40, max_running=12)
EAGLE = SpeculativeAlgorithm.EAGLE


@pytest.fixture(scope="module")
def upstream():
    return run_trace(make_future_map(EAGLE, CFG), CFG)


def _patched_run(algo=EAGLE, cfg=CFG, before_trace=None):
    log.reset()
    sglang_patch.apply()
    try:
        fm = make_future_map(algo, cfg)
        if before_trace:
            before_trace(fm)
        return run_trace(fm, cfg), fm
    finally:
        sglang_patch.remove()


def _break_reference(monkeypatch, broken):
    """Both reference paths fail: the checked one and the launcher's per-step path."""
    monkeypatch.setattr(pg, "launch_reference", broken)
    monkeypatch.setattr(step_launcher.StepLauncher, "_lean_reference", lambda self, *a: broken())


def test_kernel_that_raises_falls_back_to_the_reference(monkeypatch, caplog, upstream):
    calls = []

    def broken(*args, **kwargs):
        calls.append(1)
        raise RuntimeError("triton compile failed: out of resources")

    monkeypatch.setattr(pg, "launch_triton", broken)
    with caplog.at_level(logging.WARNING, logger="spec_fused"):
        got, fm = _patched_run()
    assert got == upstream
    relay = fm.__dict__[relay_mod.RELAY_ATTR]
    assert relay.launcher.backend == "reference" and relay.disabled_reason is None
    assert len(calls) == 1  # tried once, then the reference for good
    hits = [m for m in messages(caplog) if "falling back to the torch reference" in m]
    assert len(hits) == 1 and "out of resources" in hits[0]


def test_reference_that_raises_too_hands_back_to_sglang(monkeypatch, caplog, upstream):
    def broken(*args, **kwargs):
        raise RuntimeError("device lost")

    monkeypatch.setattr(pg, "launch_triton", broken)
    _break_reference(monkeypatch, broken)
    with caplog.at_level(logging.WARNING, logger="spec_fused"):
        got, fm = _patched_run()
    assert got == upstream
    relay = fm.__dict__[relay_mod.DISABLED_ATTR]
    assert relay.disabled_reason and relay_mod.relay_for(fm) is None
    hits = [m for m in messages(caplog) if "SGLang's own relay takes over" in m]
    assert len(hits) == 1


def test_failure_after_a_pending_publish_still_lands_it(monkeypatch, upstream):
    """The first resolve fails after earlier publishes were deferred: they must not be lost."""
    state = {"n": 0}
    real_launch = pg.launch_triton

    def flaky(*args, **kwargs):
        state["n"] += 1
        if state["n"] >= 3:
            raise RuntimeError("launch failed")
        return real_launch(*args, **kwargs)

    monkeypatch.setattr(pg, "launch_triton", flaky)
    _break_reference(monkeypatch, lambda *a, **k: (_ for _ in ()).throw(RuntimeError("x")))
    got, _ = _patched_run()
    assert got == upstream


def test_triton_missing_uses_the_reference(monkeypatch, upstream):
    monkeypatch.setattr(backend_mod, "triton", None)
    assert backend_mod.backend_for("cpu") == "reference"
    got, fm = _patched_run()
    assert got == upstream and fm.__dict__[relay_mod.RELAY_ATTR].launcher.backend == "reference"


def test_forced_reference_backend(monkeypatch, upstream):
    monkeypatch.setenv("SPEC_FUSED_FORCE_REFERENCE", "1")
    got, fm = _patched_run()
    assert got == upstream and fm.__dict__[relay_mod.RELAY_ATTR].launcher.backend == "reference"


@pytest.mark.parametrize("debug", [False, True])
def test_future_map_without_the_consume_once_flag_is_relayed(upstream, monkeypatch, debug):
    """0.5.15's FutureMap has no ``_publish_fresh``: the relay works without it, and in
    debug mode checks nothing the release does not."""
    if debug:
        monkeypatch.setenv("SPEC_FUSED_DEBUG", "1")
    got, fm = _patched_run(before_trace=lambda fm: fm.__dict__.pop("_publish_fresh", None))
    assert got == upstream
    relay = relay_mod.relay_for(fm)
    assert relay is not None and not relay.consume_once_flag and relay.launcher.launches > 0


def test_future_map_missing_an_attribute_runs_sglangs_path(caplog, upstream, monkeypatch):
    # An SGLang whose FutureMap instances lack something the relay relies on: the relay
    # declines that FutureMap, SGLang's own methods serve it.
    real_init = relay_mod.FusedRelay.__init__

    def missing(self, fm, *args, **kwargs):
        raise AttributeError("'FutureMap' object has no attribute 'publish_ready'")

    monkeypatch.setattr(relay_mod.FusedRelay, "__init__", missing)
    with caplog.at_level(logging.WARNING, logger="spec_fused"):
        got, fm = _patched_run()
    monkeypatch.setattr(relay_mod.FusedRelay, "__init__", real_init)
    assert got == upstream
    assert relay_mod.relay_for(fm) is None
    assert any(
        "cannot relay this FutureMap" in m and "publish_ready" in m for m in messages(caplog)
    )


def test_a_future_map_that_cannot_be_relayed_says_why(monkeypatch, caplog):
    def broken(self, *args, **kwargs):
        raise ValueError("no good")

    monkeypatch.setattr(relay_mod.FusedRelay, "__init__", broken)
    with caplog.at_level(logging.WARNING, logger="spec_fused"):
        assert relay_mod.relay_for(make_future_map("EAGLE", SMALL)) is None
    assert messages(caplog) == [
        "spec_fused: cannot relay this FutureMap (ValueError: no good); SGLang's relay runs"
    ]


def test_each_kind_of_set_up_failure_is_logged_once(monkeypatch, caplog):
    """The same text from two kinds of failure is two reasons."""
    errors = iter([ValueError("no good"), ValueError("no good"), TypeError("no good")])

    def broken(self, *args, **kwargs):
        raise next(errors)

    monkeypatch.setattr(relay_mod.FusedRelay, "__init__", broken)
    with caplog.at_level(logging.WARNING, logger="spec_fused"):
        for _ in range(3):
            assert relay_mod.relay_for(make_future_map("EAGLE", SMALL)) is None
    assert messages(caplog) == [
        "spec_fused: cannot relay this FutureMap (ValueError: no good); SGLang's relay runs",
        "spec_fused: cannot relay this FutureMap (TypeError: no good); SGLang's relay runs",
    ]


def test_a_sticky_fault_while_setting_up_a_relay_escapes_naming_the_set_up(monkeypatch):
    def dead(self, *args, **kwargs):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(relay_mod.FusedRelay, "__init__", dead)
    with pytest.raises(RuntimeError) as info:
        relay_mod.relay_for(make_future_map("EAGLE", SMALL))
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert "surfaced in spec_fused's relay set-up for a FutureMap." in notes


def test_algorithm_without_capabilities_runs_sglangs_path(caplog, monkeypatch):
    from spec_fused import caps as caps_mod

    known = caps_mod.known_algorithms()
    monkeypatch.setattr(caps_mod, "known_algorithms", lambda: [a for a in known if a != "EAGLE3"])
    algo = SpeculativeAlgorithm.EAGLE3
    want = run_trace(make_future_map(algo, CFG), CFG)
    with caplog.at_level(logging.WARNING, logger="spec_fused"):
        got, fm = _patched_run(algo)
    assert got == want and relay_mod.relay_for(fm) is None
    hits = [
        m for m in messages(caplog) if "no capabilities for speculative algorithm 'EAGLE3'" in m
    ]
    assert len(hits) == 1


def test_algorithms_without_capabilities_are_logged_once_each(monkeypatch, caplog):
    from spec_fused import caps as caps_mod

    known = [a for a in caps_mod.known_algorithms() if a not in ("EAGLE3", "STANDALONE")]
    monkeypatch.setattr(caps_mod, "known_algorithms", lambda: known)
    with caplog.at_level(logging.WARNING, logger="spec_fused"):
        for algo in ("EAGLE3", "STANDALONE", "EAGLE3"):
            assert relay_mod.relay_for(make_future_map(algo, SMALL)) is None
    lines = messages(caplog)
    assert len(lines) == 2
    assert lines[0].startswith("spec_fused: no capabilities for speculative algorithm 'EAGLE3'")
    assert lines[0].endswith("SpecCaps(...)); SGLang's relay runs")


def test_each_reason_is_logged_once(monkeypatch, caplog):
    monkeypatch.setattr(
        pg, "launch_triton", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("bad"))
    )
    with caplog.at_level(logging.WARNING, logger="spec_fused"):
        sglang_patch.apply()
        try:
            for seed in range(3):  # three FutureMaps, one reason
                cfg = TraceConfig(seed=seed, steps=10)
                run_trace(make_future_map(EAGLE, cfg), cfg)
        finally:
            sglang_patch.remove()
    assert len([m for m in messages(caplog) if "falling back" in m]) == 1


def test_non_speculative_future_map_is_left_to_sglang():
    sglang_patch.apply()
    try:
        fm = make_future_map(SpeculativeAlgorithm.NONE, CFG)
        fm.publish(torch.tensor([1, 2]), torch.tensor([5, 6]))
        assert relay_mod.relay_for(fm) is None
        assert fm.new_seq_lens_buf[1:3].tolist() == [5, 6]  # SGLang's scatter ran at once
    finally:
        sglang_patch.remove()


def test_remove_lands_pending_publishes():
    sglang_patch.apply()
    fm = make_future_map(EAGLE, CFG)
    fm.publish(torch.tensor([3, 4]), torch.tensor([30, 40], dtype=torch.int32))
    relay = relay_mod.relay_for(fm)
    assert relay.pending is not None
    sglang_patch.remove()
    assert fm.new_seq_lens_buf[3:5].tolist() == [30, 40] and relay.pending is None


def test_any_reader_of_the_buffer_sees_published_values():
    sglang_patch.apply()
    try:
        fm = make_future_map(EAGLE, CFG)
        fm.publish(torch.tensor([3, 4]), torch.tensor([30, 40]))
        assert fm.__dict__[relay_mod.RELAY_ATTR].pending is not None
        assert fm.new_seq_lens_buf[3:5].tolist() == [30, 40]  # e.g. DSPARK's own readers
    finally:
        sglang_patch.remove()


def test_an_unsafe_host_override_is_refused_in_one_line(monkeypatch, caplog, upstream):
    """``SPEC_FUSED_HOST_SEQ_LENS=reserved`` where an attention backend reads host
    lengths: refused, logged once, the relay keeps exact host lengths."""
    monkeypatch.setenv("SPEC_FUSED_HOST_SEQ_LENS", "reserved")
    with caplog.at_level(logging.WARNING, logger="spec_fused"):
        got, fm = _patched_run()
    assert got == upstream and relay_mod.relay_for(fm).host_seq_lens == "exact"
    hits = [m for m in messages(caplog) if "override refused" in m]
    assert len(hits) == 1 and "reads host lengths" in hits[0]


@pytest.mark.parametrize(
    "error",
    [
        ValueError("Pointer argument (at 6) cannot be accessed from Triton (cpu tensor?)"),
        TypeError("function takes exactly 25 arguments (24 given)"),
        RuntimeError("Triton Error [CUDA]: invalid argument"),
    ],
)
def test_the_launchers_own_errors_go_down_the_reference_rung(monkeypatch, caplog, upstream, error):
    """Triton's launcher raises ValueError/TypeError for its own failures: those are the
    backend's, not the caller's, and the torch reference takes over."""

    def broken(*args, **kwargs):
        raise error

    monkeypatch.setattr(pg, "launch_triton", broken)
    with caplog.at_level(logging.WARNING, logger="spec_fused"):
        got, fm = _patched_run()
    assert got == upstream
    assert relay_mod.relay_for(fm).launcher.backend == "reference"
    assert any("falling back to the torch reference" in m for m in messages(caplog))


@pytest.mark.parametrize("device", ["mps", "xpu", "meta"])
def test_devices_triton_cannot_drive_get_the_reference(device):
    backend, reason = backend_mod.explain_backend(device)
    assert backend == "reference" and "reference" in reason


def test_cpu_without_the_interpreter_serves_with_the_reference(monkeypatch, upstream):
    monkeypatch.setattr(backend_mod, "TRITON_INTERPRETS", False)  # compiled Triton only
    assert backend_mod.backend_for("cpu") == "reference"
    got, fm = _patched_run()
    assert got == upstream and relay_mod.relay_for(fm).launcher.backend == "reference"


# -------------------------------------------------------------- one relay, driven directly


@pytest.mark.parametrize("backend", ["reference", "null"])
def test_a_failing_reference_or_null_backend_is_not_retried(backend, caplog):
    relay, fm, _ = direct_relay(EXACT, ops=None)
    relay.launcher.backend = backend
    calls = []

    def failing(*args):
        calls.append(args)
        raise RuntimeError("boom")

    relay.launcher.launch = failing
    with caplog.at_level(logging.WARNING, logger="spec_fused"):
        with pytest.raises(RuntimeError, match="boom"):
            relay._launch(torch.tensor([1]), None, None, False)
    assert len(calls) == 1 and relay.launcher.backend == backend
    assert not [m for m in messages(caplog) if "falling back" in m]


def test_each_kind_of_kernel_failure_is_logged_once_with_the_device(caplog):
    relay, fm, _ = direct_relay(EXACT, ops=None)
    with caplog.at_level(logging.WARNING, logger="spec_fused"):
        for exc in (RuntimeError("boom"), RuntimeError("boom again"), KeyError("k")):
            relay.launcher.backend = "interpreter"

            def failing(*args, exc=exc):
                raise exc

            relay.launcher.launch = failing
            out = relay._launch(torch.tensor([1]), None, None, False)
            assert relay.launcher.backend == "reference"
            assert out.tolist() == fm.new_seq_lens_buf[1:2].tolist()
    assert [m for m in messages(caplog) if "falling back" in m] == [
        "spec_fused: fused kernel failed on cpu (RuntimeError: boom); falling back to the "
        "torch reference",
        "spec_fused: fused kernel failed on cpu (KeyError: 'k'); falling back to the torch "
        "reference",
    ]


FALLING_BACK = (
    "spec_fused: fused kernel failed on cpu (RuntimeError: kernel broke); "
    "falling back to the torch reference"
)


def _break_kernel(monkeypatch, relay):
    from spec_fused.kernels import publish_gather as pg

    monkeypatch.setattr(
        pg, "launch_triton", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("kernel broke"))
    )
    relay.launcher.backend = relay.launcher.backend  # drop anything bound to the kernel


def test_an_exact_resolve_whose_kernel_fails_gets_its_lengths_from_the_reference(
    monkeypatch, caplog
):
    relay, fm, ops = direct_relay(EXACT)
    with ops.on(ops.forward):
        relay.publish(fm, torch.tensor([1, 2]), torch.tensor([10, 20]))
    _break_kernel(monkeypatch, relay)
    batch = decode_batch([1, 2], SMALL)
    with caplog.at_level(logging.WARNING, logger="spec_fused"):
        relay.resolve(fm, batch)
    assert batch.seq_lens.tolist() == [10, 20] and batch.seq_lens_cpu.tolist() == [10, 20]
    assert batch.seq_lens_sum == 30 and relay.launcher.backend == "reference"
    assert messages(caplog) == [FALLING_BACK]  # and no stale host row read from the device


@pytest.mark.parametrize("on_cuda", [False, True])
def test_a_landing_whose_kernel_fails_lands_on_the_reference(monkeypatch, caplog, on_cuda):
    relay, fm, ops = direct_relay(EXACT, ops="fake" if on_cuda else None)
    relay.publish(fm, torch.tensor([1, 2]), torch.tensor([10, 20]))
    _break_kernel(monkeypatch, relay)
    with caplog.at_level(logging.WARNING, logger="spec_fused"):
        relay.land_pending()
    assert relay.pending is None and fm.new_seq_lens_buf[1:3].tolist() == [10, 20]
    assert relay.launcher.backend == "reference" and messages(caplog) == [FALLING_BACK]


def test_a_settled_int32_publish_lands_in_the_int64_buffer(caplog):
    """SGLang's publish takes int32 lengths too; landing them with plain torch must cast
    (``index_put`` refuses mixed dtypes), or the lengths would be dropped as unlandable."""
    relay, fm, ops = direct_relay(EXACT, ops=None)
    relay.pending = (torch.tensor([2, 5]), torch.tensor([21, 51], dtype=torch.int32))
    with caplog.at_level(logging.WARNING, logger="spec_fused"):
        relay.land_with_torch()
    assert relay.pending is None and not messages(caplog)
    assert fm.new_seq_lens_buf[[2, 5]].tolist() == [21, 51]


def test_a_publish_lands_quietly_after_its_future_map_is_gone(caplog):
    """Nothing is left to record ``publish_ready`` on: the values land, nothing is said."""
    relay, fm, ops = direct_relay(EXACT, ops=None)
    relay.pending = (torch.tensor([3]), torch.tensor([30]))
    relay.future_map_ref = lambda: None
    with caplog.at_level(logging.WARNING, logger="spec_fused"):
        relay.land_with_torch()
    assert relay.pending is None and not messages(caplog)
    assert fm.new_seq_lens_buf[3] == 30


def test_a_publish_that_cannot_land_is_dropped_with_one_line_per_kind(caplog):
    relay, fm, ops = direct_relay(EXACT, ops=None)
    with caplog.at_level(logging.WARNING, logger="spec_fused"):
        for bad in [
            (torch.tensor([99]), torch.tensor([1])),
            (torch.tensor([98]), torch.tensor([2])),
            (torch.tensor([1]), "not a tensor"),
        ]:
            relay.pending = bad
            relay.land_with_torch()
            assert relay.pending is None
    lines = messages(caplog)
    assert len(lines) == 2
    assert lines[0].startswith(
        "spec_fused: a publish that cannot land was dropped (IndexError: index 99 is out of "
    )
    assert lines[1] == (
        "spec_fused: a publish that cannot land was dropped (AttributeError: 'str' object "
        "has no attribute 'to')"
    )


# ----------------------------------------------------------------------------- hand-back


def test_a_disabled_relay_is_kept_with_its_reason_and_sglang_serves():
    fm = make_future_map("EAGLE", SMALL)
    relay = relay_mod.relay_for(fm)
    relay.pending = (torch.tensor([3]), torch.tensor([30]))
    relay.retire(fm, "because")
    assert relay_mod.relay_for(fm) is None and fm.__dict__[relay_mod.RELAY_ATTR] is None
    assert fm.__dict__[relay_mod.DISABLED_ATTR] is relay and relay.disabled_reason == "because"
    assert fm.__dict__["new_seq_lens_buf"][3] == 30


def test_a_reader_whose_landing_fails_gets_the_buffer_and_the_relay_is_handed_back(monkeypatch):
    fm = make_future_map("EAGLE", SMALL)
    relay = relay_mod.relay_for(fm)
    relay.pending = (torch.tensor([3]), torch.tensor([30]))

    def broken(fence=True):
        raise RuntimeError("landing broke")

    monkeypatch.setattr(relay, "land_pending", broken)
    buf = sglang_patch.read_buffer(fm)
    assert buf is fm.__dict__["new_seq_lens_buf"] and buf[3] == 30
    assert (
        relay_mod.relay_for(fm) is None
        and relay.disabled_reason == "landing a pending publish failed: landing broke"
    )


def test_a_future_map_without_the_buffer_has_no_such_attribute():
    fm = SimpleNamespace()
    with pytest.raises(AttributeError) as info:
        sglang_patch.read_buffer(fm)
    assert info.value.args == ("new_seq_lens_buf",) and info.value.__cause__ is None
