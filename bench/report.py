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


def kernel_table(path: Path, pool: int, batches=(1, 8, 64, 256, 1024, 4096)) -> str:
    data = json.loads(path.read_text())
    rows = {(r["provider"], r["batch"]): r for r in data["rows"] if r["pool"] == pool}
    lines = [f"kernel_sweep, pool {pool}, device `{data['device']}`",
             "",
             "| batch | provider | launches | host syncs | D2H bytes | host µs | device µs |",
             "|---:|---|---:|---:|---:|---:|---:|"]
    for b in batches:
        for p in PROVIDERS:
            r = rows.get((p, b))
            if r is None:
                continue
            lines.append(f"| {b} | {p} | {r['launches']} | {r['host_syncs']} | "
                         f"{r['d2h_bytes']} | {_fmt(r['host_us'])} | {_fmt(r['device_us'], 2)} |")
    return "\n".join(lines)


def ab_table(path: Path) -> str:
    data = json.loads(path.read_text())
    summary = data.get("summary", [])
    lines = [f"ab_throughput, device `{data['device']}`, arm B kernel backend "
             f"`{data.get('config', {}).get('kernel_backend', '?')}`",
             "",
             "| algorithm | concurrency | A tok/s | B tok/s | C tok/s | B/A | recovered A→C | B variant |",
             "|---|---:|---:|---:|---:|---:|---:|---|"]
    for s in summary:
        share = s.get("gap_share_recovered")
        lines.append(
            f"| {s['algorithm']} | {s['concurrency']} | {_fmt(s['A_tok_s'])} | "
            f"{_fmt(s['B_tok_s'])} | {_fmt(s['C_tok_s'])} | {_fmt(s['B_over_A'], 3)} | "
            f"{'-' if share is None else f'{share:.0%}'} | {s.get('B_variant', '')} |")
    return "\n".join(lines)


def versions_line(path: Path) -> str:
    v = json.loads(path.read_text())["versions"]
    keys = ("sglang", "torch", "triton", "cuda", "driver", "gpu", "kernel_backend")
    return ", ".join(f"{k} {v.get(k)}" for k in keys if v.get(k) is not None)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.report", description=__doc__.split("\n")[0])
    parser.add_argument("results_dir", type=Path)
    parser.add_argument("--pool", type=int, default=4096)
    args = parser.parse_args(argv)
    ks, ab = args.results_dir / "kernel_sweep.json", args.results_dir / "ab_throughput.json"
    if ks.exists():
        print(f"_{versions_line(ks)}_\n")
        print(kernel_table(ks, args.pool), "\n")
    if ab.exists():
        print(ab_table(ab))


if __name__ == "__main__":
    main()
