"""Which implementation runs the fused step on a device, compiled ahead of serving.

Why these live together: choosing a backend (compiled Triton, the interpreter, the torch
reference, or the benchmarks' ``null`` seam) and remembering what the start-up canary
(:mod:`spec_fused.kernels.canary`) proved on each device are one decision - which code is
trusted to run here - and ``doctor`` reports it from this module. The canary itself needs
the launcher, which needs this module: it lives apart, so nothing here imports it.
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

__all__ = [
    "BACKENDS",
    "ENV_BENCH",
    "ENV_FORCE_BACKEND",
    "Verdict",
    "backend_for",
    "device_key",
    "explain_backend",
    "explain_relay_backend",
    "record_verdict",
    "verdict_for",
]

# The three of backend_for, plus "null" (SPEC_FUSED_FORCE_BACKEND=null with
# SPEC_FUSED_BENCH=1): the whole host path and no device work, to price the wrapper.
BACKENDS = ("triton", "interpreter", "reference", "null")

# Facts about Triton in this process, read here so that choosing a backend needs nothing
# of the kernel module (which needs this one). ``triton.jit`` decides once, when a kernel
# is decorated, whether it is interpreted (TRITON_INTERPRET=1 before Triton was imported):
# a probe decorated the same way, never launched, says what the kernel's decoration did.
TRITON_AVAILABLE = triton is not None
if triton is not None:

    @triton.jit
    def _decoration_probe(x):
        pass

    TRITON_INTERPRETS = type(_decoration_probe).__name__ == "InterpretedFunction"
else:  # pragma: no cover
    TRITON_INTERPRETS = False


def explain_backend(device) -> tuple[str, str]:
    """``(backend, why)`` for ``device``: what :func:`backend_for` picks, and the reason."""
    device = torch.device(device)
    if settings.FORCE_REFERENCE.on():
        return "reference", "SPEC_FUSED_FORCE_REFERENCE=1"
    proven = verdict_for(device)
    if proven is not None and proven.backend == "reference" and proven.downgraded:
        return "reference", f"start-up canary: {proven.notes[-1]}"
    if not TRITON_AVAILABLE:
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


ENV_FORCE_BACKEND = settings.FORCE_BACKEND.name
ENV_BENCH = settings.BENCH.name


def explain_relay_backend(device) -> tuple[str, str]:
    """``(backend, why)`` the relay's launcher uses on ``device``: :func:`explain_backend`,
    or ``"null"`` under ``SPEC_FUSED_FORCE_BACKEND=null`` together with
    ``SPEC_FUSED_BENCH=1`` - the measurement seam that runs the relay's whole host path
    with no device work. ``null`` is never picked otherwise, and never by a fallback."""
    backend, why = explain_backend(device)
    ignored = ignored_force_backend()
    if ignored is not None:
        return backend, f"{why} ({ignored})"
    if not settings.FORCE_BACKEND.raw():
        return backend, why
    return (
        "null",
        f"{ENV_FORCE_BACKEND}=null with {ENV_BENCH}=1: no device work, "
        f"results unspecified (benchmarks only)",
    )


def ignored_force_backend() -> Optional[str]:
    """Why ``SPEC_FUSED_FORCE_BACKEND`` is set but ignored (a typo, or ``null`` without
    ``SPEC_FUSED_BENCH=1``), or None: a server ignores it with a warning, ``selftest``
    calls it a bad override."""
    forced = settings.FORCE_BACKEND.raw()
    if not forced:
        return None
    if forced != "null":
        return f"{ENV_FORCE_BACKEND}={forced!r} ignored: only 'null' is known"
    if not settings.BENCH.on():
        return f"{ENV_FORCE_BACKEND}=null ignored: it needs {ENV_BENCH}=1"
    return None


def backend_for(device) -> str:
    """Which implementation ``publish_gather`` uses on ``device``.

    ``"triton"`` (compiled, CUDA/ROCm), ``"interpreter"`` (CPU tensors under
    ``TRITON_INTERPRET=1`` set before Triton was imported) or ``"reference"`` (plain torch:
    no Triton, or a device Triton cannot drive here, e.g. MPS, NPU, XPU, or CPU without the
    interpreter). ``SPEC_FUSED_FORCE_REFERENCE=1`` forces the reference everywhere."""
    return explain_backend(device)[0]


# ---------------------------------------------------------------------------- verdicts


@dataclass
class Verdict:
    """What the start-up canary (:mod:`spec_fused.kernels.canary`) proved on one device:
    the backend the relay will use there (``"sglang"``: none - the kernel faulted in the
    canary's child process, and SGLang's own relay serves that device), whether the
    direct launch ran and was right, each step down with why, and what proving it cost."""

    device: str
    backend: str
    direct: bool
    cases: int = 0
    notes: list = field(default_factory=list)
    seconds: float = 0.0  # wall time of the in-process canary (compiles included)
    child: Optional[dict] = None  # the child-process canary's report, where one ran

    @property
    def downgraded(self) -> bool:
        return bool(self.notes)

    @property
    def refused(self) -> bool:
        """The relay does not engage on this device: SGLang's own path serves it."""
        return self.backend == "sglang"

    def describe(self) -> str:
        if self.refused:
            return "SGLang's own relay: " + "; ".join(self.notes)
        how = "direct launch" if self.direct else "normal launch"
        if self.backend not in ("triton", "interpreter"):
            how = "torch reference"
        text = f"{how}: {self.cases} cases match the torch reference"
        if self.seconds:
            text += f" in {self.seconds:.2f} s"
        if self.child is not None and self.child.get("seconds") is not None:
            text += f" (child process first: {self.child['seconds']:.2f} s"
            if self.child.get("gpu_bytes") is not None:
                text += f", {self.child['gpu_bytes'] / 2**20:.0f} MiB of GPU memory"
            text += ")"
        return text if not self.notes else f"{text}; " + "; ".join(self.notes)


_verdicts: dict = {}


def device_key(device) -> str:
    """One key per physical device: ``cuda`` is the current CUDA device's index, so a
    verdict proven under ``cuda`` is the one a relay on ``cuda:0`` looks up."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        try:
            return f"cuda:{torch.cuda.current_device()}"
        except Exception:  # no CUDA here: the name is all there is
            return "cuda"
    return str(device)


def verdict_for(device) -> Optional[Verdict]:
    """The canary's verdict for ``device`` in this process, if it ran."""
    return _verdicts.get(device_key(device))


def record_verdict(verdict: Verdict) -> Verdict:
    """File ``verdict`` under its device's key (what :func:`verdict_for` reads)."""
    verdict.device = device_key(verdict.device)
    _verdicts[verdict.device] = verdict
    return verdict
