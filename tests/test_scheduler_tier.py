"""The WAR-barrier decision against SGLang's real ``Scheduler`` class (the heavy tier).

Importing ``sglang.srt.managers.scheduler`` on a CPU takes transformers, torchvision and
more (scripts/setup_scheduler_tier.sh); ``./run.sh test`` runs this file in .venv-sched.
The scheduler is made with ``object.__new__`` (its ``__init__`` loads a model) and then
driven through its own ``_apply_war_barrier`` code."""

import os
import subprocess
import sys
import textwrap
import types

import pytest
import torch

pytestmark = pytest.mark.scheduler
scheduler_mod = pytest.importorskip("sglang.srt.managers.scheduler")
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm  # noqa: E402

from traces import TraceConfig, make_future_map  # noqa: E402

from spec_fused import relay as relay_mod  # noqa: E402
from spec_fused.integration import sglang_patch  # noqa: E402

Scheduler = scheduler_mod.Scheduler


class StreamLog:
    def __init__(self):
        self.calls = []

    def wait_event(self, ev):
        self.calls.append(("wait_event", ev))

    def wait_stream(self, stream):
        self.calls.append(("wait_stream", stream))


def _scheduler(algo, *, worker=None, needs_cpu_seq_lens=True):
    sched = object.__new__(Scheduler)
    sched.spec_algorithm = algo
    sched.draft_worker = worker if worker is not None else types.SimpleNamespace()
    sched.future_map = make_future_map(algo, TraceConfig(), needs_cpu_seq_lens=needs_cpu_seq_lens)
    # The forward's read-done event under both names SGLang gave it: 0.5.15 ... 0.5.17
    # ``war_fastpath_runner.war_fastpath_read_done_event``, 0.5.18+
    # ``last_shared_read_runner.shared_read_done_event``.
    runner = types.SimpleNamespace(shared_read_done_event="read-done",
                                   war_fastpath_read_done_event="read-done")
    sched.model_worker = types.SimpleNamespace(last_shared_read_runner=runner,
                                               war_fastpath_runner=runner)
    sched.schedule_stream = StreamLog()
    sched.forward_stream = "forward"
    return sched


@pytest.fixture
def patched_scheduler():
    sglang_patch.apply()
    assert isinstance(Scheduler.__dict__["_war_barrier_enabled"], property)
    yield
    sglang_patch.remove()


def _platform_gate(sched, enabled=True):
    # What Scheduler.run_event_loop does right before dispatching the event loop.
    sched._war_barrier_enabled = enabled


def test_unpatched_scheduler_barrier_is_platform_only():
    assert "_war_barrier_enabled" not in Scheduler.__dict__
    sched = _scheduler(SpeculativeAlgorithm.DFLASH)
    _platform_gate(sched)
    sched._apply_war_barrier()
    assert sched.schedule_stream.calls == [("wait_event", "read-done")]


@pytest.mark.parametrize("algo", list(SpeculativeAlgorithm))
def test_patched_decision_follows_established_caps(patched_scheduler, algo):
    from spec_fused.caps import caps_for, establish

    sched = _scheduler(algo)
    _platform_gate(sched)
    caps = establish(caps_for(algo), algo)
    assert sched._war_barrier_enabled is caps.needs_war_barrier
    sched._apply_war_barrier()
    expect = [("wait_event", "read-done")] if caps.needs_war_barrier else []
    assert sched.schedule_stream.calls == expect
    assert sched.future_map.__dict__[relay_mod.CAPS_ATTR] == caps


def test_caps_can_only_remove_the_barrier_never_add_it(patched_scheduler, monkeypatch):
    monkeypatch.setenv("SPEC_FUSED_WAR_BARRIER", "1")
    sched = _scheduler(SpeculativeAlgorithm.EAGLE)
    _platform_gate(sched, enabled=False)  # e.g. not CUDA and no SGLANG_ENABLE_WAR_BARRIER
    assert sched._war_barrier_enabled is False
    sched._apply_war_barrier()
    assert sched.schedule_stream.calls == []


