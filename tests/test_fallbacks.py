"""Never break the server: each fault is injected, and SGLang's lengths still come out right.

The ladder is fused Triton kernel -> torch reference -> SGLang's own FutureMap method, per
FutureMap, with one log line per reason. Every test compares the patched run against the
real unpatched FutureMap on the same trace."""

import logging

import pytest
import torch
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

from spec_fused import cuda_ops
from spec_fused import relay as relay_mod
from spec_fused.integration import sglang_patch
from spec_fused.kernels import backend as backend_mod
from spec_fused.kernels import publish_gather as pg
from spec_fused.kernels import step_launcher
from spec_fused.traces import TraceConfig, make_future_map, run_trace

CFG = TraceConfig(seed=7, steps=40, pool=40, max_running=12)
EAGLE = SpeculativeAlgorithm.EAGLE


@pytest.fixture(scope="module")
def upstream():
    return run_trace(make_future_map(EAGLE, CFG), CFG)


def _patched_run(algo=EAGLE, cfg=CFG, before_trace=None):
    relay_mod._logged.clear()
    sglang_patch.apply()
    try:
        fm = make_future_map(algo, cfg)
        if before_trace:
            before_trace(fm)
        return run_trace(fm, cfg), fm
    finally:
        sglang_patch.remove()


def _break_reference(monkeypatch, broken):
    """Both reference paths fail: the checked one and the launcher's lean step."""
    monkeypatch.setattr(pg, "_reference_impl", broken)
    monkeypatch.setattr(step_launcher.PublishGather, "_launch_reference",
                        lambda self, *args: broken())


def _messages(caplog):
    return [r.getMessage() for r in caplog.records if r.name == "spec_fused"]


def test_kernel_that_raises_falls_back_to_the_reference(monkeypatch, caplog, upstream):
    calls = []

    def broken(*args, **kwargs):
        calls.append(1)
        raise RuntimeError("triton compile failed: out of resources")

    monkeypatch.setattr(pg, "_launch", broken)
    with caplog.at_level(logging.WARNING, logger="spec_fused"):
        got, fm = _patched_run()
    assert got == upstream
    relay = fm.__dict__[relay_mod.RELAY_ATTR]
    assert relay.launcher.backend == "reference" and relay.disabled_reason is None
    assert len(calls) == 1  # tried once, then the reference for good
    hits = [m for m in _messages(caplog) if "falling back to the torch reference" in m]
    assert len(hits) == 1 and "out of resources" in hits[0]


def test_reference_that_raises_too_hands_back_to_sglang(monkeypatch, caplog, upstream):
    def broken(*args, **kwargs):
        raise RuntimeError("device lost")

    monkeypatch.setattr(pg, "_launch", broken)
    _break_reference(monkeypatch, broken)
    with caplog.at_level(logging.WARNING, logger="spec_fused"):
        got, fm = _patched_run()
    assert got == upstream
    relay = fm.__dict__[relay_mod.DISABLED_ATTR]
    assert relay.disabled_reason and relay_mod.relay_for(fm) is None
    hits = [m for m in _messages(caplog) if "SGLang's own relay takes over" in m]
    assert len(hits) == 1


def test_failure_after_a_pending_publish_still_lands_it(monkeypatch, upstream):
    """The first resolve fails after earlier publishes were deferred: they must not be lost."""
    state = {"n": 0}
    real_launch = pg._launch

    def flaky(*args, **kwargs):
        state["n"] += 1
        if state["n"] >= 3:
            raise RuntimeError("launch failed")
        return real_launch(*args, **kwargs)

    monkeypatch.setattr(pg, "_launch", flaky)
    _break_reference(monkeypatch, lambda *a, **k: (_ for _ in ()).throw(RuntimeError("x")))
    got, _ = _patched_run()
    assert got == upstream


def test_triton_missing_uses_the_reference(monkeypatch, upstream):
    monkeypatch.setattr(backend_mod, "TRITON_AVAILABLE", False)
    assert backend_mod.backend_for("cpu") == "reference"
    got, fm = _patched_run()
    assert got == upstream and fm.__dict__[relay_mod.RELAY_ATTR].launcher.backend == "reference"


def test_forced_reference_backend(monkeypatch, upstream):
    monkeypatch.setenv("SPEC_FUSED_FORCE_REFERENCE", "1")
    got, fm = _patched_run()
    assert got == upstream and fm.__dict__[relay_mod.RELAY_ATTR].launcher.backend == "reference"


