"""Random continuous-batching traces driven through a real SGLang ``FutureMap``.

Why in the package: the same traces are the tests' ground truth and ``spec-fused
selftest``'s correctness check on a user's device. A trace is what the spec-v2 overlap
scheduler does to the relay, step by step: requests join (a prefill publishes their first
length), decode steps resolve the running batch and publish ``seq_lens + accept``
mid-forward, requests finish and their slots are reused, DP-idle steps carry empty
batches, and mixed prefill+decode batches late-bind their tails through
``resolve_mixed_spec_tails``. Every observable (``batch.seq_lens``, ``seq_lens_cpu``,
``seq_lens_sum`` and the mixed-tail fields) is recorded, so the same seed run through the
unpatched and the patched FutureMap must record the same thing.

On CUDA the trace runs SGLang's stream pattern: resolves on a schedule stream, the forward
on its own stream (a sleep stands in for verify, the publish lands mid-forward, another
sleep for draft extend), the WAR barrier as a wait of the schedule stream on the forward.
Nothing synchronizes the device mid-trace except what the relay itself does, so a missing
fence shows as wrong lengths, not as a slow run.
"""

from __future__ import annotations

import contextlib
import random
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Optional

import torch

__all__ = ["StepRecord", "TraceConfig", "decode_batch", "make_future_map", "run_trace"]


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
    verify_cycles: int = 200_000  # CUDA only: the forward's verify and draft-extend sleeps


@dataclass
class StepRecord:
    kind: str
    seq_lens: object = None
    seq_lens_cpu: object = None
    seq_lens_sum: object = None
    extra: tuple = ()


def make_pool(pool: int, max_len: int, device="cpu"):
    req_to_token = torch.arange(pool * max_len, dtype=torch.int32, device=device).reshape(
        pool, max_len
    )
    return SimpleNamespace(req_to_token=req_to_token)


def make_future_map(
    spec_algo, cfg: TraceConfig, *, device="cpu", needs_cpu_seq_lens=True, **kwargs
):
    from sglang.srt.managers.overlap_utils import FutureMap
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    if isinstance(spec_algo, str):
        spec_algo = SpeculativeAlgorithm[spec_algo]
    return FutureMap(
        torch.device(device),
        spec_algo,
        make_pool(cfg.pool, cfg.max_len, device),
        needs_cpu_seq_lens=needs_cpu_seq_lens,
        **kwargs,
    )


def decode_batch(slots, cfg: Optional[TraceConfig] = None, device="cpu", *, host=None):
    """The ScheduleBatch fields ``resolve_seq_lens_cpu`` reads and writes, for a decode
    batch of the requests in ``slots``: a list of slots (made into ``cfg.index_dtype``
    future indices on ``device``, staged as SGLang stages batch inputs), or the future
    indices as a tensor already made (used as they are; their host copy is ``host``, or
    one made here - once, outside any timed loop)."""
    if isinstance(slots, torch.Tensor):
        fi = slots
        if host is None:
            host = slots.to("cpu", copy=True)
    else:
        host = torch.tensor(slots, dtype=torch.int64)
        fi = _to_device(torch.tensor(slots, dtype=cfg.index_dtype), device)
    return SimpleNamespace(
        spec_info=SimpleNamespace(future_indices=fi),
        req_pool_indices=fi,
        req_pool_indices_cpu=host,
        seq_lens=None,
        seq_lens_cpu=None,
        seq_lens_sum=None,
    )


def _to_device(t: torch.Tensor, device) -> torch.Tensor:
    """Host values to the device without blocking the host (pinned, non-blocking), as
    SGLang stages batch inputs."""
    if torch.device(device).type != "cuda":
        return t
    return t.pin_memory().to(device, non_blocking=True)


def _value(x):
    if x is None:
        return None
    if isinstance(x, torch.Tensor):
        return x if x.device.type != "cpu" else x.tolist()
    return int(x)


class _Streams:
    """SGLang's two streams on CUDA; on CPU every scope is a no-op."""

    def __init__(self, device):
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        if self.cuda:
            self.schedule = torch.cuda.Stream(device)
            self.forward = torch.cuda.Stream(device)
            while self.forward.cuda_stream == self.schedule.cuda_stream:
                self.forward = torch.cuda.Stream(device)

    def on_schedule(self):
        return torch.cuda.stream(self.schedule) if self.cuda else contextlib.nullcontext()

    def on_forward(self):
        if not self.cuda:
            return contextlib.nullcontext()
        self.forward.wait_stream(self.schedule)
        return torch.cuda.stream(self.forward)

    def sleep(self, cycles: int) -> None:
        if self.cuda and cycles > 0:
            torch.cuda._sleep(cycles)

    def war_barrier(self) -> None:
        if self.cuda:
            self.schedule.wait_stream(self.forward)


def run_trace(fm, cfg: TraceConfig, device=None, guard=contextlib.nullcontext) -> list:
    """Drive ``fm`` through the trace given by ``cfg``; return what every step observed
    (device tensors are brought to the host once, at the end). ``guard()`` is entered
    around the steps (``selftest`` runs the paths that must not sync under PyTorch's
    sync detector)."""
    with guard():
        records, streams = _steps(fm, cfg, device or fm.device)
    if streams.cuda:
        torch.cuda.synchronize(streams.device)
    return [_on_host(r) for r in records]


