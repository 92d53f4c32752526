"""One launch for the FutureMap relay: publish step N's lengths, gather step N+1's, sum them.

Why fused: upstream SGLang spends a scatter (plus a dtype cast), an event, a gather, a
D2H copy of the *whole* ``new_seq_lens_buf`` pool, a blocking synchronize and a host
index + sum on every speculative decode step (``FutureMap.publish`` and
``FutureMap.resolve_seq_lens_cpu``). All of it touches at most ``m + n`` int64 values, so
the cost is pure launch and sync overhead. This module does the scatter, the gather, the
sum and (optionally) the host mirror in ONE Triton program: the publish happens-before the
gather inside the launch (``tl.debug_barrier``), the sum is a register reduction, and the
host mirror is ``n + 1`` values stored straight into pinned memory by the same program.

Layout follows SGLang's ``gather_spec_extras``: one kernel, one wrapper, a torch reference
with the same semantics, and a stateful :class:`PublishGather` that owns preallocated
outputs so the launch allocates nothing and can be captured in a CUDA graph.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional

import torch

try:  # Triton is optional: without it every device gets the reference.
    import triton
    import triton.language as tl
except Exception:  # pragma: no cover - exercised by the fallback-ladder tests
    triton = None
    tl = None

__all__ = [
    "BACKENDS",
    "InputError",
    "InputTypeError",
    "PublishGather",
    "StaleHostMirrorError",
    "PublishGatherResult",
    "PoisonedSlotError",
    "backend_for",
    "explain_backend",
    "explain_relay_backend",
    "prewarm",
    "publish_gather",
    "publish_gather_reference",
]

# One program, one block shape: a decode batch up to BLOCK lengths takes one loop
# iteration; larger ones loop inside the same program, which is still one launch. A single
# BLOCK keeps the compiled variants few, so none is compiled while serving.
BLOCK = 1024
NUM_WARPS = 4
# Marker the kernel leaves in the error flag when nothing went wrong.
_NO_ERROR = -1


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


class StaleHostMirrorError(RuntimeError):
    """The host mirror holds another launch's lengths than the one being read.

    ``cause`` says which check tripped ("stale", "stale after waiting", "torn"): the
    message carries step numbers, the cause does not, so logs can key on it."""

    def __init__(self, message: str, cause: str):
        super().__init__(message)
        self.cause = cause


@dataclass
class PublishGatherResult:
    seq_lens: torch.Tensor  # (n,) buf.dtype on buf.device
    seq_lens_sum: torch.Tensor  # 0-d int64 on buf.device
    # Sticky error flag the poison check writes (slot index, or -1): None unless poison.
    error_flag: Optional[torch.Tensor] = None
    # PublishGather only: the host ring row [*lens, sum, ..., stamp], its expected stamp
    # and the batch size.
    host: Optional[torch.Tensor] = None
    stamp: Optional[int] = None
    n: int = 0

    def raise_if_poisoned(self) -> None:
        """Raise :class:`PoisonedSlotError` if the consume-once check tripped.

        Reads the flag without a device sync when it lives in host memory (CPU, or a
        pinned zero-copy flag on CUDA); call it after the stream has been synchronized."""
        _raise_if_flagged(self.error_flag)


def _raise_if_flagged(flag: Optional[torch.Tensor]) -> None:
    if flag is None:
        return
    slot = int(flag[0])
    if slot != _NO_ERROR:
        flag[0] = _NO_ERROR
        raise PoisonedSlotError(slot)


# --------------------------------------------------------------------------- kernel

if triton is not None:

    # Nothing but the pointers' dtypes and the constexprs may pick the compiled variant:
    # lengths and the stamp change every step (specializing on them would recompile),
    # and the caller's index/value tensors may be views at any offset. So every integer
    # is excluded from value specialization and every pointer but the relay buffer from
    # alignment specialization, which is what lets PublishGather bind one compiled
    # variant per dtype combination and launch it directly (kernels/launcher.py).
    @triton.jit(
        do_not_specialize=["pub_idx_stride", "pub_val_stride", "m", "gat_idx_stride", "n",
                           "stamp", "stamp_offset"],
        do_not_specialize_on_alignment=["pub_idx_ptr", "pub_val_ptr", "gat_idx_ptr",
                                        "out_ptr", "out_sum_ptr", "host_ptr", "err_ptr"],
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
            if HAS_STAMP:  # last store: says which launch wrote this host mirror
                tl.store(host_ptr + stamp_offset, stamp.to(tl.int64))

        # 3) consume-once poison, after every lane has read (duplicates read the value).
        if POISON:
            tl.debug_barrier()
            for start in range(0, n, BLOCK):
                offs = start + lanes
                mask = offs < n
                idx = tl.load(gat_idx_ptr + offs * gat_idx_stride, mask=mask, other=0)
                tl.store(buf_ptr + idx.to(tl.int64), tl.full([BLOCK], -1, tl.int64), mask=mask)

    _IS_INTERPRETED = type(_publish_gather_kernel).__name__ == "InterpretedFunction"
else:  # pragma: no cover
    _publish_gather_kernel = None
    _IS_INTERPRETED = False


def explain_backend(device) -> tuple[str, str]:
    """``(backend, why)`` for ``device``: what :func:`backend_for` picks, and the reason."""
    device = torch.device(device)
    if os.environ.get("SPEC_FUSED_FORCE_REFERENCE") == "1":
        return "reference", "SPEC_FUSED_FORCE_REFERENCE=1"
    if _publish_gather_kernel is None:
        return "reference", "no Triton (import failed): plain-torch reference"
    if _IS_INTERPRETED:
        if device.type == "cpu":
            return "interpreter", "TRITON_INTERPRET=1 (set before Triton was imported)"
        return "reference", "TRITON_INTERPRET=1 runs CPU tensors only: plain-torch reference"
    if device.type == "cuda":
        return "triton", "Triton compiled"
    if device.type == "cpu":
        return "reference", "Triton compiles for GPUs; TRITON_INTERPRET=1 would interpret on CPU"
    return "reference", f"Triton cannot drive {device.type} here: plain-torch reference"


ENV_FORCE_BACKEND = "SPEC_FUSED_FORCE_BACKEND"
ENV_BENCH = "SPEC_FUSED_BENCH"


def explain_relay_backend(device) -> tuple[str, str]:
    """``(backend, why)`` the relay's launcher uses on ``device``: :func:`explain_backend`,
    or ``"null"`` under ``SPEC_FUSED_FORCE_BACKEND=null`` together with
    ``SPEC_FUSED_BENCH=1`` - the measurement seam that runs the relay's whole host path
    with no device work. ``null`` is never picked otherwise, and never by a fallback."""
    forced = os.environ.get(ENV_FORCE_BACKEND, "")
    backend, why = explain_backend(device)
    if not forced:
        return backend, why
    if forced != "null":
        return backend, f"{why} ({ENV_FORCE_BACKEND}={forced!r} ignored: only 'null' is known)"
    if os.environ.get(ENV_BENCH) != "1":
        return backend, f"{why} ({ENV_FORCE_BACKEND}=null ignored: it needs {ENV_BENCH}=1)"
    return "null", f"{ENV_FORCE_BACKEND}=null with {ENV_BENCH}=1: no device work, " \
                   f"results unspecified (benchmarks only)"


def backend_for(device) -> str:
    """Which implementation ``publish_gather`` uses on ``device``.

    ``"triton"`` (compiled, CUDA/ROCm), ``"interpreter"`` (CPU tensors under
    ``TRITON_INTERPRET=1`` set before Triton was imported) or ``"reference"`` (plain torch:
    no Triton, or a device Triton cannot drive here, e.g. MPS, NPU, XPU, or CPU without the
    interpreter). ``SPEC_FUSED_FORCE_REFERENCE=1`` forces the reference everywhere."""
    return explain_backend(device)[0]


def _launch(buf, gather_indices, publish_indices, publish_values, out, out_sum, host_out,
            err, poison, stamp=None, stamp_offset=0):
    """``kernel[grid](...)``: Triton's normal launch path; returns the compiled kernel."""
    n = gather_indices.shape[0]
    m = 0 if publish_indices is None else publish_indices.shape[0]
    if m == 0:  # any valid pointer will do; the masks keep it untouched
        publish_indices = publish_values = gather_indices
    return _publish_gather_kernel[(1,)](
        buf,
        publish_indices,
        publish_indices.stride(0) if m else 0,
        publish_values,
        publish_values.stride(0) if m else 0,
        m,
        gather_indices,
        gather_indices.stride(0),
        n,
        out,
        out_sum,
        host_out if host_out is not None else out,
        err if err is not None else out,
        0 if stamp is None else stamp,
        stamp_offset,
        HAS_HOST=host_out is not None,
        HAS_STAMP=stamp is not None,
        POISON=bool(poison),
        BLOCK=BLOCK,
        num_warps=NUM_WARPS,
    )


