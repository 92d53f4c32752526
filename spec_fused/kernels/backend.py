"""Which implementation runs the fused step on a device, and what the canary proved there.

Why together: choosing a backend (compiled Triton, the interpreter, the torch reference, or
the benchmarks' ``null`` seam) and remembering what the start-up canary
(:mod:`spec_fused.kernels.canary`) proved on each device are one decision - which code is
trusted to run here - and ``doctor`` reports it from here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch

from spec_fused import settings

try:  # Triton is optional: without it every device gets the reference.
    import triton
except Exception:  # pragma: no cover - exercised by the fallback-ladder tests
    triton = None

__all__ = ["BACKENDS", "Verdict", "backend_for", "explain_backend", "explain_relay_backend"]

# backend_for's three, plus "null" (SPEC_FUSED_FORCE_BACKEND=null with SPEC_FUSED_BENCH=1):
# the relay's whole host path and no device work, to price the wrapper.
BACKENDS = ("triton", "interpreter", "reference", "null")

# triton.jit decides once, when a kernel is decorated, whether it is interpreted
# (TRITON_INTERPRET=1 before Triton was imported): a probe decorated the same way says so.
if triton is not None:

    @triton.jit
    def _decoration_probe(x):
        pass

    TRITON_INTERPRETS = type(_decoration_probe).__name__ == "InterpretedFunction"
else:  # pragma: no cover
    TRITON_INTERPRETS = False


def explain_backend(device) -> tuple[str, str]:
    """``(backend, why)`` for ``device``: ``"triton"`` (compiled, CUDA), ``"interpreter"``
    (CPU tensors under ``TRITON_INTERPRET=1``) or ``"reference"`` (plain torch: no Triton,
    a device Triton cannot drive here, ``SPEC_FUSED_FORCE_REFERENCE=1``, or a kernel that
    failed the canary)."""
    device = torch.device(device)
    if settings.FORCE_REFERENCE.on():
        return "reference", "SPEC_FUSED_FORCE_REFERENCE=1"
    proven = verdict_for(device)
    if proven is not None and proven.backend == "reference" and proven.notes:
        return "reference", f"start-up canary: {proven.notes[-1]}"
    if triton is None:
        return "reference", "no Triton (import failed): plain-torch reference"
    if TRITON_INTERPRETS:
        if device.type == "cpu":
            return "interpreter", "TRITON_INTERPRET=1 (set before Triton was imported)"
        return "reference", "TRITON_INTERPRET=1 runs CPU tensors only: plain-torch reference"
    if device.type == "cuda":
        return "triton", "Triton compiled"
    if device.type == "cpu":
        return "reference", "Triton compiles for GPUs; TRITON_INTERPRET=1 would interpret on CPU"
    return "reference", f"Triton cannot drive {device.type} here: plain-torch reference"


def backend_for(device) -> str:
    return explain_backend(device)[0]


def ignored_force_backend() -> Optional[str]:
    """Why ``SPEC_FUSED_FORCE_BACKEND`` is set but ignored (not ``null``, or ``null``
    without ``SPEC_FUSED_BENCH=1``), or None."""
    forced = settings.FORCE_BACKEND.raw()
    if not forced:
        return None
    if forced != "null":
        return f"{settings.FORCE_BACKEND.name}={forced!r} ignored: only 'null' is known"
    if not settings.BENCH.on():
        return f"{settings.FORCE_BACKEND.name}=null ignored: it needs {settings.BENCH.name}=1"
    return None


def explain_relay_backend(device) -> tuple[str, str]:
    """What the relay's launcher uses: :func:`explain_backend`, or ``"null"`` under
    ``SPEC_FUSED_FORCE_BACKEND=null`` with ``SPEC_FUSED_BENCH=1`` (never otherwise)."""
    backend, why = explain_backend(device)
    ignored = ignored_force_backend()
    if ignored is not None:
        return backend, f"{why} ({ignored})"
    if not settings.FORCE_BACKEND.raw():
        return backend, why
    return "null", "SPEC_FUSED_FORCE_BACKEND=null with SPEC_FUSED_BENCH=1: no device work"


@dataclass
class Verdict:
    """What the start-up canary proved on one device: the backend the relay uses there,
    whether the direct launch ran and was right, each step down with why, and its cost."""

    device: str
    backend: str
    direct: bool = False
    cases: int = 0
    notes: list = field(default_factory=list)
    seconds: float = 0.0

    def describe(self) -> str:
        how = "direct launch" if self.direct else "normal launch"
        if self.backend not in ("triton", "interpreter"):
            how = "torch reference"
        text = f"{how}: {self.cases} cases match the torch reference in {self.seconds:.2f} s"
        return "; ".join([text, *self.notes])


_verdicts: dict = {}


def device_key(device) -> str:
    """One key per physical device: ``cuda`` is ``cuda:<current device>``."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        try:
            return f"cuda:{torch.cuda.current_device()}"
        except Exception:  # no CUDA here: the name is all there is
            return "cuda"
    return str(device)


def verdict_for(device) -> Optional[Verdict]:
    return _verdicts.get(device_key(device))


def record_verdict(verdict: Verdict) -> Verdict:
    verdict.device = device_key(verdict.device)
    _verdicts[verdict.device] = verdict
    return verdict
