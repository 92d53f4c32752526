"""Where the relay engages: which FutureMaps (speculative, with capabilities, relayable) and
which devices (NVIDIA CUDA and CPU; not ROCm, not meta/xpu), with which capabilities and
variant, what it compiles ahead of serving, and what it says once when it stays out.

Expected values come from the module's documented contract (spec_fused/relay.py: when
SGLang's own path runs, what is logged once and why), from SGLang's FutureMap unpatched or
from literals - never from the relay's own output."""

import logging
from types import SimpleNamespace

import pytest
import torch
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
from support.fake_cuda import CFG, EXACT, direct_relay, messages

from spec_fused import cuda_ops, log, upstream
from spec_fused import relay as relay_mod
from spec_fused.caps import SpecCaps
from spec_fused.integration import sglang_patch
from spec_fused.kernels import backend as backend_mod
from spec_fused.tools.traces import TraceConfig, make_future_map

NO_HOST = SpecCaps(False, "none", "test")
EAGLE = SpeculativeAlgorithm.EAGLE


# ----------------------------------------------------------------------------- debug switches


def test_sglangs_poisoning_is_not_assumed_when_its_source_cannot_be_read(monkeypatch):
    import inspect

    def unreadable(obj):
        raise OSError("could not get source code")

    monkeypatch.setattr(inspect, "getsource", unreadable)
    assert upstream.sglang_tracks_seq_lens() is False


# ----------------------------------------------------------------------------- devices


def test_rocm_is_left_to_sglang_with_the_hip_only_branches_named(monkeypatch):
    """On ROCm the device type is ``cuda`` too; upstream's HIP-only branches decide."""
    monkeypatch.setattr(torch.version, "hip", "6.4.0", raising=False)
    why = (
        "ROCm (HIP): upstream takes HIP-only branches here (publish_ready."
        "synchronize(), the stream_ordered resolve) that spec_fused does not reproduce"
    )
    assert relay_mod.unsupported_device("cuda:0") == why
    assert cuda_ops.unsupported_device("cuda") == why
    monkeypatch.setattr(torch.version, "hip", None, raising=False)
    assert cuda_ops.unsupported_device("cuda") is None
    assert cuda_ops.unsupported_device("cpu") is None


@pytest.mark.parametrize(
    "device, why",
    [
        ("meta", "meta: spec_fused's ordering was only ever"),
        ("xpu", "xpu: spec_fused's ordering was only ever"),
    ],
)
def test_devices_the_relay_does_not_engage_on_keep_sglangs_path(device, why, caplog):
    assert why in cuda_ops.unsupported_device(device)
    cfg = TraceConfig(pool=8, max_len=4)
    sglang_patch.apply()
    try:
        fm = make_future_map(EAGLE, cfg)
        fm.__dict__["new_seq_lens_buf"] = torch.empty(8, dtype=torch.int64, device="meta")
        with caplog.at_level(logging.WARNING, logger="spec_fused"):
            log.reset()
            if device == "meta":
                assert relay_mod.relay_for(fm) is None
                assert any("not relaying on meta" in m for m in messages(caplog))
    finally:
        sglang_patch.remove()


def test_a_device_the_relay_does_not_engage_on_is_logged_once(caplog):
    fm = make_future_map("EAGLE", CFG)
    fm.new_seq_lens_buf = fm.new_seq_lens_buf.to("meta")
    with caplog.at_level(logging.WARNING, logger="spec_fused"):
        assert relay_mod.relay_for(fm) is None
    assert messages(caplog) == [
        "spec_fused: not relaying on meta: spec_fused's ordering was only ever run on NVIDIA "
        "CUDA and CPU; SGLang's relay runs"
    ]


# ----------------------------------------------------------------------------- decisions


def test_a_refused_override_is_logged_once_as_refused(monkeypatch, caplog):
    monkeypatch.setenv("SPEC_FUSED_HOST_SEQ_LENS", "none")
    fm = make_future_map("EAGLE", CFG, needs_cpu_seq_lens=True)
    with caplog.at_level(logging.WARNING, logger="spec_fused"):
        relay_mod.future_map_caps(fm)
        relay_mod.future_map_caps(fm)
    assert messages(caplog) == [
        "spec_fused: override refused: SPEC_FUSED_HOST_SEQ_LENS=none for EAGLE: an attention "
        "backend reads host lengths (needs_cpu_seq_lens)"
    ]


