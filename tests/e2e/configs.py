"""The e2e tier's configurations, engine arguments and requests."""

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


def pythonpath(*extra: Path) -> str:
    """PYTHONPATH for an engine process on CPU: the stand-ins, ``extra``, then the caller's."""
    inherited = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return os.pathsep.join([str(p) for p in (*STANDIN_PATHS, *extra)] + inherited)


N_REQUESTS = 16
MAX_RUNNING = 4  # requests finish at different steps; queued ones are admitted mid-decode


@dataclass(frozen=True)
class Config:
    algorithm: str
    draft: str | None  # a models.MODELS name
    host_lengths: bool  # an attention backend reads host lengths (else every one opts out)
    spec: dict = field(default_factory=dict)
    max_new: int = 10  # the longest output; the others are 4 or more tokens shorter
    dtype: str = "float32"


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
    "standalone": (
        "STANDALONE",
        "standalone",
        {
            "speculative_num_steps": 2,
            "speculative_eagle_topk": 1,
            "speculative_num_draft_tokens": 3,
        },
    ),
    "eagle": (
        "EAGLE",
        "eagle",
        {
            "speculative_num_steps": 2,
            "speculative_eagle_topk": 1,
            "speculative_num_draft_tokens": 3,
        },
    ),
    "eagle3": (
        "EAGLE3",
        "eagle3",
        {
            "speculative_num_steps": 2,
            "speculative_eagle_topk": 1,
            "speculative_num_draft_tokens": 3,
        },
    ),
    "dflash": ("DFLASH", "dflash", {"speculative_num_draft_tokens": 4}),
}

CONFIGS = {}
for _name, (_algo, _draft, _spec) in _SPEC.items():
    for _host in (True, False):
        if _algo == "NGRAM" and not _host:
            continue  # NGRAM forces host lengths on every backend
        CONFIGS[f"{_name}-{'host' if _host else 'gpu-only'}"] = Config(
            _algo,
            _draft,
            _host,
            _spec,
            # DFLASH's draft runs in bfloat16 whatever the engine's dtype: match it
            dtype="bfloat16" if _algo == "DFLASH" else "float32",
        )


def unused_model_modules() -> str:
    """SGLANG_DISABLED_MODEL_ARCHS: every model module but the tier's, so the scheduler does
    not import SGLang's ~200 model files at start-up (seconds of each arm)."""
    import pkgutil

    import sglang.srt.models as package

    used = {"llama", "llama_eagle", "llama_eagle3", "dflash"}
    return ",".join(
        m.name for m in pkgutil.iter_modules(package.__path__) if not m.ispkg and m.name not in used
    )


def make_models(root: Path) -> dict:
    return models.make_all(root)


def engine_kwargs(cfg: Config, paths: dict) -> dict:
    kw = dict(
        model_path=paths["target"],
        load_format="dummy",
        skip_tokenizer_init=True,
        device="cpu",
        dtype=cfg.dtype,
        attention_backend="triton",
        sampling_backend="pytorch",
        disable_cuda_graph=True,
        page_size=1,
        max_running_requests=MAX_RUNNING,
        max_total_tokens=4096,
        context_length=512,
        chunked_prefill_size=256,
        random_seed=0,
        triton_attention_num_kv_splits=1,
        log_level="warning",
        disable_radix_cache=True,
        speculative_algorithm=cfg.algorithm,
        **cfg.spec,
    )
    if cfg.draft is not None:
        kw.update(
            speculative_draft_model_path=paths[cfg.draft],
            speculative_draft_load_format="dummy",
            speculative_draft_attention_backend="triton",
        )
    return kw


def requests(max_new: int = 10):
    """N_REQUESTS greedy requests whose prompts and output lengths differ; repeated phrases
    give NGRAM something to match."""
    rng = random.Random(0)
    prompts, params = [], []
    for i in range(N_REQUESTS):
        phrase = [rng.randrange(3, models.VOCAB - 1) for _ in range(3 + i % 4)]
        prompt = (phrase * (2 + i % 3))[: 6 + (i * 7) % 23] + [rng.randrange(3, 500)]
        prompts.append(prompt)
        params.append(
            {"temperature": 0.0, "max_new_tokens": max_new - (i * 5) % 7, "ignore_eos": True}
        )
    return prompts, params
