"""Where no GPU run measured the fused step level with SGLang's, SGLang's relay runs.

"Never slower than SGLang" is held like "only tested code runs": a configuration is
relayed on a GPU only where ``spec_fused/measured.py`` names the run that measured it
level, decided once per FutureMap with one log line; ``SPEC_FUSED_UNMEASURED=1`` relays
it anyway. A CPU has no CUDA device: a FutureMap whose buffer says it is on ``cuda:0``
stands for one here (the relay reads the device from the buffer), its CUDA calls stood
in by ``FakeOps`` and its launches made on the CPU tensor underneath."""

import logging

import pytest
import torch
from support.fake_cuda import FakeOps, messages

from spec_fused import log, measured
from spec_fused import relay as relay_mod
from spec_fused.caps import SpecCaps
from spec_fused.integration import sglang_patch
from spec_fused.tools.traces import TraceConfig, decode_batch, make_future_map

CFG = TraceConfig(pool=16, max_len=32)


class _OnCuda(torch.Tensor):
    """A CPU tensor that says it is on ``cuda:0``."""

    @property
    def device(self):
        return torch.device("cuda:0")


@pytest.fixture
def on_cuda(monkeypatch):
    """A patched FutureMap on "cuda:0" (``needs_cpu_seq_lens`` as asked)."""
    monkeypatch.delenv("SPEC_FUSED_UNMEASURED", raising=False)
    monkeypatch.delenv("SPEC_FUSED_HOST_SEQ_LENS", raising=False)
    monkeypatch.setattr(relay_mod, "ops_for", lambda device: FakeOps())
    real_launcher = relay_mod.StepLauncher  # its launches on the CPU tensor underneath
    monkeypatch.setattr(
        relay_mod,
        "StepLauncher",
        lambda buf, **kw: real_launcher(buf.as_subclass(torch.Tensor), **kw),
    )
    monkeypatch.setattr(relay_mod, "unsupported_device", lambda device: None)
    monkeypatch.setattr(torch.version, "hip", None, raising=False)
    log.reset()
    sglang_patch.apply()

    def make(needs_cpu: bool):
        fm = make_future_map("EAGLE", CFG, needs_cpu_seq_lens=needs_cpu)
        fm.__dict__["new_seq_lens_buf"] = fm.__dict__["new_seq_lens_buf"].as_subclass(_OnCuda)
        return fm

    yield make
    sglang_patch.remove()


def test_the_table_hands_exact_host_lengths_on_cuda_to_sglang_and_nothing_else(monkeypatch):
    monkeypatch.delenv("SPEC_FUSED_UNMEASURED", raising=False)
    why = measured.handed_to_sglang("cuda:0", exact=True)
    assert why is not None and "SPEC_FUSED_UNMEASURED=1 relays it anyway" in why
    assert "gpu_check-2026-12-06-b" in why  # the run it rests on
    assert measured.handed_to_sglang("cuda:0", exact=False) is None
    assert measured.handed_to_sglang("cpu", exact=True) is None
    monkeypatch.setenv("SPEC_FUSED_UNMEASURED", "1")
    assert measured.handed_to_sglang("cuda:0", exact=True) is None


def test_every_gpu_configuration_is_either_measured_level_or_handed_over():
    """The two tables cover no, exact and bound host lengths on CUDA, each once."""
    keys = set(measured.LEVEL) | set(measured.NOT_MEASURED_LEVEL)
    assert keys == {("cuda", "none"), ("cuda", "exact"), ("cuda", "bound")}
    assert not set(measured.LEVEL) & set(measured.NOT_MEASURED_LEVEL)


def test_an_exact_future_map_on_cuda_keeps_sglangs_relay_with_one_line(on_cuda, caplog):
    with caplog.at_level(logging.INFO, logger="spec_fused"):
        fms = [on_cuda(needs_cpu=True) for _ in range(2)]
        for fm in fms:
            fm.publish(torch.tensor([1, 2]), torch.tensor([10, 20]))
            assert relay_mod.relay_for(fm) is None
    lines = [m for m in messages(caplog) if "SGLang's relay runs" in m]
    assert lines == [f"spec_fused: {measured.handed_to_sglang('cuda', True)}: SGLang's relay runs"]
    batch = decode_batch([1, 2], CFG)
    fms[0].new_seq_lens_buf = fms[0].new_seq_lens_buf.as_subclass(torch.Tensor)  # real CPU
    fms[0].resolve_seq_lens_cpu(batch)  # SGLang's own resolve, SGLang's own publish before
    assert batch.seq_lens_cpu.tolist() == [10, 20] and batch.seq_lens_sum == 30


def test_a_gpu_only_future_map_on_cuda_is_relayed(on_cuda):
    fm = on_cuda(needs_cpu=False)
    fm.publish(torch.tensor([1, 2]), torch.tensor([10, 20]))
    relay = relay_mod.relay_for(fm)
    assert relay is not None and relay.pending is not None


def test_the_override_relays_an_unmeasured_configuration(on_cuda, monkeypatch):
    monkeypatch.setenv("SPEC_FUSED_UNMEASURED", "1")
    fm = on_cuda(needs_cpu=True)
    fm.publish(torch.tensor([1, 2]), torch.tensor([10, 20]))
    assert relay_mod.relay_for(fm) is not None


def test_capabilities_that_later_make_a_relay_exact_hand_it_back_landing_what_is_pending(
    on_cuda, caplog
):
    """The scheduler's capabilities (which know the worker) come after the relay was made:
    an explicit exact claim makes it a configuration no GPU measured level."""
    fm = on_cuda(needs_cpu=False)
    fm.publish(torch.tensor([1, 2]), torch.tensor([10, 20]))
    relay = relay_mod.relay_for(fm)
    with caplog.at_level(logging.INFO, logger="spec_fused"):
        relay.set_caps(SpecCaps(True, "exact", "a worker's claim", host_word="worker"))
    assert fm.__dict__[relay_mod.RELAY_ATTR] is None
    assert fm.__dict__[relay_mod.DISABLED_ATTR] is relay
    assert relay.pending is None and fm.__dict__["new_seq_lens_buf"][[1, 2]].tolist() == [10, 20]
    assert relay.disabled_reason == measured.handed_to_sglang("cuda", True)
    assert [m for m in messages(caplog) if "SGLang's relay runs" in m] == [
        f"spec_fused: {relay.disabled_reason}: SGLang's relay runs"
    ]


def test_capabilities_for_a_future_map_that_is_gone_are_adopted_quietly(on_cuda):
    """Nothing is left to hand back: the relay takes the claims and changes nothing else."""
    fm = on_cuda(needs_cpu=False)
    relay = relay_mod.FusedRelay(fm, relay_mod.future_map_caps(fm), debug=False)
    relay.future_map_ref = lambda: None
    relay.set_caps(SpecCaps(True, "exact", "a worker's claim", host_word="worker"))
    assert relay.exact_claimed and relay.disabled_reason is None


def test_capabilities_that_keep_a_relay_gpu_only_keep_it(on_cuda):
    fm = on_cuda(needs_cpu=False)
    fm.publish(torch.tensor([1]), torch.tensor([10]))
    relay = relay_mod.relay_for(fm)
    relay.set_caps(SpecCaps(True, "exact", "upstream's default"))  # no claim: upstream's flag
    assert fm.__dict__[relay_mod.RELAY_ATTR] is relay
