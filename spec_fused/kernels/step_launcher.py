"""The relay's per-step launcher: one fused launch per decode step, for as little host time
as the launch itself costs.

Why a stateful launcher: the relay makes one tiny launch per step, so everything Python
does around it *is* its cost. This binds everything fixed per relay buffer once (the
backend, the compiled specializations, ``out_sum``, the host ring, the staging buffer) and makes
each step an O(1) guard plus one launch. Input checks and errors are ``checks``; the host
mirror is ``host_ring``; the direct launch of a compiled kernel is ``direct_launch``.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from spec_fused.kernels import checks
from spec_fused.kernels import publish_gather as kernel
from spec_fused.kernels.backend import BACKENDS, backend_for, verdict_for
from spec_fused.kernels.checks import (
    NO_ERROR,
    InputError,
    StaleHostMirrorError,
    raise_if_flagged,
)
from spec_fused.kernels.host_ring import HostRing, write_host_row
from spec_fused.kernels.publish_gather import kernel_args

__all__ = ["StepLauncher"]


def _check_buffer(buf) -> None:
    checks.validate(buf, buf[:0].long(), None, None, None, None, None, deep=False)


_UNSEEN = object()
_INT64 = torch.int64  # one global load on the per-step path
# What the bound path accepts without the full check; anything else takes it.
_LEAN_INDEX = (torch.int32, torch.int64)


class StepLauncher:
    """The relay's launcher: bound once to one relay buffer, one step per call.

    Two entry points. :meth:`launch` is the per-step path the relay takes in release
    mode: an O(1) guard (each input 1-D, on the buffer's device, an index/value dtype
    combination this launcher has already accepted once) and then the launch - for
    compiled Triton straight through the bound compiled kernel (``direct_launch``),
    skipping ``JITFunction.run``. Anything the guard does not recognise takes
    :meth:`launch_checked`, which runs the full check (clear errors, before anything is
    written), and, if the input is good, launches it the normal way and remembers the
    combination. Debug mode (``validate``/``poison``) always takes the checked path.

    Each step returns a fresh ``(n,)`` result: the relay hands it to SGLang as
    ``batch.seq_lens``, which outlives the step (see ``FusedRelay``). ``out_sum`` is the
    launcher's own scalar, never handed out. ``host=True`` also stores ``[*lens, sum]``
    and the step's stamp into the host ring (:class:`~spec_fused.kernels.host_ring.HostRing`),
    read back with :meth:`read_row`."""

    def __init__(
        self,
        buf: torch.Tensor,
        *,
        max_batch: Optional[int] = None,
        poison: bool = False,
        validate: bool = False,
        debug: bool = False,
        backend: Optional[str] = None,
        pinned: Optional[bool] = None,
        mirror: bool = True,
    ):
        _check_buffer(buf)
        self.buf = buf
        self.max_batch = int(buf.shape[0] if max_batch is None else max_batch)
        self.poison = poison
        self.validate = validate
        self.debug = debug
        self._on_cuda = buf.device.type == "cuda"
        self._on_cpu = buf.device.type == "cpu"
        # Host memory the kernel stores into is pinned on CUDA, unless the host forbids
        # it (Confidential Computing: the relay then keeps the flag on the device).
        self._pin_host = pinned is not False
        # host=True: the launch also yields the lengths' sum in ``out_sum``, and - with a
        # mirror - stores ``[*lens, sum]`` and its stamp into the host ring. A relay on the
        # host itself (CPU) launches without it and sums its lengths there (FusedRelay).
        self.mirror = mirror
        self._device_index = buf.get_device()  # -1 on CPU, as Tensor.get_device() says
        self.out_sum = torch.zeros((), dtype=torch.int64, device=buf.device)
        self.ring: Optional[HostRing] = None
        # Bound for the per-step path, which reaches them only where they are set (a
        # host step has a ring; a bound specialization has a DirectLaunch): typed as such.
        self._ring_rows: Any = None  # ring.rows
        self._stamp_offset = 0
        self._flag: Optional[torch.Tensor] = None
        if poison:
            self._flag = torch.full((1,), NO_ERROR, dtype=torch.int64, pin_memory=self._pinned)
            if not self._pinned:
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
        self._seen: dict = {}
        self._direct: Any = None  # DirectLaunch on compiled Triton, else None
        self._last_dtypes: Any = None
        self._last_host: Any = None
        self._last_bound: Any = None
        self.backend = backend or backend_for(buf.device)

    @property
    def _pinned(self) -> bool:
        return self._on_cuda and self._pin_host

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
        self._seen = {}
        self._last_dtypes = self._last_host = self._last_bound = None
        self._direct = None
        if name == "triton" and self._on_cuda:
            from spec_fused.kernels.direct_launch import DirectLaunch

            self._direct = DirectLaunch(self._device_index, kernel._publish_gather_kernel)
            proven = verdict_for(self.buf.device)
            if proven is not None and not proven.direct and proven.downgraded:
                self._direct.block(f"start-up canary: {proven.notes[0]}")
        self._null = name == "null"
        self._impl = kernel._reference_impl if name == "reference" else kernel._launch
        self.launch = self._launch_reference if name == "reference" else self._launch_kernel

    def rebind(self, buf: torch.Tensor) -> None:
        """A new relay buffer (FutureMap adopted a captured graph's): same launcher."""
        _check_buffer(buf)
        self.buf = buf
        self.backend = self._backend  # bound kernels keyed on the old buffer go

    def uses_direct_launch(self) -> bool:
        """Whether this launcher may take the direct launch at all (compiled Triton, not
        blocked); :meth:`launches_directly` says whether one step would."""
        return self._direct is not None and self._direct.blocked is None

    def block_direct_launch(self, why: str) -> None:
        """No direct launch from this launcher from now on (the reason is logged once)."""
        if self._direct is not None:
            self._direct.block(why)

    def has_launched(self, gi, pi, pv, host: bool) -> bool:
        """Whether these inputs' specialization was launched (so compiled) by this launcher
        before: a step of them needs no check and no compile (e.g. under graph capture)."""
        return self._guard(gi, pi, pv, host) is not _UNSEEN

    def launches_directly(self, gi, pi, pv, host: bool) -> bool:
        """Whether :meth:`launch` of these inputs would take the direct launch now (a
        bound specialization, and no launch hook, pre-run hook, compile or device switch in the
        way): what the canary proves it ran, not what it was allowed to run."""
        if self._direct is None or not self._direct.ready():
            return False
        bound = self._guard(gi, pi, pv, host)
        return bound is not _UNSEEN and bound is not None

    def ensure_host_ring(self) -> HostRing:
        """The stamped host ring (pinned on CUDA), allocated now if it was not, e.g.
        before graph capture."""
        if self.ring is None:
            self.ring = HostRing(self.max_batch, pinned=self._pinned)
            self._ring_rows = self.ring.rows
            self._stamp_offset = self.ring.stamp_offset
        return self.ring

    def stage_host_indices(self, host: torch.Tensor) -> torch.Tensor:
        """``host`` (CPU indices) copied into a pinned buffer the kernel reads zero-copy;
        the view returned is trusted by :meth:`launch` as gather indices. Only call it
        once the previous launch that read the staging buffer has completed."""
        n = host.shape[0]
        if self._staging is None or self._staging.shape[0] < n:
            self._staging = torch.empty(
                (max(n, self.max_batch),), dtype=torch.int64, pin_memory=self._pinned
            )
        view = self._staging[:n]
        view.copy_(host)
        self.staged = view
        return view

    # ------------------------------------------------------------------ per step

    def _guard(self, gi, pi, pv, host: bool):
        """The O(1) guard: the bound specialization for these inputs, or ``_UNSEEN``.

        Accepted: each input 1-D and on the buffer's device (gather indices may also be
        the launcher's own staged pinned copy), values as long as indices, and a dtype
        combination that :meth:`launch_checked` has already accepted once - which is
        also where anything else goes, for its clear error. The steady state (the same
        dtypes every step) is one tuple compare, not a dict lookup."""
        if self._on_cpu:  # get_device() says -1 for CPU and meta alike
            on_device = gi.is_cpu and (pi is None or (pi.is_cpu and pv.is_cpu))
        else:
            dev = self._device_index
            on_device = (gi.get_device() == dev or gi is self.staged) and (
                pi is None or (pi.get_device() == dev and pv.get_device() == dev)
            )
        if pi is None:
            if not (on_device and gi.dim() == 1):
                return _UNSEEN
            return self._seen.get((gi.dtype, host), _UNSEEN)
        if not (
            on_device
            and gi.dim() == 1
            and pi.dim() == 1
            and pv.dim() == 1
            and pv.numel() == pi.numel()
        ):
            return _UNSEEN
        dtypes = gi.dtype, pi.dtype, pv.dtype
        if dtypes == self._last_dtypes and host is self._last_host:
            return self._last_bound
        bound = self._seen.get((*dtypes, host), _UNSEEN)
        if bound is not _UNSEEN:
            self._last_dtypes, self._last_host, self._last_bound = dtypes, host, bound
        elif not pi.shape[0]:
            # An empty publish is launched as no publish and filed so by the checked
            # path: look it up there, or every such step would take the full check.
            return self._seen.get((gi.dtype, host), _UNSEEN)
        return bound

    def _launch_kernel(self, gi, pi, pv, host: bool) -> torch.Tensor:
        """Release-mode step on the Triton kernel (compiled or interpreted), or on the
        null backend (the same path; ``_run_impl`` leaves the launch out). Returns the
        lengths."""
        bound = self._guard(gi, pi, pv, host)
        n = gi.numel()
        if bound is _UNSEEN or (host and n > self.max_batch):
            return self.launch_checked(gi, pi, pv, host)
        m = 0 if pi is None else pi.numel()
        if not (n or m):  # DP-idle: nothing to launch
            return self._idle(host)
        out = self._new(n) if n else self.empty_out
        stamp = self.stamp = self.step & HostRing.STAMP_MASK
        self.step += 1
        fast = self._direct  # None for the null backend: _run_impl leaves the launch out
        if bound is not None and fast.ready():
            self.launches += 1
            bound.run(
                1,
                1,
                1,
                fast.raw_stream(self._device_index),
                bound.function,
                bound.metadata,
                None,
                None,
                None,
                *kernel_args(
                    self.buf,
                    gi,
                    pi if m else None,
                    pv,
                    out,
                    self.out_sum,
                    self._ring_rows[stamp & 1] if host else None,
                    self._flag if self.poison else None,
                    stamp,
                    self._stamp_offset,
                ),
                host,
                host,
                self.poison,
                kernel.BLOCK,
            )
            return out
        self._run_impl(gi, pi if m else None, pv if m else None, out, host, stamp)
        return out

    def _launch_reference(self, gi, pi, pv, host: bool) -> torch.Tensor:
        """Release-mode step in plain torch: the ops upstream's own relay makes, behind
        the same O(1) guard as the kernel's."""
        n = gi.numel()
        if self._guard(gi, pi, pv, host) is _UNSEEN or (host and n > self.max_batch):
            return self.launch_checked(gi, pi, pv, host)
        m = 0 if pi is None else pi.numel()
        if not m and not n:  # DP-idle: nothing to launch
            return self._idle(host)
        buf = self.buf
        if m:
            if pv.dtype is _INT64 and pi.dtype is _INT64:
                buf.index_copy_(0, pi, pv)
            else:
                buf[pi] = pv.to(_INT64)
        if self._on_cuda:
            staged = self.staged
            if staged is not None and gi is staged:  # pinned host indices: move over
                gi = staged.to(buf.device, non_blocking=True)
        out = buf.index_select(0, gi)
        self.launches += 1
        stamp = self.stamp = self.step & HostRing.STAMP_MASK
        self.step += 1
        if host:  # the kernel's sum, and its host mirror
            torch.sum(out, 0, out=self.out_sum)
            if self.mirror:
                write_host_row(
                    self._ring_rows[stamp & 1], out, self.out_sum, stamp, self._stamp_offset
                )
        return out

    def launch_checked(self, gi, pi, pv, host: bool, out=None) -> torch.Tensor:
        """The full check (clear errors before anything is written), then one launch; a
        combination that passes is remembered, so later steps take :meth:`launch`."""
        checks.validate(self.buf, gi, pi, pv, out, None, None, deep=self.validate or self.poison)
        n = gi.shape[0]
        if host and n > self.max_batch:
            raise InputError(f"gather_indices has {n} slots, more than max_batch={self.max_batch}")
        raise_if_flagged(self._flag)  # a previous launch's consume-once failure
        if host and self.mirror:
            self.ensure_host_ring()
        if pi is not None and pi.shape[0] == 0:
            pi = pv = None
        # Keyed on what is launched: an empty publish compiles no publish pointers of its
        # own, so it must not stand in for a combination with real ones.
        key = (gi.dtype, host) if pi is None else (gi.dtype, pi.dtype, pv.dtype, host)
        if out is None:
            out = self._new(n) if n else self.empty_out
        if not n and pi is None:  # DP-idle: nothing to launch
            return self._idle(host)
        stamp = self.stamp = self.step & HostRing.STAMP_MASK
        self.step += 1
        compiled = self._run_impl(gi, pi, pv, out, host, stamp)
        if (
            key not in self._seen
            and gi.dtype in _LEAN_INDEX
            and (len(key) == 2 or (key[1] in _LEAN_INDEX and key[2] in _LEAN_INDEX))
        ):
            self._seen[key] = self._bind(compiled)
        if self.poison and not self._on_cuda:
            raise_if_flagged(self._flag)
        return out

    def _idle(self, host: bool) -> torch.Tensor:
        """A DP-idle step launches nothing; with a host mirror its row still says so
        (no lengths, sum 0), so every step can be read back the same way."""
        if host and self.mirror:
            ring = self.ensure_host_ring()
            stamp = self.stamp = self.step & HostRing.STAMP_MASK
            self.step += 1
            ring.stamp_only(stamp, total=0)
        elif host:
            self.out_sum.zero_()
        return self.empty_out

    def _bind(self, compiled):
        if self._direct is None or self._direct.blocked or compiled is None:
            return None
        from spec_fused.kernels.direct_launch import bind

        bound, why = bind(compiled, len(kernel._publish_gather_kernel.arg_names))
        if bound is None:
            self._direct.block(why)
        return bound

    def _run_impl(self, gi, pi, pv, out, host, stamp):
        if self._null:  # SPEC_FUSED_FORCE_BACKEND=null: everything but the launch
            if host and self.ring is not None:
                self.ring.stamp_only(stamp)  # so the read takes its normal branch
            return None
        row, row_stamp, stamp_offset = None, None, 0
        if host and self.mirror:
            row, row_stamp = self._ring_rows[stamp & 1], stamp
            stamp_offset = row.shape[0] - 1
        self.launches += 1
        args = (
            self.buf,
            gi,
            pi,
            pv,
            out,
            self.out_sum,
            row,
            self._flag,
            self.poison,
            row_stamp,
            stamp_offset,
        )
        if self._direct is not None and self._direct.on_other_device():
            # Triton's normal launch goes to the *current* device: switch to the buffer's.
            with torch.cuda.device(self.buf.device):
                return self._impl(*args)
        return self._impl(*args)

    def read_row(self, stamp: int, n: int, wait=None):
        """``(seq_lens_cpu, seq_lens_sum)`` of launch ``stamp`` from the host ring (see
        :meth:`HostRing.read`; debug mode never waits again), after the consume-once
        check when poisoning."""
        if self.ring is None:
            raise StaleHostMirrorError(f"no host-mirror launch was made (step {stamp})", "no ring")
        lens_total = self.ring.read(stamp, n, wait, strict=self.debug)
        if self.poison:
            raise_if_flagged(self._flag)
        return lens_total
