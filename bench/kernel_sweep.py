"""Kernel microbenchmarks: one relay round trip (publish + resolve) per provider, batch and
pool size, as pytest-benchmark benchmarks (``pytest --benchmark-only``: its JSON, its
histogram), on the *real* SGLang ``FutureMap`` class:

* ``upstream``            SGLang's own ``FutureMap`` (unpatched), exact host lengths (EAGLE):
                          on CUDA its pinned-mirror + private-stream + synchronize path;
* ``fused-exact``         the patched ``FutureMap`` (``sglang_patch.apply()``), EAGLE:
                          the ``war_guarded`` variant, exact host lengths from the launch;
* ``fused-barrier-free``  the patched ``FutureMap``, DFLASH with ``SPEC_FUSED_WAR_BARRIER=0``
                          and no host lengths: no sync;
* ``floor``               one near-empty Triton launch: the least any one-launch relay costs.

Per benchmark: pytest-benchmark's host wall time of the step call (its rounds and stats);
in ``extra_info`` the step's ``launches``, ``host_syncs`` and ``d2h_bytes``
(``bench/counters.py``), and on CUDA ``device_us`` (``triton.testing.do_bench``, event-timed
on the caller's stream, so a step's own host sync is in it) and ``device_graph_us``
(``do_bench_cudagraph``, where the step does not block the host). Each provider's lengths
are checked once against what was published; no time is asserted.

On CPU the fused kernel runs in the Triton interpreter: its times are not speed, the counts
are the result.

    python -m bench.kernel_sweep --quick          # CPU, under a minute
    python -m bench.kernel_sweep --out /tmp/run   # CUDA, full sweep
    pytest bench/kernel_sweep.py --benchmark-only # the benchmarks alone (KERNEL_SWEEP_* sizes)
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import torch

from bench import counters, harness, measure  # first: sets TRITON_INTERPRET on CPU before triton
from spec_fused.tools import traces

PROVIDERS = ("upstream", "fused-exact", "fused-barrier-free", "floor")
FULL_BATCHES = tuple(2**i for i in range(13))  # 1 .. 4096
QUICK_BATCHES = (1, 16, 256, 4096)
FULL_POOLS = (4096, 65536)
QUICK_POOLS = (4096,)
ENV = {"batches": "KERNEL_SWEEP_BATCHES", "pools": "KERNEL_SWEEP_POOLS"}

counters.track_kernel(measure._empty_kernel)


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


def _relay_case(provider, fm, relay, idx, vals, *, host_lengths):
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
        # the fused host row (lengths, sum, stamp): stored by the kernel into pinned
        # memory, invisible to the profiler
        "zero_copy_bytes": 8 * (idx.numel() + 2) if provider == "fused-exact" else 0,
    }
    roles = [fm.__dict__["new_seq_lens_buf"], idx, vals]
    capturable = provider == "fused-barrier-free"  # the others block the host
    return Case(provider, step, provider != "upstream", roles, capturable, check, extra, relay)


def build_case(relays: Relays, device, pool: int, batch: int, provider: str, seed: int) -> Case:
    gen = torch.Generator().manual_seed(seed * 1_000_003 + pool + batch)
    idx = torch.randperm(pool, generator=gen)[:batch].to(device)
    vals = torch.randint(1, 1 << 15, (batch,), generator=gen, dtype=torch.int64).to(device)
    if provider == "floor":
        scratch = torch.zeros(1, dtype=torch.int64, device=device)
        return Case(
            "floor",
            lambda: measure._empty_kernel[(1,)](scratch),
            None,
            [scratch],
            True,
            extra={"variant": "empty launch", "zero_copy_bytes": 0},
        )
    fm, relay = relays.maps[provider]
    host = provider != "fused-barrier-free"
    return _relay_case(provider, fm, relay, idx, vals, host_lengths=host)


def device_times(case: Case, device: torch.device) -> dict:
    """``device_us`` / ``device_graph_us`` (``triton.testing``); empty on CPU."""
    if device.type != "cuda":
        return {}
    from triton.testing import do_bench, do_bench_cudagraph

    out = {"device_us": do_bench(case.step, warmup=10, rep=50, return_mode="median") * 1e3}
    if not case.capturable:
        out["device_note"] = "step blocks the host (synchronize): not capturable"
        return out
    try:
        out["device_graph_us"] = do_bench_cudagraph(case.step, rep=50, return_mode="median") * 1e3
    except Exception as exc:  # a capture failure is a result, not a crash
        torch.cuda.synchronize()
        out["device_note"] = f"capture failed: {type(exc).__name__}: {exc}"[:200]
    return out


def prepare(case: Case, device: torch.device) -> dict:
    """Put the patch state the case needs, check its lengths once, count its step."""
    if case.patched is not None:
        measure.set_patched(case.patched)
    if case.check is not None:
        case.check()
    counts = counters.count_step(
        case.step, device, roles=case.roles, reps=4, zero_copy_bytes=case.extra["zero_copy_bytes"]
    )
    own = None  # the relay's own launch count per step, a cross-check of the counters'
    if case.relay is not None:
        launches0 = case.relay.launcher.launches
        for _ in range(3):
            case.step()
        own = (case.relay.launcher.launches - launches0) / 3
    return {
        "launches": counts["launches"],
        "host_syncs": counts["host_syncs"],
        "d2h_bytes": counts["d2h_bytes"],
        "validation_ops": counts["validation_ops"],
        "launch_names": counts["launch_names"],
        "launch_source": counts["launch_source"],
        "relay_reported_launches": own,
        "variant": case.extra["variant"],
    }


# --------------------------------------------------------------------------- the benchmarks


def _sizes(name: str, default) -> list:
    raw = os.environ.get(ENV[name], "")
    return [int(x) for x in raw.split()] if raw else list(default)


def pytest_generate_tests(metafunc):
    if {"pool", "batch", "provider"} <= set(metafunc.fixturenames):
        pools, batches = _sizes("pools", QUICK_POOLS), _sizes("batches", QUICK_BATCHES)
        providers = os.environ.get("KERNEL_SWEEP_PROVIDERS", " ".join(PROVIDERS)).split()
        cells = [(p, b, v) for p in pools for b in batches if b <= p for v in providers]
        ids = [f"pool{p}-bs{b}-{v}" for p, b, v in cells]
        metafunc.parametrize(("pool", "batch", "provider"), cells, ids=ids)


_relays: dict = {}


def test_relay_step(benchmark, pool, batch, provider):
    device = harness.pick_device()
    harness.prepare_device(device)
    if pool not in _relays:
        _relays[pool] = Relays.build(device, pool)
    case = build_case(_relays[pool], device, pool, batch, provider, seed=0)
    try:
        info = prepare(case, device)
        benchmark.group = f"pool {pool}"
        benchmark(case.step)
        info.update(device_times(case, device))  # last: a capture leaves state behind
        benchmark.extra_info.update(info, provider=provider, pool=pool, batch=batch)
    finally:
        measure.set_patched(False)


# --------------------------------------------------------------------------- the command

COLUMNS = ("provider", "pool", "batch", "host_us", "device_us", "device_graph_us")
COLUMNS += ("launches", "host_syncs", "d2h_bytes")


def rows_of(bench_json: dict) -> list:
    """One row per benchmark: its extra_info and pytest-benchmark's median (µs)."""
    rows = []
    for b in bench_json["benchmarks"]:
        stats = b["stats"]
        rows.append(
            {
                **b["extra_info"],
                "host_us": stats["median"] * 1e6,
                "host_us_min": stats["min"] * 1e6,
                "host_us_iqr": stats["iqr"] * 1e6,
                "host_rounds": stats["rounds"],
            }
        )
    return rows