def test_a_workers_claim_against_a_backend_is_refused_and_logged_once(monkeypatch, caplog):
    """Through the path the scheduler takes: a worker that says it needs no host lengths,
    on a FutureMap whose backends read them, gets exact host lengths and one log line."""
    monkeypatch.delenv("SPEC_FUSED_HOST_SEQ_LENS", raising=False)
    fm = make_future_map("EAGLE", CFG, needs_cpu_seq_lens=True)
    worker = SimpleNamespace(host_seq_lens="none")
    with caplog.at_level(logging.WARNING, logger="spec_fused"):
        for _ in range(2):
            caps = relay_mod.future_map_caps(fm, worker=worker)
    assert caps.host_seq_lens == "exact"
    assert messages(caplog) == [
        "spec_fused: override refused: SimpleNamespace.host_seq_lens='none' for EAGLE: an "
        "attention backend reads host lengths (needs_cpu_seq_lens)"
    ]


def test_each_distinct_refusal_is_logged_once(monkeypatch, caplog):
    """Once per refusal, not once per process: a second, different unsafe override (here
    under another algorithm) still gets its own line."""
    monkeypatch.setenv("SPEC_FUSED_HOST_SEQ_LENS", "none")
    with caplog.at_level(logging.WARNING, logger="spec_fused"):
        for algo in ("EAGLE", "EAGLE", "NGRAM"):
            relay_mod.future_map_caps(make_future_map(algo, CFG, needs_cpu_seq_lens=True))
    refused = [m for m in messages(caplog) if "override refused" in m]
    assert len(refused) == 2
    assert "for EAGLE" in refused[0] and "for NGRAM" in refused[1]


@pytest.mark.parametrize("caps, variant", [(EXACT, "war_guarded"), (NO_HOST, "barrier_free")])
def test_the_chosen_variant_follows_the_caps(caps, variant):
    relay, _, _ = direct_relay(caps, ops=None)
    assert relay.variant == variant and relay.host_seq_lens == caps.host_seq_lens


# ----------------------------------------------------------------------------- relay_for


def test_the_schedulers_caps_are_the_ones_the_relay_runs_with():
    """The scheduler patch files its decision (it knows the worker) on the FutureMap
    before the first publish; the relay takes that, not a worker-less decision of its own."""
    fm = make_future_map("EAGLE", CFG, needs_cpu_seq_lens=True)  # alone: war_guarded, exact
    fm.__dict__[relay_mod.CAPS_ATTR] = SpecCaps(False, "none", "the scheduler's")
    relay = relay_mod.relay_for(fm)
    assert (relay.caps.needs_war_barrier, relay.host_seq_lens) == (False, "none")
    assert relay.variant == "barrier_free"


def test_a_confidence_relay_is_left_to_sglang_with_one_info_line(caplog):
    fm = make_future_map("EAGLE", CFG)
    fm.needs_confidence_relay = True
    with caplog.at_level(logging.INFO, logger="spec_fused"):
        assert relay_mod.relay_for(fm) is None
    assert messages(caplog) == [
        "spec_fused: the confidence relay (DSPARK ragged verify) gates its own D2H on "
        "publish_ready; SGLang's relay runs for this FutureMap"
    ]
    assert caplog.records[0].levelno == logging.INFO


def test_a_future_map_from_before_the_confidence_relay_is_relayed():
    fm = make_future_map("EAGLE", CFG)
    fm.__dict__.pop("needs_confidence_relay", None)
    assert relay_mod.relay_for(fm) is not None


def test_release_mode_leaves_the_buffer_as_sglang_made_it(monkeypatch):
    monkeypatch.delenv("SPEC_FUSED_DEBUG", raising=False)
    fm = make_future_map("EAGLE", CFG)
    before = fm.new_seq_lens_buf.clone()
    assert relay_mod.relay_for(fm) is not None
    assert torch.equal(fm.__dict__["new_seq_lens_buf"], before)


