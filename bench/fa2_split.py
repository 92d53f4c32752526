"""FlashInfer 0.7.2's fa2 split-KV attention in Python: the plan the host makes from its KV
lengths, the kernel that runs it on the device's, and the merge that joins the two.

Why: a graphed DFLASH verify plans fa2 from host lengths and runs on device lengths. Where
they differ (DFLASH's bound), the plan and the kernel disagree about a request's partition,
and nothing crashes: every query row of that request merges the wrong partial states. This
mirror computes real numbers through both halves, so a CPU test can show the corruption,
prove the straddle guard (``spec_fused/integration/flashinfer_plan.py``) removes it, and
count how often it fires (``python -m bench.fa2_split``, the table in docs/design.md).
The GPU check (``bench/flashinfer_check.py``) holds the mirror to the real plan.

Read from flashinfer-python 0.7.2's wheel (``flashinfer/data/include/flashinfer/``), for
SGLang 0.5.23's use: ``fast_prefill_plan`` under CUDA graphs, page size 1, causal, no
window, ``uniform_q_len=0``, ``fixed_split_size=-1``, ``disable_split_kv=False``
(``sglang/srt/layers/attention/flashinfer_backend.py`` 294-316):

- plan: ``attention/scheduler.cuh`` 101-130 (``PrefillBinarySearchKVChunkSize``: under CUDA
  graphs ``split_kv`` is always true), 545-683 (``PrefillSplitQOKVIndptr``: min chunk 579,
  the graph branch's tile size 603-611, per request ``ceil(host_kv / chunk)`` work items,
  ``merge_indptr`` and ``o_indptr`` 646-670, padding 672-676), 788-791 (at most
  ``2 * num_sm / num_kv_heads`` work items), 845 (``kv_chunk_size`` into the pinned buffer);
  ``utils.cuh`` 411-480 (``FA2DetermineCtaTileQ``); ``csrc/batch_prefill.cu`` 63-67 (the
  plan reads ``kv_indptr``: the host lengths).
- kernel: ``attention/prefill.cuh`` 3808-3833 (the chunk from the plan, ``kv_len`` from the
  device indptr via ``page.cuh`` 185-190, each chunk clamped to it), 3872 and 4293-4335
  (partial rows at ``o_indptr[req] + qo * ceil(device_kv / chunk) + kv_tile``: the row
  stride from the DEVICE length), 4736-4750 (split: partials, then the merge).
- merge: ``attention/cascade.cuh`` 394-470 (``VariableLengthMergeStates``: row ``pos``
  merges slots ``merge_indptr[pos] .. merge_indptr[pos + 1]``, the plan's).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from collections.abc import Sequence
from typing import Optional

import torch

FLASHINFER = "0.7.2"  # the wheel this mirror was read from (the guard's gate: flashinfer_plan)
H100 = {"num_sm": 132, "num_qo_heads": 32, "num_kv_heads": 8, "head_dim": 128}  # Llama-3-8B
DIM = 16  # the head dim of :func:`tensors` (the partition does not depend on it)


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def cta_tile_q(packed_qo_len: int, head_dim: int) -> int:
    """``FA2DetermineCtaTileQ`` (utils.cuh 411-480) for head dims below 256 on sm80+, where
    the 16-row tile fits shared memory (bf16, head dim <= 256)."""
    return 128 if packed_qo_len > 64 else 64 if packed_qo_len > 16 else 16


def binary_search_chunk(max_work: int, packed_qo, kv, tile_q: int, min_chunk: int) -> tuple:
    """``PrefillBinarySearchKVChunkSize`` (scheduler.cuh 101-130), CUDA graphs on:
    ``(split_kv, kv_chunk_size)``, the smallest chunk whose work fits ``max_work``."""
    low, high = min_chunk, max([1, *kv])
    while low < high:
        mid = (low + high) // 2
        work = sum(ceil_div(p, tile_q) * ceil_div(max(n, 1), mid) for p, n in zip(packed_qo, kv))
        low, high = (mid + 1, high) if work > max_work else (low, mid)
    return True, low


@dataclasses.dataclass
class Plan:
    """What ``PrefillPlanImpl`` leaves for the kernel and the merge."""

    split_kv: bool
    chunk: int  # kv_chunk_size, tokens (page size 1)
    tile_q: int
    group: int  # query heads per KV head
    padded_batch_size: int
    work: list  # (request, q tile, kv tile) per CTA, in plan order
    merge_indptr: list  # per query row: its partial slots
    o_indptr: list  # per request: its first partial slot
    qo_indptr: list

    def chunks(self, kv_len: int) -> int:
        return ceil_div(max(kv_len, 1), self.chunk)


def plan(
    qo_lens: Sequence[int],
    kv_lens: Sequence[int],
    *,
    num_sm: int = H100["num_sm"],
    num_qo_heads: int = H100["num_qo_heads"],
    num_kv_heads: int = H100["num_kv_heads"],
    head_dim: int = H100["head_dim"],
    max_total_num_rows: Optional[int] = None,
    disable_split_kv: bool = False,
) -> Plan:
    """``PrefillSplitQOKVIndptr`` (scheduler.cuh 545-683) from host lengths, as SGLang's
    ``fast_prefill_plan`` calls it (``max_total_num_rows``: the rows the graph was captured
    with, ``self._max_total_num_rows or total_num_rows``)."""
    bs, group = len(qo_lens), num_qo_heads // num_kv_heads
    total_rows = max_total_num_rows or sum(qo_lens)
    packed = [q * group for q in qo_lens]
    tile_q = cta_tile_q((total_rows - bs + 1) * group, head_dim)  # 603-605
    total_tiles_q = ceil_div(total_rows * group, tile_q) + bs - 1  # 611
    max_work = (2 * num_sm) // num_kv_heads  # 788-791
    if disable_split_kv:  # 637-638
        split, chunk = False, 1 << 62
    else:  # min_kv_chunk_size = max(128 / page_size, 1): 579
        split, chunk = binary_search_chunk(max_work, packed, kv_lens, tile_q, 128)
    work, merge_indptr, o_indptr, qo_indptr = [], [0], [0], [0]
    for r, (p, q, n) in enumerate(zip(packed, qo_lens, kv_lens)):
        n_chunks = 1 if disable_split_kv else ceil_div(max(n, 1), chunk)  # 651-652
        work += [(r, t, c) for t in range(ceil_div(p, tile_q)) for c in range(n_chunks)]
        merge_indptr += [merge_indptr[-1] + n_chunks * (i + 1) for i in range(q)]
        o_indptr.append(o_indptr[-1] + q * n_chunks)
        qo_indptr.append(qo_indptr[-1] + q)
    padded = max(max_work, total_tiles_q)  # 672-673
    assert len(work) <= padded, "new batch size should not exceed padded batch size"  # 674
    return Plan(split, chunk, tile_q, group, padded, work, merge_indptr, o_indptr, qo_indptr)


def _partial(q, k, v, rows, keys, causal_end):
    """One CTA's state for query rows ``rows`` over KV ``keys``: (o, lse) per row and head,
    an empty chunk giving o = 0, lse = -inf (no key contributes)."""
    s = torch.einsum("qhd,khd->qhk", q[rows], k[keys]) / math.sqrt(q.shape[-1])
    allowed = keys[None, :] <= causal_end[:, None]  # causal: row i sees keys <= its position
    s = s.masked_fill(~allowed[:, None, :], float("-inf"))
    lse = torch.logsumexp(s, -1)
    p = torch.where(allowed[:, None, :], torch.exp(s - lse.clamp(min=-1e30)[..., None]), 0.0)
    return torch.einsum("qhk,khd->qhd", p, v[keys]), lse


def run(p: Plan, kv_lens_device: Sequence[int], q, k, v, kv_start: Sequence[int]) -> dict:
    """The kernel on the device's lengths, then the merge on the plan's ``merge_indptr``:
    ``{"out": [rows, heads, dim], "collisions": partial slots two CTAs wrote, "stale_reads":
    slots the merge read that no CTA wrote (here: a fixed stand-in for old bytes)}``. ``q`` holds
    every request's rows (``p.qo_indptr``), ``k``/``v`` the KV cache, request ``r``'s KV at
    ``kv_start[r] ...``; heads are one KV head's group (the partition is the same per head)."""
    rows_total = p.qo_indptr[-1]
    if not p.split_kv:  # the kernel writes each row's whole attention: no merge
        out = torch.zeros_like(q)
        for r, t, _ in p.work:
            rows, keys, end = _rows_keys(p, r, t, 0, kv_lens_device[r], kv_start[r], full=True)
            out[rows] = _partial(q, k, v, rows, keys, end)[0]
        return {"out": out, "collisions": 0, "stale_reads": 0}
    slots: dict = {}  # partial slot -> (o, lse) of the last CTA that wrote it
    writers: dict = {}
    for r, t, c in p.work:  # plan order; CTAs run in any order, so a collision is a race
        n_dev = p.chunks(kv_lens_device[r])  # prefill.cuh 4293: the device length's chunks
        rows, keys, end = _rows_keys(p, r, t, c, kv_lens_device[r], kv_start[r])
        o, lse = _partial(q, k, v, rows, keys, end)
        for i, row in enumerate(rows.tolist()):
            slot = p.o_indptr[r] + (row - p.qo_indptr[r]) * n_dev + c  # 3872, 4333
            writers[slot] = writers.get(slot, 0) + 1
            slots[slot] = (o[i], lse[i])
    out, stale_reads = torch.zeros_like(q), 0
    stale = (torch.full_like(q[0], 7.0), torch.zeros(q.shape[1:2], dtype=q.dtype))  # old bytes
    for pos in range(rows_total):  # cascade.cuh 394-470
        read = range(p.merge_indptr[pos], p.merge_indptr[pos + 1])
        stale_reads += sum(s not in slots for s in read)
        states = [slots.get(s, stale) for s in read]
        if states:
            o = torch.stack([s[0] for s in states])
            lse = torch.stack([s[1] for s in states])
            w = torch.softmax(torch.where(torch.isinf(lse), -1e30, lse), 0)
            w = torch.where(torch.isinf(lse), 0.0, w)
            out[pos] = torch.einsum("sh,shd->hd", w, o) / w.sum(0).clamp(min=1e-30)[:, None]
    collisions = sum(n - 1 for n in writers.values())
    return {"out": out, "collisions": collisions, "stale_reads": stale_reads}