def plot(rows: list, path, device: torch.device) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pools = sorted({r["pool"] for r in rows})
    # On CPU the microseconds are the Triton interpreter's and mean nothing: plot the counts.
    metrics = ["device_us", "host_us"] if device.type == "cuda" else ["launches", "d2h_bytes"]
    fig, axes = plt.subplots(
        len(metrics), len(pools), squeeze=False, figsize=(6.5 * len(pools), 4.5 * len(metrics))
    )
    for i, metric in enumerate(metrics):
        for j, pool in enumerate(pools):
            series = {}
            for provider in PROVIDERS:
                pts = sorted(
                    (r["batch"], r.get(metric))
                    for r in rows
                    if r["pool"] == pool and r["provider"] == provider
                )
                if pts:
                    series[provider] = tuple(zip(*pts))
            title = f"{metric} per relay step, pool={pool}"
            if device.type != "cuda":
                title += "\nCPU: counts (interpreter timings are not speed and not shown)"
            harness.plot_lines(
                series,
                path,
                title=title,
                xlabel="batch size",
                ylabel=metric,
                ax=axes[i][j],
                logy=metric != "launches",
            )
    fig.suptitle(f"spec_fused kernel sweep on {harness.device_name(device)}", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m bench.kernel_sweep",
        description="Relay round trip (publish + resolve) per provider, batch and pool size, "
        "through pytest-benchmark.",
    )
    harness.add_common_args(parser)
    parser.add_argument("--batches", type=int, nargs="+", help="override the batch sizes")
    parser.add_argument("--pools", type=int, nargs="+", help="override the pool sizes")
    parser.add_argument("--providers", nargs="+", choices=PROVIDERS, default=list(PROVIDERS))
    return parser.parse_args(argv)


