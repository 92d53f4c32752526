"""The fused length relay that stands in for ``FutureMap.publish`` + ``resolve_seq_lens_cpu``.

Upstream publishes step N's lengths with a scatter on the forward stream and resolves
step N+1's with an event wait, a gather and - where a backend reads host lengths - a D2H
copy of the whole pool, a blocking synchronize and a host sum. Here ``publish`` only
remembers *what* to write (and records the ``publish_ready`` event upstream records), and
``resolve`` issues ONE launch that publishes, gathers and sums. What the host gets
follows :mod:`spec_fused.caps`:

* no host lengths (every attention backend opts out): the caller's stream waits for
  ``publish_ready`` on the device, as upstream's GPU-only path, and the launch runs there;
  ``seq_lens_cpu`` and ``seq_lens_sum`` are ``None``, as upstream leaves them.
* exact host lengths: the launch runs on a private stream gated on ``publish_ready``
  only - it gathers through pinned host indices, so it does not wait for the schedule
  stream and its WAR barrier - and writes ``bs + 1`` values into the pinned host ring.
  The host waits for that launch alone, never for a pool-sized copy.

Everything fixed per FutureMap is bound when the relay is made, so a step reads its
inputs, makes one launch and writes the batch's fields. A publish still pending when
anything else reads ``new_seq_lens_buf`` lands first (:meth:`FusedRelay.land_pending`), as does
one at a resolve with nothing to gather. Every failure walks down a ladder - Triton kernel
-> torch reference -> SGLang's own method - logging each reason once. CUDA calls and the
devices it engages on: :mod:`spec_fused.cuda_ops`.
"""

from __future__ import annotations

import logging
import weakref
from typing import Any, NoReturn, Optional

import torch

from spec_fused import upstream
from spec_fused.caps import SpecCaps, decide, select_variant
from spec_fused.cuda_ops import ops_for, unsupported_device
from spec_fused.faults import raise_if_sticky
from spec_fused.kernels.backend import explain_relay_backend, ignored_force_backend, verdict_for
from spec_fused.kernels.checks import (
    InputError,
    InputTypeError,
    PoisonedSlotError,
    StaleHostMirrorError,
)
from spec_fused.kernels.step_launcher import StepLauncher
from spec_fused.log import log_once
from spec_fused.upstream import confidential_compute, debug_enabled, sglang_tracks_seq_lens

logger = logging.getLogger("spec_fused")

RELAY_ATTR = "_spec_fused_relay"  # the live relay, or None where SGLang's path runs
DISABLED_ATTR = "_spec_fused_disabled"  # a relay handed back to SGLang, kept for inspection
CAPS_ATTR = "_spec_fused_caps"  # set by the scheduler patch, which knows worker + backends
BUF_ATTR = "new_seq_lens_buf"
# A CPU relay's seq_lens_sum: up to this many lengths, sum(tolist()) beats a torch sum's
# dispatch (0.3-0.5 us against 1.5 us on this project's CPU; 2.6 us at 256).
_PY_SUM_MAX = 64

live_relays: weakref.WeakSet[FusedRelay] = weakref.WeakSet()  # for remove() to land what is pending
# What is the caller's fault (bad input, raised before anything is written) or a caught
# bug (SGLang's own debug assertions, the consume-once and stamp checks): raised to the
# caller, never a reason to change backend. Anything else a launch raises - Triton's
# launcher raises ValueError/TypeError for its own failures too - is the backend's.
NOT_A_BACKEND_FAILURE = (
    InputError,
    InputTypeError,
    AssertionError,
    PoisonedSlotError,
    StaleHostMirrorError,
)


class HandToSGLang(Exception):
    """This step is SGLang's: the relay landed what it had pending, and SGLang's own
    method (``publish`` or ``resolve_seq_lens_cpu``) runs the step, as shipped."""