# --------------------------------------------------------------------------- reference


def _reference_impl(buf, gather_indices, publish_indices, publish_values, out, out_sum,
                    host_out, err, poison, stamp=None, stamp_offset=0):
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
        _write_host_row(host_out, gathered, out_sum.reshape(()), stamp, stamp_offset)
    if poison and gathered.numel():
        buf[gather_indices.long()] = -1


# --------------------------------------------------------------------------- validation

_INDEX_DTYPES = (torch.int32, torch.int64)


def _is_integer(t: torch.Tensor) -> bool:
    return not t.dtype.is_floating_point and not t.dtype.is_complex and t.dtype != torch.bool


def _check_1d(name, t):
    if not isinstance(t, torch.Tensor):
        raise InputTypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != 1:
        raise InputError(f"{name} must be 1-D, got shape {tuple(t.shape)}")


def _validate(buf, gather_indices, publish_indices, publish_values, out, out_sum, host_out,
              deep: bool):
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
    if gather_indices.dtype not in _INDEX_DTYPES:
        raise InputTypeError(f"gather_indices must be int32 or int64, got {gather_indices.dtype}")
    if gather_indices.device != buf.device and not _zero_copy_ok(gather_indices, buf):
        raise InputError(
            f"gather_indices is on {gather_indices.device}, buf on {buf.device} (on CUDA, "
            f"pinned host indices are read zero-copy)")
    if (publish_indices is None) != (publish_values is None):
        raise InputError("publish_indices and publish_values must be given together")
    if publish_indices is not None:
        _check_1d("publish_indices", publish_indices)
        _check_1d("publish_values", publish_values)
        if publish_indices.dtype not in _INDEX_DTYPES:
            raise InputTypeError(
                f"publish_indices must be int32 or int64, got {publish_indices.dtype}")
        if not _is_integer(publish_values):
            raise InputTypeError(f"publish_values must be an integer tensor, got {publish_values.dtype}")
        for name, t in (("publish_indices", publish_indices), ("publish_values", publish_values)):
            if t.device != buf.device:
                raise InputError(f"{name} is on {t.device}, buf on {buf.device}")
        if publish_indices.shape[0] != publish_values.shape[0]:
            raise InputError(
                f"publish_indices has {publish_indices.shape[0]} entries but publish_values "
                f"has {publish_values.shape[0]}")
    n = gather_indices.shape[0]
    if out is not None:
        _check_1d("out", out)
        if out.shape[0] != n or out.dtype != buf.dtype or out.device != buf.device:
            raise InputError(
                f"out must be ({n},) {buf.dtype} on {buf.device}, got {tuple(out.shape)} "
                f"{out.dtype} on {out.device}")
        if not out.is_contiguous():
            raise InputError("out must be contiguous")
    if out_sum is not None:
        if not isinstance(out_sum, torch.Tensor):
            raise InputTypeError("out_sum must be a torch.Tensor")
        if out_sum.numel() != 1 or out_sum.dim() > 1 or out_sum.dtype != torch.int64 \
                or out_sum.device != buf.device:
            raise InputError(
                f"out_sum must be a 0-d or (1,) int64 tensor on {buf.device}, got "
                f"{tuple(out_sum.shape)} {out_sum.dtype} on {out_sum.device}")
    if host_out is not None:
        _check_1d("host_out", host_out)
        if host_out.shape[0] != n + 1 or host_out.dtype != torch.int64 \
                or host_out.device.type != "cpu" or not host_out.is_contiguous():
            raise InputError(
                f"host_out must be a contiguous ({n + 1},) int64 CPU tensor (lens then sum), "
                f"got {tuple(host_out.shape)} {host_out.dtype} on {host_out.device}")
        if buf.device.type == "cuda" and not host_out.is_pinned():
            raise InputError("host_out must be pinned memory when buf is on CUDA")
    if deep:
        pool = buf.shape[0]
        _check_range("gather_indices", gather_indices, pool)
        if publish_indices is not None and publish_indices.shape[0]:
            _check_range("publish_indices", publish_indices, pool)
            if torch.unique(publish_indices).shape[0] != publish_indices.shape[0]:
                vals, counts = torch.unique(publish_indices, return_counts=True)
                dup = int(vals[counts > 1][0])
                raise InputError(f"publish_indices has duplicate slot {dup}")


