"""Launch a compiled Triton kernel without going through ``JITFunction.run`` every time.

Why: ``kernel[grid](...)`` rebuilds the specialization key, looks the kernel up, builds
launch metadata and passes the launch hooks on every call: about 6-13 µs of host time per
launch in Triton 3.5 (tritonbench PR #669), against about 3-6 µs for calling the compiled
kernel's own ``run`` (PR #1017). The relay launches one tiny kernel per decode step, so
that difference *is* its host cost. A :class:`BoundKernel` keeps ``(run, function,
packed_metadata)`` of one compiled specialization and calls
``run(gx, gy, gz, stream, function, packed_metadata, None, None, None, *args)``.

SGLang 0.5.23 ships the same idea as a record/replay decorator
(``sglang/kernels/ops/diffusion/common/fast_launch.py``), keyed on every operand's shape,
stride, dtype, device and 16-byte alignment. It does not fit here: the relay's index
tensors change shape every step (so every batch size would be recorded afresh), computing
that key for five tensors costs about as much as the launch it saves, and 0.5.15-0.5.22
do not have it. Its guards are what this module borrows: hooks set -> normal path,
``torch.compiler.is_compiling()`` -> normal path, a launcher that does not take every
parameter (constexprs included, Triton >= 3.3) -> normal path.

Specialization must not change silently under a bound specialization. The kernel that is bound
declares every integer argument ``do_not_specialize`` and every pointer that the caller
supplies ``do_not_specialize_on_alignment``, so what Triton would specialize on per call
reduces to the pointers' dtypes and the constexprs; the caller keys its bound specializations on
exactly those (see ``StepLauncher``). Integers must also stay in int32 range, or Triton
would type them i64.
"""

from __future__ import annotations

import logging
from typing import Any, Optional

import torch

from spec_fused.log import log_once

logger = logging.getLogger("spec_fused")

try:
    import triton
    from triton import knobs as _knobs
    from triton.knobs import HookChain as _HookChain
except Exception:  # pragma: no cover - no Triton, or a vendor build without knobs
    triton = None
    _knobs = None
    _HookChain = None

__all__ = ["BoundKernel", "DirectLaunch", "KNOWN_TRITON", "bind", "triton_version"]

# The compiled-kernel calling convention read from Triton 3.6.0, 3.7.1, 3.8.0 and 3.9.0
# (the releases that SGLang 0.5.15 ... 0.5.23's torch pins bring, plus the newest): one
# ``run`` property, ``function``, ``packed_metadata``, and a launcher that takes the grid,
# the raw stream, the function, the metadata, launch metadata, two hooks, then every
# kernel parameter in order. Outside this range the normal path runs.
KNOWN_TRITON = ((3, 6), (3, 9))


def triton_version() -> Optional[tuple]:
    if triton is None:
        return None
    parts = []
    for piece in str(getattr(triton, "__version__", "")).split(".")[:2]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        if not digits:
            return None
        parts.append(int(digits))
    return tuple(parts) if len(parts) == 2 else None


def _log_once(reason: str) -> None:
    log_once(
        ("normal-launch", reason),
        "Triton's normal launch path is used (%s)",
        reason,
        level=logging.INFO,
    )


def _unknown_triton() -> Optional[str]:
    """Why the direct launch cannot be trusted with the installed Triton, or None."""
    version = triton_version()
    lo, hi = KNOWN_TRITON
    if version is None or not lo <= version <= hi:
        return (
            f"Triton {getattr(triton, '__version__', None)} is outside the versions the "
            f"direct launch was read against ({lo} to {hi})"
        )
    return None


class BoundKernel:
    """One compiled specialization: call ``run(gx, gy, gz, stream, function, metadata, None,
    None, None, *args)`` with every kernel parameter in order."""

    __slots__ = ("run", "function", "metadata", "compiled")

    def __init__(self, run, function, metadata, compiled=None):
        self.run = run
        self.function = function
        self.metadata = metadata
        # Kept alive: Triton 3.8+ unloads the module when the CompiledKernel is collected
        # (if its JIT cache is ever cleared), which would leave ``function`` dangling.
        self.compiled = compiled


