"""Every plan from DFLASH's bound partitions each request as the fa2 kernel will.

FlashInfer's fa2 counts a request's split-KV chunks from the host length for its work list
and merge, and lays the partial outputs out by the device length's count: a plan from an
upper bound is the same attention only where both counts agree (``bench/fa2_split.py``,
the mirror these tests run). The guard checks each plan the bound makes: where a chunk
boundary falls in a request's window (the host's committed length + the verify block, up
to the bound), the plan is made again from the exact lengths. Driven here through SGLang's
real ``fast_prefill_plan``, planning into the mirror's plan, its "kernel" running the plan
the device workspace holds on the device's lengths (tests/support/flashinfer_standin.py)."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from support.flashinfer_standin import Fa2Model, Gpu, plan_step, real_fast_prefill_plan

from spec_fused.caps import BoundStep
from spec_fused.integration import flashinfer_plan

BLOCK = 16
TOL = 1e-9  # float64 attention: a right partition is exact to rounding


@pytest.fixture
def rig(monkeypatch):
    """SGLang's fast_prefill_plan guarded and armed on the mirror; no step expected yet."""
    gpu = Gpu()
    monkeypatch.setattr(flashinfer_plan, "_event", gpu.event_class())
    monkeypatch.setattr(flashinfer_plan, "_rings", {})
    for key in ("plans", "waits", "checked", "replans"):
        monkeypatch.setitem(flashinfer_plan._state, key, 0)
    monkeypatch.setitem(flashinfer_plan._state, "armed", True)
    monkeypatch.setitem(flashinfer_plan._state, "step", None)
    return Fa2Model(gpu), flashinfer_plan.guarded(real_fast_prefill_plan())


def verify(rig, committed, device, bound, *, step=True) -> dict:
    """One graphed verify: planned from ``bound`` (KV lengths, the verify block included),
    run on ``device + BLOCK``; ``step``: the relay told the plan its floor (the host's
    ``committed``) and how to read ``device`` exactly."""
    model, plan = rig
    reads = []
    dev = torch.tensor(device)
    flashinfer_plan.expect(
        BoundStep(torch.tensor(committed), BLOCK, lambda: reads.append(1) or dev) if step else None
    )
    w = model.wrapper(len(bound))
    heads = (Fa2Model.QO_HEADS, Fa2Model.KV_HEADS)
    plan_step(plan, w, torch.tensor(bound), width=BLOCK, heads=heads)
    model.gpu.run()
    out = model.attention(w, [d + BLOCK for d in device], BLOCK)
    return out | {"reads": len(reads), **flashinfer_plan.guard_stats()}


def test_unguarded_the_bound_plan_is_wrong_attention(rig):
    """The check skipped (no step expected): the plan stands as the bound made it."""
    got = verify(rig, [1004], [1004], [1004 + 2 * BLOCK], step=False)
    assert got["max_err"] > 0.1 and got["replans"] == 0


def test_guarded_a_straddling_window_is_replanned_from_exact_lengths_with_one_read(rig):
    got = verify(rig, [1004], [1004], [1004 + 2 * BLOCK])
    assert got["max_err"] < TOL and got["replans"] == 1 and got["reads"] == 1


def test_guarded_a_window_within_one_chunk_keeps_the_bound_plan_and_reads_nothing(rig):
    """1 committed + 16 .. 1 + 32 lies in the first 128-token chunk: nothing to check."""
    got = verify(rig, [900, 1], [905, 1], [900 + 2 * BLOCK, 1 + 2 * BLOCK])
    assert got["max_err"] < TOL and (got["replans"], got["reads"], got["checked"]) == (0, 0, 1)


@settings(deadline=None)
@given(st.lists(st.tuples(st.integers(1, 3000), st.integers(0, BLOCK)), min_size=1, max_size=8))
def test_guarded_every_step_is_the_attention_whatever_the_device_accepted(steps):
    """A DFLASH step at page size 1: the device ahead of the host's committed length by one
    verify's accepted tokens (0: level), the bound ``committed + 2 * block``."""
    gpu = Gpu()
    saved = flashinfer_plan._event, dict(flashinfer_plan._state), flashinfer_plan._rings
    flashinfer_plan._event, flashinfer_plan._rings = gpu.event_class(), {}
    flashinfer_plan._state.update(armed=True, step=None)
    try:
        committed = [c for c, _ in steps]
        device = [c + lag for c, lag in steps]
        got = verify((Fa2Model(gpu), flashinfer_plan.guarded(real_fast_prefill_plan())),
                     committed, device, [c + 2 * BLOCK for c in committed])  # fmt: skip
        assert got["max_err"] < TOL, (steps, got)
    finally:
        flashinfer_plan._event, flashinfer_plan._rings = saved[0], saved[2]
        flashinfer_plan._state.clear()
        flashinfer_plan._state.update(saved[1])


def test_a_floor_one_above_the_committed_length_is_caught(rig, monkeypatch):
    """The plant "the device accepted at least one token": wrong for a request level with
    the host (just prefilled, or its last step already processed). Device 1024 = committed
    1008 + block, a chunk boundary: a floor of 1025 sees no straddle up to 1040."""
    monkeypatch.setattr(BoundStep, "lower", property(lambda s: s.committed + s.window + 1))
    got = verify(rig, [1008], [1008], [1008 + 2 * BLOCK])
    assert got["max_err"] > 0.1 and got["replans"] == 0


def test_a_skipped_check_is_caught(rig, monkeypatch):
    monkeypatch.setattr(flashinfer_plan, "_disagrees", lambda *a: False)
    got = verify(rig, [1004], [1004], [1004 + 2 * BLOCK])
    assert got["max_err"] > 0.1


def test_a_plan_that_does_not_split_is_not_checked(rig, monkeypatch):
    model, plan = rig
    w = model.wrapper(1)
    w._plan_info = [0] * 15
    assert flashinfer_plan._planned_chunk(w) is None