def _zero_copy_ok(t: torch.Tensor, buf: torch.Tensor) -> bool:
    """A pinned host tensor the kernel can read over the bus, beside a CUDA buffer."""
    return buf.device.type == "cuda" and t.device.type == "cpu" and t.is_pinned()


def _check_range(name, idx, pool):
    if idx.numel() == 0:
        return
    lo, hi = int(idx.min()), int(idx.max())
    if lo < 0 or hi >= pool:
        bad = lo if lo < 0 else hi
        raise InputError(f"{name} has slot {bad} outside the pool [0, {pool})")


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
    impl(buf, gather_indices, publish_indices, publish_values, out, out_sum, host_out,
         error_flag, poison)


@_publish_gather_op.register_fake
def _(buf, gather_indices, publish_indices, publish_values, out, out_sum, host_out,
      error_flag, poison):
    return None


def _run(impl, buf, gather_indices, publish_indices, publish_values, out, out_sum, host_out,
         poison, validate):
    _validate(buf, gather_indices, publish_indices, publish_values, out, out_sum, host_out,
              deep=validate or poison)
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
        flag = torch.full((1,), _NO_ERROR, dtype=torch.int64,
                          pin_memory=buf.device.type == "cuda")
        if buf.device.type != "cuda":
            flag = flag.to(buf.device)
    impl(buf, gather_indices, publish_indices if m else None, publish_values if m else None,
         out, out_sum, host_out, flag, poison)
    result = PublishGatherResult(out, out_sum.reshape(()), flag)
    if poison and flag.device.type == "cpu" and buf.device.type == "cpu":
        result.raise_if_poisoned()  # free on CPU: raise at once, naming the slot
    return result


