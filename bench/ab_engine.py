"""A/B on the real engine: SGLang's ``sglang.Engine`` serving with dummy weights, arm A =
``SPEC_FUSED_DISABLE=1`` (SGLang as shipped), arm B = the plugin, loaded by SGLang's own
``load_plugins()`` in the scheduler process, in interleaved rounds (AB, BA, AB, ...).

Why: the other benchmarks time the relay alone (kernel sweep, host cost) or replay the
overlap loop around it (``ab_throughput``); this one runs everything a server runs - the
overlap scheduler, spec v2, the worker publishing mid-forward, the scheduler resolving -
and reports what a user sees: tokens/s and time per step, B/A with its noise band, and
each arm's WAR barrier and host lengths (read from the scheduler process).

Each arm is one worker process with its own engine; both arms' engines are up at once and
the requests alternate between them (round r: A then B at each concurrency, B then A in
the next round), so the rounds' noise is the machine's over seconds, not over an engine
start. At each concurrency an arm serves that many greedy requests of ``--max-new``
tokens at once (``max_running_requests`` = the largest concurrency). tokens/s = completion
tokens / wall time of the batch; ms/step = wall time / speculative steps (counted in the scheduler).

**On CPU** it runs the e2e tier's tiny Llama (``tests/e2e/models.py``: 4 layers, hidden
64) with its CPU stand-ins (``tests/e2e/site``, put on the workers' PYTHONPATH) in
``.venv-sched``, arm B's relay on its CPU backend (the plain-torch reference, as a CPU
server runs it; SGLang itself needs the Triton interpreter for one kernel there): the
figures are CPU figures of a toy model, **not GPU speed**; they show
that the plugin serves at parity on the real engine, not what it saves on a GPU. On a GPU
with SGLang installed it runs the same tiny shape without stand-ins.

    python -m bench.ab_engine --quick          # CPU: EAGLE, host lengths read, 2 rounds
    python -m bench.ab_engine --configs eagle-host eagle-gpu-only dflash-gpu-only
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
E2E = ROOT / "tests" / "e2e"
ARMS = ("A", "B")


def parse_args(argv=None):
    from bench import harness

    parser = argparse.ArgumentParser(
        prog="python -m bench.ab_engine", description=__doc__.split("\n\n")[0]
    )
    harness.add_common_args(parser)
    parser.add_argument(
        "--configs",
        nargs="+",
        default=None,
        help="e2e configurations (tests/e2e/configs.py); default: "
        "eagle-host (--quick) or eagle-host eagle-gpu-only",
    )
    parser.add_argument(
        "--concurrency",
        type=int,
        nargs="+",
        default=None,
        help="default 1 8 64 256 (--quick: 1 16 256)",
    )
    parser.add_argument("--rounds", type=int, default=None, help="default 4 (--quick: 2)")
    parser.add_argument("--max-new", type=int, default=8, help="tokens per request")
    parser.add_argument(
        "--python",
        default=None,
        help="interpreter with the engine (default: .venv-sched's, else this)",
    )
    parser.add_argument(
        "--worker", nargs=3, metavar=("CONFIG", "ARM", "MAX_CONC"), help=argparse.SUPPRESS
    )
    return parser.parse_args(argv)


# --------------------------------------------------------------------------- worker


def _requests(n: int, max_new: int):
    import random

    rng = random.Random(n)
    prompts = [[rng.randrange(3, 500) for _ in range(8 + i % 9)] for i in range(n)]
    params = [{"temperature": 0.0, "max_new_tokens": max_new, "ignore_eos": True}] * n
    return prompts, params


def _steps(counts_dir: str) -> tuple[int, dict]:
    best = {}
    for path in Path(counts_dir).glob("counts-*.json"):
        data = json.loads(path.read_text())
        if data.get("steps", 0) >= best.get("steps", 0):
            best = data
    return best.get("steps", 0), best


MARK = "AB_ENGINE "  # the worker's protocol lines on stdout; anything else is ignored


def _e2e_configs():
    """The e2e tier's configurations and CPU stand-in paths (tests/e2e/configs.py)."""
    if str(E2E) not in sys.path:
        sys.path.insert(0, str(E2E))
    import configs  # noqa: E402  (tests/e2e)

    return configs


