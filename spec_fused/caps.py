"""What each speculative algorithm needs from the step-to-step length relay.

Upstream PR #29232 set out to replace ``is_dflash()`` special cases in SGLang's shared
scheduler code with per-worker capabilities, deleted the special cases, and never added
the capabilities: since 0.5.15 every algorithm pays the WAR barrier and an exact host
mirror of ``seq_lens``. This module is the missing piece. Two questions decide the relay:

* ``needs_war_barrier``: must the scheduler's next shared-buffer writes wait for this
  forward's reads? (DFLASH plans KV writes from its own reserved allocation, so no.)
* ``host_seq_lens``: what host lengths the step needs: ``"exact"`` (a host copy of the
  device lengths), ``"reserved"`` (the worker plans with its own KV-allocation bound and
  accepts ``seq_lens_cpu=None``), or ``"none"`` (every attention backend opts out).

Precedence, lowest first: the table below < attributes of the spec worker
(``needs_war_barrier``, ``host_seq_lens``, the hook the PR intended) < attention backends
(``needs_cpu_seq_lens``) < environment (``SPEC_FUSED_WAR_BARRIER``,
``SPEC_FUSED_HOST_SEQ_LENS``). NGRAM and two-batch overlap force ``"exact"`` as upstream.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Iterable, Literal, Mapping, Optional

HostSeqLens = Literal["exact", "reserved", "none"]
HOST_SEQ_LENS_VALUES = ("exact", "reserved", "none")
Variant = Literal["barrier_free", "war_guarded"]

ENV_WAR_BARRIER = "SPEC_FUSED_WAR_BARRIER"
ENV_HOST_SEQ_LENS = "SPEC_FUSED_HOST_SEQ_LENS"

__all__ = [
    "SpecCaps",
    "caps_for",
    "describe",
    "establish",
    "installed_algorithms",
    "known_algorithms",
    "register_caps",
    "select_variant",
]


@dataclass(frozen=True)
class SpecCaps:
    needs_war_barrier: bool
    host_seq_lens: HostSeqLens
    reason: str = ""
    # Which layer decided last: "table", "worker", "backends", "env" or "installed".
    source: str = "table"

    def __post_init__(self):
        if self.host_seq_lens not in HOST_SEQ_LENS_VALUES:
            raise ValueError(
                f"host_seq_lens must be one of {HOST_SEQ_LENS_VALUES}, got {self.host_seq_lens!r}")
        if not isinstance(self.needs_war_barrier, bool):
            raise TypeError("needs_war_barrier must be a bool")


_SAFE = "shares the scheduler's buffers and reads exact host lengths: upstream's default"

# Defaults for every builtin SpeculativeAlgorithm member of SGLang 0.5.23, with why.
_TABLE: dict[str, SpecCaps] = {
    # The design PR #29232 meant: DFLASH plans KV from its reserved allocation and fences
    # its own shared req_to_token writes. establish() checks both against the installed
    # worker (0.5.14 fenced with verify_done; 0.5.15+ dropped the fence, so there the
    # barrier stays and only the host-length half applies).
    "DFLASH": SpecCaps(
        False, "reserved",
        "plans verify/draft KV from its reserved allocation (nxt_kv_lens_cpu; "
        "reserved_seq_lens_cpu up to 0.5.18) when "
        "seq_lens_cpu is None (dflash_worker_v2.py); exempt from the WAR barrier before "
        "PR #29232"),
    # DSPARK reuses DFlashDraftInputV2's bound when seq_lens_cpu is None, but its compact
    # KV inject reads req_to_token after verify's read-done (dspark_kv_inject.py) and its
    # ragged-verify confidence relay is gated on publish_ready: kept on upstream's path.
    "DSPARK": SpecCaps(
        True, "exact",
        "dflash family, but its KV inject reads req_to_token after verify's read-done and "
        "its confidence relay gates on publish_ready: upstream's default kept"),
    # UNO has its own reserved_seq_lens_cpu bound (uno_info.py) but was never exempted
    # from the barrier and its bound is not probed here: upstream's default kept.
    "UNO": SpecCaps(True, "exact", "never exempted; its reserved bound is not verified here"),
    "EAGLE": SpecCaps(True, "exact", _SAFE),
    "EAGLE3": SpecCaps(True, "exact", _SAFE),
    # Tolerates seq_lens_cpu=None but then syncs for its own sum (frozen_kv_mtp_worker_v2).
    "FROZEN_KV_MTP": SpecCaps(True, "exact", "EAGLE-family worker (is_eagle()); " + _SAFE),
    "STANDALONE": SpecCaps(True, "exact", "runs the EAGLE v2 verify path; " + _SAFE),
    "NGRAM": SpecCaps(
        True, "exact",
        "USE_FULL_MASK verify sizes the tree mask from seq_lens_cpu on any backend"),
    "NONE": SpecCaps(True, "exact", "non-speculative overlap: no length relay to fuse"),
}
_REGISTERED: dict[str, SpecCaps] = {}


def algorithm_name(algorithm) -> str:
    """``SpeculativeAlgorithm.DFLASH``, a plugin ``CustomSpecAlgo`` or ``"dflash"`` -> ``"DFLASH"``."""
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
    """Declare the capabilities of a plugin algorithm (``SpeculativeAlgorithm.register``)."""
    if not isinstance(caps, SpecCaps):
        raise TypeError("caps must be a SpecCaps")
    _REGISTERED[algorithm_name(name)] = caps


def _table_caps(name: str) -> SpecCaps:
    if name in _REGISTERED:
        return _REGISTERED[name]
    if name in _TABLE:
        return _TABLE[name]
    raise KeyError(
        f"no capabilities for speculative algorithm {name!r}; known: "
        f"{', '.join(sorted(set(_TABLE) | set(_REGISTERED)))}. Plugin algorithms declare "
        f"theirs with spec_fused.caps.register_caps(name, SpecCaps(...))")


def _parse_bool_env(env: Mapping[str, str], key: str) -> Optional[bool]:
    raw = env.get(key)
    if raw is None or raw == "":
        return None
    if raw in ("0", "1"):
        return raw == "1"
    raise ValueError(f"{key}={raw!r} is not valid; allowed values: 0, 1")


def _parse_host_env(env: Mapping[str, str]) -> Optional[str]:
    raw = env.get(ENV_HOST_SEQ_LENS)
    if raw is None or raw == "":
        return None
    if raw.lower() in HOST_SEQ_LENS_VALUES:
        return raw.lower()
    raise ValueError(
        f"{ENV_HOST_SEQ_LENS}={raw!r} is not valid; allowed values: "
        f"{', '.join(HOST_SEQ_LENS_VALUES)}")


def caps_for(algorithm, *, worker=None, attn_backends: Optional[Iterable] = None,
             env: Optional[Mapping[str, str]] = None,
             two_batch_overlap: bool = False) -> SpecCaps:
    """The relay capabilities of ``algorithm`` as it runs here (see the module docstring
    for the precedence). ``attn_backends`` follows SGLang's ``decide_needs_cpu_seq_lens``:
    ``None`` entries are skipped and a backend without the flag counts as needing lengths."""
    name = algorithm_name(algorithm)
    caps = _table_caps(name)
    if worker is not None:
        barrier = getattr(worker, "needs_war_barrier", None)
        host = getattr(worker, "host_seq_lens", None)
        if isinstance(barrier, bool):
            caps = replace(caps, needs_war_barrier=barrier, source="worker",
                           reason=f"{type(worker).__name__}.needs_war_barrier={barrier}")
        if isinstance(host, str):
            caps = replace(caps, host_seq_lens=host, source="worker",
                           reason=f"{type(worker).__name__}.host_seq_lens={host!r}")
    if attn_backends is not None:
        backends = [b for b in attn_backends if b is not None]
        if backends and not any(getattr(b, "needs_cpu_seq_lens", True) for b in backends):
            caps = replace(caps, host_seq_lens="none", source="backends",
                           reason="every attention backend sets needs_cpu_seq_lens=False")
    if name == "NGRAM" or two_batch_overlap:
        why = "NGRAM verify reads seq_lens_cpu" if name == "NGRAM" else \
            "two-batch overlap splits batches on host lengths"
        if caps.host_seq_lens != "exact":
            caps = replace(caps, host_seq_lens="exact", source="backends", reason=why)
    env = os.environ if env is None else env
    barrier = _parse_bool_env(env, ENV_WAR_BARRIER)
    host = _parse_host_env(env)
    if barrier is not None:
        caps = replace(caps, needs_war_barrier=barrier, source="env",
                       reason=f"{ENV_WAR_BARRIER}={int(barrier)}")
    if host is not None:
        caps = replace(caps, host_seq_lens=host, source="env",
                       reason=f"{ENV_HOST_SEQ_LENS}={host}")
    return caps


# ------------------------------------------------------------------ the installed worker


def _module_source(module: str) -> Optional[str]:
    """A module's source text without importing it (the workers pull the model stack)."""
    import importlib.util

    try:
        spec = importlib.util.find_spec(module)
        if spec is None or not spec.origin or not spec.origin.endswith(".py"):
            return None
        with open(spec.origin, encoding="utf-8") as fh:
            return fh.read()
    except Exception:
        return None