def test_env_turns_the_barrier_off(patched_scheduler, monkeypatch):
    monkeypatch.setenv("SPEC_FUSED_WAR_BARRIER", "0")
    sched = _scheduler(SpeculativeAlgorithm.DFLASH)
    _platform_gate(sched)
    sched._apply_war_barrier()
    assert sched._war_barrier_enabled is False and sched.schedule_stream.calls == []


def test_worker_declaring_its_own_caps_is_trusted(patched_scheduler):
    worker = types.SimpleNamespace(needs_war_barrier=False, host_seq_lens="none")
    sched = _scheduler(SpeculativeAlgorithm.EAGLE, worker=worker)
    _platform_gate(sched)
    sched._apply_war_barrier()
    assert sched.schedule_stream.calls == []
    relay = relay_mod.relay_for(sched.future_map)
    assert relay.host_seq_lens == "none" and relay.variant == "barrier_free"


def test_coarse_fallback_still_works_when_barrier_kept(patched_scheduler):
    sched = _scheduler(SpeculativeAlgorithm.EAGLE)
    runner = sched.model_worker.last_shared_read_runner
    runner.shared_read_done_event = runner.war_fastpath_read_done_event = None
    _platform_gate(sched)
    sched._apply_war_barrier()
    assert sched.schedule_stream.calls == [("wait_stream", "forward")]


def test_algorithm_without_caps_keeps_sglangs_decision(patched_scheduler, monkeypatch):
    from spec_fused import caps as caps_mod

    monkeypatch.setattr(caps_mod, "_TABLE", {})
    sched = _scheduler(SpeculativeAlgorithm.DFLASH)
    _platform_gate(sched)
    assert sched._war_barrier_enabled is True


def test_remove_restores_the_scheduler_class_exactly():
    before = dict(Scheduler.__dict__)
    sglang_patch.apply()
    sched = _scheduler(SpeculativeAlgorithm.DFLASH)
    _platform_gate(sched)
    sglang_patch.remove()
    assert dict(Scheduler.__dict__) == before
    assert sched._war_barrier_enabled is True  # the instance keeps upstream's value


def test_patch_waits_for_the_scheduler_import_in_a_fresh_process():
    code = textwrap.dedent("""
        import sys
        from spec_fused.integration import sglang_patch
        report = sglang_patch.apply()
        assert "sglang.srt.managers.scheduler" not in sys.modules, "apply() imported it"
        assert report.deferred == ["sglang.srt.managers.scheduler.Scheduler._war_barrier_enabled"]
        import sglang.srt.managers.scheduler as s
        assert isinstance(s.Scheduler.__dict__["_war_barrier_enabled"], property)
        sglang_patch.remove()
        assert "_war_barrier_enabled" not in s.Scheduler.__dict__
        print("deferred-ok")
    """)
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "deferred-ok" in out.stdout


def test_fused_relay_runs_beside_the_real_scheduler_module(patched_scheduler):
    """With the heavy stack imported too, the relay still matches upstream on a trace."""
    from traces import run_trace

    cfg = TraceConfig(seed=2, steps=30)
    sglang_patch.remove()
    want = run_trace(make_future_map(SpeculativeAlgorithm.EAGLE, cfg), cfg)
    sglang_patch.apply()
    got = run_trace(make_future_map(SpeculativeAlgorithm.EAGLE, cfg), cfg)
    assert got == want and torch.is_tensor(torch.zeros(1))


def test_scheduler_caps_reach_a_relay_made_earlier(patched_scheduler):
    worker = types.SimpleNamespace(host_seq_lens="none")
    sched = _scheduler(SpeculativeAlgorithm.EAGLE, worker=worker)
    relay = relay_mod.relay_for(sched.future_map)  # e.g. a warm-up step before the loop
    assert relay.host_seq_lens == "exact"
    _platform_gate(sched)
    assert relay.host_seq_lens == "none"
