"""The bound variant on the relay: a covered step gives no host lengths and waits for
nothing; any other step is SGLang's; debug mode holds the bound to the device lengths.

The FutureMap reads host lengths (``needs_cpu_seq_lens``) and the decision carries DFLASH's
own bound (``caps.HostBound``), as the scheduler hands it where every reader of host
lengths plans from it (``integration/flashinfer_plan.py``)."""

import types

import pytest
import torch
from support.fake_cuda import CFG, FakeOps, direct_relay

from spec_fused import relay as relay_mod
from spec_fused.caps import HostBound, decide
from spec_fused.integration import sglang_patch
from spec_fused.tools.traces import decode_batch, make_future_map

DECODE = types.SimpleNamespace(is_decode=lambda: True)
MIXED = types.SimpleNamespace(is_decode=lambda: False)


def bound_caps(max_bs=4, window=4, armed=None, expected=None):
    arm = (lambda: armed.append(1)) if armed is not None else (lambda: None)
    expect = expected.append if expected is not None else (lambda step: None)
    bound = HostBound("DFLASH's own bound (test)", max_bs, window, arm=arm, expect=expect)
    return decide("DFLASH", needs_cpu_seq_lens=True, env={}, host_bound=bound)


def batch(slots, mode=DECODE, bound=None, rids=None, committed=None):
    """A decode batch as ``prepare_for_decode`` leaves it: ``seq_lens_cpu`` seeded with the
    host's committed lengths (``committed``; 0 each unless given)."""
    b = decode_batch(slots, CFG)
    b.forward_mode = mode
    b.seq_lens_cpu = torch.tensor(committed or [0] * len(slots))
    b.spec_info.nxt_kv_lens_cpu = None if bound is None else torch.tensor(bound)
    b.reqs = [types.SimpleNamespace(rid=r) for r in rids] if rids else []
    return b


def published(relay, fm, ops, slots, values):
    with ops.on(ops.forward) if ops else _nothing():
        relay.publish(fm, torch.tensor(slots), torch.tensor(values))


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


@pytest.mark.parametrize("ops", [None, "fake"], ids=["cpu", "cuda-standin"])
def test_a_covered_step_gives_no_host_lengths_and_no_host_wait(ops):
    relay, fm, ops = direct_relay(bound_caps(), ops=ops, algo="DFLASH")
    published(relay, fm, ops, [1, 2], [10, 20])
    if ops:
        ops.log.clear()
    b = batch([1, 2])
    relay.resolve(fm, b)
    assert b.seq_lens.tolist() == [10, 20]
    assert b.seq_lens_cpu is None and b.seq_lens_sum is None
    if ops:  # the caller's stream waits on the device; nothing on the host
        assert ("schedule", "wait_event", fm.publish_ready.name) in ops.log
        assert not [entry for entry in ops.log if entry[0] == "host"]


@pytest.mark.parametrize(
    "b",
    [batch([1, 2], MIXED), batch([1, 2, 3, 4, 5])],
    ids=["a mixed chunk", "a batch above the largest graph"],
)
def test_a_step_the_bound_does_not_cover_is_sglangs_after_the_publish_lands(b):
    relay, fm, ops = direct_relay(bound_caps(max_bs=4), ops="fake", algo="DFLASH")
    published(relay, fm, ops, [1, 2], [10, 20])
    with pytest.raises(relay_mod.HandToSGLang, match="host bound does not cover"):
        relay.resolve(fm, b)
    assert relay.pending is None and fm.new_seq_lens_buf[[1, 2]].tolist() == [10, 20]


def test_through_sglangs_future_map_an_uncovered_step_gets_sglangs_exact_lengths():
    fm = make_future_map("DFLASH", CFG, needs_cpu_seq_lens=True)
    fm.__dict__[relay_mod.CAPS_ATTR] = bound_caps(max_bs=2)
    sglang_patch.apply()
    try:
        fm.publish(torch.tensor([1, 2, 3]), torch.tensor([10, 20, 30]))
        covered, uncovered = batch([1, 2]), batch([1, 2, 3])
        fm.resolve_seq_lens_cpu(covered)
        assert covered.seq_lens.tolist() == [10, 20] and covered.seq_lens_cpu is None
        fm.publish(torch.tensor([1, 2, 3]), torch.tensor([11, 21, 31]))
        fm.resolve_seq_lens_cpu(uncovered)  # SGLang's own resolve: exact host lengths
        assert uncovered.seq_lens_cpu.tolist() == [11, 21, 31] and uncovered.seq_lens_sum == 63
        assert fm.__dict__[relay_mod.RELAY_ATTR] is not None  # per step, not for good
    finally:
        sglang_patch.remove()


