"""``spec-fused selftest``: correct here, and this much faster than SGLang here.

Why: spec_fused's CUDA path may meet its first GPU on a user's server. Before serving,
one command checks the installed device as the server would run the relay - the same
SGLang, the same environment (``SPEC_FUSED_*`` included), the same backend - and prints
a verdict with the figures behind it:

* the start-up canary's verdict (every launch variant against the torch reference);
* correctness: random continuous-batching traces through the real SGLang ``FutureMap``,
  patched against unpatched, EAGLE and DFLASH, ``needs_cpu_seq_lens`` 1 (exact host
  lengths: on CUDA the private stream and the pinned ring) and 0 (none; and, where the
  environment does not already choose, ``reserved`` and the barrier-free variant); on
  CUDA the traces run SGLang's stream pattern, and the paths that must not sync run
  under PyTorch's own detector (``torch.cuda.set_sync_debug_mode("error")``);
* speed: per relay step, host µs and device µs (CUDA events) for upstream, spec_fused,
  spec_fused through the normal launch, and one empty launch, at batch 1, 32, 256, 1024.

A relay that does not engage (a bad override, SGLang refusing it, a broken backend) or
gives other lengths than SGLang is a failure and a non-zero exit, never a pass. On a CPU
the kernel runs in the Triton interpreter: its times are printed, and said not to be GPU
times.
"""

from __future__ import annotations

import contextlib
import json
import logging
import platform
import statistics
import time
from typing import Optional

import torch

from spec_fused import settings

__all__ = ["render", "run"]

ALGORITHMS = ("EAGLE", "DFLASH")
BATCHES = (1, 32, 256, 1024)
# (needs_cpu_seq_lens, environment, every seed?): what the relay can run on this device.
# The overridden ones run where the user's environment leaves the choice open, so a
# user's own override is what gets checked, never replaced.
CONFIGS = (
    (True, {}, True),
    (False, {}, True),
    (False, {settings.HOST_SEQ_LENS.name: "reserved"}, False),
    (False, {settings.HOST_SEQ_LENS.name: "reserved", settings.WAR_BARRIER.name: "0"}, False),
)


def _versions(device) -> dict:
    from spec_fused.tools.doctor import versions

    out = dict(versions())
    out["device"] = (
        torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else platform.processor() or platform.machine()
    )
    return out


def _plugin() -> dict:
    from spec_fused.integration import sglang_patch

    off = sglang_patch.disabled_by()
    if off is not None:
        return {
            "ok": False,
            "reason": f"{sglang_patch.ENV_DISABLE}={off}: spec_fused is "
            f"disabled here, nothing it would run was checked",
        }
    try:
        version = sglang_patch.check_supported()
    except Exception as exc:  # UnsupportedSGLangError, or anything the probe tripped on
        return {"ok": False, "reason": f"spec_fused would not load: {exc}"}
    return {"ok": True, "reason": f"SGLang {version}: the patch applies"}


@contextlib.contextmanager
def _no_sync(device):
    """PyTorch's own detector: any synchronizing CUDA op on these paths raises."""
    if device.type != "cuda":
        yield
        return
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode("default")


def _configs():
    """``CONFIGS`` less the overridden ones whose variables the environment sets."""
    for needs_cpu, env, every_seed in CONFIGS:
        if env and any(k in settings.source() for k in env):
            continue
        yield needs_cpu, env, every_seed


def _correctness_case(algorithm, needs_cpu, seed, device, quick, env=None) -> dict:
    from spec_fused.tools.traces import TraceConfig

    cfg = TraceConfig(
        seed=seed,
        pool=256,
        steps=20 if quick else 40,
        max_running=32,
        p_mixed=0.0 if not needs_cpu else 0.15,
        verify_cycles=200_000 if device.type == "cuda" else 0,
    )
    case = {
        "algorithm": algorithm,
        "needs_cpu_seq_lens": int(needs_cpu),
        "seed": seed,
        "env": dict(env or {}),
    }
    with settings.overridden(env):
        return _check_trace(case, algorithm, needs_cpu, cfg, device)


