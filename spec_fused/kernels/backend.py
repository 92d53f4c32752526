"""Which implementation runs the fused step on a device, compiled ahead of serving.

Why these live together: choosing a backend (compiled Triton, the interpreter, the torch
reference, or the benchmarks' ``null`` seam), compiling its variants before the first
request (``prewarm``) and proving on the device that what was compiled gives the
reference's answers (the start-up canary) are one decision - which code is trusted to
run here - and ``doctor`` reports it from this module.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Optional

import torch

from spec_fused import settings
from spec_fused.kernels import publish_gather as kernel
from spec_fused.log import emit

__all__ = ["BACKENDS", "ENV_BENCH", "ENV_FORCE_BACKEND", "Verdict", "backend_for", "canary",
           "explain_backend", "explain_relay_backend", "prewarm", "verdict_for"]

# The three of backend_for, plus "null" (SPEC_FUSED_FORCE_BACKEND=null with
# SPEC_FUSED_BENCH=1): the whole host path and no device work, to price the wrapper.
BACKENDS = ("triton", "interpreter", "reference", "null")


def explain_backend(device) -> tuple[str, str]:
    """``(backend, why)`` for ``device``: what :func:`backend_for` picks, and the reason."""
    device = torch.device(device)
    if settings.FORCE_REFERENCE.on():
        return "reference", "SPEC_FUSED_FORCE_REFERENCE=1"
    proven = _verdicts.get(str(device))
    if proven is not None and proven.backend == "reference" and proven.downgraded:
        return "reference", f"start-up canary: {proven.notes[-1]}"
    if kernel._publish_gather_kernel is None:
        return "reference", "no Triton (import failed): plain-torch reference"
    if kernel._IS_INTERPRETED:
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
    return "null", f"{ENV_FORCE_BACKEND}=null with {ENV_BENCH}=1: no device work, " \
                   f"results unspecified (benchmarks only)"


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


# ---------------------------------------------------------------------------- canary


@dataclass
class Verdict:
    """What the start-up canary proved on one device: the backend the relay will use
    there, whether the direct launch may be used, and each step down with why."""

    device: str
    backend: str
    direct: bool
    cases: int = 0
    notes: list = field(default_factory=list)

    @property
    def downgraded(self) -> bool:
        return bool(self.notes)

    def describe(self) -> str:
        how = "direct launch" if self.direct else "normal launch"
        if self.backend not in ("triton", "interpreter"):
            how = "torch reference"
        text = f"{how}: {self.cases} cases match the torch reference"
        return text if not self.notes else f"{text}; " + "; ".join(self.notes)


_verdicts: dict = {}


def verdict_for(device) -> Optional[Verdict]:
    """The canary's verdict for ``device`` in this process, if it ran."""
    return _verdicts.get(str(torch.device(device)))


# (publish values dtype or None, gather from pinned host indices, host mirror, batch):
# every combination the relay launches, and the publish-only launch of a flush.
_CASES = [(values, pinned, host, 4)
          for values in (torch.int64, torch.int32, None)
          for pinned in (False, True)
          for host in (False, True)] + [(torch.int64, False, False, 0),
                                        (torch.int32, False, False, 0)]


class CanaryMismatch(AssertionError):
    """A launch gave other results than the torch reference on the same inputs."""


class _DirectLaunchFailed(Exception):
    """The per-step (direct) launch failed a case its normal launch had just passed."""


def _check_case(launcher, mirror, case, step: int, lean: bool, stream, sync) -> None:
    """One launch of ``case`` through ``launcher`` (``lean``: the per-step path, which
    is the direct launch where bound; else the checked, normal launch), compared with
    the reference run on the host mirror of the same buffer (poisoning as the launcher
    does, in debug mode)."""
    values_dtype, pinned, host, n = case
    device = launcher.buf.device
    gen = torch.Generator().manual_seed(1000 + step)
    pool = launcher.buf.shape[0]
    slots = torch.randperm(pool - 1, generator=gen)[:6] + 1
    gather_cpu, publish_cpu = slots[:n], slots[2:]
    values_cpu = torch.randint(0, 1 << 20, (publish_cpu.shape[0],), generator=gen)
    want = kernel.publish_gather_reference(
        mirror, gather_cpu, publish_cpu if values_dtype else None,
        values_cpu.to(values_dtype) if values_dtype else None, poison=launcher.poison)
    gather = launcher.stage_host_indices(gather_cpu) if pinned else gather_cpu.to(device)
    pi = publish_cpu.to(device) if values_dtype else None
    pv = values_cpu.to(values_dtype).to(device) if values_dtype else None
    with stream:
        out = (launcher.launch if lean else launcher.launch_checked)(gather, pi, pv, host)
        sync()
    got = out.cpu()
    if not torch.equal(got, want.seq_lens):
        raise CanaryMismatch(f"lengths {got.tolist()} != {want.seq_lens.tolist()} ({case})")
    if n and int(launcher.out_sum) != int(want.seq_lens_sum):
        raise CanaryMismatch(f"sum {int(launcher.out_sum)} != {int(want.seq_lens_sum)} "
                             f"({case})")
    if host:
        lens, total = launcher.read_row(launcher.stamp, got.shape[0])
        if not torch.equal(lens, want.seq_lens) or total != int(want.seq_lens_sum):
            raise CanaryMismatch(f"host row {lens.tolist()}/{total} != "
                                 f"{want.seq_lens.tolist()}/{int(want.seq_lens_sum)} ({case})")
    if not torch.equal(launcher.buf.cpu(), mirror):
        raise CanaryMismatch(f"the published buffer differs from the reference's ({case})")


