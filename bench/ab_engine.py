"""A/B on the real engine: SGLang's ``sglang.Engine`` serving with dummy weights, arm A =
``SPEC_FUSED_DISABLE=1`` (SGLang as shipped), arm B = the plugin, loaded by SGLang's own
``load_plugins()`` in the scheduler process. Both arms' engines are up at once; requests
alternate between them (AB in even rounds, BA in odd ones), so the noise between paired
cells is the machine's over seconds, not an engine start.

**On a GPU** it is a throughput A/B: a Llama-3-8B-shaped target (``load_format="dummy"``,
no download) with an EAGLE-3 draft (SGLang's auto speculative parameters: top-k 4, so
FlashInfer on Hopper - host lengths read) and a DFLASH draft (FA3 on Hopper: no host
lengths), SGLang's default attention backend and CUDA graphs, no CPU stand-ins; concurrency
1 to 256, at least 4 rounds a cell after one warm-up batch per concurrency. Per cell: each
arm's tokens/s (median over rounds), B/A as the median of the rounds' paired ratios with
their min..max band - a band that excludes 1.0 is flagged, either way - and, counted in
each arm's scheduler for that cell alone, its speculative steps, relay steps, relay
backend, WAR barrier and host lengths.

**On CPU** it is a parity check on a toy model (4 layers, hidden 64) with the e2e tier's
CPU stand-ins (``tests/e2e``: ``configs.pythonpath()`` and ``SPEC_FUSED_E2E=1``) in
``.venv-sched``: identical tokens in both arms and the relay engaged on every step of B
and no step of A. It prints no throughput ratio: a CPU has nothing for the relay to save.

    python -m bench.ab_engine                       # CPU parity, or the GPU A/B on CUDA
    python -m bench.ab_engine --device cuda --dry-run   # the GPU plan, as JSON, last line
"""

from __future__ import annotations

import argparse
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
PLUGIN_DIR = Path(__file__).resolve().parent / "engine_plugin"  # the counter's entry point
ARMS = ("A", "B")
MARK = "AB_ENGINE "  # the worker's protocol lines on stdout; anything else is ignored
KEPT_MODEL_MODULES = ("llama", "llama_eagle3", "dflash")

LLAMA3_8B = dict(model_type="llama", vocab_size=128256, hidden_size=4096, head_dim=128)
LLAMA3_8B.update(intermediate_size=14336, num_hidden_layers=32, hidden_act="silu")
LLAMA3_8B.update(num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192)
LLAMA3_8B.update(rms_norm_eps=1e-5, rope_theta=500000.0, tie_word_embeddings=False)
LLAMA3_8B.update(torch_dtype="bfloat16", bos_token_id=128000, eos_token_id=128001)
TOY = dict(LLAMA3_8B, vocab_size=512, hidden_size=64, intermediate_size=128)
TOY.update(num_hidden_layers=4, num_attention_heads=2, num_key_value_heads=1, head_dim=32)
TOY.update(max_position_embeddings=2048, rope_theta=10000.0, bos_token_id=1, eos_token_id=2)
# the drafts: (architecture, extra config) per shape; SGLang's defaults where it has them
# (DFLASH's target layers: evenly spread, [1, 8, 15, 22, 29] here). CPU: tests/e2e's toys.
_EAGLE3 = "LlamaForCausalLMEagle3"
_AUX = {"eagle_aux_hidden_state_layer_ids": [0, 1, 2]}
_TOY_BLOCK = {"block_size": 4, "target_layer_ids": [1, 2], "mask_token_id": 511}
DRAFTS = {
    "gpu": {
        "eagle3": (_EAGLE3, dict(num_hidden_layers=1, draft_vocab_size=32000)),
        "dflash": ("DFlashDraftModel", dict(num_hidden_layers=5, num_target_layers=32)),
    },
    "cpu": {
        "eagle3": (_EAGLE3, dict(num_hidden_layers=1, draft_vocab_size=512, eagle_config=_AUX)),
        "dflash": ("DFlashDraftModel", dict(num_hidden_layers=1, num_target_layers=4)),
    },
}
DRAFTS["gpu"]["dflash"][1]["dflash_config"] = {"block_size": 16, "mask_token_id": 128002}
DRAFTS["cpu"]["dflash"][1]["dflash_config"] = _TOY_BLOCK
ALGORITHMS = {"eagle3": "EAGLE3", "dflash": "DFLASH"}
CPU_SPEC = {  # tests/e2e/configs.py's toy speculation
    "eagle3": dict(speculative_num_steps=2, speculative_eagle_topk=1, dtype="float32"),
    "dflash": dict(speculative_num_draft_tokens=4, dtype="bfloat16"),
}
CPU_SPEC["eagle3"]["speculative_num_draft_tokens"] = 3