def worker(name: str, arm: str, max_conc: int, max_new: int) -> None:
    """One engine for one arm, kept alive: reads ``N`` (serve N requests at once, answer
    with the timing) or ``quit`` (answer with the scheduler's counts) from stdin."""
    configs = _e2e_configs()
    cfg = configs.CONFIGS[name]
    counts_dir = tempfile.mkdtemp(prefix="spec_fused_ab_engine_")
    os.environ.update(
        SPEC_FUSED_E2E="1",
        SPEC_FUSED_E2E_COUNTS_DIR=counts_dir,
        SPEC_FUSED_E2E_HOST_LENGTHS="1" if cfg.host_lengths else "",
        SGLANG_DISABLED_MODEL_ARCHS=configs.unused_model_modules(),
    )
    if arm == "A":
        os.environ["SPEC_FUSED_DISABLE"] = "1"
    else:
        os.environ.pop("SPEC_FUSED_DISABLE", None)
    import sglang

    def say(payload):
        print(MARK + json.dumps(payload), flush=True)

    models = configs.make_models(Path(tempfile.mkdtemp(prefix="spec_fused_ab_models_")))
    kwargs = configs.engine_kwargs(cfg, models)
    kwargs.update(
        max_running_requests=max_conc, max_total_tokens=max(4096, max_conc * (24 + max_new + 16))
    )
    t0 = time.perf_counter()
    engine = sglang.Engine(**kwargs)
    engine.generate(
        input_ids=[[5, 6, 7, 8]],
        sampling_params={  # warm-up
            "temperature": 0.0,
            "max_new_tokens": 4,
            "ignore_eos": True,
        },
    )
    say({"ready_s": time.perf_counter() - t0})
    try:
        for line in sys.stdin:
            if line.strip() == "quit":
                break
            conc = int(line)
            prompts, params = _requests(conc, max_new)
            steps0, _ = _steps(counts_dir)
            t0 = time.perf_counter()
            outs = engine.generate(input_ids=prompts, sampling_params=params)
            wall = time.perf_counter() - t0
            steps = max(_steps(counts_dir)[0] - steps0, 1)
            tokens = sum(len(o["output_ids"]) for o in outs)
            say(
                {
                    "concurrency": conc,
                    "tokens": tokens,
                    "wall_s": wall,
                    "tokens_per_s": tokens / wall,
                    "steps": steps,
                    "step_ms": wall / steps * 1e3,
                }
            )
    finally:
        engine.shutdown()
    _, counts = _steps(counts_dir)
    relay = counts.get("relay") or {}
    say(
        {
            "war_barrier": counts.get("war_barrier"),
            "host_lengths": "exact" if counts.get("host_length_steps") else "none",
            "relay_steps": counts.get("relay_steps", 0),
            "steps": counts.get("steps", 0),
            "variant": relay.get("variant"),
            "relay_backend": relay.get("backend"),
        }
    )


# --------------------------------------------------------------------------- driver


def _python(args) -> str:
    if args.python:
        return args.python
    sched = ROOT / ".venv-sched" / "bin" / "python"
    return str(sched) if sched.exists() else sys.executable


