"""Markdown tables for the README from committed results (``bench/results/<device>/``).

Why a script: the README's figures must be the measured ones. This renders them from the
JSON the benchmarks wrote, so refreshing the README after a run is one command:

    python -m bench.report bench/results/cpu      # or bench/results/h200
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

PROBE_COLUMNS = ("mode", "batch", "variant", "needs_cpu_seq_lens", "host_us_median",
                 "device_us_median", "host_x", "device_x", "late_steps")  # fmt: skip


def probe_table(path: Path, pool: int) -> str:
    """``bench/probe.py``'s medians at one pool (× upstream: the median of per-round ratios
    to upstream with the same needs_cpu_seq_lens); a dry run's checks in one line."""
    from bench import harness

    data = json.loads(path.read_text())
    failed = sorted({r["variant"] for r in data["rows"] if r["ok"] is False})
    checks = "every variant's check passed" if not failed else f"failed: {', '.join(failed)}"
    if data["dry_run"]:
        return f"probe: a dry run on `{data['device']}`, no figures; {checks}"
    rows = [r for r in data["rows"] if r["pool"] == pool]
    table = harness.format_table(rows, PROBE_COLUMNS, markdown=True)
    return f"probe, pool {pool}, device `{data['device']}`; {checks}\n\n{table}"


HOST_PROVIDERS = ("spec_fused", "spec_fused-null", "spec_fused-jit", "floor-direct", "floor-jit")


def host_table(path: Path, batches=(1, 1024)) -> str:
    """Host µs per relay step (median over rounds) and the ratio to upstream's."""
    data = json.loads(path.read_text())
    rows = {
        (r["provider"], r["algorithm"], r["needs_cpu_seq_lens"], r["batch"]): r
        for r in data["rows"]
    }
    present = [p for p in HOST_PROVIDERS if any(k[0] == p for k in rows)]
    lines = [
        f"host_overhead, device `{data['device']}`, production backend "
        f"`{data['config']['production_backend']}`, median host µs per step "
        f"(publish + resolve) and × upstream (the median of each round's ratio to "
        f"upstream's block in the same round)",
        "",
        "| algorithm | needs_cpu_seq_lens | batch | upstream | " + " | ".join(present) + " |",
        "|---|---:|---:|---:|" + "---:|" * len(present),
    ]
    cells = dict.fromkeys((k[1], k[2]) for k in rows)
    for algorithm, ncsl in cells:
        for b in batches:
            up = rows.get(("upstream", algorithm, ncsl, b))
            if up is None:
                continue
            cols = []
            for p in present:
                r = rows.get((p, algorithm, ncsl, b))
                cols.append(
                    "-" if r is None else f"{r['host_us']:.2f} ({r['ratio_to_upstream']:.2f}×)"
                )
            lines.append(
                f"| {algorithm} | {ncsl} | {b} | {up['host_us']:.2f} | " + " | ".join(cols) + " |"
            )
    for s in data.get("summary", []):
        best_of = s.get("worst_ratio_best_of")
        lines.append(
            f"\n{s['provider']}: worst {s['worst_ratio']:.2f}× upstream "
            f"({s['worst_at']}), median {s['median_ratio']:.2f}× over "
            f"{sum(1 for r in data['rows'] if r['provider'] == s['provider'])} "
            f"cells"
            + ("" if best_of is None else f"; worst of the best-of-rounds ratios {best_of:.2f}×")
        )
    return "\n".join(lines)


def engine_table(path: Path) -> str:
    """The A/B on the real engine (``bench/ab_engine.py``): on CPU its parity check."""
    from bench import ab_engine, harness

    data = json.loads(path.read_text())
    plan = data["plan"]
    on_gpu = plan["device"] == "cuda"
    columns = ab_engine.GPU_COLUMNS if on_gpu else ab_engine.CPU_COLUMNS
    head = (
        f"ab_engine, device `{data['device']}`: {plan['mode']}, {plan['models']['shape']}, "
        f"{plan['rounds']} rounds x {plan['max_new_tokens']} tokens per request"
    )
    if not on_gpu:
        head += f". {ab_engine.CPU_LINE}"
    return f"{head}\n\n{harness.format_table(data['summary'], columns, markdown=True)}"


def versions_line(path: Path) -> str:
    v = json.loads(path.read_text())["versions"]
    keys = ("sglang", "torch", "triton", "cuda", "driver", "gpu", "kernel_backend")
    return ", ".join(f"{k} {v.get(k)}" for k in keys if v.get(k) is not None)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.report", description=__doc__.split("\n")[0]
    )
    parser.add_argument("results_dir", type=Path)
    parser.add_argument("--pool", type=int, default=4096)
    args = parser.parse_args(argv)
    probe = args.results_dir / "probe.json"
    host = args.results_dir / "host_overhead.json"
    engine = args.results_dir / "ab_engine.json"
    if engine.exists():
        print(engine_table(engine), "\n")
    if probe.exists():
        print(f"_{versions_line(probe)}_\n")
        print(probe_table(probe, args.pool), "\n")
    if host.exists():
        print(host_table(host), "\n")


if __name__ == "__main__":
    main()
