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


@pytest.fixture
def scheduler_cls(tmp_path):
    """The installed release's Scheduler, patched for one test: each test runs the patch
    (and so its property) itself, which is what ties it to that code (mutmut's stats)."""
    module = light_scheduler(tmp_path)
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
    """Setting the barrier reads the capabilities (and may hand a relay back, landing what
    is pending): a dead CUDA context there must not be logged as "no capabilities" and
    left for the next CUDA call to blame on SGLang."""
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
    assert "surfaced in spec_fused's WAR-barrier decision (scheduler set-up)." in notes
    assert "SPEC_FUSED_DISABLE=1" in notes


def _messages(caplog) -> list:
    return [r.getMessage() for r in caplog.records if r.name == "spec_fused"]


def _unpatched(tmp_path, edit=None):
    """The installed release's scheduler module, its ``_apply_war_barrier`` edited."""
    light_scheduler(tmp_path)
    path = tmp_path / "light_scheduler.py"
    if edit is not None:
        path.write_text(edit(path.read_text()))
    spec = importlib.util.spec_from_file_location("sglang.srt.managers.scheduler", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_gate_reads_back_as_set_where_no_relay_engages(scheduler_cls, caplog):
    """Unset, there is no gate to read (as on SGLang's own class). Without speculation, or
    with the FutureMap's buffer on a device the relay does not run on, the gate reads back
    as SGLang set it, every time, and nothing is logged: not relaying is no failure."""
    import logging
    from types import SimpleNamespace

    import torch

    log.reset()
    bare = object.__new__(scheduler_cls)
    with pytest.raises(AttributeError, match="^_war_barrier_enabled$"):
        getattr(bare, "_war_barrier_enabled")  # noqa: B009 - the property's getter
    meta = SimpleNamespace(new_seq_lens_buf=torch.empty(4, device="meta"))
    on_meta = make_scheduler(scheduler_cls, SpeculativeAlgorithm.EAGLE, meta)
    with caplog.at_level(logging.INFO, logger="spec_fused"):
        for sched in (bare, on_meta):
            for gate in (True, False, True):
                sched._war_barrier_enabled = gate
                assert sched._war_barrier_enabled is gate
    assert _messages(caplog) == []


def test_a_barrier_turned_off_is_logged_once_per_algorithm_naming_why(
    scheduler_cls, monkeypatch, caplog
):
    """Only where the platform gate was on and the decision turned it off; the worker's
    absence is no obstacle (``draft_worker`` is optional)."""
    import logging

    from spec_fused import relay as relay_mod
    from spec_fused.tools.traces import TraceConfig, make_future_map

    monkeypatch.setenv("SPEC_FUSED_WAR_BARRIER", "0")
    log.reset()
    reasons = []
    with caplog.at_level(logging.INFO, logger="spec_fused"):
        for algo, gate in [("EAGLE", False), ("EAGLE", True), ("EAGLE", True), ("DFLASH", True)]:
            algo = SpeculativeAlgorithm[algo]
            fm = make_future_map(algo, TraceConfig(pool=16))
            sched = make_scheduler(scheduler_cls, algo, fm)
            del sched.draft_worker
            sched._war_barrier_enabled = gate
            assert sched._war_barrier_enabled is False
            reason = fm.__dict__[relay_mod.CAPS_ATTR].reason
            assert "SPEC_FUSED_WAR_BARRIER=0" in reason
            reasons.append(reason)
            if not gate:
                assert _messages(caplog) == []
    assert _messages(caplog) == [
        f"spec_fused: WAR barrier off for EAGLE ({reasons[1]})",
        f"spec_fused: WAR barrier off for DFLASH ({reasons[3]})",
    ]
    assert all(r.levelno == logging.WARNING for r in caplog.records)


def test_a_decision_that_cannot_be_made_keeps_sglangs_gate_saying_why_once_per_kind(
    scheduler_cls, caplog
):
    """A scheduler without a FutureMap, an algorithm nobody declared: SGLang's gate, read
    back as set, and one line per kind of failure; a later decision that can be made
    replaces none of it with a stale one."""
    import logging
    from types import SimpleNamespace

    from spec_fused.tools.traces import TraceConfig, make_future_map

    log.reset()
    no_map = make_scheduler(scheduler_cls, SpeculativeAlgorithm.EAGLE, None)
    del no_map.future_map
    fm = make_future_map(SpeculativeAlgorithm.EAGLE, TraceConfig(pool=16))
    fm.spec_algo = SimpleNamespace(name="MYSTERY", is_some=lambda: True)
    undeclared = make_scheduler(scheduler_cls, SpeculativeAlgorithm.EAGLE, fm)
    with caplog.at_level(logging.INFO, logger="spec_fused"):
        for sched in (no_map, no_map, undeclared):
            for gate in (True, False):
                sched._war_barrier_enabled = gate
                assert sched._war_barrier_enabled is gate
    assert _messages(caplog) == [
        "spec_fused: no capabilities for the WAR barrier decision (the scheduler has no "
        "future_map); keeping SGLang's",
        "spec_fused: no capabilities for the WAR barrier decision (no capabilities for "
        "speculative algorithm 'MYSTERY'; plugin algorithms declare theirs with "
        "spec_fused.caps.register_caps(name, SpecCaps(...))); keeping SGLang's",
    ]


def test_a_decision_that_stops_engaging_drops_the_previous_one(scheduler_cls, monkeypatch):
    """The gate set again once the relay no longer engages reads as SGLang's gate, not as
    the decision made the time before."""
    from spec_fused.tools.traces import TraceConfig, make_future_map

    monkeypatch.setenv("SPEC_FUSED_WAR_BARRIER", "0")
    fm = make_future_map(SpeculativeAlgorithm.EAGLE, TraceConfig(pool=16))
    sched = make_scheduler(scheduler_cls, SpeculativeAlgorithm.EAGLE, fm)
    sched._war_barrier_enabled = True
    assert sched._war_barrier_enabled is False
    sched.spec_algorithm = SpeculativeAlgorithm.NONE
    sched._war_barrier_enabled = True
    assert sched._war_barrier_enabled is True


def test_a_relay_made_before_the_scheduler_knew_its_worker_takes_the_filed_caps(
    scheduler_cls, monkeypatch
):
    """The FutureMap's relay was made (at its first publish) from the table alone; the
    scheduler's decision, which knows the worker's own claim, replaces its caps."""
    from types import SimpleNamespace

    from spec_fused import relay as relay_mod
    from spec_fused.tools.traces import TraceConfig, make_future_map

    for name in ("SPEC_FUSED_HOST_SEQ_LENS", "SPEC_FUSED_WAR_BARRIER"):
        monkeypatch.delenv(name, raising=False)
    fm = make_future_map(SpeculativeAlgorithm.EAGLE, TraceConfig(pool=16), needs_cpu_seq_lens=False)
    relay = relay_mod.relay_for(fm)
    assert relay.host_seq_lens == "none"
    worker = SimpleNamespace(host_seq_lens="exact")
    sched = make_scheduler(scheduler_cls, SpeculativeAlgorithm.EAGLE, fm, worker=worker)
    sched._war_barrier_enabled = True
    assert relay.caps is fm.__dict__[relay_mod.CAPS_ATTR]
    assert relay.host_seq_lens == "exact" and relay.exact


def test_a_scheduler_without_the_barrier_is_left_as_sglang_made_it_with_one_line(tmp_path, caplog):
    """No ``Scheduler`` class, or one without ``_apply_war_barrier``: nothing patched."""
    import logging
    import types

    log.reset()
    no_class = types.ModuleType("fake.scheduler")
    not_a_class = types.ModuleType("fake.scheduler")
    not_a_class.Scheduler = object()
    no_method = types.ModuleType("fake.scheduler")
    no_method.Scheduler = type("Scheduler", (), {})
    with caplog.at_level(logging.INFO, logger="spec_fused"):
        for module in (no_class, not_a_class, no_method):
            patches = PatchSet()
            war_barrier.patch(patches, module, sglang_patch._sglang_version())
            assert patches.targets == []
    assert _messages(caplog) == [
        "spec_fused: fake.scheduler.Scheduler has no _apply_war_barrier; the WAR barrier "
        "stays as SGLang decides it"
    ]


def test_untested_barrier_code_is_compared_with_the_installed_release_first(tmp_path, caplog):
    """Code no tested release has: the line names the release SGLang says it is, and the
    closest tested code counts that release first (0.5.18 ... 0.5.23 share this code)."""
    import logging

    module = _unpatched(
        tmp_path,
        lambda text: text.replace(
            "if not self._war_barrier_enabled:", "if not self._war_barrier_enabled or False:"
        ),
    )
    log.reset()
    with caplog.at_level(logging.INFO, logger="spec_fused"):
        war_barrier.patch(PatchSet(), module, "0.5.20")
    (line,) = _messages(caplog)
    assert line.startswith("spec_fused: SGLang 0.5.20: ")
    assert "(compared with SGLang 0.5.20, the closest tested release)" in line
    assert line.endswith(": not tested; the WAR barrier stays as SGLang decides it")
