"""What each speculative algorithm needs from the step-to-step length relay.

Upstream PR #29232 set out to replace ``is_dflash()`` special cases in SGLang's shared
scheduler code with per-worker capabilities, deleted the special cases, and never added
the capabilities: since 0.5.15 every algorithm pays the WAR barrier and an exact host
mirror of ``seq_lens``. This module is the missing piece. Two claims decide the relay:

* ``needs_war_barrier``: must the scheduler's next shared-buffer writes wait for this
  forward's reads?
* ``host_seq_lens``: what host lengths the step needs: ``"exact"`` (a host copy of the
  device lengths), ``"reserved"`` (the worker plans with its own KV-allocation bound and
  accepts ``seq_lens_cpu=None``), or ``"none"`` (every attention backend opts out).

Each claim keeps the layer that set it, because each is held to account on its own.
Layers, lowest first: the table below < the spec worker's own attributes
(``needs_war_barrier``, ``host_seq_lens``: the hook the PR intended) < the attention
backends (``needs_cpu_seq_lens``, host lengths only) - except that a worker speaks for
itself, not for the backends: its ``"exact"`` stands where they opt out (and under
what upstream forces, which it agrees with), and its ``"reserved"``/``"none"`` is refused
where one reads host lengths - < what upstream forces (NGRAM and two-batch overlap: exact
host lengths, which nothing below may lift) < the environment
(``SPEC_FUSED_WAR_BARRIER``, ``SPEC_FUSED_HOST_SEQ_LENS``; a host-length override that
is not safe for the configuration is refused and recorded in ``refused``). Then
:func:`establish` holds every claim that still comes from the table to the installed
worker: the barrier is dropped only where the worker fences its own shared writes, the
worker itself declares ``needs_war_barrier=False``, or ``SPEC_FUSED_WAR_BARRIER=0``; host
lengths are left out only where upstream leaves them out too.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Literal, Optional, cast

from spec_fused import settings, upstream

HostSeqLens = Literal["exact", "reserved", "none"]
HOST_SEQ_LENS_VALUES = ("exact", "reserved", "none")
Variant = Literal["barrier_free", "war_guarded"]
# Where a claim came from. "forced": upstream forces it (nothing may lift it).
SOURCES = ("table", "worker", "backends", "forced", "installed", "env")

ENV_WAR_BARRIER = settings.WAR_BARRIER.name
ENV_HOST_SEQ_LENS = settings.HOST_SEQ_LENS.name

__all__ = [
    "SpecCaps",
    "caps_for",
    "decide",
    "describe",
    "establish",
    "installed_algorithms",
    "known_algorithms",
    "register_caps",
    "select_variant",
]


@dataclass(frozen=True)
class SpecCaps:
    """The two claims, each with the layer that set it and why."""

    needs_war_barrier: bool
    host_seq_lens: HostSeqLens
    reason: str = ""  # the declaration's reason (both claims), as the table gives it
    barrier_source: str = "table"
    host_source: str = "table"
    barrier_reason: Optional[str] = None  # None: ``reason``
    host_reason: Optional[str] = None
    refused: tuple = ()  # overrides that were not applied, each with why

    def __post_init__(self):
        if self.host_seq_lens not in HOST_SEQ_LENS_VALUES:
            raise ValueError(
                f"host_seq_lens must be one of {HOST_SEQ_LENS_VALUES}, got {self.host_seq_lens!r}"
            )
        if not isinstance(self.needs_war_barrier, bool):
            raise TypeError("needs_war_barrier must be a bool")
        for source in (self.barrier_source, self.host_source):
            if source not in SOURCES:
                raise ValueError(f"unknown claim source {source!r}; one of {SOURCES}")

    def why_barrier(self) -> str:
        return self.reason if self.barrier_reason is None else self.barrier_reason

    def why_host(self) -> str:
        return self.reason if self.host_reason is None else self.host_reason

    @property
    def source(self) -> str:
        return f"barrier:{self.barrier_source} host:{self.host_source}"

    def explain(self) -> str:
        """One line: both claims, where each came from and why (doctor, logs)."""
        barrier, host = self.why_barrier(), self.why_host()
        if barrier == host:
            text = f"{barrier} [{self.source}]"
        else:
            text = (
                f"barrier ({self.barrier_source}): {barrier}; host lengths "
                f"({self.host_source}): {host}"
            )
        if self.refused:
            text += "; refused: " + "; ".join(self.refused)
        return text

    def with_barrier(self, value: bool, source: str, why: str) -> SpecCaps:
        return replace(self, needs_war_barrier=value, barrier_source=source, barrier_reason=why)

    def with_host(self, value: HostSeqLens, source: str, why: str) -> SpecCaps:
        return replace(self, host_seq_lens=value, host_source=source, host_reason=why)


_SAFE = "shares the scheduler's buffers and reads exact host lengths: upstream's default"

# Defaults for every builtin SpeculativeAlgorithm member of SGLang 0.5.23, with why.
_TABLE: dict[str, SpecCaps] = {
    # The design PR #29232 meant: DFLASH plans KV from its reserved allocation and fences
    # its own shared req_to_token writes. establish() checks both claims against the
    # installed worker (0.5.14 fenced with verify_done; 0.5.15+ dropped the fence, so
    # there the barrier stays and only the host-length half applies).
    "DFLASH": SpecCaps(
        False,
        "reserved",
        "plans verify/draft KV from its reserved allocation (nxt_kv_lens_cpu; "
        "reserved_seq_lens_cpu up to 0.5.18) when seq_lens_cpu is None "
        "(dflash_worker_v2.py); exempt from the WAR barrier before PR #29232",
    ),
    # DSPARK reuses DFlashDraftInputV2's bound when seq_lens_cpu is None, but its compact
    # KV inject reads req_to_token after verify's read-done (dspark_kv_inject.py) and its
    # ragged-verify confidence relay is gated on publish_ready: kept on upstream's path.
    "DSPARK": SpecCaps(
        True,
        "exact",
        "dflash family, but its KV inject reads req_to_token after verify's read-done and "
        "its confidence relay gates on publish_ready: upstream's default kept",
    ),
    # UNO has its own reserved_seq_lens_cpu bound (uno_info.py) but was never exempted
    # from the barrier and its bound is not probed here: upstream's default kept.
    "UNO": SpecCaps(True, "exact", "never exempted; its reserved bound is not verified here"),
    "EAGLE": SpecCaps(True, "exact", _SAFE),
    "EAGLE3": SpecCaps(True, "exact", _SAFE),
    # Tolerates seq_lens_cpu=None but then syncs for its own sum (frozen_kv_mtp_worker_v2).
    "FROZEN_KV_MTP": SpecCaps(True, "exact", "EAGLE-family worker (is_eagle()); " + _SAFE),
    "STANDALONE": SpecCaps(True, "exact", "runs the EAGLE v2 verify path; " + _SAFE),
    # Upstream's decide_needs_cpu_seq_lens forces host lengths for NGRAM on any backend.
    "NGRAM": SpecCaps(
        True,
        "exact",
        "USE_FULL_MASK verify sizes the tree mask from seq_lens_cpu on any backend "
        "(upstream forces host lengths for NGRAM)",
        host_source="forced",
    ),
    "NONE": SpecCaps(True, "exact", "non-speculative overlap: no length relay to fuse"),
}
_REGISTERED: dict[str, SpecCaps] = {}


def algorithm_name(algorithm) -> str:
    """``SpeculativeAlgorithm.DFLASH``, a plugin ``CustomSpecAlgo`` or ``"dflash"``:
    ``"DFLASH"``."""
    if algorithm is None:
        return "NONE"
    if isinstance(algorithm, str):
        return algorithm.upper()
    name = getattr(algorithm, "name", None)
    if isinstance(name, str):
        return name.upper()
    raise TypeError(f"cannot name speculative algorithm {algorithm!r}")


def installed_algorithms() -> Optional[list[str]]:
    """The installed SGLang's ``SpeculativeAlgorithm`` members, or None without SGLang."""
    try:
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

        return [m.name for m in SpeculativeAlgorithm]
    except Exception:
        return None


