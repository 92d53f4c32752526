"""A/B on the real engine: SGLang's ``sglang.Engine`` serving with dummy weights, arm A =
``SPEC_FUSED_DISABLE=1`` (SGLang as shipped), arm B = the plugin, loaded by SGLang's own
``load_plugins()`` in the scheduler process. Both arms' engines are up at once; requests
alternate between them (AB in even rounds, BA in odd ones), so the noise between paired
cells is the machine's over seconds, not an engine start.

**On a GPU** a throughput A/B sized for the lent GPU image (SGLang 0.5.17 from
``bench/engine_carry.sh``: no FlashInfer, no FA3): a Llama-3.2-1B-shaped target with dummy
weights (no download), SGLang's triton attention backend, CUDA graphs, concurrency 1 to 256,
at least 4 rounds a cell after a warm-up batch. One configuration per relay path: NGRAM
(host lengths read; spec_fused relays exact host lengths on CUDA only with
``SPEC_FUSED_UNMEASURED=1``, ``spec_fused/measured.py``: set in both arms, inert in A) and
EAGLE with a one-layer draft (GPU-only: triton opts out of host lengths). Per cell: each
arm's tokens/s (median), B/A as the median of the rounds' paired ratios with their min..max
band (flagged when it excludes 1.0, either way), whether B relayed, and per arm the steps,
relay steps, relay backend, WAR barrier and host lengths its scheduler counted in the cell.

**On CPU** a parity check on tests/e2e's toy model (NGRAM by default) with the e2e tier's
stand-ins in ``.venv-sched``: identical tokens in both arms, the relay on every step of B
and on none of A. No throughput ratio: a CPU has nothing for the relay to save.

Results hold versions (the driver's and the engines'), no local path: the plan names its
PYTHONPATH relative to the repository and its models by name.

    python -m bench.ab_engine                       # CPU parity, or the GPU A/B on CUDA
    python -m bench.ab_engine --device cuda --dry-run   # the GPU plan, as JSON, last line
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ARMS = ("A", "B")
MARK = "AB_ENGINE "  # the worker's protocol lines on stdout; anything else is ignored
KEPT_MODEL_MODULES = ("llama", "llama_eagle")
ENGINE_PACKAGES = ("sglang", "sglang-kernel", "flashinfer", "torch", "triton", "transformers")
# PYTHONPATH of an engine, relative to the repository (then the caller's): the counter's
# entry point (bench/engine_plugin), the repository; on CPU first the e2e tier's stand-ins
PYTHONPATH = {
    "cuda": ["bench/engine_plugin", "."],
    "cpu": ["tests/e2e/site", "tests/standins", "bench/engine_plugin", "."],
}
# the target and the draft, by name (written into the run's folder): a Llama-3.2-1B shape
# on a GPU, tests/e2e/models.py's toys on CPU
LLAMA_1B = dict(model_type="llama", vocab_size=128256, hidden_size=2048, head_dim=64)
LLAMA_1B.update(intermediate_size=8192, hidden_act="silu", rms_norm_eps=1e-5)
LLAMA_1B.update(num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192)
LLAMA_1B.update(rope_theta=500000.0, tie_word_embeddings=True, torch_dtype="bfloat16")
LLAMA_1B.update(bos_token_id=128000, eos_token_id=128001)
MODELS = {"target": ("LlamaForCausalLM", 16, 4), "eagle": ("LlamaForCausalLMEagle", 1, 1)}
# the configurations, each added to both arms: a chain of 4 draft tokens; NGRAM's exact host
# lengths are relayed on CUDA only with SPEC_FUSED_UNMEASURED=1 (inert in A)
_EAGLE = dict(speculative_algorithm="EAGLE", speculative_num_steps=3, speculative_eagle_topk=1)
_EAGLE.update(speculative_draft_model_path="eagle", speculative_draft_load_format="dummy")
_EAGLE.update(speculative_draft_attention_backend="triton", speculative_num_draft_tokens=4)
_NGRAM = dict(speculative_algorithm="NGRAM", speculative_num_draft_tokens=4)
_NGRAM["speculative_ngram_max_bfs_breadth"] = 1
CONFIGS = {
    "ngram": {"engine_kwargs": _NGRAM, "env": {"SPEC_FUSED_UNMEASURED": "1"}},
    "eagle": {"engine_kwargs": _EAGLE, "env": {}},
}


def parse_args(argv=None):
    from bench import harness

    parser = argparse.ArgumentParser(
        prog="python -m bench.ab_engine", description=__doc__.split("\n\n")[0]
    )
    harness.add_common_args(parser)
    parser.add_argument("--device", choices=("cuda", "cpu"), help="default: cuda if visible")
    parser.add_argument("--dry-run", action="store_true", help="print the plan (JSON) and exit")
    parser.add_argument(
        "--configs", nargs="+", choices=tuple(CONFIGS), help="GPU: both; CPU: ngram"
    )
    parser.add_argument("--concurrency", type=int, nargs="+")
    parser.add_argument("--rounds", type=int, help="GPU: 4 (at least 4); CPU: 2")
    parser.add_argument("--max-new", type=int, help="tokens per request (GPU 64, CPU 8)")
    parser.add_argument("--budget-s", type=float, help="start no new configuration after this")
    parser.add_argument("--python", help="interpreter with the engine (CPU: .venv-sched's)")
    parser.add_argument("--worker", nargs=3, metavar=("PLAN", "CONFIG", "ARM"), help="(internal)")
    return parser.parse_args(argv)


# --------------------------------------------------------------------------- the plan


def model_configs(on_gpu: bool) -> dict:
    """Each model's config.json (the weights are SGLang's dummy loader's)."""
    if not on_gpu and str(ROOT / "tests" / "e2e") not in sys.path:
        sys.path.insert(0, str(ROOT / "tests" / "e2e"))
    if not on_gpu:
        import models  # the e2e tier's toys (tests/e2e/models.py)
    base = LLAMA_1B if on_gpu else models.BASE
    return {
        name: dict(base, architectures=[arch], num_hidden_layers=gpu if on_gpu else cpu)
        for name, (arch, gpu, cpu) in MODELS.items()
    }


