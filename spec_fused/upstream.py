"""Facts about the installed SGLang, read from its own source and its own settings.

Why a module of its own: every wait, fence, barrier or copy spec_fused leaves out must
follow from something the installed release actually does, not from what a table says
it should do. The questions are few and each is answered here by reading the release
(its source text, or the server setting the way the release itself reads it):

* does the DFLASH worker plan with its own KV-allocation bound when
  ``batch.seq_lens_cpu`` is None (the "reserved" host lengths)?
* does it fence its own ``req_to_token`` writes behind the previous verify (0.5.14's
  ``verify_done``), which is what made skipping the scheduler's WAR barrier safe?
* is two-batch overlap on (upstream forces exact host lengths under it)?
* is SGLang's own debug mode on, and does its FutureMap poison consumed seq-lens rows
  (so spec_fused's debug mode poisons the same rows)?

Nothing here imports a worker (they pull the model stack): source is read as text.
"""

from __future__ import annotations

import importlib.util
import inspect
from typing import Optional

from spec_fused import settings

__all__ = [
    "confidential_compute",
    "debug_enabled",
    "fences_own_shared_writes",
    "module_source",
    "plans_with_reserved_bound",
    "scheduler_gpu_id",
    "two_batch_overlap",
]


def module_source(module: str) -> Optional[str]:
    """A module's source text without importing it, or None."""
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
DFLASH_BOUND_FIELDS = ("nxt_kv_lens_cpu", "reserved_seq_lens_cpu")


def _dflash_plans_with_reserved_bound() -> bool:
    # Every release 0.5.15 ... 0.5.23 has both fallbacks, in the draft plan and in verify:
    #   if batch.seq_lens_cpu is not None: ...   (itself a bound: + one verify block)
    #   elif draft_input.<bound> is not None:  # "GPU-only backend: reserved is a safe
    #       seq_lens_cpu.copy_(draft_input.<bound>)   over-estimate"
    worker = module_source("sglang.srt.speculative.dflash_worker_v2") or ""
    info = module_source("sglang.srt.speculative.dflash_info_v2") or ""
    if "batch.seq_lens_cpu is not None" not in worker:
        return False
    return any(
        f"{field}: Optional" in info
        and worker.count(f"elif draft_input.{field} is not None") >= 2
        and f"seq_lens_cpu.copy_(draft_input.{field})" in worker
        for field in DFLASH_BOUND_FIELDS
    )


def _dflash_fences_own_shared_writes() -> bool:
    # 0.5.14: the plan stream waits ``verify_done`` before writing req_to_token.
    info = module_source("sglang.srt.speculative.dflash_info_v2") or ""
    return "verify_done" in info and "wait_event(self.verify_done)" in info


# Per algorithm, how each optimistic claim is checked against the installed worker; an
# algorithm without a check never gets the claim from the table.
_RESERVED_BOUND_CHECKS = {"DFLASH": _dflash_plans_with_reserved_bound}
_FENCE_CHECKS = {"DFLASH": _dflash_fences_own_shared_writes}


def plans_with_reserved_bound(name: str) -> bool:
    """Whether the installed worker of ``name`` plans with its own KV-allocation bound
    when ``batch.seq_lens_cpu`` is None (DFLASH 0.5.23: ``draft_input.nxt_kv_lens_cpu``)."""
    check = _RESERVED_BOUND_CHECKS.get(name)
    return bool(check and check())


def fences_own_shared_writes(name: str) -> bool:
    """Whether the installed worker of ``name`` orders its shared ``req_to_token`` writes
    behind the previous verify itself (DFLASH 0.5.14: the plan stream waits
    ``verify_done``), so the scheduler-wide WAR barrier is redundant for it."""
    check = _FENCE_CHECKS.get(name)
    return bool(check and check())


# ----------------------------------------------------------------- two-batch overlap

# How each release reads the flag in ``decide_needs_cpu_seq_lens`` (overlap_utils.py):
# 0.5.15 ... 0.5.18 take the ServerArgs, 0.5.19 on read the published runtime config.
TBO_FROM_SERVER_ARGS = "server_args.enable_two_batch_overlap"
TBO_FROM_EXEC = "get_exec().overlap.enable_two_batch_overlap"


