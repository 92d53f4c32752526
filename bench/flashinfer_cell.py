"""The DFLASH + FlashInfer cell of the decode-loop A/B (issue 38 item 5): SGLang 0.5.23's real
``FutureMap`` and FlashInfer 0.7.2's real fa2 wrappers, graphed, in the overlap loop's order.

* A, SGLang as shipped: the FutureMap resolves with exact host lengths (its pool D2H and
  host wait) and each verify plans from them (committed + block, as ``dflash_worker_v2``).
* B, spec_fused's bound variant (``SPEC_FUSED_UNMEASURED=1``): the relay's caps carry a
  ``HostBound`` whose ``arm`` arms the plan guard and whose ``expect`` tells it each step's
  floor (the host's committed lengths, seeded into the batch as ``prepare_for_decode``
  does) and how to read the exact lengths; resolve gives no host lengths and does not wait;
  each verify plans from DFLASH's ``nxt_kv_lens_cpu`` = max(allocated, host committed +
  2 x block), the host's committed lengths one step behind the device's. Where a chunk
  boundary falls in a request's window the guard replans from the exact lengths, one host
  wait: so B's claim is "host waits 2 -> 1 per step outside straddle steps", and the row
  reports waits per step on steps without a replan apart from those with one.

A step, in ``event_loop_overlap`` / ``run_batch``'s order (as ``bench/ab_loop.py``): the host
waits for forward N-2's end (result processing), busy-loops ``--host-us`` (scheduling),
stages the batch and resolves; on the forward stream the draft's and the target's verify
wrappers (both ``DFLASH_VERIFY`` forwards: the guard's two plans a step) are planned by
``fast_prefill_plan`` and their graphs (``--layers`` attention calls each) replayed, then the
new lengths are published. Steps/s come from CUDA events around each forward, in ABBA rounds
with the counter off; a short pass with ``spec_fused.host_waits`` installed then counts each
arm's host waits and the guard's replans step by step (sites in the JSON). No GEMMs: the
forward is attention alone. ``--dry-run`` (CPU): the same loop on the check's stand-in device
and wrapper (the mirror's fa2 plan: the guard checks and replans for real; a CPU relay's read
of the exact lengths is no wait), 3 steps an arm (``COUNTED_DRY`` counted), lengths and
bounds checked, waits counted without the stand-in's reads of its own tensors, null figures.
Usage: ``python -m bench.flashinfer_cell --out DIR [--dry-run] [--budget-s 120]``.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import sys
import time
from types import SimpleNamespace

import torch

from bench import flashinfer_check as fc
from bench import harness, measure
from spec_fused import caps, host_waits, relay, settings
from spec_fused.integration import flashinfer_plan
from spec_fused.tools.traces import TraceConfig, decode_batch, make_future_map

T0 = time.monotonic()
POOL, BLOCK, WARMUP, COUNTED, ROUNDS = 4096, 16, 20, 20, 4
COUNTED_DRY = 10  # the dry run's counted steps: enough for windows to straddle at bs 1 and 8
UNMEASURED = {settings.UNMEASURED.name: "1"}
NOOP = type("NoOp", (), {"__getattr__": lambda *_: lambda *_: None})()
DECODE = SimpleNamespace(is_decode=lambda: True)


def future_maps(device, max_bs: int, block: int) -> dict:
    """A: SGLang's FutureMap as shipped (FlashInfer reads host lengths); B: made patched, its
    relay deciding under a ``HostBound`` that arms the guard (what ``host_bound(sched)`` finds
    for a graphed DFLASH verify on fa2)."""
    a = measure.arm_future_map("DFLASH", device, POOL, fused=False)[0]
    measure.set_patched(True)
    with settings.overridden(UNMEASURED):
        b = make_future_map("DFLASH", TraceConfig(pool=POOL, max_len=1), device=device)
        bound = caps.HostBound("DFLASH's own bound (flashinfer_cell)", max_bs, block,
                               arm=flashinfer_plan.arm, expect=flashinfer_plan.expect)  # fmt: skip
        b.__dict__[relay.CAPS_ATTR] = caps.decide(
            b.spec_algo, needs_cpu_seq_lens=True, host_bound=bound
        )
        if relay.relay_for(b) is None or not flashinfer_plan.guard_stats()["armed"]:
            raise RuntimeError("flashinfer_cell: spec_fused declined the bound variant")
    return {"A": a, "B": b}


class Cell:
    """One concurrency: its requests, the draft's and the target's verify wrappers, streams."""

    def __init__(self, device, bs: int, args, rigs, plans: dict):
        gen, self.cuda = torch.Generator().manual_seed(bs), device.type == "cuda"
        self.device, self.bs, self.args, self.rigs, self.plans = device, bs, args, rigs, plans
        self.idx_cpu = torch.randperm(POOL - 1, generator=gen)[:bs].add_(1)
        self.lens0_cpu = torch.randint(512, 1024, (bs,), generator=gen)
        self.accept_cpu = torch.randint(1, BLOCK + 1, (bs,), generator=gen)
        self.fi0, self.lens0, self.accept = (
            t.to(device) for t in (self.idx_cpu, self.lens0_cpu, self.accept_cpu)
        )
        self.idx_host = self.idx_cpu.pin_memory() if self.cuda else self.idx_cpu
        self.S, self.F = (torch.cuda.Stream(), torch.cuda.Stream()) if self.cuda else (NOOP, NOOP)
        event = (
            (lambda: torch.cuda.Event(enable_timing=True))
            if self.cuda
            else rigs[0].dev.event_class()
        )
        self.read_done, self.ev = event(), [event() for _ in range(2 * args.steps + 2)]
        self.replans: dict = {}  # counted step's label: the guard's replans in it

    def host_lengths(self, arm: str, batch, i: int, alloc):
        """What the verify plans from: A the exact host lengths + block; B the bound, checked
        on the host against the device's KV lengths (known here: lens0 + i x accept + block)."""
        if arm == "A":
            return batch.seq_lens_cpu + BLOCK, None
        known = self.lens0_cpu + max(i - 1, 0) * self.accept_cpu  # results of forward i-2
        nxt = known + 2 * BLOCK
        alloc = nxt if alloc is None else torch.maximum(alloc, nxt)
        if not bool((alloc >= self.lens0_cpu + i * self.accept_cpu + BLOCK).all()):
            raise RuntimeError(f"flashinfer_cell: the bound is below a device length at step {i}")
        return alloc, alloc

    def block(self, fms, arm: str, steps: int, count: bool = False):
        """``steps`` steps of one arm in its patch state; (steps/s, GPU idle µs a step) on
        CUDA. ``count``: each step from the third on is one ``host_waits`` step."""
        measure.set_patched(arm == "B")
        for rig in self.rigs:  # SGLang's plan as shipped for A; the armed guard for B
            rig.install(self.plans[arm])
        with settings.overridden(UNMEASURED if arm == "B" else None):
            return self._block(fms[arm], arm, steps, count)

    def _block(self, fm, arm: str, steps: int, count: bool):
        S, F, ev, on, alloc = self.S, self.F, self.ev, self.cuda, None
        keep = collections.deque(maxlen=3)  # what a forward still reads, as SGLang pins it
        host_ns = 1e3 * self.args.host_us
        with torch.cuda.stream(S if on else None):
            with torch.cuda.stream(F if on else None):
                fm.publish(self.fi0, self.lens0)
            for i in range(steps + 1):
                if count and i >= 2:  # a label a step: its waits apart (run_cell sorts them)
                    host_waits.step(label := f"{arm} {i}")
                    replans = flashinfer_plan.guard_stats()["replans"]
                ev[2 * i - 3].synchronize() if i >= 2 else None  # results of forward i-2
                end = time.perf_counter_ns() + host_ns
                while time.perf_counter_ns() < end:  # the host's scheduling work
                    pass
                fi = self.idx_host.to(self.device, non_blocking=True)
                batch = decode_batch(fi, host=self.idx_cpu)
                batch.forward_mode = DECODE  # prepare_for_decode's seed: the host's committed
                batch.seq_lens_cpu = self.lens0_cpu + max(i - 1, 0) * self.accept_cpu
                fm.resolve_seq_lens_cpu(batch)
                if i == steps:
                    break
                kv_host, alloc = self.host_lengths(arm, batch, i, alloc)
                F.wait_stream(S)
                with torch.cuda.stream(F if on else None):
                    ev[2 * i].record()
                    self.read_done.record()
                    for rig in self.rigs:  # the draft's verify, then the target's
                        rig.plan(rig.device_args(batch.seq_lens), kv_host)
                        rig.replay()
                    new = batch.seq_lens + self.accept
                    fm.publish(fi, new)
                    ev[2 * i + 1].record()
                if count and i >= 2:
                    self.replans[label] = flashinfer_plan.guard_stats()["replans"] - replans
                S.wait_event(self.read_done)
                keep.append((batch, new))
        host_waits.step("tail") if count else None  # the drain and checks below are not a step's
        measure.synchronize(self.device) if on else self.rigs[0].dev.synchronize()
        self.check(arm, batch, steps)
        if not on:
            return None
        busy = sum(ev[2 * i].elapsed_time(ev[2 * i + 1]) for i in range(steps))
        span, n = ev[0].elapsed_time(ev[2 * steps - 1]), steps - 1
        return 1e3 * n / ev[0].elapsed_time(ev[2 * steps - 2]), (span - busy) / n * 1e3

    def check(self, arm: str, batch, steps: int) -> None:
        if arm == "B" and batch.seq_lens_cpu is not None:  # the relay stepped down (its log)
            raise RuntimeError(f"flashinfer_cell: batch {self.bs}: B's relay went to SGLang's")
        ok = torch.equal(batch.seq_lens.cpu(), self.lens0_cpu + steps * self.accept_cpu)
        if not ok or (batch.seq_lens_cpu is None) != (arm == "B"):
            raise RuntimeError(f"flashinfer_cell: arm {arm} at batch {self.bs}: wrong lengths")


