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

While SGLang builds a speculative ``FutureMap`` on a CUDA device, the start-up canary
(:mod:`spec_fused.kernels.canary`) proves the kernel there, before the first request.

``SPEC_FUSED_DISABLE=1`` (or ``spec_fused`` left out of ``SGLANG_PLUGINS``) keeps SGLang as
shipped: the A side of every A/B. Anything untested (a release below the range, a missing
method, code that is not as a whole a tested release's: ``code_check``) makes :func:`apply`
patch nothing and :func:`register` say so in one line. An untested scheduler keeps its own
barrier. An argument the replacements do not know goes to SGLang's original.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Optional

import torch

from spec_fused import host_waits, settings
from spec_fused import relay as _relay
from spec_fused.faults import raise_if_sticky
from spec_fused.integration import code_check, flashinfer_plan, war_barrier
from spec_fused.integration.hooks import PatchSet
from spec_fused.kernels.backend import Verdict, device_key, record_verdict
from spec_fused.kernels.canary import canary
from spec_fused.releases import support_status
from spec_fused.upstream import debug_enabled

logger = logging.getLogger("spec_fused")

PLUGIN_NAME = "spec_fused"
ENV_DISABLE = settings.DISABLE.name
ENV_ALLOW_UNTESTED = settings.ALLOW_UNTESTED.name
OVERLAP_UTILS = "sglang.srt.managers.overlap_utils"
SCHEDULER = "sglang.srt.managers.scheduler"

__all__ = [
    "PatchReport",
    "UnsupportedSGLangError",
    "apply",
    "check_supported",
    "disabled_by",
    "is_applied",
    "register",
    "remove",
]


class UnsupportedSGLangError(RuntimeError):
    """The installed SGLang is not one spec_fused knows how to patch; nothing was patched."""


@dataclass
class PatchReport:
    applied: bool
    sglang_version: Optional[str]
    patched: list = field(default_factory=list)
    deferred: list = field(default_factory=list)  # patched when their module is imported
    reason: str = ""
    warning: str = ""  # set when untested code runs (SPEC_FUSED_ALLOW_UNTESTED=1)
    code: str = ""  # which tested release's code this is


_patches: Optional[PatchSet] = None
_report: Optional[PatchReport] = None


def disabled_by(env=None) -> Optional[str]:
    """The ``SPEC_FUSED_DISABLE`` setting that turns the plugin off, or None when it is on.
    Unset, "", "0", "false", "no" and "off" leave it on; any other value turns it off."""
    raw = settings.DISABLE.raw(env)
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


def check_supported(overlap_utils=None) -> str:
    """The SGLang version if spec_fused can patch it, else :class:`UnsupportedSGLangError`
    naming the version and what is missing or changed: a release below the tested range
    whatever its code, a FutureMap without the methods it patches, or functions that are
    not, as a whole, a tested release's (``SPEC_FUSED_ALLOW_UNTESTED=1`` lets those run)."""
    return _checked(overlap_utils)[0]


def _checked(overlap_utils=None) -> tuple[str, code_check.CodeVerdict]:
    version = _sglang_version()
    if version is None:
        raise UnsupportedSGLangError("SGLang is not installed")
    status = support_status(version)
    if status.refused:
        raise UnsupportedSGLangError(status.message)
    try:
        import importlib

        overlap_utils = overlap_utils or importlib.import_module(OVERLAP_UTILS)
    except Exception as exc:
        raise UnsupportedSGLangError(
            f"SGLang {version}: cannot import {OVERLAP_UTILS} ({type(exc).__name__}: {exc})"
        ) from exc
    future_map = getattr(overlap_utils, "FutureMap", None)
    if not isinstance(future_map, type):
        raise UnsupportedSGLangError(f"SGLang {version}: {OVERLAP_UTILS}.FutureMap is missing")
    for name in ("publish", "resolve_seq_lens_cpu"):
        if not callable(getattr(future_map, name, None)):
            raise UnsupportedSGLangError(f"SGLang {version}: FutureMap.{name} is missing")
    found = code_check.check_module(overlap_utils, prefer=version, name=OVERLAP_UTILS)
    if not found.tested and not settings.ALLOW_UNTESTED.on():
        raise UnsupportedSGLangError(
            f"SGLang {version}: {found.describe()}: not tested; set "
            f"{ENV_ALLOW_UNTESTED}=1 to try it anyway"
        )
    return version, found


# ---------------------------------------------------------------------------- hooks


_UNDECIDED = object()


def _on_failure(fm, relay, exc, what):
    """A relay step failed: the caller's error or a sticky fault is raised; anything
    else hands this FutureMap back to SGLang for good, with one log line."""
    _relay.step_failed(exc, relay.step_name(what))
    _relay.log_once(
        ("fallback", what, type(exc).__name__),
        "fused %s failed (%s: %s); SGLang's own relay takes over this FutureMap",
        what,
        type(exc).__name__,
        exc,
    )
    relay.retire(fm, f"{what}: {exc}")


# The replacements below are installed on FutureMap as plain functions: SGLang calls them
# straight, with no wrapper frame in between (HookRegistry's AROUND and REPLACE forms both
# add one; bench/host_overhead.py measures the forms). Each keeps SGLang's original in its
# closure for the fallback ladder, and PatchSet restores the original exactly.


def _no_confidence(kwargs) -> bool:
    """Only ``confidence=None`` among the keywords: what the fused publish handles."""
    return kwargs.keys() <= {"confidence"} and kwargs.get("confidence") is None


def _make_publish(original):
    HandToSGLang = _relay.HandToSGLang  # noqa: N806 - bound once for the per-step path
    relay_attr = _relay.RELAY_ATTR
    relay_for = _relay.relay_for

    def publish(self, future_indices, new_seq_lens, *args, **kwargs):
        relay = self.__dict__.get(relay_attr, _UNDECIDED)
        if relay is _UNDECIDED:
            relay = relay_for(self)
        # Fused: no relay-less FutureMap, no confidence (DSPARK gates its own D2H on the
        # scatter), nothing SGLang's publish may have grown since, not a DP-idle publish.
        if (
            relay is None
            or args
            or (kwargs and not _no_confidence(kwargs))
            or not future_indices.shape[0]
        ):
            if relay is not None:
                relay.land_pending()  # keep publish order when SGLang's path writes the buffer
            return original(self, future_indices, new_seq_lens, *args, **kwargs)
        try:
            relay.publish(self, future_indices, new_seq_lens)
        except HandToSGLang:
            return original(self, future_indices, new_seq_lens)
        except Exception as exc:
            _on_failure(self, relay, exc, "publish")
            return original(self, future_indices, new_seq_lens)

    return publish


def _make_resolve(original):
    HandToSGLang = _relay.HandToSGLang  # noqa: N806 - bound once for the per-step path
    relay_attr = _relay.RELAY_ATTR
    relay_for = _relay.relay_for

    def resolve_seq_lens_cpu(self, batch, *args, **kwargs):
        relay = self.__dict__.get(relay_attr, _UNDECIDED)
        if relay is _UNDECIDED:
            relay = relay_for(self)
        if relay is None:
            return original(self, batch, *args, **kwargs)
        if args or kwargs:
            # ``stream_ordered`` (0.5.23's HIP-only GPU path, which the relay does not
            # engage on) or anything newer: SGLang's own resolve, after the pending
            # publish lands.
            relay.land_pending()
            return original(self, batch, *args, **kwargs)
        try:
            relay.resolve(self, batch)
        except HandToSGLang:
            return original(self, batch)
        except Exception as exc:
            _on_failure(self, relay, exc, "resolve")
            return original(self, batch)

    return resolve_seq_lens_cpu


def _make_mixed_tails(original):
    def resolve_mixed_spec_tails(self, batch, *args, **kwargs):
        read_buffer(self)  # land the pending publish; upstream then reads the buffer
        return original(self, batch, *args, **kwargs)

    return resolve_mixed_spec_tails


def _landing_failed(relay: _relay.FusedRelay) -> Optional[str]:
    """Land ``relay``'s pending publish; why it could not, or None (a sticky fault
    escapes, naming the step)."""
    try:
        relay.land_pending()
        return None
    except Exception as exc:
        raise_if_sticky(exc, relay.step_name("landing of a pending publish"), logger)
        return f"landing a pending publish failed: {exc}"


def land_all_pending() -> None:
    for relay in list(_relay.live_relays):
        if relay.pending is not None and _landing_failed(relay):
            relay.land_with_torch()


def read_buffer(fm) -> torch.Tensor:
    """``fm.new_seq_lens_buf`` for anyone outside the relay: a pending publish lands first
    (and the reader's stream waits for it); a relay that cannot land it is handed back."""
    relay = fm.__dict__.get(_relay.RELAY_ATTR)
    if relay is not None and relay.pending is not None and (why := _landing_failed(relay)):
        relay.retire(fm, why)
    try:
        return fm.__dict__[_relay.BUF_ATTR]
    except KeyError:
        raise AttributeError(_relay.BUF_ATTR) from None


_proven: set = set()


def prewarm_for(fm, buf) -> None:
    """While a speculative FutureMap is built on a CUDA device (before serving), run the
    start-up canary there once: every specialization compiled and proven on the launcher
    the relay will build. A sticky fault escapes; a CUDA device whose canary could not
    run (or finish) is put on the torch reference, one log line: nothing unproven serves."""
    key = None
    try:
        algo = getattr(fm, "spec_algo", None)
        if algo is None or not algo.is_some() or not isinstance(buf, torch.Tensor):
            return
        key = device_key(buf.device) if buf.device.type == "cuda" else None
        if key is None or key in _proven or _relay.unsupported_device(buf.device) is not None:
            return
        _proven.add(key)
        canary(buf.device, debug=debug_enabled())
    except Exception as exc:
        raise_if_sticky(exc, f"spec_fused's start-up canary on {key or 'a FutureMap'}", logger)
        why = f"could not prove the fused kernel ahead of serving ({type(exc).__name__}: {exc})"
        if key is not None:  # no verdict yet, or one the canary did not finish
            why += f"; {key} serves with the torch reference"
            record_verdict(Verdict(key, "reference", notes=[why]))
        _relay.log_once(("prewarm", type(exc).__name__), "%s", why)


def _buffer_property():
    def getter(self):
        return read_buffer(self)

    def setter(self, value):
        if _relay.BUF_ATTR in self.__dict__:  # a swap (_adopt_relay): a pending publish
            read_buffer(self)  # lands in the buffer it was made for, as upstream's
        self.__dict__[_relay.BUF_ATTR] = value
        relay = self.__dict__.get(_relay.RELAY_ATTR)
        if relay is not None:
            relay.launcher.rebind(value)  # _adopt_relay: launch into the new buffer
        prewarm_for(self, value)  # FutureMap.__init__: compile and prove before serving

    return property(
        getter,
        setter,
        doc="FutureMap.new_seq_lens_buf; a pending fused publish "
        "lands before anyone outside the relay reads it",
    )


# ---------------------------------------------------------------------------- public API


def is_applied() -> bool:
    return _patches is not None


def apply() -> PatchReport:
    """Patch SGLang (idempotent). Raises :class:`UnsupportedSGLangError`, patching nothing,
    on an SGLang it does not recognise. With ``SPEC_FUSED_DISABLE=1`` patches nothing."""
    global _patches, _report
    if _patches is not None and _report is not None:
        return _report
    if (off := disabled_by()) is not None:
        return PatchReport(False, _sglang_version(), reason=f"{ENV_DISABLE}={off}")
    import importlib
    import sys

    version, found = _checked()
    future_map = importlib.import_module(OVERLAP_UTILS).FutureMap
    patches = PatchSet()
    report = PatchReport(True, version, code=found.release or "")
    try:
        patches.replace(future_map, "publish", _make_publish)
        patches.replace(future_map, "resolve_seq_lens_cpu", _make_resolve)
        if "resolve_mixed_spec_tails" in future_map.__dict__:
            patches.replace(future_map, "resolve_mixed_spec_tails", _make_mixed_tails)
        patches.set_attr(future_map, _relay.BUF_ATTR, _buffer_property())
        if SCHEDULER not in sys.modules:
            report.deferred.append(f"{SCHEDULER}.Scheduler._war_barrier_enabled")
        patches.after_import(SCHEDULER, lambda module: war_barrier.patch(patches, module, version))
        patches.after_import(flashinfer_plan.MODULE, lambda m: flashinfer_plan.patch(m, version))
        report.patched = list(patches.targets)
    except Exception:
        patches.undo()
        raise
    _patches, _report = patches, report
    if not found.tested:
        report.warning = f"SGLang {version}: {found.describe()}: not tested; {ENV_ALLOW_UNTESTED}=1"
        logger.warning("spec_fused: %s", report.warning)
    elif found.release != version:
        logger.info(
            "spec_fused: SGLang %s is not a listed release, but the code spec_fused patches "
            "is %s's, which is tested: running",
            version,
            found.release,
        )
    logger.info("spec_fused: patched SGLang %s (%s)", version, ", ".join(report.patched))
    return report


def remove() -> None:
    """Restore every patched original exactly (pending publishes land first)."""
    global _patches, _report
    if _patches is None:
        return
    land_all_pending()
    _patches.undo()
    _patches = _report = None


def register() -> None:
    """The ``sglang.srt.plugins`` entry point: apply, or say in one line why not. The host
    wait counter (``SPEC_FUSED_SYNC_DEBUG=1``) counts SGLang as shipped too."""
    if settings.SYNC_DEBUG.on():
        host_waits.install()
        PatchSet().after_import(
            SCHEDULER, lambda m: host_waits.count_steps(m.Scheduler, "run_batch")
        )
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
        logger.warning(
            "spec_fused: not loaded (%s: %s). SGLang runs its own relay.", type(exc).__name__, exc
        )
        return
    if report.deferred:
        logger.info("spec_fused: will patch on import: %s", ", ".join(report.deferred))
