"""DFLASH's own bound on FlashInfer: where planning from it is safe, and the guards it needs.

Why: from SGLang 0.5.19 a graphed DFLASH verify (the target's and the draft's, both
``DFLASH_VERIFY`` forwards) plans FlashInfer's fa2 prefill from host lengths with
``fast_prefill_plan``, no readback; with ``seq_lens_cpu`` None the worker hands it its KV
allocation watermark (``nxt_kv_lens_cpu``) instead. So where every backend that reads
host lengths is such a FlashInfer backend (:func:`host_bound`), the FutureMap's pool copy
and host wait can go - if a plan from the bound is the same attention. Two guards make it
so, per plan.

**The partition.** A plan from an upper bound is not, by itself, the same attention. fa2
takes each request's KV length from the device and clamps every chunk to it, but under
CUDA graphs it always splits KV, counts a request's chunks from the HOST length for the
plan's work list and merge (``merge_indptr``), and lays the request's partial outputs out
by the DEVICE length's count (FlashInfer 0.7.2: ``scheduler.cuh`` 646-670 against
``prefill.cuh`` 4293-4335; mirrored in ``bench/fa2_split.py``). Where a multiple of the
chunk lies between the two, every query row of the request merges the wrong partial
states, with no fault to show it. (Upstream's #32417 rests on the same premise.) So each
plan reads the chunk it chose back from its pinned buffer (written on the host, no sync)
and checks every request's window: the host committed length + the verify block (the
device is never behind it) up to the bound. Where a chunk boundary falls inside one, the
plan is made again from the exact lengths, read in the resolve stream's order: one host
wait for the step's publish, as SGLang's own resolve makes; ``replans`` counts them. The
check reads only the layout of FlashInfer versions read for it (:data:`FLASHINFER_READ`).

**The pinned buffer.** ``fast_prefill_plan`` writes its work list into the wrapper's one
pinned buffer and enqueues an async H2D copy of it with no sync; wrappers are reused per
batch size. Today the FutureMap's host wait (after forward N's publish point) orders step
N+1's plan after forward N's copy; without it the host can rewrite that buffer while the
copy still waits behind forward N-1, and verify N runs on step N+1's plan or a torn one
(mini-sglang #103). Guarded, each plan takes the next of a few pinned buffers, and an
event recorded after its copy says when that buffer may be written again. A buffer comes
back ``RING`` plans later (two steps of two plans): by then the overlap loop has waited
for step N-1's results (``copy_done``), so its copy has run and the wait never blocks;
``waits`` counts the times it did. A ring, not a twin per wrapper: SGLang pins 8 MiB per
wrapper, one per captured batch size and runner, and a twin each would double that. A
replan rewrites its buffer while the first copy may be pending; both copies run, in
order, before the kernel, and the second is the exact plan.

SGLang binds ``fast_prefill_plan`` with ``functools.partial`` at capture and checks
``begin_forward.func is fast_prefill_plan`` on every replay, so the guard replaces the
module's global when the module is imported (before any capture), inert until a relay
arms it, and is never restored: restoring it under live graphs would break that check.
"""

from __future__ import annotations

import logging
import sys
from typing import Optional

import torch

from spec_fused.caps import HostBound
from spec_fused.faults import raise_if_sticky
from spec_fused.integration import code_check

logger = logging.getLogger("spec_fused")

