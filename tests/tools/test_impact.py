"""The "where it helps" table (spec_fused/tools/impact.py) held to the installed release's source:
which attention backends opt out of host lengths and on what condition, which draft
backends DFLASH keeps, and what upstream's relay step does (the copy, the sync) that the
cost columns claim. The compat tier runs this once per tested release."""

import ast
import importlib.util
from pathlib import Path

import pytest

from spec_fused.integration import sglang_patch
from spec_fused.tools import impact

VERSION = sglang_patch._sglang_version()


def module_source(module: str) -> str:
    """A module's source without importing it ("" where this release has no such module)."""
    spec = importlib.util.find_spec(module)
    return Path(spec.origin).read_text(encoding="utf-8") if spec else ""


ATTN = "sglang.srt.layers.attention."
# --attention-backend value -> (module, class) as the attention registry maps it
CLASSES = {
    "triton": ("triton_backend", "TritonAttnBackend"),
    "trtllm_mha": ("trtllm_mha_backend", "TRTLLMHAAttnBackend"),
    "trtllm_mla": ("trtllm_mla_backend", "TRTLLMMLABackend"),
    "fa3": ("flashattention_backend", "FlashAttentionBackend"),
    "fa4": ("flashattention_backend", "FlashAttentionBackend"),
    "flashmla": ("flashmla_backend", "FlashMLABackend"),
    "dsa": ("dsa_backend", "DeepseekSparseAttnBackend"),
    "flashinfer": ("flashinfer_backend", "FlashInferAttnBackend"),
    "aiter": ("aiter_backend", "AiterAttnBackend"),
}


def _class_assignments(module: str, cls: str) -> list:
    """The source of every assignment to ``needs_cpu_seq_lens`` in the class body or its
    methods (``self.needs_cpu_seq_lens = ...``)."""
    spec = importlib.util.find_spec(ATTN + module)
    src = Path(spec.origin).read_text(encoding="utf-8")
    node = next(n for n in ast.parse(src).body if isinstance(n, ast.ClassDef) and n.name == cls)
    found = []
    for sub in ast.walk(node):
        targets = []
        if isinstance(sub, ast.AnnAssign):
            targets = [sub.target]
        elif isinstance(sub, (ast.Assign, ast.AugAssign)):
            targets = getattr(sub, "targets", None) or [sub.target]
        for t in targets:
            name = t.id if isinstance(t, ast.Name) else getattr(t, "attr", None)
            if name == "needs_cpu_seq_lens":
                found.append(ast.get_source_segment(src, sub))
    return found


@pytest.mark.parametrize("backend", sorted(CLASSES))
def test_the_backend_facts_are_this_releases(backend):
    module, cls = CLASSES[backend]
    if importlib.util.find_spec(ATTN + module) is None:
        pytest.fail(f"{module} is not in SGLang {VERSION}")
    assigned = " ; ".join(_class_assignments(module, cls))
    opts_out, note = impact.gpu_only(VERSION, backend, "EAGLE")
    dflash_only = impact.gpu_only(VERSION, backend, "DFLASH")[0] and not opts_out
    if dflash_only:
        assert "is_dflash()" in assigned, assigned
    elif opts_out:
        assert (
            "needs_cpu_seq_lens: bool = False" in assigned
            or "self.needs_cpu_seq_lens = False" in assigned
        ), assigned
    else:
        assert "False" not in assigned and "is_dflash" not in assigned, assigned
    kv_shard = "_kv_shard_pool is not None" in assigned
    assert kv_shard == ("KV-shard" in note), (assigned, note)
    kpool = "dsa_index_kpool > 1" in assigned
    assert kpool == ("dsa_index_kpool" in note), (assigned, note)


def test_dflash_keeps_the_draft_backends_the_table_says():
    hook = module_source("sglang.srt.arg_groups.speculative_hook") or ""
    choices = module_source("sglang.srt.arg_groups.choices") or ""
    worker = module_source("sglang.srt.speculative.dflash_worker_v2") or ""
    text = hook + choices + worker
    kept = impact._at(VERSION, impact._DFLASH_DRAFTS)
    for name in kept:
        assert f'"{name}"' in text, name
    assert ('"trtllm_mha"' in text and "trtllm_mha" in kept) or "trtllm_mha" not in kept


