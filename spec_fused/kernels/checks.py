"""Errors and input checks shared by the kernel wrapper and the per-step launcher.

Why one module: "bad input gets a clear error, raised before anything is written" is one
contract, and the public ``publish_gather()``, the per-step launcher's checked path and
the relay all raise the same classes with the same messages. The classes are subclasses
of ``ValueError``/``TypeError`` (so callers catch them as such) of their own, so the relay
can tell the caller's mistake from a kernel that failed.
"""

from __future__ import annotations

from typing import Optional

import torch

__all__ = [
    "InputError",
    "InputTypeError",
    "NO_ERROR",
    "PoisonedSlotError",
    "raise_if_flagged",
    "validate",
]

# Marker the kernel leaves in the error flag when nothing went wrong.
NO_ERROR = -1
INDEX_DTYPES = (torch.int32, torch.int64)


class InputError(ValueError):
    """Bad input to the relay's kernel (shape, device, range, ...), raised before anything
    is written. A ``ValueError``, so callers catch it as one; its own class, so the relay
    can tell the caller's mistake from a kernel that failed."""


class InputTypeError(TypeError):
    """Bad input dtype or type to the relay's kernel: a ``TypeError``, raised before
    anything is written (see :class:`InputError`)."""


class PoisonedSlotError(RuntimeError):
    """A gathered slot held a consumed (negative) value: it was never re-published."""

    def __init__(self, slot: int):
        super().__init__(
            f"publish_gather: slot {slot} was gathered but holds a consumed/unpublished "
            f"value (consume-once check, as SGLang's _DEBUG_ASSERT)"
        )
        self.slot = slot


def raise_if_flagged(flag: Optional[torch.Tensor]) -> None:
    if flag is None:
        return
    slot = int(flag[0])
    if slot != NO_ERROR:
        flag[0] = NO_ERROR
        raise PoisonedSlotError(slot)


def _is_integer(t: torch.Tensor) -> bool:
    return not t.dtype.is_floating_point and not t.dtype.is_complex and t.dtype != torch.bool


def _check_1d(name, t):
    if not isinstance(t, torch.Tensor):
        raise InputTypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != 1:
        raise InputError(f"{name} must be 1-D, got shape {tuple(t.shape)}")


def validate(buf, gather_indices, publish_indices, publish_values, out, out_sum, deep: bool):
    """Raise before anything is written. ``deep`` adds the value checks (range, duplicate
    publish slots) that need the index values on the host: always done on CPU, where they
    are free; on a GPU they cost a sync, so only when asked (``validate``/``poison``)."""
    _check_1d("buf", buf)
    deep = deep or buf.device.type == "cpu"
    if deep and buf.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        deep = False  # reading index values syncs, which graph capture forbids
    if buf.dtype != torch.int64:
        raise InputTypeError(f"buf must be int64, got {buf.dtype}")
    if not buf.is_contiguous():
        raise InputError("buf must be contiguous (it is written in place)")
    _check_1d("gather_indices", gather_indices)
    if gather_indices.dtype not in INDEX_DTYPES:
        raise InputTypeError(f"gather_indices must be int32 or int64, got {gather_indices.dtype}")
    if gather_indices.device != buf.device:
        raise InputError(f"gather_indices is on {gather_indices.device}, buf on {buf.device}")
    if (publish_indices is None) != (publish_values is None):
        raise InputError("publish_indices and publish_values must be given together")
    if publish_indices is not None:
        _check_1d("publish_indices", publish_indices)
        _check_1d("publish_values", publish_values)
        if publish_indices.dtype not in INDEX_DTYPES:
            raise InputTypeError(
                f"publish_indices must be int32 or int64, got {publish_indices.dtype}"
            )
        if not _is_integer(publish_values):
            raise InputTypeError(
                f"publish_values must be an integer tensor, got {publish_values.dtype}"
            )
        for name, t in (("publish_indices", publish_indices), ("publish_values", publish_values)):
            if t.device != buf.device:
                raise InputError(f"{name} is on {t.device}, buf on {buf.device}")
        if publish_indices.shape[0] != publish_values.shape[0]:
            raise InputError(
                f"publish_indices has {publish_indices.shape[0]} entries but publish_values "
                f"has {publish_values.shape[0]}"
            )
    n = gather_indices.shape[0]
    if out is not None:
        _check_1d("out", out)
        if out.shape[0] != n or out.dtype != buf.dtype or out.device != buf.device:
            raise InputError(
                f"out must be ({n},) {buf.dtype} on {buf.device}, got {tuple(out.shape)} "
                f"{out.dtype} on {out.device}"
            )
        if not out.is_contiguous():
            raise InputError("out must be contiguous")
    if out_sum is not None:
        if not isinstance(out_sum, torch.Tensor):
            raise InputTypeError("out_sum must be a torch.Tensor")
        if (
            out_sum.numel() != 1
            or out_sum.dim() > 1
            or out_sum.dtype != torch.int64
            or out_sum.device != buf.device
        ):
            raise InputError(
                f"out_sum must be a 0-d or (1,) int64 tensor on {buf.device}, got "
                f"{tuple(out_sum.shape)} {out_sum.dtype} on {out_sum.device}"
            )
    if deep:
        pool = buf.shape[0]
        _check_range("gather_indices", gather_indices, pool)
        if publish_indices is not None and publish_indices.shape[0]:
            _check_range("publish_indices", publish_indices, pool)
            if torch.unique(publish_indices).shape[0] != publish_indices.shape[0]:
                vals, counts = torch.unique(publish_indices, return_counts=True)
                dup = int(vals[counts > 1][0])
                raise InputError(f"publish_indices has duplicate slot {dup}")


def _check_range(name, idx, pool):
    if idx.numel() == 0:
        return
    lo, hi = int(idx.min()), int(idx.max())
    if lo < 0 or hi >= pool:
        bad = lo if lo < 0 else hi
        raise InputError(f"{name} has slot {bad} outside the pool [0, {pool})")
