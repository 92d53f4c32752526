"""The relay's per-step path on the real SGLang FutureMap: checked once, then the per-step path.

What the per-step path must not cost: correctness (the trace tests hold it to upstream step for
step), clear errors (bad input still gets the checked path's message), result lifetime
(a batch's lengths stay its own while later steps run), and the null measurement seam
must stay a seam (gated, visible, never chosen by the ladder)."""

import logging

import pytest
import torch
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
from support.arms import patched_future_map

from spec_fused import log
from spec_fused import relay as relay_mod
from spec_fused.kernels import backend as backend_mod
from spec_fused.kernels import checks
from spec_fused.kernels import publish_gather as pg
from spec_fused.tools.traces import TraceConfig, decode_batch

CFG = TraceConfig(pool=32)
EAGLE, DFLASH = SpeculativeAlgorithm.EAGLE, SpeculativeAlgorithm.DFLASH


def _step(fm, slots, lens):
    fm.publish(torch.tensor(slots), torch.tensor(lens))
    batch = decode_batch(slots, CFG)
    fm.resolve_seq_lens_cpu(batch)
    return batch


@pytest.mark.parametrize("algo", [EAGLE, DFLASH])
@pytest.mark.parametrize("needs_cpu", [True, False])
def test_release_steps_run_no_validation_after_the_first(monkeypatch, algo, needs_cpu):
    calls = []
    real = checks.validate
    monkeypatch.setattr(checks, "validate", lambda *a, **k: (calls.append(1), real(*a, **k)))
    with patched_future_map(algo, CFG, needs_cpu_seq_lens=needs_cpu) as fm:
        _step(fm, [1, 2, 3], [5, 6, 7])
        relay = relay_mod.relay_for(fm)
        first = len(calls)
        for k in range(10):
            batch = _step(fm, [1, 2, 3], [5 + k, 6, 7])
            assert batch.seq_lens.tolist() == [5 + k, 6, 7]
        assert not relay.debug and len(calls) == first  # the O(1) guard, nothing else


def test_debug_mode_validates_every_step(monkeypatch):
    monkeypatch.setenv("SPEC_FUSED_DEBUG", "1")
    calls = []
    real = checks.validate
    monkeypatch.setattr(checks, "validate", lambda *a, **k: (calls.append(1), real(*a, **k)))
    with patched_future_map(EAGLE, CFG) as fm:
        for k in range(4):
            _step(fm, [1, 2], [5 + k, 6])
    assert len(calls) >= 4


def test_bad_publish_on_the_lean_path_raises_the_clear_error_and_the_relay_goes_on():
    """After steady state, a publish whose values do not match its indices: the guard
    sends the step to the full check, whose error names the argument, raised to the caller
    as upstream's own publish would raise it. The bad publish cannot land and is dropped;
    the relay keeps serving the next, good steps."""
    with patched_future_map(EAGLE, CFG) as fm:
        _step(fm, [1, 2], [5, 6])
        relay = relay_mod.relay_for(fm)
        fm.publish(torch.tensor([1, 2]), torch.tensor([5, 6, 7]))
        with pytest.raises(ValueError, match="publish_indices has 2 entries but publish_values"):
            fm.resolve_seq_lens_cpu(decode_batch([1, 2], CFG))
        assert relay_mod.relay_for(fm) is relay and relay.pending is None
        assert _step(fm, [1, 2], [8, 9]).seq_lens.tolist() == [8, 9]


def test_bad_gather_indices_still_land_the_good_pending_publish():
    with patched_future_map(EAGLE, CFG) as fm:
        _step(fm, [1, 2], [5, 6])
        fm.publish(torch.tensor([1, 2]), torch.tensor([7, 8]))
        bad = decode_batch([1, 2], CFG)
        bad.spec_info.future_indices = torch.tensor([[1, 2]])
        with pytest.raises(ValueError, match="gather_indices must be 1-D"):
            fm.resolve_seq_lens_cpu(bad)
        assert fm.__dict__["new_seq_lens_buf"][1:3].tolist() == [7, 8]


