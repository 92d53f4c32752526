"""A/B throughput: SGLang's overlap event loop replayed without model weights.

Why a replay: the relay's cost matters only where it stalls the overlap loop, i.e. where
the host waits for the device (SGLang's resolve synchronizes on a whole-pool D2H copy) or
the device waits for the host. A kernel microbenchmark cannot show that; a real server
needs weights and a GPU (``bench/ab_server.sh`` does that). This replay keeps everything
of ``Scheduler.event_loop_overlap`` + ``run_batch`` that touches the relay, on the *real*
``FutureMap`` class, and replaces the model with a forward of calibrated duration:

    loop:  schedule (host bookkeeping, half the calibrated cost, input H2D on the
           schedule stream)
           run_batch: resolve_seq_lens_cpu(batch)           [schedule stream]
                      forward prepare (host, calibrated: ForwardBatch, attn metadata)
                      forward_stream.wait_stream(schedule_stream)
                      forward part 1 (verify) -> on_publish = FutureMap.publish
                      forward part 2 (draft extend)           [forward stream]
           _apply_war_barrier: schedule_stream.wait_stream(forward_stream), if the
                      Scheduler's rule applies (arm A: always on CUDA; arm B/C: CUDA and
                      ``establish(caps_for(algorithm))`` needs it; never on CPU, as upstream)
           process the previous batch's result: wait for its forward, host bookkeeping
           (the other half of the calibrated cost)

Arms, interleaved in one process, several rounds, the order rotating per round (ABC,
BCA, CAB, ...): A = SGLang's ``FutureMap`` unpatched; B = ``sglang_patch.apply()``;
C = ideal, no relay at all (lengths carried on the host, no publish, no resolve, same
WAR-barrier rule as B). Continuous batching at a
fixed concurrency: requests with random output lengths finish and are replaced, slots are
reused (FIFO, so never inside one publish), a joining request's prefill length is
published with the step before it joins. Accept lengths are drawn per request and step
(DFLASH-like: block 16, accept 1..16; EAGLE-like: chains, accept 1..4), the same draws
for every arm. tokens/s = accepted tokens / wall time.

The forward: on CUDA ``torch.cuda._sleep`` for the calibrated number of cycles (the device
is busy, the host is free: what a CUDA-graph forward looks like to the scheduler). On CPU
there is no asynchronous device, so the forward runs on a *virtual timeline*: it occupies
the "device" from its launch for its duration, ``wait`` sleeps until the recorded time,
and the relay's own work runs on the host thread as SGLang's CPU path does (the host waits
for the publish time before a resolve, which stands for the publish -> resolve fence).
No background thread: nothing competes with the host for the GIL. Busy work would be
wrong there (it would serialize "device" and host). Host bookkeeping is a busy-wait of
calibrated cost, because real scheduler work occupies the core.

On CPU, arm B runs spec_fused's production CPU backend by default: the plain-torch
reference (``backend_for("cpu")`` without the interpreter), so B/A there compares what a
CPU server would run. ``--kernel-backend interpreter`` runs the Triton kernel in the
interpreter instead (milliseconds a launch: that proves the loop, it is not speed).
SGLang's CPU relay has no D2H copy and no real sync, so on CPU B/A shows overhead, not
what the fusion buys on a GPU.

    TRITON_INTERPRET=1 python -m bench.ab_throughput --quick     # CPU, < ~4 min
    python -m bench.ab_throughput --out /tmp/run                 # CUDA
"""

from __future__ import annotations

import argparse
import time
from dataclasses import asdict, dataclass, replace
from typing import Optional

import torch

from bench import harness  # first: sets TRITON_INTERPRET on CPU before triton is imported
from bench.overlap_model import WORKLOADS, OverlapLoop, Workload, make_timeline
from spec_fused import settings
from spec_fused.tools import measure, traces

ARMS = ("A", "B", "C")
ALGORITHMS = ("DFLASH", "EAGLE")
FULL_CONCURRENCY = (1, 8, 32, 64, 128, 256)
QUICK_CONCURRENCY = (1, 32, 128)


@dataclass
class Arm:
    name: str
    fm: object = None
    relay: object = None
    war_barrier: bool = False
    host_lengths: bool = False
    variant: str = "none"


def arm_b_env(algorithm: str, force_barrier_free: bool) -> Optional[dict]:
    """``--force-barrier-free``: what an operator who has checked their own build sets."""
    return {"SPEC_FUSED_WAR_BARRIER": "0"} if force_barrier_free and algorithm == "DFLASH" else None