def test_upstreams_step_costs_are_what_the_columns_claim():
    """Host lengths: a scatter, a gather, a copy of the whole pool to pinned memory and a
    stream synchronize; without them, the scatter and the gather only."""
    src = module_source("sglang.srt.managers.overlap_utils")
    tree = ast.parse(src)
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "FutureMap")
    methods = {
        n.name: ast.unparse(n)
        for n in cls.body  # code only, no comments
        if isinstance(n, ast.FunctionDef)
    }
    publish, resolve = methods["publish"], methods["resolve_seq_lens_cpu"]
    assert "self.new_seq_lens_buf[indices] = new_seq_lens.to(" in publish
    assert "batch.seq_lens = self.new_seq_lens_buf[fi]" in resolve
    assert "self.new_seq_lens_cpu_pinned.copy_(self.new_seq_lens_buf" in resolve  # 8·pool
    assert "self.fwd_prepare_d2h_stream.synchronize()" in resolve  # the host sync
    gpu_only_branch = resolve[resolve.index("if not self.needs_cpu_seq_lens") :]
    gpu_only_branch = gpu_only_branch[: gpu_only_branch.index("return")]
    assert ".cpu()" not in gpu_only_branch and "synchronize" not in gpu_only_branch


@pytest.mark.parametrize("algorithm", ["DFLASH", "EAGLE", "NGRAM"])
def test_every_row_says_where_it_helps_from_the_host_lengths(algorithm):
    for backend in CLASSES:
        row = impact.configuration(VERSION, backend, algorithm)
        assert ("nothing that matters" in row.verdict) is not row.needs_host_lengths
        draft = backend
        if algorithm == "DFLASH" and backend not in impact._at(VERSION, impact._DFLASH_DRAFTS):
            draft = "flashinfer"  # DFLASH's draft falls back to it
        flashinfer = "flashinfer" in (backend, draft)
        waits_later = row.needs_host_lengths and flashinfer and not row.bound
        assert ("host still waits later" in row.verdict) is waits_later
    assert impact.configuration(
        VERSION, "triton", "EAGLE", two_batch_overlap=True
    ).needs_host_lengths


def test_flashinfer_blocks_the_host_later_in_the_step_as_the_rows_say():
    """Where a FlashInfer row says the saving is the copy's µs, not a host wait: its
    multi-step draft copies kv_indptr to the host and a verify plan() copies its indptrs,
    and the flags the note names to lift that exist from 0.5.23 (read from this
    release's backend)."""
    from spec_fused.releases import parse

    src = module_source("sglang.srt.layers.attention.flashinfer_backend")
    assert "self.kv_indptr[:, : bs + 1].cpu()" in src
    assert impact.FLASHINFER_BLOCKS in impact.configuration(VERSION, "flashinfer", "EAGLE").notes
    assert (
        impact.FLASHINFER_BLOCKS not in impact.configuration(VERSION, "flashinfer", "DFLASH").notes
    )
    for flag in (
        "SGLANG_OPT_FLASHINFER_DRAFT_HOST_INDPTR",
        "SGLANG_OPT_FLASHINFER_VERIFY_HOST_PLAN",
    ):
        assert flag in impact.FLASHINFER_BLOCKS
        assert (flag in src) is (parse(VERSION) >= parse("0.5.23")), flag


def test_dflash_on_flashinfer_loses_a_host_wait_exactly_where_the_release_plans_from_the_host():
    """0.5.19+: a graphed DFLASH verify plans FlashInfer from host lengths with no readback
    (``fast_prefill_plan``; tests/test_compat.py reads it per release), so DFLASH's own
    bound takes the step's FutureMap wait away: 2 host waits a step -> 1, not relayed
    until a GPU measures it. Before, the stock plan() blocks the host anyway."""
    from compat.expectations import RELEASES

    row = impact.configuration(VERSION, "flashinfer", "DFLASH")
    assert row.bound is RELEASES[VERSION].host_plan and row.needs_host_lengths
    assert ("host waits per step 2 → 1" in row.verdict) is row.bound
    assert (impact.DFLASH_BOUND in row.notes) is row.bound
    assert (impact.FLASHINFER_BLOCKS_DFLASH in row.notes) is not row.bound
    assert not row.relayed and "not measured level" in row.verdict
    assert not impact.configuration(VERSION, "flashinfer", "DFLASH", two_batch_overlap=True).bound
    assert not impact.configuration(VERSION, "flashinfer", "EAGLE").bound
