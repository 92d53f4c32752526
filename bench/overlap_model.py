"""The model behind the A/B replay: a decode step's device and host costs, the two timelines
a forward can run on, continuous batching at a fixed concurrency, and the overlap loop that
runs one arm step by step as SGLang's ``event_loop_overlap``.

Why apart from ``ab_throughput.py``: these are the replay's assumptions - what a forward
costs, when the host is busy, how requests come and go - stated in one place where they
can be read and changed without touching how the arms are run and reported.
"""

from __future__ import annotations

import gc
import random
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Optional

import torch

from bench import harness
from spec_fused.tools import measure, traces


@dataclass(frozen=True)
class Workload:
    """What one decode step costs, device and host. It is a model: the defaults stand for
    a small (~1-3B) target with CUDA graphs, whose forward costs ``fwd_base_ms`` plus
    ``fwd_per_token_us`` per verified token; the scheduler's per-step Python
    (``get_next_batch_to_run`` + ``process_batch_result``) costs ``sched_base_us`` plus
    ``sched_per_req_us`` per request; preparing and enqueuing the forward after the
    resolve (``ForwardBatch`` init, attention metadata from the host lengths, graph
    replay) costs ``launch_us`` plus ``launch_per_req_us`` per request. Larger models
    mean longer forwards and smaller relay shares; every field has a flag."""

    algorithm: str
    max_accept: int  # accepted tokens per request and step: 1..max_accept
    accept_rate: float  # per-draft-token acceptance probability
    verify_tokens: int  # tokens verified per request and step
    fwd_base_ms: float = 2.5
    fwd_per_token_us: float = 5.0
    publish_frac: float = 0.7  # share of the forward before on_publish (verify)
    sched_base_us: float = 300.0
    sched_per_req_us: float = 3.0
    launch_us: float = 150.0
    launch_per_req_us: float = 1.0
    out_len: tuple = (64, 512)
    prompt_len: tuple = (128, 1024)

    def forward_s(self, batch: int) -> float:
        return self.fwd_base_ms * 1e-3 + self.fwd_per_token_us * 1e-6 * self.verify_tokens * batch

    def host_s(self, batch: int) -> float:
        return (self.sched_base_us + self.sched_per_req_us * batch) * 1e-6

    def launch_s(self, batch: int) -> float:
        return (self.launch_us + self.launch_per_req_us * batch) * 1e-6

    def draw_accept(self, rng: random.Random) -> int:
        accept = 1  # the bonus token always lands
        while accept < self.max_accept and rng.random() < self.accept_rate:
            accept += 1
        return accept


WORKLOADS = {
    "DFLASH": Workload("DFLASH", max_accept=16, accept_rate=0.8, verify_tokens=16),
    "EAGLE": Workload("EAGLE", max_accept=4, accept_rate=0.7, verify_tokens=8, fwd_base_ms=2.0),
}


# --------------------------------------------------------------------------- timelines


@dataclass
class Forward:
    done: object = None  # CUDA event
    publish_at: float = 0.0  # virtual timeline (CPU)
    done_at: float = 0.0


def sleep_until(deadline: float) -> None:
    remaining = deadline - time.perf_counter()
    if remaining > 3e-4:
        time.sleep(remaining - 2e-4)
    harness.spin_until(deadline)


