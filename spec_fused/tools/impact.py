"""Where spec_fused helps, and where it changes nothing that matters: per release, attention
backend and algorithm, what one relay step costs upstream and with spec_fused.

Why: upstream recovered most of PR #29232's regression by other means (the read-done WAR
barrier, device-side FA3/FA4 page tables, DFLASH's sync-free decode). What is left for
the relay to remove depends on whether the step's attention backends read host lengths
(``needs_cpu_seq_lens``): where every backend opts out, upstream's step is already
GPU-only and the fused launch saves one launch and some host time; where one reads them,
upstream copies the whole request pool to the host and blocks on it every step, and the
fused launch replaces that with ``bs + 2`` values written by the launch itself.

The facts below were read from each release's wheel (``layers/attention/*.py``, the
attention registry, ``dflash_worker_v2.py``'s draft-backend choice, ``overlap_utils.py``)
and are held to every tested release by ``tests/tools/test_impact.py``. ``doctor`` prints the
installed release's rows, or one configuration's with SGLang's own flag names.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from spec_fused.releases import parse

__all__ = [
    "Row",
    "configuration",
    "gpu_only",
    "ranged_rows",
    "release_rows",
    "render_markdown",
    "saving",
]

# --attention-backend values that set needs_cpu_seq_lens=False, from the release that
# first did (each entry supersedes the previous one), with any condition that turns the
# need back on. Every other backend inherits the base class's True: it reads host lengths.
_GPU_ONLY = {
    "triton": [("0.5.15", "")],
    "trtllm_mha": [("0.5.15", "")],
    "trtllm_mla": [
        ("0.5.15", ""),
        ("0.5.21", "from 0.5.21, host lengths again with a KV-shard pool"),
    ],
    "cutedsl_mla": [
        ("0.5.15", ""),
        ("0.5.21", "from 0.5.21, host lengths again with a KV-shard pool"),
    ],
    "tokenspeed_mla": [
        ("0.5.15", ""),
        ("0.5.21", "from 0.5.21, host lengths again with a KV-shard pool"),
    ],
    "fa3": [
        ("0.5.15", "DFLASH only"),
        ("0.5.16", ""),
        ("0.5.21", "from 0.5.21, host lengths again with a KV-shard pool"),
    ],
    "fa4": [
        ("0.5.15", "DFLASH only"),
        ("0.5.16", ""),
        ("0.5.21", "from 0.5.21, host lengths again with a KV-shard pool"),
    ],
    "flashmla": [("0.5.16", "")],
    "dsa": [
        ("0.5.15", ""),
        ("0.5.20", "0.5.20 - 0.5.21: host lengths when dsa_index_kpool > 1"),
        ("0.5.22", ""),
    ],
    "nsa": [
        ("0.5.15", ""),
        ("0.5.20", "0.5.20 - 0.5.21: host lengths when dsa_index_kpool > 1"),
        ("0.5.22", ""),
    ],
    "qsa": [("0.5.20", "")],
    "dsv4": [("0.5.16", "on CUDA, unless online c128 MTP is on")],
}
# DFLASH's draft runner takes --speculative-draft-attention-backend, else the target's;
# one it does not support falls back to flashinfer (dflash_worker_v2 / speculative_hook).
_DFLASH_DRAFTS = [
    ("0.5.15", ("flashinfer", "fa3", "fa4", "triton", "ascend")),
    ("0.5.17", ("flashinfer", "fa3", "fa4", "triton", "ascend", "trtllm_mha")),
    ("0.5.20", ("flashinfer", "fa3", "fa4", "triton", "ascend", "trtllm_mha", "intel_xpu")),
]
_DRAFT_CAVEAT = {
    "trtllm_mha": "kept for the draft only if its layers are all sliding-window "
    "or it is causal, else flashinfer (from 0.5.17)"
}


def _at(release: str, entries: list):
    """The entry in force at ``release`` (entries sorted by first release), or None."""
    key, found = parse(release), None
    for first, value in entries:
        if key is not None and key >= parse(first):
            found = value
    return found


def gpu_only(release: str, backend: str, algorithm: str = "EAGLE") -> tuple:
    """``(opts_out, note)``: whether ``backend`` sets ``needs_cpu_seq_lens=False`` at
    ``release`` for ``algorithm``, and the condition that turns it back on."""
    note = _at(release, _GPU_ONLY.get(backend, []))
    if note is None:
        return False, ""
    if note == "DFLASH only":
        return algorithm == "DFLASH", "opts out under DFLASH only (0.5.15)"
    return True, note


def _dflash_draft(release: str, target: str, draft: Optional[str]) -> tuple:
    chosen = draft or target
    supported = _at(release, _DFLASH_DRAFTS) or ()
    if chosen not in supported:
        return "flashinfer", f"the DFLASH draft falls back from {chosen} to flashinfer"
    return chosen, _DRAFT_CAVEAT.get(chosen, "")


@dataclass
class Row:
    release: str
    backend: str
    algorithm: str
    needs_host_lengths: bool
    notes: tuple
    upstream: dict
    spec_fused: dict
    verdict: str


def _costs(needs_host: bool) -> tuple:
    """Per relay step (publish + resolve) on CUDA: device ops, D2H bytes, host syncs and
    what the host waits for; the WAR barrier is kept either way (no release from 0.5.15
    on fences DFLASH's own writes). ``pool``: the request pool, ``bs``: the batch."""
    if needs_host:
        upstream = {
            "device_ops": 3,
            "d2h_bytes": "8·pool",
            "host_syncs": 1,
            "host_waits_for": "publish + a pool-sized D2H copy",
            "barrier": True,
        }
        ours = {
            "device_ops": 1,
            "d2h_bytes": "8·(bs+2)",
            "host_syncs": 1,
            "host_waits_for": "publish + one small launch",
            "barrier": True,
        }
    else:
        upstream = {
            "device_ops": 2,
            "d2h_bytes": "0",
            "host_syncs": 0,
            "host_waits_for": "nothing",
            "barrier": True,
        }
        ours = {
            "device_ops": 1,
            "d2h_bytes": "0",
            "host_syncs": 0,
            "host_waits_for": "nothing",
            "barrier": True,
        }
    return upstream, ours


HELPS = (
    "helps: no pool-sized D2H copy (8·pool bytes become 8·(bs+2) written by the "
    "launch) and one launch instead of three; the host still waits for the publish"
)
NOTHING = (
    "spec_fused changes nothing that matters here: upstream's step is already "
    "GPU-only (no copy, no host sync); the fused launch saves one launch and a few "
    "host µs per step"
)


def configuration(
    release: str,
    backend: str,
    algorithm: str,
    *,
    draft_backend: Optional[str] = None,
    two_batch_overlap: bool = False,
) -> Row:
    """The row for one configuration, in SGLang's own terms (``--attention-backend``,
    ``--speculative-algorithm``, ``--speculative-draft-attention-backend``,
    ``--enable-two-batch-overlap``)."""
    algorithm = algorithm.upper()
    if algorithm == "NEXTN":
        algorithm = "EAGLE"
    notes = []
    _, note = gpu_only(release, backend, algorithm)
    if note:
        notes.append(f"{backend}: {note}")
    backends = [backend]
    if algorithm in ("DFLASH", "DSPARK"):
        draft, why = _dflash_draft(release, backend, draft_backend)
        backends.append(draft)
        if why:
            notes.append(why)
    elif draft_backend:
        backends.append(draft_backend)
    needs_host = not all(gpu_only(release, b, algorithm)[0] for b in backends)
    if algorithm == "NGRAM":
        needs_host = True
        notes.append("NGRAM forces host lengths on every backend")
    if two_batch_overlap:
        needs_host = True
        notes.append("two-batch overlap forces host lengths")
    upstream, ours = _costs(needs_host)
    return Row(
        release,
        backend,
        algorithm,
        needs_host,
        tuple(notes),
        upstream,
        ours,
        HELPS if needs_host else NOTHING,
    )


# The configurations the README's table and doctor's default listing show.
TABLE_CONFIGS = [
    ("fa3", "DFLASH", "Hopper's default for DFLASH"),
    ("fa3", "EAGLE", "Hopper's default for EAGLE/EAGLE3 with top-k 1"),
    ("trtllm_mha", "DFLASH", "PR #29232's own benchmark (draft: fa4)"),
    ("flashinfer", "DFLASH", "a backend that reads host lengths"),
    ("flashinfer", "EAGLE", "EAGLE/EAGLE3 with top-k > 1 (Hopper's default then)"),
    ("triton", "EAGLE", ""),
    ("fa3", "NGRAM", ""),
]


def release_rows(release: str) -> list:
    rows = []
    for backend, algorithm, why in TABLE_CONFIGS:
        draft = "fa4" if (backend, algorithm) == ("trtllm_mha", "DFLASH") else None
        row = configuration(release, backend, algorithm, draft_backend=draft)
        if why:
            row.notes = (why,) + row.notes
        rows.append(row)
    return rows


def cells(costs: dict) -> str:
    """One cost column: device ops / D2H bytes / host syncs / WAR barrier."""
    barrier = "yes" if costs["barrier"] else "no"
    return f"{costs['device_ops']} / {costs['d2h_bytes']} / {costs['host_syncs']} / {barrier}"


def ranged_rows(releases) -> list:
    """``[(release range, Row)]`` for :data:`TABLE_CONFIGS` over ``releases``, consecutive
    releases with the same answer merged into one range."""
    out = []
    for index in range(len(TABLE_CONFIGS)):
        runs = []
        for release in releases:
            row = release_rows(release)[index]
            key = (row.needs_host_lengths, row.verdict)
            if runs and runs[-1][2] == key:
                runs[-1][1] = release
                runs[-1][3].notes = tuple(dict.fromkeys(runs[-1][3].notes + row.notes))
            else:
                runs.append([release, release, key, row])
        for first, last, _, row in runs:
            out.append((first if first == last else f"{first} – {last}", row))
    return out


def saving(upstream: dict, ours: dict) -> str:
    """What spec_fused saves on one relay step against upstream, from the two cost
    columns: device ops, the D2H copy, and whether the host still waits."""
    ops = upstream["device_ops"] - ours["device_ops"]
    parts = [f"{ops} device op{'s' if ops != 1 else ''}"]
    if upstream["d2h_bytes"] != ours["d2h_bytes"]:
        parts.append(f"the {upstream['d2h_bytes']}-byte D2H copy")
    saved = " and ".join(parts)
    if upstream["host_syncs"] == ours["host_syncs"] == 0:
        return f"{saved}; no host wait either way"
    if upstream["host_syncs"] == ours["host_syncs"]:
        return f"{saved}; the host still waits"
    return f"{saved} and {upstream['host_syncs'] - ours['host_syncs']} host wait(s)"


def render_markdown(ranged: list) -> str:
    """The README's "what it changes on your server" table: per relay step on CUDA,
    upstream -> spec_fused in device ops, D2H bytes and what the host waits for, and what
    that saves; a line under it says whether the WAR barrier differs."""
    lines = [
        "| SGLang | attention backend | algorithm | host lengths | device ops | "
        "D2H bytes | host waits for | spec_fused saves per step | notes |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    barriers = set()
    for releases, r in ranged:
        u, o = r.upstream, r.spec_fused
        barriers.add((u["barrier"], o["barrier"]))
        verdict = "helps" if r.needs_host_lengths else "nothing that matters"
        lines.append(
            f"| {releases} | {r.backend} | {r.algorithm} | "
            f"{'read' if r.needs_host_lengths else 'opted out'} | "
            f"{u['device_ops']} → {o['device_ops']} | "
            f"{u['d2h_bytes']} → {o['d2h_bytes']} | "
            f"{u['host_waits_for']} → {o['host_waits_for']} | "
            f"**{verdict}**: {saving(u, o)} | {'; '.join(r.notes)} |"
        )
    if barriers == {(True, True)}:
        barrier = "Both keep SGLang's WAR barrier on every row."
    else:
        barrier = (
            "The WAR barrier (upstream / spec_fused) differs by row: "
            + ", ".join(
                f"{'yes' if a else 'no'} / {'yes' if b else 'no'}" for a, b in sorted(barriers)
            )
            + "."
        )
    lines += [
        "",
        "Per relay step (publish + resolve) on CUDA, upstream → spec_fused; `pool`: "
        "the request pool's slots, `bs`: the batch. " + barrier,
    ]
    return "\n".join(lines)
