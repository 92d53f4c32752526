"""The start-up canary runs first in a child process, where a fault cannot touch the server.

A kernel that faults on a GPU kills the CUDA context of the process it runs in. The
scheduler therefore proves the fused step in a child (at the top of ``Scheduler.__init__``,
before the pools are allocated): a child that faults, dies or hangs costs itself, and the
device is then served by SGLang's own relay, with one log line. On a CPU the child runs the
real canary under the Triton interpreter; the faults are planted by replacing the child's
command."""

import logging
import sys
import textwrap
from types import SimpleNamespace

import pytest
import torch

from spec_fused import log
from spec_fused import relay as relay_mod
from spec_fused.integration import sglang_patch
from spec_fused.kernels import backend as backend_mod
from spec_fused.kernels import canary as canary_mod
from spec_fused.tools.traces import TraceConfig, make_future_map, run_trace

CFG = TraceConfig(seed=2, steps=20)


@pytest.fixture(autouse=True)
def fresh_verdicts():
    backend_mod._verdicts.clear()
    canary_mod._child_reports.clear()
    log.reset()
    yield
    backend_mod._verdicts.clear()
    canary_mod._child_reports.clear()


def _child(code: str):
    return [sys.executable, "-c", textwrap.dedent(code)]


def _messages(caplog):
    return [r.getMessage() for r in caplog.records if r.name == "spec_fused"]


def test_a_sound_kernel_passes_in_the_child_and_the_relay_serves():
    report = canary_mod.child_canary("cpu")
    assert report["ok"] and report["fault"] is None and report["seconds"] > 0
    assert report["verdict"]["backend"] == "interpreter" and report["verdict"]["cases"] > 0
    assert relay_mod.not_relayed_on("cpu") is None
    # the in-process canary that follows carries the child's report
    verdict = canary_mod.canary("cpu")
    assert verdict.child is report and "child process first" in verdict.describe()


FAULTS = {
    "a sticky fault": """
        import json, sys
        print(json.dumps({"fault": "AcceleratorError: CUDA error: an illegal memory access "
                                   "was encountered", "verdict": None, "free_bytes": None}))
        sys.exit(3)
    """,
    "a crash": """
        import os
        os.abort()  # as a device-side assert can take the process down
    """,
    "a bad answer": """
        print("not the canary's report")
    """,
}


@pytest.mark.parametrize("fault", FAULTS)
def test_a_child_that_faults_leaves_the_device_to_sglang_in_one_line(fault, caplog):
    with caplog.at_level(logging.WARNING, logger="spec_fused"):
        report = canary_mod.child_canary("cpu", command=_child(FAULTS[fault]))
    assert not report["ok"] and report["fault"]
    why = relay_mod.not_relayed_on("cpu")
    assert why is not None and "faulted in the canary's child process" in why
    lines = _messages(caplog)
    assert len(lines) == 1 and "SGLang's own relay serves this device" in lines[0]
    # and SGLang's own relay serves: the patched FutureMap gives upstream's lengths
    want = run_trace(make_future_map("EAGLE", CFG), CFG)
    sglang_patch.apply()
    try:
        fm = make_future_map("EAGLE", CFG)
        assert run_trace(fm, CFG) == want
        assert fm.__dict__[relay_mod.RELAY_ATTR] is None
    finally:
        sglang_patch.remove()


def test_a_child_that_hangs_is_a_fault(caplog):
    with caplog.at_level(logging.WARNING, logger="spec_fused"):
        report = canary_mod.child_canary(
            "cpu", command=_child("import time; time.sleep(60)"), timeout=2
        )
    assert "did not finish in 2 s" in report["fault"]
    assert relay_mod.not_relayed_on("cpu") is not None


def test_a_child_that_cannot_start_proves_nothing_either_way(caplog):
    with caplog.at_level(logging.WARNING, logger="spec_fused"):
        report = canary_mod.child_canary("cpu", command=["/nonexistent/python"])
    assert not report["ok"] and report["fault"] is None
    assert relay_mod.not_relayed_on("cpu") is None  # the in-process canary decides
    assert any("runs in the scheduler process" in m for m in _messages(caplog))


def test_the_child_reports_a_sticky_fault_as_such(monkeypatch, capsys):
    from spec_fused.kernels import publish_gather as pg

    monkeypatch.setattr(
        pg,
        "_launch",
        lambda *a, **k: (_ for _ in ()).throw(
            RuntimeError("Triton Error [CUDA]: misaligned address")
        ),
    )
    assert canary_mod._child_main(["cpu"]) == 3
    report = canary_mod._last_json_line(capsys.readouterr().out)
    assert "misaligned address" in report["fault"] and report["verdict"] is None


def test_the_child_lets_any_other_failure_crash_it(monkeypatch):
    monkeypatch.setattr(
        canary_mod, "canary", lambda *a, **k: (_ for _ in ()).throw(KeyError("not a device fault"))
    )
    with pytest.raises(KeyError):
        canary_mod._child_main(["cpu"])


