"""One launch for the FutureMap relay: publish step N's lengths, gather step N+1's, sum them.

Why fused: per decode step upstream spends a cast and scatter at publish, an event, a
gather, and where host lengths are read a D2H copy of the *whole* pool, a blocking
synchronize and a host index and sum, for ``m + n`` values. One program scatters, then
(``tl.debug_barrier``) gathers and sums into one device row ``[*lens, sum]``: where the
host needs the lengths, one copy of those ``n + 1`` values brings them over. The kernel
touches device memory only: the zero-copy host loads and stores it once made put that
step at 30-32 µs of device time on an H100, against 5.3 µs for its GPU-only step, and
Confidential Computing forbids them. Laid out as SGLang's
``gather_spec_extras``: the kernel, its one-call wrapper, a torch reference, the custom op.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import NamedTuple, Optional

import torch

from spec_fused.kernels import checks
from spec_fused.kernels.backend import backend_for
from spec_fused.kernels.checks import NO_ERROR, raise_if_flagged

try:  # Triton is optional: without it every device gets the reference.
    import triton
    import triton.language as tl
except Exception:  # pragma: no cover - exercised by the fallback-ladder tests
    triton = None
    tl = None

__all__ = ["BLOCK", "Args", "PublishGatherResult", "publish_gather", "publish_gather_reference"]

# A batch above BLOCK loops in the same launch; one BLOCK keeps specializations few.
BLOCK = 1024


@dataclass
class PublishGatherResult:
    seq_lens: torch.Tensor  # (n,) buf.dtype on buf.device
    seq_lens_sum: torch.Tensor  # 0-d int64 on buf.device
    error_flag: Optional[torch.Tensor] = None  # the consume-once check's flag (poison only)

    def raise_if_poisoned(self) -> None:  # on GPU, after a sync
        raise_if_flagged(self.error_flag)


class Args(NamedTuple):
    """One launch, as both implementations take it. With ``row`` the sum is stored at
    ``out[n]``: the row ``[*lens, sum]`` that one copy brings to the host."""

    buf: torch.Tensor
    gather_indices: torch.Tensor
    publish_indices: Optional[torch.Tensor]
    publish_values: Optional[torch.Tensor]
    out: torch.Tensor
    out_sum: torch.Tensor
    error_flag: Optional[torch.Tensor] = None
    poison: bool = False
    row: bool = False  # the sum goes to out[n]: one row [*lens, sum] (out_sum unused)


# Integers that change every step and pointers into the caller's tensors must not pick
# the compiled specialization: the pointers' dtypes and the constexprs alone do.
_VARYING = ["m", "n"]
_PTRS = "pub_idx_ptr pub_val_ptr gat_idx_ptr out_ptr out_sum_ptr err_ptr".split()

if triton is not None:

    @triton.jit(do_not_specialize=_VARYING, do_not_specialize_on_alignment=_PTRS)
    def _publish_gather_kernel(
        buf_ptr,
        pub_idx_ptr,
        pub_val_ptr,
        m,
        gat_idx_ptr,
        n,
        out_ptr,
        out_sum_ptr,
        err_ptr,
        POISON: tl.constexpr,
        ROW: tl.constexpr,
        BLOCK: tl.constexpr,
    ):
        lanes = tl.arange(0, BLOCK)
        # 1) publish: buf[pub_idx] = pub_val (cast to int64 in registers).
        for start in range(0, m, BLOCK):
            offs = start + lanes
            mask = offs < m
            idx = tl.load(pub_idx_ptr + offs, mask=mask, other=0)
            val = tl.load(pub_val_ptr + offs, mask=mask, other=0)
            tl.store(buf_ptr + idx.to(tl.int64), val.to(tl.int64), mask=mask)
        # Publish happens-before gather: every lane's store is visible to every lane.
        tl.debug_barrier()

        # 2) gather + sum (+ consume-once check).
        acc = tl.zeros([BLOCK], dtype=tl.int64)
        for start in range(0, n, BLOCK):
            offs = start + lanes
            mask = offs < n
            idx = tl.load(gat_idx_ptr + offs, mask=mask, other=0).to(tl.int64)
            v = tl.load(buf_ptr + idx, mask=mask, other=0)
            tl.store(out_ptr + offs, v, mask=mask)
            acc += v
            if POISON:
                tl.store(err_ptr + offs * 0, idx, mask=mask & (v < 0))
        if ROW:  # [*lens, sum]: one row for one copy to the host
            tl.store(out_ptr + n, tl.sum(acc, axis=0))
        else:
            tl.store(out_sum_ptr, tl.sum(acc, axis=0))

        # 3) consume-once poison, after every lane has read (duplicates read the value).
        if POISON:
            tl.debug_barrier()
            for start in range(0, n, BLOCK):
                offs = start + lanes
                mask = offs < n
                idx = tl.load(gat_idx_ptr + offs, mask=mask, other=0)
                tl.store(buf_ptr + idx.to(tl.int64), tl.full([BLOCK], -1, tl.int64), mask=mask)

else:  # pragma: no cover
    _publish_gather_kernel = None


def kernel_args(a: Args) -> tuple:
    """The kernel's arguments in order (constexprs last), for the normal launch and the
    direct one. An input with nothing to read points at ``buf`` (its loop never runs), an
    absent error flag at ``out``: the interpreter needs a tensor behind each."""
    n, pi = a.gather_indices.shape[0], a.publish_indices
    m = 0 if pi is None else pi.shape[0]
    return (
        *((a.buf, pi, a.publish_values, m) if m else (a.buf, a.buf, a.buf, 0)),
        a.gather_indices if n else a.buf,
        n,
        a.out,
        a.out_sum,
        a.out if a.error_flag is None else a.error_flag,
        bool(a.poison),  # POISON
        bool(a.row),  # ROW
        BLOCK,
    )


def launch_triton(a: Args):
    """``kernel[grid](...)``: Triton's normal launch; returns the compiled kernel."""
    return _publish_gather_kernel[(1,)](*kernel_args(a), num_warps=4)