# The draft input's KV-allocation bound, by the name each release gives it:
# ``reserved_seq_lens_cpu`` in 0.5.15 ... 0.5.18, ``nxt_kv_lens_cpu`` from 0.5.19 on.
_DFLASH_BOUND_FIELDS = ("nxt_kv_lens_cpu", "reserved_seq_lens_cpu")


def _dflash_plans_with_reserved_bound() -> bool:
    # Every release 0.5.15 ... 0.5.23 has both fallbacks, in the draft plan and in verify:
    #   if batch.seq_lens_cpu is not None: ...
    #   elif draft_input.<bound> is not None:  # "GPU-only backend: reserved is a safe
    #       seq_lens_cpu.copy_(draft_input.<bound>)   over-estimate"
    # (0.5.22+ also plans KV locations from ``... else draft_input.nxt_kv_lens_cpu``).
    worker = _module_source("sglang.srt.speculative.dflash_worker_v2") or ""
    info = _module_source("sglang.srt.speculative.dflash_info_v2") or ""
    if "batch.seq_lens_cpu is not None" not in worker:
        return False
    return any(f"{field}: Optional" in info
               and worker.count(f"elif draft_input.{field} is not None") >= 2
               and f"seq_lens_cpu.copy_(draft_input.{field})" in worker
               for field in _DFLASH_BOUND_FIELDS)