def make_rigs(device, bs: int, args, plan_fn, dev=None) -> list:
    max_kv = 1024 + (max(args.steps, WARMUP, COUNTED) + 2) * BLOCK
    if device.type == "cuda":
        import flashinfer

        return [fc.CudaRig(flashinfer, bs, BLOCK, max_kv, plan_fn, args.layers) for _ in range(2)]
    return [fc.StandinRig(dev, bs, BLOCK, max_kv, plan_fn) for _ in range(2)]


def run_cell(cell, fms, args) -> dict:
    """Warm-up, ABBA rounds (steps/s, counter off), then the counted pass (waits per step)."""
    row = {"concurrency": cell.bs, "block": BLOCK, "layers": args.layers}
    steps = 3 if args.dry_run else args.steps
    rounds = 1 if args.dry_run else ROUNDS
    samples = {"A": [], "B": []}
    for arm in "AB":
        cell.block(fms, arm, 3 if args.dry_run else WARMUP)
    for r in range(rounds):
        for arm in "AB" if r % 2 == 0 else "BA":
            samples[arm].append(cell.block(fms, arm, steps))
    plans0 = flashinfer_plan.guard_stats()
    on_device = None if cell.cuda else (lambda t: True)  # the stand-in: every tensor is "device"
    extra = () if cell.cuda else ((type(cell.ev[0]), "synchronize", "Event.synchronize"),)
    host_waits.install(on_device=on_device, extra=extra, every=1 << 30)
    try:
        for arm in "AB":
            cell.block(fms, arm, COUNTED_DRY if args.dry_run else COUNTED, count=True)
        counted = host_waits.stats()
    finally:
        host_waits.uninstall()
    guard = flashinfer_plan.guard_stats()
    row.update(waits_by_step(counted, cell.replans, "" if cell.cuda else "flashinfer_check.py:"))
    row["guard"] = {k: guard[k] - plans0[k] for k in ("plans", "waits", "replans")}
    if cell.cuda:
        med = harness.median
        ratios = [b[0] / a[0] for a, b in zip(samples["A"], samples["B"])]
        row.update(steps_per_s={a: med(s[0] for s in samples[a]) for a in "AB"},
                   gpu_idle_us_per_step={a: med(s[1] for s in samples[a]) for a in "AB"},
                   b_over_a=med(ratios), band=[min(ratios), max(ratios)])  # fmt: skip
    return row


