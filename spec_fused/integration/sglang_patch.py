"""Load the fused relay into SGLang at startup, through SGLang's own plugin entry point.

``pip install spec_fused`` registers :func:`register` under ``sglang.srt.plugins``; SGLang's
``load_plugins()`` calls it in the engine and in every scheduler process (each TP/DP rank).
It patches, reversibly:

* ``FutureMap.publish`` / ``resolve_seq_lens_cpu`` - the fused one-launch relay
  (:mod:`spec_fused.relay`), variant chosen per FutureMap from :mod:`spec_fused.caps`;
* ``FutureMap.resolve_mixed_spec_tails`` and the ``new_seq_lens_buf`` attribute - every
  other reader lands a pending publish first, so it keeps seeing published values;
* ``Scheduler._war_barrier_enabled`` - upstream's platform gate AND the algorithm's
  ``needs_war_barrier`` capability, patched when ``sglang.srt.managers.scheduler`` is (or
  gets) imported, never by importing it.

``SPEC_FUSED_DISABLE=1`` (or leaving ``spec_fused`` out of ``SGLANG_PLUGINS``) keeps SGLang
exactly as shipped: the A side of every A/B. Anything unrecognised - version, class,
method signature - makes :func:`apply` raise :class:`UnsupportedSGLangError` having
patched nothing, and :func:`register` log that in one line and leave SGLang as it is.
"""

from __future__ import annotations

import inspect
import logging
import os
from dataclasses import dataclass, field
from typing import Optional

from spec_fused import relay as _relay
from spec_fused.caps import caps_for, establish
from spec_fused.integration.hooks import PatchSet
from spec_fused.releases import TESTED_RELEASES, support_status

logger = logging.getLogger("spec_fused")

PLUGIN_NAME = "spec_fused"
ENV_DISABLE = "SPEC_FUSED_DISABLE"
ENV_ALLOW_UNTESTED = "SPEC_FUSED_ALLOW_UNTESTED"
OVERLAP_UTILS = "sglang.srt.managers.overlap_utils"
SCHEDULER = "sglang.srt.managers.scheduler"

__all__ = ["PatchReport", "UnsupportedSGLangError", "apply", "check_supported", "disabled_by",
           "is_applied", "register", "remove"]


class UnsupportedSGLangError(RuntimeError):
    """The installed SGLang is not one spec_fused knows how to patch; nothing was patched."""


@dataclass
class PatchReport:
    applied: bool
    sglang_version: Optional[str]
    patched: list = field(default_factory=list)
    deferred: list = field(default_factory=list)  # patched when their module is imported
    reason: str = ""
    warning: str = ""  # set when the SGLang release is not a tested one


_patches: Optional[PatchSet] = None
_report: Optional[PatchReport] = None


def disabled_by(env=None) -> Optional[str]:
    """The ``SPEC_FUSED_DISABLE`` setting that turns the plugin off, or None when it is on.
    Unset, "", "0", "false", "no" and "off" leave it on; any other value turns it off."""
    raw = (os.environ if env is None else env).get(ENV_DISABLE, "")
    return None if raw.strip().lower() in ("", "0", "false", "no", "off") else raw


def _sglang_version() -> Optional[str]:
    try:
        from importlib.metadata import version

        return version("sglang")
    except Exception:
        try:
            import sglang

            return getattr(sglang, "__version__", None)
        except Exception:
            return None


def _require_params(version, owner, name, params):
    fn = owner.__dict__.get(name)
    if fn is None or not callable(fn):
        raise UnsupportedSGLangError(
            f"SGLang {version}: {owner.__name__}.{name} is missing; spec_fused supports the "
            f"FutureMap API of SGLang {_range_text()}")
    try:
        names = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError) as exc:
        raise UnsupportedSGLangError(
            f"SGLang {version}: cannot read the signature of {owner.__name__}.{name}") from exc
    if names[: len(params)] != list(params):
        raise UnsupportedSGLangError(
            f"SGLang {version}: {owner.__name__}.{name}{tuple(names)} does not start with "
            f"{tuple(params)}; spec_fused supports the API of SGLang {_range_text()}")
    return names


def _range_text() -> str:
    return f"{TESTED_RELEASES[0]} to {TESTED_RELEASES[-1]}"