def plan(device: str, args) -> dict:
    """Everything the run does: per arm its environment and engine arguments (common to
    every configuration), per configuration what it adds to both arms, the grid."""
    on_gpu = device == "cuda"
    configs = args.configs or (list(CONFIGS) if on_gpu else ["ngram"])
    concurrency = args.concurrency or ([1, 16, 64, 256] if on_gpu else [1, 8])
    rounds = args.rounds or (4 if on_gpu else 2)
    if on_gpu and rounds < 4:
        raise SystemExit("ab_engine: a GPU A/B needs at least 4 rounds per cell")
    max_new = args.max_new or (64 if on_gpu else 8)
    prompt = 128 if on_gpu else 12
    common = {
        "model_path": "target",  # a name: the run's folder holds it
        "load_format": "dummy",
        "skip_tokenizer_init": True,
        "attention_backend": "triton",
        "sampling_backend": "pytorch",
        "max_running_requests": max(concurrency),
        # fixed, so both arms get the same pools whichever engine started first
        "max_total_tokens": max(4096, max(concurrency) * (prompt + max_new + 64)),
        "disable_radix_cache": True,  # every round does the same prefill work
        "random_seed": 0,
        "log_level": "warning",
    }
    env: dict = {}
    if on_gpu:  # CUDA graphs for the decode steps (the relay's) at the grid's batch sizes,
        # none for prefill: a short start-up
        common.update(dtype="bfloat16", disable_cuda_graph=False, cuda_graph_bs_decode=concurrency)
        common["disable_prefill_cuda_graph"] = True
    else:  # the e2e tier's CPU engine (tests/e2e/configs.py engine_kwargs)
        common.update(
            device="cpu",
            dtype="float32",
            disable_cuda_graph=True,
            page_size=1,
            context_length=512,
            chunked_prefill_size=256,
            triton_attention_num_kv_splits=1,
        )
        env.update(
            SPEC_FUSED_E2E="1",  # the e2e plugin's CPU stand-ins (tests/e2e/site)
            SGLANG_USE_CPU_ENGINE="1",
            TRITON_INTERPRET="1",  # SGLang needs it for one kernel on CPU
            SPEC_FUSED_FORCE_REFERENCE="1",  # the relay's CPU server backend
            OMP_NUM_THREADS="1",
        )
    return {
        "device": device,
        "mode": "throughput A/B" if on_gpu else "parity check (CPU, toy model)",
        "pythonpath": PYTHONPATH[device],
        "arms": {
            "A": {"env": dict(env, SPEC_FUSED_DISABLE="1"), "engine_kwargs": common},
            "B": {"env": env, "engine_kwargs": common},
        },
        # an arm's engine for config c: its engine_kwargs | c's, its env | c's
        "configs": {name: CONFIGS[name] for name in configs},
        "models": {
            "shape": "Llama-3.2-1B" if on_gpu else "toy Llama",
            "configs": model_configs(on_gpu),
        },
        "concurrency": concurrency,
        "rounds": rounds,
        "warmup": "one unrecorded batch per arm at each concurrency before round 0"
        if on_gpu
        else None,  # parity needs no warm-up
        "order": "AB in even rounds, BA in odd rounds, at each concurrency",
        "max_new_tokens": max_new,
        "prompt_tokens": prompt,
        "kept_model_modules": list(KEPT_MODEL_MODULES),
        "budget_s": args.budget_s,
    }


