"""Sticky device faults: recognised, named, and never stepped over.

Why a module of its own: after an illegal address, a misaligned address, an illegal
instruction or a device-side assert, the CUDA context is dead for the rest of the process.
The error surfaces at whatever CUDA call comes next - often a ``synchronize()`` far from
the launch that faulted - and every later call fails too. A fallback ladder that steps
down to the torch reference or to SGLang's own relay would then fail at an unrelated
call, with a message that points away from spec_fused. So a sticky fault is never a
reason to fall back: it escapes the call it surfaced in, carrying a note that names
spec_fused, the step it was in, and ``SPEC_FUSED_DISABLE=1`` as the way to serve without
it. SGLang's own path would have crashed on such a fault too, so this is never less safe
than SGLang. Recoverable errors (out of memory, a launcher's ``ValueError``/``TypeError``,
a wrong result) are not sticky: they keep the ladder.
"""

from __future__ import annotations

import logging
import re
from typing import NoReturn, Optional

from spec_fused.kernels.checks import InputError, InputTypeError, PoisonedSlotError

__all__ = [
    "CALLERS_ERRORS",
    "STICKY_CODES",
    "StickyDeviceFault",
    "is_sticky_fault",
    "raise_if_sticky",
    "step_failed",
]

# The caller's fault (bad input, raised before anything is written) or a caught bug
# (SGLang's own debug assertions, the consume-once check): raised as they are, never a
# reason to change backend. Anything else - Triton's launcher raises ValueError and
# TypeError for its own failures too - is the backend's.
CALLERS_ERRORS = (InputError, InputTypeError, AssertionError, PoisonedSlotError)

# cudaError_t codes after which the context is unusable ("sticky" in CUDA's words; cuda.h:
# "the process must be terminated and relaunched"), with the text cudaGetErrorString gives
# for them (read from libcudart 13.0): PyTorch raises "CUDA error: <text>", Triton's
# launcher "Triton Error [CUDA]: <text>".
STICKY_CODES = {
    214: "uncorrectable ECC error encountered",
    220: "uncorrectable NVLink error detected during the execution",
    226: "Invalid access of peer GPU memory over nvlink or a hardware error",
    700: "an illegal memory access was encountered",
    702: "the launch timed out and was terminated",
    710: "device-side assert triggered",
    714: "hardware stack error",
    715: "an illegal instruction was encountered",
    716: "misaligned address",
    717: "operation not supported on global/shared address space",
    718: "invalid program counter",
    719: "unspecified launch failure",
    721: "tensor memory not completely freed",
    810: "the MPS client has been terminated by the server",
    911: "an async error has occured in external entity outside of CUDA",  # CUDA's spelling
}
_STICKY_TEXT = re.compile(
    r"(CUDA error|Triton Error \[CUDA\]|CUDA driver error)[^:]*:\s*("
    + "|".join(re.escape(text) for text in STICKY_CODES.values())
    + ")",
    re.IGNORECASE,
)
_NOTED = "_spec_fused_sticky_noted"


class StickyDeviceFault(RuntimeError):
    """A sticky fault re-raised where the running Python cannot attach a note (< 3.11)."""


def is_sticky_fault(exc: BaseException) -> bool:
    """Whether ``exc`` (or what it was raised from) is a sticky device fault: a
    ``torch.AcceleratorError`` with a sticky code, or PyTorch's or Triton's error text
    for one."""
    seen = 0
    while exc is not None and seen < 8:
        code = getattr(exc, "error_code", None)
        if isinstance(code, int) and code in STICKY_CODES:
            return True
        if isinstance(exc, (RuntimeError, StickyDeviceFault)) and _STICKY_TEXT.search(str(exc)):
            return True
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return False


def raise_if_sticky(
    exc: BaseException, where: str, logger: Optional[logging.Logger] = None
) -> None:
    """Re-raise ``exc`` if it is a sticky device fault, noting spec_fused, ``where`` (the
    step it surfaced in) and ``SPEC_FUSED_DISABLE=1``; return otherwise. Noted once: an
    outer handler that sees the same exception re-raises it as it is."""
    if not is_sticky_fault(exc):
        return
    _escape(exc, where, logger)


def _escape(exc: BaseException, where: str, logger: Optional[logging.Logger]) -> NoReturn:
    if getattr(exc, _NOTED, False):
        raise exc
    note = (
        f"spec_fused: a sticky device fault surfaced in {where}. The CUDA context is "
        f"unusable for the rest of this process (SGLang's own path could not run on it "
        f"either), so spec_fused does not fall back. To serve without spec_fused, "
        f"restart with SPEC_FUSED_DISABLE=1, and report this error to spec_fused."
    )
    (logger or logging.getLogger("spec_fused")).error("%s (%s: %s)", note, type(exc).__name__, exc)
    try:
        setattr(exc, _NOTED, True)
    except Exception:  # pragma: no cover - an exception type that refuses attributes
        pass
    if hasattr(exc, "add_note"):
        exc.add_note(note)
        raise exc
    wrapped = StickyDeviceFault(f"{exc}\n{note}")
    setattr(wrapped, _NOTED, True)
    raise wrapped from exc


def step_failed(exc: BaseException, where: str) -> None:
    """Raise ``exc`` if it is the caller's or a sticky device fault (noted, naming
    spec_fused and ``SPEC_FUSED_DISABLE=1``); return if a backend failed, for the caller
    to step down."""
    if isinstance(exc, CALLERS_ERRORS):
        raise exc
    raise_if_sticky(exc, where)
