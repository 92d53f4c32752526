"""Every environment variable spec_fused reads, in one place: its name, its meaning, its
default; and the one place that reads them.

Each read asks ``os.environ`` at the moment it is made (nothing is cached at import), so
a variable exported later, or set by a test, is seen by the next decision. Functions that
take an ``env`` mapping (``caps_for``, ``doctor``, ``sglang_patch.disabled``) pass it here
and it is read instead of ``os.environ``.

    from spec_fused import settings
    settings.DEBUG.on()                    # SPEC_FUSED_DEBUG=1?
    settings.HOST_SEQ_LENS.raw(env)        # the value set in env (or os.environ), or ""
    with settings.overridden({...}): ...   # set some for a block (measurements)

``describe()`` lists them (name, default, meaning), as the README's table does."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Optional

__all__ = ["SETTINGS", "Setting", "describe", "overridden", "source"]


@dataclass(frozen=True)
class Setting:
    name: str
    default: str
    meaning: str
    read_by: str = "spec_fused"  # who reads it: the package, or a script / the tests

    def raw(self, env: Optional[Mapping[str, str]] = None) -> str:
        """The value set (in ``env``, else ``os.environ``), or the default."""
        return source(env).get(self.name, self.default)

    def get(self, env: Optional[Mapping[str, str]] = None) -> Optional[str]:
        """The value set, or None when it is not set at all (no default applied)."""
        return source(env).get(self.name)

    def on(self, env: Optional[Mapping[str, str]] = None) -> bool:
        """Set to exactly ``1``."""
        return self.raw(env) == "1"

    def is_set(self, env: Optional[Mapping[str, str]] = None) -> bool:
        return self.name in source(env)

    def set_default(self, value: str) -> None:
        """Set in ``os.environ`` unless already set (``os.environ.setdefault``)."""
        os.environ.setdefault(self.name, value)


# ------------------------------------------------------------------- the plugin

DISABLE = Setting(
    "SPEC_FUSED_DISABLE",
    "",
    "set to anything but 0/false/no/off (or empty): the plugin patches nothing and SGLang "
    "runs its own relay (the A/B switch)",
)
ALLOW_UNTESTED = Setting(
    "SPEC_FUSED_ALLOW_UNTESTED",
    "",
    "1: run on SGLang code that is not a tested release's (a warning says so); otherwise "
    "such code is refused and SGLang's relay runs",
)

# ------------------------------------------------------------------- the decisions

WAR_BARRIER = Setting(
    "SPEC_FUSED_WAR_BARRIER",
    "",
    "0 or 1: override the WAR-barrier decision (unset: the capability model decides)",
)
HOST_SEQ_LENS = Setting(
    "SPEC_FUSED_HOST_SEQ_LENS",
    "",
    "exact, reserved or none (any case): override the host-length claim; an unsafe one is "
    "refused with one log line",
)
DEBUG = Setting(
    "SPEC_FUSED_DEBUG",
    "",
    "1: consume-once poisoning, index validation, strict stamp checks (also on under "
    "SGLang's SGLANG_IS_IN_CI where its FutureMap poisons too)",
)

CHILD_CANARY = Setting(
    "SPEC_FUSED_CHILD_CANARY",
    "1",
    "0: run the start-up canary in the scheduler process only (by default it runs first in "
    "a child process, before the pools are allocated, so a kernel that faults costs the "
    "child and the GPU is left to SGLang's relay)",
)

# ------------------------------------------------------------------- the backend

FORCE_REFERENCE = Setting(
    "SPEC_FUSED_FORCE_REFERENCE",
    "",
    "1: the plain-torch reference everywhere instead of the Triton kernel",
)
FORCE_BACKEND = Setting(
    "SPEC_FUSED_FORCE_BACKEND",
    "",
    "null (with SPEC_FUSED_BENCH=1): the relay's host path with no device work, to price "
    "the wrapper; any other value is ignored with a warning",
)
BENCH = Setting(
    "SPEC_FUSED_BENCH",
    "",
    "1: allow SPEC_FUSED_FORCE_BACKEND=null (benchmarks only: results unspecified)",
)

# ------------------------------------------------------------------- scripts and tests

HYPOTHESIS_PROFILE = Setting(
    "SPEC_FUSED_HYPOTHESIS_PROFILE",
    "fast",
    "fast, full or compat: how many hypothesis examples per property",
    read_by="tests/conftest.py, run.sh, scripts/compat_tier.py",
)
VENV = Setting(
    "SPEC_FUSED_VENV", ".venv", "the light tier's virtual environment", read_by="scripts/setup.sh"
)
SCHED_VENV = Setting(
    "SPEC_FUSED_SCHED_VENV",
    ".venv-sched",
    "the scheduler tier's virtual environment",
    read_by="scripts/setup_scheduler_tier.sh",
)
SGLANG_VERSION = Setting(
    "SPEC_FUSED_SGLANG_VERSION",
    "0.5.23",
    "the SGLang release the light tier installs",
    read_by="scripts/setup.sh",
)

# ------------------------------------------------------------------- others' variables

SGLANG_PLUGINS = Setting(
    "SGLANG_PLUGINS",
    "",
    "SGLang's comma-separated plugin whitelist (unset: every installed plugin loads); "
    "doctor checks it lists spec_fused",
)
TRITON_INTERPRET = Setting(
    "TRITON_INTERPRET",
    "",
    "Triton's interpreter switch, read when Triton is imported; spec-fused selftest sets "
    "it to 1 on a machine without CUDA",
)

SETTINGS = (
    DISABLE,
    ALLOW_UNTESTED,
    WAR_BARRIER,
    HOST_SEQ_LENS,
    DEBUG,
    CHILD_CANARY,
    FORCE_REFERENCE,
    FORCE_BACKEND,
    BENCH,
    HYPOTHESIS_PROFILE,
    VENV,
    SCHED_VENV,
    SGLANG_VERSION,
    SGLANG_PLUGINS,
    TRITON_INTERPRET,
)


def source(env: Optional[Mapping[str, str]] = None) -> Mapping[str, str]:
    """The mapping read: ``env`` when given, else ``os.environ`` (as it is now)."""
    return os.environ if env is None else env


def describe() -> list:
    """``[{name, default, meaning, read_by}]`` for every variable."""
    return [
        {"name": s.name, "default": s.default, "meaning": s.meaning, "read_by": s.read_by}
        for s in SETTINGS
    ]


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
