"""The fused length relay that stands in for ``FutureMap.publish`` + ``resolve_seq_lens_cpu``.

``publish`` only remembers what to write (and records ``publish_ready``, as upstream);
``resolve`` issues ONE launch that publishes, gathers and sums:

* no host lengths (``needs_cpu_seq_lens`` off): the caller's stream waits for
  ``publish_ready`` on the device and the launch runs there, as upstream's GPU-only path.
* exact host lengths: a private stream gated on ``publish_ready`` only - as upstream's
  own copy stream is - takes the batch's host indices up, launches, and brings the row
  ``[*lens, sum]`` down: ``8·(n + 1)`` bytes instead of upstream's ``8·pool``. The host
  waits for that stream alone, never for the schedule stream's WAR barrier (past the
  publish in 0.5.15-0.5.18, and for EAGLE in 0.5.23): the device ``future_indices`` a
  filtered batch makes there are never read.

A publish still pending when anything else reads ``new_seq_lens_buf`` lands first
(:meth:`FusedRelay.land_pending`). A failing kernel steps down to the torch reference; a
failing reference hands the FutureMap back to SGLang; a sticky device fault escapes
(:func:`step_failed`). What no GPU run measured level with SGLang's is SGLang's own
(:mod:`spec_fused.measured`). Every CUDA call goes through :mod:`spec_fused.cuda_ops`.
"""

from __future__ import annotations

import logging
import weakref
from typing import Any, NoReturn, Optional

import torch

from spec_fused.caps import SpecCaps, decide
from spec_fused.cuda_ops import ops_for, unsupported_device
from spec_fused.faults import raise_if_sticky, step_failed
from spec_fused.kernels.backend import explain_relay_backend, ignored_force_backend
from spec_fused.kernels.checks import InputError, InputTypeError
from spec_fused.kernels.step_launcher import StepLauncher
from spec_fused.log import log_once
from spec_fused.measured import handed_to_sglang
from spec_fused.upstream import confidential_compute, debug_enabled, sglang_tracks_seq_lens

logger = logging.getLogger("spec_fused")

RELAY_ATTR = "_spec_fused_relay"  # the live relay, or None where SGLang's path runs
DISABLED_ATTR = "_spec_fused_disabled"  # a relay handed back to SGLang, kept for inspection
CAPS_ATTR = "_spec_fused_caps"  # set by the scheduler patch, which knows the worker
BUF_ATTR = "new_seq_lens_buf"
live_relays: weakref.WeakSet[FusedRelay] = weakref.WeakSet()  # remove() lands what is pending
# A CPU relay's seq_lens_sum: up to this many, sum(tolist()) beats torch's (0.3-0.5 µs
# against 1.5 µs on the project's 2-core CPU).
_PY_SUM_MAX = 64
_NO_HOST_INDICES = "no host indices matching future_indices"


class HandToSGLang(Exception):
    """This step is SGLang's: what was pending has landed; SGLang's own method runs it."""


def future_map_caps(fm, *, worker=None, host_bound=None) -> SpecCaps:
    """The production decision for ``fm`` (with the worker and what the scheduler found of
    its host bound, when it knows them); refused overrides are logged once each."""
    ncsl = bool(fm.needs_cpu_seq_lens)
    caps = decide(fm.spec_algo, worker=worker, needs_cpu_seq_lens=ncsl, host_bound=host_bound)
    for refused in caps.refused:
        log_once(("refused", refused), "override refused: %s", refused)
    return caps


def gives_host_lengths(caps: SpecCaps, fm) -> bool:
    """Exact host lengths: where upstream gives them (``needs_cpu_seq_lens``), or claimed
    outright. (``FusedRelay.resolve`` inlines this on the per-step path.)"""
    return caps.exact_claimed or (caps.host_seq_lens == "exact" and bool(fm.needs_cpu_seq_lens))


def kept_by_sglang(caps: SpecCaps, fm) -> Optional[str]:
    """Why SGLang's relay keeps ``fm`` under ``caps`` (``measured.py``), logged once."""
    exact, bound = gives_host_lengths(caps, fm), caps.bound is not None  # bound: reserved
    why = handed_to_sglang(fm.__dict__[BUF_ATTR].device, exact, bound=bound)
    if why is not None:
        log_once(("unmeasured", why), "%s: SGLang's relay runs", why, level=logging.INFO)
    return why