class _FutureMapWithoutRelayBuffers:
    """What a FutureMap before 0.5.23 carries (no ``_relay`` at all)."""

    def __init__(self):
        self.new_seq_lens_buf = torch.zeros(CFG.pool, dtype=torch.int64)
        self.needs_cpu_seq_lens = True
        self.publish_ready = None
        self.spec_algo = SpeculativeAlgorithm.EAGLE


def test_debug_mode_poisons_a_future_map_without_relay_buffers(monkeypatch):
    monkeypatch.setenv("SPEC_FUSED_DEBUG", "1")
    monkeypatch.setattr(relay_mod, "sglang_tracks_seq_lens", lambda: False)
    fm = _FutureMapWithoutRelayBuffers()
    assert relay_mod.relay_for(fm) is not None
    assert (fm.__dict__["new_seq_lens_buf"] == -1).all()


def test_the_relay_logs_its_variant_once_per_configuration(caplog):
    with caplog.at_level(logging.INFO, logger="spec_fused"):
        for needs_cpu in (True, True, False):
            relay_mod.relay_for(make_future_map("EAGLE", CFG, needs_cpu_seq_lens=needs_cpu))
    lines = [m for m in messages(caplog) if "variant" in m]
    backend = relay_mod.explain_relay_backend("cpu")[0]
    assert lines == [
        f"spec_fused: relaying EAGLE lengths with the fused war_guarded variant (host lengths: "
        f"exact, kernel: {backend})",
        f"spec_fused: relaying EAGLE lengths with the fused war_guarded variant (host lengths: "
        f"none, kernel: {backend})",
    ]


@pytest.mark.parametrize("forced", ["bogus", "other"])
def test_an_ignored_force_backend_setting_is_logged_once_per_reason(monkeypatch, caplog, forced):
    monkeypatch.setenv("SPEC_FUSED_FORCE_BACKEND", forced)
    with caplog.at_level(logging.WARNING, logger="spec_fused"):
        for _ in range(2):
            relay_mod.relay_for(make_future_map("EAGLE", CFG))
        monkeypatch.setenv("SPEC_FUSED_FORCE_BACKEND", "null")
        relay_mod.relay_for(make_future_map("EAGLE", CFG))
    lines = [m for m in messages(caplog) if "ignored" in m]
    assert lines == [
        f"spec_fused: SPEC_FUSED_FORCE_BACKEND={forced!r} ignored: only 'null' is known",
        "spec_fused: SPEC_FUSED_FORCE_BACKEND=null ignored: it needs SPEC_FUSED_BENCH=1",
    ]


# ----------------------------------------------------------------------------- prewarm


class _OnCuda(torch.Tensor):
    """A CPU tensor that says it is on ``cuda:0`` (prewarm_for only reads the device)."""

    @property
    def device(self):
        return torch.device("cuda:0")


@pytest.fixture
def prewarm_calls(monkeypatch):
    calls = []
    monkeypatch.setattr(
        sglang_patch,
        "canary",
        lambda device, debug: calls.append((str(device), debug)),
    )
    monkeypatch.setattr(sglang_patch, "_proven", set())
    monkeypatch.setattr(backend_mod, "_verdicts", {})
    monkeypatch.setattr(torch.version, "hip", None, raising=False)
    return calls


def test_prewarm_compiles_once_per_cuda_device_for_speculative_maps(prewarm_calls):
    buf = torch.zeros(4).as_subclass(_OnCuda)
    eagle = SimpleNamespace(spec_algo=SpeculativeAlgorithm.EAGLE)
    sglang_patch.prewarm_for(SimpleNamespace(spec_algo=SpeculativeAlgorithm.NONE), buf)
    sglang_patch.prewarm_for(SimpleNamespace(), buf)
    sglang_patch.prewarm_for(eagle, "not a tensor")
    sglang_patch.prewarm_for(eagle, torch.zeros(4))  # a CPU buffer: nothing to compile
    assert prewarm_calls == []
    sglang_patch.prewarm_for(eagle, buf)
    sglang_patch.prewarm_for(eagle, buf)
    assert prewarm_calls == [("cuda:0", False)]


