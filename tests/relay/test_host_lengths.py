"""Host lengths through the relay: two batches in flight keep their own, debug mode's
checks (never-published slots, double reads, host indices), and which batches get host
lengths at all (a claim, upstream's ``needs_cpu_seq_lens``).

The host copies underneath (staged indices up, the row ``[*lens, sum]`` down) are tested
in tests/kernels/test_step_launcher.py, their stream order in test_stream_order.py."""

import logging
import random
from types import SimpleNamespace

import pytest
import torch
from compat.expectations import expectation_for
from hypothesis import given
from hypothesis import strategies as st
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
from support.arms import patched_future_map, unpatched_then_patched
from support.fake_cuda import EXACT, direct_relay

from spec_fused import relay as relay_mod
from spec_fused.kernels.checks import PoisonedSlotError
from spec_fused.tools.traces import (
    TraceConfig,
    decode_batch,
    make_future_map,
)

CFG = TraceConfig(pool=16, max_len=32)


def _two_batch_ops():
    op = st.tuples(
        st.sampled_from(["publish", "resolve", "finish"]), st.integers(0, 1), st.integers(0, 10**6)
    )
    return st.lists(op, min_size=1, max_size=60)


@given(_two_batch_ops(), st.sampled_from(["EAGLE", "DFLASH"]), st.booleans())
def test_two_batches_in_flight_random_interleavings(ops, algo_name, needs_cpu):
    """Publish/resolve of two batches interleaved at random, slots reused after a finish
    and empty (DP-idle) batches: patched and unpatched FutureMaps see the same lengths."""
    cfg = TraceConfig(pool=24)

    def drive(fm):
        free = list(range(1, cfg.pool))
        batches = [[free.pop() for _ in range(3)], []]
        lens = {s: 10 for b in batches for s in b}
        fm.publish(torch.tensor(batches[0]), torch.tensor([lens[s] for s in batches[0]]))
        seen = []
        for op, b, seed in ops:
            r = random.Random(seed)
            slots = batches[b]
            if op == "publish":
                for s in slots:
                    lens[s] += r.randint(1, 8)
                fm.publish(
                    torch.tensor(slots, dtype=torch.int64),
                    torch.tensor([lens[s] for s in slots], dtype=torch.int32),
                )
            elif op == "resolve":
                batch = decode_batch(slots, cfg)
                fm.resolve_seq_lens_cpu(batch)
                seen.append(
                    (
                        b,
                        batch.seq_lens.tolist(),
                        None if batch.seq_lens_cpu is None else batch.seq_lens_cpu.tolist(),
                        batch.seq_lens_sum,
                    )
                )
            else:  # finish: free this batch's slots, reuse some for fresh requests
                free.extend(slots)
                r.shuffle(free)
                batches[b] = [free.pop() for _ in range(r.randint(0, 4))]
                for s in batches[b]:
                    lens[s] = r.randint(1, 30)
                fm.publish(
                    torch.tensor(batches[b], dtype=torch.int64),
                    torch.tensor([lens[s] for s in batches[b]], dtype=torch.int64),
                )
        return seen

    want, got = unpatched_then_patched(drive, algo_name, cfg, needs_cpu_seq_lens=needs_cpu)
    assert got == want


SMALL = TraceConfig(pool=16)


@pytest.fixture
def debug_fm(monkeypatch):
    monkeypatch.setenv("SPEC_FUSED_DEBUG", "1")
    with patched_future_map(SpeculativeAlgorithm.EAGLE, SMALL) as fm:
        yield fm


def test_planted_bug_reading_a_never_published_slot_is_caught(debug_fm):
    debug_fm.publish(torch.tensor([1, 2]), torch.tensor([7, 8]))
    with pytest.raises(PoisonedSlotError, match="slot 5 ") as info:
        debug_fm.resolve_seq_lens_cpu(decode_batch([1, 2, 5], SMALL))
    assert info.value.slot == 5
    # A caught bug is not a kernel failure: the Triton kernel stays in charge.
    assert relay_mod.relay_for(debug_fm).launcher.backend == "interpreter"


def test_debug_consume_once_catches_a_double_read(debug_fm):
    debug_fm.publish(torch.tensor([1, 2]), torch.tensor([7, 8]))
    debug_fm.resolve_seq_lens_cpu(decode_batch([1, 2], SMALL))
    debug_fm.publish(torch.tensor([1]), torch.tensor([9]))  # slot 2 not re-published
    with pytest.raises(PoisonedSlotError) as info:
        debug_fm.resolve_seq_lens_cpu(decode_batch([1, 2], SMALL))
    assert info.value.slot == 2


def test_a_resolve_with_nothing_to_gather_lands_the_pending_publish():
    """No pending publish may outlive the next forward (which may scatter newer values)."""
    from types import SimpleNamespace

    with patched_future_map(SpeculativeAlgorithm.EAGLE, SMALL) as fm:
        fm.publish(torch.tensor([3]), torch.tensor([30]))
        relay = relay_mod.relay_for(fm)
        assert relay.pending is not None
        fm.resolve_seq_lens_cpu(SimpleNamespace(spec_info=None))  # e.g. a prefill batch
        assert relay.pending is None and fm.__dict__["new_seq_lens_buf"][3] == 30