def main(argv=None) -> dict:
    import pytest

    args = parse_args(argv)
    device = harness.pick_device()
    batches = args.batches or (QUICK_BATCHES if args.quick else FULL_BATCHES)
    pools = args.pools or (QUICK_POOLS if args.quick else FULL_POOLS)
    out_dir = harness.results_dir(device, args.out)
    path = out_dir / "kernel_sweep.json"
    os.environ.update(
        KERNEL_SWEEP_BATCHES=" ".join(map(str, batches)),
        KERNEL_SWEEP_POOLS=" ".join(map(str, pools)),
        KERNEL_SWEEP_PROVIDERS=" ".join(args.providers),
    )
    on_cpu = device.type == "cpu"
    cmd = [__file__, "-q", "-p", "no:cacheprovider", "--benchmark-only"]
    cmd += [f"--benchmark-json={path}", "--benchmark-columns=min,median,iqr,rounds"]
    # CPU: interpreter times mean nothing, a few rounds show the shape; CUDA: short too
    max_time = 0.05 if on_cpu else (0.1 if args.quick else 0.5)
    cmd += [f"--benchmark-max-time={max_time}", "--benchmark-min-rounds=3"]
    try:
        import pygal  # noqa: F401  (pytest-benchmark's histogram)

        cmd.append(f"--benchmark-histogram={out_dir / 'kernel_sweep'}")
    except ImportError:
        print("kernel_sweep: no histogram (pygal is not installed: pytest-benchmark[histogram])")
    t0 = time.perf_counter()
    rc = pytest.main(cmd)
    if rc != 0:
        raise SystemExit(f"kernel_sweep: pytest exited {rc}")
    data = json.loads(path.read_text())
    for bench in data["benchmarks"]:
        bench["stats"].pop("data", None)  # every round's raw time: the histogram has them
    rows = rows_of(data)
    data.update(
        device=harness.device_name(device),
        versions=harness.versions(device),
        mode=harness.kernel_backend(device),
        rows=rows,
        config={
            "quick": args.quick,
            "batches": list(batches),
            "pools": list(pools),
            "wall_s": round(time.perf_counter() - t0, 1),
        },
    )
    draw = None if args.no_plot or not rows else (lambda png: plot(rows, png, device))
    svgs = sorted(Path(out_dir).glob("kernel_sweep*.svg"))
    return harness.write_results(
        "kernel_sweep",
        out_dir,
        data,
        tables=[harness.format_table(rows, COLUMNS)],
        plot=draw,
        count=f"{len(rows)} benchmarks",
        also=svgs,
    )


if __name__ == "__main__":
    main()