class Worker:
    """A worker process (one engine, one arm) and its protocol."""

    def __init__(self, python: str, name: str, arm: str, args, max_conc: int, on_cpu: bool):
        env = dict(os.environ)
        if on_cpu:  # the e2e tier's CPU stand-ins (sgl_kernel, overlap on CPU, ...)
            env.update(
                PYTHONPATH=_e2e_configs().pythonpath(ROOT),
                SGLANG_USE_CPU_ENGINE="1",
                TRITON_INTERPRET="1",
                # SGLang needs the interpreter for one kernel here; the relay runs what a
                # CPU server runs, its plain-torch reference, not the interpreter
                SPEC_FUSED_FORCE_REFERENCE="1",
                OMP_NUM_THREADS="1",
            )
        self.name, self.arm = name, arm
        self.log = tempfile.NamedTemporaryFile(
            prefix=f"ab_engine_{arm}_", suffix=".log", delete=False
        )
        self.proc = subprocess.Popen(
            [
                python,
                "-m",
                "bench.ab_engine",
                "--worker",
                name,
                arm,
                str(max_conc),
                "--max-new",
                str(args.max_new),
            ],
            env=env,
            cwd=ROOT,
            text=True,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
        )
        self.ready_s = self.read()["ready_s"]

    def read(self) -> dict:
        for line in self.proc.stdout:
            if line.startswith(MARK):
                return json.loads(line[len(MARK) :])
        self.proc.wait()
        tail = "\n".join(
            line
            for line in Path(self.log.name).read_text().splitlines()
            if "Ignore import error" not in line
        )[-3000:]
        raise RuntimeError(
            f"ab_engine worker {self.name} {self.arm} died (rc {self.proc.returncode}):\n{tail}"
        )

    def serve(self, conc: int) -> dict:
        self.proc.stdin.write(f"{conc}\n")
        self.proc.stdin.flush()
        return self.read()

    def close(self) -> dict:
        self.proc.stdin.write("quit\n")
        self.proc.stdin.flush()
        final = self.read()
        self.proc.wait(timeout=120)
        os.unlink(self.log.name)
        return final


def summarize(runs: list) -> list:
    """Per configuration and concurrency: each arm's median over rounds, B/A, the band of
    the rounds' paired B/A ratios, and whether B and A differ by more than half their
    rounds' spread."""
    out = []
    keys = dict.fromkeys((r["config"], row["concurrency"]) for r in runs for row in r["rows"])
    for name, conc in keys:
        per_arm = {}
        for arm in ARMS:
            mine = [
                (r["round"], row, r)
                for r in runs
                if r["config"] == name and r["arm"] == arm
                for row in r["rows"]
                if row["concurrency"] == conc
            ]
            per_arm[arm] = mine
        tps = {arm: [row["tokens_per_s"] for _, row, _ in per_arm[arm]] for arm in ARMS}
        step = {
            arm: statistics.median(row["step_ms"] for _, row, _ in per_arm[arm]) for arm in ARMS
        }
        med = {arm: statistics.median(tps[arm]) for arm in ARMS}
        by_round = {arm: {rnd: row["tokens_per_s"] for rnd, row, _ in per_arm[arm]} for arm in ARMS}
        paired = [
            by_round["B"][rnd] / by_round["A"][rnd] for rnd in by_round["A"] if rnd in by_round["B"]
        ]
        noise = max(max(tps[a]) - min(tps[a]) for a in ARMS) / 2
        last = {arm: per_arm[arm][-1][2] for arm in ARMS}
        out.append(
            {
                "config": name,
                "concurrency": conc,
                "A_tok_s": med["A"],
                "B_tok_s": med["B"],
                "B_over_A": med["B"] / med["A"],
                "B_over_A_min": min(paired),
                "B_over_A_max": max(paired),
                "B_vs_A_within_noise": abs(med["B"] - med["A"]) <= noise,
                "A_step_ms": step["A"],
                "B_step_ms": step["B"],
                "rounds": len(paired),
                **{f"{arm}_barrier": last[arm]["war_barrier"] for arm in ARMS},
                **{f"{arm}_host_lengths": last[arm]["host_lengths"] for arm in ARMS},
                "B_variant": last["B"]["variant"],
                "B_relay_steps": f"{last['B']['relay_steps']}/{last['B']['steps']}",
            }
        )
    return out