# ------------------------------------------------------------------- who gets host lengths


@pytest.mark.parametrize("how", ["worker", "env"])
def test_an_explicit_exact_claim_gives_the_batch_host_lengths_on_opted_out_backends(
    how, monkeypatch
):
    """Where every backend opts out upstream hands the step no host lengths; a worker's
    ``host_seq_lens="exact"`` or ``SPEC_FUSED_HOST_SEQ_LENS=exact`` puts them back - on
    the batch, not only in the caps."""
    monkeypatch.delenv("SPEC_FUSED_HOST_SEQ_LENS", raising=False)
    fm = make_future_map("EAGLE", CFG, needs_cpu_seq_lens=False)
    worker = None
    if how == "worker":
        worker = SimpleNamespace(host_seq_lens="exact")
    else:
        monkeypatch.setenv("SPEC_FUSED_HOST_SEQ_LENS", "exact")
    caps = relay_mod.future_map_caps(fm, worker=worker)
    assert caps.host_seq_lens == "exact" and caps.exact_claimed
    relay = relay_mod.FusedRelay(fm, caps, debug=False, ops=None)
    assert relay_mod.gives_host_lengths(relay.caps, fm)
    relay.publish(fm, torch.tensor([3, 5, 7]), torch.tensor([11, 4, 9]))
    batch = decode_batch([7, 3], CFG)
    relay.resolve(fm, batch)
    assert batch.seq_lens.tolist() == [9, 11]
    assert batch.seq_lens_cpu.tolist() == [9, 11] and batch.seq_lens_sum == 20


def test_no_claim_on_opted_out_backends_gives_the_batch_no_host_lengths(monkeypatch):
    monkeypatch.delenv("SPEC_FUSED_HOST_SEQ_LENS", raising=False)
    fm = make_future_map("EAGLE", CFG, needs_cpu_seq_lens=False)
    relay = relay_mod.FusedRelay(fm, relay_mod.future_map_caps(fm), debug=False, ops=None)
    assert not relay_mod.gives_host_lengths(relay.caps, fm)
    relay.publish(fm, torch.tensor([3, 7]), torch.tensor([11, 9]))
    batch = decode_batch([7, 3], CFG)
    relay.resolve(fm, batch)
    assert batch.seq_lens.tolist() == [9, 11]
    assert (batch.seq_lens_cpu, batch.seq_lens_sum) == (None, None)


@pytest.mark.parametrize(
    "algo, needs_cpu, gives",
    [
        ("EAGLE", True, True),  # a backend reads host lengths: upstream gives them
        ("NGRAM", False, False),  # this FutureMap (unlike a server's) says no
        ("NGRAM", True, True),
    ],
)
def test_unclaimed_exact_host_lengths_follow_upstreams_flag(algo, needs_cpu, gives, monkeypatch):
    """Without an explicit claim the batch gets host lengths exactly where SGLang's own
    FutureMap would: its ``needs_cpu_seq_lens`` (upstream forces it for NGRAM)."""
    monkeypatch.delenv("SPEC_FUSED_HOST_SEQ_LENS", raising=False)
    fm = make_future_map(algo, CFG, needs_cpu_seq_lens=needs_cpu)
    caps = relay_mod.future_map_caps(fm)
    assert (caps.host_seq_lens == "exact") is gives
    relay = relay_mod.FusedRelay(fm, caps, debug=False, ops=None)
    assert relay_mod.gives_host_lengths(relay.caps, fm) is gives
    relay.publish(fm, torch.tensor([2]), torch.tensor([6]))
    batch = decode_batch([2], CFG)
    relay.resolve(fm, batch)
    assert (batch.seq_lens_cpu is not None) is gives


def test_an_empty_exact_resolve_gives_what_upstream_gives():
    want = make_future_map("EAGLE", CFG, needs_cpu_seq_lens=True)
    upstream_batch = decode_batch([], CFG)
    want.resolve_seq_lens_cpu(upstream_batch)
    relay, fm, ops = direct_relay(EXACT)
    with ops.on(ops.forward):
        relay.publish(fm, torch.tensor([1]), torch.tensor([10]))
    batch = decode_batch([], CFG)
    relay.resolve(fm, batch)
    assert batch.seq_lens_cpu.dtype == upstream_batch.seq_lens_cpu.dtype == torch.int64
    assert batch.seq_lens_cpu.tolist() == upstream_batch.seq_lens_cpu.tolist() == []
    assert batch.seq_lens_sum == upstream_batch.seq_lens_sum == 0


