"""Kernel sweep: one relay round trip (publish + resolve) per provider, batch and pool size.

Why: the fused relay replaces SGLang's per-step scatter + event + gather + whole-pool D2H +
synchronize + host sum with one launch. Its worth is launch and sync overhead, so this
sweep measures exactly that, on the *real* SGLang ``FutureMap`` class, for

* ``upstream``            SGLang's own ``FutureMap`` (unpatched), exact host lengths (EAGLE):
                          on CUDA its pinned-mirror + private-stream + synchronize path;
* ``fused-exact``         the patched ``FutureMap`` (``sglang_patch.apply()``), EAGLE:
                          the ``war_guarded`` variant, exact host lengths from the launch;
* ``fused-barrier-free``  the patched ``FutureMap``, DFLASH with ``SPEC_FUSED_WAR_BARRIER=0
                          SPEC_FUSED_HOST_SEQ_LENS=reserved``: no host lengths, no sync;
* ``floor``               one near-empty Triton launch: the least any one-launch relay costs.

All providers run interleaved per size in one process (the patch is class-level, so each
provider is measured in the patch state it needs). Per provider and size:

* ``device_us``: ``triton.testing.do_bench`` median on CUDA (event-timed on the caller's
  stream, so it includes any host sync inside the step), null on CPU;
  ``device_graph_us``: ``do_bench_cudagraph`` where the step is capturable (not
  ``upstream`` / ``fused-exact``, whose steps block the host), else null;
* ``host_us``: median wall time of the Python step call after warmup;
* ``launches``, ``d2h_bytes``, ``host_syncs`` per step (rules in ``bench/harness.py``).

On CPU the fused kernel runs in the Triton interpreter (``TRITON_INTERPRET=1``): its
timings are not speed, the counts are the result. Benchmarks never assert timings; the
sweep only checks that every provider resolved the lengths it published.

    TRITON_INTERPRET=1 python -m bench.kernel_sweep --quick    # CPU, < ~3 min
    python -m bench.kernel_sweep --out /tmp/run                # CUDA, full sweep
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Optional

import torch

from bench import counters, harness, measure  # first: sets TRITON_INTERPRET on CPU before triton
from spec_fused.tools import traces

PROVIDERS = ("upstream", "fused-exact", "fused-barrier-free", "floor")
FULL_BATCHES = tuple(2**i for i in range(13))  # 1 .. 4096
QUICK_BATCHES = (1, 4, 16, 64, 256, 1024, 4096)
FULL_POOLS = (4096, 65536)
QUICK_POOLS = (4096,)


_floor_kernel = measure._empty_kernel
counters.track_kernel(_floor_kernel)


@dataclass
class Settings:
    host_reps: int
    host_warmup: int
    count_reps: int
    bench_warmup_ms: int
    bench_rep_ms: int

    @classmethod
    def for_run(cls, device: torch.device, quick: bool) -> Settings:
        if device.type == "cuda":
            return cls(200 if quick else 500, 20, 5, 5 if quick else 10, 25 if quick else 50)
        return cls(25 if quick else 50, 3, 2, 0, 0)


@dataclass
class Case:
    provider: str
    step: Callable[[], None]
    patched: Optional[bool]  # None: either state will do
    roles: list
    capturable: bool
    check: Optional[Callable[[], None]] = None
    extra: dict = field(default_factory=dict)
    relay: object = None  # the FusedRelay, whose launcher counts its own launches


@dataclass
class Relays:
    """The three FutureMaps of one pool size, built once (the patch state they need is
    set again before each provider is measured)."""

    maps: dict

    @classmethod
    def build(cls, device: torch.device, pool: int) -> Relays:
        maps = {"upstream": measure.arm_future_map("EAGLE", device, pool, fused=False)}
        maps["fused-exact"] = measure.arm_future_map("EAGLE", device, pool, fused=True)
        maps["fused-barrier-free"] = measure.arm_future_map(
            "DFLASH",
            device,
            pool,
            fused=True,
            env={"SPEC_FUSED_WAR_BARRIER": "0"},
            needs_cpu_seq_lens=False,
        )
        for name, want in (("fused-exact", "war_guarded"), ("fused-barrier-free", "barrier_free")):
            relay = maps[name][1]
            if relay.variant != want:
                raise RuntimeError(f"{name}: got the {relay.variant} variant, wanted {want}")
        measure.set_patched(False)
        return cls(maps)


def _relay_case(provider, fm, relay, idx, vals, *, patched, host_lengths, capturable):
    batch = traces.decode_batch(idx)

    def step():
        fm.publish(idx, vals)
        fm.resolve_seq_lens_cpu(batch)

    def check():
        step()
        measure.synchronize(idx.device)
        measure.check_resolved(batch, vals, host_lengths=host_lengths, what=provider)

    extra = {
        "variant": relay.variant if relay else "sglang",
        # the fused host row: stored by the kernel into pinned memory, invisible to
        # the profiler (lengths, sum, stamp)
        "zero_copy_bytes": 8 * (idx.numel() + 2) if provider == "fused-exact" else 0,
    }
    return Case(
        provider,
        step,
        patched,
        [fm.__dict__["new_seq_lens_buf"], idx, vals],
        capturable,
        check,
        extra,
        relay,
    )


def build_cases(relays: Relays, device: torch.device, pool: int, batch: int, seed: int) -> list:
    gen = torch.Generator().manual_seed(seed * 1_000_003 + pool + batch)
    idx = torch.randperm(pool, generator=gen)[:batch].to(device)
    vals = torch.randint(1, 1 << 15, (batch,), generator=gen, dtype=torch.int64).to(device)
    cases = []
    for provider in PROVIDERS:
        if provider == "floor":
            scratch = torch.zeros(1, dtype=torch.int64, device=device)
            cases.append(
                Case(
                    "floor",
                    lambda s=scratch: _floor_kernel[(1,)](s),
                    None,
                    [scratch],
                    True,
                    extra={"variant": "empty launch"},
                )
            )
            continue
        fm, relay = relays.maps[provider]
        cases.append(
            _relay_case(
                provider,
                fm,
                relay,
                idx,
                vals,
                patched=provider != "upstream",
                host_lengths=provider != "fused-barrier-free",
                capturable=provider in ("fused-barrier-free",),
            )
        )
    # Patched providers last, together: two patch flips per size instead of four.
    order = {"upstream": 0, "floor": 1, "fused-exact": 2, "fused-barrier-free": 3}
    return sorted(cases, key=lambda c: order[c.provider])


def device_times(case: Case, device: torch.device, cfg: Settings) -> tuple:
    """``(device_us, device_graph_us, graph_note)``; nulls on CPU or where not capturable."""
    if device.type != "cuda":
        return None, None, "no device timing on CPU"
    from triton.testing import do_bench, do_bench_cudagraph

    dev = (
        do_bench(case.step, warmup=cfg.bench_warmup_ms, rep=cfg.bench_rep_ms, return_mode="median")
        * 1e3
    )
    if not case.capturable:
        return dev, None, "step blocks the host (synchronize): not capturable"
    try:
        graph = do_bench_cudagraph(case.step, rep=cfg.bench_rep_ms, return_mode="median") * 1e3
        return dev, graph, ""
    except Exception as exc:  # a capture failure is a result, not a crash
        torch.cuda.synchronize()
        return dev, None, f"capture failed: {type(exc).__name__}: {exc}"[:200]


def _self_reported(case: Case) -> Optional[int]:
    """The relay's own launch count (``FusedRelay.launches``), a cross-check of ours."""
    return None if case.relay is None else getattr(case.relay, "launches", None)