def check_supported(overlap_utils=None) -> str:
    """Return the SGLang version if spec_fused can patch it, else raise
    :class:`UnsupportedSGLangError` naming the version and what is missing.

    The version must be a tested release (:mod:`spec_fused.releases`), or a newer patch
    release of the newest tested one (which :func:`apply` runs with a one-line warning),
    or - with ``SPEC_FUSED_ALLOW_UNTESTED=1`` - any other release from the oldest tested
    one on. Whatever the version, the API probe below (the parameters and attributes the
    patch touches) must pass."""
    version = _sglang_version()
    if version is None:
        raise UnsupportedSGLangError("SGLang is not installed")
    status = support_status(version)
    if not status.runs_by_default:
        allowed = status.kind == "untested" and os.environ.get(ENV_ALLOW_UNTESTED) == "1"
        if not allowed:
            raise UnsupportedSGLangError(status.message)
    if overlap_utils is None:
        try:
            import importlib

            overlap_utils = importlib.import_module(OVERLAP_UTILS)
        except Exception as exc:
            raise UnsupportedSGLangError(
                f"SGLang {version}: cannot import {OVERLAP_UTILS} ({type(exc).__name__}: {exc})"
            ) from exc
    future_map = getattr(overlap_utils, "FutureMap", None)
    if not isinstance(future_map, type):
        raise UnsupportedSGLangError(f"SGLang {version}: {OVERLAP_UTILS}.FutureMap is missing")
    _require_params(version, future_map, "publish", ("self", "future_indices", "new_seq_lens"))
    _require_params(version, future_map, "resolve_seq_lens_cpu", ("self", "batch"))
    if "resolve_mixed_spec_tails" in future_map.__dict__:
        _require_params(version, future_map, "resolve_mixed_spec_tails", ("self", "batch"))
    try:
        init_src = inspect.getsource(future_map.__init__)
    except (OSError, TypeError):  # no source shipped: the per-instance checks still run
        init_src = None
    for attr in ("new_seq_lens_buf", "needs_cpu_seq_lens", "publish_ready"):
        if init_src is not None and attr not in init_src:
            raise UnsupportedSGLangError(
                f"SGLang {version}: FutureMap.__init__ no longer sets {attr!r}")
    return version


# ---------------------------------------------------------------------------- hooks


_PASSTHROUGH = (AssertionError,)  # SGLang's own debug checks must surface as they do upstream
_UNDECIDED = object()


def _on_failure(fm, relay, exc, what):
    from spec_fused.kernels.publish_gather import (
        InputError,
        InputTypeError,
        PoisonedSlotError,
        StaleHostMirrorError,
    )

    # Bad input and caught bugs reach the caller, as upstream's own errors would; the
    # relay stays (a bad step is not a broken relay).
    if isinstance(exc, (InputError, InputTypeError, PoisonedSlotError, StaleHostMirrorError,
                        *_PASSTHROUGH)):
        raise exc
    _relay.log_once(("fallback", what, type(exc).__name__),
                    "fused %s failed (%s: %s); SGLang's own relay takes over this FutureMap",
                    what, type(exc).__name__, exc)
    _relay.disable(fm, relay, f"{what}: {exc}")


# The replacements below are installed on FutureMap as plain functions: SGLang calls them
# straight, with no wrapper frame in between (HookRegistry's AROUND and REPLACE forms both
# add one; bench/host_overhead.py measures the forms). Each keeps SGLang's original in its
# closure for the fallback ladder, and PatchSet restores the original exactly.


def _make_publish(original):
    relay_attr = _relay.RELAY_ATTR
    relay_for = _relay.relay_for

    def publish(self, future_indices, new_seq_lens, confidence=None):
        relay = self.__dict__.get(relay_attr, _UNDECIDED)
        if relay is _UNDECIDED:
            relay = relay_for(self)
        if relay is None or confidence is not None or future_indices.shape[0] == 0:
            if relay is not None:
                relay.flush()  # keep publish order when SGLang's path writes the buffer
            if confidence is None:
                return original(self, future_indices, new_seq_lens)
            return original(self, future_indices, new_seq_lens, confidence)
        try:
            relay.publish(self, future_indices, new_seq_lens)
        except Exception as exc:
            _on_failure(self, relay, exc, "publish")
            return original(self, future_indices, new_seq_lens)

    return publish


def _make_resolve(original):
    relay_attr = _relay.RELAY_ATTR
    relay_for = _relay.relay_for

    def resolve_seq_lens_cpu(self, batch, stream_ordered=False):
        relay = self.__dict__.get(relay_attr, _UNDECIDED)
        if relay is _UNDECIDED:
            relay = relay_for(self)
        if relay is None:
            if stream_ordered:
                return original(self, batch, stream_ordered)
            return original(self, batch)
        try:
            relay.resolve(self, batch, stream_ordered)
        except Exception as exc:
            _on_failure(self, relay, exc, "resolve")
            if stream_ordered:
                return original(self, batch, stream_ordered)
            return original(self, batch)

    return resolve_seq_lens_cpu


def _make_mixed_tails(original):
    def resolve_mixed_spec_tails(self, batch, *args, **kwargs):
        _relay.read_buffer(self)  # land the pending publish; upstream then reads the buffer
        return original(self, batch, *args, **kwargs)

    return resolve_mixed_spec_tails


def _buffer_property():
    def getter(self):
        return _relay.read_buffer(self)

    def setter(self, value):
        self.__dict__[_relay.BUF_ATTR] = value
        relay = self.__dict__.get(_relay.RELAY_ATTR)
        if relay is not None:
            relay.rebind(value)
        _relay.prewarm_for(self, value)  # FutureMap.__init__: compile before serving

    return property(getter, setter, doc="FutureMap.new_seq_lens_buf; a pending fused publish "
                                        "lands before anyone outside the relay reads it")


