"""FlashInfer 0.7.2's fa2 paged prefill, planned as SGLang 0.5.23 plans a graphed DFLASH verify:
exact host lengths against DFLASH's own bound, with and without spec_fused's partition guard,
and the pinned plan buffer with and without its ring (issues 38 item 5, 41 item 5).

Why: the bound variant (``spec_fused/integration/flashinfer_plan.py``) plans every graphed
verify from ``nxt_kv_lens_cpu`` instead of exact host lengths, and lets the host plan step
N+1 while step N's plan copy may still be queued. Three claims carry it, and only a GPU shows
them: (1) a bound plan is wrong attention where a chunk boundary lies between the device
length and the bound (``bench/fa2_split.py``'s mirror says so; the straddle cases make the
real kernel show it, or the check fails: it could not see the bug), and the guard, told the
step (``caps.BoundStep``), replans those from exact lengths read back from the device, so
every straddle case and every grid cell is the fp32 reference's attention within bf16's
error; (2) the mirror picks the real plan's ``kv_chunk_size`` (for this GPU's SM count), so
the guard's arithmetic and the CPU tests stand for the real plan; (3) without the ring a host
rewrite of the pinned buffer reaches a pending copy (the first plan's device workspace holds a
later plan's bytes), with it never. Every error has a threshold verdict (``CLEAN_FLOOR``,
``CLEAN_FACTOR``, ``MISMATCH``, in the JSON); ``main`` fails unless every verdict holds.

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

``--dry-run`` (CPU): SGLang's real ``fast_prefill_plan`` and the real guard on a stand-in
device whose copies wait until the host synchronizes, its "kernel" the mirror's split-KV
attention on the device lengths (:class:`StandinFa2`): the straddle cases, the grid's code and
the verdict for real (float64), the race's tearing; no GPU figure.
Usage: ``python -m bench.flashinfer_check --out DIR [--dry-run] [--quick]``.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import math
import sys
import time
from types import SimpleNamespace
from typing import Optional, Union

import torch

from bench import fa2_split, harness
from spec_fused import caps
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
STRADDLE = {"bs": (1, 8), "block": 16}  # fa2_split.straddling_case: bs 1, and a spread batch
# Queries x 2: peaked attention, as a trained model's. With unit queries a softmax over ~1000
# keys is flat and a wrong merge of a spread batch moves outputs by only ~0.1 (the mirror at
# head dim 128); x 2 it moves them by >= 0.57 while bf16 rounding stays near 4e-3.
Q_SCALE = 2.0
# Verdicts on max |output - the fp32 reference of the device lengths| (a non-finite output:
# inf). Clean: within CLEAN_FACTOR x the exact plan's own error, or CLEAN_FLOOR, ~4 bf16
# half-ulps at |out| = 2 (the largest outputs here; an emulation of the kernel's bf16 P and
# output rounding gives 4e-3); the exact plan itself must be within the floor, or the
# reference is not to be trusted. Mismatch: at least MISMATCH, above the widest clean band
# (3 x the floor) and ~6x below the smallest wrong merge the mirror shows on these data.
# Between: unclear, which no verdict accepts.
CLEAN_FLOOR, CLEAN_FACTOR, MISMATCH = 3e-2, 3, 0.1


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

    def settle(self) -> None:
        """What a replay queued has run (CUDA: the stream orders every later use anyway)."""

    def read(self, t: torch.Tensor) -> torch.Tensor:
        """A device-to-host read of ``t``: it waits for what the stream has queued."""
        return t.to("cpu")


class CudaRig(Rig):
    """The real wrapper on CUDA: KV caches of random bf16, the graph of one verify's attention."""

    def __init__(self, fi, bs: int, block: int, max_kv: int, plan_fn, layers: int = 1):
        super().__init__(bs, block, max_kv, torch.device("cuda"))
        gen = torch.Generator(device="cuda").manual_seed(bs * 100 + block)
        rand = functools.partial(torch.randn, dtype=torch.bfloat16, device="cuda", generator=gen)
        self.k, self.v = rand(self.cap, KH, HD), rand(self.cap, KH, HD)
        self.q = rand(bs * block, QH, HD).mul_(Q_SCALE)
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