def _rows_keys(p: Plan, r, t, c, kv_len, start, full=False):
    """The rows of q tile ``t`` of request ``r`` and the keys of its chunk ``c``, clamped to
    the device length (prefill.cuh 3826-3833), and each row's last visible key."""
    qo_len = p.qo_indptr[r + 1] - p.qo_indptr[r]
    first = t * p.tile_q // p.group
    last = min(qo_len, ceil_div((t + 1) * p.tile_q, p.group))
    lo, hi = (0, kv_len) if full else (min(c * p.chunk, kv_len), min((c + 1) * p.chunk, kv_len))
    rows = torch.arange(p.qo_indptr[r] + first, p.qo_indptr[r] + last)
    keys = torch.arange(start + lo, start + hi)
    end = start + kv_len - qo_len + torch.arange(first, last)
    return rows, keys, end


def reference(qo_lens, kv_lens_device, q, k, v, kv_start) -> torch.Tensor:
    """Causal attention of each request's rows over its device KV, in one piece."""
    out, at = torch.zeros_like(q), 0
    for r, (n_q, n_kv) in enumerate(zip(qo_lens, kv_lens_device)):
        rows = torch.arange(at, at + n_q)
        keys = torch.arange(kv_start[r], kv_start[r] + n_kv)
        out[rows] = _partial(q, k, v, rows, keys, kv_start[r] + n_kv - n_q + torch.arange(n_q))[0]
        at += n_q
    return out