MODULE = "sglang.srt.layers.attention.flashinfer_backend"
WORKER = "sglang.srt.speculative.dflash_worker_v2"  # SGLang's DFLASH worker (spec v2)
RING = 4  # pinned buffers per size: two steps of two plans (the draft's and the verify's)
# The releases whose code plans a graphed DFLASH verify from host lengths with no readback
# (read from each wheel: tests/test_compat.py). 0.5.15-0.5.18 plan it with the stock
# plan(), which copies the device indptr to the host: those wait anyway.
BOUND_RELEASES = ("0.5.19", "0.5.20", "0.5.21", "0.5.22", "0.5.23")
# The FlashInfer versions whose fa2 plan (the 15-entry PrefillPlanInfo, kv_chunk_size at
# the offset of its entry 9, split_kv its entry 14), kernel layout and merge were read for
# the partition guard (bench/fa2_split.py). 0.7.1 (SGLang 0.5.22's pin) and 0.7.2.post1
# hold byte-identical plan, kernel and merge sources and the same 20-argument plan. Not
# 0.7.4: the same layout, but its plan takes 21 arguments, so SGLang's fast_prefill_plan
# fails there; nor 0.6.18 (0.5.19-0.5.21's pin): an empty partial state merges as NaN.
FLASHINFER_READ = ("0.7.1", "0.7.2", "0.7.2.post1")

__all__ = [
    "BOUND_RELEASES",
    "FLASHINFER_READ",
    "arm",
    "expect",
    "flashinfer_refusal",
    "guard_stats",
    "guarded",
    "host_bound",
    "patch",
    "straddles",
]

_state: dict = {"armed": False, "installed": None, "plans": 0, "waits": 0, "checked": 0}
_state.update(replans=0, step=None)  # step: what this step's plans check against (BoundStep)
_rings: dict = {}
_event = torch.cuda.Event  # the guard's events (a CPU test stands in for them)


class _Ring:
    """``RING`` pinned buffers shaped like one wrapper's, each with the event of its last
    copy; :meth:`take` hands out the next one once that copy has run."""

    def __init__(self, like: torch.Tensor):
        pin = like.is_pinned()
        self.buffers = [torch.empty_like(like, pin_memory=pin) for _ in range(RING)]
        self.events: list = [None] * RING
        self.next = 0

    def take(self) -> int:
        i, self.next = self.next, (self.next + 1) % RING
        event = self.events[i]
        if event is not None and not event.query():  # its copy may still be pending
            _state["waits"] += 1
            event.synchronize()
        return i

    def recorded(self, i: int) -> None:
        """After the plan: the event follows its copy on the plan's (the current) stream."""
        event = self.events[i] = self.events[i] or _event()
        event.record()


def guarded(original):
    """``original`` (SGLang's ``fast_prefill_plan``), planning into the ring once armed."""

    def fast_prefill_plan(self, *args, **kwargs):
        if not _state["armed"]:
            return original(self, *args, **kwargs)
        pinned = self._pin_memory_int_workspace_buffer
        key = (pinned.numel(), pinned.dtype)
        ring = _rings.get(key) or _rings.setdefault(key, _Ring(pinned))
        i = ring.take()
        self._pin_memory_int_workspace_buffer = ring.buffers[i]
        _state["plans"] += 1
        try:
            original(self, *args, **kwargs)
            step = _state["step"]
            if step is not None and _disagrees(self, kwargs, step.lower):
                _state["replans"] += 1
                original(self, *args, **_exact(kwargs, step.exact))
        finally:  # also when it raised: an event after nothing is harmless
            ring.recorded(i)

    fast_prefill_plan.__wrapped__ = original  # type: ignore[attr-defined]
    fast_prefill_plan.__doc__ = original.__doc__
    return fast_prefill_plan