def _steps(fm, cfg: TraceConfig, device) -> tuple:
    rng = random.Random(cfg.seed)
    has_mixed_tails = hasattr(fm, "resolve_mixed_spec_tails")  # 0.5.19+
    streams = _Streams(device)
    free = list(range(1, cfg.pool))  # slot 0 mirrors the KV padding row, as upstream
    rng.shuffle(free)
    running: dict = {}  # slot -> committed length (host truth)
    records: list = []

    def publish(slots, lens):
        fm.publish(
            _to_device(torch.tensor(slots, dtype=cfg.index_dtype), device),
            _to_device(torch.tensor(lens, dtype=cfg.value_dtype), device),
        )

    for _ in range(cfg.steps):
        joins = []
        while free and len(running) + len(joins) < cfg.max_running and rng.random() < cfg.p_join:
            joins.append(free.pop())
        if joins:  # requests join: their prefill publishes the first committed length
            lens = [rng.randint(1, cfg.max_len // 4) for _ in joins]
            with streams.on_forward():
                if rng.random() < cfg.p_mixed and running and has_mixed_tails:
                    # mixed prefill+decode: the running tails late-bind from the relay
                    tails = sorted(running)[: rng.randint(1, len(running))]
                    records.append(_mixed_step(fm, tails, cfg, rng, device))
                    for s in tails:
                        running[s] += 1
                    publish(tails, [running[s] for s in tails])
                publish(joins, lens)
            streams.war_barrier()
            running.update(zip(joins, lens))
            records.append(StepRecord("prefill", extra=tuple(joins)))
            continue
        if not running or rng.random() < cfg.p_idle:
            with streams.on_schedule():
                batch = decode_batch([], cfg, device)  # DP-idle: empty batch on this rank
                fm.resolve_seq_lens_cpu(batch)
            with streams.on_forward():
                fm.publish(
                    _to_device(torch.empty(0, dtype=cfg.index_dtype), device),
                    _to_device(torch.empty(0, dtype=cfg.value_dtype), device),
                )
            records.append(_record("idle", batch))
            continue
        slots = sorted(running)
        rng.shuffle(slots)
        with streams.on_schedule():
            batch = decode_batch(slots, cfg, device)
            fm.resolve_seq_lens_cpu(batch)
            record = _record("decode", batch)
        records.append(record)
        # the forward: verify accepts 1..block tokens per request, publishes mid-forward
        accept = [rng.randint(1, cfg.block) for _ in slots]
        for s, a in zip(slots, accept):
            running[s] = min(running[s] + a, cfg.max_len - 2)
        new_lens = [running[s] for s in slots]
        with streams.on_forward():
            streams.sleep(cfg.verify_cycles)
            publish(slots, new_lens)
            streams.sleep(cfg.verify_cycles // 2)
        streams.war_barrier()
        for s in slots:  # some requests finish: their slots go back to the pool for reuse
            if rng.random() < cfg.p_finish:
                del running[s]
                free.insert(0, s)
    return records, streams


def _record(kind: str, batch) -> StepRecord:
    lens = batch.seq_lens
    if isinstance(lens, torch.Tensor) and lens.device.type != "cpu":
        lens = lens.clone()  # on the current (schedule) stream: no host sync mid-trace
    return StepRecord(kind, _value(lens), _value(batch.seq_lens_cpu), _value(batch.seq_lens_sum))


def _on_host(record: StepRecord) -> StepRecord:
    def host(x):
        return x.tolist() if isinstance(x, torch.Tensor) else x

    return StepRecord(
        record.kind,
        host(record.seq_lens),
        host(record.seq_lens_cpu),
        host(record.seq_lens_sum),
        tuple(host(e) if isinstance(e, torch.Tensor) else e for e in record.extra),
    )


def _mixed_step(fm, tails, cfg, rng, device) -> StepRecord:
    n_prefill = rng.randint(1, 4)
    n = len(tails)
    seq_lens = torch.tensor([rng.randint(1, 50) for _ in range(n_prefill)] + [0] * n)
    batch = SimpleNamespace(
        mix_running_indices=_to_device(torch.tensor(tails, dtype=cfg.index_dtype), device),
        mix_running_indices_cpu=torch.tensor(tails, dtype=torch.int64),
        seq_lens=_to_device(seq_lens, device),
        seq_lens_cpu=seq_lens.clone(),
        seq_lens_sum=int(seq_lens.sum()),
        out_cache_loc=_to_device(torch.zeros(n_prefill + n, dtype=torch.int64), device),
        prefix_lens=[0] * (n_prefill + n),
    )
    fm.resolve_mixed_spec_tails(batch)
    out_cache_loc: Optional[torch.Tensor] = batch.out_cache_loc
    if out_cache_loc.device.type != "cpu":
        out_cache_loc = out_cache_loc.clone()
    return StepRecord(
        "mixed",
        _value(batch.seq_lens),
        _value(batch.seq_lens_cpu),
        _value(batch.seq_lens_sum),
        (out_cache_loc, tuple(batch.prefix_lens)),
    )
