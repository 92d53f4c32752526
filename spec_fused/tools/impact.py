"""Where spec_fused helps, and where it changes nothing that matters, per release, attention
backend and algorithm.

Why: upstream recovered most of PR #29232's regression by other means. Where every
attention backend opts out of host lengths, upstream's step is already GPU-only: the fused
launch saves launches and host µs. Where one reads them, upstream copies the whole request
pool to the host and blocks on it every step; the fused step copies ``8·n`` bytes up and
``8·(n + 1)`` down instead - and is SGLang's own until a GPU measures it level
(``spec_fused/measured.py``). FlashInfer then blocks the host again in the same step for
EAGLE (its planning copies), so there the saving is the copy's µs, not the wait. DFLASH on
FlashInfer from 0.5.19 plans its graphed verify without a readback: there the bound
variant takes the step's wait away (host waits 2 -> 1) on every step whose plans need no
exact replan (the partition guard: ``integration/flashinfer_plan.py``). Read from each
release's wheel and held to it by ``tests/tools/test_impact.py``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from spec_fused.integration.flashinfer_plan import BOUND_RELEASES
from spec_fused.measured import handed_to_sglang
from spec_fused.releases import parse

__all__ = ["Row", "configuration", "ranged_rows", "release_rows", "render_markdown"]

_SHARD = "0.5.21+: host lengths with a KV-shard pool"
_KPOOL = "0.5.20 - 0.5.21: host lengths when dsa_index_kpool > 1"
# --attention-backend values that set needs_cpu_seq_lens=False, from the release that
# first did (later entries supersede), with the condition that turns it back on. Every
# other backend inherits the base class's True.
_GPU_ONLY = {
    "triton": [("0.5.15", "")],
    "trtllm_mha": [("0.5.15", "")],
    "trtllm_mla": [("0.5.15", ""), ("0.5.21", _SHARD)],
    "cutedsl_mla": [("0.5.15", ""), ("0.5.21", _SHARD)],
    "tokenspeed_mla": [("0.5.15", ""), ("0.5.21", _SHARD)],
    "fa3": [("0.5.15", "DFLASH only"), ("0.5.16", ""), ("0.5.21", _SHARD)],
    "fa4": [("0.5.15", "DFLASH only"), ("0.5.16", ""), ("0.5.21", _SHARD)],
    "flashmla": [("0.5.16", "")],
    "dsa": [("0.5.15", ""), ("0.5.20", _KPOOL), ("0.5.22", "")],
    "nsa": [("0.5.15", ""), ("0.5.20", _KPOOL), ("0.5.22", "")],
    "qsa": [("0.5.20", "")],
    "dsv4": [("0.5.16", "on CUDA, unless online c128 MTP is on")],
}
# DFLASH's draft runner takes --speculative-draft-attention-backend, else the target's; one
# it does not support falls back to flashinfer.
_DFLASH_DRAFTS = [
    ("0.5.15", ("flashinfer", "fa3", "fa4", "triton", "ascend")),
    ("0.5.17", ("flashinfer", "fa3", "fa4", "triton", "ascend", "trtllm_mha")),
    ("0.5.20", ("flashinfer", "fa3", "fa4", "triton", "ascend", "trtllm_mha", "intel_xpu")),
]
# FlashInfer's own planning blocks the host in the same step for the EAGLE family: the
# multi-step draft copies kv_indptr to the host (.cpu()), a verify plan() copies qo/kv
# indptr (.to("cpu")). A graphed DFLASH verify plans host-built from 0.5.19 (BOUND_RELEASES).
FLASHINFER_BLOCKS = (
    "FlashInfer blocks the host later in the step (the draft's kv_indptr .cpu(), the verify "
    "plan()): the saving is the copy's µs, not the wait; from 0.5.23 "
    "SGLANG_OPT_FLASHINFER_DRAFT_HOST_INDPTR=1 and SGLANG_OPT_FLASHINFER_VERIFY_HOST_PLAN=1 "
    "(EAGLE top-k 1, CUDA graphs) lift them"
)
FLASHINFER_BLOCKS_DFLASH = (
    "FlashInfer blocks the host later in the step (a graphed DFLASH verify's stock plan() "
    "copies its indptrs; from 0.5.19 it plans without a readback)"
)
DFLASH_BOUND = (
    "DFLASH plans FlashInfer fa2 from its own KV bound, each plan's split-KV partition "
    "checked (a step with a chunk boundary in a request's window replans from exact lengths: "
    "one wait) and its pinned buffer guarded (FlashInfer 0.7.1 - 0.7.2.post1, CUDA graphs; "
    "no sliding window, draft window, dequant KV or multimodal model)"
)


def _at(release: str, entries: list):
    """The entry in force at ``release`` (entries sorted by first release), or None."""
    key, found = parse(release), None
    for first, value in entries:
        if key is not None and key >= parse(first):
            found = value
    return found


def gpu_only(release: str, backend: str, algorithm: str = "EAGLE") -> tuple[bool, str]:
    """``(opts_out, note)``: whether ``backend`` sets ``needs_cpu_seq_lens=False``."""
    note = _at(release, _GPU_ONLY.get(backend, []))
    if note is None:
        return False, ""
    if note == "DFLASH only":
        return algorithm == "DFLASH", "0.5.15: opts out under DFLASH only"
    return True, note


@dataclass
class Row:
    release: str
    backend: str
    algorithm: str
    needs_host_lengths: bool
    notes: list = field(default_factory=list)
    bound: bool = False  # DFLASH's own bound serves every reader of host lengths

    @property
    def relayed(self) -> bool:
        """spec_fused relays it on a GPU by default (``spec_fused/measured.py``)."""
        exact = self.needs_host_lengths and not self.bound
        return handed_to_sglang("cuda", exact=exact, bound=self.bound) is None

    @property
    def saving(self) -> str:
        """What relaying it changes per step."""
        if not self.needs_host_lengths:
            return "nothing that matters: upstream is GPU-only here (2 device ops → 1)"
        if self.bound:
            return "8·pool-byte D2H and its wait → none, no host lengths: host waits per step 2 → 1"
        flashinfer = "flashinfer" in self.backend or any("FlashInfer" in n for n in self.notes)
        waits = "the host still waits later" if flashinfer else "the host waits for one stream"
        return f"scatter + gather → 1 launch; 8·pool-byte D2H → 8·n up, 8·(n+1) down; {waits}"

    @property
    def verdict(self) -> str:
        if self.relayed:
            return self.saving
        return f"nothing by default: SGLang's relay (not measured level); relayed: {self.saving}"


def configuration(
    release: str,
    backend: str,
    algorithm: str,
    *,
    draft_backend: Optional[str] = None,
    two_batch_overlap: bool = False,
) -> Row:
    """The row for one configuration, in SGLang's own flag terms."""
    algorithm = "EAGLE" if algorithm.upper() == "NEXTN" else algorithm.upper()
    row = Row(release, backend, algorithm, False)
    backends = [backend]
    if algorithm in ("DFLASH", "DSPARK"):
        chosen = draft_backend or backend
        if chosen not in (_at(release, _DFLASH_DRAFTS) or ()):
            row.notes.append(f"the DFLASH draft falls back from {chosen} to flashinfer")
            chosen = "flashinfer"
        backends.append(chosen)
    elif draft_backend:
        backends.append(draft_backend)
    for b in dict.fromkeys(backends):
        opts_out, note = gpu_only(release, b, algorithm)
        row.notes += [f"{b}: {note}"] if note else []
        row.needs_host_lengths |= not opts_out
    if algorithm == "NGRAM":
        row.needs_host_lengths = True
        row.notes.append("NGRAM forces host lengths on every backend")
    if two_batch_overlap:
        row.needs_host_lengths = True
        row.notes.append("two-batch overlap forces host lengths")
    readers = [b for b in dict.fromkeys(backends) if not gpu_only(release, b, algorithm)[0]]
    dflash_plans_host = algorithm == "DFLASH" and release in BOUND_RELEASES
    if row.needs_host_lengths and "flashinfer" in backends and algorithm == "DFLASH":
        row.bound = dflash_plans_host and readers == ["flashinfer"] and not two_batch_overlap
        row.notes.append(DFLASH_BOUND if row.bound else FLASHINFER_BLOCKS_DFLASH)
    elif row.needs_host_lengths and "flashinfer" in backends:
        row.notes.append(FLASHINFER_BLOCKS)
    return row