def production_caps(algorithm: str, needs_cpu_seq_lens: bool, env: Optional[dict]):
    """Exactly the decision the patched scheduler and relay make for a FutureMap of
    ``algorithm`` with these backends (``relay.future_map_caps``), under ``env``."""
    from types import SimpleNamespace

    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    from spec_fused.relay import future_map_caps

    with settings.overridden(env):
        return future_map_caps(
            SimpleNamespace(
                spec_algo=SpeculativeAlgorithm[algorithm], needs_cpu_seq_lens=needs_cpu_seq_lens
            )
        )


def make_arm(name: str, algorithm: str, device: torch.device, args) -> Arm:
    """A = SGLang (its barrier: the platform gate, on CUDA); B = spec_fused, its barrier
    and host lengths the production decision; C = no relay at all, B's barrier."""
    on_cuda = device.type == "cuda"
    if name == "A":
        fm, _ = measure.arm_future_map(
            algorithm, device, args.pool, fused=False, needs_cpu_seq_lens=args.needs_cpu_seq_lens
        )
        return Arm("A", fm, None, on_cuda, args.needs_cpu_seq_lens, "sglang")
    env = arm_b_env(algorithm, args.force_barrier_free)
    caps = production_caps(algorithm, args.needs_cpu_seq_lens, env)
    barrier = on_cuda and caps.needs_war_barrier
    if name == "C":
        return Arm("C", None, None, barrier, True, "ideal")
    fm, relay = measure.arm_future_map(
        algorithm,
        device,
        args.pool,
        fused=True,
        env=env,
        needs_cpu_seq_lens=args.needs_cpu_seq_lens,
    )
    if relay.caps.needs_war_barrier != caps.needs_war_barrier:
        raise RuntimeError(f"relay caps {relay.caps} disagree with the scheduler's {caps}")
    if args.kernel_backend != "auto":
        relay.launcher.backend = args.kernel_backend
    return Arm("B", fm, relay, barrier, relay.gives_host_lengths(fm), relay.variant)


def prewarm(arm: Arm, timeline, concurrency: int, pool: int) -> None:
    """Compile the fused kernel for the block sizes this run launches (n = concurrency,
    m = concurrency .. 2 * concurrency publishes) before anything is timed."""
    if arm.relay is None:
        return
    with timeline.scope():
        gather = timeline.stage(list(range(1, concurrency + 1)))
        for m in sorted({concurrency, min(2 * concurrency, pool - 1)}):
            pub = timeline.stage(list(range(1, m + 1)))
            fwd = timeline.forward(0.0, 0.0, lambda pub=pub: arm.fm.publish(pub, pub))
            timeline.before_resolve(fwd)
            arm.fm.resolve_seq_lens_cpu(traces.decode_batch(gather, host=gather.to("cpu")))
        timeline.drain()


# --------------------------------------------------------------------------- driver


def workload_for(algorithm: str, args) -> Workload:
    fields = (
        "fwd_base_ms",
        "fwd_per_token_us",
        "publish_frac",
        "sched_base_us",
        "sched_per_req_us",
        "launch_us",
        "launch_per_req_us",
    )
    overrides = {k: getattr(args, k) for k in fields if getattr(args, k) is not None}
    return replace(WORKLOADS[algorithm], **overrides)


def run_all_arms(args, device, timeline) -> tuple:
    """Every (algorithm, concurrency, round, arm) run, arms interleaved ABCABC..."""
    from tqdm import tqdm

    runs, arm_info = [], {}
    total = len(args.algorithms) * len(args.concurrency) * args.rounds * len(ARMS)
    with tqdm(total=total, desc="ab_throughput", unit="run", dynamic_ncols=True) as bar:
        for algorithm in args.algorithms:
            wl = workload_for(algorithm, args)
            for conc in args.concurrency:
                for rnd in range(args.rounds):
                    seed = args.seed * 1_000 + rnd * 101 + conc
                    # the arms' order rotates each round (ABC, BCA, CAB): no arm always
                    # runs first after a concurrency change, or right after another
                    for name in ARMS[rnd % len(ARMS) :] + ARMS[: rnd % len(ARMS)]:
                        bar.set_postfix_str(
                            f"{algorithm} c={conc} round={rnd} arm={name}", refresh=False
                        )
                        arm = make_arm(name, algorithm, device, args)  # sets the patch state
                        prewarm(arm, timeline, conc, args.pool)
                        loop = OverlapLoop(arm, wl, timeline, conc, args.pool, seed, args.steps)
                        res = loop.run(args.steps, args.warmup_steps)
                        runs.append((algorithm, conc, rnd, name, res))
                        arm_info[(algorithm, name)] = arm
                        bar.update(1)
    measure.set_patched(False)
    return runs, arm_info