class FusedRelay:
    """Per-FutureMap state: the pending publish, the launcher, the chosen variant. A
    consumed publish is held one more step (``landed``): read on another stream, its
    tensors must outlive the next forward (which waits for that launch)."""

    def __init__(self, future_map, caps: SpecCaps, *, debug: bool, ops=None):
        self.future_map_ref = weakref.ref(future_map)
        self.debug = debug
        buf = future_map.__dict__[BUF_ATTR]
        self.device = buf.device
        self.ops: Any = ops_for(buf.device) if ops is None else ops  # None off CUDA
        self.on_cuda = self.ops is not None
        self.launcher = StepLauncher(
            buf,
            poison=debug,
            validate=debug,
            backend=explain_relay_backend(buf.device)[0],
            # Under Confidential Computing SGLang stages host copies in pageable memory
            # (``is_pin_memory_available``); the relay's two small copies do too.
            pinned=not (self.on_cuda and confidential_compute()),
        )
        self.pending: Optional[tuple] = None  # (indices, values) not yet in the buffer
        self.landed: Optional[tuple] = None  # the last consumed publish (see above)
        self.disabled_reason: Optional[str] = None
        self.consume_once_flag = "_publish_fresh" in future_map.__dict__  # 0.5.16+
        self.has_relay_buffers = "_relay" in dir(future_map)  # 0.5.23's FutureRelayBuffers
        if self.ops is not None:
            self.relay_stream = self.ops.new_stream()
            self.relay_stream_ctx = self.ops.stream_ctx(self.relay_stream)
            self.done_event = self.ops.event()
        self._adopt(caps)
        live_relays.add(self)

    def _adopt(self, caps: SpecCaps) -> None:
        self.caps = caps
        self.exact_claimed = caps.exact_claimed  # read every step
        self.host_seq_lens = caps.host_seq_lens
        self.exact = caps.host_seq_lens == "exact"
        self.variant = caps.variant
        self.bound = caps.bound  # a worker's own bound (host lengths reserved), per step
        if self.bound is not None:
            self.bound.arm()

    def set_caps(self, caps: SpecCaps) -> None:
        """Adopt newer capabilities (the scheduler's, which know the worker); where they
        make a configuration no GPU measured level, SGLang's relay takes the FutureMap."""
        self._adopt(caps)
        fm = self.future_map_ref()
        if fm is not None and fm.__dict__.get(RELAY_ATTR) is self:
            if (why := kept_by_sglang(caps, fm)) is not None:
                self.retire(fm, why)

    def retire(self, fm, reason: str) -> None:
        """Hand ``fm`` back to SGLang for good: what is pending lands with plain torch (what
        upstream's publish does), then SGLang's own methods run."""
        self.land_with_torch()
        if self.bound is not None:  # SGLang's resolves give exact lengths from now on
            self.bound.expect(None)
        self.disabled_reason = reason
        fm.__dict__[RELAY_ATTR] = None
        fm.__dict__[DISABLED_ATTR] = self

    def step_name(self, what: str) -> str:
        """Which step a failure surfaced in, for the one line that names it."""
        algo = getattr(getattr(self.future_map_ref(), "spec_algo", None), "name", "?")
        return (
            f"spec_fused's fused {what} (relay step {self.launcher.step}, {algo}, "
            f"{self.variant}, kernel: {self.launcher.backend}, device {self.device})"
        )

    def _launch(self, gi, pi, pv, row: bool) -> torch.Tensor:
        """One step's launch; a backend that fails steps down to the reference, once."""
        try:
            return self.launcher.launch(gi, pi, pv, row)
        except Exception as exc:
            return self._step_down(exc, gi, pi, pv, row)

    def _step_down(self, exc, gi, pi, pv, row: bool) -> torch.Tensor:
        """A launch raised: the caller's error and a sticky fault are raised; a backend that
        failed steps down to the reference, once, and the step is launched again there."""
        if isinstance(exc, (InputError, InputTypeError)):
            self.land_with_torch()  # what can still land of the pending publish does
        step_failed(exc, self.step_name("launch"))
        if self.launcher.backend in ("reference", "null"):
            raise exc
        log_once(
            ("kernel", self.device.type, type(exc).__name__),
            "fused kernel failed on %s (%s: %s); falling back to the torch reference",
            self.device,
            type(exc).__name__,
            exc,
        )
        self.launcher.backend = "reference"
        return self.launcher.launch(gi, pi, pv, row)

    def publish(self, fm, indices, new_seq_lens) -> None:
        if self.on_cuda and self.ops.capturing():
            # SGLang (<= 0.5.23) never publishes under capture; if one does, a deferred
            # write would be made once, at capture, never at replay: SGLang's own publish.
            self.land_pending(fence=False)
            raise HandToSGLang("publish under CUDA-graph capture")
        if self.pending is not None:  # two publishes without a resolve: keep their order
            self.land_pending()
        relay = fm._relay if self.has_relay_buffers else None
        if relay is not None and new_seq_lens is relay.published_seq_lens:
            relay.published_seq_lens = None  # a captured verify graph already scattered
        else:
            self.pending = (indices, new_seq_lens)
        if fm.publish_ready is None:  # as upstream: the event other readers gate on
            module = self.ops if self.on_cuda else torch.get_device_module(self.device)
            fm.publish_ready = module.event() if self.on_cuda else module.Event()
        fm.publish_ready.record()
        if self.consume_once_flag:
            fm._publish_fresh = True

    def resolve(self, fm, batch) -> None:
        if self.bound is not None:  # no plan of this step is the bound's until it is launched
            self.bound.expect(None)
        spec = batch.spec_info
        fi = None if spec is None else spec.future_indices
        if fi is None:
            self.land_pending()  # no pending publish may outlive this step
            return
        event = fm.publish_ready
        exact = self.exact_claimed or (self.exact and fm.needs_cpu_seq_lens)
        committed = None  # with a bound: the host's committed lengths, the step's floor
        if self.bound is not None and (committed := self.bound.floor(batch, fi.shape[0])) is None:
            self._hand_back("a step the worker's host bound does not cover", "")
        if exact and self.on_cuda:
            host = getattr(batch, "req_pool_indices_cpu", None)  # upstream's FIXME: == fi
            staged = self.launcher.stage_host_indices(host, fi)
            if staged is None or event is None:
                self._hand_back("no publish yet" if event is None else _NO_HOST_INDICES)
            if self.debug:
                _consume_once(fm, event, self.consume_once_flag)
            return self._resolve_exact_cuda(batch, staged, event)
        if self.debug:
            _consume_once(fm, event, self.consume_once_flag)
        if event is not None:
            event.wait()  # as upstream, on every device: the stream waits, not the host
        pending = self.pending
        pi, pv = pending or (None, None)
        try:  # self._launch, inline: this is the per-step path
            out = self.launcher.launch(fi, pi, pv, False)
        except Exception as exc:
            out = self._step_down(exc, fi, pi, pv, False)
        self.landed, self.pending = pending, None
        batch.seq_lens = out
        if not exact:
            batch.seq_lens_cpu = batch.seq_lens_sum = None
            if self.bound is not None:  # its plans: their floor, and how to read exact lengths
                read = self.ops.read_later(out) if self.on_cuda else lambda: out
                self.bound.launched(batch, committed, out, read, debug=self.debug)
        else:  # a CPU relay: the lengths are the host lengths, as upstream's .cpu()
            batch.seq_lens_cpu = out
            n = out.shape[0]
            batch.seq_lens_sum = sum(out.tolist()) if n <= _PY_SUM_MAX else int(out.sum())

    def _hand_back(self, why: str, kind: str = "exact host lengths with ") -> NoReturn:
        """A step the relay does not run is SGLang's (an exact step the private stream
        cannot gate on ``publish_ready`` alone; one a host bound does not cover): the
        pending publish lands first, then SGLang's resolve runs, as shipped."""
        self.land_pending()
        msg = "%s%s: SGLang's own resolve runs such steps"
        log_once(("hand-back", why), msg, kind, why, level=logging.INFO)
        raise HandToSGLang(why)

    def _resolve_exact_cuda(self, batch, staged, event) -> None:
        """The private stream: host indices up, the wait for ``publish_ready`` alone, the
        launch, the row ``[*lens, sum]`` down; the host waits for that stream, so all it
        wrote is done when the host returns and no other stream waits. The upload precedes
        the wait: it carries host indices, nothing the forward writes (safe: test_stream_order)."""
        launcher, stream, pending = self.launcher, self.relay_stream, self.pending
        pi, pv = pending or (None, None)
        try:
            with self.relay_stream_ctx:
                gi = launcher.upload_host_indices(staged)
                stream.wait_event(event)
                out = self._launch(gi, pi, pv, True)
                launcher.row_to_host(out)
        finally:  # also when a launch raised: nothing it enqueued outlives the step
            self.done_event.record(stream)
            self.done_event.synchronize()
        self.landed, self.pending = pending, None
        self.ops.record_stream(out, self.ops.current_stream())  # made on the private stream
        n = staged.shape[0]
        batch.seq_lens = out[:n]
        batch.seq_lens_cpu, batch.seq_lens_sum = launcher.host_lengths(n)

    def land_pending(self, fence: bool = True) -> None:
        """Land a pending publish now, as a publish-only launch. On CUDA it runs on the
        private stream gated on ``publish_ready`` only, re-recorded right after it: whoever
        gates on the event (``resolve_mixed_spec_tails``, the next resolve) waits for the
        publish point plus this launch, never for the schedule stream. ``fence``: the
        caller's stream waits for the landed write too."""
        if self.pending is None:
            return
        indices, values = self.pending
        if self.on_cuda:
            fm, stream = self.future_map_ref(), self.relay_stream
            if fm is not None and fm.publish_ready is not None:
                stream.wait_event(fm.publish_ready)
            else:
                stream.wait_stream(self.ops.current_stream())
            for t in self.pending:  # read on the private stream: keep them alive
                self.ops.record_stream(t, stream)
            with self.relay_stream_ctx:
                self._launch(self.launcher.buf[:0], indices, values, False)
                if fm is not None:
                    fm.publish_ready = fm.publish_ready or self.ops.event()
                    fm.publish_ready.record(stream)
            if fence:
                self.fence_current_stream()
        else:
            self._launch(self.launcher.buf[:0], indices, values, False)
        self.pending = None  # only once it landed: a failure leaves it to land_with_torch

    def land_with_torch(self) -> None:
        """Land a pending publish with plain torch (what upstream's publish does at once),
        or drop it if it cannot land (it is itself the bad input)."""
        if self.pending is None:
            return
        indices, values = self.pending
        self.pending = None
        try:
            self.fence_current_stream(indices, values)
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

    def fence_current_stream(self, *tensors) -> None:
        """Order the caller's stream after ``publish_ready`` on the device (no host wait),
        keeping ``tensors`` alive until that stream has used them."""
        if not self.on_cuda:
            return
        cur = self.ops.current_stream()
        fm = self.future_map_ref()
        if fm is not None and fm.publish_ready is not None:
            cur.wait_event(fm.publish_ready)
        for t in tensors:
            self.ops.record_stream(t, cur)