def test_the_prewarm_proves_the_debug_launcher_in_debug_mode(prewarm_calls, monkeypatch):
    """The canary checks the launcher the relay will build: the poisoning one under
    SPEC_FUSED_DEBUG=1."""
    monkeypatch.setenv("SPEC_FUSED_DEBUG", "1")
    sglang_patch.prewarm_for(
        SimpleNamespace(spec_algo=SpeculativeAlgorithm.EAGLE), torch.zeros(4).as_subclass(_OnCuda)
    )
    assert prewarm_calls == [("cuda:0", True)]


def test_a_failed_prewarm_is_logged_once(monkeypatch, prewarm_calls, caplog):
    def fail(device, debug):
        raise RuntimeError("no compiler")

    monkeypatch.setattr(sglang_patch, "canary", fail)
    eagle = SimpleNamespace(spec_algo=SpeculativeAlgorithm.EAGLE)
    with caplog.at_level(logging.WARNING, logger="spec_fused"):
        sglang_patch.prewarm_for(eagle, torch.zeros(4).as_subclass(_OnCuda))
    assert messages(caplog) == [
        "spec_fused: could not prove the fused kernel ahead of serving (RuntimeError: no "
        "compiler); cuda:0 serves with the torch reference"
    ]


@pytest.mark.parametrize("where", ["before the canary", "before its verdict", "after it"])
def test_a_device_whose_canary_could_not_run_serves_with_the_reference(
    monkeypatch, prewarm_calls, where
):
    """No verdict (or the canary's first, unfinished one) means compiled Triton and the
    direct launch, unproven: a canary that could not run or finish puts the device on the
    torch reference instead."""
    from spec_fused.kernels import canary as canary_mod

    def fail(*args, **kwargs):
        raise OSError("no disk")

    def record_then_fail(verdict):
        backend_mod.record_verdict(verdict)
        fail()

    monkeypatch.setattr(sglang_patch, "canary", canary_mod.canary)
    if where == "before the canary":
        monkeypatch.setattr(sglang_patch, "debug_enabled", fail)
    elif where == "before its verdict":
        monkeypatch.setattr(canary_mod, "backend_for", fail)
    else:
        monkeypatch.setattr(canary_mod, "record_verdict", record_then_fail)
    monkeypatch.setattr(backend_mod, "TRITON_INTERPRETS", False)  # compiled Triton on CUDA
    assert backend_mod.explain_backend("cuda:0")[0] == "triton"
    sglang_patch.prewarm_for(
        SimpleNamespace(spec_algo=SpeculativeAlgorithm.EAGLE), torch.zeros(4).as_subclass(_OnCuda)
    )
    backend, why = backend_mod.explain_backend("cuda:0")
    assert backend == "reference" and "(OSError: no disk)" in why
    assert backend_mod.verdict_for("cuda:0").direct is False


def test_each_kind_of_failed_prewarm_is_logged_once(monkeypatch, prewarm_calls, caplog):
    errors = iter([RuntimeError("no compiler"), RuntimeError("no compiler"), OSError("no disk")])

    def fail(device, debug):
        raise next(errors)

    monkeypatch.setattr(sglang_patch, "canary", fail)
    eagle = SimpleNamespace(spec_algo=SpeculativeAlgorithm.EAGLE)
    with caplog.at_level(logging.WARNING, logger="spec_fused"):
        for _ in range(3):
            sglang_patch._proven.clear()
            sglang_patch.prewarm_for(eagle, torch.zeros(4).as_subclass(_OnCuda))
    assert messages(caplog) == [
        "spec_fused: could not prove the fused kernel ahead of serving (RuntimeError: no "
        "compiler); cuda:0 serves with the torch reference",
        "spec_fused: could not prove the fused kernel ahead of serving (OSError: no disk); "
        "cuda:0 serves with the torch reference",
    ]
