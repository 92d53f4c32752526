"""GPU probe: what each ingredient of a relay step costs, one at a time (issues 34 and 37).

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
  resolve copies the batch's host indices into pinned staging; on the stream (the
  caller's, or a private high-priority one) copies them up (``gi-device``, before the wait,
  as the relay does), waits for the event, gathers through that copy or the pinned staging
  itself (zero-copy loads), launches ``kernel[grid]`` writing
  the row ``[*lens, sum]`` into pinned host memory (zero-copy stores; no device lengths
  then) or into a device row followed by one D2H of n + 1 values, records an event, and
  the host waits for it and reads the row.
* floors: ``event`` (the host waits for the publish event), ``empty-kernel`` (the caller's
  stream waits for it, one empty Triton launch, no host wait), ``d2h-16B`` / ``d2h-pool``
  (a private stream waits for it and copies 16 bytes / the whole pool to pinned memory; the
  host waits): the least a GPU-only step, a host-returning step and upstream's copy cost.

Queued mode runs behind graphed bf16 GEMMs (a verify of ``--busy-us`` before the publish
point, a draft extend of half that after it: ``spec_fused/tools/forward.py``), so the
step's launches contend for SMs as in serving. ``spec_fused``'s rows say whether its relay
resolved every step of the cell, warm-up included (``engaged``); a cell where it handed
one back to SGLang has no ratio, and the exit status is 1.

Grid (``CELLS``, in this order; a batch fits only below its pool, since SGLang draws
distinct slots past slot 0): pool 1,024 x batch 1, 32, 256 (the hardest case for the fused
step: upstream's full-pool copy is only 8 KB), pool 4,096 x batch 1, 32, 256, 1,024
(SGLang's default 2-4 k slots), pool 65,536 x batch 1, 256. Pool 65,536's batches 32 and
1,024 were dropped (issue 37) to pay for pool 1,024 within ``--budget-s`` 75: the largest
pool is the fused step's easiest case (a 512 KB upstream copy), ahead on the last H100.
Each cell x both modes; every variant in every cell, rounds in seeded shuffled ABBA order,
each variant's lengths and sum checked against the published ones before it is timed. A
cell starts only if the time left in ``--budget-s`` covers its estimate (its steps, the
filler's measured µs included). ``probe.json`` keeps every round, the medians, the GPU's
clocks and PCIe link before and after, the filler, versions and settings. Nothing asserts
a time. ``--dry-run`` prints the plan (cells, modes, variants, the device time it would
take) and every variant's check, not a table of empty figures.

    python -m bench.probe --out DIR              # CUDA, within --budget-s (75 s)
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
BATCHES = (1, 32, 256, 1024)
CELLS = [(1024, b) for b in BATCHES[:3]] + [(4096, b) for b in BATCHES] + [(65536, 1), (65536, 256)]
HAND = tuple(
    f"gi-{g}/out-{o}/{s}"
    for g in ("pinned", "device")
    for o in ("zc", "d2h")
    for s in ("caller", "private")
)
FLOORS = {"event": 1, "empty-kernel": 0, "d2h-16B": 1, "d2h-pool": 1}
VARIANTS = [("upstream", 0), ("upstream", 1), ("spec_fused", 0), ("spec_fused", 1)]
VARIANTS += [*((h, 1) for h in HAND), *FLOORS.items()]
SETUP_S = 25.0  # estimate: imports, FutureMaps, the canary's and variants' compiles, GEMMs
COLUMNS = ("mode", "pool", "batch", "variant", "needs_cpu_seq_lens", "host_us_median",
           "device_us_median", "host_x", "device_x", "late_steps", "engaged", "ok")  # fmt: skip


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
        with dev.on(private):
            gi = staging if "gi-pinned" in name else gi_dev.copy_(staging, non_blocking=True)
            (private or dev.current()).wait_event(ready)
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


def estimate_s(clock: timing.Clock, mode: str, args) -> float:
    """Device seconds one cell (every variant, one mode) is planned to take."""
    plan = {k: getattr(args, k) for k in ("rounds", "steps", "warmup", "busy_us")}
    return timing.estimate_s(clock, mode, len(VARIANTS), **plan)


def rows_for(cell: dict, arms: dict, relayed: dict, measured: dict) -> list:
    """One row per variant of a cell; figures null where it was not timed."""
    rows = []
    for (variant, n), arm in arms.items():
        r = measured.get(f"{variant}:{n}", {})
        base = measured.get(f"upstream:{n}", {})
        on = r.get("engaged")  # spec_fused's relay resolved every step (None: no relay)
        x = {k: None if on is False else timing.paired_x(base.get(k), r.get(k))
             for k in ("host_us", "device_us")}  # fmt: skip
        rows.append({
            "variant": variant, "needs_cpu_seq_lens": n, **cell,
            "relayed": relayed.get(n) if variant == "spec_fused" else None,
            "ok": None if arm is None else not isinstance(arm, str),  # None: not built
            "error": arm if isinstance(arm, str) else None, "engaged": on,
            "host_us": r.get("host_us"), "device_us": r.get("device_us"), "late": r.get("late"),
            "engaged_steps": r.get("engaged_steps"), "warmup_engaged": r.get("warmup_engaged"),
            "host_us_median": timing.median(r.get("host_us")),
            "device_us_median": timing.median(r.get("device_us")),
            "host_x": x["host_us"], "device_x": x["device_us"],
            "late_steps": sum(r["late"]) if r.get("late") and cell["mode"] == "queued" else None,
        })  # fmt: skip
    return rows


def grid(args) -> list:
    """``(pool, batch)`` cells: ``CELLS``, or ``--pools`` x ``--batches`` where it fits."""
    if args.pools is None and args.batches is None:
        return list(CELLS)
    pools, batches = args.pools or sorted({p for p, _ in CELLS}), args.batches or BATCHES
    return [(p, b) for p, b in itertools.product(pools, batches) if b < p]


def make_plan(args, clock: timing.Clock) -> dict:
    """The plan, in probe.json and printed: cells, modes, variants, device seconds."""
    cells = grid(args)
    per = {m: round(estimate_s(clock, m, args), 2) for m in timing.MODES}
    est = SETUP_S + sum(per.values()) * len(cells)
    return {
        "variants": [{"variant": v, "needs_cpu_seq_lens": n} for v, n in VARIANTS],
        "grid": [{"pool": p, "batch": b} for p, b in cells], "modes": list(timing.MODES),
        "rounds": args.rounds, "steps": args.steps, "warmup": args.warmup,
        "cells": len(cells) * 2, "rows": len(cells) * 2 * len(VARIANTS),
        "estimated_s_per_cell": per, "setup_s": SETUP_S,
        "estimated_device_s": round(est, 1), "estimated_device_min": round(est / 60, 1),
        "budget_s": args.budget_s, "filler_us": clock.queued_us(args.busy_us),
        "filler_calibrated": clock.filler is not None,
    }  # fmt: skip


def probe(args, device) -> dict:
    clock = timing.Clock(device, busy_us=0.0 if args.dry_run else args.busy_us)
    plan = make_plan(args, clock)
    log(f"plan: {plan['rows']} rows, about {plan['estimated_device_s']} s of device time")
    rows, skipped, slow = [], [], dict.fromkeys(timing.MODES, 1.0)
    for i, (pool, batch) in enumerate(grid(args)):
        need = estimate_s(clock, "idle", args) * slow["idle"]
        fits = time.monotonic() - T0 + need <= args.budget_s
        if args.dry_run or fits:
            arms, relayed = build(device, pool, batch, clock)
            bad = [k for k, v in arms.items() if isinstance(v, str)]
            log(f"pool {pool} batch {batch}: {len(arms) - len(bad)} checked, {len(bad)} failed")
        else:  # not even built: nothing of it fits the budget
            arms, relayed = dict.fromkeys(VARIANTS), {}
        for mode in timing.MODES:
            cell, measured = {"mode": mode, "pool": pool, "batch": batch}, {}
            timed = [a for a in arms.values() if isinstance(a, timing.Arm)]
            if args.dry_run and i == 0 and mode == "idle":  # the runner on CPU: engagement kept
                ran = timing.run(timed, clock, mode="idle", rounds=2, steps=1, seed=0, warmup=0)
                measured = {k: {"engaged": v["engaged"]} for k, v in ran.items()}
            elif not args.dry_run:
                need = estimate_s(clock, mode, args) * slow[mode]
                if time.monotonic() - T0 + need > args.budget_s:
                    skipped.append(cell | {"why": f"budget: {need:.1f} s would not fit"})
                    rows += rows_for(cell, arms, relayed, {})
                    continue
                t = time.monotonic()
                seed = args.seed * 1_000 + len(rows)
                measured = timing.run(timed, clock, mode=mode, rounds=args.rounds,
                                      steps=args.steps, seed=seed, warmup=args.warmup)  # fmt: skip
                took = time.monotonic() - t
                slow[mode] = max(slow[mode], took / estimate_s(clock, mode, args))
                log(f"  {mode}: {took:.1f} s")
            rows += rows_for(cell, arms, relayed, measured)
    measure.set_patched(False)
    return {"plan": plan, "rows": rows, "skipped": skipped, "filler": clock.filler}


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
    parser.add_argument("--budget-s", type=float, default=75.0, help="never run past this")
    parser.add_argument("--rounds", type=int, default=10, help="per cell (even: ABBA)")
    parser.add_argument("--steps", type=int, default=25, help="per variant and round")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--busy-us", type=float, default=300.0, help="queued: the verify's µs")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--pools", type=int, nargs="+", help="with --batches: not CELLS")
    parser.add_argument("--batches", type=int, nargs="+")
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
        | {"wall_s": round(time.monotonic() - T0, 1)},
        **result,
    }  # fmt: skip
    rows = payload["rows"]
    failed = sorted({r["variant"] for r in rows if r["ok"] is False})
    off = [r for r in rows if r["engaged"] is False]
    tables = plan_tables(payload["plan"], rows)
    if not args.dry_run:  # on a CPU every figure is empty: the plan says what a GPU would run
        tables.append(harness.format_table(rows, COLUMNS))
    draw = None if args.no_plot or args.dry_run else lambda p: plot(rows, p)
    count = f"{len(rows)} rows" + (" (dry run: no figures)" if args.dry_run else "")
    out_dir = harness.results_dir(device, args.out)
    harness.write_results("probe", out_dir, payload, tables=tables, plot=draw, count=count)
    if failed:
        print(f"probe: FAILED checks: {', '.join(failed)}", file=sys.stderr)
    if off:
        cells = ", ".join(f"{r['mode']} pool {r['pool']} batch {r['batch']} ncsl "
                          f"{r['needs_cpu_seq_lens']}" for r in off)  # fmt: skip
        print(f"probe: NOT ENGAGED (steps handed back to SGLang, no ratio): {cells}",
              file=sys.stderr)  # fmt: skip
    return 1 if failed or off else 0


def plan_tables(plan: dict, rows: list) -> list:
    """The plan: a line per cell (its checks, its device seconds), then what it adds up to."""
    per, n = plan["estimated_s_per_cell"], len(plan["variants"])
    cells = []
    for g in plan["grid"]:
        mine = [r for r in rows if (r["pool"], r["batch"]) == (g["pool"], g["batch"])]
        checked = {(r["variant"], r["needs_cpu_seq_lens"]): r["ok"] for r in mine}
        cells.append(g | {"modes": " + ".join(plan["modes"]), "variants": n,
                          "checked_ok": sum(v is True for v in checked.values()),
                          "failed": sum(v is False for v in checked.values()),
                          **{f"device_s_{m}": per[m] for m in plan["modes"]}})  # fmt: skip
    cols = ["pool", "batch", "modes", "variants", "checked_ok", "failed"]
    head = harness.format_table(cells, cols + [f"device_s_{m}" for m in plan["modes"]])
    names = ", ".join(f"{v['variant']}:{v['needs_cpu_seq_lens']}" for v in plan["variants"])
    return [
        head,
        f"plan: {len(plan['grid'])} cells x {len(plan['modes'])} modes x {n} variants = "
        f"{plan['rows']} rows, {plan['rounds']} rounds x {plan['steps']} steps + "
        f"{plan['warmup']} warm-up a variant; about {plan['estimated_device_s']} s "
        f"({plan['estimated_device_min']} min) of device time with {plan['setup_s']:.0f} s of "
        f"set-up, within --budget-s {plan['budget_s']:.0f}; queued steps carry "
        f"{plan['filler_us']:.0f} µs of GEMMs ("
        f"{'calibrated' if plan['filler_calibrated'] else '1.5 x --busy-us until a GPU calibrates'}"
        f")\nvariants (name:ncsl): {names}",
    ]


if __name__ == "__main__":
    sys.exit(main())
