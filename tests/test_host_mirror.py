"""No stale or torn lengths: the stamped, double-buffered host ring and two batches in flight.

The ring's contract (spec_fused/kernels/host_ring.py): a read of launch ``k`` returns
launch ``k``'s lengths while at most one newer launch has been made (that launch wrote the
other row), and refuses - never returns other lengths - once its row was reused."""

import logging
import random

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

from spec_fused import relay as relay_mod
from spec_fused.kernels.checks import PoisonedSlotError, StaleHostMirrorError
from spec_fused.kernels.host_ring import HostRing
from spec_fused.kernels.publish_gather import publish_gather_reference
from spec_fused.kernels.step_launcher import PublishGather
from spec_fused.traces import (
    TraceConfig,
    decode_batch,
    patched_future_map,
    unpatched_then_patched,
)


def _launch(pg, mirror, r, pool):
    gather = torch.tensor([r.randrange(pool) for _ in range(r.randint(1, 8))])
    pub = torch.tensor(r.sample(range(pool), min(pool, r.randrange(0, 5))), dtype=torch.int64)
    vals = torch.tensor([r.randrange(5000) for _ in pub], dtype=torch.int32)
    want = publish_gather_reference(mirror, gather, pub, vals)
    pg.launch_checked(gather, pub, vals, True)
    return pg.stamp, gather.shape[0], want.seq_lens.tolist(), int(want.seq_lens_sum)


@pytest.mark.parametrize("backend", ["interpreter", "reference"])
@given(pool=st.integers(1, 200), ops=st.lists(st.tuples(
    st.sampled_from(["launch", "read"]), st.integers(0, 10**6)), max_size=40))
def test_a_read_returns_that_launchs_lengths_or_refuses_once_reused(backend, pool, ops):
    g = torch.Generator().manual_seed(pool)
    buf = torch.randint(0, 1000, (pool,), generator=g)
    mirror = buf.clone()
    pg = PublishGather(buf, max_batch=64, backend=backend)
    launched = []  # (stamp, n, lens, sum)
    for op, seed in ops:
        r = random.Random(seed)
        if op == "launch" or not launched:
            launched.append(_launch(pg, mirror, r, pool))
            continue
        k = seed % len(launched)
        stamp, n, lens, total = launched[k]
        newer = len(launched) - 1 - k
        if newer < HostRing.RING:  # its row is still its own: the read must succeed
            got_lens, got_sum = pg.read_row(stamp, n)
            assert got_lens.tolist() == lens and got_sum == total, (newer, k)
        else:
            with pytest.raises(StaleHostMirrorError):
                pg.read_row(stamp, n)


def test_the_previous_launch_is_still_readable_after_the_next_one():
    """What the second row is for: the next launch is enqueued while the host still
    reads the previous one's lengths."""
    pg = PublishGather(torch.arange(10, dtype=torch.int64), backend="interpreter")
    pg.launch_checked(torch.tensor([1, 2]), None, None, True)
    first = pg.stamp
    pg.launch_checked(torch.tensor([5, 6, 7]), torch.tensor([5]), torch.tensor([99]), True)
    lens, total = pg.read_row(first, 2)
    assert (lens.tolist(), total) == ([1, 2], 3)
    lens, total = pg.read_row(pg.stamp, 3)
    assert (lens.tolist(), total) == ([99, 6, 7], 112)


def test_lengths_read_are_owned_by_the_caller():
    pg = PublishGather(torch.arange(10, dtype=torch.int64), backend="interpreter")
    pg.launch_checked(torch.tensor([1, 2]), None, None, True)
    lens, total = pg.read_row(pg.stamp, 2)
    for _ in range(3):  # later launches reuse the ring; the copy handed out stays put
        pg.launch_checked(torch.tensor([5, 6]), torch.tensor([5]), torch.tensor([99]), True)
    assert lens.tolist() == [1, 2] and total == 3


def test_a_stale_row_is_waited_for_once_then_refused():
    ring = HostRing(4, pinned=False)
    ring.stamp_only(7, total=0)
    calls = []
    with pytest.raises(StaleHostMirrorError) as info:
        ring.read(9, 0, wait=lambda: calls.append(1))
    assert calls == [1] and info.value.cause == "stale after waiting"
    with pytest.raises(StaleHostMirrorError) as info:
        ring.read(9, 0, wait=lambda: calls.append(1), strict=True)
    assert calls == [1] and info.value.cause == "stale"  # strict: no second wait
    lens, total = ring.read(7, 0)
    assert lens.tolist() == [] and total == 0