def aggregate(runs, arm_info, args, device) -> list:
    rows = []
    for algorithm in args.algorithms:
        wl = workload_for(algorithm, args)
        for conc in args.concurrency:
            for name in ARMS:
                mine = [r for a, c, _, n, r in runs if (a, c, n) == (algorithm, conc, name)]
                tps = [r.tokens_per_s for r in mine]
                steps = [s for r in mine for s in r.step_ms]
                arm = arm_info[(algorithm, name)]
                rows.append(
                    {
                        "algorithm": algorithm,
                        "concurrency": conc,
                        "arm": name,
                        "tokens_per_s": harness.median(tps),
                        "step_ms_p50": harness.percentile(steps, 50),
                        "step_ms_p99": harness.percentile(steps, 99),
                        "rounds": len(mine),
                        "tokens_per_s_min": min(tps),
                        "tokens_per_s_max": max(tps),
                        "tokens_per_s_rounds": tps,
                        "variant": arm.variant,
                        "war_barrier": arm.war_barrier,
                        "host_lengths": "exact" if arm.host_lengths else "none",
                        "forward_ms_model": wl.forward_s(conc) * 1e3,
                        "host_ms_model": wl.host_s(conc) * 1e3,
                    }
                )
    return rows


def summarize(rows: list) -> list:
    """Per algorithm and concurrency: B/A and the share of the A->C gap that B recovers
    (None when C is not faster than A by more than half the rounds' spread: a share of
    a gap that is noise is noise)."""
    out = []
    keyed = {(r["algorithm"], r["concurrency"], r["arm"]): r for r in rows}
    for algorithm, conc in dict.fromkeys((r["algorithm"], r["concurrency"]) for r in rows):
        a, b, c = (keyed[(algorithm, conc, arm)] for arm in ARMS)
        gap = c["tokens_per_s"] - a["tokens_per_s"]
        noise = (
            max(
                a["tokens_per_s_max"] - a["tokens_per_s_min"],
                c["tokens_per_s_max"] - c["tokens_per_s_min"],
            )
            / 2
        )
        within_noise = gap <= noise
        share = None if within_noise else (b["tokens_per_s"] - a["tokens_per_s"]) / gap
        ab_noise = (
            max(
                a["tokens_per_s_max"] - a["tokens_per_s_min"],
                b["tokens_per_s_max"] - b["tokens_per_s_min"],
            )
            / 2
        )
        out.append(
            {
                "algorithm": algorithm,
                "concurrency": conc,
                "A_tok_s": a["tokens_per_s"],
                "B_tok_s": b["tokens_per_s"],
                "C_tok_s": c["tokens_per_s"],
                "B_over_A": b["tokens_per_s"] / a["tokens_per_s"],
                "C_over_A": c["tokens_per_s"] / a["tokens_per_s"],
                "gap_share_recovered": share,
                "gap_within_noise": within_noise,
                "B_vs_A_within_noise": abs(b["tokens_per_s"] - a["tokens_per_s"]) <= ab_noise,
                "A_step_ms_p50": a["step_ms_p50"],
                "B_step_ms_p50": b["step_ms_p50"],
                "C_step_ms_p50": c["step_ms_p50"],
                "B_variant": b["variant"],
                "A_barrier": a["war_barrier"],
                "B_barrier": b["war_barrier"],
                "C_barrier": c["war_barrier"],
            }
        )
    return out


SUMMARY_COLUMNS = (
    "algorithm",
    "concurrency",
    "A_tok_s",
    "B_tok_s",
    "C_tok_s",
    "B_over_A",
    "C_over_A",
    "gap_share_recovered",
    "gap_within_noise",
    "B_vs_A_within_noise",
    "A_step_ms_p50",
    "B_step_ms_p50",
    "C_step_ms_p50",
    "B_variant",
    "A_barrier",
    "B_barrier",
    "C_barrier",
)