# The configurations the README's table and doctor's default listing show.
TABLE_CONFIGS = [
    ("fa3", "DFLASH", None, "Hopper's default for DFLASH"),
    ("fa3", "EAGLE", None, "Hopper's default for EAGLE top-k 1"),
    ("trtllm_mha", "DFLASH", "fa4", "PR #29232's own benchmark"),
    ("flashinfer", "DFLASH", None, ""),
    ("flashinfer", "EAGLE", None, "Hopper's default for EAGLE top-k > 1"),
    ("triton", "EAGLE", None, ""),
    ("fa3", "NGRAM", None, ""),
]


def release_rows(release: str) -> list[Row]:
    rows = []
    for backend, algorithm, draft, why in TABLE_CONFIGS:
        row = configuration(release, backend, algorithm, draft_backend=draft)
        row.notes = [why, *row.notes] if why else row.notes
        rows.append(row)
    return rows


def ranged_rows(releases) -> list[tuple[str, Row]]:
    """``[(release range, Row)]`` for every configuration of the table, consecutive
    releases with the same answer merged."""
    out = []
    for index in range(len(TABLE_CONFIGS)):
        runs: list = []
        for release in releases:
            row = release_rows(release)[index]
            if runs and runs[-1][2] == (row.needs_host_lengths, row.verdict):
                runs[-1][1] = release
                runs[-1][3].notes = list(dict.fromkeys(runs[-1][3].notes + row.notes))
            else:
                runs.append([release, release, (row.needs_host_lengths, row.verdict), row])
        out += [(a if a == b else f"{a} – {b}", row) for a, b, _, row in runs]
    return out


def render_markdown(ranged: list) -> str:
    """The README's table: per relay step on CUDA, upstream → spec_fused."""
    lines = [
        "| SGLang | attention backend | algorithm | host lengths | relayed | what relaying it "
        "changes per step | notes |",
        "|---|---|---|---|---|---|---|",
    ]
    for releases, r in ranged:
        read = "read (pool copy, sync)" if r.needs_host_lengths else "opted out"
        short = {
            FLASHINFER_BLOCKS: "FlashInfer blocks the host later",
            DFLASH_BOUND: "DFLASH's own bound (fa2, CUDA graphs)",
        }
        short[FLASHINFER_BLOCKS_DFLASH] = short[FLASHINFER_BLOCKS]
        notes = [short.get(n, n) for n in r.notes]
        relayed = "yes" if r.relayed else "no: not measured level yet"
        lines.append(
            f"| {releases} | {r.backend} | {r.algorithm} | {read} | {relayed} | {r.saving} "
            f"| {'; '.join(notes)} |"
        )
    return "\n".join(lines)