def bind(compiled, n_args: int) -> tuple[Optional[BoundKernel], str]:
    """``(BoundKernel, "")`` for what ``kernel[grid](...)`` returned, or ``(None, why)``.

    ``compiled`` is the ``CompiledKernel`` a normal launch returns (the interpreter and
    asynchronous compilation return something else); ``n_args`` is how many parameters
    the launch passes, constexprs included."""
    unknown = _unknown_triton()
    if unknown:
        return None, unknown
    try:
        run = compiled.run  # a property: loads the module and builds the launcher once
        function = compiled.function
        metadata = compiled.packed_metadata
        signature = compiled.src.signature
    except Exception as exc:  # None (interpreter), a future, or a moved API
        return None, f"no compiled kernel to bind ({type(exc).__name__}: {exc})"
    if len(signature) != n_args:  # Triton < 3.3 passed non-constexpr arguments only
        return None, f"the launcher takes {len(signature)} arguments, the kernel has {n_args}"
    if not callable(run) or function is None:
        return None, "the compiled kernel has no loaded function"
    return BoundKernel(run, function, metadata, compiled), ""


class DirectLaunch:
    """Per-process conditions for the direct launch, checked in O(1) per step.

    ``ready()`` is False - and the caller takes ``kernel[grid](...)`` - while a launch
    hook is installed (proton and other profilers hook every launch), while the kernel
    has pre-run hooks, under
    ``torch.compiler.is_compiling()``, or when the current CUDA device is not the one the
    kernels were bound on. ``blocked`` is set when the direct launch cannot be used at all
    here (unknown Triton, no knobs)."""

    def __init__(self, device_index: int, kernel=None):
        self.device_index = device_index
        self.blocked: Optional[str] = None
        # JITFunction.run calls the kernel's pre-run hooks before every launch; the direct
        # launch would not. Read live (a hook may be added after the kernel is bound).
        self._kernel = kernel
        # Read only once ``blocked`` is None, i.e. where both exist.
        self._runtime: Any = None if _knobs is None else _knobs.runtime
        self._is_compiling = torch.compiler.is_compiling
        self._get_device: Any = getattr(torch._C, "_cuda_getDevice", None)
        self.raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        if _knobs is None or _HookChain is None:
            self.block("this Triton has no triton.knobs launch hooks to inspect")
        elif (unknown := _unknown_triton()) is not None:
            self.block(unknown)
        elif self.raw_stream is None or self._get_device is None:
            self.block("torch has no raw CUDA stream accessor")

    def block(self, why: str) -> None:
        """No direct launch in this process from now on (logged once per reason)."""
        self.blocked = why
        _log_once(why)

    def ready(self) -> bool:
        if self.blocked is not None:
            return False
        rt = self._runtime
        if not (_quiet(rt.launch_enter_hook) and _quiet(rt.launch_exit_hook)):
            _log_once("a Triton launch hook is set (a profiler?)")
            return False
        if getattr(self._kernel, "pre_run_hooks", None):
            _log_once("the kernel has pre-run hooks")
            return False
        if self._is_compiling():
            return False
        if self._get_device() != self.device_index:
            _log_once("the current CUDA device is not the one the kernels were bound on")
            return False
        return True

    def on_other_device(self) -> bool:
        """The current CUDA device is not the buffer's: a normal launch must switch to
        the buffer's device first, or Triton would launch on the current one."""
        return self._get_device is not None and self._get_device() != self.device_index


def _quiet(hook) -> bool:
    """No launch hook: None, or Triton's default empty ``HookChain`` (3.5+)."""
    return hook is None or (hook.__class__ is _HookChain and not hook.calls)