class BackendsDecision:
    """The attention backends' OR-ed ``needs_cpu_seq_lens``, as FutureMap received it."""

    def __init__(self, needs_cpu_seq_lens: bool):
        self.needs_cpu_seq_lens = needs_cpu_seq_lens


def future_map_caps(fm, *, worker=None, server_args=None) -> SpecCaps:
    """The production decision for ``fm``: the algorithm's capabilities with the
    backends' need as the FutureMap received it, two-batch overlap read the way the
    installed release reads it, and the worker when the scheduler knows it. Overrides
    that were refused are logged here, once each."""
    tbo, how = upstream.two_batch_overlap(server_args)
    if tbo is None:
        log_once(
            ("tbo-unknown", how),
            "cannot tell whether two-batch overlap is on (%s); "
            "exact host lengths, as upstream gives them under it",
            how,
        )
    caps = decide(
        fm.spec_algo,
        worker=worker,
        attn_backends=[BackendsDecision(bool(fm.needs_cpu_seq_lens))],
        two_batch_overlap=tbo,
    )
    for refused in caps.refused:
        log_once(("refused", refused), "override refused: %s", refused)
    return caps


class FusedRelay:
    """Per-FutureMap state: the pending publish, the launcher, the chosen variant.

    Why each step allocates its ``(n,)`` result rather than writing into a ring: it
    becomes ``batch.seq_lens``, which SGLang keeps well past the step (isolation
    snapshots pinned for two iterations in ``batch_record_buf``, ``result_queue``, an
    unscheduled ``running_batch`` that ``merge_batch`` reads after more resolves). Those
    readers are ordered by reference lifetime, not by a step count, so a ring of any fixed
    depth could be overwritten while still held. What is bound once is everything else.

    Why a consumed publish is kept one more step (``landed``): its tensors come from the
    forward stream and the launch that reads them runs on another. Holding them until the
    next resolve means the caching allocator can only reuse their blocks after the next
    forward was enqueued, and that forward waits for the schedule stream and so for the
    launch - what ``record_stream`` would give, without a call per tensor."""

    def __init__(self, future_map, caps: SpecCaps, *, debug: bool, ops=None):
        self.future_map_ref = weakref.ref(future_map)
        self.debug = debug
        buf = future_map.__dict__[BUF_ATTR]
        self.device = buf.device
        # CudaOps (or a test's stand-in); None off CUDA, where nothing below uses it:
        # every CUDA-only attribute is reached behind ``on_cuda``.
        self.ops: Any = ops_for(buf.device) if ops is None else ops
        self.on_cuda = self.ops is not None
        backend, _ = explain_relay_backend(buf.device)
        # Under Confidential Computing SGLang turns pinned memory off (host<->device
        # copies go through a bounce buffer; cudaMallocHost memory is UVM-managed): the
        # kernel's zero-copy host stores would fault or crawl there, so exact host
        # lengths are SGLang's (see :meth:`resolve`) and nothing is pinned.
        self.pinned_ok = not (self.on_cuda and confidential_compute())
        if not self.pinned_ok:
            log_once(
                "cc",
                "Confidential Computing (SGLang's own check): exact host lengths "
                "come from SGLang's resolve; the fused launch serves the GPU-only steps",
                level=logging.INFO,
            )
        # On CPU the lengths are host lengths already: a step needs their sum, no mirror.
        self.launcher = StepLauncher(
            buf,
            poison=debug,
            validate=debug,
            debug=debug,
            backend=backend,
            pinned=self.pinned_ok,
            mirror=self.on_cuda,
        )
        self.set_caps(caps)
        self.pending: Optional[tuple] = None  # (indices, values) not yet in the buffer
        self.landed: Optional[tuple] = None  # the last consumed publish (see the class doc)
        self.disabled_reason: Optional[str] = None
        # 0.5.23's FutureMap arms a consume-once flag on publish; 0.5.15's has none.
        self.consume_once_flag = "_publish_fresh" in future_map.__dict__
        # 0.5.23's FutureRelayBuffers (a captured verify graph scatters itself).
        self.has_relay_buffers = (
            hasattr(type(future_map), "_relay") or "_relay" in future_map.__dict__
        )
        self.relay_stream: Any = None
        self.done_event: Any = None
        self.relay_stream_ctx: Any = None
        self.capture_ready: Any = None  # publish_ready for a publish under graph capture
        self._vetted: set = set()  # caller streams known not to be the private stream
        if self.ops is not None:
            ops = self.ops
            self.relay_stream = ops.new_stream(set())
            self.done_event = ops.event()
            self.relay_stream_ctx = ops.stream_ctx(self.relay_stream)
            self.capture_ready = ops.external_event()
        self._bind_launch()
        live_relays.add(self)

    # ------------------------------------------------------------------ binding

    def set_caps(self, caps: SpecCaps) -> None:
        """Adopt (possibly newer) capabilities, e.g. the scheduler's, which know the worker."""
        self.caps = caps
        self.host_seq_lens = caps.host_seq_lens
        self.exact = caps.host_seq_lens == "exact"
        # An explicit "exact" - the worker's, or SPEC_FUSED_HOST_SEQ_LENS - stands even on
        # backends that opt out; any other "exact" goes where upstream's FutureMap gives
        # host lengths: its needs_cpu_seq_lens, read per step as upstream reads it.
        self.exact_claimed = self.exact and caps.host_source in ("worker", "env")
        self.variant = select_variant(caps)
        if self.exact and self.on_cuda and self.pinned_ok:
            self.launcher.ensure_host_ring()

    def gives_host_lengths(self, fm) -> bool:
        """Whether a resolve of ``fm`` hands the batch exact host lengths."""
        return self.exact_claimed or (self.exact and bool(fm.needs_cpu_seq_lens))

    def _bind_launch(self) -> None:
        self._launch = self.launcher.launch_checked if self.debug else self.launcher.launch

    @property
    def launches(self) -> int:
        return self.launcher.launches

    def rebind(self, buf: torch.Tensor) -> None:
        """FutureMap swapped its buffer (``_adopt_relay``): keep launching into the new one."""
        self.launcher.rebind(buf)
        self._bind_launch()

    def _fall_back(self, exc, gi, pi, pv, host: bool) -> torch.Tensor:
        """The kernel failed: log why once, switch this relay to the reference, retry."""
        if isinstance(exc, (InputError, InputTypeError)):
            # The caller's mistake, raised to the caller as upstream's own publish or
            # gather would; what can still land of the pending publish does.
            self.land_with_torch()
            raise exc
        raise_if_sticky(exc, self.step_name("launch"), logger)
        if isinstance(exc, NOT_A_BACKEND_FAILURE) or self.launcher.backend in ("reference", "null"):
            raise exc
        log_once(
            ("kernel", self.device.type, type(exc).__name__),
            "fused kernel failed on %s (%s: %s); falling back to the torch reference",
            self.device,
            type(exc).__name__,
            exc,
        )
        self.launcher.backend = "reference"
        self._bind_launch()
        return self._launch(gi, pi, pv, host)

    def step_name(self, what: str) -> str:
        """Which step a failure surfaced in, for the one line that names it."""
        fm = self.future_map_ref()
        algo = getattr(getattr(fm, "spec_algo", None), "name", "?")
        return (
            f"spec_fused's fused {what} (relay step {self.launcher.step}, {algo}, "
            f"{self.variant}, kernel: {self.launcher.backend}, device {self.device})"
        )

    def _check_streams(self, fm, cur) -> None:
        """Before the private stream first runs work for a caller's stream ``cur``: it
        must be none of the streams SGLang uses (``cur``, the first publish's, FutureMap's
        own D2H stream, and every caller stream seen before). Each caller stream is
        vetted once (a set lookup per step after that); a private stream that aliases one
        is replaced by a new draw, ordered after the old one."""
        ops = self.ops
        caller = ops.handle(cur)
        self._vetted.add(caller)
        avoid = set(self._vetted)
        d2h = getattr(fm, "fwd_prepare_d2h_stream", None) if fm is not None else None
        if d2h is not None:
            avoid.add(ops.handle(d2h))
        if self._publish_stream is not None:
            avoid.add(self._publish_stream)
        if ops.handle(self.relay_stream) in avoid:
            old = self.relay_stream
            self.relay_stream = ops.new_stream(avoid)
            self.relay_stream.wait_stream(old)
            self.relay_stream_ctx = ops.stream_ctx(self.relay_stream)

    _publish_stream: Optional[int] = None  # raw handle of the stream the first publish ran on

    # ------------------------------------------------------------------ FutureMap API

    def publish(self, fm, indices, new_seq_lens) -> None:
        if self.on_cuda:
            if self.ops.capturing():
                return self._publish_captured(fm, indices, new_seq_lens)
            if self._publish_stream is None:
                self._publish_stream = self.ops.handle(self.ops.current_stream())
        if self.pending is not None:  # two publishes without a resolve: keep their order
            self.land_pending()
        relay = fm._relay if self.has_relay_buffers else None
        if relay is not None and new_seq_lens is relay.published_seq_lens:
            relay.published_seq_lens = None  # a captured verify graph already scattered
        else:
            self.pending = (indices, new_seq_lens)
        event = fm.publish_ready  # as upstream: the event other readers gate on
        if event is None:
            event = fm.publish_ready = self._new_event()
        event.record()
        if self.consume_once_flag:
            fm._publish_fresh = True

    def _new_event(self):
        return self.ops.event() if self.on_cuda else torch.get_device_module(self.device).Event()

    def _publish_captured(self, fm, indices, new_seq_lens) -> None:
        """A publish made while a CUDA graph is captured lands at once, inside the
        capture, as upstream's scatter would: a deferred write would be made once, at
        capture time, and never at replay. A publish still pending from before the
        capture is landed first, outside it, on the private stream.

        ``publish_ready`` becomes an *external* event: recorded in the capture it is a
        node that records at every replay, and an eager ``wait()`` or ``synchronize()``
        after the capture is valid (an ordinary event recorded in a capture is a captured
        node: eager use may fail with ``cudaErrorCapturedEvent``, and replays would not
        re-record it). Without external events in the installed torch, or for a specialization
        this launcher has not launched before (nothing may compile inside a capture),
        the publish is SGLang's own. (SGLang 0.5.23 never publishes under capture.)"""
        if self.pending is not None:
            log_once(
                "capture-pending",
                "a publish pending when CUDA-graph capture began was landed outside the capture",
            )
            self.land_pending(fence=False)
        empty = self.launcher.buf[:0]
        ready = self.capture_ready
        if ready is None or not self.launcher.has_launched(empty, indices, new_seq_lens, False):
            log_once(
                ("capture-sglang", ready is None),
                "a publish under CUDA-graph capture is SGLang's own (%s)",
                "this torch has no external events"
                if ready is None
                else "its launch specialization was not compiled before the capture",
                level=logging.INFO,
            )
            raise HandToSGLang("publish under capture")
        try:
            self._launch(empty, indices, new_seq_lens, False)
        except Exception as exc:
            self._fall_back(exc, empty, indices, new_seq_lens, False)
        fm.publish_ready = ready
        ready.record()
        if self.consume_once_flag:
            fm._publish_fresh = True

    def resolve(self, fm, batch) -> None:
        spec = batch.spec_info
        fi = None if spec is None else spec.future_indices
        if fi is None:
            if self.pending is not None:  # no pending publish may outlive this step
                self.land_pending()
            return
        event = fm.publish_ready
        # gives_host_lengths(fm), inline: this is the per-step path
        exact = self.exact_claimed or (self.exact and fm.needs_cpu_seq_lens)
        if exact and self.on_cuda:
            gather = self._host_indices(batch, fi) if self.pinned_ok else None
            if gather is None or event is None:
                self._hand_back(event)
            if self.debug:
                self._consume_once(fm, event)
            return self._resolve_exact_cuda(fm, batch, gather, event)
        if self.debug:
            self._consume_once(fm, event)
        if event is not None:
            event.wait()  # as upstream, on every device: the stream waits, not the host
        pending = self.pending
        pi, pv = pending or (None, None)
        try:
            out = self._launch(fi, pi, pv, False)
        except Exception as exc:
            out = self._fall_back(exc, fi, pi, pv, False)
        self.landed, self.pending = pending, None
        batch.seq_lens = out
        if not exact:
            batch.seq_lens_cpu = None
            batch.seq_lens_sum = None
        else:
            # Here ``exact`` means a CPU relay: the device is the host, so the lengths
            # are the host lengths - as upstream's ``batch.seq_lens.cpu()``, the same
            # tensor. A few ints sum faster in Python than through a torch op.
            batch.seq_lens_cpu = out
            batch.seq_lens_sum = (
                sum(out.tolist()) if out.shape[0] <= _PY_SUM_MAX else int(out.sum())
            )

    def _consume_once(self, fm, event) -> None:
        """Upstream's consume-once check (0.5.16+, under its debug switch)."""
        if self.consume_once_flag and event is not None:
            assert fm._publish_fresh, "resolve without a fresh forward publish"
            fm._publish_fresh = False

    def _hand_back(self, event) -> NoReturn:
        """An exact step the private stream cannot gate on ``publish_ready`` alone is
        SGLang's: with no pinned host indices (the device ones were staged on the
        schedule stream, which sits behind the WAR barrier - for EAGLE, the whole
        forward), with no publish yet, or under Confidential Computing. What is pending
        lands first, gated on ``publish_ready`` only; SGLang's resolve then waits for
        ``publish_ready``, as upstream does - never for the forward's reads."""
        why = (
            "Confidential Computing"
            if not self.pinned_ok
            else "no publish yet"
            if event is None
            else "the batch has no host indices matching future_indices"
        )
        self.land_pending()
        if self.pinned_ok:  # under CC the relay said so once, when it was made
            log_once(
                ("hand-back", why),
                "exact host lengths with %s: SGLang's own resolve runs such steps",
                why,
                level=logging.INFO,
            )
        raise HandToSGLang(why)

    def _resolve_exact_cuda(self, fm, batch, gather, event) -> None:
        """A private stream gated on ``publish_ready`` only runs the launch, which reads
        the pinned host indices ``gather`` and writes ``bs + 1`` values into the pinned
        ring; the caller's stream waits for it on the device and the host waits for its
        event only."""
        cur = self.ops.current_stream()
        if self.ops.handle(cur) not in self._vetted:
            self._check_streams(fm, cur)
        stream = self.relay_stream
        stream.wait_event(event)
        pending = self.pending
        pi, pv = pending or (None, None)
        try:
            with self.relay_stream_ctx:
                # Allocated on the stream that writes it; the caller's stream uses it
                # after waiting for ``done_event``; the allocator learns that from
                # record_stream.
                try:
                    out = self._launch(gather, pi, pv, True)
                except Exception as exc:
                    out = self._fall_back(exc, gather, pi, pv, True)
                finally:  # also when bad input raises: what was written is ordered
                    self.done_event.record(stream)
        finally:
            cur.wait_event(self.done_event)
        self.landed, self.pending = pending, None
        self.ops.record_stream(out, cur)
        wait = self.done_event.synchronize
        wait()  # the host waits for this launch only
        batch.seq_lens = out
        if out.numel():
            batch.seq_lens_cpu, batch.seq_lens_sum = self._read_host(self.launcher.stamp, out, wait)
        else:
            batch.seq_lens_cpu, batch.seq_lens_sum = torch.empty(0, dtype=torch.int64), 0

    def _read_host(self, stamp, out, wait):
        try:
            return self.launcher.read_row(stamp, out.shape[0], wait=wait)
        except StaleHostMirrorError as exc:
            if self.debug:
                raise
            # Release: never an older step's lengths. Read this step's from the device.
            log_once(("stale", exc.cause), "%s; reading this step's lengths from the device", exc)
            lens = out.cpu()
            return lens, int(lens.sum())

    def _host_indices(self, batch, fi) -> Optional[torch.Tensor]:
        """``fi`` as a pinned host tensor the kernel reads zero-copy, from the host indices
        the batch carries (upstream's FIXME: fi == req_pool_indices). Gathering from these
        lets the launch wait for the publish only, not for the schedule stream, which
        already holds the WAR barrier on the previous forward (for EAGLE, all of it)."""
        host = getattr(batch, "req_pool_indices_cpu", None)
        if (
            not isinstance(host, torch.Tensor)
            or host.device.type != "cpu"
            or host.dim() != 1
            or host.shape[0] != fi.shape[0]
            or host.is_floating_point()
        ):
            return None
        # Safe to overwrite: the host waited for the previous launch that read it.
        view = self.launcher.stage_host_indices(host)
        if self.debug and not torch.equal(view, fi.cpu()):
            raise AssertionError("batch.req_pool_indices_cpu differs from future_indices")
        return view

    # ------------------------------------------------------------------ other readers

    def land_pending(self, fence: bool = True) -> None:
        """Land a pending publish now, as a publish-only launch.

        On CUDA it runs on the private stream gated on ``publish_ready`` only, and
        ``publish_ready`` is re-recorded right after it, so whoever gates on the event
        (SGLang's ``resolve_mixed_spec_tails``, which blocks the host on it; the next
        resolve) waits for the forward's publish point plus this launch - never for the
        schedule stream, which sits behind the WAR barrier (for EAGLE, the whole
        forward). ``fence``: the caller's stream waits for the landed write too (it is
        about to read the buffer, or to publish over it)."""
        if self.pending is None:
            return
        indices, values = self.pending
        empty = self.launcher.buf[:0]
        if not self.on_cuda:
            try:
                self._launch(empty, indices, values, False)
            except Exception as exc:
                self._fall_back(exc, empty, indices, values, False)
            self.pending = None
            return
        fm = self.future_map_ref()
        cur = self.ops.current_stream()
        if self.ops.handle(cur) not in self._vetted:
            self._check_streams(fm, cur)
        stream = self.relay_stream
        event = None if fm is None else fm.publish_ready
        if event is not None:
            stream.wait_event(event)
        else:
            stream.wait_stream(cur)
        for t in (indices, values):  # read on the private stream: keep them alive
            self.ops.record_stream(t, stream)
        try:
            with self.relay_stream_ctx:
                try:
                    self._launch(empty, indices, values, False)
                except Exception as exc:
                    self._fall_back(exc, empty, indices, values, False)
                finally:
                    self.pending = None
                    self._mark_landed(fm, stream)
        finally:
            if fence:
                self.fence_current_stream()

    def _mark_landed(self, fm, stream) -> None:
        """A deferred publish just landed on ``stream``: re-record ``publish_ready``
        there, so whoever gates on it waits for this write, not only the original
        publish."""
        if fm is None:
            return
        if fm.publish_ready is None:
            fm.publish_ready = self.ops.event()
        fm.publish_ready.record(stream)

    def land_with_torch(self) -> None:
        """Land a pending publish with plain torch (what upstream's publish does at once),
        or, if it cannot land (it is itself the bad input), drop it: either way nothing
        of it is left to fail again."""
        if self.pending is None:
            return
        indices, values = self.pending
        try:
            try:
                # Fence while ``pending`` still names the publish: the caller's stream,
                # which writes from its forward-stream tensors, is record_stream'd on them.
                self.fence_current_stream()
            finally:
                self.pending = None
            self.launcher.buf[indices.long()] = values.to(self.launcher.buf.dtype)
            fm = self.future_map_ref()
            if self.on_cuda and fm is not None and fm.publish_ready is not None:
                fm.publish_ready.record()
        except Exception as exc:
            raise_if_sticky(exc, self.step_name("landing of a pending publish"), logger)
            log_once(
                ("unlandable", type(exc).__name__),
                "a publish that cannot land was dropped (%s: %s)",
                type(exc).__name__,
                exc,
            )

    def fence_current_stream(self) -> None:
        """Order the caller's stream after ``publish_ready`` on the device (no host wait),
        and keep a pending publish's tensors alive until that stream has used them."""
        if not self.on_cuda:
            return
        cur = self.ops.current_stream()
        fm = self.future_map_ref()
        if fm is not None and fm.publish_ready is not None:
            cur.wait_event(fm.publish_ready)
        for t in self.pending or ():
            if t is not None:
                self.ops.record_stream(t, cur)


