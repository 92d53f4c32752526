"""What each speculative algorithm needs from the step-to-step length relay.

SGLang PR #29232 set out to replace ``is_dflash()`` special cases in the shared scheduler
with per-worker capabilities, deleted the special cases, and never added the capabilities.
This module is that missing piece, with two claims:

* ``needs_war_barrier``: must the scheduler's next shared-buffer writes wait for this
  forward's reads?
* ``host_seq_lens``: ``"exact"`` (a host copy of the device lengths), ``"reserved"`` (the
  worker plans with its own KV-allocation bound) or ``"none"``. To the relay "reserved"
  and "none" are one thing: no host lengths, given only where upstream gives none too.

A claim is declared by the table below (or :func:`register_caps` for a plugin algorithm),
then by the worker's own attributes, then by ``SPEC_FUSED_WAR_BARRIER`` /
``SPEC_FUSED_HOST_SEQ_LENS``. :func:`decide` holds the declaration to the installed
release: a barrier the table drops stays unless the installed worker fences its own
writes (0.5.14's ``verify_done``; no release since); host lengths are exact wherever the
FutureMap's own ``needs_cpu_seq_lens`` says so (every release folds the attention
backends, two-batch overlap and NGRAM into it), and an explicit ``"exact"`` stands where
it does not. A declaration that would take host lengths away where upstream gives them
is refused, and the refusal recorded - except ``"reserved"`` where the scheduler found a
:class:`HostBound`: every backend that reads host lengths plans from the worker's own
upper bound safely (DFLASH on FlashInfer fa2, ``integration/flashinfer_plan.py``). Then
the step gives no host lengths and nothing waits for them; a batch the bound does not
cover (not a graphed decode) is SGLang's, step by step.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any, Literal, Optional, cast

from spec_fused import settings, upstream

HostSeqLens = Literal["exact", "reserved", "none"]
HOST_SEQ_LENS_VALUES = ("exact", "reserved", "none")
Variant = Literal["barrier_free", "war_guarded"]

__all__ = [
    "BoundStep",
    "HostBound",
    "SpecCaps",
    "caps_for",
    "decide",
    "describe",
    "register_caps",
    "select_variant",
]


@dataclass(frozen=True)
class HostBound:
    """The worker plans host-length readers from its own upper bound, and every such reader
    accepts one: ``why``, the largest batch whose verify is graphed (planned from host
    lengths with no readback), and the verify window the bound must cover beyond the
    committed length (the debug check)."""

    why: str
    max_bs: int
    window: int
    arm: Callable[[], None] = field(default=lambda: None, compare=False)  # what it needs first
    # per step: what the step's plans may check themselves against (None: exact lengths)
    expect: Callable[[Optional[BoundStep]], None] = field(default=lambda step: None, compare=False)

    def floor(self, batch, n: int):
        """The host's committed lengths of a graphed decode step of ``n`` requests (SGLang
        0.5.19+'s ``prepare_for_decode`` seeds ``seq_lens_cpu`` with them), or None: any
        other step (a mixed chunk, a batch above the largest graph, whose stock plan reads
        the device anyway) is SGLang's."""
        mode, committed = getattr(batch, "forward_mode", None), getattr(batch, "seq_lens_cpu", None)
        if mode is None or not mode.is_decode() or not 0 < n <= self.max_bs:
            return None
        return committed if committed is not None and committed.shape[0] == n else None

    def launched(self, batch, committed, lens, read, *, debug: bool) -> None:
        """A covered step is launched: its plans learn their floor and how to read the exact
        lengths (``read``: the device ``lens``, on the host); debug mode checks both ends."""
        self.expect(BoundStep(committed, self.window, read))
        if debug:
            self.check(batch, lens, committed)

    def check(self, batch, lens, committed) -> None:
        """Debug mode (a sync): every request's device length lies between the host's
        committed length (the step's floor, :class:`BoundStep`) and the bound less the
        verify window, by name."""
        bound, lens = batch.spec_info.nxt_kv_lens_cpu, lens.cpu()
        need = lens + self.window
        for i in ((need > bound[: need.shape[0]]) | (lens < committed)).nonzero().flatten():
            rid = getattr(batch.reqs[i], "rid", int(i)) if getattr(batch, "reqs", None) else i
            raise AssertionError(
                f"request {rid}: device length {int(lens[i])} outside [host committed "
                f"{int(committed[i])}, host bound {int(bound[i])} - verify window {self.window}]"
            )


@dataclass(frozen=True)
class BoundStep:
    """A step whose host-length readers plan from the worker's bound. Per request: the
    floor of what they plan for (the host's committed length + the window: the device is
    never behind what the host committed) and, for a plan the bound cannot serve, the
    exact lengths (one host wait, for the step's publish, as SGLang's resolve waits)."""

    committed: Any  # int64 CPU tensor, one per request
    window: int
    read: Callable[[], Any]  # -> the device lengths (int64, on the host)

    @property
    def lower(self):
        return self.committed + self.window

    @cached_property
    def exact(self):
        """Read once, when a plan first asks: one wait serves the step's every plan."""
        return self.read() + self.window


