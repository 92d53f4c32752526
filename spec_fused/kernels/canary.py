"""The start-up canary: prove on the device, before serving, that the fused step is right.

Why: the CUDA path meets its first GPU at a user's. Before the first request, every specialization
the relay will launch runs on scratch data through the path it will use - the direct
launch, the normal launch, the pinned host ring, a private high-priority stream, and in
debug mode the poisoning launcher - and each result (lengths, sum, host row and stamp,
the published buffer) is compared with the torch reference. A wrong result steps down
(direct -> normal launch -> torch reference), one log line each.

A *fault* is different: an illegal address or a device-side assert kills the CUDA context
of the process it happens in. So on CUDA the scheduler first runs the canary in a child
process (:func:`child_canary`), before it allocates its pools: a kernel that faults there
costs the child, and the device is served by SGLang's own relay, with one log line. The
child holds a CUDA context for a few seconds and exits before SGLang measures free memory
for its pools, so it takes nothing from ``mem_fraction_static``; its time and memory are
in the verdict (``doctor``, ``selftest``). Where no child could run, a sticky fault in the
in-process canary escapes like one in the relay (:mod:`spec_fused.faults`): a server on a
dead context must not start.

Run as ``python -m spec_fused.kernels.canary DEVICE [--debug]``: the child's entry point;
it prints one JSON line.
"""

from __future__ import annotations

import contextlib
import json
import logging
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any, Optional

import torch

from spec_fused.faults import is_sticky_fault, raise_if_sticky
from spec_fused.kernels import publish_gather as kernel
from spec_fused.kernels.backend import Verdict, backend_for, device_key, record_verdict
from spec_fused.kernels.step_launcher import StepLauncher

__all__ = ["CASES", "CanaryMismatch", "canary", "child_canary", "prewarm"]

logger = logging.getLogger("spec_fused")

# (publish values dtype or None, gather from pinned host indices, host mirror, batch):
# every combination the relay launches, and the publish-only launch that lands a pending publish.
CASES = [
    (values, pinned, host, 4)
    for values in (torch.int64, torch.int32, None)
    for pinned in (False, True)
    for host in (False, True)
] + [(torch.int64, False, False, 0), (torch.int32, False, False, 0)]
CHILD_TIMEOUT_S = 300.0  # a cold Triton cache compiles every specialization in the child


class CanaryMismatch(AssertionError):
    """A launch gave other results than the torch reference on the same inputs."""


class _DirectLaunchFailed(Exception):
    """The per-step (direct) launch failed a case its normal launch had just passed."""


def _check_case(launcher, mirror, case, step: int, per_step: bool, stream, sync) -> bool:
    """One launch of ``case`` through ``launcher`` (``per_step``: the per-step path, which
    is the direct launch where bound; else the checked, normal launch), compared with
    the reference run on the host mirror of the same buffer (poisoning as the launcher
    does, in debug mode). Returns whether the launch went through the direct launch."""
    values_dtype, pinned, host, n = case
    device = launcher.buf.device
    gen = torch.Generator().manual_seed(1000 + step)
    pool = launcher.buf.shape[0]
    slots = torch.randperm(pool - 1, generator=gen)[:6] + 1
    gather_cpu, publish_cpu = slots[:n], slots[2:]
    values_cpu = torch.randint(0, 1 << 20, (publish_cpu.shape[0],), generator=gen)
    want = kernel.publish_gather_reference(
        mirror,
        gather_cpu,
        publish_cpu if values_dtype else None,
        values_cpu.to(values_dtype) if values_dtype else None,
        poison=launcher.poison,
    )
    gather = launcher.stage_host_indices(gather_cpu) if pinned else gather_cpu.to(device)
    pi = publish_cpu.to(device) if values_dtype else None
    pv = values_cpu.to(values_dtype).to(device) if values_dtype else None
    direct = per_step and launcher.launches_directly(gather, pi, pv, host)
    with stream:
        out = (launcher.launch if per_step else launcher.launch_checked)(gather, pi, pv, host)
        sync()
    got = out.cpu()
    if not torch.equal(got, want.seq_lens):
        raise CanaryMismatch(f"lengths {got.tolist()} != {want.seq_lens.tolist()} ({case})")
    if n and int(launcher.out_sum) != int(want.seq_lens_sum):
        raise CanaryMismatch(f"sum {int(launcher.out_sum)} != {int(want.seq_lens_sum)} ({case})")
    if host:
        lens, total = launcher.read_row(launcher.stamp, got.shape[0])
        if not torch.equal(lens, want.seq_lens) or total != int(want.seq_lens_sum):
            raise CanaryMismatch(
                f"host row {lens.tolist()}/{total} != "
                f"{want.seq_lens.tolist()}/{int(want.seq_lens_sum)} ({case})"
            )
    if not torch.equal(launcher.buf.cpu(), mirror):
        raise CanaryMismatch(f"the published buffer differs from the reference's ({case})")
    return direct