def tensors(qo_lens, kv_lens, *, group: int = 4, dim: int = DIM, seed: int = 0) -> tuple:
    """Random q (every request's rows), a KV cache holding every request's keys, starts."""
    gen = torch.Generator().manual_seed(seed)
    starts = [0]
    for n in kv_lens[:-1]:
        starts.append(starts[-1] + n)
    q = torch.randn(sum(qo_lens), group, dim, generator=gen, dtype=torch.float64)
    k = torch.randn(sum(kv_lens), group, dim, generator=gen, dtype=torch.float64)
    v = torch.randn(sum(kv_lens), group, dim, generator=gen, dtype=torch.float64)
    return q, k, v, starts


def attention_error(host, device, *, block: int = 16, **plan_kw) -> dict:
    """A verify of ``block`` rows per request planned from ``host`` KV lengths and run on
    ``device`` ones: the largest error against the reference, the plan, the collisions."""
    qo = [block] * len(host)
    p = plan(qo, host, **plan_kw)
    q, k, v, starts = tensors(qo, [max(h, d) for h, d in zip(host, device)], group=p.group)
    got = run(p, device, q, k, v, starts)
    want = reference(qo, device, q, k, v, starts)
    err = float((got["out"] - want).abs().max())
    return {"max_err": err, "chunk": p.chunk, "plan": p,
            "collisions": got["collisions"], "stale_reads": got["stale_reads"]}  # fmt: skip


def straddling_case(bs: int, block: int = 16, lag: int = 4, **plan_kw) -> dict:
    """A deterministic verify of ``bs`` requests whose bound plan corrupts attention: the
    host committed ``lag`` tokens behind the device, the bound ``committed + 2 * block``,
    and a chunk boundary between device and bound for at least one request (bs 1 on an
    H100: device 1020, bound 1032, chunk 128); ``plan_kw``: the GPU's, as :func:`plan`."""
    for base in range(1000, 8000):
        committed = [base + 613 * i for i in range(bs)]  # spread: unlike chunk counts
        device = [c + lag + block for c in committed]  # KV lengths, the verify included
        bound = [c + 2 * block for c in committed]
        p = plan([block] * bs, bound, **plan_kw)
        hit = [i for i in range(bs) if p.chunks(device[i]) != p.chunks(bound[i])]
        if hit:
            return {"committed": committed, "device_kv": device, "bound_kv": bound,
                    "chunk": p.chunk, "straddling": hit}  # fmt: skip
    raise ValueError(f"no straddling case for bs {bs}")