def _run_cases(launcher, stream, sync, *, lean: bool) -> int:
    """Each case through the normal launch (a failure there is the kernel's), then, when
    ``lean``, through the per-step launch (a failure there is the direct launch's:
    :class:`_DirectLaunchFailed`). A poisoning (debug) launcher starts each check from a
    fresh buffer, as consumed rows may not be read again."""
    base = torch.arange(launcher.buf.shape[0], dtype=torch.int64) * 7
    mirror = base.clone()
    launcher.buf.copy_(mirror)

    def fresh():
        if launcher.poison:
            mirror.copy_(base)
            launcher.buf.copy_(base)

    n = 0
    for step, case in enumerate(_CASES):
        fresh()
        _check_case(launcher, mirror, case, step, False, stream, sync)  # compiles, binds
        n += 1
        if lean:
            fresh()
            try:
                _check_case(launcher, mirror, case, 100 + step, True, stream, sync)
            except Exception as exc:
                raise _DirectLaunchFailed(f"{type(exc).__name__}: {exc}") from exc
            n += 1
    return n


def canary(device, *, debug: bool = False, make_launcher=None) -> Verdict:
    """Before serving: every variant the relay will launch on ``device`` runs on scratch
    data through the path it will use - the direct launch, the normal launch, the pinned
    host ring, a private high-priority stream, and with ``debug`` the poisoning variant
    the relay then builds - and each result (lengths, sum, host row and stamp, the
    published buffer) is compared with the torch reference. A mismatch or an error of the
    direct launch blocks it (the normal launch is used); one of the normal launch - the
    kernel itself - or a canary that cannot even set up puts the device on the reference.
    Each step down is one log line; ``doctor`` and ``selftest`` show the verdict. It
    costs milliseconds at start-up and nothing per step. ``make_launcher(buf, backend)``
    stands in for the launcher (tests)."""
    from spec_fused.kernels.step_launcher import PublishGather

    device = torch.device(device)
    if make_launcher is None:
        def make_launcher(buf, backend):
            return PublishGather(buf, backend=backend, poison=debug, validate=debug,
                                 debug=debug)
    backend = backend_for(device)
    verdict = Verdict(str(device), backend, direct=False)
    _verdicts[str(device)] = verdict
    if backend not in ("triton", "interpreter"):
        return verdict  # the reference is what the others are held to
    try:
        scratch = torch.zeros((64,), dtype=torch.int64, device=device)
        if device.type == "cuda":
            private = torch.cuda.Stream(device, priority=-1)
            stream, sync = torch.cuda.stream(private), private.synchronize
        else:
            stream, sync = contextlib.nullcontext(), (lambda: None)
        launcher = make_launcher(scratch, backend)
        verdict.cases += _run_cases(launcher, stream, sync, lean=True)
        verdict.direct = launcher.uses_direct_launch()
        return verdict
    except _DirectLaunchFailed as exc:
        verdict.notes.append(f"the direct launch failed the canary ({exc}): normal launch")
        _log(device, verdict.notes[-1])
    except Exception as exc:
        return _on_reference(verdict, f"{type(exc).__name__}: {exc}")
    try:
        launcher = make_launcher(scratch, backend)
        launcher.block_direct_launch("the start-up canary failed the direct launch")
        verdict.cases += _run_cases(launcher, stream, sync, lean=False)
    except Exception as exc:
        return _on_reference(verdict, f"{type(exc).__name__}: {exc}")
    return verdict


def _on_reference(verdict: Verdict, why: str) -> Verdict:
    """Nothing fused proven on this device: the torch reference serves there."""
    verdict.backend, verdict.direct = "reference", False
    verdict.notes.append(f"the fused kernel failed the canary ({why}): torch reference")
    _log(verdict.device, verdict.notes[-1])
    return verdict


def _log(device, note: str) -> None:
    emit("start-up canary on %s: %s", device, note)


def prewarm(device, *, debug: bool = False) -> Verdict:
    """Compile and prove, before serving: the canary runs every variant the relay launches
    on ``device`` (``debug``: the relay's debug-mode launcher), so nothing is compiled or
    loaded while a server is serving."""
    return canary(device, debug=debug)