def parse_args(argv=None):
    from bench import harness

    parser = argparse.ArgumentParser(
        prog="python -m bench.ab_engine", description=__doc__.split("\n\n")[0]
    )
    harness.add_common_args(parser)
    parser.add_argument("--device", choices=("cuda", "cpu"), help="default: cuda if visible")
    parser.add_argument("--dry-run", action="store_true", help="print the plan (JSON) and exit")
    parser.add_argument("--configs", nargs="+", choices=tuple(ALGORITHMS), help="the drafts")
    parser.add_argument("--concurrency", type=int, nargs="+")
    parser.add_argument("--rounds", type=int, help="GPU: 4 (at least 4); CPU: 2")
    parser.add_argument("--max-new", type=int, help="tokens per request (GPU 64, CPU 8)")
    parser.add_argument("--budget-s", type=float, help="start no new configuration after this")
    parser.add_argument("--python", help="interpreter with the engine (CPU: .venv-sched's)")
    parser.add_argument("--worker", nargs=3, metavar=("PLAN", "CONFIG", "ARM"), help="(internal)")
    return parser.parse_args(argv)


# --------------------------------------------------------------------------- the plan


def _e2e_configs():
    """The e2e tier's ``configs`` module: only ``pythonpath()`` (its CPU stand-ins) is used."""
    if str(ROOT / "tests" / "e2e") not in sys.path:
        sys.path.insert(0, str(ROOT / "tests" / "e2e"))
    import configs  # noqa: E402  (tests/e2e)

    return configs


def model_paths(shape: str) -> dict:
    root = Path(tempfile.gettempdir()) / f"spec_fused_ab_engine_{shape}"
    return {name: str(root / name) for name in ("target", *DRAFTS[shape])}


def model_configs(shape: str) -> dict:
    """Each model's config.json (the weights are SGLang's dummy loader's)."""
    base = LLAMA3_8B if shape == "gpu" else TOY
    archs = {"target": ("LlamaForCausalLM", {}), **DRAFTS[shape]}
    return {
        name: dict(base, architectures=[arch], **extra) for name, (arch, extra) in archs.items()
    }