class CudaTimeline:
    """SGLang's two streams; the forward is ``torch.cuda._sleep`` of calibrated cycles."""

    def __init__(self, device: torch.device):
        self.device = device
        self.schedule_stream = torch.cuda.Stream(device)
        self.forward_stream = torch.cuda.Stream(device)
        self.cycles_per_s = self._calibrate()

    def _calibrate(self) -> float:
        torch.cuda._sleep(1000)
        rates = []
        for cycles in (2_000_000, 10_000_000, 10_000_000):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            torch.cuda._sleep(cycles)
            end.record()
            end.synchronize()
            rates.append(cycles / (start.elapsed_time(end) * 1e-3))
        return harness.median(rates[1:])

    def scope(self):
        return torch.cuda.stream(self.schedule_stream)

    def stage(self, values: list) -> torch.Tensor:
        """H2D from pinned memory on the schedule stream, as SGLang stages batch inputs."""
        host = torch.tensor(values, dtype=torch.int64).pin_memory()
        return host.to(self.device, non_blocking=True)

    def _sleep(self, seconds: float) -> None:
        cycles = int(seconds * self.cycles_per_s)
        if cycles > 0:
            torch.cuda._sleep(cycles)

    def forward(self, part1_s: float, part2_s: float, on_publish: Optional[Callable]) -> Forward:
        with torch.cuda.stream(self.forward_stream):
            self.forward_stream.wait_stream(self.schedule_stream)
            self._sleep(part1_s)
            if on_publish is not None:
                on_publish()
            self._sleep(part2_s)
            done = torch.cuda.Event()
            done.record(self.forward_stream)
        return Forward(done=done)

    def before_resolve(self, last: Forward) -> None:
        """Nothing: on CUDA the relay orders itself behind the publish (event / stream)."""

    def war_barrier(self) -> None:
        self.schedule_stream.wait_stream(self.forward_stream)

    def wait_done(self, fwd: Forward) -> None:
        fwd.done.synchronize()

    def drain(self) -> None:
        torch.cuda.synchronize(self.device)


class VirtualTimeline:
    """CPU: the forward occupies a virtual device for its duration; waits sleep until then."""

    cycles_per_s = None

    def __init__(self, device: torch.device):
        self.device = device
        self.free_at = 0.0

    def scope(self):
        import contextlib

        return contextlib.nullcontext()

    def stage(self, values: list) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int64)

    def forward(self, part1_s, part2_s, on_publish) -> Forward:
        start = max(time.perf_counter(), self.free_at)
        fwd = Forward(publish_at=start + part1_s, done_at=start + part1_s + part2_s)
        if on_publish is not None:
            on_publish()  # the host enqueues it mid-forward; its data is ready at publish_at
        self.free_at = fwd.done_at
        return fwd

    def before_resolve(self, last: Forward) -> None:
        sleep_until(last.publish_at)

    def war_barrier(self) -> None:
        """Upstream enables the barrier on CUDA only (or SGLANG_ENABLE_WAR_BARRIER)."""

    def wait_done(self, fwd: Forward) -> None:
        sleep_until(fwd.done_at)

    def drain(self) -> None:
        sleep_until(self.free_at)


def make_timeline(device: torch.device):
    return CudaTimeline(device) if device.type == "cuda" else VirtualTimeline(device)


# --------------------------------------------------------------------------- requests


class Requests:
    """Continuous batching at a fixed concurrency; slots come from a FIFO free list."""

    def __init__(self, concurrency: int, pool: int, wl: Workload, seed: int):
        if pool < 2 * concurrency + 2:
            raise ValueError(f"pool {pool} too small for concurrency {concurrency}")
        self.wl = wl
        self.rng = random.Random(seed * 7919 + 1)
        self.free = deque(range(1, pool))  # slot 0 is the KV padding row, as upstream
        self.length: dict = {}
        self.left: dict = {}
        for _ in range(concurrency):
            self._admit()

    def _admit(self) -> int:
        slot = self.free.popleft()
        self.length[slot] = self.rng.randint(*self.wl.prompt_len)
        self.left[slot] = self.rng.randint(*self.wl.out_len)
        return slot

    def initial(self) -> tuple:
        slots = list(self.length)
        return slots, [self.length[s] for s in slots]

    def step(self, accepts: list) -> tuple:
        """Advance the running batch by ``accepts``; returns the batch slots, their
        lengths before the step, what the forward publishes and the accepted tokens."""
        slots = list(self.length)
        lens = [self.length[s] for s in slots]
        pub_vals, finished, tokens = [], [], 0
        for slot, accept in zip(slots, accepts):
            got = min(accept, self.left[slot])
            tokens += got
            self.left[slot] -= got
            self.length[slot] += accept
            pub_vals.append(self.length[slot])
            if self.left[slot] <= 0:
                finished.append(slot)
        pub_slots = list(slots)
        for slot in finished:
            del self.length[slot], self.left[slot]
            self.free.append(slot)
        for _ in finished:  # the prefill of a joining request publishes its first length
            slot = self._admit()
            pub_slots.append(slot)
            pub_vals.append(self.length[slot])
        return slots, lens, pub_slots, pub_vals, tokens


# --------------------------------------------------------------------------- arms