def publish_gather(buf, gather_indices, publish_indices=None, publish_values=None, *,
                   out=None, out_sum=None, host_out=None, poison=False, validate=False):
    """``buf[publish_indices] = publish_values``, then ``seq_lens = buf[gather_indices]``
    and ``seq_lens_sum = seq_lens.sum()`` (and ``host_out = [*seq_lens, sum]``): one launch.

    Bad input raises ``TypeError``/``ValueError`` naming the argument before anything is
    written. Range and duplicate-slot checks run always on CPU, and on GPU under
    ``poison=True`` or ``validate=True`` (they cost a device sync there). ``poison=True``
    is SGLang's consume-once debug check: gathered rows become -1, and gathering a negative
    row raises :class:`PoisonedSlotError` (at once on CPU; on GPU via
    ``result.raise_if_poisoned()`` after a sync)."""
    return _run(lambda *a: _publish_gather_op(*a), buf, gather_indices, publish_indices,
                publish_values, out, out_sum, host_out, poison, validate)


def publish_gather_reference(buf, gather_indices, publish_indices=None, publish_values=None,
                             *, out=None, out_sum=None, host_out=None, poison=False,
                             validate=False):
    """Plain-torch twin of :func:`publish_gather`: same arguments, checks and results."""
    return _run(_reference_impl, buf, gather_indices, publish_indices, publish_values, out,
                out_sum, host_out, poison, validate)


# --------------------------------------------------------------------------- stateful launcher

_UNSEEN = object()
# What the bound path accepts without the full check; anything else takes it.
_LEAN_INDEX = (torch.int32, torch.int64)
# Launcher backends: the three of backend_for, plus "null" (SPEC_FUSED_FORCE_BACKEND=null
# with SPEC_FUSED_BENCH=1): the whole host path and no device work, to price the wrapper.
BACKENDS = ("triton", "interpreter", "reference", "null")


