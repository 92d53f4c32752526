"""The e2e tier's configurations, engine arguments, requests and engine environment."""

from __future__ import annotations

import os
import random
from dataclasses import dataclass, field
from pathlib import Path

import models

HERE = Path(__file__).resolve().parent
# What the engine needs on a CPU, test tiers only: tests/e2e/site (sgl_kernel stand-ins, the
# e2e plugin) and tests/standins (torchvision). Each says why in its docstring.
STANDIN_PATHS = (HERE / "site", HERE.parent / "standins")

# What an engine process keeps of the caller's environment: nothing that could change an
# arm (no SPEC_FUSED_*, SGLANG_*, TRITON_*, TORCH*, PYTHONPATH, CUDA_*, OMP_*). What each
# arm needs is set explicitly (engine_env, serve.arm_env).
KEPT_ENV = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR")


def pythonpath(*extra: Path) -> str:
    """PYTHONPATH for an engine process on CPU outside the tier (bench/ab_engine.py): the
    stand-ins, ``extra``, then the caller's."""
    inherited = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return os.pathsep.join([str(p) for p in (*STANDIN_PATHS, *extra)] + inherited)


def engine_env(threads: str = "1") -> dict:
    """The environment of an engine process, built from scratch."""
    env = {key: os.environ[key] for key in KEPT_ENV if key in os.environ}
    env.update(
        PYTHONPATH=os.pathsep.join(str(p) for p in STANDIN_PATHS),
        SGLANG_USE_CPU_ENGINE="1",
        TRITON_INTERPRET="1",  # the fused kernel runs in Triton's interpreter on CPU
        # SGLang's @torch.compile'd helpers compile for seconds per rank: off in both arms
        TORCHDYNAMO_DISABLE="1",
        # one torch thread per process: tiny ops, and the tier's engines share the cores
        OMP_NUM_THREADS=threads,
    )
    return env


@dataclass(frozen=True)
class Config:
    algorithm: str
    draft: str | None  # a models.MODELS name
    host_lengths: bool  # an attention backend reads host lengths (else every one opts out)
    spec: dict = field(default_factory=dict)
    dtype: str = "float32"
    target: str = "target"  # a models.MODELS name
    tp: int = 1  # tensor-parallel ranks (CPU: gloo)
    serving: bool = False  # serving sizes (SERVING) rather than SMALL

    @property
    def sizes(self) -> Sizes:
        return SERVING if self.serving else SMALL


@dataclass(frozen=True)
class Sizes:
    """How much a configuration serves: ``requests`` greedy requests, prompts of
    ``prompt_lens`` tokens (cycled), outputs of up to ``max_new`` tokens, ``running`` at once."""

    requests: int
    prompt_lens: tuple
    max_new: int
    running: int
    max_total_tokens: int
    context_length: int
    chunked_prefill: int


# Every sequence stays under ~40 tokens, at most 4 running: requests finish at different
# steps and queued ones are admitted mid-decode.
SMALL = Sizes(
    requests=16,
    prompt_lens=tuple(7 + (i * 7) % 23 for i in range(16)),
    max_new=10,
    running=4,
    max_total_tokens=4096,
    context_length=512,
    chunked_prefill=256,
)
# Sizes that look like serving: 24 requests all running at once, prompts of a few hundred
# tokens (chunked), and a few short ones whose lengths cross 41..47 while they decode (the
# range the kernel_41_47 plant is wrong on).
SERVING = Sizes(
    requests=24,
    prompt_lens=(30, 33, 36, 39, 42) + tuple(96 + 29 * i for i in range(19)),
    max_new=24,
    running=24,
    max_total_tokens=24576,
    context_length=1024,
    chunked_prefill=512,
)

_CHAIN = {
    "speculative_num_steps": 2,
    "speculative_eagle_topk": 1,
    "speculative_num_draft_tokens": 3,
}
_SPEC = {
    "ngram-chain": (
        "NGRAM",
        None,
        {"speculative_num_draft_tokens": 4, "speculative_ngram_max_bfs_breadth": 1},
    ),
    "ngram-tree": (
        "NGRAM",
        None,
        {"speculative_num_draft_tokens": 6, "speculative_ngram_max_bfs_breadth": 3},
    ),
    "standalone": ("STANDALONE", "standalone", _CHAIN),
    "eagle": ("EAGLE", "eagle", _CHAIN),
    "eagle3": ("EAGLE3", "eagle3", _CHAIN),
    "dflash": ("DFLASH", "dflash", {"speculative_num_draft_tokens": 4}),
}