def write_markdown(path, summary: list, payload: dict, device: torch.device) -> None:
    cfg = payload["config"]
    lines = [
        f"# A/B throughput replay on {payload['device']}",
        "",
        f"SGLang {payload['versions']['sglang']}, torch {payload['versions']['torch']}, "
        f"triton {payload['versions']['triton']}, arm B kernel backend "
        f"`{cfg.get('kernel_backend', payload['versions']['kernel_backend'])}`. "
        f"Rounds: {cfg['rounds']}, steps per run: "
        f"{cfg['steps']} ({cfg['warmup_steps']} untimed). Median tokens/s over rounds.",
        "",
        "A = SGLang's FutureMap (unpatched), B = spec_fused applied, C = no relay at all. "
        "`X_barrier`: whether arm X ran the scheduler's WAR barrier (A: SGLang's platform "
        "gate; B and C: spec_fused's production decision for this configuration). "
        "`gap_share_recovered` = (B - A) / (C - A); `gap_within_noise` = the A->C gap is not "
        "larger than half the rounds' spread, and the share is left out (`-`); "
        "`B_vs_A_within_noise`: B and A differ by no more than half their rounds' spread.",
        "",
    ]
    if device.type != "cuda":
        lines += [
            "**CPU run:** the forward runs on a virtual timeline; arm B runs the backend "
            "named above (the reference is what a CPU server runs; the interpreter costs "
            "milliseconds per launch). SGLang's CPU relay has no D2H copy and no real "
            "sync to remove, so these numbers show the replay and spec_fused's host "
            "overhead, not what the fusion buys on a GPU.",
            "",
        ]
    lines += [harness.format_table(summary, SUMMARY_COLUMNS, markdown=True), ""]
    path.write_text("\n".join(lines))