def _consume_once(fm, event, flag: bool) -> None:
    """Upstream's consume-once check (0.5.16+, under its debug switch)."""
    if flag and event is not None:
        assert fm._publish_fresh, "resolve without a fresh forward publish"
        fm._publish_fresh = False


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
                "the confidence relay (DSPARK ragged verify) gates its own D2H on "
                "publish_ready; SGLang's relay runs for this FutureMap",
                level=logging.INFO,
            )
            return None
        for attr in (BUF_ATTR, "needs_cpu_seq_lens", "publish_ready", "spec_algo"):
            if not hasattr(fm, attr):
                raise AttributeError(f"FutureMap has no attribute {attr!r}")
        unsupported = unsupported_device(d[BUF_ATTR].device)
        if unsupported is not None:
            log_once(
                ("device", unsupported), "not relaying on %s; SGLang's relay runs", unsupported
            )
            return None
        caps = d.get(CAPS_ATTR) or future_map_caps(fm)
        if kept_by_sglang(caps, fm) is not None:
            return None
        debug = debug_enabled()
        relay = FusedRelay(fm, caps, debug=debug)
    except KeyError as exc:  # an algorithm without capabilities
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
    ignored = ignored_force_backend()
    if ignored is not None:
        log_once(("force-backend", ignored), "%s", ignored)
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
