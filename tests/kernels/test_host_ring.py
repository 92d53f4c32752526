"""No stale or torn lengths: the stamped, double-buffered pinned host ring.

A read of launch ``k`` returns launch ``k``'s lengths while at most one newer launch has
been made (that launch wrote the other row), and refuses - never returns other lengths -
once its row was reused. Expected values come from the contract in
spec_fused/kernels/host_ring.py's docstrings:
row ``k % 2`` belongs to launch ``k``, laid out ``[*lens, sum, ..., stamp]`` with the
stamp at the row's end, rows of an even number of int64 values (16-byte aligned), and a
read that returns launch ``k``'s lengths or raises - never another launch's, never a row
no launch wrote."""

import random

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from spec_fused.kernels import host_ring as host_ring_mod
from spec_fused.kernels.checks import StaleHostMirrorError
from spec_fused.kernels.host_ring import HostRing, write_host_row
from spec_fused.kernels.publish_gather import publish_gather_reference
from spec_fused.kernels.step_launcher import StepLauncher


@pytest.mark.parametrize("max_batch, width", [(1, 4), (2, 4), (3, 6), (4, 6), (7, 10), (8, 10)])
def test_rows_are_the_smallest_even_width_that_holds_a_full_batch(max_batch, width):
    """``max_batch`` lengths + the sum + the stamp, rounded up to an even count of int64
    values (16-byte aligned rows); two rows."""
    ring = HostRing(max_batch, pinned=False)
    assert tuple(ring.rows.shape) == (2, width)
    assert ring.rows.dtype == torch.int64 and ring.stamp_offset == width - 1


@pytest.mark.parametrize("max_batch", [1, 3, 5, 8])
def test_a_full_batch_reads_back_with_its_sum(max_batch):
    """``n == max_batch``: the sum lands right after the lengths and the stamp after it,
    neither overwriting the other (odd and even ``max_batch``)."""
    ring = HostRing(max_batch, pinned=False)
    for stamp in (0, 1, 2):
        lens = torch.arange(1, max_batch + 1, dtype=torch.int64) * (10 + stamp)
        write_host_row(ring.rows[stamp % 2], lens, int(lens.sum()), stamp, ring.stamp_offset)
        got, total = ring.read(stamp, max_batch, strict=True)
        assert got.tolist() == lens.tolist() and total == int(lens.sum())
        assert got.dtype == torch.int64


def test_lengths_beyond_float_precision_read_back_exactly():
    ring = HostRing(2, pinned=False)
    lens = torch.tensor([2**40 + 1, 2**53 + 3], dtype=torch.int64)
    write_host_row(ring.rows[0], lens, int(lens.sum()), 0, ring.stamp_offset)
    got, total = ring.read(0, 2, strict=True)
    assert got.tolist() == [2**40 + 1, 2**53 + 3] and total == 2**40 + 2**53 + 4


@pytest.mark.parametrize("stamp", [0, 1])
def test_a_fresh_ring_holds_no_launchs_row(stamp):
    """Nothing was launched: reading step 0 or step 1 refuses (no stamp is negative)."""
    ring = HostRing(4, pinned=False)
    with pytest.raises(StaleHostMirrorError) as info:
        ring.read(stamp, 2, strict=True)
    assert info.value.cause == "stale"


@pytest.mark.parametrize("stamp", [0, 1, 2, 3, 6, 7])
def test_row_k_is_the_row_launch_k_owns(stamp):
    ring = HostRing(3, pinned=False)
    row = ring.row(stamp)
    assert row.data_ptr() == ring.rows[stamp % 2].data_ptr()
    write_host_row(row, torch.tensor([4, 5]), 9, stamp, ring.stamp_offset)
    lens, total = ring.read(stamp, 2, strict=True)
    assert (lens.tolist(), total) == ([4, 5], 9)


def test_the_ring_asks_for_pinned_rows_only_when_told(monkeypatch):
    """Zero-copy from the kernel needs pinned host memory (CUDA); the CPU ring does not."""
    seen = []
    real_full = torch.full

    def full(*args, **kwargs):
        seen.append(kwargs.get("pin_memory"))
        return real_full(*args, **{**kwargs, "pin_memory": False})

    monkeypatch.setattr(host_ring_mod.torch, "full", full)
    HostRing(4, pinned=True)
    HostRing(4, pinned=False)
    assert seen == [True, False]