def _check_trace(case, algorithm, needs_cpu, cfg, device) -> dict:
    from spec_fused import relay as relay_mod
    from spec_fused.integration import sglang_patch
    from spec_fused.tools.traces import make_future_map, run_trace

    sglang_patch.apply()
    try:
        fm = make_future_map(algorithm, cfg, device=device, needs_cpu_seq_lens=needs_cpu)
        relay = relay_mod.relay_for(fm)
        if relay is None:
            lines = [m for m in _LOG.lines if "relay" in m or "refused" in m]
            case.update(
                ok=False, why="the relay did not engage" + (f": {lines[-1]}" if lines else "")
            )
            return case
        case.update(
            host_lengths=relay.host_seq_lens, variant=relay.variant, backend=relay.launcher.backend
        )
        exact = relay.gives_host_lengths(fm)
        guard = contextlib.nullcontext if exact else (lambda: _no_sync(device))
        try:
            got = run_trace(fm, cfg, guard=guard)
        except Exception as exc:  # a sync on a path that must not sync, or worse
            case.update(ok=False, why=f"{type(exc).__name__}: {str(exc)[:300]}")
            return case
        case["direct_launch"] = relay.launcher.uses_direct_launch()
    finally:
        sglang_patch.remove()
    # SGLang's own FutureMap on the same trace; where the relay gives exact host lengths
    # on backends that opt out (an explicit "exact" claim), SGLang's as a backend that
    # reads them would get them.
    want = run_trace(
        make_future_map(algorithm, cfg, device=device, needs_cpu_seq_lens=needs_cpu or exact), cfg
    )
    bad = [i for i, (g, w) in enumerate(zip(got, want)) if g != w]
    if len(got) != len(want) or bad:
        step = bad[0] if bad else min(len(got), len(want))
        case.update(
            ok=False,
            why=f"lengths differ from SGLang's at step {step} "
            f"({want[step].kind if step < len(want) else '?'})",
        )
    else:
        case.update(ok=True, steps=len(got), why="")
    return case


def _speed(device, quick) -> list:
    from spec_fused.tools import measure

    steps = (200 if not quick else 100) if device.type == "cuda" else 5
    rounds = 5 if device.type == "cuda" else 2
    names = ("upstream", "spec_fused", "spec_fused-jit", "floor-direct")
    rows = []
    for needs_cpu in (False, True):
        for batch in BATCHES:
            providers = measure.build_providers("EAGLE", device, needs_cpu, batch, names=names)
            host = measure.measure_cell(providers, device, rounds, steps, warmup=5)
            for p in providers:
                if p.patched is not None:
                    measure.set_patched(p.patched)
                dev_us = measure.device_us(p.step, steps, device)
                measure.set_patched(False)
                rows.append(
                    {
                        "provider": p.name,
                        "needs_cpu_seq_lens": int(needs_cpu),
                        "batch": batch,
                        "host_us": statistics.median(host[p.name]),
                        "device_us": dev_us,
                    }
                )
    by = {(r["needs_cpu_seq_lens"], r["batch"], r["provider"]): r for r in rows}
    for r in rows:
        up = by[(r["needs_cpu_seq_lens"], r["batch"], "upstream")]
        r["host_x_upstream"] = r["host_us"] / up["host_us"]
        r["device_x_upstream"] = (
            r["device_us"] / up["device_us"] if r["device_us"] and up["device_us"] else None
        )
    return rows