def arm_env(the_plan: dict, name: str, arm: str) -> dict:
    """What an arm's engine for configuration ``name`` adds to the caller's environment."""
    paths = [str(ROOT / p) for p in the_plan["pythonpath"]]
    paths += [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env = dict(the_plan["configs"][name]["env"], **the_plan["arms"][arm]["env"])
    return dict(env, PYTHONPATH=os.pathsep.join(paths))


# --------------------------------------------------------------------------- in the scheduler

STATS = {"steps": 0, "host_length_steps": 0, "relay_steps": 0, "backend": None, "variant": None}
_LIVE: list = []  # [relay_for] in arm B, [] in arm A: decided at the first step


def register_counter() -> None:
    """The counter, an SGLang plugin (``bench/engine_plugin``'s entry point): in each
    scheduler process it counts speculative steps (FutureMap resolves with future indices),
    those that handed the batch host lengths and those a live spec_fused relay served, and
    adds them, with the scheduler's WAR barrier, to ``get_internal_state``'s answer."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    fm, sched = "sglang.srt.managers.overlap_utils.FutureMap", "sglang.srt.managers.scheduler"
    HookRegistry.register(f"{fm}.resolve_seq_lens_cpu", _count_step, HookType.AROUND)
    HookRegistry.register(f"{sched}.Scheduler.get_internal_state", _report, HookType.AROUND)


def _count_step(original, self, batch, *args, **kwargs):
    out = original(self, batch, *args, **kwargs)
    if getattr(getattr(batch, "spec_info", None), "future_indices", None) is None:
        return out
    if not STATS["steps"]:
        from spec_fused.integration import sglang_patch
        from spec_fused.relay import relay_for

        _LIVE[:] = [relay_for] if sglang_patch.is_applied() else []
    STATS["steps"] += 1
    STATS["host_length_steps"] += getattr(batch, "seq_lens_cpu", None) is not None
    relay = _LIVE[0](self) if _LIVE else None
    if relay is not None:
        STATS["relay_steps"] += 1
        STATS["backend"] = relay.launcher.backend
        STATS["variant"] = getattr(relay, "variant", None)
    return out


def _report(original, self, *args, **kwargs):
    out = original(self, *args, **kwargs)
    war = bool(getattr(self, "_war_barrier_enabled", False))
    out.internal_state["ab_engine"] = dict(STATS, war_barrier=war)
    return out


# --------------------------------------------------------------------------- the worker


def _requests(n: int, max_new: int, prompt: int, vocab: int):
    import random

    rng = random.Random(n)
    ids = [[rng.randrange(3, vocab - 3) for _ in range(prompt + i % 9)] for i in range(n)]
    return ids, [{"temperature": 0.0, "max_new_tokens": max_new, "ignore_eos": True}] * n


def worker(plan_path: str, name: str, arm: str) -> None:
    """One engine for one arm, kept alive: serves ``N`` requests at once per stdin line.
    Its models are named in the plan and live in the plan file's folder."""
    import importlib.metadata
    import pkgutil

    the_plan = json.loads(Path(plan_path).read_text())
    kwargs = dict(the_plan["arms"][arm]["engine_kwargs"])
    kwargs.update(the_plan["configs"][name]["engine_kwargs"])
    for key in ("model_path", "speculative_draft_model_path"):
        if key in kwargs:
            kwargs[key] = str(Path(plan_path).parent / kwargs[key])
    import sglang
    import sglang.srt.models as models

    os.environ["SGLANG_DISABLED_MODEL_ARCHS"] = ",".join(
        m.name for m in pkgutil.iter_modules(models.__path__) if m.name not in KEPT_MODEL_MODULES
    )
    vocab = json.loads((Path(kwargs["model_path"]) / "config.json").read_text())["vocab_size"]

    def say(payload):
        print(MARK + json.dumps(payload), flush=True)

    t0 = time.perf_counter()
    engine = sglang.Engine(**kwargs)

    def counts():
        return engine.get_server_info()["internal_states"][0].get("ab_engine") or {}

    versions = {}
    for package in ENGINE_PACKAGES:  # the first on sys.path, as an import finds it
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            versions[package] = importlib.metadata.version(package)
    say({"ready_s": time.perf_counter() - t0, "counter": bool(counts()), "versions": versions})
    try:
        for line in sys.stdin:
            if line.strip() == "quit":
                break
            conc = int(line)
            ids, params = _requests(
                conc, the_plan["max_new_tokens"], the_plan["prompt_tokens"], vocab
            )
            before = counts()
            t0 = time.perf_counter()
            outs = engine.generate(input_ids=ids, sampling_params=params)
            wall = time.perf_counter() - t0
            after = counts()
            tokens = [o["output_ids"] for o in outs]
            row = {
                k: after[k] - before.get(k, 0)
                for k in ("steps", "host_length_steps", "relay_steps")
            }
            row.update(
                concurrency=conc,
                tokens=sum(map(len, tokens)),
                wall_s=wall,
                tokens_per_s=sum(map(len, tokens)) / wall,
                step_ms=wall / max(row["steps"], 1) * 1e3,
                digest=hashlib.sha1(json.dumps(tokens).encode()).hexdigest()[:12],
                war_barrier=after["war_barrier"],
                backend=after["backend"],
                variant=after["variant"],
            )
            say(row)
    finally:
        engine.shutdown()


# --------------------------------------------------------------------------- the driver


class Worker:
    """A worker process (one engine, one arm) and its protocol."""

    def __init__(self, python: str, plan_path: str, name: str, arm: str, env: dict):
        self.name, self.arm = name, arm
        self.log = tempfile.NamedTemporaryFile(
            prefix=f"ab_engine_{arm}_", suffix=".log", delete=False
        )
        cmd = [python, "-m", "bench.ab_engine", "--worker", plan_path, name, arm]
        # the caller's environment less whatever could change an arm, then the arm's
        env = {
            k: v
            for k, v in os.environ.items()
            if k != "SGLANG_PLUGINS" and not k.startswith("SPEC_FUSED_")
        } | env
        self.proc = subprocess.Popen(
            cmd,
            env=env,
            cwd=ROOT,
            text=True,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
        )
        self.ready: dict = {}

    def wait_ready(self) -> float:
        self.ready = self.read()
        if not self.ready["counter"]:
            raise RuntimeError(f"ab_engine: no counter in {self.name} {self.arm} (engine_plugin)")
        return round(self.ready["ready_s"], 1)

    def read(self) -> dict:
        for line in self.proc.stdout:
            if line.startswith(MARK):
                return json.loads(line[len(MARK) :])
        self.proc.wait()
        tail = Path(self.log.name).read_text().splitlines()
        tail = "\n".join(x for x in tail if "Ignore import error" not in x)[-3000:]
        raise RuntimeError(
            f"ab_engine worker {self.name} {self.arm} died (rc {self.proc.returncode}):\n{tail}"
        )

    def serve(self, conc: int) -> dict:
        self.proc.stdin.write(f"{conc}\n")
        self.proc.stdin.flush()
        return self.read()

    def close(self) -> None:
        """Ask the engine to shut down; :meth:`wait` for it."""
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write("quit\n")
                self.proc.stdin.flush()
            except BrokenPipeError:
                pass

    def wait(self) -> None:
        try:
            self.proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.unlink(self.log.name)


def _band(lo: float, hi: float) -> str:
    if lo > 1.0:
        return "B faster in every round"
    if hi < 1.0:
        return "B slower in every round"
    return "band includes 1.0"


def summarize(rows: list, on_gpu: bool) -> list:
    """Per configuration and concurrency: both arms' counts over the cell's rounds, whether
    their tokens matched round by round, and on a GPU the throughput and paired B/A."""
    out = []
    for name, conc in dict.fromkeys((r["config"], r["concurrency"]) for r in rows):
        cell = {
            arm: {
                r["round"]: r
                for r in rows
                if (r["config"], r["concurrency"], r["arm"]) == (name, conc, arm)
            }
            for arm in ARMS
        }
        rounds = sorted(set(cell["A"]) & set(cell["B"]))
        s = {"config": name, "concurrency": conc, "rounds": len(rounds)}
        s["same_tokens"] = (
            f"{sum(cell['A'][r]['digest'] == cell['B'][r]['digest'] for r in rounds)}/{len(rounds)}"
        )
        for arm in ARMS:
            mine = [cell[arm][r] for r in rounds]
            steps = sum(r["steps"] for r in mine)
            s[f"{arm}_relay_steps"] = f"{sum(r['relay_steps'] for r in mine)}/{steps}"
            host = sum(r["host_length_steps"] for r in mine)
            s[f"{arm}_host_lengths"] = (
                "exact" if host == steps and steps else "none" if not host else f"{host}/{steps}"
            )
            s[f"{arm}_relayed"] = steps > 0 and sum(r["relay_steps"] for r in mine) == steps
            s[f"{arm}_barrier"] = "on" if mine[-1]["war_barrier"] else "off"
            s[f"{arm}_backend"] = mine[-1]["backend"] or "sglang"
            if on_gpu:
                s[f"{arm}_tok_s"] = statistics.median(r["tokens_per_s"] for r in mine)
                s[f"{arm}_step_ms"] = statistics.median(r["step_ms"] for r in mine)
        if on_gpu:
            paired = [cell["B"][r]["tokens_per_s"] / cell["A"][r]["tokens_per_s"] for r in rounds]
            s.update(B_over_A=statistics.median(paired), band_lo=min(paired), band_hi=max(paired))
            s["verdict"] = _band(s["band_lo"], s["band_hi"])
        else:
            s["parity"] = (
                s["same_tokens"] == f"{len(rounds)}/{len(rounds)}"
                and s["A_relay_steps"].startswith("0/")
                and s["B_relayed"]
            )
        out.append(s)
    return out


GPU_COLUMNS = tuple(
    "config concurrency A_tok_s B_tok_s B_over_A band_lo band_hi verdict A_step_ms B_step_ms "
    "B_relayed A_relay_steps B_relay_steps B_backend A_barrier B_barrier A_host_lengths "
    "B_host_lengths same_tokens".split()
)
CPU_COLUMNS = tuple(
    "config concurrency rounds same_tokens A_relay_steps B_relay_steps B_backend A_barrier "
    "B_barrier A_host_lengths B_host_lengths parity".split()
)
CPU_LINE = (
    "ab_engine on CPU is a parity check on a toy model (tokens and relay counts per cell), "
    "not a throughput result: a CPU has nothing for the relay to save"
)


def probe(python: str, pythonpath: str, on_gpu: bool):
    """Why the engine cannot run from ``python`` here, or None (found, not imported: fast)."""
    mods = ["sgl_kernel", "flashinfer"] if on_gpu else []
    code = "import importlib.util as u, importlib.metadata as m\n"
    code += f"for mod in {mods + ['sglang.srt.entrypoints.engine']}:\n"
    code += "    assert u.find_spec(mod), f'no module {mod!r}'\n"
    code += "assert 'spec_fused' in m.entry_points(group='sglang.srt.plugins').names, "
    code += "'no spec_fused entry point there: load_plugins() would not load it'"
    env = dict(os.environ, PYTHONPATH=pythonpath)
    done = subprocess.run([python, "-c", code], capture_output=True, text=True, env=env)
    lines = done.stderr.strip().splitlines()
    return None if done.returncode == 0 else (lines[-1] if lines else f"rc {done.returncode}")


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.worker:
        worker(*args.worker)
        return {}
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    on_gpu = device == "cuda"
    the_plan = plan(device, args)
    if args.dry_run:
        print(json.dumps(the_plan, sort_keys=True))
        return the_plan
    from bench import harness

    sched = ROOT / ".venv-sched" / "bin" / "python"
    python = args.python or (str(sched) if not on_gpu and sched.exists() else sys.executable)
    first = next(iter(the_plan["configs"]))
    why = probe(python, arm_env(the_plan, first, "B")["PYTHONPATH"], on_gpu)
    if why is not None:
        hint = "install SGLang with its GPU kernels (or bench/engine_spike.md's carry)"
        hint = hint if on_gpu else "run scripts/setup_e2e_tier.sh"
        print(f"ab_engine: skipped: {python} cannot run SGLang's engine here ({why}); {hint}")
        return {}
    if not on_gpu:
        print(CPU_LINE)
    run_dir = tempfile.TemporaryDirectory(prefix="ab_engine_")  # the plan and the models
    plan_path = Path(run_dir.name) / "plan.json"
    plan_path.write_text(json.dumps(the_plan))
    for name, config in the_plan["models"]["configs"].items():
        (Path(run_dir.name) / name).mkdir()
        (Path(run_dir.name) / name / "config.json").write_text(json.dumps(config, indent=1))
    out_dir = harness.results_dir(torch.device(device), args.out)
    t0 = last = time.perf_counter()
    rows, skipped, starts, took, engine_versions = [], [], {}, 0.0, {}
    for name in the_plan["configs"]:
        if args.budget_s and time.perf_counter() - t0 + took > args.budget_s:
            skipped.append(name)  # the last configuration's time would overrun the budget
            print(f"ab_engine: {name} skipped: --budget-s {args.budget_s:.0f} would be overrun")
            continue
        workers = {}
        try:
            for arm in ARMS:  # GPU: one after the other, the second sizes itself beside
                env = arm_env(the_plan, name, arm)  # the first; CPU: both at once
                workers[arm] = Worker(python, str(plan_path), name, arm, env)
                if on_gpu:
                    starts[f"{name} {arm}"] = workers[arm].wait_ready()
            for arm in ARMS if not on_gpu else ():
                starts[f"{name} {arm}"] = workers[arm].wait_ready()
            engine_versions = workers["B"].ready["versions"]  # one interpreter for both arms
            for conc in the_plan["concurrency"] if the_plan["warmup"] else ():  # warm-up
                for arm in ARMS:
                    workers[arm].serve(conc)
            for rnd in range(the_plan["rounds"]):
                for conc in the_plan["concurrency"]:
                    for arm in ARMS if rnd % 2 == 0 else ARMS[::-1]:
                        rows.append(dict(workers[arm].serve(conc), config=name, arm=arm, round=rnd))
                print(f"ab_engine: {name} round {rnd + 1}/{the_plan['rounds']} done", flush=True)
        finally:
            for w in workers.values():
                w.close()
            for w in workers.values():
                w.wait()
        took, last = time.perf_counter() - last, time.perf_counter()
        partial = {"plan": the_plan, "runs": rows, "partial": True}  # kept if a timeout hits
        harness.write_json(out_dir / "ab_engine.json", partial)
    run_dir.cleanup()
    summary = summarize(rows, on_gpu)
    payload = {
        "benchmark": "ab_engine",
        "device": harness.device_name(torch.device(device)),
        "versions": harness.versions(torch.device(device)),  # the driver's
        "engine_versions": engine_versions,  # what the engines imported
        "plan": the_plan,
        "config": {
            "wall_s": round(time.perf_counter() - t0, 1),
            "start_s": starts,
            "skipped": skipped,
        },
        "runs": rows,
        "summary": summary,
    }
    columns = GPU_COLUMNS if on_gpu else CPU_COLUMNS
    head = (
        f"{the_plan['mode']}: {the_plan['models']['shape']}, dummy weights, "
        f"{the_plan['rounds']} rounds x {the_plan['max_new_tokens']} tokens per request"
    )
    if on_gpu:
        head += "; B/A = median of the rounds' paired ratios, band = their min..max"
    md = out_dir / "ab_engine.md"
    table = harness.format_table(summary, columns, markdown=True)
    md.write_text(f"# ab_engine ({payload['device']})\n\n{head}\n\n{table}\n")

    def plot(path):
        series = {
            f"{name} {arm}": (
                [s["concurrency"] for s in summary if s["config"] == name],
                [s[f"{arm}_tok_s"] for s in summary if s["config"] == name],
            )
            for name in the_plan["configs"]
            for arm in ARMS
        }
        harness.plot_lines(
            series,
            path,
            title=f"ab_engine, {payload['device']}",
            xlabel="concurrency",
            ylabel="tokens/s",
        )

    result = harness.write_results(
        "ab_engine",
        out_dir,
        payload,
        tables=[head, harness.format_table(summary, columns)] + ([] if on_gpu else [CPU_LINE]),
        plot=None if args.no_plot or not on_gpu or not rows else plot,
        count=f"{len(the_plan['configs']) * 2} engines, {len(rows)} cells served",
        also=[md],
    )
    if not on_gpu and not all(s["parity"] for s in summary):
        raise SystemExit(
            "ab_engine: PARITY FAILED on CPU (see the table): tokens or relay counts differ"
        )
    return result


if __name__ == "__main__":
    main()
