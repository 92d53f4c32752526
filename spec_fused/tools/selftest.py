"""``spec-fused selftest``: correct here, and this much faster than SGLang here.

Why: the CUDA path may meet its first GPU on a user's server. One command checks the
device as the server would run the relay (the installed SGLang, the same ``SPEC_FUSED_*``,
the same backend): the start-up canary; random continuous-batching traces through SGLang's
real ``FutureMap``, patched against unpatched, EAGLE and DFLASH, ``needs_cpu_seq_lens`` 1
and 0 (on CUDA in SGLang's stream pattern, the GPU-only path under PyTorch's sync
detector); and one relay step timed against SGLang's (``torch.utils.benchmark``, and
``triton.testing.do_bench`` for the device) - on a CPU the production CPU path (the torch
reference), never the Triton interpreter. A relay that does not engage, or gives other
lengths than SGLang, fails (exit 1).
"""

from __future__ import annotations

import contextlib
import json
import statistics
import time
from typing import Optional

import torch

__all__ = ["render", "run"]

ALGORITHMS = ("EAGLE", "DFLASH")
BATCHES = (1, 32, 256, 1024)


def _plugin() -> Optional[str]:
    """Why the relay would not run here, or None."""
    from spec_fused.caps import caps_for
    from spec_fused.integration import sglang_patch
    from spec_fused.kernels.backend import ignored_force_backend

    if (off := sglang_patch.disabled_by()) is not None:
        return f"SPEC_FUSED_DISABLE={off}: disabled here, nothing it would run was checked"
    try:
        sglang_patch.check_supported()
    except Exception as exc:  # UnsupportedSGLangError, or anything the probe tripped on
        return f"spec_fused would not load: {exc}"
    ignored = ignored_force_backend()
    if ignored is not None:
        return f"bad override: {ignored}"
    try:
        caps_for("EAGLE")  # reads SPEC_FUSED_WAR_BARRIER / SPEC_FUSED_HOST_SEQ_LENS
    except ValueError as exc:
        return f"bad override: {exc}"
    return None


@contextlib.contextmanager
def _no_sync(device):
    """PyTorch's own detector: any synchronizing CUDA op on the path raises."""
    if device.type != "cuda":
        yield
        return
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode("default")


def _trace(algorithm: str, needs_cpu: bool, seed: int, device, quick: bool) -> dict:
    """One random trace through the patched FutureMap, then through SGLang's own."""
    from spec_fused.integration import sglang_patch
    from spec_fused.relay import relay_for
    from spec_fused.tools.traces import TraceConfig, make_future_map, run_trace

    cfg = TraceConfig(
        seed=seed,
        pool=256,
        steps=20 if quick else 40,
        max_running=32,
        p_mixed=0.15 if needs_cpu else 0.0,
        verify_cycles=200_000 if device.type == "cuda" else 0,
    )
    case = {"algorithm": algorithm, "needs_cpu_seq_lens": int(needs_cpu), "seed": seed}
    sglang_patch.apply()
    try:
        fm = make_future_map(algorithm, cfg, device=device, needs_cpu_seq_lens=needs_cpu)
        relay = relay_for(fm)
        if relay is None:
            return case | {"ok": False, "why": "the relay did not engage (see the log)"}
        exact = relay.gives_host_lengths(fm)
        case |= {"variant": relay.variant, "backend": relay.launcher.backend}
        try:
            got = run_trace(
                fm, cfg, guard=contextlib.nullcontext if exact else lambda: _no_sync(device)
            )
        except Exception as exc:  # a sync on a path that must not sync, or worse
            return case | {"ok": False, "why": f"{type(exc).__name__}: {str(exc)[:300]}"}
    finally:
        sglang_patch.remove()
    # SGLang's own, giving host lengths wherever the relay does (an explicit "exact" claim)
    want = run_trace(make_future_map(algorithm, cfg, device=device, needs_cpu_seq_lens=exact), cfg)
    bad = [i for i, (g, w) in enumerate(zip(got, want)) if g != w]
    if bad or len(got) != len(want):
        step = bad[0] if bad else min(len(got), len(want))
        return case | {"ok": False, "why": f"lengths differ from SGLang's at step {step}"}
    return case | {"ok": True, "why": ""}


def _step(algorithm: str, device, needs_cpu: bool, batch: int, fused: bool):
    """One relay step (publish + resolve) on a fresh FutureMap, as a closure; on CPU the
    relay runs its production backend, the torch reference."""
    from spec_fused.integration import sglang_patch
    from spec_fused.relay import relay_for
    from spec_fused.tools.traces import TraceConfig, decode_batch, make_future_map

    (sglang_patch.apply if fused else sglang_patch.remove)()
    fm = make_future_map(
        algorithm, TraceConfig(pool=4096, max_len=1), device=device, needs_cpu_seq_lens=needs_cpu
    )
    if fused and device.type == "cpu":
        relay_for(fm).launcher.backend = "reference"
    gen = torch.Generator().manual_seed(batch)
    idx = (torch.randperm(4095, generator=gen)[:batch] + 1).to(device)
    vals = torch.randint(1, 1 << 15, (batch,), generator=gen).to(device)
    b = decode_batch(idx)

    def step():
        fm.publish(idx, vals)
        fm.resolve_seq_lens_cpu(b)

    return step


