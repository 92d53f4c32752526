"""Under NVIDIA Confidential Computing nothing is pinned, and the relay serves as elsewhere.

SGLang stages host copies in pageable memory under CC (``sglang.srt.utils.common.
is_pin_memory_available``: host<->device copies go through a bounce buffer). The fused
kernel reads and writes device memory only; the exact step's two small copies (the batch's
host indices up, the row ``[*lens, sum]`` down) use pageable host memory there, as SGLang's
own staging does. The relay reads SGLang's own check (forced here with SGLang's own
override, ``SGLANG_FORCE_CONFIDENTIAL_COMPUTE``); its CUDA calls are stood in on a CPU."""

import pytest
import torch
from sglang.srt.utils import common as sglang_common
from support.fake_cuda import FakeOps

from spec_fused import log
from spec_fused import relay as relay_mod
from spec_fused.integration import sglang_patch
from spec_fused.tools import doctor
from spec_fused.tools.traces import TraceConfig, make_future_map, run_trace
from spec_fused.upstream import confidential_compute

CFG = TraceConfig(seed=5, steps=30, pool=40, max_running=10)


needs_sglangs_check = pytest.mark.skipif(
    not hasattr(sglang_common, "is_confidential_compute"),
    reason="this release has no Confidential Computing check (it pins memory under CC itself)",
)


@pytest.fixture
def cc_host(monkeypatch):
    if not hasattr(sglang_common, "is_confidential_compute"):
        pytest.skip("this release has no Confidential Computing check")
    monkeypatch.setenv("SGLANG_FORCE_CONFIDENTIAL_COMPUTE", "1")
    sglang_common.is_confidential_compute.cache_clear()
    yield
    monkeypatch.delenv("SGLANG_FORCE_CONFIDENTIAL_COMPUTE", raising=False)
    sglang_common.is_confidential_compute.cache_clear()


def test_sglangs_own_check_is_what_is_read(cc_host, monkeypatch):
    assert confidential_compute() and not sglang_common.is_pin_memory_available()
    monkeypatch.setenv("SGLANG_FORCE_CONFIDENTIAL_COMPUTE", "0")
    sglang_common.is_confidential_compute.cache_clear()
    assert not confidential_compute()


@pytest.mark.parametrize("needs_cpu", [True, False])
def test_the_relay_serves_every_step_with_nothing_pinned(cc_host, monkeypatch, needs_cpu):
    """Exact host lengths too: the fused launch serves them, its host copies pageable."""
    want = run_trace(make_future_map("EAGLE", CFG, needs_cpu_seq_lens=needs_cpu), CFG)
    ops = FakeOps(relay_handles=(3, 4))
    monkeypatch.setattr(relay_mod, "ops_for", lambda device: ops)
    pinned = []
    real_full, real_empty = torch.full, torch.empty

    def spy(real):
        def make(*args, **kwargs):
            pinned.append(bool(kwargs.get("pin_memory")))
            return real(*args, **{k: v for k, v in kwargs.items() if k != "pin_memory"})

        return make

    log.reset()
    sglang_patch.apply()
    try:
        fm = make_future_map("EAGLE", CFG, needs_cpu_seq_lens=needs_cpu)
        with monkeypatch.context() as spying:
            spying.setattr(torch, "full", spy(real_full))
            spying.setattr(torch, "empty", spy(real_empty))
            got = run_trace(fm, CFG)
        relay = fm.__dict__[relay_mod.RELAY_ATTR]
    finally:
        sglang_patch.remove()
    assert got == want
    assert relay is not None and not relay.launcher.pinned and not any(pinned)
    exact_steps = [e for e in ops.log if e == ("host", "synchronize", relay.done_event.name)]
    assert bool(exact_steps) is needs_cpu and relay.launcher.launches > 0
    assert (relay.launcher._row is not None) is needs_cpu  # made, and pageable


@needs_sglangs_check
def test_doctor_names_the_same_relay_with_or_without_cc(monkeypatch):
    summaries = []
    for cc in ("1", "0"):
        monkeypatch.setenv("SGLANG_FORCE_CONFIDENTIAL_COMPUTE", cc)
        sglang_common.is_confidential_compute.cache_clear()
        summaries.append((doctor.relay_summary("cuda:0"), doctor.relay_summary("cpu")))
    sglang_common.is_confidential_compute.cache_clear()
    assert summaries[0] == summaries[1] and summaries[0][1] == "fused relay"


@pytest.mark.skipif(
    hasattr(sglang_common, "is_confidential_compute"), reason="this release has SGLang's own check"
)
def test_a_release_without_sglangs_check_is_not_treated_as_cc():
    assert not confidential_compute()
