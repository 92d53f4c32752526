"""The WAR-barrier decision against SGLang's real ``Scheduler`` class (the heavy tier).

Importing ``sglang.srt.managers.scheduler`` on a CPU takes transformers and more
(scripts/setup_scheduler_tier.sh) and torchvision (its stand-in, tests/standins, on the
PYTHONPATH); ``./run.sh test`` runs this file in .venv-sched,
once per release. The scheduler is made with ``object.__new__`` (its ``__init__`` loads a
model) and driven through its own ``_apply_war_barrier``; the whole configuration matrix
is checked against the rules of tests/support/upstream_rules.py, as the fast tier checks it
on the same method read out of the release's source."""

import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.scheduler
from sglang.srt.managers import scheduler as scheduler_mod  # noqa: E402
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm  # noqa: E402
from support.upstream_rules import (  # noqa: E402
    NEEDS_CPU,
    barrier_calls,
    check_barrier_matrix,
    make_scheduler,
)

from spec_fused import relay as relay_mod  # noqa: E402
from spec_fused.integration import sglang_patch  # noqa: E402
from spec_fused.tools.traces import TraceConfig, make_future_map, run_trace  # noqa: E402

Scheduler = scheduler_mod.Scheduler
CFG = TraceConfig(pool=16, max_len=8)


@pytest.fixture
def patched_scheduler():
    sglang_patch.apply()
    assert isinstance(Scheduler.__dict__["_war_barrier_enabled"], property), (
        "the patch did not reach the real Scheduler (untested barrier code?)"
    )
    yield Scheduler
    sglang_patch.remove()


def test_unpatched_scheduler_barrier_is_platform_only():
    assert "_war_barrier_enabled" not in Scheduler.__dict__
    fm = make_future_map("DFLASH", CFG, needs_cpu_seq_lens=False)
    sched = make_scheduler(Scheduler, SpeculativeAlgorithm.DFLASH, fm)
    assert barrier_calls(sched, True) == [("wait_event", "read-done")]


@pytest.mark.parametrize("algorithm", list(SpeculativeAlgorithm), ids=lambda a: a.name)
@pytest.mark.parametrize("needs_cpu", NEEDS_CPU)
def test_barrier_matrix_on_the_real_scheduler(patched_scheduler, algorithm, needs_cpu, monkeypatch):
    check_barrier_matrix(patched_scheduler, algorithm, needs_cpu=needs_cpu, monkeypatch=monkeypatch)


def test_coarse_fallback_still_works_when_barrier_kept(patched_scheduler):
    fm = make_future_map("EAGLE", CFG)
    sched = make_scheduler(Scheduler, SpeculativeAlgorithm.EAGLE, fm)
    runner = sched.model_worker.last_shared_read_runner
    runner.shared_read_done_event = runner.war_fastpath_read_done_event = None
    assert barrier_calls(sched, True) == [("wait_stream", "forward")]


def test_algorithm_without_caps_keeps_sglangs_decision(patched_scheduler, monkeypatch):
    from spec_fused import caps as caps_mod

    monkeypatch.setattr(caps_mod, "known_algorithms", lambda: [])
    monkeypatch.setattr(caps_mod, "_DECLARED", {})
    monkeypatch.setenv("SPEC_FUSED_WAR_BARRIER", "0")
    fm = make_future_map("DFLASH", CFG)
    sched = make_scheduler(Scheduler, SpeculativeAlgorithm.DFLASH, fm)
    assert barrier_calls(sched, True) == [("wait_event", "read-done")]
    assert sched._war_barrier_enabled is True


def test_remove_restores_the_scheduler_class_exactly():
    before = dict(Scheduler.__dict__)
    sglang_patch.apply()
    fm = make_future_map("DFLASH", CFG)
    sched = make_scheduler(Scheduler, SpeculativeAlgorithm.DFLASH, fm)
    sched._war_barrier_enabled = True
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
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([os.environ.get("PYTHONPATH", ""), os.getcwd()])
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "deferred-ok" in out.stdout