def waits_by_step(counted: dict, replans: dict, drop: str = "") -> dict:
    """Per arm, from one ``host_waits`` label a step: host waits per step over every counted
    step, over the steps the guard did not replan and over those it did (a straddle: its
    read of the exact lengths), the straddle steps, the guard's replans per step, the sites;
    ``drop``: a site prefix not counted (the stand-in's reads of its own host tensors)."""
    out: dict = {k: {} for k in ("host_waits_per_step", "host_waits_per_step_outside_straddles",
                                 "host_waits_per_step_on_straddles", "straddle_steps",
                                 "replans_per_step", "host_wait_sites")}  # fmt: skip
    mean = lambda xs: sum(xs) / len(xs) if xs else None  # noqa: E731
    for arm in "AB":
        steps = {k: {s: n for s, n in v["sites"].items() if not drop or drop not in s}
                 for k, v in counted.items() if k.split()[0] == arm}  # fmt: skip
        waits = {k: sum(v.values()) for k, v in steps.items()}
        on = [w for k, w in waits.items() if replans.get(k, 0)]
        off = [w for k, w in waits.items() if not replans.get(k, 0)]
        sites = sum((collections.Counter(v) for v in steps.values()), collections.Counter())
        per_step = mean([replans.get(k, 0) for k in steps])
        for key, value in zip(out, (mean(on + off), mean(off), mean(on), len(on), per_step)):
            out[key][arm] = value
        out["host_wait_sites"][arm] = dict(sites)
    return out


