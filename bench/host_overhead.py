"""Host cost of one relay step (publish + resolve), spec_fused side by side with SGLang.

Why: SGLang's overlap scheduler runs the CPU one batch ahead of the GPU, so every
microsecond of Python on the relay's per-step path delays the next batch. On FA3 (the
Hopper default for DFLASH and top-k-1 EAGLE) upstream's step has no D2H and no host sync
left, only an event wait and a few small launches: a fused relay whose host path costs
more than that loses, however few launches it makes. This measures exactly the host side,
on the real SGLang ``FutureMap`` class, in one process, providers interleaved:

* ``upstream``        SGLang's ``FutureMap`` as shipped;
* ``spec_fused``      patched, on the production backend (compiled Triton through the
                      bound launcher on CUDA; the plain-torch reference on a CPU server);
                      the providers are ``bench/measure.py``'s;
* ``spec_fused-null`` patched, ``SPEC_FUSED_FORCE_BACKEND=null SPEC_FUSED_BENCH=1``: the
                      whole hot path with no device work, i.e. the wrapper alone;
* ``spec_fused-jit`` (CUDA only): spec_fused with its direct launch turned off, every
                      launch through ``kernel[grid]``: what the bound launcher saves;
* ``floor-direct`` / ``floor-jit`` (CUDA only): one empty Triton launch through the bound
                      launcher / through ``kernel[grid]``: what any one-launch relay costs.

Grid: algorithm EAGLE, DFLASH x ``needs_cpu_seq_lens`` 0, 1 x batch 1 ... 1024. Per cell,
``--rounds`` rounds; in each round every provider runs a block of ``--steps`` steps (its
own patch state set outside the block, GC off inside); a block's mean is one sample, and
the table gives the median (``host_us``) and the best (``host_us_best``) over rounds.
``ratio_to_upstream`` is paired: the median over rounds of each block's time over
upstream's block in the same round, so a slow stretch of a shared machine, which hits
both, cancels instead of landing on one provider's median.

A second table prices the hook layer itself: one call through SGLang's ``HookRegistry``
AROUND and REPLACE forms and through a direct replacement (what spec_fused installs), on
a probe class with an empty method, so nothing but the layer is timed
(``torch.utils.benchmark.Timer``).

Nothing here asserts a time; each provider's lengths are checked once against what was
published (outside the timed blocks), except the null provider, whose results are
unspecified by design.

    python -m bench.host_overhead --quick          # CPU, about a minute
    python -m bench.host_overhead --out /tmp/run   # CUDA
"""

from __future__ import annotations

import argparse
import time

from bench import (
    harness,  # first: sets TRITON_INTERPRET on CPU before triton is imported
    measure,
)

ALGORITHMS = ("EAGLE", "DFLASH")
FULL_BATCHES = (1, 4, 16, 64, 256, 1024)
QUICK_BATCHES = (1, 16, 256, 1024)
POOL = 4096
PROVIDER_ORDER = (
    "upstream",
    "spec_fused",
    "spec_fused-null",
    "spec_fused-jit",
    "floor-direct",
    "floor-jit",
)


def sweep(args, device) -> list:
    from tqdm import tqdm

    rows = []
    cells = [
        (a, c, b) for a in args.algorithms for c in args.needs_cpu_seq_lens for b in args.batches
    ]
    with tqdm(total=len(cells), desc="host_overhead", unit="cell", dynamic_ncols=True) as bar:
        for algorithm, needs_cpu, batch in cells:
            bar.set_postfix_str(f"{algorithm} needs_cpu={needs_cpu} batch={batch}", refresh=False)
            production = None if device.type == "cuda" else "reference"
            providers = measure.build_providers(
                algorithm,
                device,
                needs_cpu,
                batch,
                pool=POOL,
                seed=args.seed,
                production=production,
            )
            samples = measure.measure_cell(providers, device, args.rounds, args.steps, args.warmup)
            up = samples["upstream"]
            up_best = min(up)
            floor = samples.get("floor-direct")
            floor_med = harness.median(floor) if floor else None
            for name, times in samples.items():
                med, best = harness.median(times), min(times)
                rows.append(
                    {
                        "provider": name,
                        "algorithm": algorithm,
                        "needs_cpu_seq_lens": needs_cpu,
                        "batch": batch,
                        "host_us": med,
                        "host_us_best": best,
                        "host_us_p90": harness.percentile(times, 90),
                        "ratio_to_upstream": harness.median(t / u for t, u in zip(times, up)),
                        "ratio_to_upstream_best": best / up_best,
                        "ratio_to_floor": None if floor_med is None else med / floor_med,
                        "rounds": len(times),
                        "steps_per_round": args.steps,
                    }
                )
            bar.update(1)
    return rows


