"""The relay's per-step launcher: one fused launch per decode step, for little more host
time than the launch itself.

Why a stateful launcher: the relay makes one tiny launch per step, so everything Python
does around it *is* its cost. This binds what is fixed per relay buffer once (the backend,
the compiled specializations, ``out_sum``, the host ring, the staging buffer) and makes a
step an O(1) guard plus one launch. Anything the guard does not recognise takes the full
check (clear errors before anything is written) and is remembered once it passes.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from spec_fused.faults import raise_if_sticky
from spec_fused.kernels import checks
from spec_fused.kernels import publish_gather as kernel
from spec_fused.kernels.backend import BACKENDS, backend_for, verdict_for
from spec_fused.kernels.checks import NO_ERROR, InputError, StaleHostMirrorError, raise_if_flagged
from spec_fused.kernels.host_ring import HostRing, write_host_row
from spec_fused.kernels.publish_gather import Args, kernel_args
from spec_fused.log import log_once

__all__ = ["StepLauncher"]

_UNSEEN = object()
_tuple_new = tuple.__new__  # an Args without NamedTuple's per-call Python __new__
_INT64 = torch.int64


class StepLauncher:
    """Bound once to one relay buffer; ``launch(gi, pi, pv, host)`` is one step: gather
    indices (or :meth:`stage_host_indices`' pinned copy), the publish (or None), and with
    ``host`` the sum plus, with a ``mirror``, the stamped host row ``[*lens, sum]``
    (:meth:`read_row`). Each step returns a fresh ``(n,)`` result, as SGLang keeps it as
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
        mirror: bool = True,
    ):
        checks.validate(buf, buf[:0].long(), None, None, None, None, None, deep=False)
        self.buf = buf
        self.max_batch = int(buf.shape[0] if max_batch is None else max_batch)
        self.poison = poison
        self.validate = validate or poison
        self.mirror = mirror
        self._on_cuda = buf.device.type == "cuda"
        self._index = buf.get_device()  # -1 on CPU
        # Host memory the kernel stores into is pinned on CUDA, unless the host forbids it
        # (Confidential Computing: the flag then stays on the device).
        self._pin = pinned
        self.out_sum = torch.zeros((), dtype=_INT64, device=buf.device)
        self.empty_out = buf.new_empty(0)
        self.ring: Optional[HostRing] = None
        self._rows: Any = None
        self._flag: Optional[torch.Tensor] = None
        if poison:
            self._flag = torch.full((1,), NO_ERROR, dtype=_INT64, pin_memory=self.pinned)
            self._flag = self._flag if self.pinned else self._flag.to(buf.device)
        self.stamp = 0  # the last launch's host-row stamp (read_row's key)
        self.step = 0
        self.launches = 0  # device launches made (kernel or reference), for tests and counts
        self.direct_launches = 0
        self.staged: Optional[torch.Tensor] = None  # trusted pinned gather indices
        self._staging: Optional[torch.Tensor] = None
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
        checks.validate(buf, buf[:0].long(), None, None, None, None, None, deep=False)
        self.buf, self._index = buf, buf.get_device()
        self.backend = self._backend  # specializations bound to the old buffer go

    def uses_direct_launch(self) -> bool:
        return self._direct is not None and self._direct.blocked is None

    def block_direct_launch(self, why: str) -> None:
        if self._direct is not None:
            self._direct.block(why)

    def ensure_host_ring(self) -> HostRing:
        if self.ring is None:
            self.ring = HostRing(self.max_batch, pinned=self.pinned)
            self._rows = self.ring.rows
        return self.ring

    def stage_host_indices(self, host, like: Optional[torch.Tensor] = None):
        """``host`` (CPU indices) copied into a pinned buffer the kernel reads zero-copy, so
        an exact step waits for the publish only, not for the schedule stream's WAR barrier;
        :meth:`launch` trusts the view. None unless ``host`` is CPU indices shaped as
        ``like``. Call only once the last launch that read the staging buffer completed."""
        if not isinstance(host, torch.Tensor) or host.device.type != "cpu":
            return None
        if host.is_floating_point() or (like is not None and host.shape != like.shape):
            return None
        n = host.shape[0]
        if self._staging is None or self._staging.shape[0] < n:
            size = max(n, self.max_batch)
            self._staging = torch.empty((size,), dtype=_INT64, pin_memory=self.pinned)
        view = self.staged = self._staging[:n]
        view.copy_(host)
        if self.validate and like is not None and not torch.equal(view, like.cpu()):
            raise AssertionError("batch.req_pool_indices_cpu differs from future_indices")
        return view

    def _key(self, gi, pi, pv, host: bool):
        """What the guard accepts without the full check: 1-D contiguous inputs on the
        buffer's device (or the staged indices), a dtype combination seen before. Plain
        attribute reads only: this runs every step."""
        if gi.dim() != 1 or not gi.is_contiguous():
            return None
        cpu, index = not self._on_cuda, self._index
        if not (gi.is_cpu if cpu else gi.get_device() == index) and gi is not self.staged:
            return None
        if pi is None or not pi.shape[0]:
            return gi.dtype, host
        if pi.dim() != 1 or pi.shape != pv.shape or not (pi.is_contiguous() and pv.is_contiguous()):
            return None
        here = pi.is_cpu and pv.is_cpu if cpu else pi.get_device() == pv.get_device() == index
        return (gi.dtype, pi.dtype, pv.dtype, host) if here else None

    def _launch(self, gi, pi, pv, host: bool) -> torch.Tensor:
        bound = self._seen.get(self._key(gi, pi, pv, host), _UNSEEN)
        n = gi.shape[0]
        if bound is _UNSEEN or (host and n > self.max_batch):
            return self.launch_checked(gi, pi, pv, host)
        m = 0 if pi is None else pi.shape[0]
        if not (n or m):
            return self._idle(host)
        if self._backend == "reference":
            return self._lean_reference(gi, pi if m else None, pv, host)
        out = self.buf.new_empty(n) if n else self.empty_out
        a = self._args(gi, pi if m else None, pv if m else None, out, host)
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

    def launch_checked(self, gi, pi, pv, host: bool) -> torch.Tensor:
        """The full check, then one launch; a combination that passes is remembered."""
        checks.validate(self.buf, gi, pi, pv, None, None, None, deep=self.validate)
        n = gi.shape[0]
        if host and n > self.max_batch:
            raise InputError(f"gather_indices has {n} slots, more than max_batch={self.max_batch}")
        raise_if_flagged(self._flag)  # a previous launch's consume-once failure
        if pi is not None and not pi.shape[0]:
            pi = pv = None
        if gi is not self.staged:
            gi = gi.contiguous()
        pi, pv = (None, None) if pi is None else (pi.contiguous(), pv.contiguous())
        if not n and pi is None:
            return self._idle(host)
        out = self.buf.new_empty(n) if n else self.empty_out
        compiled = self._run(self._args(gi, pi, pv, out, host))
        key = self._key(gi, pi, pv, host)
        if key is not None and key not in self._seen:
            self._seen[key] = None if self._direct is None else self._direct.bind(compiled)
        if self.poison and not self.pinned:
            raise_if_flagged(self._flag)
        return out

    def _args(self, gi, pi, pv, out, host: bool) -> Args:
        """This step's Args, built as a plain tuple: it runs every step."""
        stamp = self.stamp = self.step & HostRing.STAMP_MASK
        self.step += 1
        if host and self.mirror:
            ring = self.ring or self.ensure_host_ring()
            row, at, offset = self._rows[stamp & 1], stamp, ring.stamp_offset
        else:
            row, at, offset = None, None, 0
        fields = (self.buf, gi, pi, pv, out, self.out_sum, row, self._flag, self.poison, at, offset)
        return _tuple_new(Args, fields)

    def _run(self, a: Args):
        """One launch with the kernel's whole semantics (normal Triton launch, or torch)."""
        if self._backend == "null":  # SPEC_FUSED_FORCE_BACKEND=null: all but the launch
            if self.ring is not None and a.stamp is not None:
                self.ring.stamp_only(a.stamp)
            return None
        self.launches += 1
        if self._backend == "reference":
            return kernel.launch_reference(a)
        if self._direct is not None and self._direct.on_other_device():
            with torch.cuda.device(self.buf.device):  # Triton launches on the current device
                return kernel.launch_triton(a)
        return kernel.launch_triton(a)

    def _lean_reference(self, gi: Any, pi, pv: Any, host: bool) -> torch.Tensor:
        """Release-mode reference step: the two ops upstream's own relay makes."""
        buf = self.buf
        if pi is not None:
            if pi.dtype is _INT64 and pv.dtype is _INT64:
                buf.index_copy_(0, pi, pv)
            else:
                buf[pi] = pv.to(_INT64)
        if buf.is_cuda and gi is self.staged:  # pinned host indices: move them over
            gi = self.staged.to(buf.device, non_blocking=True)
        out = buf.index_select(0, gi)
        self.launches += 1
        if host:
            torch.sum(out, 0, out=self.out_sum)
            if self.mirror:
                stamp = self.stamp = self.step & HostRing.STAMP_MASK
                self.step += 1
                ring = self.ensure_host_ring()
                write_host_row(self._rows[stamp & 1], out, self.out_sum, stamp, ring.stamp_offset)
        return out

    def _idle(self, host: bool) -> torch.Tensor:
        """A DP-idle step launches nothing; its host row still says so (no lengths, sum 0)."""
        if host and self.mirror:
            stamp = self.stamp = self.step & HostRing.STAMP_MASK
            self.step += 1
            self.ensure_host_ring().stamp_only(stamp, total=0)
        elif host:
            self.out_sum.zero_()
        return self.empty_out

    def read_row(self, stamp: int, n: int, wait=None):
        """``(seq_lens_cpu, seq_lens_sum)`` of launch ``stamp`` from the host ring (debug
        mode never waits again), after the consume-once check when poisoning."""
        if self.ring is None:
            raise StaleHostMirrorError(f"no host-mirror launch was made (step {stamp})", "no ring")
        lens_total = self.ring.read(stamp, n, wait, strict=self.validate)
        raise_if_flagged(self._flag)
        return lens_total

    def read_lengths(self, out: torch.Tensor, wait) -> tuple:
        """The last launch's host row; never an older step's lengths: in release mode a
        stale row is read from the device instead (logged once per cause)."""
        try:
            return self.read_row(self.stamp, out.shape[0], wait=wait)
        except StaleHostMirrorError as exc:
            if self.validate:
                raise
            log_once(("stale", exc.cause), "%s; reading this step's lengths from the device", exc)
            return out.cpu(), int(out.sum())
