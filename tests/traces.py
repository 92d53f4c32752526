"""Random continuous-batching traces driven through a real SGLang ``FutureMap``.

A trace is what the spec-v2 overlap scheduler does to the relay, step by step: requests
join (a prefill publishes their first length), decode steps resolve the running batch and
publish ``seq_lens + accept`` mid-forward, requests finish and their slots are reused,
DP-idle steps carry empty batches, and mixed prefill+decode batches late-bind their tails
through ``resolve_mixed_spec_tails``. Every observable (``batch.seq_lens``,
``seq_lens_cpu``, ``seq_lens_sum`` and the mixed-tail fields) is recorded, so the same
seed run through the unpatched and the patched FutureMap must record the same thing.
"""

from __future__ import annotations

import contextlib
import random
from dataclasses import dataclass, field
from types import SimpleNamespace

import torch


@dataclass
class TraceConfig:
    seed: int = 0
    pool: int = 64
    steps: int = 30
    max_running: int = 16
    max_len: int = 512
    block: int = 16  # accept lengths drawn in [1, block]
    value_dtype: torch.dtype = torch.int64
    index_dtype: torch.dtype = torch.int64
    p_join: float = 0.5
    p_finish: float = 0.15
    p_idle: float = 0.1
    p_mixed: float = 0.15


@dataclass
class StepRecord:
    kind: str
    seq_lens: list = field(default_factory=list)
    seq_lens_cpu: object = None
    seq_lens_sum: object = None
    extra: tuple = ()


def make_pool(pool: int, max_len: int):
    req_to_token = torch.arange(pool * max_len, dtype=torch.int32).reshape(pool, max_len)
    return SimpleNamespace(req_to_token=req_to_token)


def installed(*names):
    """The names among ``names`` that the installed SGLang's SpeculativeAlgorithm has."""
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    return [n for n in names if n in SpeculativeAlgorithm.__members__]


def make_future_map(spec_algo, cfg: TraceConfig, *, needs_cpu_seq_lens=True):
    from sglang.srt.managers.overlap_utils import FutureMap

    return FutureMap(torch.device("cpu"), spec_algo, make_pool(cfg.pool, cfg.max_len),
                     needs_cpu_seq_lens=needs_cpu_seq_lens)


def unpatched_then_patched(drive, algo, cfg: TraceConfig, **fm_kwargs):
    """``drive`` run on SGLang's FutureMap as shipped, then on a patched one: both results."""
    from spec_fused.integration import sglang_patch

    want = drive(make_future_map(algo, cfg, **fm_kwargs))
    sglang_patch.apply()
    try:
        got = drive(make_future_map(algo, cfg, **fm_kwargs))
    finally:
        sglang_patch.remove()
    return want, got


@contextlib.contextmanager
def patched_future_map(algo, cfg: TraceConfig, **fm_kwargs):
    """A FutureMap made, and used, while spec_fused is applied."""
    from spec_fused.integration import sglang_patch

    sglang_patch.apply()
    try:
        yield make_future_map(algo, cfg, **fm_kwargs)
    finally:
        sglang_patch.remove()


def _decode_batch(slots, cfg):
    fi = torch.tensor(slots, dtype=cfg.index_dtype)
    return SimpleNamespace(
        spec_info=SimpleNamespace(future_indices=fi),
        req_pool_indices=fi,
        req_pool_indices_cpu=torch.tensor(slots, dtype=torch.int64),
        seq_lens=None, seq_lens_cpu=None, seq_lens_sum=None)


def _as_list(x):
    if x is None:
        return None
    if isinstance(x, torch.Tensor):
        return x.tolist()
    return int(x)


def run_trace(fm, cfg: TraceConfig) -> list[StepRecord]:
    """Drive ``fm`` through the trace given by ``cfg``; return what every step observed."""
    rng = random.Random(cfg.seed)
    has_mixed_tails = hasattr(fm, "resolve_mixed_spec_tails")  # 0.5.23 yes, 0.5.15 no
    free = list(range(1, cfg.pool))  # slot 0 mirrors the KV padding row, as upstream
    rng.shuffle(free)
    running: dict[int, int] = {}  # slot -> committed length (host truth)
    records: list[StepRecord] = []

    def publish(slots, lens):
        fm.publish(torch.tensor(slots, dtype=cfg.index_dtype),
                   torch.tensor(lens, dtype=cfg.value_dtype))

    for _ in range(cfg.steps):
        # requests join: their prefill publishes the first committed length
        joins = []
        while free and len(running) + len(joins) < cfg.max_running and rng.random() < cfg.p_join:
            joins.append(free.pop())
        if joins:
            lens = [rng.randint(1, cfg.max_len // 4) for _ in joins]
            if rng.random() < cfg.p_mixed and running and has_mixed_tails:
                # mixed prefill+decode: the running tails late-bind from the relay
                tails = sorted(running)[: rng.randint(1, len(running))]
                records.append(_mixed_step(fm, tails, cfg, rng))
                for s in tails:
                    running[s] += 1
                publish(tails, [running[s] for s in tails])
            publish(joins, lens)
            running.update(zip(joins, lens))
            records.append(StepRecord("prefill", extra=tuple(joins)))
            continue
        if not running or rng.random() < cfg.p_idle:
            batch = _decode_batch([], cfg)  # DP-idle: empty batch on this rank
            fm.resolve_seq_lens_cpu(batch)
            fm.publish(torch.empty(0, dtype=cfg.index_dtype), torch.empty(0, dtype=cfg.value_dtype))
            records.append(StepRecord("idle", _as_list(batch.seq_lens),
                                      _as_list(batch.seq_lens_cpu), _as_list(batch.seq_lens_sum)))
            continue
        slots = sorted(running)
        rng.shuffle(slots)
        batch = _decode_batch(slots, cfg)
        fm.resolve_seq_lens_cpu(batch)
        records.append(StepRecord("decode", _as_list(batch.seq_lens),
                                  _as_list(batch.seq_lens_cpu), _as_list(batch.seq_lens_sum)))
        # the forward: verify accepts 1..block tokens per request, publishes mid-forward
        for s in slots:
            running[s] = min(running[s] + rng.randint(1, cfg.block), cfg.max_len - 2)
        publish(slots, [running[s] for s in slots])
        # some requests finish: their slots go back to the pool for reuse
        for s in slots:
            if rng.random() < cfg.p_finish:
                del running[s]
                free.insert(0, s)
    return records


def _mixed_step(fm, tails, cfg, rng) -> StepRecord:
    n_prefill = rng.randint(1, 4)
    n = len(tails)
    idx = torch.tensor(tails, dtype=cfg.index_dtype)
    seq_lens = torch.tensor([rng.randint(1, 50) for _ in range(n_prefill)] + [0] * n)
    batch = SimpleNamespace(
        mix_running_indices=idx,
        mix_running_indices_cpu=torch.tensor(tails, dtype=torch.int64),
        seq_lens=seq_lens,
        seq_lens_cpu=seq_lens.clone(),
        seq_lens_sum=int(seq_lens.sum()),
        out_cache_loc=torch.zeros(n_prefill + n, dtype=torch.int64),
        prefix_lens=[0] * (n_prefill + n),
    )
    fm.resolve_mixed_spec_tails(batch)
    return StepRecord("mixed", _as_list(batch.seq_lens), _as_list(batch.seq_lens_cpu),
                      _as_list(batch.seq_lens_sum),
                      (tuple(batch.out_cache_loc.tolist()), tuple(batch.prefix_lens)))