class StandinFa2:
    """FlashInfer 0.7.2's fa2 on the stand-in device, as ``bench/fa2_split.py`` mirrors it, so
    a dry run computes attention through the plan/kernel split the GPU has: :meth:`plan` is
    ``_cached_module.plan`` (the C++ plan's host half): it partitions from the host lengths it
    is handed, writes the plan's id and ``kv_chunk_size`` into the pinned buffer, queues the
    copy into the device workspace (no sync) and returns a ``PrefillPlanInfo`` pointing at
    them (entry 9: the chunk's byte offset, 14: split_kv). :meth:`kernel` is the captured
    kernel and merge: the plan the device workspace holds, run on the device's lengths."""

    BYTES = 256  # its workspaces: the plan's id, its chunk, room for a block_valid_mask

    def __init__(self, dev: StandinDevice):
        self.dev, self.plans = dev, []

    def plan(self, float_ws, int_ws, pinned, qo_host, kv_indptr_host, kv_lens, rows, *rest):
        qh, kh, hd = rest[1], rest[2], rest[5]  # after batch_size: heads, page, graph, head dim
        p = fa2_split.plan(qo_host.diff().tolist(), kv_indptr_host.diff().tolist(),
                           num_qo_heads=qh, num_kv_heads=kh, head_dim=hd,
                           max_total_num_rows=rows)  # fmt: skip
        self.plans.append(p)
        pinned.view(torch.int32)[:2] = torch.tensor([len(self.plans) - 1, p.chunk])
        self.dev.later(lambda: int_ws.copy_(pinned))  # cudaMemcpyAsync, no sync
        return [p.padded_batch_size, rows, 0, p.tile_q, 0, 0, 0, 0, 0, 4, 0, 0, 8, 1, p.split_kv]

    def kernel(self, int_ws: torch.Tensor, device_kv: list, block: int) -> tuple:
        """The plan the device workspace holds, run on ``device_kv``: (plan, output), on
        ``fa2_split.tensors``' inputs for those lengths."""
        p = self.plans[int(int_ws.view(torch.int32)[0])]
        q, k, v, starts = fa2_split.tensors([block] * len(device_kv), device_kv, group=p.group)
        return p, fa2_split.run(p, device_kv, q, k, v, starts)["out"]

    @staticmethod
    def reference(device_kv: list, block: int, group: int) -> torch.Tensor:
        qo = [block] * len(device_kv)
        return fa2_split.reference(qo, device_kv, *fa2_split.tensors(qo, device_kv, group=group))