def launch_reference(a: Args) -> None:
    """The kernel's semantics in plain torch."""
    buf, pi, pv = a.buf, a.publish_indices, a.publish_values
    if pi is not None and pv is not None and pi.shape[0]:
        buf[pi.long()] = pv.to(buf.dtype)
    gathered = buf[a.gather_indices.long()]
    if a.poison and a.error_flag is not None and bool((gathered < 0).any()):
        a.error_flag[0] = int(a.gather_indices[(gathered < 0).nonzero()[0, 0]])
    n = gathered.shape[0]
    a.out[:n].copy_(gathered)
    total = gathered.sum()
    if a.row:
        a.out[n] = total
    else:
        a.out_sum.copy_(total.reshape(a.out_sum.shape))
    if a.poison and gathered.numel():
        buf[a.gather_indices.long()] = -1


@torch.library.custom_op(
    "spec_fused::publish_gather",
    mutates_args=("buf", "out", "out_sum", "error_flag"),
)
def _publish_gather_op(
    buf: torch.Tensor,
    gather_indices: torch.Tensor,
    publish_indices: Optional[torch.Tensor],
    publish_values: Optional[torch.Tensor],
    out: torch.Tensor,
    out_sum: torch.Tensor,
    error_flag: Optional[torch.Tensor],
    poison: bool,
) -> None:
    a = Args(buf, gather_indices, publish_indices, publish_values, out, out_sum)
    launch = launch_reference if backend_for(buf.device) == "reference" else launch_triton
    launch(a._replace(error_flag=error_flag, poison=poison))


_publish_gather_op.register_fake(lambda *args: None)


_OPTIONS = frozenset(("out", "out_sum", "poison", "validate"))


def _run(impl, buf, gather_indices, publish_indices=None, publish_values=None, **options):
    if not options.keys() <= _OPTIONS:
        raise TypeError(
            f"publish_gather got unexpected options {sorted(options.keys() - _OPTIONS)}"
        )
    out, out_sum = options.get("out"), options.get("out_sum")
    poison = bool(options.get("poison"))
    deep = poison or bool(options.get("validate"))
    checks.validate(buf, gather_indices, publish_indices, publish_values, out, out_sum, deep=deep)
    n = gather_indices.shape[0]
    m = 0 if publish_indices is None else publish_indices.shape[0]
    gather_indices = gather_indices.contiguous()  # the kernel reads every input unstrided
    pi, pv = (publish_indices.contiguous(), publish_values.contiguous()) if m else (None, None)
    out = buf.new_empty((n,)) if out is None else out
    out_sum = buf.new_empty(()) if out_sum is None else out_sum
    if n == 0 and m == 0:  # DP-idle batch: nothing to do, no launch
        out_sum.zero_()
        return PublishGatherResult(out, out_sum.reshape(()))
    flag = None  # the consume-once flag, on the device (debug mode reads it with a sync)
    if poison:
        flag = torch.full((1,), NO_ERROR, dtype=torch.int64, device=buf.device)
    impl(buf, gather_indices, pi, pv, out, out_sum, flag, poison)
    result = PublishGatherResult(out, out_sum.reshape(()), flag)
    if flag is not None and buf.device.type == "cpu":
        result.raise_if_poisoned()  # free on CPU: raise at once, naming the slot
    return result


def publish_gather(buf, gather_indices, publish_indices=None, publish_values=None, **options):
    """``buf[publish_indices] = publish_values``, then ``seq_lens = buf[gather_indices]``
    and ``seq_lens_sum = seq_lens.sum()``: one launch.

    ``options``: ``out``, ``out_sum``, ``poison`` (SGLang's
    consume-once check: gathered rows become -1; gathering one raises PoisonedSlotError, on
    GPU from ``result.raise_if_poisoned()`` after a sync), ``validate``. Bad input raises
    TypeError/ValueError naming the argument before anything is written; range and
    duplicate checks run on CPU always, on GPU under ``poison``/``validate`` (a sync)."""
    return _run(_publish_gather_op, buf, gather_indices, publish_indices, publish_values, **options)


# The plain-torch twin of publish_gather: same arguments, checks and results.
publish_gather_reference = partial(_run, lambda *args: launch_reference(Args(*args)))