# --------------------------------------------------------------------------- when it runs


def _scheduler_init(self, server_args, port_args, gpu_id=None, tp_rank=0):
    """The signature of older releases' ``Scheduler.__init__`` (0.5.23 drops gpu_id)."""


@pytest.fixture
def child_calls(monkeypatch):
    calls = []
    monkeypatch.setattr(
        sglang_patch, "child_canary", lambda device, debug: calls.append((str(device), debug)) or {}
    )
    monkeypatch.setattr(torch.version, "hip", None, raising=False)
    return calls


def _server_args(**kwargs):
    return SimpleNamespace(**{"speculative_algorithm": "EAGLE", "device": "cuda", **kwargs})


def test_a_speculative_cuda_scheduler_proves_its_gpu_in_a_child_first(child_calls):
    sglang_patch.canary_before_pools(_scheduler_init, (_server_args(), None, 3), {})
    sglang_patch.canary_before_pools(
        _scheduler_init, (_server_args(),), {"port_args": None, "gpu_id": 1}
    )
    assert child_calls == [("cuda:3", False), ("cuda:1", False)]


def test_0_5_23_names_the_gpu_in_its_runtime_context(child_calls, monkeypatch):
    from sglang.srt import runtime_context

    monkeypatch.setattr(runtime_context, "get_device", lambda: SimpleNamespace(gpu_id=5))
    sglang_patch.canary_before_pools(
        lambda self, server_args, port_args: None, (_server_args(), None), {}
    )
    assert child_calls == [("cuda:5", False)]


@pytest.mark.parametrize(
    "server_args",
    [
        _server_args(speculative_algorithm=None),
        _server_args(device="cpu"),
        _server_args(device="npu"),
    ],
)
def test_no_child_where_the_relay_would_not_run_on_cuda(child_calls, server_args):
    sglang_patch.canary_before_pools(_scheduler_init, (server_args, None, 0), {})
    assert child_calls == []


def test_no_child_when_switched_off(child_calls, monkeypatch):
    monkeypatch.setenv("SPEC_FUSED_CHILD_CANARY", "0")
    sglang_patch.canary_before_pools(_scheduler_init, (_server_args(), None, 0), {})
    assert child_calls == []


def test_a_scheduler_whose_gpu_cannot_be_told_runs_the_canary_in_process(
    child_calls, monkeypatch, caplog
):
    from sglang.srt import runtime_context

    monkeypatch.setattr(runtime_context, "get_device", lambda: SimpleNamespace(gpu_id=None))
    with caplog.at_level(logging.INFO, logger="spec_fused"):
        sglang_patch.canary_before_pools(
            lambda self, server_args, port_args: None, (_server_args(), None), {}
        )
    assert child_calls == []
    assert any("runs in the scheduler process" in m for m in _messages(caplog))


def test_the_child_canary_never_raises_into_the_scheduler(monkeypatch, caplog):
    monkeypatch.setattr(
        sglang_patch,
        "child_canary",
        lambda device, debug: (_ for _ in ()).throw(OSError("no fork")),
    )
    monkeypatch.setattr(torch.version, "hip", None, raising=False)
    with caplog.at_level(logging.WARNING, logger="spec_fused"):
        assert (
            sglang_patch.canary_before_pools(_scheduler_init, (_server_args(), None, 0), {}) is None
        )
    assert any("could not run in a child process" in m for m in _messages(caplog))


def test_a_refused_device_is_not_prewarmed(monkeypatch):
    calls = []
    monkeypatch.setattr(sglang_patch, "prewarm", lambda device, debug: calls.append(device))
    monkeypatch.setattr(sglang_patch, "_prewarmed", set())
    monkeypatch.setattr(torch.version, "hip", None, raising=False)
    backend_mod.record_verdict(
        backend_mod.Verdict("cuda:0", "sglang", direct=False, notes=["the fused kernel faulted"])
    )

    class OnCuda(torch.Tensor):
        @property
        def device(self):
            return torch.device("cuda:0")

    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    sglang_patch.prewarm_for(
        SimpleNamespace(spec_algo=SpeculativeAlgorithm.EAGLE), torch.zeros(4).as_subclass(OnCuda)
    )
    assert calls == []


def test_selftest_runs_the_child_first_and_stops_where_it_faults(monkeypatch):
    from spec_fused.tools import selftest

    real = canary_mod.child_canary
    monkeypatch.setattr(
        canary_mod,
        "child_canary",
        lambda device, debug: real(device, debug=debug, command=_child(FAULTS["a sticky fault"])),
    )
    report = selftest.run(quick=True, device="cpu")
    assert not report["ok"] and "SGLang's own relay" in report["verdict"]
    assert "illegal memory access" in report["canary"]["child"]["fault"]
    assert "child process" in selftest.render(report)
