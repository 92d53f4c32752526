"""One launch for the FutureMap relay: publish step N's lengths, gather step N+1's, sum them.

Why fused: upstream SGLang spends a scatter (plus a dtype cast), an event, a gather, a
D2H copy of the *whole* ``new_seq_lens_buf`` pool, a blocking synchronize and a host
index + sum on every speculative decode step (``FutureMap.publish`` and
``FutureMap.resolve_seq_lens_cpu``). All of it touches at most ``m + n`` int64 values, so
the cost is pure launch and sync overhead. This module does the scatter, the gather, the
sum and (optionally) the host mirror in ONE Triton program: the publish happens-before the
gather inside the launch (``tl.debug_barrier``), the sum is a register reduction, and the
host mirror is ``n + 1`` values stored straight into pinned memory by the same program.

Layout follows SGLang's ``gather_spec_extras``: the kernel, its one-call wrapper
(:func:`publish_gather`), a torch reference with the same semantics, and the custom op
that lets ``torch.compile`` trace it. The per-step launcher the relay uses is
``step_launcher.StepLauncher``; input checks and errors are ``checks``; which backend
runs where is ``backend`` (which needs nothing of this module).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from spec_fused.kernels import checks
from spec_fused.kernels.backend import backend_for
from spec_fused.kernels.checks import NO_ERROR, raise_if_flagged
from spec_fused.kernels.host_ring import write_host_row

try:  # Triton is optional: without it every device gets the reference.
    import triton
    import triton.language as tl
except Exception:  # pragma: no cover - exercised by the fallback-ladder tests
    triton = None
    tl = None

__all__ = ["BLOCK", "PublishGatherResult", "publish_gather", "publish_gather_reference"]

# One program, one block shape: a decode batch up to BLOCK lengths takes one loop
# iteration; larger ones loop inside the same program, which is still one launch. A single
# BLOCK keeps the compiled specializations few, so none is compiled while serving.
BLOCK = 1024
NUM_WARPS = 4


@dataclass
class PublishGatherResult:
    seq_lens: torch.Tensor  # (n,) buf.dtype on buf.device
    seq_lens_sum: torch.Tensor  # 0-d int64 on buf.device
    # Sticky error flag the poison check writes (slot index, or -1): None unless poison.
    error_flag: Optional[torch.Tensor] = None

    def raise_if_poisoned(self) -> None:
        """Raise :class:`PoisonedSlotError` if the consume-once check tripped.

        Reads the flag without a device sync when it lives in host memory (CPU, or a
        pinned zero-copy flag on CUDA); call it after the stream has been synchronized."""
        raise_if_flagged(self.error_flag)


# --------------------------------------------------------------------------- kernel

if triton is not None:
    # Nothing but the pointers' dtypes and the constexprs may pick the compiled specialization:
    # lengths and the stamp change every step (specializing on them would recompile),
    # and the caller's index/value tensors may be views at any offset. So every integer
    # is excluded from value specialization and every pointer but the relay buffer from
    # alignment specialization, which is what lets StepLauncher bind one compiled
    # specialization per dtype combination and launch it directly (direct_launch.py).
    @triton.jit(
        do_not_specialize=[
            "pub_idx_stride",
            "pub_val_stride",
            "m",
            "gat_idx_stride",
            "n",
            "stamp",
            "stamp_offset",
        ],
        do_not_specialize_on_alignment=[
            "pub_idx_ptr",
            "pub_val_ptr",
            "gat_idx_ptr",
            "out_ptr",
            "out_sum_ptr",
            "host_ptr",
            "err_ptr",
        ],
    )
    def _publish_gather_kernel(
        buf_ptr,
        pub_idx_ptr,
        pub_idx_stride,
        pub_val_ptr,
        pub_val_stride,
        m,
        gat_idx_ptr,
        gat_idx_stride,
        n,
        out_ptr,
        out_sum_ptr,
        host_ptr,
        err_ptr,
        stamp,
        stamp_offset,
        HAS_HOST: tl.constexpr,
        HAS_STAMP: tl.constexpr,
        POISON: tl.constexpr,
        BLOCK: tl.constexpr,
    ):
        # Usual decode batches fit one block (BLOCK >= max(n, m)): each loop below runs
        # once. Larger batches loop inside the same program - still one launch, and the
        # publish-before-gather order needs no grid-wide barrier.
        lanes = tl.arange(0, BLOCK)
        # 1) publish: buf[pub_idx] = pub_val (cast to int64 in registers).
        for start in range(0, m, BLOCK):
            offs = start + lanes
            mask = offs < m
            idx = tl.load(pub_idx_ptr + offs * pub_idx_stride, mask=mask, other=0)
            val = tl.load(pub_val_ptr + offs * pub_val_stride, mask=mask, other=0)
            tl.store(buf_ptr + idx.to(tl.int64), val.to(tl.int64), mask=mask)
        # Publish happens-before gather: every lane's store is visible to every lane.
        tl.debug_barrier()

        # 2) gather + sum (+ host mirror, + consume-once check).
        acc = tl.zeros([BLOCK], dtype=tl.int64)
        for start in range(0, n, BLOCK):
            offs = start + lanes
            mask = offs < n
            idx = tl.load(gat_idx_ptr + offs * gat_idx_stride, mask=mask, other=0).to(tl.int64)
            v = tl.load(buf_ptr + idx, mask=mask, other=0)
            tl.store(out_ptr + offs, v, mask=mask)
            if HAS_HOST:
                tl.store(host_ptr + offs, v, mask=mask)
            acc += v
            if POISON:
                tl.store(err_ptr + offs * 0, idx, mask=mask & (v < 0))
        total = tl.sum(acc, axis=0)
        tl.store(out_sum_ptr, total)
        if HAS_HOST:
            tl.store(host_ptr + n, total)
            if HAS_STAMP:  # says which launch wrote this row; the host reads it only
                # after waiting for the launch to complete (see host_ring.py)
                tl.store(host_ptr + stamp_offset, stamp.to(tl.int64))

        # 3) consume-once poison, after every lane has read (duplicates read the value).
        if POISON:
            tl.debug_barrier()
            for start in range(0, n, BLOCK):
                offs = start + lanes
                mask = offs < n
                idx = tl.load(gat_idx_ptr + offs * gat_idx_stride, mask=mask, other=0)
                tl.store(buf_ptr + idx.to(tl.int64), tl.full([BLOCK], -1, tl.int64), mask=mask)

else:  # pragma: no cover
    _publish_gather_kernel = None


def kernel_args(
    buf,
    gather_indices,
    publish_indices,
    publish_values,
    out,
    out_sum,
    host_out,
    err,
    stamp,
    stamp_offset,
) -> tuple:
    """The kernel's runtime arguments in order, as both launches pass them: Triton's
    normal one (:func:`_launch`) and the direct one (``step_launcher``). An empty input's
    pointer may be null, so one with nothing to read points at ``buf`` (its loop never
    runs; any valid pointer will do), and an absent host row or error flag at ``out``."""
    n = gather_indices.shape[0]
    m = 0 if publish_indices is None else publish_indices.shape[0]
    if not m:
        publish_indices = publish_values = buf
    return (
        buf,
        publish_indices,
        publish_indices.stride(0) if m else 0,
        publish_values,
        publish_values.stride(0) if m else 0,
        m,
        gather_indices if n else buf,
        gather_indices.stride(0) if n else 0,
        n,
        out,
        out_sum,
        out if host_out is None else host_out,
        out if err is None else err,
        0 if stamp is None else stamp,
        stamp_offset,
    )


def _launch(
    buf,
    gather_indices,
    publish_indices,
    publish_values,
    out,
    out_sum,
    host_out,
    err,
    poison,
    stamp=None,
    stamp_offset=0,
):
    """``kernel[grid](...)``: Triton's normal launch path; returns the compiled kernel."""
    return _publish_gather_kernel[(1,)](
        *kernel_args(
            buf,
            gather_indices,
            publish_indices,
            publish_values,
            out,
            out_sum,
            host_out,
            err,
            stamp,
            stamp_offset,
        ),
        HAS_HOST=host_out is not None,
        HAS_STAMP=stamp is not None,
        POISON=bool(poison),
        BLOCK=BLOCK,
        num_warps=NUM_WARPS,
    )


