"""FlashInfer 0.7.2's fa2 paged prefill, planned as SGLang 0.5.23 plans a graphed DFLASH verify:
exact host lengths against DFLASH's own bound, and the pinned plan buffer with and without
spec_fused's guard (issue 38, item 5).

Why: the bound variant (``spec_fused/integration/flashinfer_plan.py``) plans every graphed
verify from ``nxt_kv_lens_cpu`` instead of exact host lengths, and lets the host plan step
N+1 while step N's plan copy may still be queued. Two claims carry it, and only a GPU shows
them: (1) fa2 computes the same attention from a bound plan - bit for bit where the bound
keeps each request's KV partition (the same ``kv_chunk_size``), the largest difference
elsewhere; (2) without the guard a host rewrite of the pinned buffer reaches a pending copy
(the first plan's device workspace holds a later plan's bytes), with it never.

``fast_prefill_plan`` is SGLang's own, compiled alone from the installed
``flashinfer_backend.py`` once its fingerprint equals a tested release's: importing the
module pulls SGLang's model stack, whose kernels (sglang-kernel 0.4.10) do not load on the
lent image's torch 2.11. Wrappers are built as ``_create_prefill_wrappers`` builds them for a
DFLASH verify (CUDA-graph fa2, one per batch size, no custom mask), planned once by the stock
``plan()`` at capture, then by ``fast_prefill_plan`` with ``call_begin_forward``'s arguments.
The race holds the stream with ``torch.cuda._sleep`` ahead of the plans, so a copy runs only
after the host has planned again. Where FlashInfer enqueues that copy (``cudaMemcpyAsync`` in
``PrefillPlanImpl``, on ``TVMFFIEnvGetStream``, which tvm-ffi sets to torch's current stream
for the call) is what the race proves: a copy on another stream would not wait for the sleep.

``--dry-run`` (CPU): the plan, SGLang's real ``fast_prefill_plan`` and the real guard on a
stand-in device whose copies wait until the host synchronizes, null figures.
Usage: ``python -m bench.flashinfer_check --out DIR [--dry-run] [--quick]``.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import sys
import time
from types import SimpleNamespace
from typing import Optional, Union

import torch

from bench import harness
from spec_fused.integration import code_check, flashinfer_plan

T0 = time.monotonic()
MODULE, NAME = flashinfer_plan.MODULE, "fast_prefill_plan"
QH, KH, HD = 32, 8, 128  # Llama-3-8B: query heads, KV heads, head dim
GRID = {"bs": (1, 8, 32, 128), "kv": (256, 1024, 4096, 8192), "block": (8, 16)}
QUICK = {"bs": (1, 8), "kv": (256, 4096), "block": (16,)}
RACE = {"bs": 8, "block": 16, "kv": 2048, "step": 256}  # RING + 1 plans, each shorter
WORKSPACE = 384 << 20  # SGLANG_FLASHINFER_WORKSPACE_SIZE
SLEEP_CYCLES = 200_000_000  # torch.cuda._sleep: ~100 ms at 2 GHz, far beyond the plans' host time
CELL_S = {1: 0.05, 8: 0.1, 32: 0.25, 128: 0.8}  # per kv cell: two replays + the fp32 reference


def log(msg: str) -> None:
    print(f"flashinfer_check [{time.monotonic() - T0:6.1f} s] {msg}", file=sys.stderr, flush=True)


def load_fast_prefill_plan():
    """SGLang's ``fast_prefill_plan``, compiled alone from the installed release's source once
    its fingerprint is a tested release's; ``(function, {module, releases})``."""
    namespace = {"__name__": MODULE, "torch": torch, "Optional": Optional, "Union": Union}
    fn, releases = code_check.tested_function(MODULE, NAME, namespace)
    return fn, {"module": MODULE, "releases": releases}


def plan_view(w) -> dict:
    """The plan's partition as fa2 reads it: ``kv_chunk_size`` from the host copy of the int
    workspace (the pinned buffer the plan just wrote), the rest from ``_plan_info``."""
    info = [int(x) for x in w._plan_info]
    raw = w._pin_memory_int_workspace_buffer[info[9] : info[9] + 4].tolist()
    chunk = int.from_bytes(bytes(raw), "little", signed=True)
    return {"kv_chunk_size": chunk, "split_kv": bool(info[14]), "padded_batch_size": info[0],
            "cta_tile_q": info[3], "end": info[12] + info[0]}  # fmt: skip


