"""The host ring's contract, pinned down where mutation testing found it loose
(scripts/mutation.py, tests/MUTATION.md).

Expected values come from the contract in spec_fused/kernels/host_ring.py's docstrings:
row ``k % 2`` belongs to launch ``k``, laid out ``[*lens, sum, ..., stamp]`` with the
stamp at the row's end, rows of an even number of int64 values (16-byte aligned), and a
read that returns launch ``k``'s lengths or raises - never another launch's, never a row
no launch wrote."""

import numpy as np
import pytest
import torch

from spec_fused.kernels import host_ring as host_ring_mod
from spec_fused.kernels.checks import StaleHostMirrorError
from spec_fused.kernels.host_ring import HostRing, write_host_row


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
    with pytest.raises(StaleHostMirrorError,
                       match=r"holds step 7 after waiting, expected step 9$") as info:
        ring.read(9, 0, wait=lambda: None)
    assert info.value.cause == "stale after waiting"


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
    with pytest.raises(StaleHostMirrorError,
                       match=r"^host mirror slot was rewritten \(step 6\) while step 4 was "
                             r"being read$") as info:
        ring.read(4, 2, wait=lambda: None)
    assert info.value.cause == "torn"
