"""A/B of the relay inside SGLang 0.5.23's overlap decode loop, with a synthetic forward.

SGLang's real ``FutureMap`` in ``event_loop_overlap`` / ``run_batch``'s order on 3 streams.
Launching forward N+1 the host waits for forward N-1's end (result processing), busy-loops
``--host-us`` + ``--host-us-per-req`` x batch µs (a stated stand-in for scheduling), stages
the batch's indices (H2D) and resolves while forward N runs. The forward
(``spec_fused/tools/forward.py``): verify (graphed bf16 GEMMs of Llama-3-8B layers at batch x
draft tokens), ``publish``, the draft extend. WAR barrier: a read-done event at the forward's
top, or ``--barrier coarse``. Configurations (``CONFIGS``): NGRAM-like (exact host lengths,
no draft), EAGLE-like exact (exact host lengths and a draft after the publish, as EAGLE on
FlashInfer), DFLASH/EAGLE-like (GPU-only lengths, a draft). Pools: 4,096 slots (SGLang's
default 2-4 k) and, for exact host lengths, 1,024 (the fused step's hardest case: upstream's
full-pool copy shrinks to 8 KB; the GPU-only step copies no pool).
Arms, ABBA then BAAB: A SGLang as shipped; B spec_fused (``SPEC_FUSED_UNMEASURED=1``),
checked after every block to have resolved each of its steps itself (``timing.engagement``:
a hand-back times SGLang against itself, so such a cell reads "not engaged", no ratio, and
the exit status is 1); C (exact host lengths only) a GPU-only FutureMap plus a host upper
bound, what planning ahead could gain. Steps/s and GPU idle per step come from CUDA events
around each forward. Every cell gets an equal share of what is left of ``--budget-s``, and
starts only if ``MIN_STEPS`` a block fit its estimate.
It cannot show FlashInfer's planning (its host copies block again later in a real step),
sampling, the tokenizer, real attention, SGLang's real scheduler, NGRAM's corpus update.
``--dry-run`` (the only mode on CPU): the plan, null figures, each arm run 3 toy steps.
Usage: ``python -m bench.ab_loop [--dry-run] --out DIR [--budget-s 200: all GPU wall time]``.
"""

from __future__ import annotations

import argparse
import collections
import gc
import sys
import time

import torch

from bench import harness, measure  # harness first: TRITON_INTERPRET on CPU, before triton
from spec_fused import measured, settings
from spec_fused.tools import timing
from spec_fused.tools.forward import LLAMA, TOY, Forward
from spec_fused.tools.traces import decode_batch

T0 = time.monotonic()
LAYER_BYTES = 2 * (LLAMA[1] + LLAMA[0] + 3 * LLAMA[2]) * LLAMA[0]  # 436 MB of bf16
CONFIGS = {  # label: algorithm, exact host lengths, a draft after the publish, arms, pools
    "NGRAM-like": ("NGRAM", True, False, "ABC", (4096, 1024)),
    "EAGLE-like exact": ("EAGLE", True, True, "ABC", (4096, 1024)),
    "DFLASH/EAGLE-like": ("DFLASH", False, True, "AB", (4096,)),
}
ABBA = (0, 1, 1, 0, 1, 0, 0, 1)  # 1: the round runs the arms in reverse
SETUP_S, MIN_STEPS, WARMUP = 20.0, 30, 30
DRY = ["--dry-run"]
UNMEASURED = {"SPEC_FUSED_UNMEASURED": "1"}
NOOP = type("NoOp", (), {"__getattr__": lambda *_: lambda *_: None})()  # CPU streams, events


def log(msg: str) -> None:
    print(f"ab_loop [{time.monotonic() - T0:6.1f} s] {msg}", file=sys.stderr, flush=True)


class NotEngaged(Exception):
    """Arm B handed steps back to SGLang: its figures would time SGLang against itself."""