def test_fused_relay_runs_beside_the_real_scheduler_module(patched_scheduler):
    """With the heavy stack imported too, the relay still matches upstream on a trace."""
    cfg = TraceConfig(seed=2, steps=30)
    sglang_patch.remove()
    want = run_trace(make_future_map("EAGLE", cfg), cfg)
    sglang_patch.apply()
    fm = make_future_map("EAGLE", cfg)
    got = run_trace(fm, cfg)
    assert got == want and relay_mod.relay_for(fm).launcher.launches > 0


def test_scheduler_caps_reach_a_relay_made_earlier(patched_scheduler):
    from types import SimpleNamespace

    fm = make_future_map("EAGLE", CFG, needs_cpu_seq_lens=False)
    sched = make_scheduler(
        Scheduler, SpeculativeAlgorithm.EAGLE, fm, worker=SimpleNamespace(host_seq_lens="exact")
    )
    relay = relay_mod.relay_for(fm)  # e.g. a warm-up step before the loop
    assert relay.host_seq_lens == "none"  # the backends opt out; no worker claim yet
    barrier_calls(sched, True)
    assert relay.host_seq_lens == "exact" and relay.caps.exact_claimed


def test_the_plan_guard_reaches_sglangs_flashinfer_backend_and_the_bound_its_classes(
    monkeypatch,
):
    """Applied before FlashInfer's backend is imported (as at start-up, before any graph
    capture), the guard becomes the module's ``fast_prefill_plan``: what a capture binds
    and what every replay's ``begin_forward.func is fast_prefill_plan`` compares with.
    Then DFLASH's real worker with two real FlashInfer backends gets its bound exactly on
    the releases that plan a graphed DFLASH verify from host lengths."""
    import functools
    import importlib
    import importlib.util
    import types

    from compat.expectations import expectation_for

    from spec_fused.caps import HostBound
    from spec_fused.integration import flashinfer_plan

    sglang_patch.apply()
    try:
        fi = importlib.import_module(flashinfer_plan.MODULE)
        worker_mod = importlib.import_module(flashinfer_plan.WORKER)
        for name in (
            "sglang.srt.speculative.dflash_info_v2",
            "sglang.srt.mem_cache.allocation_sizing",  # 0.5.19+
        ):
            if importlib.util.find_spec(name) is not None:
                importlib.import_module(name)
        assert fi.fast_prefill_plan is flashinfer_plan.guard() is not None
        assert fi.fast_prefill_plan.__wrapped__.__module__ == flashinfer_plan.MODULE

        def backend():
            b = object.__new__(fi.FlashInferAttnBackend)
            b.__dict__.update(
                prefill_backend="fa2", dispatch_reason=None, is_multimodal=False,
                use_sliding_window_kv_pool=False, is_dllm_model=False,
                prefill_uses_dequant_workspace=False, prefill_cuda_graph_metadata={},
            )  # fmt: skip
            for bs in (1, 8):  # as capture does it for a DFLASH verify (fa2, no mask)
                w = types.SimpleNamespace(_backend="fa2")
                w.begin_forward = functools.partial(fi.fast_prefill_plan, w)
                b.prefill_cuda_graph_metadata[bs] = [w]
            return b

        worker = object.__new__(worker_mod.DFlashWorkerV2)
        worker._target_worker = types.SimpleNamespace(
            model_runner=types.SimpleNamespace(attn_backend=backend())
        )
        worker.draft_model_runner = types.SimpleNamespace(attn_backend=backend())
        worker.block_size, worker.draft_window_size = 16, None
        sched = types.SimpleNamespace(
            draft_worker=worker, server_args=types.SimpleNamespace(enable_two_batch_overlap=False)
        )
        if flashinfer_plan.flashinfer_version() is None:  # a CPU: FlashInfer not installed
            monkeypatch.setitem(sys.modules, "flashinfer", types.ModuleType("flashinfer"))
            sys.modules["flashinfer"].__version__ = "0.7.2"  # SGLang 0.5.23's pin
        found = flashinfer_plan.host_bound(sched)
        assert isinstance(found, HostBound) is expectation_for().host_plan, found
    finally:
        sglang_patch.remove()
    assert fi.fast_prefill_plan is flashinfer_plan.guard()  # never restored under live graphs
