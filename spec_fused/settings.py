"""Every environment variable the package reads: its name, default and meaning, and the one
place that reads them.

Each read asks ``os.environ`` when it is made (nothing is cached at import), so a variable
exported later, or set by a test, is seen by the next decision. Functions that take an
``env`` mapping pass it here and it is read instead of ``os.environ``."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Optional

__all__ = ["SETTINGS", "Setting", "overridden", "source"]


@dataclass(frozen=True)
class Setting:
    name: str
    default: str
    meaning: str

    def raw(self, env: Optional[Mapping[str, str]] = None) -> str:
        """The value set (in ``env``, else ``os.environ``), or the default."""
        return source(env).get(self.name, self.default)

    def on(self, env: Optional[Mapping[str, str]] = None) -> bool:
        """Set to exactly ``1``."""
        return self.raw(env) == "1"


DISABLE = Setting(
    "SPEC_FUSED_DISABLE",
    "",
    "anything but empty/0/false/no/off: patch nothing; SGLang runs its own relay (the A/B switch)",
)
ALLOW_UNTESTED = Setting(
    "SPEC_FUSED_ALLOW_UNTESTED",
    "",
    "1: run on SGLang code that is not a tested release's (a warning says so)",
)
WAR_BARRIER = Setting(
    "SPEC_FUSED_WAR_BARRIER",
    "",
    "0 or 1: override the WAR-barrier decision; it can only drop the barrier where SGLang's "
    "platform gate would apply it, so 0 is for those who checked their build fences its "
    "own writes",
)
HOST_SEQ_LENS = Setting(
    "SPEC_FUSED_HOST_SEQ_LENS",
    "",
    "exact, reserved or none: override the host-length claim; exact gives host lengths "
    "even where upstream gives none; anything else only where upstream gives none too "
    "(refused with one log line elsewhere)",
)
DEBUG = Setting(
    "SPEC_FUSED_DEBUG",
    "",
    "1: consume-once poisoning and index validation, host indices held to future_indices "
    "(also on under SGLang's SGLANG_IS_IN_CI where its FutureMap poisons too)",
)
FORCE_REFERENCE = Setting(
    "SPEC_FUSED_FORCE_REFERENCE", "", "1: the plain-torch reference instead of the Triton kernel"
)
FORCE_BACKEND = Setting(
    "SPEC_FUSED_FORCE_BACKEND",
    "",
    "null (with SPEC_FUSED_BENCH=1): the relay's host path with no device work, to price "
    "it; any other value is ignored with a warning",
)
BENCH = Setting("SPEC_FUSED_BENCH", "", "1: allow SPEC_FUSED_FORCE_BACKEND=null (benchmarks only)")
UNMEASURED = Setting(
    "SPEC_FUSED_UNMEASURED",
    "",
    "1: relay configurations no GPU run has measured level with SGLang (spec_fused/measured.py: "
    "exact host lengths on CUDA), to measure them or to try them",
)

SYNC_DEBUG = Setting(
    "SPEC_FUSED_SYNC_DEBUG",
    "",
    "1: count every host wait of each scheduler step with its call site (spec_fused/"
    "host_waits.py); works with SPEC_FUSED_DISABLE=1 too, to count SGLang as shipped",
)
SYNC_DEBUG_EVERY = Setting(
    "SPEC_FUSED_SYNC_DEBUG_EVERY", "100", "with SPEC_FUSED_SYNC_DEBUG=1: a summary every N steps"
)

SETTINGS = (
    DISABLE,
    ALLOW_UNTESTED,
    WAR_BARRIER,
    HOST_SEQ_LENS,
    DEBUG,
    FORCE_REFERENCE,
    FORCE_BACKEND,
    BENCH,
    UNMEASURED,
    SYNC_DEBUG,
    SYNC_DEBUG_EVERY,
)


def source(env: Optional[Mapping[str, str]] = None) -> Mapping[str, str]:
    """The mapping read: ``env`` when given, else ``os.environ`` (as it is now)."""
    return os.environ if env is None else env


def set_default(name: str, value: str) -> None:
    """Set ``name`` in ``os.environ`` unless it is set (e.g. ``TRITON_INTERPRET`` before
    Triton is imported)."""
    os.environ.setdefault(name, value)


@contextlib.contextmanager
def overridden(values: Optional[Mapping[str, str]]):
    """Set ``values`` in ``os.environ`` for the block, restoring what was there."""
    values = dict(values or {})
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
