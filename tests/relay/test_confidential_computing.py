"""Under NVIDIA Confidential Computing nothing is pinned, and exact host lengths are SGLang's.

SGLang turns pinned memory off under CC (``sglang.srt.utils.common.is_pin_memory_available``:
host<->device copies go through a bounce buffer; ``cudaMallocHost`` memory is UVM-managed,
``cudaHostRegister`` is refused): the kernel's zero-copy stores into a pinned ring would
fault or crawl there. The relay reads SGLang's own check (forced here with SGLang's own
override, ``SGLANG_FORCE_CONFIDENTIAL_COMPUTE``); its CUDA calls are stood in on a CPU."""

import logging

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
def test_exact_host_lengths_come_from_sglangs_resolve_and_nothing_is_pinned(
    cc_host, monkeypatch, caplog, needs_cpu
):
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
        with caplog.at_level(logging.INFO, logger="spec_fused"):
            fm = make_future_map("EAGLE", CFG, needs_cpu_seq_lens=needs_cpu)
            with monkeypatch.context() as spying:
                spying.setattr(torch, "full", spy(real_full))
                spying.setattr(torch, "empty", spy(real_empty))
                got = run_trace(fm, CFG)
        relay = fm.__dict__[relay_mod.RELAY_ATTR]
    finally:
        sglang_patch.remove()
    assert got == want
    assert relay is not None and not relay.pinned_ok
    assert relay.launcher.ring is None and relay.launcher.staged is None
    assert not any(pinned)
    assert not [e for e in ops.log if e[1] == "synchronize" and e[2] == relay.done_event.name]
    lines = [r.getMessage() for r in caplog.records if "Confidential Computing" in r.getMessage()]
    assert lines == [
        "spec_fused: Confidential Computing (SGLang's own check): exact host "
        "lengths come from SGLang's resolve; the fused launch serves the GPU-only "
        "steps"
    ]
    if not needs_cpu:  # the GPU-only steps are still the fused launch's
        assert relay.launcher.launches > 0


def test_doctor_says_where_exact_host_lengths_come_from(cc_host):
    assert "Confidential Computing" in doctor.relay_summary("cuda:0")
    assert "SGLang's resolve" in doctor.relay_summary("cuda:0")
    assert doctor.relay_summary("cpu") == "fused relay"


@needs_sglangs_check
def test_without_cc_the_doctor_row_is_the_plain_fused_relay(monkeypatch):
    monkeypatch.setenv("SGLANG_FORCE_CONFIDENTIAL_COMPUTE", "0")
    sglang_common.is_confidential_compute.cache_clear()
    try:
        assert doctor.relay_summary("cuda:0") == "fused relay"
    finally:
        sglang_common.is_confidential_compute.cache_clear()


@pytest.mark.skipif(
    hasattr(sglang_common, "is_confidential_compute"), reason="this release has SGLang's own check"
)
def test_a_release_without_sglangs_check_is_not_treated_as_cc():
    assert not confidential_compute()