def test_debug_mode_names_the_request_whose_bound_is_short():
    relay, fm, ops = direct_relay(bound_caps(window=4), ops=None, algo="DFLASH", debug=True)
    published(relay, fm, None, [1, 2], [10, 20])
    relay.resolve(fm, batch([1, 2], bound=[14, 24], rids=["a", "b"]))  # exactly enough
    published(relay, fm, None, [1, 2], [11, 21])
    with pytest.raises(AssertionError, match=r"request b: device length 21 outside .* 24 - verify"):
        relay.resolve(fm, batch([1, 2], bound=[15, 24], rids=["a", "b"]))


def test_debug_mode_names_the_request_the_device_is_behind():
    """The floor the plans check their partition against holds only if the device never
    lags what the host committed."""
    relay, fm, ops = direct_relay(bound_caps(window=4), ops=None, algo="DFLASH", debug=True)
    published(relay, fm, None, [1, 2], [10, 20])
    match = r"request a: device length 10 outside \[host committed 11"
    with pytest.raises(AssertionError, match=match):
        relay.resolve(fm, batch([1, 2], bound=[15, 24], rids=["a", "b"], committed=[11, 20]))


def test_a_covered_step_tells_its_plans_the_floor_and_reads_exact_lengths_in_resolve_order():
    """The floor is the host's committed lengths (prepare_for_decode's seed) + the window;
    the exact lengths, read only where a plan asks, wait for the resolve stream (the
    publish), not for the forward stream the plan runs on."""
    expected = []
    relay, fm, ops = direct_relay(bound_caps(window=4, expected=expected), algo="DFLASH")
    published(relay, fm, ops, [1, 2], [10, 20])
    relay.resolve(fm, batch([1, 2], committed=[9, 20]))
    none, step = expected
    assert none is None and step.lower.tolist() == [13, 24]
    ops.log.clear()
    with ops.on(ops.forward):  # where the plan runs
        assert step.exact.tolist() == [14, 24]
    assert ops.log == [("host", "reads back after", "schedule")]


@pytest.mark.parametrize(
    "b",
    [batch([1, 2], MIXED), batch([1, 2, 3, 4, 5]), decode_batch([1, 2], CFG)],
    ids=["a mixed chunk", "a batch above the largest graph", "no committed lengths"],
)
def test_a_step_the_bound_does_not_cover_leaves_its_plans_unchecked_and_exact(b):
    """SGLang's resolve gives such a step exact host lengths: no plan of it is the bound's."""
    expected = []
    b.forward_mode = getattr(b, "forward_mode", DECODE)
    relay, fm, ops = direct_relay(bound_caps(expected=expected), ops="fake", algo="DFLASH")
    published(relay, fm, ops, [1, 2], [10, 20])
    relay.resolve(fm, batch([1, 2]))
    with pytest.raises(relay_mod.HandToSGLang):
        relay.resolve(fm, b)
    assert expected[-1] is None and expected[-2] is not None


def test_a_relay_handing_its_future_map_back_for_good_leaves_no_step_expected():
    expected = []
    relay, fm, ops = direct_relay(bound_caps(expected=expected), ops="fake", algo="DFLASH")
    published(relay, fm, ops, [1, 2], [10, 20])
    relay.resolve(fm, batch([1, 2]))
    relay.retire(fm, "test")
    assert expected[-1] is None


def test_a_relay_that_plans_from_the_bound_arms_what_the_bound_needs_first():
    armed = []
    relay, fm, _ = direct_relay(bound_caps(armed=armed), ops=FakeOps(), algo="DFLASH")
    assert armed == [1] and relay.bound is not None and not relay.exact
    exact, *_ = direct_relay(
        decide("DFLASH", needs_cpu_seq_lens=True, env={"SPEC_FUSED_HOST_SEQ_LENS": "exact"}),
        ops=FakeOps(),
        algo="DFLASH",
    )
    assert exact.bound is None and exact.exact