class Loop:
    """The overlap loop at one concurrency: its forward parts, streams, events; ``at(pool)``
    picks its batch's slots in a pool."""

    def __init__(self, device, bs: int, args, dims=LLAMA, dtype=torch.bfloat16):
        self.device, self.bs, self.args, self.pool = device, bs, args, 0
        forward = Forward(device, bs * args.draft_tokens, dims, dtype)
        self.verify = forward.part(4 * args.verify_layers)
        self.draft = forward.part(4 * args.draft_layers)
        self.cuda = c = device.type == "cuda"
        self.S, self.F = (torch.cuda.Stream(), torch.cuda.Stream()) if c else (NOOP, NOOP)
        self.read_done, n = torch.cuda.Event() if c else NOOP, 2 * args.steps  # >= WARMUP
        self.ev = [torch.cuda.Event(enable_timing=True) if c else NOOP for _ in range(n)]

    def at(self, pool: int) -> Loop:
        """The batch: ``bs`` distinct slots past slot 0 of ``pool``, lengths, acceptances."""
        if pool != self.pool:
            gen, bs, c = torch.Generator().manual_seed(self.bs), self.bs, self.cuda
            self.idx_cpu = torch.randperm(pool - 1, generator=gen)[:bs].add_(1)
            self.lens0_cpu = torch.randint(64, 2048, (bs,), generator=gen)
            self.accept_cpu = torch.randint(1, self.args.draft_tokens + 1, (bs,), generator=gen)
            self.fi0, self.lens0, self.accept = (
                t.to(self.device) for t in (self.idx_cpu, self.lens0_cpu, self.accept_cpu)
            )
            self.idx_host, self.pool = self.idx_cpu.pin_memory() if c else self.idx_cpu, pool
        return self

    def block(self, fm, arm: str, exact: bool, steps: int, draft: bool = True):
        """``steps`` steps of one arm and a last resolve: ``(figures, engaged)``, figures
        (steps/s, idle µs a step) on CUDA; engaged: B's resolves its relay made itself."""
        S, F, args, ev, on = self.S, self.F, self.args, self.ev, self.cuda
        keep = collections.deque(maxlen=3)  # what a forward still reads, as SGLang pins it
        host_ns, ub = 1e3 * (args.host_us + args.host_us_per_req * self.bs), self.lens0_cpu
        tally, engaged = timing.engagement(fm) if arm == "B" else None, 0
        with torch.cuda.stream(S if on else None):
            with torch.cuda.stream(F if on else None):
                tally() if tally else None  # the baseline
                fm.publish(self.fi0, self.lens0)  # step 0's publish: what step 1 resolves
            for i in range(steps + 1):
                ev[2 * i - 3].synchronize() if i >= 2 else None  # results of forward i-2
                end = time.perf_counter_ns() + host_ns
                if tally and i:  # within the host's work below: the last step's resolve
                    engaged += tally()
                while time.perf_counter_ns() < end:  # the host's scheduling work
                    pass
                fi = self.idx_host.to(self.device, non_blocking=True)
                batch = decode_batch(fi, host=self.idx_cpu)
                fm.resolve_seq_lens_cpu(batch)
                if arm == "C":  # planning ahead: an upper bound kept on the host, no wait
                    batch.seq_lens_cpu, batch.seq_lens_sum = ub, int(ub.sum())
                    ub = ub + args.draft_tokens
                if i == steps:
                    break
                F.wait_stream(S)
                with torch.cuda.stream(F if on else None):
                    ev[2 * i].record()
                    self.read_done.record()
                    self.verify()
                    new = batch.seq_lens + self.accept
                    fm.publish(fi, new)
                    self.draft() if draft else None
                    ev[2 * i + 1].record()
                # _apply_war_barrier, right after run_batch
                S.wait_stream(F) if args.barrier == "coarse" else S.wait_event(self.read_done)
                keep.append((batch, new))
        engaged += tally() if tally else 0
        measure.synchronize(self.device)
        want = self.lens0_cpu + steps * self.accept_cpu
        host = self.lens0_cpu + steps * args.draft_tokens if arm == "C" else want if exact else None
        got, total = batch.seq_lens_cpu, batch.seq_lens_sum
        ok = torch.equal(batch.seq_lens.cpu(), want) and (got is None) == (host is None)
        if host is not None:
            ok = ok and torch.equal(got.cpu(), host) and int(total) == int(host.sum())
        if not ok:
            raise RuntimeError(f"ab_loop: arm {arm} resolved wrong lengths at batch {self.bs}")
        if not on:
            return None, engaged
        busy = sum(ev[2 * i].elapsed_time(ev[2 * i + 1]) for i in range(steps))
        span, n = ev[0].elapsed_time(ev[2 * steps - 1]), steps - 1
        return (1e3 * n / ev[0].elapsed_time(ev[2 * steps - 2]), (span - busy) / n * 1e3), engaged