@pytest.mark.parametrize("algo", [EAGLE, DFLASH])
@pytest.mark.parametrize("needs_cpu", [True, False])
def test_two_batches_in_flight_keep_their_own_lengths(algo, needs_cpu):
    """Overlap keeps batch N's ``seq_lens`` (snapshots, batch_record_buf, result_queue)
    while batch N+1 resolves: every step's result is its own tensor, never rewritten."""
    with patched_future_map(algo, CFG, needs_cpu_seq_lens=needs_cpu) as fm:
        held = []
        for k in range(6):
            batch = _step(
                fm,
                [1, 2, 3] if k % 2 else [4, 5],
                [10 * k + 1, 10 * k + 2, 10 * k + 3][: 3 if k % 2 else 2],
            )
            held.append(
                (
                    batch,
                    batch.seq_lens.tolist(),
                    None if batch.seq_lens_cpu is None else batch.seq_lens_cpu.tolist(),
                )
            )
        ptrs = {b.seq_lens.data_ptr() for b, _, _ in held[-3:]}
        assert len(ptrs) == 3  # three batches alive, three storages
        for batch, lens, host in held:
            assert batch.seq_lens.tolist() == lens
            if host is not None:
                assert batch.seq_lens_cpu.tolist() == host == lens


def test_null_backend_needs_the_bench_switch(monkeypatch, caplog):
    monkeypatch.setenv("SPEC_FUSED_FORCE_BACKEND", "null")
    log.reset()
    with caplog.at_level(logging.WARNING, logger="spec_fused"):
        with patched_future_map(EAGLE, CFG) as fm:
            _step(fm, [1, 2], [5, 6])
            _step(fm, [1, 2], [7, 8])
            assert relay_mod.relay_for(fm).launcher.backend != "null"
    hits = [r.getMessage() for r in caplog.records if "SPEC_FUSED_FORCE_BACKEND" in r.getMessage()]
    assert len(hits) == 1 and "needs SPEC_FUSED_BENCH=1" in hits[0]
    assert backend_mod.explain_relay_backend("cpu")[0] != "null"


def test_null_backend_runs_the_path_without_device_work(monkeypatch):
    monkeypatch.setenv("SPEC_FUSED_FORCE_BACKEND", "null")
    monkeypatch.setenv("SPEC_FUSED_BENCH", "1")
    with patched_future_map(EAGLE, CFG) as fm:
        before = fm.__dict__["new_seq_lens_buf"].clone()
        for _ in range(3):
            batch = _step(fm, [1, 2], [5, 6])
            assert batch.seq_lens.shape == (2,) and batch.seq_lens_cpu is not None
        relay = relay_mod.relay_for(fm)
        assert relay.launcher.backend == "null" and relay.launcher.launches == 0
        assert torch.equal(fm.__dict__["new_seq_lens_buf"], before)  # nothing written


def test_the_ladder_never_falls_to_null(monkeypatch):
    monkeypatch.setattr(
        pg, "launch_triton", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("x"))
    )
    log.reset()
    with patched_future_map(EAGLE, CFG) as fm:
        batch = _step(fm, [1, 2], [5, 6])
        assert batch.seq_lens.tolist() == [5, 6]
        assert relay_mod.relay_for(fm).launcher.backend == "reference"


def test_doctor_shows_the_relay_backend(monkeypatch):
    from spec_fused.tools import doctor

    monkeypatch.setenv("SPEC_FUSED_FORCE_BACKEND", "null")
    monkeypatch.setenv("SPEC_FUSED_BENCH", "1")
    report = doctor.devices()
    assert report["cpu"]["backend"] == "null"
    assert "no device work" in report["cpu"]["why"]
    monkeypatch.delenv("SPEC_FUSED_BENCH")
    assert doctor.devices()["cpu"]["backend"] != "null"