# --------------------------------------------------------------------------- hook forms


class _Probe:
    def step(self, a, b):
        return a


def _install(form: str):
    """``_Probe.step`` wrapped by ``form``; returns an undo function."""
    import sys
    import types

    original = _Probe.__dict__["step"]
    if form == "direct":

        def make(orig):
            def step(self, a, b):
                return orig(self, a, b)

            return step

        _Probe.step = make(original)
        return lambda: setattr(_Probe, "step", original)
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    module = types.ModuleType("spec_fused_hook_probe")
    module._Probe = _Probe
    sys.modules[module.__name__] = module
    target = f"{module.__name__}._Probe.step"
    if form == "around":
        hook, kind = (lambda orig, self, a, b: orig(self, a, b)), HookType.AROUND
    else:
        hook, kind = (lambda self, a, b: original(self, a, b)), HookType.REPLACE
    saved = {k: list(v) for k, v in HookRegistry._hooks.items()}, set(HookRegistry._patched)
    HookRegistry.register(target, hook, kind)
    HookRegistry.apply_hooks()

    def undo():
        _Probe.step = original
        HookRegistry._hooks.clear()
        HookRegistry._hooks.update(saved[0])
        HookRegistry._patched.clear()
        HookRegistry._patched.update(saved[1])
        sys.modules.pop(module.__name__, None)

    return undo


def hook_forms(min_run_time: float) -> list:
    """ns per call of a method reached through each hook form (``none`` = unpatched),
    timed by ``torch.utils.benchmark.Timer`` (median of its blocked autorange)."""
    from torch.utils.benchmark import Timer

    probe, rows = _Probe(), []
    for form in ("none", "direct", "replace", "around"):
        undo = _install(form) if form != "none" else (lambda: None)
        try:
            timer = Timer("probe.step(1, 2)", globals={"probe": probe})
            ns = timer.blocked_autorange(min_run_time=min_run_time).median * 1e9
        finally:
            undo()
        rows.append(
            {
                "form": form,
                "ns_per_call": ns,
                "ns_over_unpatched": ns - rows[0]["ns_per_call"] if rows else 0.0,
            }
        )
    return rows


# --------------------------------------------------------------------------- report

TABLE_COLUMNS = (
    "algorithm",
    "needs_cpu_seq_lens",
    "batch",
    "provider",
    "host_us",
    "host_us_best",
    "ratio_to_upstream",
)


def summary(rows: list) -> list:
    """Per provider: the worst ratio to upstream over the grid (median and best-of)."""
    out = []
    for name in PROVIDER_ORDER:
        mine = [r for r in rows if r["provider"] == name]
        if not mine or name == "upstream":
            continue
        worst = max(mine, key=lambda r: r["ratio_to_upstream"])
        out.append(
            {
                "provider": name,
                "worst_ratio": worst["ratio_to_upstream"],
                "worst_at": f"{worst['algorithm']} ncsl={worst['needs_cpu_seq_lens']} "
                f"bs={worst['batch']}",
                "median_ratio": harness.median(r["ratio_to_upstream"] for r in mine),
                "worst_ratio_best_of": max(r["ratio_to_upstream_best"] for r in mine),
                "worst_ratio_to_floor": max(
                    (r["ratio_to_floor"] for r in mine if r["ratio_to_floor"] is not None),
                    default=None,
                ),
            }
        )
    return out


