"""The stamped, double-buffered host mirror the fused launch writes exact lengths into.

Why: SGLang's exact-host-lengths path copies the whole ``new_seq_lens_buf`` pool to the
host and blocks on a stream synchronize every step. The fused launch instead stores the
step's ``bs`` lengths, their sum and a stamp straight into pinned host memory (zero-copy
on CUDA), and the host waits for that one launch. Its write (the kernel, or
:func:`write_host_row` for the torch reference) and its read (:meth:`HostRing.read`), with
the argument for why the read never returns another step's lengths, are all here.

Row ``k % 2`` belongs to launch ``k``: ``[*lens, sum, ..., stamp]``, the stamp at a fixed
place (the row's end). With two rows, the launch for step ``k + 1`` never overwrites the
row of step ``k``, so a reader of step ``k`` may still be copying while the next launch is
enqueued. What orders the row's values before the host reads them is the wait for the
launch's completion - on CUDA an event recorded after it: a completed kernel's stores to
mapped host memory are visible to the host - not the stamp. The kernel stores the stamp
last, but from one thread and with no system-scope fence, so the stamp does not publish
the row by itself; it says *which* launch wrote the row (catching a reused slot, a launch
that never ran, a read of the wrong step), and it is read again after the copy to catch a
rewrite while copying. Stamps wrap at 2**30 so Triton keeps typing them int32.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Optional

import torch

from spec_fused.kernels.checks import StaleHostMirrorError

__all__ = ["HostRing", "write_host_row"]


class HostRing:
    RING = 2
    STAMP_MASK = (1 << 30) - 1

    def __init__(self, max_batch: int, *, pinned: bool):
        width = max_batch + 2 + (max_batch % 2)  # even: 16-byte aligned rows
        self.rows = torch.full((self.RING, width), -1, dtype=torch.int64, pin_memory=pinned)
        self.np = self.rows.numpy()  # stamps are read as numpy scalars: no tensor op
        self.stamp_offset = width - 1

    def row(self, stamp: int) -> torch.Tensor:
        return self.rows[stamp & 1]

    def stamp_only(self, stamp: int, total: Optional[int] = None) -> None:
        """A launch with nothing to store (DP-idle, or the benchmarks' null backend)
        still owns its row: its sum (when given) and its stamp."""
        if total is not None:
            self.np[stamp & 1, 0] = total
        self.np[stamp & 1, -1] = stamp

    def read(
        self, stamp: int, n: int, wait: Optional[Callable[[], None]] = None, *, strict: bool = False
    ) -> tuple:
        """``(lens, total)`` of launch ``stamp``, copied out (the caller owns them).

        Call once that launch has completed. A row whose stamp is not ``stamp`` raises
        :class:`StaleHostMirrorError` when ``strict`` or when there is no ``wait``;
        otherwise ``wait()`` is called once more (the launch may not have been waited
        for) and the stamp re-checked. Never an older or newer launch's lengths."""
        row = self.np[stamp & 1]
        if row[-1] != stamp:
            if strict or wait is None:
                raise StaleHostMirrorError(
                    f"host mirror slot holds step {int(row[-1])}, expected step {stamp}", "stale"
                )
            wait()
            if row[-1] != stamp:
                raise StaleHostMirrorError(
                    f"host mirror slot holds step {int(row[-1])} after waiting, expected "
                    f"step {stamp}",
                    "stale after waiting",
                )
        lens, total = torch.from_numpy(row[:n].copy()), int(row[n])
        if row[-1] != stamp:  # overwritten while copying: torn
            raise StaleHostMirrorError(
                f"host mirror slot was rewritten (step {int(row[-1])}) while step "
                f"{stamp} was being read",
                "torn",
            )
        return lens, total


def write_host_row(row, lens, total, stamp=None, stamp_offset=-1) -> None:
    """The kernel's host-mirror store, in torch: ``[*lens, total]`` and, last, the stamp."""
    n = lens.shape[0]
    row[:n].copy_(lens)
    row[n] = total
    if stamp is not None:
        row.view(-1)[stamp_offset] = stamp  # (a view of the whole ring row)