@dataclass(frozen=True)
class SpecCaps:
    """The two claims, why, and whether each is an explicit word (a worker's, a plugin
    algorithm's or the environment's) that stands as said."""

    needs_war_barrier: bool
    host_seq_lens: HostSeqLens
    reason: str = ""
    own_barrier: bool = False  # the barrier claim is a worker's, plugin's or the env's word
    host_word: str = ""  # who claimed host lengths explicitly (a worker, a plugin, the env)
    refused: tuple = ()  # declarations that were not applied, each with why
    bound: Optional[HostBound] = None  # with "reserved", where a backend reads host lengths

    def __post_init__(self):
        if self.host_seq_lens not in HOST_SEQ_LENS_VALUES:
            raise ValueError(
                f"host_seq_lens must be one of {HOST_SEQ_LENS_VALUES}, got {self.host_seq_lens!r}"
            )
        if not isinstance(self.needs_war_barrier, bool):
            raise TypeError("needs_war_barrier must be a bool")
        if self.bound is not None and self.host_seq_lens != "reserved":
            raise ValueError("a host bound stands for reserved host lengths only")

    @property
    def exact_claimed(self) -> bool:
        """Exact host lengths claimed outright: they stand where upstream gives none."""
        return bool(self.host_word) and self.host_seq_lens == "exact"

    @property
    def variant(self) -> Variant:
        return select_variant(self)

    def because(self, why: str, **changes) -> SpecCaps:
        return replace(self, reason=f"{self.reason}; {why}" if self.reason else why, **changes)


_DEFAULT = SpecCaps(True, "exact", "upstream's default")
# What PR #29232 meant for DFLASH: it plans KV from its reserved allocation and (in 0.5.14)
# fenced its own req_to_token writes. decide() holds both to the installed release.
_DECLARED = {
    "DFLASH": SpecCaps(
        False,
        "reserved",
        "DFLASH plans KV from its reserved allocation when seq_lens_cpu is None and was "
        "exempt from the WAR barrier before PR #29232",
    ),
}
_REGISTERED: dict[str, SpecCaps] = {}


def algorithm_name(algorithm) -> str:
    """``SpeculativeAlgorithm.DFLASH``, a plugin algorithm or ``"dflash"``: ``"DFLASH"``."""
    if algorithm is None:
        return "NONE"
    name = algorithm if isinstance(algorithm, str) else getattr(algorithm, "name", None)
    if not isinstance(name, str):
        raise TypeError(f"cannot name speculative algorithm {algorithm!r}")
    return name.upper()


def known_algorithms() -> list[str]:
    """The installed SGLang's ``SpeculativeAlgorithm`` members (the table's without
    SGLang), and every registered plugin algorithm."""
    try:
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

        names = [m.name for m in SpeculativeAlgorithm]
    except Exception:
        names = list(_DECLARED)
    return list(dict.fromkeys([*names, *_REGISTERED]))


def register_caps(name: str, caps: SpecCaps) -> None:
    """Declare the capabilities of a plugin algorithm (``SpeculativeAlgorithm.register``).
    Its author speaks for its worker: both claims are its own word."""
    if not isinstance(caps, SpecCaps):
        raise TypeError("caps must be a SpecCaps")
    name = algorithm_name(name)
    word = f"register_caps({name!r}): host_seq_lens={caps.host_seq_lens!r}"
    _REGISTERED[name] = replace(caps, own_barrier=True, host_word=word)


def _parse_env(env: Mapping[str, str]) -> tuple[Optional[bool], Optional[HostSeqLens]]:
    barrier = env.get(settings.WAR_BARRIER.name) or None
    if barrier is not None and barrier not in ("0", "1"):
        raise ValueError(f"{settings.WAR_BARRIER.name}={barrier!r} is not valid; allowed: 0, 1")
    host = (env.get(settings.HOST_SEQ_LENS.name) or "").lower() or None
    if host is not None and host not in HOST_SEQ_LENS_VALUES:
        raise ValueError(
            f"{settings.HOST_SEQ_LENS.name}={host!r} is not valid; allowed: "
            f"{', '.join(HOST_SEQ_LENS_VALUES)}"
        )
    return (None if barrier is None else barrier == "1"), cast(Optional[HostSeqLens], host)


