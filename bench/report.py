"""Markdown tables for the README from committed results (``bench/results/<device>/``).

Why a script: the README's figures must be the measured ones. This renders them from the
JSON the benchmarks wrote, so refreshing the README after a run is one command:

    python -m bench.report bench/results/cpu      # or bench/results/h200
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

PROVIDERS = ("upstream", "fused-exact", "fused-barrier-free", "floor")


def _fmt(v, digits=1):
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


def kernel_table(path: Path, pool: int, batches=(1, 4096)) -> str:
    data = json.loads(path.read_text())
    rows = {(r["provider"], r["batch"]): r for r in data["rows"] if r["pool"] == pool}
    timed = data["device"] != "cpu"  # on CPU the µs are the interpreter's: left out
    head = "| batch | provider | launches | host syncs | D2H bytes |"
    rule = "|---:|---|---:|---:|---:|"
    if timed:
        head, rule = head + " host µs | device µs |", rule + "---:|---:|"
    lines = [f"kernel_sweep, pool {pool}, device `{data['device']}`", "", head, rule]
    for b in batches:
        for p in PROVIDERS:
            r = rows.get((p, b))
            if r is None:
                continue
            line = f"| {b} | {p} | {r['launches']} | {r['host_syncs']} | {r['d2h_bytes']} |"
            if timed:
                line += f" {_fmt(r['host_us'])} | {_fmt(r['device_us'], 2)} |"
            lines.append(line)
    return "\n".join(lines)


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
    ks = args.results_dir / "kernel_sweep.json"
    host = args.results_dir / "host_overhead.json"
    engine = args.results_dir / "ab_engine.json"
    if engine.exists():
        print(engine_table(engine), "\n")
    if ks.exists():
        print(f"_{versions_line(ks)}_\n")
        print(kernel_table(ks, args.pool), "\n")
    if host.exists():
        print(host_table(host), "\n")


if __name__ == "__main__":
    main()
