"""GPU probe: what each ingredient of a relay step costs, one at a time (issue 34, item 1).

Why: the last GPU run measured the fused exact-host-lengths step slower than SGLang's, and
a read names three suspects: zero-copy PCIe on the kernel's critical path (pinned gather
indices, host stores), the private stream, and all of the fused step's GPU work trailing
the host's last call. This times each apart, beside SGLang's step as shipped, in idle and
queued modes; every figure (host µs, device µs, late) is defined in
``spec_fused/tools/timing.py``. Variants (ncsl: needs_cpu_seq_lens, 1 = exact host lengths):

* ``upstream`` (ncsl 0, 1): SGLang's real ``FutureMap``, unpatched: publish scatters on the
  forward stream; resolve waits, gathers and (ncsl 1) copies the whole pool (8·pool bytes)
  on its own stream, synchronizes it, indexes and sums on the host.
* ``spec_fused`` (0, 1): the same, patched, the relay made with ``SPEC_FUSED_UNMEASURED=1``;
  ``relayed``: whether it relays this by default.
* the kernel by hand (1 only), ``gi-{pinned|device}/out-{zc|d2h}/{caller|private}``:
  publish records an event (the scatter is deferred into the launch, as spec_fused's);
  resolve copies the batch's host indices into pinned staging, has the stream (the
  caller's, or a private high-priority one) wait for the event, gathers through the pinned
  staging itself (zero-copy loads) or an H2D copy of it, launches ``kernel[grid]`` writing
  the row ``[*lens, sum]`` into pinned host memory (zero-copy stores; no device lengths
  then) or into a device row followed by one D2H of n + 1 values, records an event, and
  the host waits for it and reads the row.
* floors: ``event`` (the host waits for the publish event), ``empty-kernel`` (the caller's
  stream waits for it, one empty Triton launch, no host wait), ``d2h-16B`` / ``d2h-pool``
  (a private stream waits for it and copies 16 bytes / the whole pool to pinned memory; the
  host waits): the least a GPU-only step, a host-returning step and upstream's copy cost.

Grid: pools 4,096 and 65,536 x batch 1, 32, 256, 1024 x both modes; every variant in every
cell, rounds in seeded shuffled ABBA order, each variant's lengths and sum checked against
the published ones before it is timed. A cell starts only if the time left in
``--budget-s`` covers its estimate. ``probe.json`` keeps every round, the medians, the
GPU's clocks and PCIe link before and after, versions and settings. Nothing asserts a time.

    python -m bench.probe --out DIR              # CUDA, within --budget-s (170 s)
    python -m bench.probe --dry-run --out DIR    # CPU: the plan, every variant's check
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import time
from contextlib import nullcontext

import torch

from bench import harness, measure  # harness first: TRITON_INTERPRET on CPU before triton
from spec_fused.kernels.publish_gather import Args, launch_triton
from spec_fused.tools import selftest, timing

T0 = time.monotonic()
POOLS, BATCHES = (4096, 65536), (1, 32, 256, 1024)
HAND = tuple(
    f"gi-{g}/out-{o}/{s}"
    for g in ("pinned", "device")
    for o in ("zc", "d2h")
    for s in ("caller", "private")
)
FLOORS = {"event": 1, "empty-kernel": 0, "d2h-16B": 1, "d2h-pool": 1}
VARIANTS = [("upstream", 0), ("upstream", 1), ("spec_fused", 0), ("spec_fused", 1)]
VARIANTS += [*((h, 1) for h in HAND), *FLOORS.items()]
SETUP_S, STEP_US = 40.0, 150.0  # estimates: start-up and compiles; a step's own overhead
COLUMNS = ("mode", "pool", "batch", "variant", "needs_cpu_seq_lens", "host_us_median",
           "device_us_median", "host_x", "device_x", "late_steps", "ok")  # fmt: skip


def log(msg: str) -> None:
    print(f"probe [{time.monotonic() - T0:6.1f} s] {msg}", file=sys.stderr, flush=True)


class _Nothing:
    """A CPU stand-in for a stream or an event: every call does nothing."""

    def __getattr__(self, name):
        return lambda *args, **kwargs: None


class _Dev:
    """Pinned memory, private streams and events on CUDA; no-ops on a CPU."""

    def __init__(self, device):
        self.device, self.cuda = device, device.type == "cuda"

    def pinned(self, n: int) -> torch.Tensor:
        return torch.zeros(n, dtype=torch.int64, pin_memory=self.cuda)

    def stream(self):
        return torch.cuda.Stream(self.device, priority=-1) if self.cuda else _Nothing()

    def event(self):
        return torch.cuda.Event() if self.cuda else _Nothing()

    def current(self):
        return torch.cuda.current_stream(self.device) if self.cuda else _Nothing()

    def on(self, stream):
        return torch.cuda.stream(stream) if isinstance(stream, torch.cuda.Stream) else nullcontext()


def hand(dev: _Dev, name: str, buf, idx, vals) -> tuple:
    """One hand-launched variant (module docstring): ``(arm, check)``."""
    n, host_idx = idx.shape[0], idx.cpu()
    staging, row = dev.pinned(n), dev.pinned(n + 1)
    gi_dev, row_dev, out_sum = torch.empty_like(idx), buf.new_empty(n + 1), buf.new_zeros(())
    private = dev.stream() if name.endswith("private") else None
    ready, done, got = dev.event(), dev.event(), {}

    def resolve():
        staging.copy_(host_idx)
        (private or dev.current()).wait_event(ready)
        with dev.on(private):
            gi = staging if "gi-pinned" in name else gi_dev.copy_(staging, non_blocking=True)
            zero_copy = "out-zc" in name
            launch_triton(
                Args(buf, gi, idx, vals, row if zero_copy else row_dev, out_sum, row=True)
            )
            if not zero_copy:
                row.copy_(row_dev, non_blocking=True)
            done.record()
        done.synchronize()
        values = row.numpy()
        got["lens"], got["sum"] = values[:n].copy(), int(values[n])

    arm = timing.Arm(
        name, ready.record, resolve, streams=(private,) if dev.cuda and private else ()
    )

    def check():
        buf.fill_(-1)  # a launch that gathers before it publishes reads -1
        arm.publish()
        arm.resolve()
        want = vals.cpu().numpy()
        if not ((got["lens"] == want).all() and got["sum"] == int(want.sum())):
            raise AssertionError(f"{name}: other lengths than the published ones")

    return arm, check


def floor(dev: _Dev, name: str, buf) -> tuple:
    """One floor (module docstring): ``(arm, check)``; a floor has no lengths to check."""
    ready, done, stream = dev.event(), dev.event(), dev.stream()
    src = buf[:2] if name == "d2h-16B" else buf
    dst, scratch = dev.pinned(src.shape[0]), buf.new_zeros(1)

    def resolve():
        if name == "event":
            ready.synchronize()
        elif name == "empty-kernel":
            dev.current().wait_event(ready)
            measure._empty_kernel[(1,)](scratch)
        else:
            stream.wait_event(ready)
            with dev.on(stream):
                dst.copy_(src, non_blocking=True)
                done.record()
            done.synchronize()

    arm = timing.Arm(name, ready.record, resolve)
    return arm, lambda: (arm.publish(), arm.resolve(), measure.synchronize(buf.device))


def build(device, pool: int, batch: int, clock: timing.Clock) -> tuple:
    """Every variant of one (pool, batch), checked: ``({(variant, ncsl): arm or error},
    {ncsl: spec_fused relays it by default})``."""
    dev, arms, relayed = _Dev(device), {}, {}
    idx, vals = selftest.slots(device, pool, batch)
    for n in (0, 1):
        keys = (("upstream", n), ("spec_fused", n))
        try:
            pairs, exact = selftest.relay_arms(device, pool, batch, bool(n), clock)
            relayed[n] = selftest.relayed_by_default("cuda", exact)  # a dry run: as on a GPU
            arms.update(_checked(key, a, c) for key, (a, c) in zip(keys, pairs))
        except Exception as exc:  # the FutureMaps or the relay could not be made
            arms.update((key, f"{type(exc).__name__}: {exc}"[:300]) for key in keys)
    measure.set_patched(False)
    buf = torch.full((pool,), -1, dtype=torch.int64, device=device)
    for name in HAND:
        arms.update([_checked((name, 1), *hand(dev, name, buf.clone(), idx, vals))])
    for name, n in FLOORS.items():
        arms.update([_checked((name, n), *floor(dev, name, buf.clone()))])
    return arms, relayed


def _checked(key: tuple, arm: timing.Arm, check) -> tuple:
    """``(key, arm)`` renamed ``variant:ncsl``, or ``(key, why)`` if its check failed."""
    try:
        check()
        return key, arm._replace(name=f"{key[0]}:{key[1]}")
    except Exception as exc:
        return key, f"{type(exc).__name__}: {exc}"[:300]


def estimate_s(mode: str, args) -> float:
    """Device seconds one cell (every variant, one mode) is planned to take."""
    per_step = STEP_US + (1.5 * args.busy_us if mode == "queued" else 0.0)
    return len(VARIANTS) * (args.rounds * args.steps + args.warmup) * per_step / 1e6


def rows_for(cell: dict, arms: dict, relayed: dict, measured: dict) -> list:
    """One row per variant of a cell; figures null where it was not timed."""
    rows = []
    for (variant, n), arm in arms.items():
        r = measured.get(f"{variant}:{n}", {})
        base = measured.get(f"upstream:{n}", {})
        rows.append({
            "variant": variant, "needs_cpu_seq_lens": n, **cell,
            "relayed": relayed.get(n) if variant == "spec_fused" else None,
            "ok": None if arm is None else not isinstance(arm, str),  # None: not built
            "error": arm if isinstance(arm, str) else None,
            "host_us": r.get("host_us"), "device_us": r.get("device_us"), "late": r.get("late"),
            "host_us_median": timing.median(r.get("host_us")),
            "device_us_median": timing.median(r.get("device_us")),
            "host_x": timing.paired_x(base.get("host_us"), r.get("host_us")),
            "device_x": timing.paired_x(base.get("device_us"), r.get("device_us")),
            "late_steps": sum(r["late"]) if r and cell["mode"] == "queued" else None,
        })  # fmt: skip
    return rows


def probe(args, device) -> dict:
    clock = timing.Clock(device, busy_us=0.0 if args.dry_run else args.busy_us)
    grid = list(itertools.product(args.pools, args.batches))
    plan = {
        "variants": [{"variant": v, "needs_cpu_seq_lens": n} for v, n in VARIANTS],
        "pools": args.pools, "batches": args.batches, "modes": list(timing.MODES),
        "rounds": args.rounds, "steps": args.steps, "warmup": args.warmup,
        "cells": len(grid) * 2, "rows": len(grid) * 2 * len(VARIANTS),
    }  # fmt: skip
    per_grid = sum(estimate_s(m, args) for m in timing.MODES)
    plan["estimated_device_s"] = round(SETUP_S + per_grid * len(grid), 1)
    log(f"plan: {plan['rows']} rows, about {plan['estimated_device_s']} s of device time")
    rows, skipped, slow = [], [], dict.fromkeys(timing.MODES, 1.0)
    for i, (pool, batch) in enumerate(grid):
        fits = time.monotonic() - T0 + estimate_s("idle", args) * slow["idle"] <= args.budget_s
        if args.dry_run or fits:
            arms, relayed = build(device, pool, batch, clock)
            bad = [k for k, v in arms.items() if isinstance(v, str)]
            log(f"pool {pool} batch {batch}: {len(arms) - len(bad)} checked, {len(bad)} failed")
        else:  # not even built: nothing of it fits the budget
            arms, relayed = dict.fromkeys(VARIANTS), {}
        for mode in timing.MODES:
            cell, measured = {"mode": mode, "pool": pool, "batch": batch}, {}
            timed = [a for a in arms.values() if isinstance(a, timing.Arm)]
            if args.dry_run and i == 0 and mode == "idle":  # the runner on CPU; nothing kept
                timing.run(timed, clock, mode="idle", rounds=2, steps=1, seed=0, warmup=0)
            elif not args.dry_run:
                need = estimate_s(mode, args) * slow[mode]
                if time.monotonic() - T0 + need > args.budget_s:
                    skipped.append(cell | {"why": f"budget: {need:.1f} s would not fit"})
                    rows += rows_for(cell, arms, relayed, {})
                    continue
                t = time.monotonic()
                seed = args.seed * 1_000 + len(rows)
                measured = timing.run(timed, clock, mode=mode, rounds=args.rounds,
                                      steps=args.steps, seed=seed, warmup=args.warmup)  # fmt: skip
                took = time.monotonic() - t
                slow[mode] = max(slow[mode], took / estimate_s(mode, args))
                log(f"  {mode}: {took:.1f} s")
            rows += rows_for(cell, arms, relayed, measured)
    measure.set_patched(False)
    return {"plan": plan, "rows": rows, "skipped": skipped, "busy_cycles": clock.cycles}


def plot(rows: list, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pools = sorted({r["pool"] for r in rows})
    fig, axes = plt.subplots(2, len(pools), figsize=(7.5 * len(pools), 10), squeeze=False)
    for ax, (mode, pool) in zip(axes.flat, itertools.product(timing.MODES, pools)):
        series: dict = {}
        for r in rows:
            if (r["mode"], r["pool"]) == (mode, pool) and r["device_us_median"]:
                xs, ys = series.setdefault(f"{r['variant']}:{r['needs_cpu_seq_lens']}", ([], []))
                xs.append(r["batch"]), ys.append(r["device_us_median"])
        harness.plot_lines(series, path, ax=ax, title=f"{mode}, pool {pool}", xlabel="batch",
                           ylabel="device µs per step (median of rounds)")  # fmt: skip
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.probe", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--dry-run", action="store_true", help="CPU: the plan and every check")
    parser.add_argument("--out", metavar="DIR", help="default: bench/results/<device>/")
    parser.add_argument("--budget-s", type=float, default=170.0, help="never run past this")
    parser.add_argument("--rounds", type=int, default=10, help="per cell (even: ABBA)")
    parser.add_argument("--steps", type=int, default=25, help="per variant and round")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--busy-us", type=float, default=300.0, help="queued: the busy kernel")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--pools", type=int, nargs="+", default=list(POOLS))
    parser.add_argument("--batches", type=int, nargs="+", default=list(BATCHES))
    parser.add_argument("--no-plot", action="store_true")
    args = parser.parse_args(argv)
    cuda = torch.cuda.is_available()
    if args.dry_run and os.environ.get("TRITON_INTERPRET") != "1":
        print(
            "probe: --dry-run checks on CPU tensors; hide CUDA (CUDA_VISIBLE_DEVICES=)",
            file=sys.stderr,
        )
        return 2
    if not (cuda or args.dry_run):
        print("probe: no CUDA device: it times a GPU; on a CPU, --dry-run writes the plan and "
              "runs every variant's check", file=sys.stderr)  # fmt: skip
        return 2
    device = torch.device("cpu" if args.dry_run else "cuda")
    gpu = {"before": harness.gpu_state() if cuda else None}
    result = probe(args, device)
    gpu["after"] = harness.gpu_state() if cuda else None
    payload = {
        "dry_run": args.dry_run, "device": harness.device_name(device),
        "versions": harness.versions(device), "gpu": gpu,
        "figures": "spec_fused/tools/timing.py (module docstring)",
        "config": {k: v for k, v in vars(args).items() if k not in ("out", "no_plot")}
        | {"busy_cycles": result.pop("busy_cycles"), "wall_s": round(time.monotonic() - T0, 1)},
        **result,
    }  # fmt: skip
    rows = payload["rows"]
    failed = sorted({r["variant"] for r in rows if r["ok"] is False})
    table = harness.format_table(rows, COLUMNS)
    draw = None if args.no_plot or args.dry_run else lambda p: plot(rows, p)
    count = f"{len(rows)} rows" + (" (dry run: no figures)" if args.dry_run else "")
    out_dir = harness.results_dir(device, args.out)
    harness.write_results("probe", out_dir, payload, tables=[table], plot=draw, count=count)
    if failed:
        print(f"probe: FAILED checks: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