def _dflash_fences_own_shared_writes() -> bool:
    # 0.5.14: the plan stream waits ``verify_done`` before writing req_to_token.
    info = _module_source("sglang.srt.speculative.dflash_info_v2") or ""
    return "verify_done" in info and "wait_event(self.verify_done)" in info


# How the table's two optimistic claims are checked against the installed worker, per
# algorithm; one without a check is held to upstream's (barrier, exact lengths).
_RESERVED_BOUND_CHECKS = {"DFLASH": _dflash_plans_with_reserved_bound}
_FENCE_CHECKS = {"DFLASH": _dflash_fences_own_shared_writes}


def plans_with_reserved_bound(algorithm) -> bool:
    """Whether the installed worker plans with its own KV-allocation bound when
    ``batch.seq_lens_cpu`` is None (DFLASH 0.5.23: ``draft_input.nxt_kv_lens_cpu``)."""
    check = _RESERVED_BOUND_CHECKS.get(algorithm_name(algorithm))
    return bool(check and check())


def fences_own_shared_writes(algorithm) -> bool:
    """Whether the installed worker orders its shared ``req_to_token`` writes behind the
    previous verify itself (DFLASH 0.5.14: the plan stream waits ``verify_done``), so the
    scheduler-wide WAR barrier is redundant for it."""
    check = _FENCE_CHECKS.get(algorithm_name(algorithm))
    return bool(check and check())


def establish(caps: SpecCaps, algorithm) -> SpecCaps:
    """Hold the table and worker layers to what the installed SGLang actually does: skip
    the WAR barrier only for a worker that fences its own shared writes, hand a reserved
    bound only to a worker that plans with one. Only the table's defaults are held to
    account: what a worker declares about itself, or an explicit environment setting, stands."""
    if caps.source != "table":
        return caps
    if not caps.needs_war_barrier and not fences_own_shared_writes(algorithm):
        caps = replace(caps, needs_war_barrier=True, source="installed",
                       reason=_join("WAR barrier kept: the installed worker does not fence "
                                    "its own req_to_token writes (no verify_done)", caps.reason))
    if caps.host_seq_lens == "reserved" and not plans_with_reserved_bound(algorithm):
        caps = replace(caps, host_seq_lens="exact", source="installed",
                       reason=_join("exact host lengths: the installed worker does not plan "
                                    "with a reserved bound", caps.reason))
    return caps


def _join(finding: str, reason: str) -> str:
    return f"{finding}; declared: {reason}" if reason else finding


def select_variant(caps: SpecCaps) -> Variant:
    """``barrier_free`` when the step needs neither the WAR barrier nor exact host lengths:
    the fused launch is stream-ordered behind the publish, nothing waits, nothing is copied.
    ``war_guarded`` otherwise: the barrier stays, and the host lengths are what
    ``host_seq_lens`` says - exact ones come from the same launch (``bs + 1`` values, the
    host waiting for that launch only); a reserved bound or none costs no host wait."""
    if not caps.needs_war_barrier and caps.host_seq_lens != "exact":
        return "barrier_free"
    return "war_guarded"


def describe(env: Optional[Mapping[str, str]] = None) -> list[dict]:
    """The capability table, as declared and as established against the installed SGLang,
    with the chosen variant for every known algorithm (``spec-fused doctor``)."""
    rows = []
    installed = installed_algorithms()
    for name in known_algorithms():
        in_sglang = installed is None or name in installed or name in _REGISTERED
        try:
            declared = caps_for(name, env=env)
        except (KeyError, ValueError) as exc:
            rows.append({"algorithm": name, "error": str(exc).strip('"'),
                         "in_sglang": in_sglang})
            continue
        caps = establish(declared, name)
        reason = caps.reason if in_sglang else f"not in the installed SGLang; {caps.reason}"
        rows.append({"algorithm": name, "needs_war_barrier": caps.needs_war_barrier,
                     "host_seq_lens": caps.host_seq_lens, "variant": select_variant(caps),
                     "declared": f"{declared.needs_war_barrier}/{declared.host_seq_lens}",
                     "reason": reason, "in_sglang": in_sglang})
    return rows