def _run_cases(launcher, stream, sync, *, per_step: bool) -> tuple[int, bool]:
    """Each case through the normal launch (a failure there is the kernel's), then, when
    ``per_step``, through the per-step launch (a failure there is the direct launch's:
    :class:`_DirectLaunchFailed`). A poisoning (debug) launcher starts each check from a
    fresh buffer, as consumed rows may not be read again. Returns the cases run and
    whether every per-step launch went through the direct launch."""
    base = torch.arange(launcher.buf.shape[0], dtype=torch.int64) * 7
    mirror = base.clone()
    launcher.buf.copy_(mirror)

    def fresh():
        if launcher.poison:
            mirror.copy_(base)
            launcher.buf.copy_(base)

    n, all_direct = 0, per_step
    for step, case in enumerate(CASES):
        fresh()
        _check_case(launcher, mirror, case, step, False, stream, sync)  # compiles, binds
        n += 1
        if per_step:
            fresh()
            try:
                all_direct &= _check_case(launcher, mirror, case, 100 + step, True, stream, sync)
            except Exception as exc:
                raise_if_sticky(
                    exc,
                    f"spec_fused's start-up canary on {launcher.buf.device} "
                    f"(the direct launch, case {case})",
                    logger,
                )
                raise _DirectLaunchFailed(f"{type(exc).__name__}: {exc}") from exc
            n += 1
    return n, all_direct


def canary(device, *, debug: bool = False, make_launcher=None) -> Verdict:
    """Prove the fused step on ``device`` (see the module docstring) and file the verdict
    for the relay. A mismatch or an error of the direct launch blocks it (the normal
    launch is used); one of the normal launch - the kernel itself - or a canary that
    cannot even set up puts the device on the reference. A sticky device fault escapes,
    noted (:mod:`spec_fused.faults`). It costs seconds on a cold Triton cache (every
    specialization compiles), far less on a warm one, and nothing per step; the verdict says how
    long it took. ``make_launcher(buf, backend)`` stands in for the launcher (tests)."""
    device = torch.device(device)
    if make_launcher is None:

        def make_launcher(buf, backend):
            return StepLauncher(buf, backend=backend, poison=debug, validate=debug, debug=debug)

    backend = backend_for(device)
    previous = _child_report(device)
    verdict = record_verdict(Verdict(str(device), backend, direct=False, child=previous))
    if backend not in ("triton", "interpreter"):
        return verdict  # the reference is what the others are held to
    started = time.perf_counter()
    try:
        return _prove(verdict, device, backend, make_launcher)
    finally:
        verdict.seconds = time.perf_counter() - started


def _prove(verdict: Verdict, device, backend: str, make_launcher) -> Verdict:
    where = f"spec_fused's start-up canary on {verdict.device}"
    try:
        scratch = torch.zeros((64,), dtype=torch.int64, device=device)
        stream: Any
        if device.type == "cuda":
            private = torch.cuda.Stream(device, priority=-1)
            stream, sync = torch.cuda.stream(private), private.synchronize
        else:
            stream, sync = contextlib.nullcontext(), (lambda: None)
        launcher = make_launcher(scratch, backend)
        cases, all_direct = _run_cases(launcher, stream, sync, per_step=True)
        verdict.cases += cases
        # What ran, not what was allowed: a launch hook or a device switch makes the
        # per-step path take the normal launch, and the verdict says so.
        verdict.direct = launcher.uses_direct_launch() and all_direct
        return verdict
    except _DirectLaunchFailed as exc:
        verdict.notes.append(f"the direct launch failed the canary ({exc}): normal launch")
        _log(verdict.device, verdict.notes[-1])
    except Exception as exc:
        raise_if_sticky(exc, where, logger)
        return _on_reference(verdict, f"{type(exc).__name__}: {exc}")
    try:
        launcher = make_launcher(scratch, backend)
        launcher.block_direct_launch("the start-up canary failed the direct launch")
        verdict.cases += _run_cases(launcher, stream, sync, per_step=False)[0]
    except Exception as exc:
        raise_if_sticky(exc, where, logger)
        return _on_reference(verdict, f"{type(exc).__name__}: {exc}")
    return verdict


def _on_reference(verdict: Verdict, why: str) -> Verdict:
    """Nothing fused proven on this device: the torch reference serves there."""
    verdict.backend, verdict.direct = "reference", False
    verdict.notes.append(f"the fused kernel failed the canary ({why}): torch reference")
    _log(verdict.device, verdict.notes[-1])
    return verdict