def plot(summary: list, rows: list, path, device: torch.device) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    algorithms = list(dict.fromkeys(r["algorithm"] for r in rows))
    fig, axes = plt.subplots(2, len(algorithms), squeeze=False, figsize=(6.5 * len(algorithms), 8))
    note = (
        ""
        if device.type == "cuda"
        else "\nCPU: virtual forward, no D2H/sync to remove: overhead, NOT GPU speed"
    )
    for j, algorithm in enumerate(algorithms):
        series = {}
        for arm in ARMS:
            pts = sorted(
                (r["concurrency"], r["tokens_per_s"])
                for r in rows
                if r["algorithm"] == algorithm and r["arm"] == arm
            )
            series[_ARM_LABEL[arm]] = tuple(zip(*pts))
        harness.plot_lines(
            series,
            path,
            title=f"{algorithm}: tokens/s{note}",
            xlabel="concurrency",
            ylabel="accepted tokens/s",
            ax=axes[0][j],
            colors=_ARM_COLOR,
        )
        mine = sorted(
            (s for s in summary if s["algorithm"] == algorithm), key=lambda s: s["concurrency"]
        )
        xs = [s["concurrency"] for s in mine]
        harness.plot_lines(
            {
                "B/A": (xs, [s["B_over_A"] for s in mine]),
                "C/A": (xs, [s["C_over_A"] for s in mine]),
            },
            path,
            title=f"{algorithm}: throughput relative to A (SGLang){note}",
            xlabel="concurrency",
            ylabel="ratio",
            logy=False,
            ax=axes[1][j],
            colors={"B/A": _ARM_COLOR[_ARM_LABEL["B"]], "C/A": _ARM_COLOR[_ARM_LABEL["C"]]},
        )
        axes[1][j].axhline(1.0, color="grey", lw=0.8)
        ratios = [s["B_over_A"] for s in mine] + [s["C_over_A"] for s in mine]
        if ratios:  # at least +-10% around 1, so noise does not look like a result
            axes[1][j].set_ylim(min(0.9, min(ratios) - 0.02), max(1.1, max(ratios) + 0.02))
    fig.suptitle(f"spec_fused overlap-loop A/B on {harness.device_name(device)}", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


_ARM_LABEL = {"A": "A (SGLang)", "B": "B (spec_fused)", "C": "C (no relay)"}
_ARM_COLOR = {"A (SGLang)": "tab:blue", "B (spec_fused)": "tab:orange", "C (no relay)": "tab:green"}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m bench.ab_throughput",
        description="SGLang's overlap loop replayed with a synthetic forward: tokens/s of "
        "SGLang's relay (A), spec_fused (B) and no relay (C).",
        epilog="Workload flags override both algorithms' defaults (see Workload).",
    )
    harness.add_common_args(parser)
    parser.add_argument("--algorithms", nargs="+", choices=ALGORITHMS, default=list(ALGORITHMS))
    parser.add_argument("--concurrency", type=int, nargs="+")
    parser.add_argument(
        "--rounds",
        type=int,
        help="rounds per point, each running every arm once (median reported; default 6, "
        "two full rotations of the arm order)",
    )
    parser.add_argument("--steps", type=int, help="decode steps per run")
    parser.add_argument("--warmup-steps", type=int, help="untimed steps at the start of a run")
    parser.add_argument("--pool", type=int, default=4096, help="req_to_token pool size")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--force-barrier-free",
        action="store_true",
        help="arm B on DFLASH with SPEC_FUSED_WAR_BARRIER=0 (what an operator "
        "who checked their build sets): barrier_free where the step "
        "gets no exact host lengths (--needs-cpu-seq-lens 0), else "
        "war_guarded without the barrier",
    )
    parser.add_argument(
        "--kernel-backend",
        choices=("auto", "reference", "interpreter"),
        default=None,
        help="arm B's kernel backend; default: auto on CUDA, reference on CPU "
        "(what a CPU server runs; the interpreter is a test vehicle)",
    )
    parser.add_argument(
        "--needs-cpu-seq-lens",
        type=int,
        choices=(0, 1),
        default=1,
        help="FutureMap.needs_cpu_seq_lens (the attention backends' need)",
    )
    for flag in (
        "fwd-base-ms",
        "fwd-per-token-us",
        "publish-frac",
        "sched-base-us",
        "sched-per-req-us",
        "launch-us",
        "launch-per-req-us",
    ):
        parser.add_argument(f"--{flag}", type=float, default=None)
    args = parser.parse_args(argv)
    quick = args.quick
    args.concurrency = args.concurrency or list(QUICK_CONCURRENCY if quick else FULL_CONCURRENCY)
    args.rounds = args.rounds or 6
    args.steps = args.steps or (40 if quick else 100)
    args.warmup_steps = args.warmup_steps if args.warmup_steps is not None else (5 if quick else 10)
    args.needs_cpu_seq_lens = bool(args.needs_cpu_seq_lens)
    if args.kernel_backend is None:
        args.kernel_backend = "auto" if torch.cuda.is_available() else "reference"
    if args.kernel_backend == "interpreter" and torch.cuda.is_available():
        parser.error("--kernel-backend interpreter is for CPU runs")
    if args.warmup_steps >= args.steps:
        parser.error("--warmup-steps must be smaller than --steps")
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    device = harness.pick_device()
    prepared = harness.prepare_device(device)
    t0 = time.perf_counter()
    timeline = make_timeline(device)
    runs, arm_info = run_all_arms(args, device, timeline)
    rows = aggregate(runs, arm_info, args, device)
    summary = summarize(rows)
    out_dir = harness.results_dir(device, args.out)
    payload = {
        "device": harness.device_name(device),
        "versions": harness.versions(device),
        "rows": rows,
        "summary": summary,
        "mode": "cuda-streams" if device.type == "cuda" else "cpu-virtual-timeline",
        "config": {
            "quick": args.quick,
            "algorithms": args.algorithms,
            "concurrency": args.concurrency,
            "rounds": args.rounds,
            "steps": args.steps,
            "warmup_steps": args.warmup_steps,
            "pool": args.pool,
            "seed": args.seed,
            "force_barrier_free": args.force_barrier_free,
            "needs_cpu_seq_lens": args.needs_cpu_seq_lens,
            "kernel_backend": args.kernel_backend,
            "sleep_cycles_per_s": timeline.cycles_per_s,
            "workloads": {a: asdict(workload_for(a, args)) for a in args.algorithms},
            **prepared,
            "wall_s": round(time.perf_counter() - t0, 1),
        },
    }
    md_path = out_dir / "ab_throughput.md"
    write_markdown(md_path, summary, payload, device)
    tables = [
        harness.format_table(
            rows,
            (
                "algorithm",
                "concurrency",
                "arm",
                "tokens_per_s",
                "step_ms_p50",
                "step_ms_p99",
                "rounds",
                "variant",
                "war_barrier",
            ),
        ),
        harness.format_table(summary, SUMMARY_COLUMNS),
    ]
    draw = None if args.no_plot else (lambda png: plot(summary, rows, png, device))
    return harness.write_results(
        "ab_throughput",
        out_dir,
        payload,
        tables=tables,
        plot=draw,
        count=f"{len(runs)} runs",
        also=(md_path,),
    )


if __name__ == "__main__":
    main()