def straddles(lower, upper, chunk: int) -> bool:
    """Whether a request whose KV length lies in ``[lower, upper]`` may have another number
    of ``chunk``-token chunks than ``upper`` (what a plan from it counted), or ``upper`` is
    below its floor: fa2's kernel lays partial outputs out by the device length's count
    (``prefill.cuh`` 4293), its merge by the plan's (``scheduler.cuh`` 651-669)."""
    return bool((((lower - 1) // chunk != (upper - 1) // chunk) | (lower > upper)).any())


def _planned_chunk(w) -> Optional[int]:
    """The split-KV chunk the plan just chose (None: it did not split), read from the host
    side of the int workspace it wrote: ``PrefillPlanInfo`` entry 9 is its offset, 14 the
    split flag (FlashInfer 0.7.2 ``scheduler.cuh`` 720-736, 845)."""
    info = w._plan_info
    if not info[14]:
        return None
    at = int(info[9])
    raw = w._pin_memory_int_workspace_buffer[at : at + 4].numpy().tobytes()
    return int.from_bytes(raw, "little", signed=True)


def _disagrees(w, kwargs, lower) -> bool:
    """Whether the plan just made may partition a request otherwise than the kernel will
    (:func:`straddles`), for the step's requests (the rows after them: graph padding,
    planned from the same values as SGLang's exact plan)."""
    chunk = _planned_chunk(w)
    _state["checked"] += 1
    if chunk is None or chunk >= kwargs["max_kv_len"]:
        return False  # one chunk per request, whatever its length up to the bound
    indptr, n = kwargs["kv_indptr_host"], lower.shape[0]
    if indptr.shape[0] <= n:
        raise RuntimeError(f"a plan of {indptr.shape[0] - 1} requests in a step of {n}")
    return straddles(lower, indptr[1 : n + 1] - indptr[:n], chunk)


def _exact(kwargs: dict, exact) -> dict:
    """``call_begin_forward``'s host layout, the step's requests' lengths made exact."""
    lens = kwargs["kv_lens_host"].clone()
    lens[: exact.shape[0]] = exact
    indptr = torch.zeros_like(kwargs["kv_indptr_host"])
    indptr[1:] = torch.cumsum(lens, 0)
    return {**kwargs, "kv_lens_host": lens, "kv_indptr_host": indptr, "max_kv_len": int(lens.max())}


def arm() -> None:
    """A relay planning from the bound starts: every later plan is guarded."""
    _state["armed"] = True


def expect(step) -> None:
    """This step's plans are from the bound, with ``step``'s floor (``caps.BoundStep``), or
    from exact lengths (None); the relay says which at every resolve."""
    _state["step"] = step


def guard_stats() -> dict:
    """Guarded plans, the times one waited for a pending copy (should stay 0), the plans
    checked for their partition and those replanned from exact lengths (one wait each)."""
    keys = ("armed", "plans", "waits", "checked", "replans")
    return {k: _state[k] for k in keys} | {"installed": is_installed()}


def is_installed() -> bool:
    return _state["installed"] is not None


def patch(module, version: str) -> None:
    """Install the guard on ``module.fast_prefill_plan`` where the module's code is a tested
    release's (``code_check``), once; it stays for the process (module docstring)."""
    if is_installed() or not callable(getattr(module, "fast_prefill_plan", None)):
        return
    found = code_check.patchable(module, version, "DFLASH plans FlashInfer from exact lengths")
    if found is None:
        return
    module.fast_prefill_plan = guarded(module.fast_prefill_plan)
    _state["installed"] = found.release or version


def _refusal(backend, flashinfer, guard) -> Optional[str]:
    """Why ``backend`` cannot plan from a host upper bound, or None."""
    if not getattr(backend, "needs_cpu_seq_lens", True):
        return None  # it reads no host lengths
    name = type(backend).__name__
    if flashinfer is None or type(backend) is not flashinfer.FlashInferAttnBackend:
        return f"{name} reads host lengths and is not FlashInfer's plain backend"
    for attr, fine, why in (
        ("prefill_backend", "fa2", "its prefill backend is not fa2"),
        ("dispatch_reason", None, "sliding-window or cross-attention wrappers"),
        ("use_sliding_window_kv_pool", False, "a sliding-window KV pool"),
        ("prefill_uses_dequant_workspace", False, "a dequant KV workspace"),
        ("is_multimodal", False, "a multimodal model (MRoPE positions)"),
        ("is_dllm_model", False, "a diffusion LM"),
    ):
        if getattr(backend, attr, not fine) != fine:
            return f"{name}: {why}"
    graphs = getattr(backend, "prefill_cuda_graph_metadata", None) or {}
    if not graphs:
        return f"{name}: no captured verify graphs (every verify plans with a readback)"
    for wrappers in graphs.values():
        for w in wrappers:
            func = getattr(w.begin_forward, "func", None)
            if func is not guard or getattr(w, "_backend", None) != "fa2":
                return f"{name}: a captured verify graph is not planned by the guarded fa2 plan"
    return None


def host_bound(sched) -> HostBound | str:
    """DFLASH's own bound for the host lengths of ``sched``'s FutureMap, or why not (never
    raises: a scheduler it cannot read keeps exact host lengths)."""
    try:
        return _host_bound(sched)
    except Exception as exc:
        raise_if_sticky(exc, "spec_fused's host-bound decision (scheduler set-up)", logger)
        return f"could not read the worker's backends ({type(exc).__name__}: {exc})"


def _untested_code() -> Optional[str]:
    """Why the installed code the bound rests on is not a bound release's, or None."""
    for name in code_check.CHECKED:
        if name in code_check.RELAY_MODULES:
            continue
        module = sys.modules.get(name)
        found = None if module is None else code_check.check_module(module)
        if found is None or found.release not in BOUND_RELEASES:
            return f"{name}: not the code of SGLang {BOUND_RELEASES[0]}+" + (
                f" ({found.describe()})" if found is not None else " (not imported)"
            )
    return None


def _host_bound(sched) -> HostBound | str:
    worker, args = getattr(sched, "draft_worker", None), getattr(sched, "server_args", None)
    backends = getattr(worker, "spec_v2_attn_backends", None)
    flashinfer = sys.modules.get(MODULE)
    if worker is None or backends is None:
        return "the worker names no attention backends (spec_v2_attn_backends)"
    if not is_installed() or flashinfer is None:
        return "the FlashInfer plan guard is not installed (module not imported, or untested)"
    if type(worker).__module__ != WORKER:
        return f"{type(worker).__name__} is not SGLang's DFLASH worker ({WORKER})"
    if (why := _untested_code()) is not None:
        return why
    if (why := flashinfer_refusal(version := flashinfer_version())) is not None:
        return why
    if getattr(worker, "draft_window_size", None) is not None:
        return "a draft window (compact draft cache): its host bound omits the window's block"
    if getattr(args, "enable_two_batch_overlap", False):
        return "two-batch overlap reads host lengths outside the attention backends"
    live = [b for b in backends if b is not None]
    if why := next((r for b in live if (r := _refusal(b, flashinfer, guard()))), None):
        return why
    readers = [b for b in live if getattr(b, "needs_cpu_seq_lens", True)]
    return HostBound(
        f"DFLASH plans FlashInfer fa2 from its own KV bound, each plan's partition and "
        f"pinned buffer guarded (SGLang {_state['installed']}, FlashInfer {version})",
        max_bs=min(max(b.prefill_cuda_graph_metadata) for b in readers) if readers else 1 << 30,
        window=int(worker.block_size),
        arm=arm,
        expect=expect,
    )


def flashinfer_refusal(version: Optional[str]) -> Optional[str]:
    """Why DFLASH's bound may not plan FlashInfer ``version``, or None: the partition guard
    reads the plan layout of the versions in :data:`FLASHINFER_READ` only."""
    if version in FLASHINFER_READ:
        return None
    read = ", ".join(FLASHINFER_READ)
    return f"FlashInfer {version}: its fa2 split-KV layout was read for {read} only"


def flashinfer_version() -> Optional[str]:
    """The FlashInfer SGLang's backend imported (its ``__version__``), or None."""
    return getattr(sys.modules.get("flashinfer"), "__version__", None)


def guard():
    """The installed guard (the module's global), or None."""
    module = sys.modules.get(MODULE)
    fn = getattr(module, "fast_prefill_plan", None)
    return fn if getattr(fn, "__module__", "") == __name__ else None