def measure_case(
    case: Case, device: torch.device, pool: int, batch: int, cfg: Settings, mode: str
) -> dict:
    if case.patched is not None:
        measure.set_patched(case.patched)
    if case.check is not None:
        case.check()
    counts = counters.count_step(
        case.step,
        device,
        roles=case.roles,
        reps=cfg.count_reps,
        zero_copy_bytes=case.extra["zero_copy_bytes"] if "zero_copy_bytes" in case.extra else 0,
    )
    before = _self_reported(case)
    host = harness.host_time_us(case.step, device, reps=cfg.host_reps, warmup=cfg.host_warmup)
    after = _self_reported(case)
    calls = cfg.host_reps + cfg.host_warmup
    dev, graph, note = device_times(case, device, cfg)  # last: a capture leaves state behind
    row = {
        "provider": case.provider,
        "pool": pool,
        "batch": batch,
        "device_us": dev,
        "host_us": harness.median(host),
        "launches": counts["launches"],
        "d2h_bytes": counts["d2h_bytes"],
        "host_syncs": counts["host_syncs"],
        "device_graph_us": graph,
        "host_us_p10": harness.percentile(host, 10),
        "host_us_p90": harness.percentile(host, 90),
        "host_reps": len(host),
        "validation_ops": counts["validation_ops"],
        "launch_names": counts["launch_names"],
        "launch_source": counts["launch_source"],
        "relay_reported_launches": None if before is None else (after - before) / calls,
        "mode": mode,
        **case.extra,
    }
    if note:
        row["device_note"] = note
    return row


