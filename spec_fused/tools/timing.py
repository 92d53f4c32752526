"""One relay step timed as serving sees it, for ``spec-fused selftest`` and ``bench/probe.py``.

Why not ``torch.utils.benchmark`` or ``do_bench``: they sync at block edges on an idle GPU,
so a step that blocks the host reads as its serial latency. SGLang resolves while the
forward still runs and publishes mid-forward. A step here is an :class:`Arm`'s
``publish()`` on a forward stream, then its ``resolve()`` on a schedule stream, on a
drained device, in one of two modes: ``idle`` (the only one on a CPU), or ``queued`` (CUDA),
behind real work as serving resolves: graphed bf16 GEMMs of Llama-3-8B layers
(:mod:`spec_fused.tools.forward`, 256 tokens) on the forward stream, a verify calibrated
to ``busy_us`` before the publish point and a draft extend of half that after it, so every
enqueue lands before the GPU reaches the publish point and the step's launches contend
with the draft's for SMs (a sleep kernel left them free).

* host µs: the wall time of the ``publish()`` call plus the ``resolve()`` call, minus the
  time inside ``torch.cuda.Event.synchronize``, ``torch.cuda.Stream.synchronize`` and
  ``torch.cuda.synchronize`` meanwhile (:func:`blocked`, for every arm alike).
* device µs (CUDA): GPU-clock time from the publish point - an event on the forward stream
  just before ``publish()``: idle, when the host got there; queued, when the verify's
  GEMMs ended - to an event on the schedule stream once ``resolve()`` has returned and that
  stream has waited for the arm's own streams: the later of the step's last device op and
  the host's return as the GPU sees it. Idle: the serial latency; queued: what the step
  adds after the publish point.
* late (queued): the GPU reached the publish point (an event on an idle stream marks when
  the host began the step) before the host, blocked time left out, had enqueued the
  publish, the draft and the resolve: the step was not wholly queued.
* engaged (a relay arm, :func:`engagement`): after every step, warm-up included, outside
  the timed spans: the relay resolved it itself. A step it handed back to SGLang times
  SGLang against itself (about 1.00x), so a cell with one such step is no ratio.

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

__all__ = ["MODES", "Arm", "Clock", "abba", "blocked", "engagement", "estimate_s", "median",
           "paired_x", "run"]  # fmt: skip

MODES = ("queued", "idle")
FILLER_TOKENS = 256  # the queued GEMMs' rows: 64 requests x 4 draft tokens
STEP_US = 150.0  # estimate: a GPU step's own µs (host calls, events, syncs), filler aside


def _nothing() -> None:
    pass


class Arm(NamedTuple):
    name: str
    publish: Callable[[], object]  # on the forward stream
    resolve: Callable[[], object]  # on the schedule stream
    prepare: Callable[[], object] = _nothing  # before each block (e.g. the patch state)
    streams: tuple = ()  # streams of the step's own device work, joined before the end event
    engaged: Optional[Callable[[], bool]] = None  # a relay arm: was that step its own?


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
    """The forward, schedule and idle streams, the step's events and the queued mode's
    GEMM graphs on CUDA; on a CPU only the host clock. ``filler``: what the GEMMs
    measured (None: no queued mode)."""

    def __init__(self, device, busy_us: float = 0.0):
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.forward = self.schedule = self.idle = None
        self.filler: Optional[dict] = None
        if self.cuda:
            self.forward, self.schedule, self.idle = (torch.cuda.Stream(self.device) for _ in "fsi")
            self.events = [torch.cuda.Event(enable_timing=True) for _ in "hpe"]
            if busy_us > 0:
                self._fill(busy_us)

    def _fill(self, us: float) -> None:
        from spec_fused.tools.forward import Forward

        with torch.cuda.stream(self.forward):
            fwd = Forward(self.device, FILLER_TOKENS)
            (self.verify, v, v_us), (self.draft, d, d_us) = fwd.calibrated(us, us / 2)
        self.filler = {"tokens": FILLER_TOKENS, "wanted_us": us, "verify_gemms": v,
                       "verify_us": round(v_us, 1), "draft_gemms": d,
                       "draft_us": round(d_us, 1)}  # fmt: skip

    def queued_us(self, busy_us: float) -> float:
        """Device µs the filler adds to a queued step (measured; else ``1.5 busy_us``)."""
        f = self.filler
        return f["verify_us"] + f["draft_us"] if f else 1.5 * busy_us

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
                    self.verify()
            th = clock()
            host0.record(self.idle)
            pub.record(self.forward)
        spent[0] = 0
        with self._on(self.forward):
            t0 = clock()
            arm.publish()
            t1 = clock()
            if queued:
                self.draft()
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
        late = host0.elapsed_time(pub) * 1e3 < (t3 - th - spent[0]) / 1e3 if queued else None
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


def _step(clock: Clock, arm: Arm, spent: list, queued: bool) -> tuple:
    """One step and, after it (outside every timed span), whether it was the relay's."""
    return (*clock.step(arm, spent, queued), arm.engaged() if arm.engaged else None)


