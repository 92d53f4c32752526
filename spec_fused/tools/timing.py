"""One relay step timed as serving sees it, for ``spec-fused selftest`` and ``bench/probe.py``.

Why not ``torch.utils.benchmark`` or ``do_bench``: they sync at block edges on an idle GPU,
so a step that blocks the host reads as its serial latency. SGLang resolves while the
forward still runs and publishes mid-forward. A step here is an :class:`Arm`'s
``publish()`` on a forward stream, then its ``resolve()`` on a schedule stream, on a
drained device, in one of two modes: ``idle`` (the only one on a CPU), or ``queued`` (CUDA):
a busy kernel (``torch.cuda._sleep`` calibrated to ``busy_us``) on the forward stream
first, the publish after it and half as much again after that (the draft extend), so
every enqueue lands before the GPU reaches the publish point.

* host µs: the wall time of the ``publish()`` call plus the ``resolve()`` call, minus the
  time inside ``torch.cuda.Event.synchronize``, ``torch.cuda.Stream.synchronize`` and
  ``torch.cuda.synchronize`` meanwhile (:func:`blocked`, for every arm alike).
* device µs (CUDA): GPU-clock time from the publish point - an event on the forward stream
  just before ``publish()``: idle, when the host got there; queued, when the busy kernel
  ended - to an event on the schedule stream once ``resolve()`` has returned and that
  stream has waited for the arm's own streams: the later of the step's last device op and
  the host's return as the GPU sees it. Idle: the serial latency; queued: what the step
  adds after the publish point.
* late (queued): the GPU reached the publish point less than the step's host µs after the
  host began it (an event on an idle stream): the step was not queued.

Each arm runs a block of steps per round (GC off, ``prepare()`` outside), in a seeded
shuffled order the next round reverses (ABBA); a round's figure is its block's median.
"""

from __future__ import annotations

import contextlib
import gc
import random
import statistics
import time
from collections.abc import Callable, Sequence
from typing import NamedTuple, Optional

import torch

__all__ = ["MODES", "Arm", "Clock", "abba", "blocked", "median", "paired_x", "run"]

MODES = ("queued", "idle")


def _nothing() -> None:
    pass


class Arm(NamedTuple):
    name: str
    publish: Callable[[], object]  # on the forward stream
    resolve: Callable[[], object]  # on the schedule stream
    prepare: Callable[[], object] = _nothing  # before each block (e.g. the patch state)
    streams: tuple = ()  # streams of the step's own device work, joined before the end event


@contextlib.contextmanager
def blocked():
    """Timers on CUDA's synchronize calls; yields ``[ns]``: host ns spent blocked in them."""
    spent = [0]
    saved = [(o, o.synchronize) for o in (torch.cuda.Event, torch.cuda.Stream, torch.cuda)]

    def timed(fn):
        def call(*args, **kwargs):
            t = time.perf_counter_ns()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[0] += time.perf_counter_ns() - t

        return call

    try:
        for owner, fn in saved:
            owner.synchronize = timed(fn)
        yield spent
    finally:
        for owner, fn in saved:
            owner.synchronize = fn