def known_algorithms() -> list[str]:
    names = dict.fromkeys(_TABLE)
    # every member of the installed SGLang, so a new member is visible (and refused)
    names.update(dict.fromkeys(installed_algorithms() or ()))
    names.update(dict.fromkeys(_REGISTERED))
    return list(names)


def register_caps(name: str, caps: SpecCaps) -> None:
    """Declare the capabilities of a plugin algorithm (``SpeculativeAlgorithm.register``).
    Its author speaks for its worker, so both claims count as the worker's own."""
    if not isinstance(caps, SpecCaps):
        raise TypeError("caps must be a SpecCaps")
    _REGISTERED[algorithm_name(name)] = replace(
        caps,
        barrier_source="worker" if caps.barrier_source == "table" else caps.barrier_source,
        host_source="worker" if caps.host_source == "table" else caps.host_source,
    )


def _table_caps(name: str) -> SpecCaps:
    if name in _REGISTERED:
        return _REGISTERED[name]
    if name in _TABLE:
        return _TABLE[name]
    raise KeyError(
        f"no capabilities for speculative algorithm {name!r}; known: "
        f"{', '.join(sorted(set(_TABLE) | set(_REGISTERED)))}. Plugin algorithms declare "
        f"theirs with spec_fused.caps.register_caps(name, SpecCaps(...))"
    )