def run(arms: Sequence[Arm], clock: Clock, *, mode: str, rounds: int, steps: int, seed: int,
        warmup: int = 2) -> dict:  # fmt: skip
    """``{arm: {"host_us": [...], "device_us": [...], "late": [...], "engaged_steps": [...],
    "warmup_engaged": n, "engaged": bool}}``, one entry per round: the block's median
    (None: no device), late and engaged: how many of its steps (None: idle / no relay);
    ``engaged``: every step of the arm, warm-up included, was the relay's (None: no relay)."""
    queued = mode == "queued"
    if mode not in MODES or (queued and not clock.filler):
        raise ValueError(f"mode {mode!r}: queued needs CUDA and busy_us > 0")
    by_name = {a.name: a for a in arms}
    out = {a.name: {"host_us": [], "device_us": [], "late": [], "engaged_steps": []} for a in arms}
    gc.collect()
    gc.freeze()  # what exists now is no round's garbage: each round's collection skips it
    with contextlib.ExitStack() as stack:
        stack.callback(gc.unfreeze)
        spent = stack.enter_context(blocked())
        for arm in arms:
            arm.prepare()
            if arm.engaged:
                arm.engaged()  # the baseline: what ran before (its check) is not counted
            warm = [_step(clock, arm, spent, queued)[3] for _ in range(warmup)]
            out[arm.name]["warmup_engaged"] = sum(warm) if arm.engaged else None
        for order in abba(list(by_name), rounds, seed):
            gc.collect()
            for name in order:
                by_name[name].prepare()
                gc.disable()
                try:
                    block = [_step(clock, by_name[name], spent, queued) for _ in range(steps)]
                finally:
                    gc.enable()
                hosts, devs, lates, engaged = zip(*block)
                rec = out[name]
                rec["host_us"].append(statistics.median(hosts))
                rec["device_us"].append(median(devs))  # None on a CPU
                rec["late"].append(sum(lates) if queued else None)
                rec["engaged_steps"].append(sum(engaged) if by_name[name].engaged else None)
    for a in arms:
        rec = out[a.name]
        whole = rec["warmup_engaged"] == warmup and all(n == steps for n in rec["engaged_steps"])
        rec["engaged"] = whole if a.engaged else None
    return out


def engagement(fm) -> Callable[[], bool]:
    """For a relay arm's ``engaged``: whether spec_fused's relay of ``fm`` resolved the step
    since the last call itself (the first call sets the baseline). Its launcher counted
    exactly one launch, it consumed a publish it had not before, and it is still ``fm``'s
    relay. A launch count alone is fooled: a hand-back lands the pending publish with a
    launch of its own, then SGLang's resolve runs, one launch a step too."""
    from spec_fused.relay import RELAY_ATTR

    relay, seen = fm.__dict__.get(RELAY_ATTR), [None, None]
    if relay is None:  # SGLang's already
        return lambda: False

    def engaged() -> bool:
        step, landed = relay.launcher.step, relay.landed
        ok = seen[0] is not None and step == seen[0] + 1 and landed is not seen[1]
        seen[:] = step, landed
        return ok and fm.__dict__.get(RELAY_ATTR) is relay

    return engaged


def estimate_s(clock: Clock, mode: str, arms: int, *, rounds: int, steps: int, warmup: int,
               busy_us: float) -> float:  # fmt: skip
    """Device seconds :func:`run` is planned to take (every step, its filler included)."""
    per_step = STEP_US + (clock.queued_us(busy_us) if mode == "queued" else 0.0)
    return arms * (rounds * steps + warmup) * per_step / 1e6


def median(values) -> Optional[float]:
    values = [v for v in values or () if v is not None]
    return statistics.median(values) if values else None


def paired_x(base, other) -> Optional[float]:
    """The median over rounds of ``other / base`` within the same round."""
    return median([o / b for b, o in zip(base or (), other or ()) if b and o is not None])
