"""The relay's per-step launcher: one fused launch per decode step, for little more host
time than the launch itself.

Why a stateful launcher: the relay makes one tiny launch per step, so everything Python
does around it *is* its cost. This binds what is fixed per relay buffer once (the backend,
the compiled specializations, ``out_sum``, the host-index staging and the host row) and
makes a step an O(1) guard plus one launch. Anything the guard does not recognise takes
the full check (clear errors before anything is written) and is remembered once it passes.

Exact host lengths on a GPU are three device operations on the caller's (private) stream:
the batch's host indices up (:meth:`upload_host_indices`), the launch writing the row
``[*lens, sum]``, and that row down (:meth:`row_to_host`); the kernel itself reads and
writes device memory only.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from spec_fused.faults import raise_if_sticky
from spec_fused.kernels import checks
from spec_fused.kernels import publish_gather as kernel
from spec_fused.kernels.backend import BACKENDS, backend_for, verdict_for
from spec_fused.kernels.checks import NO_ERROR, raise_if_flagged
from spec_fused.kernels.publish_gather import Args, kernel_args

__all__ = ["StepLauncher"]

_UNSEEN = object()
_tuple_new = tuple.__new__  # an Args without NamedTuple's per-call Python __new__
_INT64 = torch.int64


class StepLauncher:
    """Bound once to one relay buffer; ``launch(gi, pi, pv, row)`` is one step: gather
    indices, the publish (or None), and with ``row`` the sum at ``out[n]`` (the row one
    copy brings to the host). Each step returns a fresh result, as SGLang keeps it as
    ``batch.seq_lens``. Debug mode (``poison``/``validate``) fully checks every step."""

    def __init__(
        self,
        buf: torch.Tensor,
        *,
        max_batch: Optional[int] = None,
        poison: bool = False,
        validate: bool = False,
        backend: Optional[str] = None,
        pinned: bool = True,
    ):
        checks.validate(buf, buf[:0].long(), None, None, None, None, deep=False)
        self.buf = buf
        self.max_batch = int(buf.shape[0] if max_batch is None else max_batch)  # host sizes
        self.poison = poison
        self.validate = validate or poison
        self._on_cuda = buf.device.type == "cuda"
        self._index = buf.get_device()  # -1 on CPU
        # Host memory the copies use is pinned on CUDA, unless the host forbids it
        # (Confidential Computing: SGLang stages pageable there, and so does this).
        self._pin = pinned
        self.out_sum = torch.zeros((), dtype=_INT64, device=buf.device)
        self.empty_out = buf.new_empty(0)
        self._zero_row = torch.zeros(1, dtype=_INT64, device=buf.device)  # [sum] of no lengths
        self._flag: Optional[torch.Tensor] = None  # the consume-once flag (debug mode)
        if poison:
            self._flag = torch.full((1,), NO_ERROR, dtype=_INT64, device=buf.device)
        self._staging: Any = None  # host indices, pinned: (staging, device copy)
        self._row: Any = None  # the host row [*lens, sum] and its numpy view
        self.step = 0
        self.launches = 0  # device launches made (kernel or reference), for tests and counts
        self.direct_launches = 0
        self.backend = backend or backend_for(buf.device)

    @property
    def pinned(self) -> bool:
        return self._on_cuda and self._pin

    @property
    def backend(self) -> str:
        return self._backend

    @backend.setter
    def backend(self, name: str) -> None:
        """Bind the per-step implementation (no dispatch per step)."""
        if name not in BACKENDS:
            raise ValueError(f"unknown backend {name!r}; one of {BACKENDS}")
        self._backend = name
        self._seen: dict = {}  # guard key -> bound compiled kernel (or None)
        self._direct: Any = None
        if name == "triton" and self._on_cuda:
            from spec_fused.kernels.direct_launch import DirectLaunch

            self._direct = DirectLaunch(self.buf.get_device(), kernel._publish_gather_kernel)
            proven = verdict_for(self.buf.device)
            if proven is not None and not proven.direct and proven.notes:
                self._direct.block(f"start-up canary: {proven.notes[0]}")
        self.launch = self.launch_checked if self.validate else self._launch

    def rebind(self, buf: torch.Tensor) -> None:
        """A new relay buffer (FutureMap adopted a captured graph's): same launcher."""
        checks.validate(buf, buf[:0].long(), None, None, None, None, deep=False)
        self.buf, self._index = buf, buf.get_device()
        self.backend = self._backend  # specializations bound to the old buffer go

    def uses_direct_launch(self) -> bool:
        return self._direct is not None and self._direct.blocked is None

    def block_direct_launch(self, why: str) -> None:
        if self._direct is not None:
            self._direct.block(why)

    # ------------------------------------------------------------ exact host lengths

    def stage_host_indices(self, host, like: torch.Tensor) -> Optional[torch.Tensor]:
        """``host`` (the batch's CPU indices) copied into the host staging buffer, or None
        unless it is CPU integer indices shaped as ``like`` (the device ``future_indices``;
        debug mode checks the values are equal, which SGLang's FIXME says they are).
        Host work only: call on the caller's stream, before :meth:`upload_host_indices`."""
        if not isinstance(host, torch.Tensor) or host.device.type != "cpu":
            return None
        if host.is_floating_point() or host.shape != like.shape:
            return None
        n = host.shape[0]
        if self._staging is None or self._staging[0].shape[0] < n:
            size = max(n, self.max_batch)
            self._staging = (
                torch.empty((size,), dtype=_INT64, pin_memory=self.pinned),
                torch.empty((size,), dtype=_INT64, device=self.buf.device),
            )
        view = self._staging[0][:n]
        view.copy_(host)
        if self.validate and not torch.equal(view, like.cpu()):
            raise AssertionError("batch.req_pool_indices_cpu differs from future_indices")
        return view

    def upload_host_indices(self, staged: torch.Tensor) -> torch.Tensor:
        """The staged indices on the device, copied on the current stream: the launch that
        follows there gathers by them, gated on nothing the schedule stream does."""
        if not self._on_cuda:
            return staged
        dev = self._staging[1][: staged.shape[0]]
        dev.copy_(staged, non_blocking=True)
        return dev

    def row_to_host(self, row: torch.Tensor) -> None:
        """Copy a launch's row ``[*lens, sum]`` to the host row, on the current stream;
        read it with :meth:`host_lengths` once that stream has reached here."""
        if self._row is None or self._row[0].shape[0] < row.shape[0]:
            host = torch.empty((max(row.shape[0], self.max_batch + 1),), dtype=_INT64,
                               pin_memory=self.pinned)  # fmt: skip
            self._row = (host, host.numpy())
        self._row[0][: row.shape[0]].copy_(row, non_blocking=True)

    def host_lengths(self, n: int) -> tuple:
        """``(seq_lens_cpu, seq_lens_sum)`` from the host row: a copy (the row is reused)."""
        values = self._row[1]
        return torch.from_numpy(values[:n].copy()), int(values[n])

    # ------------------------------------------------------------------ the launch

    def _key(self, gi, pi, pv, row: bool):
        """What the guard accepts without the full check: 1-D contiguous inputs on the
        buffer's device, a dtype combination seen before. Plain attribute reads only:
        this runs every step."""
        if gi.dim() != 1 or not gi.is_contiguous():
            return None
        cpu, index = not self._on_cuda, self._index
        if not (gi.is_cpu if cpu else gi.get_device() == index):
            return None
        if pi is None or not pi.shape[0]:
            return gi.dtype, row
        if pi.dim() != 1 or pi.shape != pv.shape or not (pi.is_contiguous() and pv.is_contiguous()):
            return None
        here = pi.is_cpu and pv.is_cpu if cpu else pi.get_device() == pv.get_device() == index
        return (gi.dtype, pi.dtype, pv.dtype, row) if here else None

    def _launch(self, gi, pi, pv, row: bool) -> torch.Tensor:
        bound = self._seen.get(self._key(gi, pi, pv, row), _UNSEEN)
        if bound is _UNSEEN:
            return self.launch_checked(gi, pi, pv, row)
        n = gi.shape[0]
        m = 0 if pi is None else pi.shape[0]
        if not (n or m):
            return self._zero_row if row else self.empty_out
        if self._backend == "reference":
            return self._lean_reference(gi, pi if m else None, pv, row)
        out = self.buf.new_empty(n + 1 if row else n)
        a = self._args(gi, pi if m else None, pv if m else None, out, row)
        if bound is not None and self._direct.ready():
            try:
                self._direct.launch(bound, kernel_args(a))
                self.launches += 1
                self.direct_launches += 1
            except Exception as exc:  # any surprise: the normal launch, for good
                raise_if_sticky(exc, "spec_fused's direct launch")
                self._direct.block(f"the direct launch failed ({type(exc).__name__}: {exc})")
                self._run(a)
        else:
            self._run(a)
        return out

    def launch_checked(self, gi, pi, pv, row: bool) -> torch.Tensor:
        """The full check, then one launch; a combination that passes is remembered."""
        checks.validate(self.buf, gi, pi, pv, None, None, deep=self.validate)
        n = gi.shape[0]
        if pi is not None and not pi.shape[0]:
            pi = pv = None
        gi = gi.contiguous()
        pi, pv = (None, None) if pi is None else (pi.contiguous(), pv.contiguous())
        if not n and pi is None:
            return self._zero_row if row else self.empty_out
        out = self.buf.new_empty(n + 1 if row else n)
        compiled = self._run(self._args(gi, pi, pv, out, row))
        key = self._key(gi, pi, pv, row)
        if key is not None and key not in self._seen:
            self._seen[key] = None if self._direct is None else self._direct.bind(compiled)
        if self.poison:
            raise_if_flagged(self._flag)  # debug mode: a sync on a GPU, free on a CPU
        return out

    def _args(self, gi, pi, pv, out, row: bool) -> Args:
        """This step's Args, built as a plain tuple: it runs every step."""
        self.step += 1
        fields = (self.buf, gi, pi, pv, out, self.out_sum, self._flag, self.poison, row)
        return _tuple_new(Args, fields)

    def _run(self, a: Args):
        """One launch with the kernel's whole semantics (normal Triton launch, or torch)."""
        if self._backend == "null":  # SPEC_FUSED_FORCE_BACKEND=null: all but the launch
            return None
        self.launches += 1
        if self._backend == "reference":
            return kernel.launch_reference(a)
        if self._direct is not None and self._direct.on_other_device():
            with torch.cuda.device(self.buf.device):  # Triton launches on the current device
                return kernel.launch_triton(a)
        return kernel.launch_triton(a)

    def _lean_reference(self, gi: Any, pi, pv: Any, row: bool) -> torch.Tensor:
        """Release-mode reference step: the two ops upstream's own relay makes (a third,
        the sum, for a row)."""
        buf = self.buf
        if pi is not None:
            if pi.dtype is _INT64 and pv.dtype is _INT64:
                buf.index_copy_(0, pi, pv)
            else:
                buf[pi] = pv.to(_INT64)
        self.launches += 1
        self.step += 1
        if not row:
            return buf.index_select(0, gi)
        n = gi.shape[0]
        out = buf.new_empty(n + 1)
        torch.index_select(buf, 0, gi, out=out[:n])
        torch.sum(out[:n], 0, out=out[n])
        return out