def run(args) -> dict:
    """Every concurrency's row, and the plan; what ``bench/ab_loop.py --flashinfer`` adds."""
    cuda = torch.cuda.is_available() and not args.dry_run
    device = torch.device("cuda" if cuda else "cpu")
    fast_prefill_plan, source = fc.load_fast_prefill_plan()
    guarded = flashinfer_plan.guarded(fast_prefill_plan)  # what the plugin installs at import
    dev = None if cuda else fc.StandinDevice()
    rows, fms = [], future_maps(device, max(args.concurrency), BLOCK)
    with contextlib.nullcontext() if cuda else fc.standin(dev):
        try:
            for bs in args.concurrency:
                rigs = make_rigs(device, bs, args, fast_prefill_plan, dev)
                cell = Cell(device, bs, args, rigs, {"A": fast_prefill_plan, "B": guarded})
                rows.append(run_cell(cell, fms, args))
                print(f"flashinfer_cell [{time.monotonic() - T0:6.1f} s] {rows[-1]}",
                      file=sys.stderr)  # fmt: skip
                del cell
        finally:
            flashinfer_plan.expect(None)  # B's last step's floor: no later plan's
            measure.set_patched(False)
    est = 30 + len(args.concurrency) * (WARMUP + COUNTED + ROUNDS * args.steps) * 2 * 2e-3
    return {"source": source, "rows": rows, "plan": {
        "arms": {"A": "SGLang as shipped: exact host lengths (pool D2H + host wait), plans "
                      "from committed + block", "B": "spec_fused's bound variant "
                      "(SPEC_FUSED_UNMEASURED=1): no host lengths, no wait; plans from "
                      "max(allocated, host committed + 2 x block), guard armed and told each "
                      "step's floor (a straddle replans from exact lengths: one wait)"},
        "expect": "host waits per step 2 (A) -> 1 (B) outside straddle steps",
        "concurrency": args.concurrency, "block": BLOCK, "layers": args.layers,
        "steps": args.steps, "rounds": ROUNDS, "warmup": WARMUP, "counted_steps": COUNTED,
        "host_us": args.host_us, "estimated_device_s": round(est, 1)}}  # fmt: skip


def parse(argv=None):
    """The cell's arguments (``bench/ab_loop.py --flashinfer`` builds them from its own)."""
    p = harness.add_common_args(argparse.ArgumentParser(description=__doc__.split("\n")[0]))
    p.add_argument("--dry-run", action="store_true", help="the stand-in loop (CPU)")
    p.add_argument("--concurrency", default="1,8,32")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--layers", type=int, default=8, help="attention calls per verify graph")
    p.add_argument("--host-us", type=float, default=150.0)
    args = p.parse_args(argv)
    args.concurrency = [int(c) for c in args.concurrency.split(",")]
    return args


def main(argv=None) -> int:
    args = parse(argv)
    if not torch.cuda.is_available() and not args.dry_run:
        print("flashinfer_cell: needs a CUDA GPU; on CPU only --dry-run runs", file=sys.stderr)
        return 2
    payload = run(args)
    device = torch.device("cpu" if args.dry_run else "cuda")
    payload.update(dry_run=args.dry_run, device=harness.device_name(device),
                   versions=harness.versions(device),
                   config={"wall_s": round(time.monotonic() - T0, 1)})  # fmt: skip
    show = [dict(r, **{f"{a}/s": (r.get("steps_per_s") or {}).get(a) for a in "AB"},
                 **{f"waits {a}": r["host_waits_per_step_outside_straddles"][a] for a in "AB"},
                 **{"waits B straddle": r["host_waits_per_step_on_straddles"]["B"],
                    "replans B/step": r["replans_per_step"]["B"]})
            for r in payload["rows"]]  # fmt: skip
    cols = ["concurrency", "A/s", "B/s", "b_over_a", "waits A", "waits B", "waits B straddle",
            "replans B/step", "guard"]  # fmt: skip
    out = harness.results_dir(device, args.out)
    rows, xs = payload["rows"], args.concurrency
    series = {f"{a}: steps/s": (xs, [r.get("steps_per_s", {}).get(a) for r in rows]) for a in "AB"}
    chart = None if args.dry_run or args.no_plot else lambda path: harness.plot_lines(
        series, path, title="DFLASH + FlashInfer: SGLang (A) vs the bound variant (B)",
        xlabel="concurrency", ylabel="steps/s", logy=False)  # fmt: skip
    table = harness.format_table(show, cols)
    harness.write_results("flashinfer_cell", out, payload, tables=[table], plot=chart,
                          count=f"{len(rows)} concurrencies")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