class Rig:
    """One wrapper of ``bs`` verify requests of ``block`` tokens, set up as SGLang sets up a
    DFLASH verify graph; ``plan`` is ``call_begin_forward``'s call for given lengths."""

    def __init__(self, bs: int, block: int, max_kv: int, device):
        self.bs, self.block, self.device = bs, block, device
        self.stride = max_kv + 2 * block  # KV slots per request (page size 1)
        self.cap = bs * self.stride
        self.qo_indptr = torch.arange(0, (bs + 1) * block, block, dtype=torch.int32, device=device)
        self.last_page = torch.ones(bs, dtype=torch.int32, device=device)
        self.slots = torch.arange(self.cap, dtype=torch.int32, device=device)

    def device_args(self, committed) -> tuple:
        """``generate_attn_arg_prefill``'s layout on the device (no sync): KV length =
        committed + block, request ``r``'s KV at slots ``r * stride ...``."""
        lens = committed.to(self.device, torch.int32) + self.block
        indptr = torch.zeros(self.bs + 1, dtype=torch.int32, device=self.device)
        indptr[1:] = torch.cumsum(lens, 0)
        r = torch.searchsorted(indptr[1:], self.slots, right=True).clamp_(max=self.bs - 1)
        indices = (r * self.stride + self.slots - indptr[r]).clamp_(0, self.cap - 1).int()
        return self.qo_indptr, indptr, indices, self.last_page

    def plan(self, args, kv_lens_host) -> dict:
        """``wrapper_paged.begin_forward`` as ``call_begin_forward`` calls it for a DFLASH
        verify replay: host metadata from ``kv_lens_host`` (exact or the bound), the device
        layout from the device lengths; ``kv_indices`` sized by the host sum, as SGLang's."""
        lens, b = kv_lens_host.to(torch.int32), self.block
        kv_indptr_host = torch.zeros(self.bs + 1, dtype=torch.int32)
        kv_indptr_host[1:] = torch.cumsum(lens, 0)
        qo, kv_indptr, indices, last = args
        self.w.begin_forward(
            qo, kv_indptr, indices[: int(kv_indptr_host[-1]) + b * self.bs], last,
            QH, KH, HD, 1, q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16,
            custom_mask=None, non_blocking=True, fixed_split_size=None, prefix_len_ptr=None,
            token_pos_in_items_ptr=None, token_pos_in_items_len=0, max_item_len_ptr=None,
            qo_indptr_host=torch.arange(0, (self.bs + 1) * b, b, dtype=torch.int32),
            kv_indptr_host=kv_indptr_host, kv_lens_host=lens, max_q_len=b,
            max_kv_len=int(lens.max()),
        )  # fmt: skip
        return plan_view(self.w)

    def install(self, plan_fn) -> None:
        """SGLang's capture branch: ``w.begin_forward = partial(fast_prefill_plan, w)``."""
        self.w.begin_forward = functools.partial(plan_fn, self.w)