def plan(device: str, args) -> dict:
    """Everything the run does: per arm its environment and engine arguments (common to
    every configuration), per configuration what it adds, the grid."""
    on_gpu = device == "cuda"
    shape = "gpu" if on_gpu else "cpu"
    configs = args.configs or (["eagle3", "dflash"] if on_gpu else ["eagle3"])
    concurrency = args.concurrency or ([1, 8, 32, 64, 128, 256] if on_gpu else [1, 8])
    rounds = args.rounds or (4 if on_gpu else 2)
    if on_gpu and rounds < 4:
        raise SystemExit("ab_engine: a GPU A/B needs at least 4 rounds per cell")
    max_new = args.max_new or (64 if on_gpu else 8)
    prompt = 128 if on_gpu else 12
    paths = model_paths(shape)
    common = {
        "model_path": paths["target"],
        "load_format": "dummy",
        "speculative_draft_load_format": "dummy",
        "skip_tokenizer_init": True,
        "max_running_requests": max(concurrency),
        # fixed, so both arms get the same pools whichever engine started first
        "max_total_tokens": max(4096, max(concurrency) * (prompt + max_new + 64)),
        "disable_radix_cache": True,  # every round does the same prefill work
        "random_seed": 0,
        "log_level": "warning",
    }
    env = {"PYTHONPATH": os.pathsep.join([str(PLUGIN_DIR), str(ROOT)])}
    if on_gpu:  # SGLang's defaults otherwise: attention backends, CUDA graphs on
        common.update(dtype="bfloat16", disable_cuda_graph=False)
        common["cuda_graph_max_bs_decode"] = max(concurrency)  # every batch served graphed
    else:  # the e2e tier's CPU engine (tests/e2e/configs.py engine_kwargs)
        common.update(
            device="cpu",
            attention_backend="triton",
            sampling_backend="pytorch",
            disable_cuda_graph=True,
            page_size=1,
            context_length=512,
            chunked_prefill_size=256,
            triton_attention_num_kv_splits=1,
        )
        env.update(
            PYTHONPATH=_e2e_configs().pythonpath(PLUGIN_DIR, ROOT),
            SPEC_FUSED_E2E="1",  # the e2e plugin's CPU stand-ins (tests/e2e/site)
            AB_ENGINE_HOST_LENGTHS="1",  # the triton backend reads host lengths (both arms)
            SGLANG_USE_CPU_ENGINE="1",
            TRITON_INTERPRET="1",  # SGLang needs it for one kernel on CPU
            SPEC_FUSED_FORCE_REFERENCE="1",  # the relay's CPU server backend
            OMP_NUM_THREADS="1",
        )
    per_config = {}
    for name in configs:
        extra = {
            "speculative_algorithm": ALGORITHMS[name],
            "speculative_draft_model_path": paths[name],
        }
        if not on_gpu:  # small fixed speculation; DFLASH's draft runs in bfloat16
            extra.update(CPU_SPEC[name], speculative_draft_attention_backend="triton")
        per_config[name] = extra
    return {
        "device": device,
        "mode": "throughput A/B" if on_gpu else "parity check (CPU, toy model)",
        "arms": {
            "A": {"env": dict(env, SPEC_FUSED_DISABLE="1"), "engine_kwargs": common},
            "B": {"env": env, "engine_kwargs": common},
        },
        "configs": per_config,  # an arm's engine for config c: engine_kwargs | configs[c]
        "models": {
            "shape": "Llama-3-8B" if on_gpu else "toy Llama",
            "paths": paths,
            "configs": model_configs(shape),
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


# --------------------------------------------------------------------------- in the scheduler

STATS = {"steps": 0, "host_length_steps": 0, "relay_steps": 0, "backend": None, "variant": None}
_LIVE: list = []  # [relay_for] in arm B, [] in arm A: decided at the first step


def register_counter() -> None:
    """The counter, an SGLang plugin (``bench/engine_plugin``'s entry point): in each
    scheduler process it counts speculative steps (FutureMap resolves with future indices),
    those that handed the batch host lengths and those a live spec_fused relay served, and
    adds them, with the scheduler's WAR barrier, to ``get_internal_state``'s answer."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    if os.environ.get("AB_ENGINE_HOST_LENGTHS") == "1":
        from sglang.srt.layers.attention import triton_backend as tb

        for cls in (tb.TritonAttnBackend, tb.TritonMultiStepDraftBackend):
            cls.needs_cpu_seq_lens = True
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
    """One engine for one arm, kept alive: serves ``N`` requests at once per stdin line."""
    import pkgutil

    the_plan = json.loads(Path(plan_path).read_text())
    kwargs = dict(the_plan["arms"][arm]["engine_kwargs"], **the_plan["configs"][name])
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

    say({"ready_s": time.perf_counter() - t0, "counter": bool(counts())})
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
        env = {
            k: v for k, v in os.environ.items() if k not in ("SGLANG_PLUGINS", "SPEC_FUSED_DISABLE")
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
            raise RuntimeError(f"ab_engine: no counter in {self.name} {self.arm} ({PLUGIN_DIR})")
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
                and s["B_relay_steps"].split("/")[0] == s["B_relay_steps"].split("/")[1] != "0"
            )
        out.append(s)
    return out


GPU_COLUMNS = tuple(
    "config concurrency A_tok_s B_tok_s B_over_A band_lo band_hi verdict A_step_ms B_step_ms "
    "A_relay_steps B_relay_steps B_backend A_barrier B_barrier A_host_lengths B_host_lengths "
    "same_tokens".split()
)
CPU_COLUMNS = tuple(
    "config concurrency rounds same_tokens A_relay_steps B_relay_steps B_backend A_barrier "
    "B_barrier A_host_lengths B_host_lengths parity".split()
)
CPU_LINE = (
    "ab_engine on CPU is a parity check on a toy model (tokens and relay counts per cell), "
    "not a throughput result: a CPU has nothing for the relay to save"
)


def probe(python: str, env: dict, on_gpu: bool):
    """Why the engine cannot run from ``python`` here, or None (found, not imported: fast)."""
    mods = ["sgl_kernel", "flashinfer"] if on_gpu else []
    code = "import importlib.util as u, importlib.metadata as m\n"
    code += f"for mod in {mods + ['sglang.srt.entrypoints.engine']}:\n"
    code += "    assert u.find_spec(mod), f'no module {mod!r}'\n"
    code += "assert 'spec_fused' in m.entry_points(group='sglang.srt.plugins').names, "
    code += "'spec_fused is not pip-installed there: load_plugins() would not load it'"
    env = dict(os.environ, PYTHONPATH=env["PYTHONPATH"])
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
    why = probe(python, the_plan["arms"]["B"]["env"], on_gpu)
    if why is not None:
        hint = "install SGLang with its GPU kernels" if on_gpu else "run scripts/setup_e2e_tier.sh"
        print(f"ab_engine: skipped: {python} cannot run SGLang's engine here ({why}); {hint}")
        return {}
    if not on_gpu:
        print(CPU_LINE)
    for name, config in the_plan["models"]["configs"].items():
        path = Path(the_plan["models"]["paths"][name])
        path.mkdir(parents=True, exist_ok=True)
        (path / "config.json").write_text(json.dumps(config, indent=1))
    plan_file = tempfile.NamedTemporaryFile("w", suffix=".json", delete=False)
    plan_file.write(json.dumps(the_plan))
    plan_file.close()
    out_dir = harness.results_dir(torch.device(device), args.out)
    t0 = last = time.perf_counter()
    rows, skipped, starts, took = [], [], {}, 0.0
    for name in the_plan["configs"]:
        if args.budget_s and time.perf_counter() - t0 + took > args.budget_s:
            skipped.append(name)  # the last configuration's time would overrun the budget
            print(f"ab_engine: {name} skipped: --budget-s {args.budget_s:.0f} would be overrun")
            continue
        workers = {}
        try:
            for arm in ARMS:  # GPU: one after the other, the second sizes itself beside
                env = the_plan["arms"][arm]["env"]  # the first; CPU: both at once
                workers[arm] = Worker(python, plan_file.name, name, arm, env)
                if on_gpu:
                    starts[f"{name} {arm}"] = workers[arm].wait_ready()
            for arm in ARMS if not on_gpu else ():
                starts[f"{name} {arm}"] = workers[arm].wait_ready()
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
    os.unlink(plan_file.name)
    summary = summarize(rows, on_gpu)
    payload = {
        "benchmark": "ab_engine",
        "device": harness.device_name(torch.device(device)),
        "versions": harness.versions(torch.device(device)),
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
