"""The start-up canary: prove on the device, before serving, that the fused step is right.

Why: the CUDA path meets its GPU at a user's. While SGLang builds a speculative
``FutureMap`` (before the first request), every specialization the relay will launch runs
once on scratch data on that rank's own device, through the launcher the relay will
build (debug mode as it will use it), first through Triton's normal launch, then through
the per-step path (the direct launch where bound). Each result - lengths, the row's sum,
the published buffer - is compared with the torch reference. The kernel touches device
memory only, so Confidential Computing proves the same launches. A wrong or failing
direct launch blocks it for the device (the normal launch serves); a wrong or failing
kernel puts the device on the torch reference; one log line each. A sticky fault escapes
naming spec_fused and ``SPEC_FUSED_DISABLE=1`` (:mod:`spec_fused.faults`): a server on a
dead context must not start. It compiles every specialization here, so none compiles while serving.
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Any

import torch

from spec_fused.faults import raise_if_sticky
from spec_fused.kernels import publish_gather as kernel
from spec_fused.kernels.backend import Verdict, backend_for, record_verdict
from spec_fused.kernels.step_launcher import StepLauncher

__all__ = ["CASES", "CanaryMismatch", "canary"]

logger = logging.getLogger("spec_fused")

# (publish values dtype or None, a row [*lens, sum], batch): every combination the relay
# launches, and the publish-only launch that lands a pending publish.
CASES = [
    (values, row, 4) for values in (torch.int64, torch.int32, None) for row in (False, True)
] + [(torch.int64, False, 0), (torch.int32, False, 0)]


class CanaryMismatch(AssertionError):
    """A launch gave other results than the torch reference on the same inputs."""


def _check(launcher: StepLauncher, mirror, case, seed: int, per_step: bool, sync) -> None:
    values_dtype, row, n = case
    gen = torch.Generator().manual_seed(seed)
    slots = torch.randperm(launcher.buf.shape[0] - 1, generator=gen)[:6] + 1
    gather_cpu, publish_cpu = slots[:n], slots[2:]
    values = torch.randint(0, 1 << 20, (4,), generator=gen).to(values_dtype or torch.int64)
    publish = (publish_cpu, values) if values_dtype else (None, None)
    want = kernel.publish_gather_reference(mirror, gather_cpu, *publish, poison=launcher.poison)
    device = launcher.buf.device
    pi, pv = (publish_cpu.to(device), values.to(device)) if values_dtype else (None, None)
    launch = launcher.launch if per_step else launcher.launch_checked
    out = launch(gather_cpu.to(device), pi, pv, row).cpu()
    sync()
    seen: dict = {
        "lengths": (out[:n].tolist(), want.seq_lens.tolist()),
        "published buffer": (launcher.buf.cpu().tolist(), mirror.tolist()),
    }
    if row:
        seen["sum"] = (int(out[n]), int(want.seq_lens_sum))
    for what, (got, expected) in seen.items():
        if got != expected:
            raise CanaryMismatch(f"{what} {got} != {expected} (case {case})")


def canary(device, *, debug: bool = False) -> Verdict:
    """Prove the fused step on ``device`` and file the verdict the relay's launchers read
    (:func:`~spec_fused.kernels.backend.verdict_for`)."""
    device = torch.device(device)
    backend = backend_for(device)
    verdict = record_verdict(Verdict(str(device), backend))
    if backend not in ("triton", "interpreter"):
        return verdict  # the reference is what the others are held to
    started = time.perf_counter()
    where = f"spec_fused's start-up canary on {verdict.device}"
    on_cuda = device.type == "cuda"
    place = torch.cuda.device(device) if on_cuda else contextlib.nullcontext()
    try:
        with place:
            stream: Any = torch.cuda.Stream(device, priority=-1) if on_cuda else None
            sync = stream.synchronize if on_cuda else (lambda: None)
            with torch.cuda.stream(stream) if on_cuda else contextlib.nullcontext():
                _prove(verdict, device, debug, sync)
    except Exception as exc:
        raise_if_sticky(exc, where, logger)
        verdict.backend, verdict.direct = "reference", False
        _note(
            verdict,
            f"the fused kernel failed the canary ({type(exc).__name__}: {exc}): torch reference",
        )
    finally:
        verdict.seconds = time.perf_counter() - started
    return verdict


def _prove(verdict: Verdict, device, debug: bool, sync) -> None:
    launcher = StepLauncher(
        torch.zeros((64,), dtype=torch.int64, device=device), poison=debug, validate=debug
    )
    base = torch.arange(64, dtype=torch.int64) * 7
    mirror = base.clone()
    launcher.buf.copy_(base)
    direct = launcher.uses_direct_launch()
    for i, case in enumerate(CASES):
        for per_step in (False, True):
            if launcher.poison:  # consumed rows may not be read again: start afresh
                mirror.copy_(base)
                launcher.buf.copy_(base)
            usable, before = launcher.uses_direct_launch(), launcher.direct_launches
            why = None
            try:
                _check(launcher, mirror, case, 1000 + i, per_step, sync)
            except Exception as exc:
                if not (per_step and usable):
                    raise  # the kernel itself, through the normal launch: the reference
                raise_if_sticky(exc, f"spec_fused's start-up canary on {verdict.device}", logger)
                launcher.block_direct_launch("the start-up canary failed the direct launch")
                why = str(exc)
                mirror.copy_(launcher.buf.cpu())
            if per_step and usable and not launcher.uses_direct_launch():
                why = why or launcher._direct.blocked
                _note(verdict, f"the direct launch failed the canary ({why}): normal launch")
            verdict.cases += 1
            direct &= not per_step or launcher.direct_launches > before
    verdict.direct = direct and launcher.uses_direct_launch()


def _note(verdict: Verdict, note: str) -> None:
    verdict.notes.append(note)
    logger.warning("spec_fused: start-up canary on %s: %s", verdict.device, note)