def not_relayed_on(device) -> Optional[str]:
    """Why the relay does not engage on ``device`` (SGLang's own path runs), or None: a
    device it does not run on, or one whose start-up canary faulted in its child."""
    why = unsupported_device(device)
    if why is None:
        proven = verdict_for(device)
        if proven is not None and proven.refused:
            why = f"{proven.device}: {proven.notes[0]}"
    return why


def relay_for(fm) -> Optional[FusedRelay]:
    """The relay of ``fm``, made on first use; None where SGLang's own path must run."""
    d = fm.__dict__
    if RELAY_ATTR in d:
        return d[RELAY_ATTR]
    d[RELAY_ATTR] = None  # decided once per FutureMap
    try:
        if not fm.spec_algo.is_some():
            return None
        if getattr(fm, "needs_confidence_relay", False):
            log_once(
                "confidence",
                "the confidence relay (DSPARK ragged verify) gates its own "
                "D2H on publish_ready; SGLang's relay runs for this FutureMap",
                level=logging.INFO,
            )
            return None
        for attr in (BUF_ATTR, "needs_cpu_seq_lens", "publish_ready", "spec_algo"):
            if not hasattr(fm, attr):
                raise AttributeError(f"FutureMap has no attribute {attr!r}")
        unsupported = not_relayed_on(d[BUF_ATTR].device)
        if unsupported is not None:
            log_once(
                ("device", unsupported), "not relaying on %s; SGLang's relay runs", unsupported
            )
            return None
        caps = d.get(CAPS_ATTR) or future_map_caps(fm)
        debug = debug_enabled()
        relay = FusedRelay(fm, caps, debug=debug)
    except KeyError as exc:
        log_once(("caps", str(fm.spec_algo)), "%s; SGLang's relay runs", str(exc).strip('"'))
        return None
    except Exception as exc:
        raise_if_sticky(exc, "spec_fused's relay set-up for a FutureMap", logger)
        log_once(
            ("init", type(exc).__name__, str(exc)),
            "cannot relay this FutureMap (%s: %s); SGLang's relay runs",
            type(exc).__name__,
            exc,
        )
        return None
    if debug and not sglang_tracks_seq_lens() and getattr(fm, "_relay", None) is None:
        d[BUF_ATTR].fill_(-1)  # poisoned init, as upstream's debug mode
    d[RELAY_ATTR] = relay
    _warn_ignored_force_backend(relay)
    log_once(
        ("variant", relay.variant, relay.host_seq_lens, str(relay.device)),
        "relaying %s lengths with the fused %s variant (host lengths: %s, kernel: %s)",
        getattr(fm.spec_algo, "name", fm.spec_algo),
        relay.variant,
        relay.host_seq_lens,
        relay.launcher.backend,
        level=logging.INFO,
    )
    return relay


def _warn_ignored_force_backend(relay: FusedRelay) -> None:
    if ignored_force_backend() is None:
        return
    _, why = explain_relay_backend(relay.device)
    log_once(("force-backend", why), "%s", why)