class _Log(logging.Handler):
    """spec_fused's own log lines during the run (what a server would have logged)."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())


_LOG = _Log()


def run(*, quick: bool = False, device: Optional[str] = None) -> dict:
    """Everything ``selftest`` checks, as one JSON-serialisable dict; ``ok`` is the
    verdict (the exit status is 0 exactly when it is True)."""
    from spec_fused import log

    logger = log.logger
    _LOG.lines.clear()
    log.reset()
    logger.addHandler(_LOG)
    level = logger.level
    logger.setLevel(logging.INFO)
    try:
        report = _run(quick, device)
    finally:
        logger.removeHandler(_LOG)
        logger.setLevel(level)
    report["log"] = list(dict.fromkeys(_LOG.lines))
    return report


def _run(quick: bool, device: Optional[str]) -> dict:
    from spec_fused.kernels.backend import device_key, explain_backend, ignored_force_backend
    from spec_fused.kernels.canary import canary, child_canary

    t0 = time.perf_counter()
    # One key per physical device: the verdict proven here is the one the relay reads.
    device = torch.device(device_key(device or ("cuda" if torch.cuda.is_available() else "cpu")))
    report = {
        "device": str(device),
        "versions": _versions(device),
        "quick": quick,
        "gpu_times": device.type == "cuda",
    }
    report["plugin"] = _plugin()
    ignored = ignored_force_backend()
    if report["plugin"]["ok"] and ignored is not None:
        report["plugin"] = {"ok": False, "reason": f"bad override: {ignored}"}
    if not report["plugin"]["ok"]:
        report.update(ok=False, verdict=report["plugin"]["reason"])
        return report
    from spec_fused.upstream import debug_enabled

    # As a server starts: the canary in a child process first (a fault costs the child),
    # then in this one - each with what it cost here.
    child = child_canary(device, debug=debug_enabled())
    if child["fault"]:
        report["canary"] = {"child": child, "describe": f"child process: {child['fault']}"}
        report.update(
            ok=False,
            verdict=f"the fused kernel faulted here ({child['fault']}): "
            f"a server leaves this device to SGLang's own relay",
        )
        return report
    verdict = canary(device, debug=debug_enabled())  # as the server's prewarm runs it
    report["canary"] = {
        "backend": verdict.backend,
        "direct": verdict.direct,
        "cases": verdict.cases,
        "notes": verdict.notes,
        "seconds": verdict.seconds,
        "child": child,
        "describe": verdict.describe(),
    }
    report["backend"] = explain_backend(device)[1]
    seeds = (0, 1) if quick else (0, 1, 2, 3)
    report["correctness"] = [
        _correctness_case(a, needs_cpu, s, device, quick, env)
        for needs_cpu, env, every_seed in _configs()
        for a in ALGORITHMS
        for s in (seeds if every_seed else seeds[:1])
    ]
    correct = all(c["ok"] for c in report["correctness"])
    report["speed"] = _speed(device, quick) if correct else []
    report["wall_s"] = round(time.perf_counter() - t0, 1)
    report["ok"] = correct
    report["verdict"] = _verdict(report)
    return report


# On CPU the figure is the backend's, not the kernel's speed: say which, and that the
# interpreter's (TRITON_INTERPRET=1, milliseconds a launch) is a correctness run only.
_CPU_TIMES = {
    "interpreter": " - CPU times of the Triton interpreter (a correctness run, not speed; "
    "without TRITON_INTERPRET a CPU server runs the torch reference), NOT GPU "
    "times",
}


def _verdict(report: dict) -> str:
    if not report["ok"]:
        failed = [c for c in report["correctness"] if not c["ok"]]
        first = failed[0]
        return (
            f"NOT correct here: {len(failed)} of {len(report['correctness'])} traces "
            f"failed (first: {first['algorithm']}, needs_cpu_seq_lens="
            f"{first['needs_cpu_seq_lens']}: {first['why']})"
        )
    ours = [r["host_x_upstream"] for r in report["speed"] if r["provider"] == "spec_fused"]
    text = (
        f"correct here ({len(report['correctness'])} traces equal SGLang's); host time "
        f"per relay step {statistics.median(ours):.2f}x SGLang's (median over "
        f"{len(ours)} cells)"
    )
    dev = [
        r["device_x_upstream"]
        for r in report["speed"]
        if r["provider"] == "spec_fused" and r["device_x_upstream"]
    ]
    if dev:
        text += f", device time {statistics.median(dev):.2f}x"
    if not report["gpu_times"]:
        text += _CPU_TIMES.get(
            report["canary"]["backend"], " - CPU times of the torch reference, NOT GPU times"
        )
    if report["canary"]["notes"]:
        text += f"; the canary stepped down: {'; '.join(report['canary']['notes'])}"
    return text


def render(report: dict) -> str:
    v = report.get("versions", {})
    out = [
        f"spec_fused selftest on {report['device']} ({v.get('device')}): SGLang "
        f"{v.get('sglang')}, torch {v.get('torch')}, triton {v.get('triton')}, driver "
        f"{v.get('driver')}",
        f"  plugin: {report['plugin']['reason']}",
    ]
    if "canary" in report:
        out.append(f"  canary: {report['canary']['describe']}")
        out.append(f"  backend: {report.get('backend', '-')}")
    cases = report.get("correctness", [])
    if cases:
        out += [
            "",
            "Correctness (random traces, patched vs SGLang's own FutureMap)",
            "  algorithm  needs_cpu_seq_lens  host lengths  variant       result",
        ]
        for c in cases:
            env = " ".join(f"{k}={v}" for k, v in c.get("env", {}).items())
            out.append(
                f"  {c['algorithm']:<9}  {c['needs_cpu_seq_lens']:<18}  "
                f"{c.get('host_lengths', '-'):<12}  {c.get('variant', '-'):<12}  "
                f"{'ok' if c['ok'] else 'FAIL: ' + c['why']}" + (f"  ({env})" if env else "")
            )
    if report.get("speed"):
        unit = (
            "µs"
            if report["gpu_times"]
            else "µs (CPU, interpreter: not GPU times; "
            "the normal-launch and empty-launch rows are CUDA only)"
        )
        out += [
            "",
            f"Speed per relay step, EAGLE ({unit}; x = ratio to SGLang's)",
            "  ncsl  batch  provider        host        device",
        ]
        for r in report["speed"]:
            dev = (
                "-"
                if r["device_us"] is None
                else f"{r['device_us']:.1f} ({r['device_x_upstream']:.2f}x)"
            )
            out.append(
                f"  {r['needs_cpu_seq_lens']:<4}  {r['batch']:<5}  {r['provider']:<14}"
                f"  {r['host_us']:.1f} ({r['host_x_upstream']:.2f}x)  {dev}"
            )
    if report.get("log"):
        out += ["", "spec_fused's log during the run"] + [f"  {m}" for m in report["log"]]
    out += ["", f"=> {report['verdict']}"]
    return "\n".join(out)


def dump(report: dict, path: str) -> None:
    with open(path, "w") as fh:
        json.dump(report, fh, indent=2, default=str)
        fh.write("\n")