def caps_for(algorithm, *, worker=None, env: Optional[Mapping[str, str]] = None) -> SpecCaps:
    """What is declared for ``algorithm``: the table or its registration, then the
    worker's own ``needs_war_barrier`` / ``host_seq_lens`` (the hook PR #29232 intended),
    then the environment. Raises ``KeyError`` for an algorithm the installed SGLang does
    not have and nobody registered (SGLang's relay then runs)."""
    name = algorithm_name(algorithm)
    if name in _REGISTERED:
        caps = _REGISTERED[name]
    elif name in _DECLARED:
        caps = _DECLARED[name]
    elif name in known_algorithms():
        caps = _DEFAULT
    else:
        raise KeyError(
            f"no capabilities for speculative algorithm {name!r}; plugin algorithms declare "
            f"theirs with spec_fused.caps.register_caps(name, SpecCaps(...))"
        )
    barrier = getattr(worker, "needs_war_barrier", None)
    host = getattr(worker, "host_seq_lens", None)
    who = type(worker).__name__
    if isinstance(barrier, bool):
        caps = caps.because(f"{who}.needs_war_barrier={barrier}", needs_war_barrier=barrier)
        caps = replace(caps, own_barrier=True)
    if host in HOST_SEQ_LENS_VALUES:
        word = f"{who}.host_seq_lens={host!r}"
        caps = caps.because(word, host_seq_lens=host, host_word=word)
    env_barrier, env_host = _parse_env(settings.source(env))
    if env_barrier is not None:
        caps = caps.because(
            f"{settings.WAR_BARRIER.name}={int(env_barrier)}",
            needs_war_barrier=env_barrier,
            own_barrier=True,
        )
    if env_host is not None:
        word = f"{settings.HOST_SEQ_LENS.name}={env_host}"
        caps = caps.because(word, host_seq_lens=env_host, host_word=word)
    return caps


def decide(
    algorithm,
    *,
    needs_cpu_seq_lens: bool,
    worker=None,
    env: Optional[Mapping[str, str]] = None,
    host_bound: HostBound | str | None = None,
) -> SpecCaps:
    """What production runs for a FutureMap whose ``needs_cpu_seq_lens`` is as given:
    :func:`caps_for` held to the installed release (see the module docstring). The
    scheduler patch, the relay, the benchmarks and ``doctor`` all decide here.
    ``host_bound``: what the scheduler found of a worker's own bound (or why none)."""
    declared = caps = caps_for(algorithm, worker=worker, env=env)
    name = algorithm_name(algorithm)
    if not caps.needs_war_barrier and not caps.own_barrier:
        if not upstream.fences_own_shared_writes(name):
            caps = caps.because(
                "WAR barrier kept: the installed worker does not fence its own "
                "req_to_token writes (no verify_done)",
                needs_war_barrier=True,
            )
    if (
        caps.host_seq_lens == "reserved"
        and needs_cpu_seq_lens
        and isinstance(host_bound, HostBound)
    ):
        caps = caps.because(f"reserved host lengths: {host_bound.why}", bound=host_bound)
    elif caps.host_seq_lens != "exact" and needs_cpu_seq_lens:
        why = "an attention backend reads host lengths (needs_cpu_seq_lens)"
        if isinstance(host_bound, str) and caps.host_seq_lens == "reserved":
            why += f", and no bound serves it ({host_bound})"
        refused = (f"{declared.host_word} for {name}: {why}",) if declared.host_word else ()
        caps = caps.because(
            f"exact host lengths: {why}",
            host_seq_lens="exact",
            host_word="",
            refused=caps.refused + refused,
        )
    elif caps.host_seq_lens == "exact" and not needs_cpu_seq_lens and not caps.exact_claimed:
        caps = caps.because("no host lengths: upstream gives none here", host_seq_lens="none")
    return caps


def select_variant(caps: SpecCaps) -> Variant:
    """``barrier_free`` when the step needs neither the WAR barrier nor exact host
    lengths: the fused launch is stream-ordered behind the publish, nothing waits, nothing
    is copied. ``war_guarded`` otherwise: the barrier stays, and exact host lengths come
    from the same launch (``bs + 1`` values, the host waiting for that launch only)."""
    if not caps.needs_war_barrier and caps.host_seq_lens != "exact":
        return "barrier_free"
    return "war_guarded"


def describe(env: Optional[Mapping[str, str]] = None, *, needs_cpu_seq_lens: bool) -> list[dict]:
    """The decision for every known algorithm (``spec-fused doctor``)."""
    rows: list[dict] = []
    for name in known_algorithms():
        if name == "NONE":
            continue
        try:
            caps = decide(name, needs_cpu_seq_lens=needs_cpu_seq_lens, env=env)
        except (KeyError, ValueError) as exc:
            rows.append({"algorithm": name, "error": str(exc).strip('"')})
            continue
        rows.append(
            {
                "algorithm": name,
                "needs_war_barrier": caps.needs_war_barrier,
                "host_seq_lens": caps.host_seq_lens,
                "variant": caps.variant,
                "reason": caps.reason,
                "refused": list(caps.refused),
            }
        )
    return rows