def _parse_bool_env(env: Mapping[str, str], key: str) -> Optional[bool]:
    raw = env.get(key)
    if raw is None or raw == "":
        return None
    if raw in ("0", "1"):
        return raw == "1"
    raise ValueError(f"{key}={raw!r} is not valid; allowed values: 0, 1")


def _parse_host_env(env: Mapping[str, str]) -> Optional[HostSeqLens]:
    raw = env.get(ENV_HOST_SEQ_LENS)
    if raw is None or raw == "":
        return None
    if raw.lower() in HOST_SEQ_LENS_VALUES:
        return cast(HostSeqLens, raw.lower())
    raise ValueError(
        f"{ENV_HOST_SEQ_LENS}={raw!r} is not valid; allowed values: "
        f"{', '.join(HOST_SEQ_LENS_VALUES)}"
    )


def _backends_need_host_lengths(attn_backends: Optional[Iterable]) -> Optional[bool]:
    """SGLang's ``decide_needs_cpu_seq_lens`` OR (None entries skipped, a backend without
    the flag needs lengths); None when the backends are not known."""
    if attn_backends is None:
        return None
    backends = [b for b in attn_backends if b is not None]
    if not backends:
        return None
    return any(getattr(b, "needs_cpu_seq_lens", True) for b in backends)


def _unsafe_host_override(
    value: str, caps: SpecCaps, backends_need: Optional[bool]
) -> Optional[str]:
    """Why host lengths ``value`` (a worker's declaration, ``SPEC_FUSED_HOST_SEQ_LENS``)
    are not safe here, or None when they are.
    Exact host lengths are always safe; anything less only where upstream itself would
    hand the step no host lengths (every attention backend opts out), nothing forces
    them, and the worker has not said it needs them."""
    if value == "exact":
        return None
    if caps.host_source == "forced":
        return f"{caps.why_host()}"
    if caps.host_source == "worker" and caps.host_seq_lens == "exact":
        return f"the worker needs exact host lengths ({caps.why_host()})"
    if backends_need is None:
        return "the attention backends' need for host lengths is not known here"
    if backends_need:
        return "an attention backend reads host lengths (needs_cpu_seq_lens)"
    return None


def caps_for(
    algorithm,
    *,
    worker=None,
    attn_backends: Optional[Iterable] = None,
    env: Optional[Mapping[str, str]] = None,
    two_batch_overlap: Optional[bool] = False,
) -> SpecCaps:
    """The relay capabilities of ``algorithm`` as declared by every layer (see the module
    docstring for the order). ``two_batch_overlap=None`` means it could not be told, and
    counts as on: exact host lengths, as upstream forces them under TBO."""
    name = algorithm_name(algorithm)
    caps = _table_caps(name)
    backends_need = _backends_need_host_lengths(attn_backends)
    if worker is not None:
        barrier = getattr(worker, "needs_war_barrier", None)
        host = getattr(worker, "host_seq_lens", None)
        who = type(worker).__name__
        if isinstance(barrier, bool):
            caps = caps.with_barrier(barrier, "worker", f"{who}.needs_war_barrier={barrier}")
        # a forced "exact" (NGRAM) still lets the worker say it plans with exact lengths,
        # which then reach the batch whatever the backends need
        if isinstance(host, str) and (caps.host_source != "forced" or host == "exact"):
            caps = caps.with_host(
                cast(HostSeqLens, host),
                "worker",  # the worker's word
                f"{who}.host_seq_lens={host!r}",
            )
    if caps.host_source == "worker":
        # A worker (or a registered plugin algorithm) speaks for itself, not for the
        # attention backends: it cannot take away host lengths a backend reads - the
        # same rule as for SPEC_FUSED_HOST_SEQ_LENS.
        unsafe = _unsafe_host_override(caps.host_seq_lens, caps, backends_need)
        if unsafe is not None:
            caps = replace(
                caps.with_host("exact", "backends", unsafe),
                refused=caps.refused + (f"{caps.why_host()} for {name}: {unsafe}",),
            )
    if backends_need is False and caps.host_source not in ("forced", "worker"):
        caps = caps.with_host(
            "none", "backends", "every attention backend sets needs_cpu_seq_lens=False"
        )
    if two_batch_overlap is not False and not (
        caps.host_source == "worker" and caps.host_seq_lens == "exact"
    ):
        caps = caps.with_host(
            "exact",
            "forced",
            "two-batch overlap splits batches on host lengths (upstream forces them)"
            if two_batch_overlap
            else "two-batch overlap could not be ruled out",
        )
    env = settings.source(env)
    barrier = _parse_bool_env(env, ENV_WAR_BARRIER)
    host = _parse_host_env(env)
    if barrier is not None:
        caps = caps.with_barrier(barrier, "env", f"{ENV_WAR_BARRIER}={int(barrier)}")
    if host is not None:
        unsafe = _unsafe_host_override(host, caps, backends_need)
        if unsafe is None:
            caps = caps.with_host(host, "env", f"{ENV_HOST_SEQ_LENS}={host}")
        else:
            caps = replace(
                caps, refused=caps.refused + (f"{ENV_HOST_SEQ_LENS}={host} for {name}: {unsafe}",)
            )
    return caps