class Clock:
    """The forward, schedule and idle streams, the step's events and the busy kernel on
    CUDA; on a CPU only the host clock."""

    def __init__(self, device, busy_us: float = 0.0):
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.cycles, self.forward = 0, None
        self.schedule = self.idle = None
        if self.cuda:
            self.forward, self.schedule, self.idle = (torch.cuda.Stream(self.device) for _ in "fsi")
            self.events = [torch.cuda.Event(enable_timing=True) for _ in "hpe"]
            self.cycles = self._calibrate(busy_us) if busy_us > 0 else 0

    def _calibrate(self, us: float) -> int:
        start, end, n = *self.events[:2], 1 << 20
        with torch.cuda.stream(self.forward):
            for _ in range(5):  # the first ones while the clocks ramp up
                start.record()
                torch.cuda._sleep(n)
                end.record()
                end.synchronize()
        return int(us * n / (start.elapsed_time(end) * 1e3))

    def apart(self, stream):
        """``stream``, or a new one where it is one of the clock's (the pool of streams that
        ``torch.cuda.Stream()`` hands out wraps after 32)."""
        mine = (self.forward, self.schedule, self.idle) if self.cuda else ()
        while stream is not None and any(stream.cuda_stream == s.cuda_stream for s in mine):
            stream = torch.cuda.Stream(self.device)
        return stream

    def _on(self, stream):
        return torch.cuda.stream(stream) if self.cuda else contextlib.nullcontext()

    def step(self, arm: Arm, spent: list, queued: bool) -> tuple:
        """``(host µs, device µs or None, late or None)`` of one step (module docstring)."""
        clock = time.perf_counter_ns
        if self.cuda:
            host0, pub, end = self.events
            torch.cuda.synchronize(self.device)
            if queued:
                with self._on(self.forward):
                    torch.cuda._sleep(self.cycles)
            host0.record(self.idle)
            pub.record(self.forward)
        spent[0] = 0
        with self._on(self.forward):
            t0 = clock()
            arm.publish()
            t1 = clock()
            if queued:
                torch.cuda._sleep(self.cycles // 2)
        with self._on(self.schedule):
            t2 = clock()
            arm.resolve()
            t3 = clock()
        host_us = (t1 - t0 + t3 - t2 - spent[0]) / 1e3
        if not self.cuda:
            return host_us, None, None
        for s in arm.streams:
            self.schedule.wait_stream(s)
        end.record(self.schedule)
        end.synchronize()
        pub.synchronize()
        late = host0.elapsed_time(pub) * 1e3 < host_us if queued else None
        return host_us, pub.elapsed_time(end) * 1e3, late


def abba(names: Sequence[str], rounds: int, seed: int) -> list:
    """Each round's order: a seeded shuffle, reversed by the round after it."""
    rng, orders, order = random.Random(seed), [], list(names)
    for r in range(rounds):
        if r % 2 == 0:
            order = list(names)
            rng.shuffle(order)
        orders.append(order if r % 2 == 0 else order[::-1])
    return orders


def run(arms: Sequence[Arm], clock: Clock, *, mode: str, rounds: int, steps: int, seed: int,
        warmup: int = 2) -> dict:  # fmt: skip
    """``{arm: {"host_us": [...], "device_us": [...], "late": [...]}}``, one entry per round:
    the block's median (None: no device), late: how many of its steps (None: idle)."""
    queued = mode == "queued"
    if mode not in MODES or (queued and not clock.cycles):
        raise ValueError(f"mode {mode!r}: queued needs CUDA and busy_us > 0")
    by_name = {a.name: a for a in arms}
    out = {a.name: {"host_us": [], "device_us": [], "late": []} for a in arms}
    gc.collect()
    gc.freeze()  # what exists now is no round's garbage: each round's collection skips it
    with contextlib.ExitStack() as stack:
        stack.callback(gc.unfreeze)
        spent = stack.enter_context(blocked())
        for arm in arms:
            arm.prepare()
            for _ in range(warmup):
                clock.step(arm, spent, queued)
        for order in abba(list(by_name), rounds, seed):
            gc.collect()
            for name in order:
                by_name[name].prepare()
                gc.disable()
                try:
                    block = [clock.step(by_name[name], spent, queued) for _ in range(steps)]
                finally:
                    gc.enable()
                hosts, devs, lates = zip(*block)
                out[name]["host_us"].append(statistics.median(hosts))
                out[name]["device_us"].append(median(devs))  # None on a CPU
                out[name]["late"].append(sum(lates) if queued else None)
    return out


def median(values) -> Optional[float]:
    values = [v for v in values or () if v is not None]
    return statistics.median(values) if values else None


def paired_x(base, other) -> Optional[float]:
    """The median over rounds of ``other / base`` within the same round."""
    return median([o / b for b, o in zip(base or (), other or ()) if b and o is not None])