# --------------------------------------------------------------------------- reference


def _reference_impl(
    buf,
    gather_indices,
    publish_indices,
    publish_values,
    out,
    out_sum,
    host_out,
    err,
    poison,
    stamp=None,
    stamp_offset=0,
):
    if publish_indices is not None and publish_indices.shape[0]:
        buf[publish_indices.long()] = publish_values.to(buf.dtype)
    gathered = buf[gather_indices.long()]
    if poison and gathered.numel() and bool((gathered < 0).any()):
        bad = int(gather_indices[(gathered < 0).nonzero()[0, 0]])
        if err is not None:
            err[0] = bad
    out.copy_(gathered)
    out_sum.copy_(gathered.sum().reshape(out_sum.shape))
    if host_out is not None:
        write_host_row(host_out, gathered, out_sum.reshape(()), stamp, stamp_offset)
    if poison and gathered.numel():
        buf[gather_indices.long()] = -1


# --------------------------------------------------------------------------- custom op


@torch.library.custom_op(
    "spec_fused::publish_gather",
    mutates_args=("buf", "out", "out_sum", "host_out", "error_flag"),
)
def _publish_gather_op(
    buf: torch.Tensor,
    gather_indices: torch.Tensor,
    publish_indices: Optional[torch.Tensor],
    publish_values: Optional[torch.Tensor],
    out: torch.Tensor,
    out_sum: torch.Tensor,
    host_out: Optional[torch.Tensor],
    error_flag: Optional[torch.Tensor],
    poison: bool,
) -> None:
    impl = _launch if backend_for(buf.device) != "reference" else _reference_impl
    impl(
        buf,
        gather_indices,
        publish_indices,
        publish_values,
        out,
        out_sum,
        host_out,
        error_flag,
        poison,
    )