def test_future_map_without_the_consume_once_flag_is_relayed(upstream):
    """0.5.15's FutureMap has no ``_publish_fresh``: the relay works without it."""
    got, fm = _patched_run(before_trace=lambda fm: fm.__dict__.pop("_publish_fresh", None))
    assert got == upstream
    relay = relay_mod.relay_for(fm)
    assert relay is not None and not relay.consume_once_flag and relay.launches > 0


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
    assert any("cannot relay this FutureMap" in m and "publish_ready" in m
               for m in _messages(caplog))


def test_algorithm_without_capabilities_runs_sglangs_path(caplog, monkeypatch):
    from spec_fused import caps as caps_mod

    monkeypatch.setattr(caps_mod, "_TABLE", {k: v for k, v in caps_mod._TABLE.items() if k != "EAGLE3"})
    algo = SpeculativeAlgorithm.EAGLE3
    want = run_trace(make_future_map(algo, CFG), CFG)
    with caplog.at_level(logging.WARNING, logger="spec_fused"):
        got, fm = _patched_run(algo)
    assert got == want and relay_mod.relay_for(fm) is None
    hits = [m for m in _messages(caplog) if "no capabilities for speculative algorithm 'EAGLE3'" in m]
    assert len(hits) == 1


def test_each_reason_is_logged_once(monkeypatch, caplog):
    monkeypatch.setattr(pg, "_launch", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("bad")))
    with caplog.at_level(logging.WARNING, logger="spec_fused"):
        sglang_patch.apply()
        try:
            for seed in range(3):  # three FutureMaps, one reason
                cfg = TraceConfig(seed=seed, steps=10)
                run_trace(make_future_map(EAGLE, cfg), cfg)
        finally:
            sglang_patch.remove()
    assert len([m for m in _messages(caplog) if "falling back" in m]) == 1


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
    hits = [m for m in _messages(caplog) if "override refused" in m]
    assert len(hits) == 1 and "reads host lengths" in hits[0]


@pytest.mark.parametrize("error", [
    ValueError("Pointer argument (at 6) cannot be accessed from Triton (cpu tensor?)"),
    TypeError("function takes exactly 25 arguments (24 given)"),
    RuntimeError("Triton Error [CUDA]: invalid argument"),
])
def test_the_launchers_own_errors_go_down_the_reference_rung(monkeypatch, caplog, upstream,
                                                             error):
    """Triton's launcher raises ValueError/TypeError for its own failures: those are the
    backend's, not the caller's, and the torch reference takes over."""
    def broken(*args, **kwargs):
        raise error

    monkeypatch.setattr(pg, "_launch", broken)
    with caplog.at_level(logging.WARNING, logger="spec_fused"):
        got, fm = _patched_run()
    assert got == upstream
    assert relay_mod.relay_for(fm).launcher.backend == "reference"
    assert any("falling back to the torch reference" in m for m in _messages(caplog))


@pytest.mark.parametrize("device", ["mps", "xpu", "meta"])
def test_devices_triton_cannot_drive_get_the_reference(device):
    backend, reason = backend_mod.explain_backend(device)
    assert backend == "reference" and "reference" in reason


def test_cpu_without_the_interpreter_serves_with_the_reference(monkeypatch, upstream):
    monkeypatch.setattr(backend_mod, "TRITON_INTERPRETS", False)  # a CPU server: compiled Triton only
    assert backend_mod.backend_for("cpu") == "reference"
    got, fm = _patched_run()
    assert got == upstream and relay_mod.relay_for(fm).launcher.backend == "reference"


@pytest.mark.parametrize("device, why", [("meta", "meta: spec_fused's ordering was only ever"),
                                         ("xpu", "xpu: spec_fused's ordering was only ever")])
def test_devices_the_relay_does_not_engage_on_keep_sglangs_path(device, why, caplog):
    assert why in cuda_ops.unsupported_device(device)
    cfg = TraceConfig(pool=8, max_len=4)
    sglang_patch.apply()
    try:
        fm = make_future_map(EAGLE, cfg)
        fm.__dict__["new_seq_lens_buf"] = torch.empty(8, dtype=torch.int64, device="meta")
        with caplog.at_level(logging.WARNING, logger="spec_fused"):
            relay_mod._logged.clear()
            if device == "meta":
                assert relay_mod.relay_for(fm) is None
                assert any("not relaying on meta" in m for m in _messages(caplog))
    finally:
        sglang_patch.remove()


def test_rocm_is_left_to_sglang(monkeypatch):
    """On ROCm the device type is ``cuda`` too; upstream's HIP-only branches decide."""
    monkeypatch.setattr(torch.version, "hip", "6.4.0", raising=False)
    why = cuda_ops.unsupported_device("cuda")
    assert why and "ROCm" in why and "stream_ordered" in why
    monkeypatch.setattr(torch.version, "hip", None, raising=False)
    assert cuda_ops.unsupported_device("cuda") is None
    assert cuda_ops.unsupported_device("cpu") is None