class PublishGather:
    """The relay's launcher: bound once to one relay buffer, one step per call.

    Two entry points. :meth:`launch` is the per-step path the relay takes in release
    mode: an O(1) guard (each input 1-D, on the buffer's device, an index/value dtype
    combination this launcher has already accepted once) and then the launch - for
    compiled Triton straight through the bound compiled kernel (``kernels/launcher.py``),
    skipping ``JITFunction.run``. Anything the guard does not recognise takes
    :meth:`launch_checked`, which runs the full ``_validate`` (clear errors, before
    anything is written), and, if the input is good, launches it the normal way and
    remembers the combination. Debug mode (``validate``/``poison``) always takes the
    checked path. :meth:`__call__` is the checked path packaged as a
    :class:`PublishGatherResult`, for tests and callers that want one object back.

    The caller owns ``out``: the relay allocates each step's ``(n,)`` result itself,
    because ``batch.seq_lens`` escapes into SGLang's batch, snapshots and worker state
    (see ``FusedRelay``). ``out_sum`` is the launcher's own scalar, never handed out.

    The host mirror is double-buffered and stamped: launch ``k`` writes ``[*lens, sum]``
    and, last, the stamp ``k`` (at a fixed place, the row's end) into ring row ``k % 2``
    (pinned, zero-copy on CUDA), so the launch for step ``k + 1`` never overwrites the row
    the host is still reading, and :meth:`read_row` refuses (debug) or waits for (release)
    a row whose stamp is not the one it expects: it never returns an older step's
    lengths. Stamps wrap at 2**30 so Triton keeps typing them int32."""

    RING = 2
    STAMP_MASK = (1 << 30) - 1

    def __init__(self, buf: torch.Tensor, *, max_batch: Optional[int] = None,
                 static_out: bool = False, poison: bool = False, validate: bool = False,
                 debug: bool = False, backend: Optional[str] = None):
        _validate(buf, buf[:0].long(), None, None, None, None, None, deep=False)
        self.buf = buf
        self.max_batch = int(buf.shape[0] if max_batch is None else max_batch)
        self.poison = poison
        self.validate = validate
        self.debug = debug
        self._on_cuda = buf.device.type == "cuda"
        self._on_cpu = buf.device.type == "cpu"
        self._device_index = buf.get_device()  # -1 on CPU, as Tensor.get_device() says
        self._static_out = (torch.empty((self.max_batch,), dtype=buf.dtype, device=buf.device)
                            if static_out else None)
        self.out_sum = torch.zeros((), dtype=torch.int64, device=buf.device)
        self._host_ring: Optional[torch.Tensor] = None
        self._ring_np = None
        self._stamp_offset = 0
        self._flag = None
        if poison:
            self._flag = torch.full((1,), _NO_ERROR, dtype=torch.int64, pin_memory=self._on_cuda)
            if not self._on_cuda:
                self._flag = self._flag.to(buf.device)
        # An empty result whose pointer is valid (an empty tensor's may be null) and does
        # not alias the buffer: what a publish-only launch writes its nothing into.
        self.empty_out = torch.empty((1,), dtype=torch.int64, device=buf.device)[:0]
        self._new = self.out_sum.new_empty  # int64 on buf's device, no kwargs to parse
        self.stamp = 0  # the last launch's host-mirror stamp (read_row's key)
        self.staged: Optional[torch.Tensor] = None  # trusted pinned gather indices
        self._staging: Optional[torch.Tensor] = None
        self.step = 0
        self.launches = 0  # device launches made (kernel or reference), for counters/tests
        self._variants: dict = {}
        self._fast = None
        self.backend = backend or backend_for(buf.device)

    # ------------------------------------------------------------------ binding

    @property
    def backend(self) -> str:
        return self._backend

    @backend.setter
    def backend(self, name: str) -> None:
        """Bind the per-step implementation once (no dispatch per step)."""
        if name not in BACKENDS:
            raise ValueError(f"unknown backend {name!r}; one of {BACKENDS}")
        self._backend = name
        self._variants = {}
        self._last_dtypes = self._last_host = self._last_bound = None
        self._fast = None
        if name == "triton" and self._on_cuda:
            from spec_fused.kernels.launcher import FastLaunch

            self._fast = FastLaunch(self._device_index, _publish_gather_kernel)
        self._null = name == "null"
        self._impl = _reference_impl if name == "reference" else _launch
        self.launch = self._launch_reference if name == "reference" else self._launch_kernel

    def rebind(self, buf: torch.Tensor) -> None:
        """A new relay buffer (FutureMap adopted a captured graph's): same launcher."""
        _validate(buf, buf[:0].long(), None, None, None, None, None, deep=False)
        self.buf = buf
        self.backend = self._backend  # bound kernels keyed on the old buffer go

    def ensure_host_ring(self) -> None:
        """Allocate the stamped host ring (pinned on CUDA) now, e.g. before graph capture."""
        if self._host_ring is None:
            width = self.max_batch + 2 + (self.max_batch % 2)  # even: 16-byte aligned rows
            self._host_ring = torch.full((self.RING, width), -1, dtype=torch.int64,
                                         pin_memory=self._on_cuda)
            self._ring_np = self._host_ring.numpy()
            self._stamp_offset = width - 1

    def stage_host_indices(self, host: torch.Tensor) -> torch.Tensor:
        """``host`` (CPU indices) copied into a pinned buffer the kernel reads zero-copy;
        the view returned is trusted by :meth:`launch` as gather indices. Only call it
        once the previous launch that read the staging buffer has completed."""
        n = host.shape[0]
        if self._staging is None or self._staging.shape[0] < n:
            self._staging = torch.empty((max(n, self.max_batch),), dtype=torch.int64,
                                        pin_memory=self._on_cuda)
        view = self._staging[:n]
        view.copy_(host)
        self.staged = view
        return view

    # ------------------------------------------------------------------ per step

    def _row(self, stamp: int):
        return self._host_ring[stamp & 1]

    def _variant(self, gi, pi, pv, host: bool):
        """The O(1) guard: the bound variant for these inputs, or ``_UNSEEN``.

        Accepted: each input 1-D and on the buffer's device (gather indices may also be
        the launcher's own staged pinned copy), values as long as indices, and a dtype
        combination that :meth:`launch_checked` has already accepted once - which is
        also where anything else goes, for its clear error. The steady state (the same
        dtypes every step) is one tuple compare, not a dict lookup."""
        if self._on_cpu:  # get_device() says -1 for CPU and meta alike
            on_device = gi.is_cpu and (pi is None or (pi.is_cpu and pv.is_cpu))
        else:
            dev = self._device_index
            on_device = (gi.get_device() == dev or gi is self.staged) and \
                (pi is None or (pi.get_device() == dev and pv.get_device() == dev))
        if pi is None:
            if not (on_device and gi.dim() == 1):
                return _UNSEEN
            return self._variants.get((gi.dtype, host), _UNSEEN)
        if not (on_device and gi.dim() == 1 and pi.dim() == 1 and pv.dim() == 1
                and pv.numel() == pi.numel()):
            return _UNSEEN
        dtypes = gi.dtype, pi.dtype, pv.dtype
        if dtypes == self._last_dtypes and host is self._last_host:
            return self._last_bound
        bound = self._variants.get((*dtypes, host), _UNSEEN)
        if bound is not _UNSEEN:
            self._last_dtypes, self._last_host, self._last_bound = dtypes, host, bound
        return bound

    def _launch_kernel(self, gi, pi, pv, host: bool) -> torch.Tensor:
        """Release-mode step on the Triton kernel (compiled or interpreted), or on the
        null backend (the same path; ``_run_impl`` leaves the launch out). Returns the
        lengths."""
        bound = self._variant(gi, pi, pv, host)
        n = gi.numel()
        if bound is _UNSEEN or (host and n > self.max_batch):
            return self.launch_checked(gi, pi, pv, host)
        m = 0 if pi is None else pi.numel()
        if not (n or m):  # DP-idle: nothing to launch
            return self.empty_out
        out = self._new(n) if n else self.empty_out
        stamp = self.stamp = self.step & self.STAMP_MASK
        self.step += 1
        fast = self._fast  # None for the null backend: _run_impl leaves the launch out
        if bound is not None and fast.ready():
            # An empty tensor's pointer may be null; for a loop that never runs any valid
            # pointer will do (the launcher only passes the address).
            if m:
                pi_stride, pv_stride = pi.stride(0), pv.stride(0)
            else:
                pi = pv = self.buf
                pi_stride = pv_stride = 0
            gi_stride = gi.stride(0) if n else 0
            row = self._host_ring[stamp & 1] if host else out
            self.launches += 1
            bound.run(1, 1, 1, fast.raw_stream(self._device_index), bound.function,
                      bound.metadata, None, None, None,
                      self.buf, pi, pi_stride, pv, pv_stride, m, gi if n else self.buf,
                      gi_stride, n, out, self.out_sum, row,
                      self._flag if self.poison else out, stamp, self._stamp_offset,
                      host, host, self.poison, BLOCK)
            return out
        self._run_impl(gi, pi if m else None, pv if m else None, out, host, stamp)
        return out

    def _launch_reference(self, gi, pi, pv, host: bool) -> torch.Tensor:
        """Release-mode step in plain torch: the ops upstream's own relay makes, behind
        the same O(1) guard as the kernel's."""
        if self._variant(gi, pi, pv, host) is _UNSEEN or (host and gi.numel() > self.max_batch):
            return self.launch_checked(gi, pi, pv, host)
        buf = self.buf
        if pi is not None and pi.numel():
            if pv.dtype == torch.int64 and pi.dtype == torch.int64:
                buf.index_copy_(0, pi, pv)
            else:
                buf[pi] = pv.to(torch.int64)
        if gi is self.staged and self._on_cuda:  # pinned host indices: index moves over
            gi = gi.to(buf.device, non_blocking=True)
        out = buf.index_select(0, gi)
        self.launches += 1
        stamp = self.stamp = self.step & self.STAMP_MASK
        self.step += 1
        if host:
            torch.sum(out, 0, out=self.out_sum)
            if self._on_cuda:  # the kernel's host mirror (on CPU the sum is all it needs)
                _write_host_row(self._host_ring[stamp & 1], out, self.out_sum, stamp,
                                self._stamp_offset)
        return out

    def launch_checked(self, gi, pi, pv, host: bool, out=None) -> torch.Tensor:
        """The full check (clear errors before anything is written), then one launch; a
        combination that passes is remembered, so later steps take :meth:`launch`."""
        _validate(self.buf, gi, pi, pv, out, None, None,
                  deep=self.validate or self.poison)
        n = gi.shape[0]
        if host and n > self.max_batch:
            raise InputError(f"gather_indices has {n} slots, more than max_batch={self.max_batch}")
        _raise_if_flagged(self._flag)  # a previous launch's consume-once failure
        if host:
            self.ensure_host_ring()
        if pi is not None and pi.shape[0] == 0:
            pi = pv = None
        # Keyed on what is launched: an empty publish compiles no publish pointers of its
        # own, so it must not stand in for a combination with real ones.
        key = (gi.dtype, host) if pi is None else (gi.dtype, pi.dtype, pv.dtype, host)
        if out is None:
            out = self._new(n) if n else self.empty_out
        if not n and pi is None:  # DP-idle: nothing to launch
            return out
        stamp = self.stamp = self.step & self.STAMP_MASK
        self.step += 1
        compiled = self._run_impl(gi, pi, pv, out, host, stamp)
        if key not in self._variants and gi.dtype in _LEAN_INDEX \
                and (len(key) == 2 or (key[1] in _LEAN_INDEX and key[2] in _LEAN_INDEX)):
            self._variants[key] = self._bind(compiled)
        if self.poison and not self._on_cuda:
            _raise_if_flagged(self._flag)
        return out

    def _bind(self, compiled):
        if self._fast is None or self._fast.blocked or compiled is None:
            return None
        from spec_fused.kernels.launcher import bind

        bound, why = bind(compiled, len(_publish_gather_kernel.arg_names))
        if bound is None:
            self._fast.block(why)
        return bound

    def _run_impl(self, gi, pi, pv, out, host, stamp):
        if self._null:  # SPEC_FUSED_FORCE_BACKEND=null: everything but the launch
            if host and self._ring_np is not None:
                self._ring_np[stamp & 1, -1] = stamp  # so the read takes its normal branch
            return None
        row = self._host_ring[stamp & 1] if host else None
        self.launches += 1
        return self._impl(self.buf, gi, pi, pv, out, self.out_sum, row,
                          self._flag, self.poison, stamp if host else None,
                          row.shape[0] - 1 if host else 0)

    # ------------------------------------------------------------------ one-object API

    def __call__(self, gather_indices, publish_indices=None, publish_values=None, *,
                 host: bool = False, out: Optional[torch.Tensor] = None) -> PublishGatherResult:
        """The checked path; ``out`` (else the static buffer, else a fresh tensor) gets the
        lengths. Passing ``out`` lets a caller allocate on the stream that will own the
        result while the launch itself runs on another."""
        n = gather_indices.shape[0]
        if n > self.max_batch:
            raise InputError(f"gather_indices has {n} slots, more than max_batch={self.max_batch}")
        if out is None:
            out = (self._static_out[:n] if self._static_out is not None
                   else torch.empty((n,), dtype=self.buf.dtype, device=self.buf.device))
        m = 0 if publish_indices is None else publish_indices.shape[0]
        if n == 0 and m == 0:  # DP-idle: validate, launch nothing
            _validate(self.buf, gather_indices, publish_indices, publish_values, out, None,
                      None, deep=False)
            self.out_sum.zero_()
            stamp = None
            if host:
                self.ensure_host_ring()
                stamp = self.stamp = self.step & self.STAMP_MASK
                self.step += 1
                self._ring_np[stamp & 1, 0] = 0
                self._ring_np[stamp & 1, -1] = stamp
            return PublishGatherResult(out, self.out_sum, self._flag,
                                       None if stamp is None else self._row(stamp), stamp, 0)
        self.launch_checked(gather_indices, publish_indices, publish_values, host, out)
        stamp = self.stamp
        return PublishGatherResult(out, self.out_sum, self._flag,
                                   self._row(stamp) if host else None,
                                   stamp if host else None, n)

    def read_host(self, result: PublishGatherResult, wait=None):
        """``(seq_lens_cpu, seq_lens_sum)`` from the launch that produced ``result``."""
        if result.host is None:
            raise ValueError("this launch was made with host=False: it has no host mirror")
        return self.read_row(result.stamp, result.n, wait)

    def read_row(self, stamp: int, n: int, wait=None):
        """``(seq_lens_cpu, seq_lens_sum)`` of launch ``stamp`` from its ring row.

        Call once that launch has completed (``wait`` is how to wait for it). The lengths
        are copied out of the ring, so the caller owns them for as long as it likes. The
        stamp is read through numpy: a scalar compare, not a tensor op."""
        row = self._ring_np[stamp & 1]
        if row[-1] != stamp:
            if self.debug or wait is None:
                raise StaleHostMirrorError(
                    f"host mirror slot holds step {int(row[-1])}, expected step {stamp}",
                    "stale")
            wait()
            if row[-1] != stamp:
                raise StaleHostMirrorError(
                    f"host mirror slot holds step {int(row[-1])} after waiting, expected "
                    f"step {stamp}", "stale after waiting")
        if self.poison:
            _raise_if_flagged(self._flag)
        lens, total = torch.from_numpy(row[:n].copy()), int(row[n])
        if row[-1] != stamp:  # overwritten while copying: torn
            raise StaleHostMirrorError(
                f"host mirror slot was rewritten (step {int(row[-1])}) while step "
                f"{stamp} was being read", "torn")
        return lens, total