@_publish_gather_op.register_fake
def _(
    buf, gather_indices, publish_indices, publish_values, out, out_sum, host_out, error_flag, poison
):
    return None


def _run(
    impl,
    buf,
    gather_indices,
    publish_indices,
    publish_values,
    out,
    out_sum,
    host_out,
    poison,
    validate,
):
    checks.validate(
        buf,
        gather_indices,
        publish_indices,
        publish_values,
        out,
        out_sum,
        host_out,
        deep=validate or poison,
    )
    n = gather_indices.shape[0]
    m = 0 if publish_indices is None else publish_indices.shape[0]
    if out is None:
        out = torch.empty((n,), dtype=buf.dtype, device=buf.device)
    if out_sum is None:
        out_sum = torch.empty((), dtype=torch.int64, device=buf.device)
    if n == 0 and m == 0:  # DP-idle batch: nothing to do, no launch
        out_sum.zero_()
        if host_out is not None:
            host_out[0] = 0
        return PublishGatherResult(out, out_sum.reshape(()))
    flag = None
    if poison:
        flag = torch.full((1,), NO_ERROR, dtype=torch.int64, pin_memory=buf.device.type == "cuda")
        if buf.device.type != "cuda":
            flag = flag.to(buf.device)
    impl(
        buf,
        gather_indices,
        publish_indices if m else None,
        publish_values if m else None,
        out,
        out_sum,
        host_out,
        flag,
        poison,
    )
    result = PublishGatherResult(out, out_sum.reshape(()), flag)
    if flag is not None and flag.device.type == "cpu" and buf.device.type == "cpu":
        result.raise_if_poisoned()  # free on CPU: raise at once, naming the slot
    return result


def publish_gather(
    buf,
    gather_indices,
    publish_indices=None,
    publish_values=None,
    *,
    out=None,
    out_sum=None,
    host_out=None,
    poison=False,
    validate=False,
):
    """``buf[publish_indices] = publish_values``, then ``seq_lens = buf[gather_indices]``
    and ``seq_lens_sum = seq_lens.sum()`` (and ``host_out = [*seq_lens, sum]``): one launch.

    Bad input raises ``TypeError``/``ValueError`` naming the argument before anything is
    written. Range and duplicate-slot checks run always on CPU, and on GPU under
    ``poison=True`` or ``validate=True`` (they cost a device sync there). ``poison=True``
    is SGLang's consume-once debug check: gathered rows become -1, and gathering a negative
    row raises :class:`PoisonedSlotError` (at once on CPU; on GPU via
    ``result.raise_if_poisoned()`` after a sync)."""
    return _run(
        lambda *a: _publish_gather_op(*a),
        buf,
        gather_indices,
        publish_indices,
        publish_values,
        out,
        out_sum,
        host_out,
        poison,
        validate,
    )


def publish_gather_reference(
    buf,
    gather_indices,
    publish_indices=None,
    publish_values=None,
    *,
    out=None,
    out_sum=None,
    host_out=None,
    poison=False,
    validate=False,
):
    """Plain-torch twin of :func:`publish_gather`: same arguments, checks and results."""
    return _run(
        _reference_impl,
        buf,
        gather_indices,
        publish_indices,
        publish_values,
        out,
        out_sum,
        host_out,
        poison,
        validate,
    )
