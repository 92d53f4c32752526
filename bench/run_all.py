"""Run every benchmark of spec_fused: the GPU probe, the host-cost sweep, the A/B on the
real engine, the kernel microbenchmark.

Why one entry point: the README's benchmark command must be one line that works on a
laptop CPU (``--quick``, Triton interpreter) and, unchanged, on a GPU (full size):

    TRITON_INTERPRET=1 python -m bench.run_all --quick     # CPU, a few minutes
    python -m bench.run_all --out /tmp/h200                # CUDA

Results go to ``bench/results/<device>/`` (or ``--out DIR``): ``probe.json/.png`` (on a CPU
its dry run: the plan and every variant's check, no figures), ``host_overhead.json/.png``,
``ab_engine.json/.md/.png``, ``kernel_bench.json`` (pytest-benchmark's; on a CPU a short
run in the Triton interpreter, its times labelled as not a speed).
The real-server A/B (weights + GPU) is
``bench/ab_server.sh``.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

from bench import harness  # first: sets TRITON_INTERPRET on CPU before triton is imported

# pytest-benchmark's options for bench/test_kernel_bench.py: rounds of >= 1 ms / 0.2 ms;
# at most 0.05 s a case on a CPU (48 cases in about 10 s), 0.25 s on a GPU after a warm-up.
KERNEL_BENCH = {
    "cpu": ["--benchmark-min-time=0.001", "--benchmark-max-time=0.05"],
    "cuda": ["--benchmark-min-time=0.0002", "--benchmark-max-time=0.25", "--benchmark-warmup=on"],
}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m bench.run_all",
        description="probe, host_overhead, ab_engine, kernel_bench; prints where results went.",
    )
    harness.add_common_args(parser)
    parser.add_argument(
        "--skip",
        nargs="+",
        choices=("probe", "host_overhead", "ab_engine", "kernel_bench"),
        default=[],
        help="benchmarks to leave out",
    )
    return parser.parse_args(argv)


def kernel_bench(argv) -> int:
    """``bench/test_kernel_bench.py`` in a pytest of its own; its JSON into ``argv[0]``."""
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    cmd += ["bench/test_kernel_bench.py", f"--benchmark-json={argv[0]}/kernel_bench.json"]
    cmd += ["--benchmark-columns=min,median,iqr,rounds,iterations"]
    cmd += KERNEL_BENCH[harness.pick_device().type]
    print("python", *cmd[1:], flush=True)
    return subprocess.run(cmd, cwd=harness.BENCH_DIR.parent).returncode


def main(argv=None) -> dict:
    args = parse_args(argv)
    passthrough = [
        *(["--quick"] if args.quick else []),
        *(["--out", args.out] if args.out else []),
        *(["--no-plot"] if args.no_plot else []),
    ]
    from bench import ab_engine, host_overhead, probe

    # the probe times a GPU only; on a CPU its dry run checks every variant
    on_gpu = harness.pick_device().type == "cuda"
    probe_args = [a for a in passthrough if a != "--quick"] + ([] if on_gpu else ["--dry-run"])
    out_dir = harness.results_dir(harness.pick_device(), args.out)
    done, walls = {}, {}
    for name, run, argv in (
        ("probe", probe.main, probe_args),
        ("host_overhead", host_overhead.main, passthrough),
        ("ab_engine", ab_engine.main, passthrough),
        ("kernel_bench", kernel_bench, [str(out_dir.resolve())]),
    ):
        if name in args.skip:
            continue
        print(f"\n=== {name} {' '.join(argv)}", flush=True)
        t0 = time.perf_counter()
        done[name] = run(argv)
        walls[name] = time.perf_counter() - t0
        if name in ("probe", "kernel_bench") and done[name]:
            raise SystemExit(f"{name} exited {done[name]}: a check failed")
    print("\n=== results")
    for name, wall in walls.items():
        print(f"{name:>14}: {wall:6.1f} s")
    for path in sorted(out_dir.iterdir()):
        if path.stem in walls:
            print(f"  {path}")
    return done


if __name__ == "__main__":
    main()