def tbo_accessor() -> Optional[str]:
    """Which of the two forms the installed ``decide_needs_cpu_seq_lens`` uses, or None."""
    try:
        from sglang.srt.managers import overlap_utils

        src = inspect.getsource(overlap_utils.decide_needs_cpu_seq_lens)
    except Exception:
        return None
    for form in (TBO_FROM_EXEC, TBO_FROM_SERVER_ARGS):
        if form in src:
            return form
    return None


def two_batch_overlap(server_args=None) -> tuple[Optional[bool], str]:
    """``(on, how)``: whether the running server has two-batch overlap on, read the way
    the installed release reads it, and how that was found. ``on`` is None when it
    cannot be told (callers then force exact host lengths, as upstream does under TBO).

    A process with no server configuration published (a test, a benchmark, a tool) has
    no two-batch overlap: there is no batch for it to split."""
    form = tbo_accessor()
    if form == TBO_FROM_EXEC:
        try:
            from sglang.srt.runtime_context import get_exec

            return bool(get_exec().overlap.enable_two_batch_overlap), form
        except ValueError as exc:
            if "not published" in str(exc):
                return False, f"{form}: no server config published in this process"
            return None, f"{form} failed ({exc})"
        except Exception as exc:
            return None, f"{form} failed ({type(exc).__name__}: {exc})"
    if form == TBO_FROM_SERVER_ARGS:
        if server_args is None:
            server_args = _global_server_args()
        if server_args is None:
            return False, f"{form}: no server arguments in this process"
        value = getattr(server_args, "enable_two_batch_overlap", None)
        if isinstance(value, bool):
            return value, form
        return None, f"{form} is {value!r}"
    return (
        None,
        "this SGLang's decide_needs_cpu_seq_lens reads two-batch overlap in a "
        "way spec_fused does not know",
    )


def _global_server_args():
    try:
        from sglang.srt.server_args import get_global_server_args

        return get_global_server_args()
    except Exception:
        return None


# ----------------------------------------------------------------- debug mode


def debug_enabled() -> bool:
    """``SPEC_FUSED_DEBUG=1``, or SGLang's own CI switch (``SGLANG_IS_IN_CI``) where the
    installed FutureMap itself tracks seq-lens consumption (0.5.23 does: poisoned init and
    consume-once; 0.5.15 only tracks output tokens), so both sides poison the same rows."""
    if settings.DEBUG.on():
        return True
    return sglang_tracks_seq_lens()


def sglang_tracks_seq_lens() -> bool:
    """SGLang's own debug mode is on and its FutureMap poisons the seq-lens relay itself."""
    return sglang_debug_assert() and sglang_poisons_seq_lens()


def sglang_debug_assert() -> bool:
    try:
        from sglang.srt.managers import overlap_utils

        return bool(getattr(overlap_utils, "_DEBUG_ASSERT", False))
    except Exception:
        return False


def sglang_poisons_seq_lens() -> bool:
    try:
        from sglang.srt.managers import overlap_utils

        return "self.new_seq_lens_buf = torch.full(" in inspect.getsource(
            overlap_utils.FutureMap.__init__
        )
    except Exception:
        return False


def confidential_compute() -> bool:
    """Whether SGLang runs this host as NVIDIA Confidential Computing, by SGLang's own
    check (``sglang.srt.utils.common.is_confidential_compute``, overridable with
    ``SGLANG_FORCE_CONFIDENTIAL_COMPUTE``): SGLang turns pinned memory off there. A
    release without the check pins memory under CC itself: False."""
    try:
        from sglang.srt.utils.common import is_confidential_compute
    except Exception:
        return False
    try:
        return bool(is_confidential_compute())
    except Exception:
        return False


def scheduler_gpu_id() -> Optional[int]:
    """This scheduler process's GPU, before the scheduler is built: 0.5.23 publishes it
    in its runtime context (``run_scheduler_process`` -> ``publish``) before it calls
    ``Scheduler(server_args, port_args)``; older releases pass ``gpu_id`` to
    ``Scheduler.__init__`` instead (read there). None where neither says."""
    try:
        from sglang.srt.runtime_context import get_device

        gpu_id = get_device().gpu_id
    except Exception:
        return None
    return gpu_id if isinstance(gpu_id, int) else None