def _write_host_row(row, lens, total, stamp=None, stamp_offset=-1) -> None:
    """The kernel's host mirror, in torch: ``[*lens, total]`` and, last, the stamp."""
    n = lens.shape[0]
    row[:n].copy_(lens)
    row[n] = total
    if stamp is not None:
        row.view(-1)[stamp_offset] = stamp  # (a view of the whole ring row)


def prewarm(device) -> int:
    """Compile the variants the relay launches (with and without a host mirror; int64 and
    int32 published values; device and pinned host indices) on scratch data, so no kernel
    is compiled or loaded while a server is serving. Returns how many launches it made."""
    device = torch.device(device)
    if backend_for(device) != "triton":
        return 0
    scratch = torch.zeros((4,), dtype=torch.int64, device=device)
    pg = PublishGather(scratch, max_batch=2)
    idx = torch.tensor([1, 2], dtype=torch.int64, device=device)
    host_idx = pg.stage_host_indices(torch.tensor([1, 2], dtype=torch.int64))
    for values in (idx.clone(), idx.int()):
        for gather in (idx, host_idx):
            for host in (False, True):
                pg.launch(gather, idx, values, host)
                pg.launch(gather, None, None, host)
    pg.launch(idx[:0], idx, idx.clone(), False)  # a publish-only flush
    torch.cuda.current_stream(device).synchronize()
    return pg.launches