def _config(name: str, host: bool, **kw) -> Config:
    algo, draft, spec = _SPEC[name]
    return Config(
        algo,
        draft,
        host,
        spec,
        # DFLASH's draft runs in bfloat16 whatever the engine's dtype: match it
        dtype="bfloat16" if algo == "DFLASH" else "float32",
        target="target-spec" if algo in ("EAGLE3", "DFLASH") else "target",
        **kw,
    )


CONFIGS = {}
for _name in _SPEC:
    for _host in (True, False):
        if _name.startswith("ngram") and not _host:
            continue  # NGRAM forces host lengths on every backend
        # EAGLE with host lengths runs at serving sizes
        serving = _name == "eagle" and _host
        CONFIGS[f"{_name}-{'host' if _host else 'gpu-only'}"] = _config(
            _name, _host, serving=serving
        )
# Two ranks (gloo on CPU): host lengths, and every backend opted out
CONFIGS["ngram-chain-host-tp2"] = _config("ngram-chain", True, tp=2)
CONFIGS["standalone-gpu-only-tp2"] = _config("standalone", False, tp=2)


def unused_model_modules() -> str:
    """SGLANG_DISABLED_MODEL_ARCHS: every model module but the tier's, so the scheduler does
    not import SGLang's ~200 model files at start-up (seconds of each arm)."""
    import pkgutil

    import sglang.srt.models as package

    used = {"llama", "llama_eagle", "llama_eagle3", "dflash"}
    return ",".join(
        m.name for m in pkgutil.iter_modules(package.__path__) if not m.ispkg and m.name not in used
    )


def config_env(cfg: Config) -> dict:
    """What a configuration sets in its engine's environment (both arms alike)."""
    env = {
        "SPEC_FUSED_E2E_HOST_LENGTHS": "1" if cfg.host_lengths else "",
        "SGLANG_DISABLED_MODEL_ARCHS": unused_model_modules(),
        "SGLANG_CPU_OMP_THREADS_BIND": "",
    }
    if cfg.tp > 1:  # one core per rank; SGLang refuses more ranks than NUMA nodes without it
        env["SGLANG_CPU_OMP_THREADS_BIND"] = "|".join(
            str(i % (os.cpu_count() or 1)) for i in range(cfg.tp)
        )
    return env


def make_models(root: Path) -> dict:
    return models.make_all(root)


def engine_kwargs(cfg: Config, paths: dict) -> dict:
    sizes = cfg.sizes
    kw = dict(
        model_path=paths[cfg.target],
        load_format="dummy",
        skip_tokenizer_init=True,
        device="cpu",
        dtype=cfg.dtype,
        attention_backend="triton",
        sampling_backend="pytorch",
        disable_cuda_graph=True,
        page_size=1,
        max_running_requests=sizes.running,
        max_total_tokens=sizes.max_total_tokens,
        context_length=sizes.context_length,
        chunked_prefill_size=sizes.chunked_prefill,
        random_seed=0,
        triton_attention_num_kv_splits=1,
        log_level="warning",
        disable_radix_cache=True,
        speculative_algorithm=cfg.algorithm,
        **cfg.spec,
    )
    if cfg.tp > 1:
        kw["tp_size"] = cfg.tp
    if cfg.draft is not None:
        kw.update(
            speculative_draft_model_path=paths[cfg.draft],
            speculative_draft_load_format="dummy",
            speculative_draft_attention_backend="triton",
        )
    return kw


def requests(cfg: Config):
    """The configuration's greedy requests, with prompts and output lengths that differ;
    repeated phrases give NGRAM something to match. Returns (rids, prompts, params)."""
    sizes = cfg.sizes
    rng = random.Random(0)
    rids, prompts, params = [], [], []
    for i in range(sizes.requests):
        length = sizes.prompt_lens[i % len(sizes.prompt_lens)]
        phrase = [rng.randrange(3, models.VOCAB - 1) for _ in range(3 + i % 4)]
        prompt = (phrase * (length // len(phrase) + 1))[: length - 1] + [rng.randrange(3, 500)]
        rids.append(f"e2e-{i}")
        prompts.append(prompt)
        params.append(
            {
                "temperature": 0.0,
                "max_new_tokens": sizes.max_new - (i * 5) % 7,
                "ignore_eos": True,
            }
        )
    return rids, prompts, params