def _two_batch_ops():
    op = st.tuples(st.sampled_from(["publish", "resolve", "finish"]), st.integers(0, 1),
                   st.integers(0, 10**6))
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
                fm.publish(torch.tensor(slots, dtype=torch.int64),
                           torch.tensor([lens[s] for s in slots], dtype=torch.int32))
            elif op == "resolve":
                batch = decode_batch(slots, cfg)
                fm.resolve_seq_lens_cpu(batch)
                seen.append((b, batch.seq_lens.tolist(),
                             None if batch.seq_lens_cpu is None else batch.seq_lens_cpu.tolist(),
                             batch.seq_lens_sum))
            else:  # finish: free this batch's slots, reuse some for fresh requests
                free.extend(slots)
                r.shuffle(free)
                batches[b] = [free.pop() for _ in range(r.randint(0, 4))]
                for s in batches[b]:
                    lens[s] = r.randint(1, 30)
                fm.publish(torch.tensor(batches[b], dtype=torch.int64),
                           torch.tensor([lens[s] for s in batches[b]], dtype=torch.int64))
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


def _launched_with_a_stale_stamp(relay, gather, lens):
    """A host-mirror launch through the relay's launcher whose row then reads as another
    launch's (as a launch that did not write it would leave it)."""
    relay.launcher.mirror = True  # as a CUDA relay's launcher (a CPU relay sums only)
    relay.launcher.buf[torch.tensor(gather)] = torch.tensor(lens)
    out = relay.launcher.launch_checked(torch.tensor(gather), None, None, True)
    stamp = relay.launcher.stamp
    relay.launcher.ring.np[stamp & 1, -1] = -12345
    return stamp, out


@pytest.mark.parametrize("debug", [True, False])
def test_a_stale_stamp_is_an_error_in_debug_and_never_stale_in_release(monkeypatch, debug,
                                                                       caplog):
    if debug:
        monkeypatch.setenv("SPEC_FUSED_DEBUG", "1")
    relay_mod._logged.clear()
    with patched_future_map(SpeculativeAlgorithm.EAGLE, SMALL) as fm:
        fm.publish(torch.tensor([1, 2]), torch.tensor([7, 8]))
        relay = relay_mod.relay_for(fm)
        if debug:
            stamp, out = _launched_with_a_stale_stamp(relay, [1, 2], [7, 8])
            with pytest.raises(StaleHostMirrorError, match="expected step"):
                relay._read_host(stamp, out, wait=lambda: None)
            return
        with caplog.at_level(logging.WARNING, logger="spec_fused"):
            for step in range(3):  # one log line per cause, not per step
                stamp, out = _launched_with_a_stale_stamp(relay, [1, 2], [7 + step, 8])
                lens, total = relay._read_host(stamp, out, wait=lambda: None)
                assert lens.tolist() == [7 + step, 8] and total == 15 + step
    lines = [r.getMessage() for r in caplog.records if "reading this step's lengths" in
             r.getMessage()]
    assert len(lines) == 1


def test_a_resolve_with_nothing_to_gather_lands_the_pending_publish():
    """No pending publish may outlive the next forward (which may scatter newer values)."""
    from types import SimpleNamespace

    with patched_future_map(SpeculativeAlgorithm.EAGLE, SMALL) as fm:
        fm.publish(torch.tensor([3]), torch.tensor([30]))
        relay = relay_mod.relay_for(fm)
        assert relay.pending is not None
        fm.resolve_seq_lens_cpu(SimpleNamespace(spec_info=None))  # e.g. a prefill batch
        assert relay.pending is None and fm.__dict__["new_seq_lens_buf"][3] == 30


@pytest.mark.parametrize("backend", ["interpreter", "reference"])
def test_a_launcher_on_the_host_yields_the_sum_without_a_mirror(backend):
    """A CPU relay's lengths are host lengths already: ``host=True`` asks the same launch
    for their sum, and no ring is made or written - an idle step's sum is 0."""
    buf = torch.arange(32, dtype=torch.int64) * 3
    pg = PublishGather(buf, backend=backend, mirror=False)
    for launch in (pg.launch_checked, pg.launch, pg.launch):
        out = launch(torch.tensor([2, 5, 9]), torch.tensor([5]), torch.tensor([100]), True)
        assert out.tolist() == [6, 100, 27] and int(pg.out_sum) == 133
    pg.launch(torch.tensor([], dtype=torch.int64), None, None, True)
    assert int(pg.out_sum) == 0 and pg.ring is None