def run_block(loop, fms, arm, label, steps):
    """One block in its arm's patch state, GC off; returns (figures, host wall s). B's
    block raises NotEngaged unless its relay resolved every step of it itself."""
    measure.set_patched(arm == "B")
    gc.disable()  # collected between blocks (set-up's objects frozen)
    exact, draft = CONFIGS[label][1:3]
    with settings.overridden(UNMEASURED if arm == "B" else None):
        t = time.perf_counter()
        out, engaged = loop.block(fms[arm], arm, exact, steps, draft=draft)
        wall = time.perf_counter() - t
    gc.enable()
    if arm == "B" and engaged != steps + 1:
        raise NotEngaged(f"B's relay resolved {engaged} of a block's {steps + 1} steps")
    return out, wall


def est_cell_s(args, bs: int, label: str, steps: int) -> float:  # H100 roofline guess
    _, exact, draft, arms, _ = CONFIGS[label]
    layers = args.verify_layers + (args.draft_layers if draft else 0)
    gpu = layers * max(LAYER_BYTES / 3.0e12, bs * args.draft_tokens * LAYER_BYTES / 6.0e14)
    step = max(gpu, (args.host_us + args.host_us_per_req * bs) * 1e-6) + 50e-6
    return len(arms) * (WARMUP + args.rounds * steps) * step


def make_row(args, bs, label, pool, samples=None, steps=None, skipped=None, engaged=None):
    """One cell's row; ``relayed``: spec_fused relays it on CUDA by default (no UNMEASURED);
    ``engaged``: B's relay resolved every step of every block (None: not run)."""
    got, med, (_, exact, draft, arms, _) = samples or {}, harness.median, CONFIGS[label]
    relayed = measured.handed_to_sglang(torch.device("cuda"), exact, env={}) is None
    r = {x: [s[0] / a[0] for s, a in zip(got[x], got["A"])] for x in "BC" if x in got}
    mid = {x: med(r[x]) if x in r else None for x in "BC"}
    band = {x: [min(r[x]), max(r[x])] if x in r else None for x in "BC"}
    return {"config": label, "needs_cpu_seq_lens": exact, "draft": draft, "pool": pool,
            "concurrency": bs, "arms": list(arms), "rounds": args.rounds if got else 0,
            "steps_per_block": steps, "b_over_a": mid["B"], "band": band["B"],
            "c_over_a": mid["C"], "c_band": band["C"],
            "steps_per_s": {a: med(s[0] for s in got[a]) if a in got else None for a in arms},
            "gpu_idle_us_per_step": {a: med(s[1] for s in got[a]) if got else None for a in arms},
            "relayed": relayed, "engaged": engaged, "skipped": skipped}  # fmt: skip


def run_cell(args, loop, fms, bs, label, pool, cells_left) -> dict:
    """One cell's row; one of B's blocks not engaged ends it: "not engaged", no figures."""
    try:
        return _run_cell(args, loop.at(pool), fms, bs, label, pool, cells_left)
    except NotEngaged as exc:
        log(f"batch {bs} {label} pool {pool}: NOT ENGAGED: {exc}")
        return make_row(args, bs, label, pool, skipped=f"not engaged: {exc}", engaged=False)


def _run_cell(args, loop, fms, bs, label, pool, cells_left) -> dict:
    arms, left = CONFIGS[label][3], args.budget_s - (time.monotonic() - T0)
    for arm in arms if args.dry_run else ():  # every arm's loop, 3 steps, lengths checked
        run_block(loop, fms, arm, label, 3)
    if args.dry_run:
        return make_row(args, bs, label, pool, engaged=True)
    if est_cell_s(args, bs, label, MIN_STEPS) > left:  # start none unfinished
        return make_row(args, bs, label, pool, skipped=f"budget: {left:.0f} s")
    walls = [run_block(loop, fms, arm, label, WARMUP)[1] for arm in arms]
    step_s, share = sum(walls) / (len(arms) * WARMUP), (left - sum(walls)) / cells_left
    steps = min(args.steps, int(share / (len(arms) * args.rounds * step_s * 1.1)))
    if steps < MIN_STEPS:
        log(f"skip batch {bs} {label} pool {pool}: {step_s * 1e3:.2f} ms a step, {steps} steps")
        return make_row(args, bs, label, pool, skipped=f"budget: {steps} steps a block would fit")
    samples = {arm: [] for arm in arms}
    for r in range(args.rounds):
        for arm in arms if ABBA[r % len(ABBA)] == 0 else arms[::-1]:
            samples[arm].append(run_block(loop, fms, arm, label, steps)[0])
    row = make_row(args, bs, label, pool, samples, steps, engaged=True)
    log(f"batch {bs} {label} pool {pool}: B/A {row['b_over_a']:.4f} {row['band']}, {steps} steps")
    return row