def sweep(
    device: torch.device, pools, batches, cfg: Settings, seed: int, providers=PROVIDERS
) -> list:
    from tqdm import tqdm

    mode = (
        "interpreter"
        if harness.kernel_backend(device) == "interpreter"
        else harness.kernel_backend(device)
    )
    rows = []
    total = len(pools) * sum(1 for b in batches) * len(providers)
    with tqdm(total=total, desc="kernel_sweep", unit="case", dynamic_ncols=True) as bar:
        for pool in pools:
            relays = Relays.build(device, pool)
            for batch in batches:
                if batch > pool:
                    bar.update(len(providers))
                    continue
                for case in build_cases(relays, device, pool, batch, seed):
                    if case.provider not in providers:
                        continue
                    bar.set_postfix_str(f"pool={pool} batch={batch} {case.provider}", refresh=False)
                    rows.append(measure_case(case, device, pool, batch, cfg, mode))
                    bar.update(1)
            measure.set_patched(False)
    return rows


TABLE_COLUMNS = (
    "provider",
    "pool",
    "batch",
    "device_us",
    "device_graph_us",
    "host_us",
    "launches",
    "d2h_bytes",
    "host_syncs",
)


def plot(rows: list, path, device: torch.device) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pools = sorted({r["pool"] for r in rows})
    # On CPU the microseconds are the Triton interpreter's and mean nothing: plot the
    # counts, which are the CPU result. (Host cost on CPU: bench/host_overhead.py.)
    metrics = ["device_us", "host_us"] if device.type == "cuda" else ["launches", "d2h_bytes"]
    fig, axes = plt.subplots(
        len(metrics), len(pools), squeeze=False, figsize=(6.5 * len(pools), 4.5 * len(metrics))
    )
    for i, metric in enumerate(metrics):
        for j, pool in enumerate(pools):
            series = {}
            for provider in PROVIDERS:
                pts = sorted(
                    (r["batch"], r[metric])
                    for r in rows
                    if r["pool"] == pool and r["provider"] == provider
                )
                if pts:
                    series[provider] = tuple(zip(*pts))
            title = f"{metric} per relay step, pool={pool}"
            unit = "µs" if metric.endswith("_us") else "per step"
            if device.type != "cuda":
                title += "\nCPU: counts (interpreter timings are not speed and not shown)"
            harness.plot_lines(
                series,
                path,
                title=title,
                xlabel="batch size",
                ylabel=f"{metric} ({unit})",
                ax=axes[i][j],
                logy=metric != "launches",
            )
    fig.suptitle(f"spec_fused kernel sweep on {harness.device_name(device)}", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def summary(rows: list) -> list:
    """Counts per provider (constant over sizes, or a range where they vary)."""
    out = []
    for provider in PROVIDERS:
        mine = [r for r in rows if r["provider"] == provider]
        if not mine:
            continue

        def span(key, mine=mine):
            vals = [r[key] for r in mine]
            lo, hi = min(vals), max(vals)
            return str(lo) if lo == hi else f"{lo}..{hi}"

        out.append(
            {
                "provider": provider,
                "launches": span("launches"),
                "host_syncs": span("host_syncs"),
                "d2h_bytes": span("d2h_bytes"),
            }
        )
    return out


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m bench.kernel_sweep",
        description="Relay round trip (publish + resolve) per provider, batch and pool size.",
        epilog="On CPU set TRITON_INTERPRET=1 (done automatically when CUDA is absent).",
    )
    harness.add_common_args(parser)
    parser.add_argument("--batches", type=int, nargs="+", help="override the batch sizes")
    parser.add_argument("--pools", type=int, nargs="+", help="override the pool sizes")
    parser.add_argument("--providers", nargs="+", choices=PROVIDERS, default=list(PROVIDERS))
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def main(argv=None) -> dict:
    args = parse_args(argv)
    device = harness.pick_device()
    batches = args.batches or (QUICK_BATCHES if args.quick else FULL_BATCHES)
    pools = args.pools or (QUICK_POOLS if args.quick else FULL_POOLS)
    cfg = Settings.for_run(device, args.quick)
    prepared = harness.prepare_device(device)
    t0 = time.perf_counter()
    rows = sweep(device, pools, batches, cfg, args.seed, tuple(args.providers))
    out_dir = harness.results_dir(device, args.out)
    payload = {
        "device": harness.device_name(device),
        "versions": harness.versions(device),
        "rows": rows,
        "mode": rows[0]["mode"] if rows else None,
        "config": {
            "quick": args.quick,
            "batches": list(batches),
            "pools": list(pools),
            **vars(cfg),
            **prepared,
            "seed": args.seed,
            "wall_s": round(time.perf_counter() - t0, 1),
        },
    }
    tables = [
        harness.format_table(rows, TABLE_COLUMNS),
        harness.format_table(summary(rows), ("provider", "launches", "host_syncs", "d2h_bytes")),
    ]
    draw = None if args.no_plot or not rows else (lambda png: plot(rows, png, device))
    return harness.write_results(
        "kernel_sweep", out_dir, payload, tables=tables, plot=draw, count=f"{len(rows)} rows"
    )


if __name__ == "__main__":
    main()