COLUMNS = (
    "config",
    "concurrency",
    "A_tok_s",
    "B_tok_s",
    "B_over_A",
    "B_over_A_min",
    "B_over_A_max",
    "B_vs_A_within_noise",
    "A_step_ms",
    "B_step_ms",
    "A_barrier",
    "B_barrier",
    "A_host_lengths",
    "B_host_lengths",
    "B_variant",
    "B_relay_steps",
)


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.worker:
        name, arm, max_conc = args.worker
        worker(name, arm, int(max_conc), args.max_new)
        return {}
    from bench import harness

    device = harness.pick_device()
    on_cpu = device.type == "cpu"
    configs_ = args.configs or (["eagle-host"] if args.quick else ["eagle-host", "eagle-gpu-only"])
    concurrency = args.concurrency or ([1, 16, 256] if args.quick else [1, 8, 64, 256])
    rounds = args.rounds or (2 if args.quick else 4)
    python = _python(args)
    probe = subprocess.run(
        [python, "-c", "import sglang.srt.entrypoints.engine"],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=_e2e_configs().pythonpath()) if on_cpu else None,
    )
    if probe.returncode != 0:  # e.g. a GPU box with only .venv's light SGLang
        print(
            f"ab_engine: skipped: {python} cannot import SGLang's engine "
            f"({probe.stderr.strip().splitlines()[-1] if probe.stderr.strip() else '?'}); "
            f"on CPU run scripts/setup_e2e_tier.sh, on a GPU install sglang with its deps"
        )
        return {}
    t0 = time.perf_counter()
    runs = []
    for name in configs_:
        # both arms' engines alive at once, requests alternating: the rounds are seconds
        # apart, not an engine start apart
        workers = {arm: Worker(python, name, arm, args, max(concurrency), on_cpu) for arm in ARMS}
        results = {arm: [] for arm in ARMS}
        try:
            for rnd in range(rounds):
                for conc in concurrency:
                    for arm in ARMS if rnd % 2 == 0 else ARMS[::-1]:
                        row = workers[arm].serve(conc)
                        results[arm].append(dict(row, round=rnd))
                print(
                    f"ab_engine: {name} round {rnd}: "
                    + ", ".join(
                        f"c{a['concurrency']} A {a['tokens_per_s']:.1f} / B "
                        f"{b['tokens_per_s']:.1f} tok/s"
                        for a, b in zip(
                            results["A"][-len(concurrency) :], results["B"][-len(concurrency) :]
                        )
                    ),
                    flush=True,
                )
        finally:
            finals = {arm: w.close() for arm, w in workers.items()}
        for arm in ARMS:
            for rnd in range(rounds):
                runs.append(
                    dict(
                        finals[arm],
                        config=name,
                        arm=arm,
                        round=rnd,
                        start_s=workers[arm].ready_s,
                        rows=[r for r in results[arm] if r["round"] == rnd],
                    )
                )
    summary = summarize(runs)
    out_dir = harness.results_dir(device, args.out)
    note = (
        "CPU: the e2e tier's tiny Llama (4 layers, hidden 64, dummy weights) and CPU "
        "stand-ins; NOT GPU speed - parity on the real engine, not the GPU saving"
        if on_cpu
        else "tiny Llama, dummy weights"
    )
    payload = {
        "benchmark": "ab_engine",
        "device": str(device.type if on_cpu else harness.device_name(device)),
        "versions": harness.versions(device),
        "config": {
            "configs": configs_,
            "concurrency": concurrency,
            "rounds": rounds,
            "max_new_tokens": args.max_new,
            "note": note,
            "wall_s": round(time.perf_counter() - t0, 1),
        },
        "runs": runs,
        "summary": summary,
    }
    table = harness.format_table(summary, COLUMNS)
    md = out_dir / "ab_engine.md"
    md.write_text(
        f"# A/B on the real engine ({payload['device']})\n\n{note}. Rounds: "
        f"{rounds}, {args.max_new} tokens per request; median over rounds; B/A band "
        f"= min..max of the rounds' paired ratios.\n\n"
        + harness.format_table(summary, COLUMNS, markdown=True)
        + "\n"
    )

    def plot(path):
        series = {}
        for name in configs_:
            rows = [s for s in summary if s["config"] == name]
            for arm in ARMS:
                series[f"{name} {arm}"] = (
                    [s["concurrency"] for s in rows],
                    [s[f"{arm}_tok_s"] for s in rows],
                )
        harness.plot_lines(
            series,
            path,
            title=f"ab_engine, {payload['device']}: "
            f"{note.split(';')[1].strip() if on_cpu else note}",
            xlabel="concurrency",
            ylabel="tokens/s",
        )

    return harness.write_results(
        "ab_engine",
        out_dir,
        payload,
        tables=[note, table],
        plot=None if args.no_plot else plot,
        count=f"{len(configs_) * 2} engines, {len(runs)} arm-rounds",
        also=[md],
    )


if __name__ == "__main__":
    main()