def cells(args) -> list:
    """``(concurrency, config, pool)``, one concurrency after the other (a Loop each)."""
    return [(bs, label, pool) for bs in args.concurrency for label, c in CONFIGS.items()
            for pool in c[4]]  # fmt: skip


def plan(args) -> dict:
    grid = cells(args)
    est = SETUP_S + sum(est_cell_s(args, bs, label, args.steps) for bs, label, _ in grid)
    least = SETUP_S + sum(est_cell_s(args, bs, label, MIN_STEPS) for bs, label, _ in grid)
    return {
        "cells": [{"concurrency": bs, "config": label, "pool": pool,
                   "needs_cpu_seq_lens": CONFIGS[label][1], "draft": CONFIGS[label][2],
                   "arms": list(CONFIGS[label][3])} for bs, label, pool in grid],
        "arms": {"A": "SGLang as shipped", "B": "spec_fused applied, SPEC_FUSED_UNMEASURED=1",
                 "C": "GPU-only FutureMap + host upper bound seq_lens + draft tokens"},
        "order": "ABBA then BAAB", "rounds": args.rounds, "steps_per_block_max": args.steps,
        "min_steps": MIN_STEPS, "warmup_steps": WARMUP, "budget_s": args.budget_s,
        "estimated_device_s": round(min(est, args.budget_s), 1),
        "estimated_device_min": round(min(est, args.budget_s) / 60, 1),
        "least_device_s": round(least, 1),  # every cell at MIN_STEPS: what the budget must fit
        "forward": {"verify_layers": args.verify_layers, "tokens_per_request": args.draft_tokens,
                    "draft_layers": {k: args.draft_layers if c[2] else 0
                                     for k, c in CONFIGS.items()},
                    "layer": "Llama-3-8B, bf16, CUDA-graphed: qkv 4096x6144, o 4096x4096, gate_up "
                    "4096x28672, SiLU-mul, down 14336x4096; 436 MB shared by all layers"},
        "dry_run": "every cell's arms: 3 steps of a toy forward, lengths checked, not timed",
        "host_work_us": f"{args.host_us} + {args.host_us_per_req} x concurrency (busy loop)",
        "barrier": args.barrier, "gpu_idle": "CUDA events: mean gap between forwards",
    }  # fmt: skip


def plot(rows, path) -> None:
    import matplotlib.pyplot as plt

    plt.switch_backend("Agg")
    fig, ax = plt.subplots(figsize=(8, 5))
    for k, bk, name in (("b_over_a", "band", "B/A"), ("c_over_a", "c_band", "C/A")):
        for cfg, pool in {(r["config"], r["pool"]) for r in rows}:
            pts = [(r["concurrency"], r[k], *r[bk]) for r in rows
                   if (r["config"], r["pool"]) == (cfg, pool) and r[k]]  # fmt: skip
            if pts:
                xs, ys, lo, hi = zip(*pts)
                err = [[y - v for y, v in zip(ys, lo)], [v - y for y, v in zip(ys, hi)]]
                ax.errorbar(xs, ys, yerr=err, marker="o", capsize=3,
                            label=f"{name} {cfg}, pool {pool}")  # fmt: skip
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xticks(cs := sorted({r["concurrency"] for r in rows}), [str(c) for c in cs])
    ax.ticklabel_format(axis="y", useOffset=False)
    ax.set(xlabel="concurrency", ylabel="steps/s ratio (median; bars: min..max of rounds)")
    ax.legend(fontsize=8, title="ab_loop: SGLang 0.5.23's overlap loop, synthetic forward")
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)


def parse(argv):
    p = harness.add_common_args(argparse.ArgumentParser(description=__doc__.split("\n")[0]))
    p.add_argument("--dry-run", action="store_true", help="the plan only (the one mode on CPU)")
    p.add_argument("--barrier", choices=("read_done", "coarse"), default="read_done")
    p.add_argument(
        "--flashinfer",
        action="store_true",
        help="the DFLASH + FlashInfer cell "
        "too (bench/flashinfer_cell.py; on a GPU the FlashInfer carry installed)",
    )
    for name, default in {"--concurrency": "1,8,32,64,128,256", "--budget-s": 200.0,
                          "--rounds": 8, "--steps": 250, "--host-us": 150.0,
                          "--host-us-per-req": 2.0, "--verify-layers": 4,
                          "--draft-layers": 1, "--draft-tokens": 4}.items():  # fmt: skip
        p.add_argument(name, type=type(default), default=default, help=f"default {default}")
    args = p.parse_args(argv)
    args.concurrency = [int(c) for c in args.concurrency.split(",")]
    if args.rounds < 4 or args.steps < MIN_STEPS:
        p.error(f"--rounds must be >= 4 and --steps >= {MIN_STEPS}")
    return args


