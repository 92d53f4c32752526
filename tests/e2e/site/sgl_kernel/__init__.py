"""A stand-in for SGLang's CPU ``sgl_kernel`` build (PyPI has none), on the e2e tier's
PYTHONPATH only. The few ops the tier's runs reach are plain torch or SGLang's own Triton
twin, each with a one-line why; any other op raises when called, naming itself. The
submodules the runs import (``SUBMODULES``) are this same namespace; any other is missing,
as it would be without the build, so SGLang's own ``ImportError`` fallbacks still run."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types

import torch

__version__ = "0.0.0+spec_fused_e2e"


def reconstruct_indices_from_tree_mask(*args):
    """NGRAM's verify metadata from its tree mask: SGLang's own Triton twin of the op."""
    from sglang.kernels.ops.speculative.reconstruct_tree import (
        reconstruct_indices_from_tree_mask_triton,
    )

    return reconstruct_indices_from_tree_mask_triton(*args)


def copy_all_layer_kv_cache_cpu(data_ptrs, strides, tgt_loc, src_loc):
    """KV rows moved between slots of every layer (the pool's warm-up): byte copies by address."""
    import ctypes

    for ptr, stride in zip(data_ptrs.tolist(), strides.tolist()):
        rows = [ctypes.string_at(ptr + s * stride, stride) for s in src_loc.tolist()]
        for t, row in zip(tgt_loc.tolist(), rows):  # all read first: safe in place
            ctypes.memmove(ptr + t * stride, row, stride)


def assign_req_to_token_pool_cpu(
    req_pool_indices, req_to_token, start, end, out_cache_loc, pool_len
):
    """New KV slots written into each request's row of req_to_token (what the Triton kernel
    does)."""
    offset = 0
    for row, s, e in zip(req_pool_indices.tolist(), start.tolist(), end.tolist()):
        req_to_token[row, s:e] = out_cache_loc[offset : offset + e - s].to(req_to_token.dtype)
        offset += e - s


def assign_extend_cache_locs_cpu(req_pool_indices, req_to_token, start, end, out, pool_len):
    """Each request's req_to_token[row, start:end] packed into out (what the Triton kernel does)."""
    offset = 0
    for row, s, e in zip(req_pool_indices.tolist(), start.tolist(), end.tolist()):
        out[offset : offset + e - s] = req_to_token[row, s:e].to(out.dtype)
        offset += e - s


def assign_draft_cache_locs_contiguous_cpu(
    req_pool_indices, req_to_token, seq_lens, out, pool_len, topk, num_cols
):
    """Each request's topk*num_cols draft slots from seq_lens on (what the Triton kernel does)."""
    width = topk * num_cols
    for i, (row, s) in enumerate(zip(req_pool_indices.tolist(), seq_lens.tolist())):
        out[i * width : (i + 1) * width] = req_to_token[row, s : s + width].to(out.dtype)


def fill_accept_out_cache_loc_cpu(accept_index, out_cache_loc, accept_out_cache_loc):
    """The accepted slots' cache locations, packed in order (what the Triton kernel does)."""
    kept = accept_index[accept_index != -1].long()
    accept_out_cache_loc[: kept.numel()] = out_cache_loc[kept].to(accept_out_cache_loc.dtype)


def fill_bonus_tokens_cpu(accept_tokens, accept_lens, bonus_tokens, accept_stride):
    """Each request's last accepted token (what the Triton kernel does)."""
    rows = torch.arange(accept_lens.numel())
    flat = accept_tokens.reshape(-1)
    bonus_tokens.copy_(flat[rows * accept_stride + accept_lens.long() - 1].to(bonus_tokens.dtype))


def verify_tree_greedy_cpu(
    predicts,
    accept_index,
    accept_token_num,
    candidates,
    retrive_index,
    retrive_next_token,
    retrive_next_sibling,
    target_predict,
):
    """Greedy tree verification: sgl-kernel's verify_tree_greedy, the same walk in Python."""
    bs, n = candidates.shape
    cand, r_index = candidates.reshape(-1).tolist(), retrive_index.reshape(-1).tolist()
    r_next, r_sib = (
        retrive_next_token.reshape(-1).tolist(),
        retrive_next_sibling.reshape(-1).tolist(),
    )
    target = target_predict.reshape(-1).tolist()
    flat_predicts = predicts.view(-1)
    for b in range(bs):
        last = r_index[b * n]
        accept_index[b, 0] = last
        accepted, cur = 0, 0
        for _ in range(1, n):
            cur = r_next[b * n + cur]
            while cur != -1:
                draft = r_index[b * n + cur]
                if cand[b * n + cur] == target[last]:
                    flat_predicts[last] = target[last]
                    accepted += 1
                    accept_index[b, accepted] = draft
                    last = draft
                    break
                cur = r_sib[b * n + cur]
            if cur == -1:
                break
        accept_token_num[b] = accepted
        flat_predicts[last] = target[last]


def build_tree_kernel_efficient_cpu(
    parent_list,
    selected_index,
    verified_seq_len,
    tree_mask,
    positions,
    retrive_index,
    retrive_next_token,
    retrive_next_sibling,
    topk,
    depth,
    draft_token_num,
    tree_mask_mode,
):
    """EAGLE's verify tree (mask, positions, retrieve links): sgl-kernel's build_tree_efficient,
    the same walk in Python."""
    n = draft_token_num
    parents, selected = parent_list.tolist(), selected_index.tolist()
    seq_lens = verified_seq_len.tolist()
    mask = tree_mask.view(-1)
    r_index, r_next = retrive_index.view(-1), retrive_next_token.view(-1)
    r_sib = retrive_next_sibling.view(-1)
    full_mask_start = 0
    for b, seq_len in enumerate(seq_lens):
        sel, par = selected[b], parents[b]
        if tree_mask_mode == 0:  # FULL_MASK: rows of seq_len + n
            row_len, base = seq_len + n, full_mask_start + seq_len
            full_mask_start += n * (seq_len + n)
        else:  # QLEN_ONLY: rows of n
            row_len, base = n, n * n * b
        for tid in range(n):
            at = base + row_len * tid + 1
            mask[at - 1] = True
            mask[at : at + n - 1] = False
            if tid == 0:
                continue
            cur, position = tid - 1, 0
            while True:
                position += 1
                mask[at + cur] = True
                parent_tb = sel[cur] // topk
                if parent_tb == 0:
                    break
                token = par[parent_tb]
                cur = next((c for c in range(n) if c < len(sel) and sel[c] == token), n)
            positions[b * n + tid] = position + seq_len
        positions[b * n] = seq_len
        for i in range(n - 1, 0, -1):
            r_index[b * n + i] = b * n + i
            parent_tb = sel[i - 1] // topk
            parent_pos = 0
            if parent_tb > 0:
                token = par[parent_tb]
                parent_pos = next((c + 1 for c in range(n - 1) if sel[c] == token), n)
            if parent_pos == n:
                continue
            first = int(r_next[b * n + parent_pos])
            r_next[b * n + parent_pos] = i
            if first != -1:
                r_sib[b * n + i] = first
        r_index[b * n] = b * n


STANDINS = {
    f.__name__: f
    for f in (
        reconstruct_indices_from_tree_mask,
        copy_all_layer_kv_cache_cpu,
        assign_req_to_token_pool_cpu,
        assign_extend_cache_locs_cpu,
        assign_draft_cache_locs_contiguous_cpu,
        fill_accept_out_cache_loc_cpu,
        fill_bonus_tokens_cpu,
        verify_tree_greedy_cpu,
        build_tree_kernel_efficient_cpu,
    )
}


def _lookup(name):
    if name.startswith("__"):
        raise AttributeError(name)
    if name in STANDINS:
        return STANDINS[name]

    def missing(*args, **kwargs):
        raise NotImplementedError(
            f"sgl_kernel.{name}: no stand-in in spec_fused's e2e tier (tests/e2e/site)"
        )

    missing.__name__ = name
    return missing


__getattr__ = _lookup


SUBMODULES = ("speculative",)


class _Submodules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path, target=None):
        if fullname.partition(".")[0] == __name__ and fullname.partition(".")[2] in SUBMODULES:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = types.ModuleType(spec.name)
        module.__getattr__ = _lookup
        module.__path__ = []
        return module

    def exec_module(self, module):
        pass


sys.meta_path.append(_Submodules())