# -- how often a bound straddles a chunk boundary (the design doc's table) --------------------


def step_lengths(gen, bs: int, context: int, block: int):
    """One DFLASH step at page size 1 (dflash_info_v2.prepare_for_decode): the host's
    committed lengths, the device's (ahead by one verify's accepted tokens, 1..block, or
    level), and the bound ``committed + 2 * block``; KV lengths include the verify's block."""
    committed = torch.randint(context // 2, context + 1, (bs,), generator=gen)
    lag = torch.randint(0, block + 1, (bs,), generator=gen)
    return committed + block, committed + lag + block, committed + 2 * block


def straddle_table(
    bss=(1, 2, 4, 8, 16, 32, 64), contexts=(512, 2048, 8192, 32768), block=16, steps=400
):
    """Per (batch, context): the share of steps whose bound plan would corrupt a request
    unguarded, the share the guard replans (a chunk boundary within [lower, bound] of any
    request), and the chunk the bound plan picks (median)."""
    from spec_fused.integration.flashinfer_plan import straddles

    gen, rows = torch.Generator().manual_seed(0), []
    for bs in bss:
        for ctx in contexts:
            corrupt = replan = 0
            chunks = []
            for _ in range(steps):
                lower, device, bound = step_lengths(gen, bs, ctx, block)
                p = plan([block] * bs, bound.tolist())
                chunks.append(p.chunk)
                dev_chunks = (device - 1) // p.chunk
                corrupt += bool((dev_chunks != (bound - 1) // p.chunk).any())
                replan += straddles(lower, bound, p.chunk)
            rows.append({"bs": bs, "context": ctx, "chunk": sorted(chunks)[steps // 2],
                         "corrupt_unguarded": corrupt / steps,
                         "replanned": replan / steps})  # fmt: skip
    return rows


def split_off_cost(bss=(1, 4, 16, 64), contexts=(2048, 32768), block=16) -> list:
    """Option (b), ``disable_split_kv``: the longest CTA's KV tokens against split-KV's,
    and the CTAs each runs on (per KV head) - the critical path a GPU would pay."""
    rows = []
    for bs in bss:
        for ctx in contexts:
            lens = [ctx + block] * bs
            on, off = plan([block] * bs, lens), plan([block] * bs, lens, disable_split_kv=True)
            rows.append({"bs": bs, "context": ctx, "ctas_split": len(on.work),
                         "ctas_unsplit": len(off.work),
                         "longest_cta_split": min(on.chunk, ctx + block),
                         "longest_cta_unsplit": ctx + block})  # fmt: skip
    return rows


def markdown(rows: list, cols: list) -> str:
    head = "| " + " | ".join(cols) + " |\n|" + "---:|" * len(cols) + "\n"
    return head + "\n".join("| " + " | ".join(str(r[c]) for c in cols) + " |" for r in rows)


def pivot(rows: list) -> str:
    """The straddle table as docs/design.md shows it: batch by context, each cell the share
    of steps the guard replans (the share a bound plan would corrupt unguarded)."""
    ctxs = sorted({r["context"] for r in rows})
    cells = {(r["bs"], r["context"]): r for r in rows}
    share = lambda r: f"{r['replanned']:.0%} ({r['corrupt_unguarded']:.0%})"  # noqa: E731
    out = [{"bs": bs} | {f"{c:,}": share(cells[bs, c]) for c in ctxs}
           for bs in sorted({r["bs"] for r in rows})]  # fmt: skip
    return markdown(out, ["bs", *(f"{c:,}" for c in ctxs)])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=400, help="steps per cell (seeded: repeatable)")
    p.add_argument("--json", help="also write the tables here")
    args = p.parse_args(argv)
    table, cost = straddle_table(steps=args.steps), split_off_cost()
    print(f"fa2 split-KV, FlashInfer {FLASHINFER} mirror, {H100}, block 16, page 1, committed")
    print("lengths uniform in [context/2, context], the device 0..16 tokens ahead:")
    print("steps the guard replans (steps a bound plan would corrupt unguarded)\n")
    print(pivot(table))
    print("\ndisable_split_kv (option b): CTAs per KV head and the longest CTA's KV tokens\n")
    print(markdown(cost, list(cost[0])))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {"flashinfer": FLASHINFER, "straddles": table, "split_off": cost}, f, indent=1
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
