"""The scheduler's WAR barrier: upstream's platform gate AND the algorithm's need.

Why its own module: the barrier is the one scheduler-wide decision the capability model
changes, and it is patched on another module (``sglang.srt.managers.scheduler``), when
that is imported, never by importing it. ``Scheduler.run_event_loop`` sets
``_war_barrier_enabled`` to upstream's gate (CUDA or ``SGLANG_ENABLE_WAR_BARRIER``); the
property here keeps the gate and ANDs it with ``needs_war_barrier`` for the scheduler's
own FutureMap and worker. A scheduler whose barrier code was not tested keeps SGLang's.
"""

from __future__ import annotations

import logging

from spec_fused import relay as _relay
from spec_fused.faults import raise_if_sticky
from spec_fused.integration import code_check, flashinfer_plan
from spec_fused.integration.hooks import PatchSet

logger = logging.getLogger("spec_fused")

__all__ = ["patch"]


def _scheduler_caps(sched):
    """The production decision for this scheduler's FutureMap, with its worker
    (``draft_worker``, whose own declaration counts). None where the relay does not
    engage (no speculation, a device it does not run on): SGLang's barrier then stays."""
    algorithm = getattr(sched, "spec_algorithm", None)
    if algorithm is None or not algorithm.is_some():
        return None
    future_map = getattr(sched, "future_map", None)
    if future_map is None:
        raise AttributeError("the scheduler has no future_map")
    buf = future_map.__dict__.get(_relay.BUF_ATTR)
    if buf is not None and _relay.unsupported_device(buf.device) is not None:
        return None
    worker = getattr(sched, "draft_worker", None)
    bound = flashinfer_plan.host_bound(sched) if future_map.needs_cpu_seq_lens else None
    caps = _relay.future_map_caps(future_map, worker=worker, host_bound=bound)
    future_map.__dict__[_relay.CAPS_ATTR] = caps
    relay = future_map.__dict__.get(_relay.RELAY_ATTR)
    if relay is not None:  # made before the scheduler knew its worker: update it
        relay.set_caps(caps)
    return caps


def _war_barrier_property():
    """``Scheduler._war_barrier_enabled`` = upstream's platform gate (set by
    ``run_event_loop``: CUDA or SGLANG_ENABLE_WAR_BARRIER) AND the algorithm's need."""
    key = "_spec_fused_war_barrier"

    def getter(self):
        d = self.__dict__
        if key in d:
            return d[key]
        if "_war_barrier_enabled" in d:
            return d["_war_barrier_enabled"]
        raise AttributeError("_war_barrier_enabled")

    def setter(self, platform_gate):
        self.__dict__["_war_barrier_enabled"] = platform_gate
        try:
            caps = _scheduler_caps(self)
        except Exception as exc:
            raise_if_sticky(exc, "spec_fused's WAR-barrier decision (scheduler set-up)", logger)
            _relay.log_once(
                ("war-caps", type(exc).__name__),
                "no capabilities for the WAR barrier decision (%s); keeping SGLang's",
                str(exc).strip('"'),
            )
            caps = None
        if caps is None:
            self.__dict__.pop(key, None)
            return
        self.__dict__[key] = bool(platform_gate) and caps.needs_war_barrier
        if platform_gate and not caps.needs_war_barrier:
            _relay.log_once(
                ("war-off", str(self.spec_algorithm)),
                "WAR barrier off for %s (%s)",
                getattr(self.spec_algorithm, "name", self.spec_algorithm),
                caps.reason,
                level=logging.WARNING,
            )

    return property(getter, setter)


def patch(patches: PatchSet, module, version: str) -> None:
    scheduler = getattr(module, "Scheduler", None)
    if not isinstance(scheduler, type) or "_apply_war_barrier" not in scheduler.__dict__:
        _relay.log_once(
            "no-war",
            "%s.Scheduler has no _apply_war_barrier; the WAR barrier stays as SGLang decides it",
            module.__name__,
        )
        return
    if code_check.patchable(module, version, "the WAR barrier stays as SGLang decides it") is None:
        return
    patches.set_attr(scheduler, "_war_barrier_enabled", _war_barrier_property())