def _speed(device, quick: bool) -> list:
    """Host µs per relay step (``torch.utils.benchmark``, patched and unpatched in turn,
    three rounds, median ratio) and device µs on CUDA (``triton.testing.do_bench``)."""
    from torch.utils import benchmark

    from spec_fused.integration import sglang_patch

    rows = []
    for needs_cpu in (False, True):
        for batch in BATCHES[:2] if quick else BATCHES:
            cell = {"needs_cpu_seq_lens": int(needs_cpu), "batch": batch, "host_us": {}}
            for _ in range(3):
                for name, fused in (("upstream", False), ("spec_fused", True)):
                    step = _step("EAGLE", device, needs_cpu, batch, fused)
                    step()  # warm: the relay is made, the kernel compiled
                    t = benchmark.Timer("step()", globals={"step": step}).blocked_autorange(
                        min_run_time=0.05
                    )
                    cell["host_us"].setdefault(name, []).append(t.median * 1e6)
                    if device.type == "cuda":
                        from triton.testing import do_bench

                        cell.setdefault("device_us", {})[name] = do_bench(step) * 1e3
            sglang_patch.remove()
            cell["host_x"] = statistics.median(
                f / u for f, u in zip(cell["host_us"]["spec_fused"], cell["host_us"]["upstream"])
            )
            rows.append(cell)
    return rows


def run(*, quick: bool = False, device: Optional[str] = None) -> dict:
    """Everything ``selftest`` checks, as one JSON-serialisable dict; ``ok`` is the
    verdict (the exit status is 0 exactly when it is True)."""
    from spec_fused.kernels.backend import device_key
    from spec_fused.kernels.canary import canary
    from spec_fused.tools.doctor import versions
    from spec_fused.upstream import confidential_compute, debug_enabled

    t0 = time.perf_counter()
    dev = torch.device(device_key(device or ("cuda" if torch.cuda.is_available() else "cpu")))
    report: dict = {"device": str(dev), "versions": versions(), "gpu_times": dev.type == "cuda"}
    refused = _plugin()
    if refused is not None:
        return report | {"ok": False, "verdict": refused}
    verdict = canary(dev, debug=debug_enabled(), pinned=not confidential_compute())
    report["canary"] = verdict.describe()
    seeds = (0, 1) if quick else (0, 1, 2, 3)
    report["correctness"] = [
        _trace(a, n, s, dev, quick) for n in (True, False) for a in ALGORITHMS for s in seeds
    ]
    report["ok"] = all(c["ok"] for c in report["correctness"])
    report["speed"] = _speed(dev, quick) if report["ok"] else []
    report["wall_s"] = round(time.perf_counter() - t0, 1)
    report["verdict"] = _verdict(report, verdict.notes)
    return report


def _verdict(report: dict, notes: list) -> str:
    cases = report["correctness"]
    if not report["ok"]:
        failed = [c for c in cases if not c["ok"]]
        first = failed[0]
        return (
            f"NOT correct here: {len(failed)} of {len(cases)} traces failed (first: "
            f"{first['algorithm']}, needs_cpu_seq_lens={first['needs_cpu_seq_lens']}: "
            f"{first['why']})"
        )
    ratio = statistics.median(r["host_x"] for r in report["speed"])
    where = "" if report["gpu_times"] else " (CPU: the production CPU path, the torch reference)"
    text = (
        f"correct here ({len(cases)} traces equal SGLang's); host time per relay step "
        f"{ratio:.2f}x SGLang's{where}"
    )
    return text + (f"; the canary stepped down: {'; '.join(notes)}" if notes else "")


def render(report: dict) -> str:
    v = report["versions"]
    out = [
        f"spec_fused selftest on {report['device']}: SGLang {v['sglang']}, torch {v['torch']}, "
        f"triton {v['triton']}, GPUs {v['gpus']}"
    ]
    if "canary" in report:
        out.append(f"  canary: {report['canary']}")
    for c in report.get("correctness", []):
        result = "ok" if c["ok"] else f"FAIL: {c['why']}"
        out.append(
            f"  trace {c['algorithm']:<6} needs_cpu_seq_lens={c['needs_cpu_seq_lens']} seed "
            f"{c['seed']}: {c.get('variant', '-')}, {c.get('backend', '-')}: {result}"
        )
    for r in report.get("speed", []):
        host = {k: statistics.median(v) for k, v in r["host_us"].items()}
        dev = r.get("device_us", {})
        out.append(
            f"  speed ncsl={r['needs_cpu_seq_lens']} bs={r['batch']:<5} host µs upstream "
            f"{host['upstream']:.1f}, spec_fused {host['spec_fused']:.1f} ({r['host_x']:.2f}x)"
            + (f"; device µs {dev['upstream']:.1f} -> {dev['spec_fused']:.1f}" if dev else "")
        )
    return "\n".join([*out, f"=> {report['verdict']}"])


def dump(report: dict, path: str) -> None:
    with open(path, "w") as fh:
        json.dump(report, fh, indent=2, default=str)
        fh.write("\n")
