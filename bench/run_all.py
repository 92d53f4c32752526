"""Run every benchmark of spec_fused: the GPU probe, the host-cost sweep, the A/B on the
real engine.

Why one entry point: the README's benchmark command must be one line that works on a
laptop CPU (``--quick``, Triton interpreter) and, unchanged, on a GPU (full size):

    TRITON_INTERPRET=1 python -m bench.run_all --quick     # CPU, a few minutes
    python -m bench.run_all --out /tmp/h200                # CUDA

Results go to ``bench/results/<device>/`` (or ``--out DIR``): ``probe.json/.png`` (on a CPU
its dry run: the plan and every variant's check, no figures), ``host_overhead.json/.png``,
``ab_engine.json/.md/.png``.
The real-server A/B (weights + GPU) is
``bench/ab_server.sh``.
"""

from __future__ import annotations

import argparse
import time

from bench import harness  # first: sets TRITON_INTERPRET on CPU before triton is imported


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m bench.run_all",
        description="probe, host_overhead, then ab_engine; prints where the results went.",
    )
    harness.add_common_args(parser)
    parser.add_argument(
        "--skip",
        nargs="+",
        choices=("probe", "host_overhead", "ab_engine"),
        default=[],
        help="benchmarks to leave out",
    )
    return parser.parse_args(argv)


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
    done, walls = {}, {}
    for name, module, argv in (
        ("probe", probe, probe_args),
        ("host_overhead", host_overhead, passthrough),
        ("ab_engine", ab_engine, passthrough),
    ):
        if name in args.skip:
            continue
        print(f"\n=== {name} {' '.join(argv)}", flush=True)
        t0 = time.perf_counter()
        done[name] = module.main(argv)
        walls[name] = time.perf_counter() - t0
        if name == "probe" and done[name]:
            raise SystemExit(f"probe exited {done[name]}: a variant's check failed")
    out_dir = harness.results_dir(harness.pick_device(), args.out)
    print("\n=== results")
    for name, wall in walls.items():
        print(f"{name:>14}: {wall:6.1f} s")
    for path in sorted(out_dir.iterdir()):
        if path.stem in walls:
            print(f"  {path}")
    return done


if __name__ == "__main__":
    main()