def test_stale_messages_name_the_step_held_and_the_step_wanted():
    ring = HostRing(4, pinned=False)
    ring.stamp_only(7, total=0)  # row 1 holds step 7
    with pytest.raises(StaleHostMirrorError, match=r"holds step 7, expected step 9$") as info:
        ring.read(9, 0)
    assert info.value.cause == "stale"
    with pytest.raises(
        StaleHostMirrorError, match=r"holds step 7 after waiting, expected step 9$"
    ) as info:
        ring.read(9, 0, wait=lambda: None)
    assert info.value.cause == "stale after waiting"


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


def test_a_row_the_wait_completes_is_read():
    """Not yet written when first looked at; the wait is the launch completing."""
    ring = HostRing(4, pinned=False)
    ring.stamp_only(1, total=0)
    calls = []

    def wait():
        calls.append(1)
        write_host_row(ring.rows[1], torch.tensor([11, 12, 13]), 36, 3, ring.stamp_offset)

    lens, total = ring.read(3, 3, wait=wait)
    assert (lens.tolist(), total, calls) == ([11, 12, 13], 36, [1])


class _RewrittenWhileCopying:
    """A ring row whose stamp changes once its lengths are sliced for the copy: another
    launch rewriting the row while the host copies it."""

    def __init__(self, row, new_stamp):
        self.row, self.new_stamp, self.copied = row, new_stamp, False

    def __getitem__(self, key):
        if isinstance(key, slice):
            self.copied = True
            return self.row[key]
        if key == -1 and self.copied:
            return np.int64(self.new_stamp)
        return self.row[key]


class _Rows:
    def __init__(self, rows, torn):
        self.rows, self.torn = rows, torn

    def __getitem__(self, index):
        return self.torn if index == 0 else self.rows[index]


def test_a_row_rewritten_while_it_is_copied_is_refused_as_torn():
    ring = HostRing(4, pinned=False)
    write_host_row(ring.rows[0], torch.tensor([1, 2]), 3, 4, ring.stamp_offset)
    ring.np = _Rows(ring.np, _RewrittenWhileCopying(ring.np[0], 6))
    with pytest.raises(
        StaleHostMirrorError,
        match=r"^host mirror slot was rewritten \(step 6\) while step 4 was "
        r"being read$",
    ) as info:
        ring.read(4, 2, wait=lambda: None)
    assert info.value.cause == "torn"


# ----------------------------------------------------------------------------- through the launcher


def _launch(pg, mirror, r, pool):
    gather = torch.tensor([r.randrange(pool) for _ in range(r.randint(1, 8))])
    pub = torch.tensor(r.sample(range(pool), min(pool, r.randrange(0, 5))), dtype=torch.int64)
    vals = torch.tensor([r.randrange(5000) for _ in pub], dtype=torch.int32)
    want = publish_gather_reference(mirror, gather, pub, vals)
    pg.launch_checked(gather, pub, vals, True)
    return pg.stamp, gather.shape[0], want.seq_lens.tolist(), int(want.seq_lens_sum)


@pytest.mark.parametrize("backend", ["interpreter", "reference"])
@given(
    pool=st.integers(1, 200),
    ops=st.lists(
        st.tuples(st.sampled_from(["launch", "read"]), st.integers(0, 10**6)), max_size=40
    ),
)
def test_a_read_returns_that_launchs_lengths_or_refuses_once_reused(backend, pool, ops):
    g = torch.Generator().manual_seed(pool)
    buf = torch.randint(0, 1000, (pool,), generator=g)
    mirror = buf.clone()
    pg = StepLauncher(buf, max_batch=64, backend=backend)
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
    pg = StepLauncher(torch.arange(10, dtype=torch.int64), backend="interpreter")
    pg.launch_checked(torch.tensor([1, 2]), None, None, True)
    first = pg.stamp
    pg.launch_checked(torch.tensor([5, 6, 7]), torch.tensor([5]), torch.tensor([99]), True)
    lens, total = pg.read_row(first, 2)
    assert (lens.tolist(), total) == ([1, 2], 3)
    lens, total = pg.read_row(pg.stamp, 3)
    assert (lens.tolist(), total) == ([99, 6, 7], 112)


def test_lengths_read_are_owned_by_the_caller():
    pg = StepLauncher(torch.arange(10, dtype=torch.int64), backend="interpreter")
    pg.launch_checked(torch.tensor([1, 2]), None, None, True)
    lens, total = pg.read_row(pg.stamp, 2)
    for _ in range(3):  # later launches reuse the ring; the copy handed out stays put
        pg.launch_checked(torch.tensor([5, 6]), torch.tensor([5]), torch.tensor([99]), True)
    assert lens.tolist() == [1, 2] and total == 3