class StandinRig(Rig):
    """A CUDA-graph fa2 wrapper as far as ``fast_prefill_plan`` touches it, on the stand-in
    device, planning into :class:`StandinFa2`; its replay queues the mirror's kernel."""

    def __init__(self, dev: StandinDevice, bs: int, block: int, max_kv: int, plan_fn):
        super().__init__(bs, block, max_kv, torch.device("cpu"))
        self.dev, self.fa2 = dev, StandinFa2(dev)
        z = functools.partial(torch.zeros, dtype=torch.int32)
        ws = functools.partial(torch.zeros, StandinFa2.BYTES, dtype=torch.uint8)
        self.w = SimpleNamespace(
            is_cuda_graph_enabled=True, _backend="fa2", _max_total_num_rows=bs * block,
            _custom_mask_buf=None, _float_workspace_buffer=torch.zeros(1),
            _int_workspace_buffer=ws(), _pin_memory_int_workspace_buffer=ws(),
            _qo_indptr_buf=z(bs + 1), _paged_kv_indptr_buf=z(bs + 1),
            _paged_kv_last_page_len_buf=z(bs), _paged_kv_indices_buf=z(self.cap),
            _cached_module=SimpleNamespace(plan=self.fa2.plan), device=self.device,
        )  # fmt: skip
        self.install(plan_fn)

    def replay(self) -> torch.Tensor:
        """The graph, queued: on the device layout as the stream has it now (the plan's copies
        into it ran at once, on the host), with the plan the workspace holds when it runs."""
        device_kv = self.w._paged_kv_indptr_buf.diff().tolist()
        out = torch.empty(self.bs * self.block, QH // KH, fa2_split.DIM, dtype=torch.float64)
        ws = self.w._int_workspace_buffer
        self.dev.later(lambda: out.copy_(self.fa2.kernel(ws, device_kv, self.block)[1]))
        return out

    def reference(self, committed) -> torch.Tensor:
        return self.fa2.reference((committed + self.block).tolist(), self.block, QH // KH)

    def settle(self) -> None:
        self.dev.synchronize()

    def read(self, t: torch.Tensor) -> torch.Tensor:
        self.settle()
        return t.clone()


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


def host_committed(committed: torch.Tensor, block: int, gen) -> torch.Tensor:
    """The host's committed lengths under DFLASH (page size 1): up to one verify's ``block``
    tokens behind the device's ``committed``; its bound ``nxt_kv_lens_cpu`` is this + 2 x block."""
    lag = torch.randint(0, block + 1, committed.shape, generator=gen)
    return (committed - lag).clamp_(min=1)


def max_err(got: torch.Tensor, want: torch.Tensor) -> float:
    """max |got - want|; a non-finite element (a merge of never-written partial states) is inf."""
    return float((got.float() - want.float()).abs().nan_to_num(nan=math.inf).max())


def judge(err: float, exact_err: float) -> str:
    """A way's verdict against the reference, given the exact plan's own error (module top)."""
    clean = err <= max(CLEAN_FACTOR * exact_err, CLEAN_FLOOR)
    return "clean" if clean else "mismatch" if err >= MISMATCH else "unclear"


def mirror_chunk(rig: Rig, kv_lens, sm: int) -> int:
    """``fa2_split.plan``'s chunk for these host lengths, on this GPU, heads and wrapper."""
    rows = rig.w._max_total_num_rows or rig.bs * rig.block
    return fa2_split.plan([rig.block] * rig.bs, [int(n) for n in kv_lens], num_sm=sm,
                          num_qo_heads=QH, num_kv_heads=KH, head_dim=HD,
                          max_total_num_rows=rows).chunk  # fmt: skip


def verify_ways(rig: Rig, committed, host, bound, sm: int, unguarded: bool = False) -> dict:
    """One verify of the device's ``committed`` lengths (KV: + block) planned from exact
    lengths; with ``unguarded``, from ``bound`` with the guard told nothing (``expect(None)``:
    the plan stands as the bound made it); and from ``bound`` with the guard told the step
    (``BoundStep``: the floor ``host`` + block, the exact lengths read back from the device).
    Per way: its error against the fp32 reference of the device lengths and its verdict, the
    real plan's chunk and the mirror's for the lengths it was planned from, its replans."""
    b, reads, on_device = rig.block, [], committed.to(rig.device)
    args, ref = rig.device_args(committed), rig.reference(on_device)
    step = caps.BoundStep(host, b, lambda: reads.append(1) or rig.read(on_device))
    ways = {"exact": (committed + b, None), "unguarded": (bound, None), "guarded": (bound, step)}
    row: dict = {k: {} for k in ("err", "verdict", "chunk", "mirror_chunk", "replans")}
    outs = {}
    for name, (lens, expect) in ways.items():
        if name == "unguarded" and not unguarded:
            continue
        replans = flashinfer_plan.guard_stats()["replans"]
        flashinfer_plan.expect(expect)
        try:
            row["chunk"][name] = rig.plan(args, lens)["kv_chunk_size"]
        finally:
            flashinfer_plan.expect(None)
        outs[name] = rig.replay()
        rig.settle()
        row["replans"][name] = flashinfer_plan.guard_stats()["replans"] - replans
        planned = committed + b if row["replans"][name] else lens
        row["mirror_chunk"][name] = mirror_chunk(rig, planned, sm)
        row["err"][name] = max_err(outs[name], ref)
    exact = row["err"]["exact"]
    row["verdict"] = {k: judge(e, 0.0 if k == "exact" else exact) for k, e in row["err"].items()}
    return row | {"reads": len(reads), "mirror_chunk_matches": row["chunk"] == row["mirror_chunk"],
                  "bitwise_guarded": bool(torch.equal(outs["exact"], outs["guarded"]))}  # fmt: skip


def grid_cell(rig: Rig, kv: int, gen, sm: int) -> dict:
    """One ``(bs, kv, block)`` cell: random device lengths near ``kv``, the host's lagging."""
    bs, b = rig.bs, rig.block
    committed = (kv - b - torch.randint(0, min(kv // 4, 64) + 1, (bs,), generator=gen)).clamp_(1)
    host = host_committed(committed, b, gen)
    return {"bs": bs, "kv": kv, "block": b, **verify_ways(rig, committed, host, host + 2 * b, sm)}


def straddle_case(rig: Rig, case: dict, sm: int) -> dict:
    """``fa2_split.straddling_case``'s verify, all three ways."""
    committed = torch.tensor(case["device_kv"]) - rig.block  # the device's committed lengths
    host, bound = torch.tensor(case["committed"]), torch.tensor(case["bound_kv"])
    return {"bs": rig.bs, **case, **verify_ways(rig, committed, host, bound, sm, unguarded=True)}


def run_all(dev, make_rig, fast_prefill_plan, grid: dict, sm: int) -> dict:
    """The straddle cases and the grid through the armed guard (as the bound variant plans),
    then the race, on ``dev`` (CUDA or the stand-in); ``make_rig(bs, block, max_kv, plan)``."""
    guarded = flashinfer_plan.guarded(fast_prefill_plan)
    flashinfer_plan.arm()
    cases, rows, gen = [], [], torch.Generator().manual_seed(0)
    heads = {"num_sm": sm, "num_qo_heads": QH, "num_kv_heads": KH, "head_dim": HD}
    for bs in STRADDLE["bs"]:
        case = fa2_split.straddling_case(bs, STRADDLE["block"], **heads)
        rig = make_rig(bs, STRADDLE["block"], max(case["bound_kv"]), guarded)
        cases.append(straddle_case(rig, case, sm))
        log(f"straddle bs {bs}: {cases[-1]}")
        del rig
    for b in grid["block"]:
        for bs in grid["bs"]:
            rig = make_rig(bs, b, max(grid["kv"]), guarded)
            for kv in grid["kv"]:
                rows.append(grid_cell(rig, kv, gen, sm))
                log(f"bs {bs} kv {kv} block {b}: {rows[-1]}")
            del rig
    rig = make_rig(RACE["bs"], RACE["block"], RACE["kv"], fast_prefill_plan)
    return {"num_sm": sm, "straddles": cases, "rows": rows,
            "race": race_pair(dev, rig, fast_prefill_plan)}  # fmt: skip


def plan(args) -> dict:
    grid = QUICK if args.quick else GRID
    cells = [(bs, kv, b) for b in grid["block"] for bs in grid["bs"] for kv in grid["kv"]]
    est = 25 + sum(0.3 + len(grid["kv"]) * CELL_S[bs] for b in grid["block"] for bs in grid["bs"])
    return {"grid": grid, "cells": len(cells), "heads": {"q": QH, "kv": KH, "dim": HD},
            "wrapper": "BatchPrefillWithPagedKVCacheWrapper(NHD, use_cuda_graph, fa2), page 1, "
                       "causal, bf16, no custom mask; stock plan() at capture, then SGLang's "
                       "fast_prefill_plan (guarded and armed) with call_begin_forward's arguments",
            "straddles": dict(STRADDLE, how="fa2_split.straddling_case for this GPU's SM count: "
                              "exact, bound unguarded (expect(None)), bound guarded (BoundStep, "
                              "device lengths read back); unguarded must be a mismatch, guarded "
                              "clean with a replan and a read"),
            "compares": "per cell: exact (committed + block) vs DFLASH's bound (host committed, "
                        "lagging up to one block, + 2 x block) through the guard told the step; "
                        "each against an fp32 reference with a threshold verdict, the real "
                        "kv_chunk_size against bench/fa2_split.py's for the same lengths",
            "thresholds": {"clean_floor": CLEAN_FLOOR, "clean_factor": CLEAN_FACTOR,
                           "mismatch": MISMATCH, "q_scale": Q_SCALE},
            "race": dict(RACE, plans=flashinfer_plan.RING + 1,
                         how="torch.cuda._sleep ahead on the stream, then the plans back to back; "
                             "each plan's host bytes vs its copy's device bytes; unguarded, "
                             "then guarded"),
            "estimated_device_s": round(est, 1)}  # fmt: skip


def run_cuda(args) -> dict:
    import flashinfer

    fast_prefill_plan, source = load_fast_prefill_plan()

    def make_rig(bs, block, max_kv, plan_fn):
        torch.cuda.empty_cache()  # the last rig's KV cache (bs 128: 4 GiB)
        return CudaRig(flashinfer, bs, block, max_kv, plan_fn)

    sm = torch.cuda.get_device_properties(0).multi_processor_count
    grid = QUICK if args.quick else GRID
    return {"source": source, "flashinfer": flashinfer.__version__,
            **run_all(CudaDevice(), make_rig, fast_prefill_plan, grid, sm)}  # fmt: skip


@contextlib.contextmanager
def standin(dev: StandinDevice):
    """The guard's events on ``dev``, and one torch thread for the mirror's tiny tensors
    (``harness.prepare_device``: a busy CPU's second thread slows them ~100x), put back."""
    saved, threads = flashinfer_plan._event, torch.get_num_threads()
    flashinfer_plan._event = dev.event_class()
    harness.prepare_device(torch.device("cpu"))
    try:
        yield
    finally:
        flashinfer_plan._event = saved
        torch.set_num_threads(threads)


def run_standin() -> dict:
    """The dry run: SGLang's real ``fast_prefill_plan`` and the real guard on the stand-in,
    the quick grid, the mirror's SM count (an H100's)."""
    fast_prefill_plan, source = load_fast_prefill_plan()
    dev = StandinDevice()
    with standin(dev):
        make_rig, sm = functools.partial(StandinRig, dev), fa2_split.H100["num_sm"]
        return {"source": source, **run_all(dev, make_rig, fast_prefill_plan, QUICK, sm)}


REQUIRED = ("straddles_caught_unguarded", "straddles_clean_guarded", "replans_counted",
            "grid_clean", "mirror_chunk_matches", "copy_on_the_current_stream", "guard_holds",
            "guard_waited_once")  # fmt: skip


def verdict(result: dict) -> dict:
    """Every key of ``REQUIRED`` must be True (on the stand-in too: there a False is a broken
    check); ``bitwise_where_chunk_unchanged`` must not be False."""
    rows, cases, r = result["rows"], result["straddles"], result["race"]
    clean = lambda x: x["verdict"]["exact"] == x["verdict"]["guarded"] == "clean"  # noqa: E731
    same = [x for x in rows if x["chunk"]["guarded"] == x["chunk"]["exact"]]
    return {"straddles_caught_unguarded": bool(cases) and all(
                c["verdict"]["unguarded"] == "mismatch" and c["replans"]["unguarded"] == 0
                for c in cases),
            "straddles_clean_guarded": bool(cases) and all(clean(c) for c in cases),
            "replans_counted": bool(cases) and all(c["replans"]["guarded"] >= 1 <= c["reads"]
                                                   for c in cases),
            "grid_clean": bool(rows) and all(clean(x) for x in rows),
            "cells": len(rows), "cells_replanned": sum(x["replans"]["guarded"] > 0 for x in rows),
            "bitwise_where_chunk_unchanged": all(x["bitwise_guarded"] for x in same)
                                             if same else None,
            "mirror_chunk_matches": all(x["mirror_chunk_matches"] for x in rows + cases),
            "copy_on_the_current_stream": r["shows_the_corruption"],
            "guard_holds": r["guard_holds"],
            "guard_waited_once": r["guard_waited_once"]}  # fmt: skip


def passed(v: dict) -> bool:
    return all(v[k] for k in REQUIRED) and v["bitwise_where_chunk_unchanged"] is not False


def plot_rows(result: dict, path) -> None:
    """Each verify's error against the reference (1e-6: none), by its longest KV, with the
    thresholds: the grid's guarded plans, the straddle cases' unguarded and guarded ones."""
    import matplotlib.pyplot as plt

    plt.switch_backend("Agg")
    fig, ax = plt.subplots(figsize=(8, 5))
    rows, cases = result["rows"], result["straddles"]
    shown = lambda e: min(max(e, 1e-6), 1e3)  # noqa: E731  # none, and inf, on the chart
    for bs in sorted({r["bs"] for r in rows}):
        pts = [(r["kv"], shown(r["err"]["guarded"])) for r in rows if r["bs"] == bs]
        ax.scatter(*zip(*pts), marker="o", label=f"grid bs {bs}: bound, guarded")
    for way, marker in (("unguarded", "x"), ("guarded", "+")):
        pts = [(max(c["bound_kv"]), shown(c["err"][way])) for c in cases]
        ax.scatter(*zip(*pts), marker=marker, s=80, label=f"straddle cases: bound, {way}")
    for y, what, ls in ((CLEAN_FLOOR, "clean floor", ":"), (MISMATCH, "mismatch", "--")):
        ax.axhline(y, ls=ls, lw=1, c="gray", label=f"{what} {y:g}")
    ax.set_ylim(5e-7, 2e3)
    ax.set(xscale="log", yscale="log", xlabel="KV length", ylabel="max |out - fp32 reference|")
    title = "fa2 verify planned from DFLASH's bound"
    ax.legend(fontsize=8, title=title, loc="upper left", bbox_to_anchor=(1.01, 1))
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)


def main(argv=None) -> int:
    p = harness.add_common_args(argparse.ArgumentParser(description=__doc__.split("\n")[0]))
    p.add_argument("--dry-run", action="store_true", help="the stand-in's check (CPU)")
    args = p.parse_args(argv)
    cuda = torch.cuda.is_available() and not args.dry_run
    if not cuda and not args.dry_run:
        print("flashinfer_check: needs a CUDA GPU; on CPU only --dry-run runs", file=sys.stderr)
        return 2
    device = torch.device("cuda" if cuda else "cpu")
    payload = {"dry_run": not cuda, "device": harness.device_name(device), "plan": plan(args)}
    log(f"planned {payload['plan']['estimated_device_s']} s of device time")
    result = run_cuda(args) if cuda else run_standin()
    payload.update(result, verdict=verdict(result), versions=harness.versions(device))
    payload["thresholds"] = payload["plan"]["thresholds"]
    payload["config"] = {"wall_s": round(time.monotonic() - T0, 1)}
    flat = [dict(x, **{f"{k} {w}": x[k][w] for k in ("err", "verdict", "chunk", "replans")
                       for w in x[k]}) for x in result["straddles"] + result["rows"]]  # fmt: skip
    ways = [f"{k} {w}" for w in ("exact", "unguarded", "guarded") for k in ("err", "verdict")]
    cols = ["bs", "kv", "block", "chunk exact", "chunk guarded", "replans guarded", *ways]
    tables = [harness.format_table(flat, cols + ["mirror_chunk_matches", "bitwise_guarded"])]
    tables.append("\n".join(f"{k}: {v}" for k, v in payload["verdict"].items()))
    chart = None if args.no_plot else lambda path: plot_rows(result, path)  # the dry run too
    out = harness.results_dir(device, args.out)
    count = (f"{len(result['straddles'])} straddle cases, {len(result['rows'])} cells, race "
             f"{'run' if cuda else 'on the stand-in'}")  # fmt: skip
    harness.write_results("flashinfer_check", out, payload, tables=tables, plot=chart, count=count)
    return 0 if passed(payload["verdict"]) else 1


if __name__ == "__main__":
    sys.exit(main())