@pytest.mark.parametrize("bs", [1, relay_mod._PY_SUM_MAX, relay_mod._PY_SUM_MAX + 1, 1000])
@pytest.mark.parametrize("algo", ["EAGLE", "DFLASH"])
def test_a_cpu_relay_gives_upstreams_host_lengths_and_sum_at_every_batch_size(algo, bs):
    """A CPU relay sums a few lengths in Python and more through torch: both equal the
    lengths and the sum SGLang's own resolve gives."""
    cfg = TraceConfig(pool=1024, max_len=1)
    rng = random.Random(bs)
    slots = rng.sample(range(1, cfg.pool), bs)
    lengths = torch.tensor([rng.randrange(1, 1 << 20) for _ in slots])

    def drive(fm):
        fm.publish(torch.tensor(slots), lengths)
        batch = decode_batch(slots, cfg)
        fm.resolve_seq_lens_cpu(batch)
        return batch.seq_lens_cpu.tolist(), batch.seq_lens_sum, type(batch.seq_lens_sum)

    want, got = unpatched_then_patched(drive, algo, cfg, needs_cpu_seq_lens=True)
    assert got == want and want[1] == int(lengths.sum())


@pytest.mark.parametrize(
    "host", [torch.tensor([5, 6, 7]), torch.tensor([5.0, 6.0]), torch.tensor([[5, 6]]), [5, 6]]
)
def test_host_indices_that_are_not_the_batchs_own_are_not_gathered_from(host):
    """Only a 1-D integer CPU copy of ``future_indices``, as long as it, is staged; any
    other exact step is SGLang's, after the pending publish landed - gated on
    ``publish_ready``, never on the schedule stream."""
    relay, fm, ops = direct_relay(EXACT)
    with ops.on(ops.forward):
        relay.publish(fm, torch.tensor([1, 2, 5, 6, 7]), torch.tensor([10, 20, 50, 60, 70]))
    batch = decode_batch([1, 2], CFG)
    batch.req_pool_indices_cpu = host
    with pytest.raises(relay_mod.HandToSGLang, match="no host indices"):
        relay.resolve(fm, batch)
    assert relay.pending is None and fm.new_seq_lens_buf[[1, 2, 5]].tolist() == [10, 20, 50]
    assert not [e for e in ops.log if e[1] == "wait_stream"]


def test_debug_mode_checks_the_host_indices_against_future_indices():
    relay, fm, ops = direct_relay(EXACT, debug=True)
    with ops.on(ops.forward):
        relay.publish(fm, torch.tensor([1, 2]), torch.tensor([10, 20]))
    batch = decode_batch([1, 2], CFG)
    batch.req_pool_indices_cpu = torch.tensor([2, 1])
    with pytest.raises(
        AssertionError, match="^batch.req_pool_indices_cpu differs from future_indices$"
    ):
        relay.resolve(fm, batch)


def test_each_reason_to_hand_a_step_back_is_logged_once(caplog):
    relay, fm, ops = direct_relay(EXACT)
    reasons = []
    with caplog.at_level(logging.INFO, logger="spec_fused"):
        batch = decode_batch([1, 2], CFG)
        batch.req_pool_indices_cpu = torch.tensor([1, 2])
        with pytest.raises(relay_mod.HandToSGLang) as info:  # before any publish
            relay.resolve(fm, batch)
        reasons.append(info.value.args)
        for _ in range(2):
            with ops.on(ops.forward):
                relay.publish(fm, torch.tensor([1, 2]), torch.tensor([10, 20]))
            batch = decode_batch([1, 2], CFG)
            batch.req_pool_indices_cpu = None
            with pytest.raises(relay_mod.HandToSGLang) as info:
                relay.resolve(fm, batch)
            reasons.append(info.value.args)
    assert reasons == [
        ("no publish yet",),
        ("no host indices matching future_indices",),
        ("no host indices matching future_indices",),
    ]
    assert [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "spec_fused"] == [
        (
            logging.INFO,
            f"spec_fused: exact host lengths with {why}: SGLang's own resolve runs such steps",
        )
        for why in ("no publish yet", "no host indices matching future_indices")
    ]


def test_a_batch_without_host_indices_is_handed_back():
    """``req_pool_indices_cpu`` is a field newer batches carry: without it, SGLang's."""
    relay, fm, ops = direct_relay(EXACT)
    with ops.on(ops.forward):
        relay.publish(fm, torch.tensor([1, 2]), torch.tensor([10, 20]))
    batch = decode_batch([1, 2], CFG)
    batch.__dict__.pop("req_pool_indices_cpu", None)
    with pytest.raises(relay_mod.HandToSGLang, match="^no host indices matching future_indices$"):
        relay.resolve(fm, batch)


@pytest.mark.skipif(
    not expectation_for().consume_once, reason="this release has no consume-once flag"
)
def test_debug_mode_holds_an_exact_step_to_upstreams_consume_once_check():
    relay, fm, ops = direct_relay(EXACT, debug=True)
    with ops.on(ops.forward):
        relay.publish(fm, torch.tensor([1, 2]), torch.tensor([10, 20]))
    for attempt in range(2):
        batch = decode_batch([1, 2], CFG)
        batch.req_pool_indices_cpu = torch.tensor([1, 2])
        if attempt:  # no publish since the last resolve
            with pytest.raises(AssertionError, match="^resolve without a fresh forward publish$"):
                relay.resolve(fm, batch)
        else:
            relay.resolve(fm, batch)
            assert batch.seq_lens_cpu.tolist() == [10, 20] and not fm._publish_fresh