def _log(device, note: str) -> None:
    logger.warning("spec_fused: start-up canary on %s: %s", device, note)


def prewarm(device, *, debug: bool = False) -> Verdict:
    """Compile and prove, before serving: the canary runs every specialization the relay launches
    on ``device`` (``debug``: the relay's debug-mode launcher), so nothing is compiled or
    loaded while a server is serving."""
    return canary(device, debug=debug)


# ---------------------------------------------------------------------------- child


_child_reports: dict = {}


def _child_report(device) -> Optional[dict]:
    return _child_reports.get(device_key(device))


def child_canary(
    device,
    *,
    debug: bool = False,
    command: Optional[Sequence[str]] = None,
    timeout: float = CHILD_TIMEOUT_S,
) -> dict:
    """Run the canary for ``device`` in a child process and file what it found.

    Returns the child's report: ``ok`` (it ran and exited cleanly), ``fault`` (why the
    device is left to SGLang, or None), ``seconds``, ``gpu_bytes`` (the GPU memory the
    child held at its end, context included, where it could be measured) and the child's
    ``verdict``. A child that faulted, died, hung or reported a sticky fault files a
    refusal: the relay does not engage on the device, SGLang's own relay serves it, one
    log line says why. A child that could not even be started proves nothing either way:
    the in-process canary then runs as before. ``command`` replaces the child's command
    line (tests)."""
    key = device_key(device)
    argv = (
        list(command)
        if command is not None
        else [sys.executable, "-m", "spec_fused.kernels.canary", key]
        + (["--debug"] if debug else [])
    )
    free_before = _free_bytes(key)
    started = time.perf_counter()
    report: dict = {"ok": False, "fault": None, "seconds": None, "gpu_bytes": None, "verdict": None}
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        report["seconds"] = time.perf_counter() - started
        return _refuse(key, report, f"the canary's child process did not finish in {timeout:.0f} s")
    except OSError as exc:
        logger.warning(
            "spec_fused: start-up canary on %s: no child process could run (%s); "
            "the canary runs in the scheduler process",
            key,
            exc,
        )
        return report
    report["seconds"] = time.perf_counter() - started
    found = _last_json_line(done.stdout)
    if found is not None:
        report["verdict"] = found.get("verdict")
        free_after = found.get("free_bytes")
        if free_before is not None and free_after is not None:
            report["gpu_bytes"] = max(0, free_before - free_after)
    if done.returncode != 0 or found is None or found.get("fault"):
        why = (found or {}).get("fault") or _tail(done.stderr) or f"exit status {done.returncode}"
        return _refuse(
            key, report, f"the fused kernel faulted in the canary's child process ({why})"
        )
    report["ok"] = True
    _child_reports[key] = report
    return report


def _refuse(key: str, report: dict, why: str) -> dict:
    report["fault"] = why
    _child_reports[key] = report
    record_verdict(Verdict(key, "sglang", direct=False, notes=[why], child=report))
    logger.warning(
        "spec_fused: start-up canary on %s: %s; SGLang's own relay serves this device", key, why
    )
    return report


def _free_bytes(key: str) -> Optional[int]:
    if not key.startswith("cuda"):
        return None
    try:
        return int(torch.cuda.mem_get_info(torch.device(key))[0])
    except Exception:
        return None


def _last_json_line(text: str) -> Optional[dict]:
    for line in reversed((text or "").splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                return None
    return None


def _tail(text: str, limit: int = 300) -> str:
    lines = [line for line in (text or "").strip().splitlines() if line.strip()]
    return lines[-1][-limit:] if lines else ""


def _child_main(argv: Sequence[str]) -> int:
    """The child: run the canary on the device, print one JSON line. A sticky fault is
    reported as such (and the child exits non-zero); a crash speaks through its exit
    status."""
    args = list(argv)
    debug = "--debug" in args
    device = torch.device(next(a for a in args if not a.startswith("--")))
    out: dict = {"device": str(device), "fault": None, "verdict": None, "free_bytes": None}
    try:
        verdict = canary(device, debug=debug)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            out["free_bytes"] = int(torch.cuda.mem_get_info(device)[0])
        out["verdict"] = {
            "backend": verdict.backend,
            "direct": verdict.direct,
            "cases": verdict.cases,
            "notes": verdict.notes,
            "seconds": verdict.seconds,
        }
    except Exception as exc:
        if not is_sticky_fault(exc):
            raise
        out["fault"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
        print(json.dumps(out), flush=True)
        return 3
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":  # pragma: no cover - run as the child process
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    sys.exit(_child_main(sys.argv[1:]))
