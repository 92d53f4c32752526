"""Launch a compiled Triton kernel through its own launcher, skipping ``JITFunction.run``.

Why: ``kernel[grid](...)`` rebuilds the specialization key, looks the kernel up and runs
the launch hooks on every call: about 9-12 µs of host time, against 3-4 µs for the
compiled kernel's own ``run`` (tritonbench #1002/#1005; vLLM #34838: 8.68 -> 4.51 µs).
The relay makes one tiny launch per decode step, so that difference is its host cost.
SGLang ships the same technique (``sglang/kernels/ops/diffusion/common/fast_launch.py``):
bind ``run``, ``function`` and ``packed_metadata`` of one compiled kernel once, call
``run(gx, gy, gz, stream, function, metadata, None, None, None, *args)``, and take the
normal path while a launch hook or pre-run hook is set, under ``torch.compile``, or when
Triton's compiled-kernel API moved. Any surprise blocks it for good (one log line) and
the normal launch runs; the start-up canary checks its results like everything else.
"""

from __future__ import annotations

import logging
from typing import Any, Optional

import torch

from spec_fused.log import log_once

try:
    from triton import knobs
except Exception:  # pragma: no cover - no Triton, or one without triton.knobs (< 3.4)
    knobs = None

__all__ = ["DirectLaunch"]


class DirectLaunch:
    """The direct launch of one kernel on one CUDA device; ``blocked`` says why not."""

    def __init__(self, device_index: int, kernel):
        self.device_index = device_index
        self.kernel = kernel
        self.blocked: Optional[str] = None
        self.raw_stream: Any = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        self._get_device: Any = getattr(torch._C, "_cuda_getDevice", None)
        if knobs is None or self.raw_stream is None or self._get_device is None:
            self.block("this Triton or torch lacks what the direct launch reads")

    def block(self, why: str) -> None:
        self.blocked = why
        log_once(
            ("normal-launch", why), "Triton's normal launch is used (%s)", why, level=logging.INFO
        )

    def bind(self, compiled) -> Optional[tuple]:
        """``(run, function, metadata, compiled)`` of what a normal launch returned, or None
        (and blocked) where Triton's compiled-kernel API is not the one read here."""
        if self.blocked is not None:
            return None
        try:
            bound = (compiled.run, compiled.function, compiled.packed_metadata, compiled)
            takes = len(compiled.src.signature)
        except Exception as exc:  # the interpreter, or a moved API
            self.block(f"no compiled kernel to bind ({type(exc).__name__}: {exc})")
            return None
        if takes != len(self.kernel.arg_names) or not callable(bound[0]) or bound[1] is None:
            self.block(f"the compiled launcher takes {takes} arguments")
            return None
        return bound

    def ready(self) -> bool:
        """False while the normal path must run: a launch hook (a profiler) or a pre-run
        hook is set, ``torch.compile`` is tracing, or another CUDA device is current."""
        runtime = knobs.runtime
        return not (
            self.blocked is not None
            or _hooked(runtime.launch_enter_hook)
            or _hooked(runtime.launch_exit_hook)
            or getattr(self.kernel, "pre_run_hooks", None)
            or torch.compiler.is_compiling()
            or self.on_other_device()
        )

    def on_other_device(self) -> bool:
        """Another CUDA device is current: a normal launch must switch to ours first."""
        return self._get_device is not None and self._get_device() != self.device_index

    def launch(self, bound: tuple, args: tuple) -> None:
        run, function, metadata, _ = bound
        stream = self.raw_stream(self.device_index)
        run(1, 1, 1, stream, function, metadata, None, None, None, *args)


def _hooked(hook) -> bool:
    """A launch hook is set: anything but None or Triton's empty default ``HookChain``."""
    return hook is not None and bool(getattr(hook, "calls", True))