def establish(caps: SpecCaps, algorithm) -> SpecCaps:
    """Hold every claim that still comes from the table to what the installed SGLang
    actually does. A claim set by a later layer (the worker's own declaration, the
    backends, upstream's forcing, an explicit environment setting) stands, whatever
    happened to the other claim.

    * The WAR barrier is skipped only for a worker that fences its own shared writes
      (DFLASH 0.5.14's ``verify_done``; no release from 0.5.15 on has it).
    * A reserved bound from the table becomes exact host lengths. Upstream hands its
      workers the bound only where ``seq_lens_cpu`` is None, i.e. where every attention
      backend opts out of host lengths ("GPU-only backend: reserved is a safe
      over-estimate", dflash_worker_v2.py) - and there the backends layer has already
      made the claim ``none``. Where a backend reads host lengths, upstream gives exact
      ones (the worker plans with committed + one verify block), and so does this."""
    name = algorithm_name(algorithm)
    if (
        caps.barrier_source == "table"
        and not caps.needs_war_barrier
        and not upstream.fences_own_shared_writes(name)
    ):
        caps = caps.with_barrier(
            True,
            "installed",
            "WAR barrier kept: the installed worker does not fence its "
            "own req_to_token writes (no verify_done)",
        )
    if caps.host_source == "table" and caps.host_seq_lens == "reserved":
        bound = upstream.plans_with_reserved_bound(name)
        caps = caps.with_host(
            "exact",
            "installed",
            "exact host lengths: the installed worker plans with its "
            "reserved bound only where every attention backend opts out "
            "of host lengths"
            if bound
            else "exact host lengths: the installed worker does not plan with a reserved bound",
        )
    return caps


def decide(
    algorithm,
    *,
    worker=None,
    attn_backends: Optional[Iterable] = None,
    env: Optional[Mapping[str, str]] = None,
    two_batch_overlap: Optional[bool] = False,
) -> SpecCaps:
    """What production runs: :func:`caps_for` held to the installed worker by
    :func:`establish`. The scheduler patch, the relay, the benchmarks and ``doctor`` all
    take their decision from here."""
    return establish(
        caps_for(
            algorithm,
            worker=worker,
            attn_backends=attn_backends,
            env=env,
            two_batch_overlap=two_batch_overlap,
        ),
        algorithm,
    )


def select_variant(caps: SpecCaps) -> Variant:
    """``barrier_free`` when the step needs neither the WAR barrier nor exact host lengths:
    the fused launch is stream-ordered behind the publish, nothing waits, nothing is copied.
    ``war_guarded`` otherwise: the barrier stays, and the host lengths are what
    ``host_seq_lens`` says - exact ones come from the same launch (``bs + 1`` values, the
    host waiting for that launch only); a reserved bound or none costs no host wait."""
    if not caps.needs_war_barrier and caps.host_seq_lens != "exact":
        return "barrier_free"
    return "war_guarded"


def describe(
    env: Optional[Mapping[str, str]] = None,
    *,
    attn_backends=None,
    two_batch_overlap: Optional[bool] = False,
) -> list[dict]:
    """The capability table, as declared and as established against the installed SGLang,
    with the chosen variant for every known algorithm (``spec-fused doctor``)."""
    rows = []
    installed = installed_algorithms()
    for name in known_algorithms():
        in_sglang = installed is None or name in installed or name in _REGISTERED
        try:
            declared = caps_for(
                name, env=env, attn_backends=attn_backends, two_batch_overlap=two_batch_overlap
            )
        except (KeyError, ValueError) as exc:
            rows.append({"algorithm": name, "error": str(exc).strip('"'), "in_sglang": in_sglang})
            continue
        caps = establish(declared, name)
        reason = caps.explain()
        if not in_sglang:
            reason = f"not in the installed SGLang; {reason}"
        rows.append(
            {
                "algorithm": name,
                "needs_war_barrier": caps.needs_war_barrier,
                "host_seq_lens": caps.host_seq_lens,
                "variant": select_variant(caps),
                "declared": f"{declared.needs_war_barrier}/{declared.host_seq_lens}",
                "barrier_source": caps.barrier_source,
                "host_source": caps.host_source,
                "refused": list(caps.refused),
                "reason": reason,
                "in_sglang": in_sglang,
            }
        )
    return rows