class CudaRig(Rig):
    """The real wrapper on CUDA: KV caches of random bf16, the graph of one verify's attention."""

    def __init__(self, fi, bs: int, block: int, max_kv: int, plan_fn, layers: int = 1):
        super().__init__(bs, block, max_kv, torch.device("cuda"))
        gen = torch.Generator(device="cuda").manual_seed(bs * 100 + block)
        rand = functools.partial(torch.randn, dtype=torch.bfloat16, device="cuda", generator=gen)
        self.k, self.v = rand(self.cap, KH, HD), rand(self.cap, KH, HD)
        self.q = rand(bs * block, QH, HD)
        i32 = functools.partial(torch.zeros, dtype=torch.int32, device="cuda")
        self.w = fi.BatchPrefillWithPagedKVCacheWrapper(
            torch.empty(WORKSPACE, dtype=torch.uint8, device="cuda"), "NHD",
            use_cuda_graph=True, backend="fa2", qo_indptr_buf=i32(bs + 1),
            paged_kv_indptr_buf=i32(bs + 1), paged_kv_indices_buf=i32(self.cap),
            paged_kv_last_page_len_buf=torch.ones(bs, dtype=torch.int32, device="cuda"),
        )  # fmt: skip
        ones = torch.ones(bs, dtype=torch.int64)  # capture: seq_lens filled with 1, as SGLang's
        qo, kv_indptr, indices, last = self.device_args(ones)
        self.w.begin_forward(
            qo, kv_indptr, indices[: bs * (block + 1)], last, QH, KH, HD, 1,
            q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16, custom_mask=None,
            non_blocking=True, fixed_split_size=None, prefix_len_ptr=None,
            token_pos_in_items_ptr=None, token_pos_in_items_len=0, max_item_len_ptr=None,
        )  # fmt: skip  # the stock plan() of the capture: sets _cached_module
        self.install(plan_fn)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self._forward()  # warm-up outside the capture
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            for _ in range(layers):  # every layer reads the one plan, as SGLang's do
                self.out = self._forward()
        torch.cuda.synchronize()

    def _forward(self):
        """``forward_extend``'s paged call for a causal DFLASH verify."""
        kv, scale = (self.k, self.v), HD**-0.5
        return self.w.forward(self.q, kv, causal=True, sm_scale=scale, window_left=-1,
                              logits_soft_cap=0.0, k_scale=None, v_scale=None)  # fmt: skip

    def replay(self) -> torch.Tensor:
        self.graph.replay()
        return self.out.clone()

    def reference(self, committed) -> torch.Tensor:
        """fp32 causal attention of each request's block over its KV (the device lengths)."""
        out = torch.empty(self.bs * self.block, QH, HD, device="cuda")
        for r, n in enumerate((committed + self.block).tolist()):
            k, v = (t[r * self.stride : r * self.stride + n].float() for t in (self.k, self.v))
            k, v = (t.repeat_interleave(QH // KH, dim=1) for t in (k, v))
            q = self.q[r * self.block : (r + 1) * self.block].float()
            s = torch.einsum("qhd,khd->hqk", q, k) * HD**-0.5
            keys = torch.arange(n, device="cuda")
            allowed = (
                keys[None, :] <= n - self.block + torch.arange(self.block, device="cuda")[:, None]
            )
            s.masked_fill_(~allowed[None], float("-inf"))
            out[r * self.block : (r + 1) * self.block] = torch.einsum(
                "hqk,khd->qhd", s.softmax(-1), v
            )
        return out


class StandinDevice:
    """``--dry-run``'s GPU: one stream whose work waits in a queue until the host
    synchronizes (as if always busy), and events on it."""

    def __init__(self):
        self.queue: list = []
        self.done = 0

    def later(self, work) -> None:
        self.queue.append(work)

    def run(self, upto: Optional[int] = None) -> None:
        while self.done < (len(self.queue) if upto is None else upto):
            self.queue[self.done]()
            self.done += 1

    def event_class(self):
        dev = self

        class Event:
            def __init__(self, *args, **kwargs):
                self.at = 0

            def record(self, stream=None):
                self.at = len(dev.queue)

            def query(self):
                return dev.done >= self.at

            def synchronize(self):
                dev.run(self.at)

        return Event

    def stream(self):
        return contextlib.nullcontext()

    def sleep(self) -> None:  # its work waits anyway
        pass

    def snapshot(self, t: torch.Tensor) -> torch.Tensor:
        box = torch.empty_like(t)
        self.later(lambda: box.copy_(t))
        return box

    def pending(self) -> bool:
        return self.done < len(self.queue)

    def synchronize(self) -> None:
        self.run()


class CudaDevice(StandinDevice):
    """The same interface on a real CUDA stream."""

    def __init__(self):
        self.s = torch.cuda.Stream()

    def stream(self):
        return torch.cuda.stream(self.s)

    def sleep(self) -> None:
        torch.cuda._sleep(SLEEP_CYCLES)

    def snapshot(self, t: torch.Tensor) -> torch.Tensor:
        return t.clone()

    def pending(self) -> bool:
        event = torch.cuda.Event()
        event.record()
        return not event.query()

    def synchronize(self) -> None:
        torch.cuda.synchronize()


class StandinRig(Rig):
    """A CUDA-graph fa2 wrapper as far as ``fast_prefill_plan`` touches it, on the stand-in
    device: its ``_cached_module.plan`` writes the plan (here: the lengths it was planned from)
    into the pinned buffer it is handed and queues the copy into the int workspace."""

    def __init__(self, dev: StandinDevice, bs: int, block: int, max_kv: int, plan_fn):
        super().__init__(bs, block, max_kv, torch.device("cpu"))
        self.dev = dev
        z = functools.partial(torch.zeros, dtype=torch.int32)
        self.w = SimpleNamespace(
            is_cuda_graph_enabled=True, _backend="fa2", _max_total_num_rows=bs * block,
            _custom_mask_buf=None, _float_workspace_buffer=torch.zeros(1),
            _int_workspace_buffer=torch.zeros(4 * (bs + 2), dtype=torch.uint8),
            _pin_memory_int_workspace_buffer=torch.zeros(4 * (bs + 2), dtype=torch.uint8),
            _qo_indptr_buf=z(bs + 1), _paged_kv_indptr_buf=z(bs + 1),
            _paged_kv_last_page_len_buf=z(bs), _paged_kv_indices_buf=z(self.cap),
            _cached_module=SimpleNamespace(plan=self._plan), device=self.device,
        )  # fmt: skip
        self.install(plan_fn)

    def _plan(self, float_ws, int_ws, pinned, qo_host, kv_indptr_host, kv_lens, *rest):
        n = kv_lens.numel()
        words = pinned.view(torch.int32)
        words[:n], words[n] = kv_lens, int(kv_lens.max())  # the work list, the "chunk size"
        self.dev.later(lambda: int_ws.copy_(pinned))  # cudaMemcpyAsync, no sync
        return [1, int(qo_host[-1]), 0, 16, 0, 0, 0, 0, 0, 4 * n, 0, 0, 4 * (n + 1), 1, 1]

    def replay(self) -> torch.Tensor:  # the "kernel" reads its work list from the workspace
        return self.dev.snapshot(self.w._int_workspace_buffer.view(torch.int32)[: self.bs])

    def reference(self, committed) -> torch.Tensor:
        return (committed + self.block).to(torch.int32)


def race(dev, rig: Rig, plan_fn, committed: list) -> dict:
    """Plans ``committed[0], committed[1], ...`` (exact lengths) back to back on one stream
    held by ``dev.sleep()``: each plan's host bytes (read right after it returned) against
    the bytes its copy put in the device workspace, and the first plan's verify output."""
    args = [rig.device_args(c) for c in committed]  # before the sleep: nothing may sync in it
    rig.install(plan_fn)
    rig.plan(args[0], committed[0] + rig.block)  # the reference: planned and run alone
    dev.synchronize()
    want = rig.replay()
    dev.synchronize()
    waits0, host, device = flashinfer_plan.guard_stats()["waits"], [], []
    with dev.stream():
        dev.sleep()
        for i, (c, a) in enumerate(zip(committed, args)):
            end = rig.plan(a, c + rig.block)["end"]
            host.append(rig.w._pin_memory_int_workspace_buffer[:end].clone())
            device.append(dev.snapshot(rig.w._int_workspace_buffer[:end]))
            if i == 0:
                got = rig.replay()
        held = dev.pending()  # the host planned everything while the first copy still waited
    dev.synchronize()
    device = [d.cpu() for d in device]  # the host's copies are host memory
    torn = [not torch.equal(d, h) for d, h in zip(device, host)]
    return {"plans": len(committed), "window_held": held, "torn": torn,
            "holds_a_later_plan": [any(torch.equal(d, h) for h in host[i + 1 :])
                                   for i, d in enumerate(device)],
            "first_output_max_diff": float((got.float() - want.float()).abs().max()),
            "guard_waits": flashinfer_plan.guard_stats()["waits"] - waits0}  # fmt: skip


def race_pair(dev, rig: Rig, fast_prefill_plan) -> dict:
    """The race without the guard, then with it (armed, as the bound variant runs it):
    ``RING + 1`` plans, so the guarded run also wraps its ring once."""
    n, c = flashinfer_plan.RING + 1, RACE["kv"] - rig.block
    committed = [torch.full((rig.bs,), c - i * RACE["step"], dtype=torch.int64) for i in range(n)]
    flashinfer_plan.arm()
    guarded = flashinfer_plan.guarded(fast_prefill_plan)
    out = {"unguarded": race(dev, rig, fast_prefill_plan, committed),
           "guarded": race(dev, rig, guarded, committed)}  # fmt: skip
    u, g = out["unguarded"], out["guarded"]
    out["shows_the_corruption"] = u["window_held"] and any(u["torn"]) and u["holds_a_later_plan"][0]
    out["guard_holds"] = not any(g["torn"]) and g["first_output_max_diff"] == 0.0
    out["guard_waited_once"] = g["guard_waits"] == 1  # at the wrap, for the first plan's copy
    return out


def bound_lengths(committed: torch.Tensor, block: int, gen) -> torch.Tensor:
    """DFLASH's ``nxt_kv_lens_cpu`` (page size 1): ``host_committed + 2 * block``, the host's
    committed length lagging the device's by up to one verify's ``block`` tokens."""
    lag = torch.randint(0, block + 1, committed.shape, generator=gen)
    return (committed - lag).clamp_(min=1) + 2 * block


def grid_cell(rig: Rig, kv: int, gen) -> dict:
    """One ``(bs, kv, block)`` cell: the verify planned from exact lengths and from the bound,
    replayed, compared with each other and with an fp32 reference."""
    bs, b = rig.bs, rig.block
    committed = (kv - b - torch.randint(0, min(kv // 4, 64) + 1, (bs,), generator=gen)).clamp_(1)
    bound = bound_lengths(committed, b, gen)
    assert bool((bound >= committed + b).all()), "the bound is below a device length"
    args = rig.device_args(committed)
    exact_plan = rig.plan(args, committed + b)
    exact = rig.replay()
    bound_plan = rig.plan(args, bound)
    got = rig.replay()
    ref = rig.reference(committed.to(rig.device))
    same = exact_plan["kv_chunk_size"] == bound_plan["kv_chunk_size"]
    return {"bs": bs, "kv": kv, "block": b, "kv_chunk_exact": exact_plan["kv_chunk_size"],
            "kv_chunk_bound": bound_plan["kv_chunk_size"], "split_exact": exact_plan["split_kv"],
            "split_bound": bound_plan["split_kv"], "same_chunk": same,
            "bitwise": bool(torch.equal(exact, got)),
            "max_diff": float((exact.float() - got.float()).abs().max()),
            "ref_err_exact": float((exact.float() - ref.float()).abs().max()),
            "ref_err_bound": float((got.float() - ref.float()).abs().max())}  # fmt: skip


def plan(args) -> dict:
    grid = QUICK if args.quick else GRID
    cells = [(bs, kv, b) for b in grid["block"] for bs in grid["bs"] for kv in grid["kv"]]
    est = 20 + sum(0.3 + len(grid["kv"]) * CELL_S[bs] for b in grid["block"] for bs in grid["bs"])
    return {"grid": grid, "cells": len(cells), "heads": {"q": QH, "kv": KH, "dim": HD},
            "wrapper": "BatchPrefillWithPagedKVCacheWrapper(NHD, use_cuda_graph, fa2), page 1, "
                       "causal, bf16, no custom mask; stock plan() at capture, then SGLang's "
                       "fast_prefill_plan (guarded and armed) with call_begin_forward's arguments",
            "compares": "per cell: exact (committed + block) vs DFLASH's bound (host committed, "
                        "lagging up to one block, + 2 x block): kv_chunk_size, split_kv, "
                        "bitwise equality, max |diff|, each against an fp32 reference",
            "race": dict(RACE, plans=flashinfer_plan.RING + 1,
                         how="torch.cuda._sleep ahead on the stream, then the plans back to back; "
                             "each plan's host bytes vs its copy's device bytes; unguarded, "
                             "then guarded"),
            "estimated_device_s": round(est, 1)}  # fmt: skip


def run_cuda(args) -> dict:
    import flashinfer

    fast_prefill_plan, source = load_fast_prefill_plan()
    guarded = flashinfer_plan.guarded(fast_prefill_plan)
    flashinfer_plan.arm()  # the grid plans as the bound variant does: through the armed guard
    grid, rows, gen = QUICK if args.quick else GRID, [], torch.Generator().manual_seed(0)
    for b in grid["block"]:
        for bs in grid["bs"]:
            rig = CudaRig(flashinfer, bs, b, max(grid["kv"]), guarded)
            for kv in grid["kv"]:
                rows.append(grid_cell(rig, kv, gen))
                log(f"bs {bs} kv {kv} block {b}: {rows[-1]}")
            del rig
            torch.cuda.empty_cache()
    rig = CudaRig(flashinfer, RACE["bs"], RACE["block"], RACE["kv"], fast_prefill_plan)
    return {"source": source, "flashinfer": flashinfer.__version__, "rows": rows,
            "race": race_pair(CudaDevice(), rig, fast_prefill_plan)}  # fmt: skip


def run_standin() -> dict:
    """The dry run: SGLang's real ``fast_prefill_plan`` and the real guard on the stand-in."""
    fast_prefill_plan, source = load_fast_prefill_plan()
    dev = StandinDevice()
    saved, flashinfer_plan._event = flashinfer_plan._event, dev.event_class()
    try:
        rows, gen = [], torch.Generator().manual_seed(0)
        guarded = flashinfer_plan.guarded(fast_prefill_plan)
        for bs in QUICK["bs"]:  # the grid's code on the stand-in: its figures mean nothing
            rig = StandinRig(dev, bs, QUICK["block"][0], max(QUICK["kv"]), guarded)
            rig.replay = functools.partial(_settled, dev, rig.replay)
            rows += [grid_cell(rig, kv, gen) for kv in QUICK["kv"]]
        rig = StandinRig(dev, RACE["bs"], RACE["block"], RACE["kv"], fast_prefill_plan)
        return {"source": source, "rows": rows, "race": race_pair(dev, rig, fast_prefill_plan)}
    finally:
        flashinfer_plan._event = saved


def _settled(dev, replay):
    out = replay()
    dev.synchronize()
    return out


def verdict(result: dict, measured: bool) -> dict:
    rows, r = result["rows"] if measured else [], result["race"]
    same = [x for x in rows if x["same_chunk"]]
    return {"bitwise_where_chunk_unchanged": all(x["bitwise"] for x in same) if same else None,
            "cells_same_chunk": len(same), "cells": len(rows),
            "max_diff_elsewhere": max((x["max_diff"] for x in rows if not x["same_chunk"]),
                                      default=None),
            "copy_on_the_current_stream": r["shows_the_corruption"],
            "guard_holds": r["guard_holds"],
            "guard_waited_once": r["guard_waited_once"]}  # fmt: skip


def plot_rows(rows, path) -> None:
    import matplotlib.pyplot as plt

    plt.switch_backend("Agg")
    fig, ax = plt.subplots(figsize=(8, 5))
    for bs in sorted({r["bs"] for r in rows}):
        for same, marker in ((True, "o"), (False, "x")):
            pts = [(r["kv"], max(r["max_diff"], 1e-6)) for r in rows
                   if r["bs"] == bs and r["same_chunk"] == same]  # fmt: skip
            if pts:
                ax.scatter(*zip(*pts), marker=marker, label=f"bs {bs}, same chunk: {same}")
    ax.set(
        xscale="log", yscale="log", xlabel="KV length", ylabel="max |bound - exact| (1e-6: equal)"
    )
    ax.legend(fontsize=8, title="fa2 verify planned from DFLASH's bound vs exact lengths")
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)


def main(argv=None) -> int:
    p = harness.add_common_args(argparse.ArgumentParser(description=__doc__.split("\n")[0]))
    p.add_argument("--dry-run", action="store_true", help="the plan and the stand-in race (CPU)")
    args = p.parse_args(argv)
    cuda = torch.cuda.is_available() and not args.dry_run
    if not cuda and not args.dry_run:
        print("flashinfer_check: needs a CUDA GPU; on CPU only --dry-run runs", file=sys.stderr)
        return 2
    device = torch.device("cuda" if cuda else "cpu")
    payload = {"dry_run": not cuda, "device": harness.device_name(device), "plan": plan(args)}
    log(f"planned {payload['plan']['estimated_device_s']} s of device time")
    result = run_cuda(args) if cuda else run_standin()
    payload.update(result, verdict=verdict(result, cuda), versions=harness.versions(device))
    payload["config"] = {"wall_s": round(time.monotonic() - T0, 1)}
    cols = ["bs", "kv", "block", "kv_chunk_exact", "kv_chunk_bound", "same_chunk", "bitwise"]
    tables = [harness.format_table(result["rows"], cols + ["max_diff", "ref_err_exact"])]
    tables.append("\n".join(f"{k}: {v}" for k, v in payload["verdict"].items()))
    chart = None if args.no_plot or not cuda else lambda path: plot_rows(result["rows"], path)
    out = harness.results_dir(device, args.out)
    count = f"{len(result['rows'])} cells, race {'run' if cuda else 'on the stand-in'}"
    harness.write_results("flashinfer_check", out, payload, tables=tables, plot=chart, count=count)
    v = payload["verdict"]
    ok = v["copy_on_the_current_stream"] and v["guard_holds"] and v["guard_waited_once"]
    return 0 if ok and v["bitwise_where_chunk_unchanged"] is not False else 1


if __name__ == "__main__":
    sys.exit(main())
