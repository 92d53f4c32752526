"""The WAR-barrier decision the patch makes, through SGLang's own ``_apply_war_barrier``,
over every configuration: algorithm x ``needs_cpu_seq_lens`` x the worker's declaration x
``SPEC_FUSED_WAR_BARRIER`` x upstream's platform gate.

The fast tier reads the installed release's ``Scheduler._apply_war_barrier`` out of its
``scheduler.py`` (tests/support/upstream_rules.py: same code, same fingerprint) so it needs no
model stack; the heavy tier runs the same matrix on the real ``Scheduler`` class of every
release (tests/test_scheduler_tier.py). Expected values are rules, never the patch's own
decision."""

import importlib.util

import pytest
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
from support.upstream_rules import (
    NEEDS_CPU,
    check_barrier_matrix,
    light_scheduler,
    make_scheduler,
)

from spec_fused import log
from spec_fused.integration import sglang_patch, war_barrier
from spec_fused.integration.hooks import PatchSet


@pytest.fixture(scope="module")
def scheduler_cls(tmp_path_factory):
    module = light_scheduler(tmp_path_factory.mktemp("scheduler"))
    patches = PatchSet()
    war_barrier.patch(patches, module, sglang_patch._sglang_version())
    assert isinstance(module.Scheduler.__dict__.get("_war_barrier_enabled"), property), (
        "the patch refused the installed release's own _apply_war_barrier"
    )
    sglang_patch.apply()
    yield module.Scheduler
    sglang_patch.remove()
    patches.undo()


@pytest.mark.parametrize("algorithm", list(SpeculativeAlgorithm), ids=lambda a: a.name)
@pytest.mark.parametrize("needs_cpu", NEEDS_CPU)
def test_barrier_matrix(scheduler_cls, algorithm, needs_cpu, monkeypatch):
    check_barrier_matrix(scheduler_cls, algorithm, needs_cpu=needs_cpu, monkeypatch=monkeypatch)


def test_untested_barrier_code_keeps_sglangs_barrier(tmp_path, caplog):
    """An ``_apply_war_barrier`` that is not a tested release's: not patched, one line."""
    import logging

    light_scheduler(tmp_path)
    path = tmp_path / "light_scheduler.py"
    path.write_text(
        path.read_text().replace(
            "if not self._war_barrier_enabled:", "if not self._war_barrier_enabled or False:"
        )
    )
    spec = importlib.util.spec_from_file_location("sglang.srt.managers.scheduler", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    log.reset()
    patches = PatchSet()
    with caplog.at_level(logging.WARNING, logger="spec_fused"):
        war_barrier.patch(patches, module, sglang_patch._sglang_version())
    assert "_war_barrier_enabled" not in module.Scheduler.__dict__
    lines = [r.getMessage() for r in caplog.records if "WAR barrier stays" in r.getMessage()]
    assert len(lines) == 1 and "Scheduler._apply_war_barrier changed code" in lines[0]


@pytest.mark.parametrize("worker_host", [None, "exact", "reserved", "none"])
@pytest.mark.parametrize("needs_cpu", NEEDS_CPU)
@pytest.mark.parametrize("algorithm", ["EAGLE", "DFLASH", "NGRAM"])
def test_traces_under_the_filed_caps_match_upstream(
    scheduler_cls, algorithm, needs_cpu, worker_host, monkeypatch
):
    """Not only the decision: a whole trace through the FutureMap whose caps the scheduler
    filed (its worker's host-length claim) equals upstream's. The reference is SGLang's
    own FutureMap given host lengths exactly where the rule says the batch gets them:
    where its backends read them, and where a worker said it plans with exact ones."""
    from types import SimpleNamespace

    from support.upstream_rules import barrier_calls, expected_host, make_scheduler

    from spec_fused import relay as relay_mod
    from spec_fused.tools.traces import TraceConfig, make_future_map, run_trace

    for name in ("SPEC_FUSED_HOST_SEQ_LENS", "SPEC_FUSED_WAR_BARRIER"):
        monkeypatch.delenv(name, raising=False)
    algo = SpeculativeAlgorithm[algorithm]
    host_lengths = needs_cpu or worker_host == "exact"
    cfg = TraceConfig(seed=7, pool=64, steps=25, p_mixed=0.15 if host_lengths == needs_cpu else 0.0)
    worker = (
        SimpleNamespace() if worker_host is None else SimpleNamespace(host_seq_lens=worker_host)
    )
    sglang_patch.remove()
    try:
        want = run_trace(make_future_map(algo, cfg, needs_cpu_seq_lens=host_lengths), cfg)
    finally:
        sglang_patch.apply()
    fm = make_future_map(algo, cfg, needs_cpu_seq_lens=needs_cpu)
    barrier_calls(make_scheduler(scheduler_cls, algo, fm, worker=worker), True)
    relay = relay_mod.relay_for(fm)
    want_host = expected_host(algorithm, needs_cpu=needs_cpu, worker=worker_host)
    assert relay.host_seq_lens == want_host, relay.caps.reason
    assert run_trace(fm, cfg) == want


def test_a_sticky_fault_while_deciding_the_barrier_escapes_naming_spec_fused(
    scheduler_cls, monkeypatch
):
    """Setting the barrier reads the capabilities and may allocate the pinned host ring:
    a dead CUDA context there must not be logged as "no capabilities" and left for the
    next CUDA call to blame on SGLang."""
    from spec_fused import relay as relay_mod
    from spec_fused.tools.traces import TraceConfig, make_future_map

    fm = make_future_map("EAGLE", TraceConfig(pool=16))

    def dead(*args, **kwargs):
        raise RuntimeError("Triton Error [CUDA]: an illegal memory access was encountered")

    monkeypatch.setattr(relay_mod, "future_map_caps", dead)
    sched = make_scheduler(scheduler_cls, SpeculativeAlgorithm.EAGLE, fm)
    with pytest.raises(RuntimeError) as info:
        sched._war_barrier_enabled = True
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert "spec_fused" in notes and "SPEC_FUSED_DISABLE=1" in notes