def _scheduler_caps(sched):
    future_map = getattr(sched, "future_map", None)
    backends = None
    if future_map is not None and hasattr(future_map, "needs_cpu_seq_lens"):
        backends = [_relay._BackendsDecision(bool(future_map.needs_cpu_seq_lens))]
    caps = establish(caps_for(sched.spec_algorithm, worker=getattr(sched, "draft_worker", None),
                              attn_backends=backends), sched.spec_algorithm)
    if future_map is not None:
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
            _relay.log_once(("war-caps", type(exc).__name__),
                            "no capabilities for the WAR barrier decision (%s); keeping "
                            "SGLang's", str(exc).strip('"'))
            self.__dict__.pop(key, None)
            return
        self.__dict__[key] = bool(platform_gate) and caps.needs_war_barrier
        if platform_gate and not caps.needs_war_barrier:
            _relay.log_once(("war-off", str(self.spec_algorithm)),
                            "WAR barrier off for %s (%s)",
                            getattr(self.spec_algorithm, "name", self.spec_algorithm),
                            caps.reason, level=logging.INFO)

    return property(getter, setter)


def _patch_scheduler(patches: PatchSet, module) -> None:
    scheduler = getattr(module, "Scheduler", None)
    if not isinstance(scheduler, type) or "_apply_war_barrier" not in scheduler.__dict__:
        _relay.log_once("no-war", "%s.Scheduler has no _apply_war_barrier; the WAR barrier "
                        "stays as SGLang decides it", SCHEDULER)
        return
    src = inspect.getsource(scheduler._apply_war_barrier)
    if "_war_barrier_enabled" not in src:
        _relay.log_once("war-src", "Scheduler._apply_war_barrier does not read "
                        "_war_barrier_enabled; the WAR barrier stays as SGLang decides it")
        return
    patches.set_attr(scheduler, "_war_barrier_enabled", _war_barrier_property())


# ---------------------------------------------------------------------------- public API


def is_applied() -> bool:
    return _patches is not None


def apply() -> PatchReport:
    """Patch SGLang (idempotent). Raises :class:`UnsupportedSGLangError`, patching nothing,
    on an SGLang it does not recognise. With ``SPEC_FUSED_DISABLE=1`` patches nothing."""
    global _patches, _report
    if _patches is not None:
        return _report
    off = disabled_by()
    if off is not None:
        return PatchReport(False, _sglang_version(), reason=f"{ENV_DISABLE}={off}")
    import importlib

    version = check_supported()
    overlap_utils = importlib.import_module(OVERLAP_UTILS)
    future_map = overlap_utils.FutureMap
    patches = PatchSet()
    report = PatchReport(True, version)
    try:
        patches.replace(future_map, "publish", _make_publish)
        patches.replace(future_map, "resolve_seq_lens_cpu", _make_resolve)
        if "resolve_mixed_spec_tails" in future_map.__dict__:
            patches.replace(future_map, "resolve_mixed_spec_tails", _make_mixed_tails)
        patches.set_attr(future_map, _relay.BUF_ATTR, _buffer_property())
        report.patched = list(patches.targets)
        import sys

        if SCHEDULER not in sys.modules:
            report.deferred.append(f"{SCHEDULER}.Scheduler._war_barrier_enabled")
        patches.after_import(SCHEDULER, lambda module: _patch_scheduler(patches, module))
        if SCHEDULER in sys.modules:
            report.patched = list(patches.targets)
    except Exception:
        patches.undo()
        raise
    _patches, _report = patches, report
    status = support_status(version)
    if status.kind != "tested":
        report.warning = status.message if status.kind == "newer" else \
            f"{status.message.split(';')[0]}; running because {ENV_ALLOW_UNTESTED}=1 and " \
            f"the API probe passed"
        logger.warning("spec_fused: %s", report.warning)
    logger.info("spec_fused: patched SGLang %s (%s)", version, ", ".join(report.patched))
    return report


def remove() -> None:
    """Restore every patched original exactly (pending publishes land first)."""
    global _patches, _report
    if _patches is None:
        return
    _relay.flush_all()
    _patches.undo()
    _patches = _report = None


def register() -> None:
    """The ``sglang.srt.plugins`` entry point: apply, or say in one line why not."""
    off = disabled_by()
    if off is not None:
        logger.info("spec_fused: disabled by %s=%s; SGLang runs its own relay", ENV_DISABLE, off)
        return
    try:
        report = apply()
    except UnsupportedSGLangError as exc:
        logger.warning("spec_fused: not loaded: %s. SGLang runs its own relay.", exc)
        return
    except Exception as exc:  # never take the server down
        logger.warning("spec_fused: not loaded (%s: %s). SGLang runs its own relay.",
                       type(exc).__name__, exc)
        return
    if report.deferred:
        logger.info("spec_fused: will patch on import: %s", ", ".join(report.deferred))