def plot(rows: list, path, device) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = [
        (a, c)
        for a in dict.fromkeys(r["algorithm"] for r in rows)
        for c in dict.fromkeys(r["needs_cpu_seq_lens"] for r in rows)
    ]
    fig, axes = plt.subplots(1, len(cells), squeeze=False, figsize=(5.2 * len(cells), 4.5))
    for j, (algorithm, needs_cpu) in enumerate(cells):
        series = {}
        for name in PROVIDER_ORDER:
            pts = sorted(
                (r["batch"], r["host_us"])
                for r in rows
                if r["provider"] == name
                and r["algorithm"] == algorithm
                and r["needs_cpu_seq_lens"] == needs_cpu
            )
            if pts:
                series[name] = tuple(zip(*pts))
        harness.plot_lines(
            series,
            path,
            title=f"{algorithm}, needs_cpu_seq_lens={needs_cpu}",
            xlabel="batch size",
            ylabel="host µs per step (median)",
            ax=axes[0][j],
        )
    fig.suptitle(
        f"spec_fused relay host cost per step (publish + resolve) on {harness.device_name(device)}",
        fontsize=11,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m bench.host_overhead",
        description="Host µs per relay step: SGLang's FutureMap vs spec_fused vs its "
        "wrapper alone (null backend), interleaved in one process.",
    )
    harness.add_common_args(parser)
    parser.add_argument("--algorithms", nargs="+", choices=ALGORITHMS, default=list(ALGORITHMS))
    parser.add_argument("--needs-cpu-seq-lens", type=int, nargs="+", choices=(0, 1), default=[0, 1])
    parser.add_argument("--batches", type=int, nargs="+")
    parser.add_argument("--rounds", type=int, help="interleaved rounds per cell")
    parser.add_argument("--steps", type=int, help="steps per block")
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    args.batches = args.batches or list(QUICK_BATCHES if args.quick else FULL_BATCHES)
    args.rounds = args.rounds or (11 if args.quick else 15)
    # 400 steps a block: a 100-step block (about 1 ms here) was short enough that one
    # hiccup of a shared 2-core machine, or the re-warm after the patch is toggled between
    # blocks, moved a cell's ratio by 0.1-0.25 between back-to-back runs.
    args.steps = args.steps or 400
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    device = harness.pick_device()
    prepared = harness.prepare_device(device)
    t0 = time.perf_counter()
    rows = sweep(args, device)
    forms = hook_forms(min_run_time=0.2 if args.quick else 1.0)
    out_dir = harness.results_dir(device, args.out)
    payload = {
        "device": harness.device_name(device),
        "versions": harness.versions(device),
        "rows": rows,
        "summary": summary(rows),
        "hook_forms": forms,
        "config": {
            "quick": args.quick,
            "pool": POOL,
            "batches": args.batches,
            "algorithms": args.algorithms,
            "needs_cpu_seq_lens": args.needs_cpu_seq_lens,
            "rounds": args.rounds,
            "steps_per_round": args.steps,
            "warmup": args.warmup,
            "production_backend": "triton" if device.type == "cuda" else "reference",
            **prepared,
            "wall_s": round(time.perf_counter() - t0, 1),
        },
    }
    tables = [
        harness.format_table(rows, TABLE_COLUMNS),
        harness.format_table(
            payload["summary"],
            (
                "provider",
                "worst_ratio",
                "worst_at",
                "median_ratio",
                "worst_ratio_best_of",
                "worst_ratio_to_floor",
            ),
        ),
        harness.format_table(forms, ("form", "ns_per_call", "ns_over_unpatched")),
    ]
    draw = None if args.no_plot or not rows else (lambda png: plot(rows, png, device))
    return harness.write_results(
        "host_overhead", out_dir, payload, tables=tables, plot=draw, count=f"{len(rows)} rows"
    )


if __name__ == "__main__":
    main()