@dataclass
class RunResult:
    tokens: int
    wall_s: float
    step_ms: list = field(default_factory=list)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.wall_s if self.wall_s > 0 else float("nan")


class OverlapLoop:
    """One continuous-batching run of one arm (``ab_throughput.Arm``: its FutureMap, its
    barrier, whether it gives host lengths), step by step as ``event_loop_overlap``."""

    def __init__(
        self, arm, wl: Workload, timeline, concurrency: int, pool: int, seed: int, steps: int
    ):
        self.arm, self.fm, self.wl, self.timeline = arm, arm.fm, wl, timeline
        self.reqs = Requests(concurrency, pool, wl, seed)
        draws = random.Random(seed)  # the same accept lengths for every arm
        self.accepts = [[wl.draw_accept(draws) for _ in range(concurrency)] for _ in range(steps)]
        self.keep_alive = deque(maxlen=4)  # cross-stream lifetimes (SGLang: batch_record_buf)
        self.batch = self.expected = None
        self.last: Optional[Forward] = None

    def _publish(self, idx, vals) -> Optional[Callable]:
        return (lambda: self.fm.publish(idx, vals)) if self.fm is not None else None

    def bootstrap(self) -> None:
        """The prefills of the first requests publish their lengths."""
        slots, lens = self.reqs.initial()
        idx, vals = self.timeline.stage(slots), self.timeline.stage(lens)
        self.keep_alive.append((idx, vals))
        self.last = self.timeline.forward(0.0, 0.0, self._publish(idx, vals))
        self.timeline.drain()

    def step(self, k: int, top: float) -> int:
        """One loop iteration started at ``top``; returns the tokens it accepts."""
        n = len(self.reqs.length)
        half = self.wl.host_s(n) / 2
        # get_next_batch_to_run: bookkeeping; batch inputs staged on the schedule stream
        slots, lens, pub_slots, pub_vals, tokens = self.reqs.step(self.accepts[k])
        idx = self.timeline.stage(slots)
        pub_idx, pub_val = self.timeline.stage(pub_slots), self.timeline.stage(pub_vals)
        harness.spin_until(top + half)
        fwd = self.run_batch(idx, slots, lens, self._publish(pub_idx, pub_val))
        self.keep_alive.append((idx, pub_idx, pub_val, self.batch))
        if self.arm.war_barrier:  # Scheduler._apply_war_barrier
            self.timeline.war_barrier()
        # process the previous batch's result: it waits for that forward
        self.timeline.wait_done(self.last)
        harness.spin_until(time.perf_counter() + half)
        self.last = fwd
        return tokens

    def run_batch(self, idx, slots, lens, publish) -> Forward:
        n = len(slots)
        if self.fm is not None:
            self.batch = traces.decode_batch(idx, host=torch.tensor(slots, dtype=torch.int64))
            self.expected = lens
            self.timeline.before_resolve(self.last)
            self.fm.resolve_seq_lens_cpu(self.batch)
        harness.spin_until(time.perf_counter() + self.wl.launch_s(n))  # forward prepare
        fwd_s = self.wl.forward_s(n)
        return self.timeline.forward(
            fwd_s * self.wl.publish_frac, fwd_s * (1 - self.wl.publish_frac), publish
        )

    def run(self, steps: int, warmup: int) -> RunResult:
        """``steps`` iterations, the first ``warmup`` untimed; GC off while timing."""
        step_ms, tokens, t_start, last_top = [], 0, None, None
        with self.timeline.scope():
            self.bootstrap()
            gc.collect()
            gc.disable()
            try:
                for k in range(steps):
                    top = time.perf_counter()
                    if k == warmup:
                        t_start = top
                    elif k > warmup:
                        step_ms.append((top - last_top) * 1e3)
                    last_top = top
                    got = self.step(k, top)
                    tokens += got if k >= warmup else 0
                self.timeline.drain()
                wall = time.perf_counter() - t_start
            finally:
                gc.enable()
        self.check()
        return RunResult(tokens, wall, step_ms)

    def check(self) -> None:
        """The last resolve gave the lengths the host knows (outside the timed region)."""
        if self.fm is not None:
            measure.check_resolved(
                self.batch,
                torch.tensor(self.expected, dtype=torch.int64),
                host_lengths=self.arm.host_lengths,
                what=f"arm {self.arm.name}",
            )