def future_maps(device, label: str, pool: int) -> dict:
    """Each arm's real SGLang FutureMap of a config and pool; B's made patched, its relay
    made at once; C's gives no host lengths."""
    algo, exact, _, arms, _ = CONFIGS[label]
    return {arm: measure.arm_future_map(algo, device, pool, fused=arm == "B",
                                        env=UNMEASURED if arm == "B" else None,
                                        needs_cpu_seq_lens=exact and arm != "C")[0]
            for arm in arms}  # fmt: skip


def main(argv=None) -> int:
    args, cuda = parse(argv), torch.cuda.is_available()
    if not cuda and not args.dry_run:
        msg = "needs a CUDA GPU (CUDA graphs, SGLang's CUDA FutureMap path); on CPU only "
        print(f"ab_loop: {msg}--dry-run runs (the plan, null figures)", file=sys.stderr)
        return 2
    device, rows = torch.device("cuda" if cuda else "cpu"), []
    harness.prepare_device(device)  # CPU: one thread (a second's wake-ups cost ms a GEMM)
    payload = {"dry_run": args.dry_run, "device": harness.device_name(device), "plan": plan(args)}
    fms = {(label, pool): future_maps(device, label, pool)
           for label, c in CONFIGS.items() for pool in c[4]}  # fmt: skip
    gc.freeze()  # set-up's objects stay out of every block's collection
    p = payload["plan"]
    log(f"set up; planned {p['estimated_device_s']} s of {args.budget_s} s "
        f"({p['estimated_device_min']} min; every cell at {MIN_STEPS} steps: "
        f"{p['least_device_s']} s)")  # fmt: skip
    grid, shape, loop = cells(args), (TOY, torch.float32) if args.dry_run else (), None
    for bs, label, pool in grid:
        try:
            loop = loop if loop is not None and loop.bs == bs else Loop(device, bs, args, *shape)
            rows.append(run_cell(args, loop, fms[label, pool], bs, label, pool,
                                 len(grid) - len(rows)))  # fmt: skip
        except Exception as exc:  # a GPU run keeps the other cells' figures
            if args.dry_run:
                raise
            rows.append(make_row(args, bs, label, pool, skipped=f"error: {exc!r}"))
            log(f"batch {bs} {label} pool {pool}: {rows[-1]['skipped']}")
    measure.set_patched(False)
    gc.unfreeze()
    if args.flashinfer:  # SGLang's FutureMap and FlashInfer's wrapper: exact A, bound B
        from bench import flashinfer_cell

        cell = [
            "--concurrency",
            ",".join(map(str, args.concurrency)),
            "--host-us",
            str(args.host_us),
        ]
        payload["flashinfer"] = flashinfer_cell.run(
            flashinfer_cell.parse(cell + DRY * args.dry_run)
        )
    payload.update(versions=harness.versions(device), rows=rows)
    payload["config"] = {"wall_s": round(time.monotonic() - T0, 1)}
    show = [dict(r, band=r["band"] and "{:.3f}-{:.3f}".format(*r["band"]),
                 **{f"{a}/s": v for a, v in r["steps_per_s"].items()},
                 **{f"idle {a} µs": v for a, v in r["gpu_idle_us_per_step"].items()})
            for r in rows]  # fmt: skip
    cols = ["config", "pool", "concurrency", "A/s", "B/s", "C/s", "b_over_a", "band"]
    cols += ["c_over_a", "idle A µs", "idle B µs", "idle C µs", "relayed", "engaged", "skipped"]
    count = f"{sum(r['rounds'] > 0 for r in rows)} of {len(rows)} cells measured"
    off = [r for r in rows if r["engaged"] is False]
    count += f"; {len(off)} NOT ENGAGED (no ratio)" if off else ""
    chart = None if args.no_plot or args.dry_run else lambda path: plot(rows, path)
    out, table = harness.results_dir(device, args.out), harness.format_table(show, cols)
    harness.write_results("ab_loop", out, payload, tables=[table], plot=chart, count=count)
    return int(bool(off) or any(str(r["skipped"]).startswith("error") for r in rows))


if __name__ == "__main__":
    sys.exit(main())
