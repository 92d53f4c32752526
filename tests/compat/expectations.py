"""What each tested SGLang release does, as read from its wheel's source.

Why a hand-written table: the compat tier must compare what spec_fused *derives* from an
installed release (its API probe, ``caps.establish()``) with what the release actually
is. These facts were read from ``pip download --no-deps sglang==X`` for every release
(``sglang/srt/managers/overlap_utils.py``, ``speculative/spec_info.py``,
``speculative/dflash_worker_v2.py``, ``speculative/dflash_info_v2.py``,
``layers/attention/flashattention_backend.py``); where a fact moves, the release that
moved it is named.

* ``algorithms``: ``SpeculativeAlgorithm`` members. DSPARK arrives in 0.5.16, UNO in 0.5.20.
* FutureMap: ``consume_once`` (``_publish_fresh``, 0.5.16+), ``confidence`` (publish's
  ``confidence`` parameter, 0.5.16+), ``mixed_tails`` (``resolve_mixed_spec_tails``,
  0.5.19+), ``stream_ordered`` (the HIP GPU-only resolve, 0.5.23), ``relay_buffers``
  (``FutureRelayBuffers``, 0.5.23).
* DFLASH: every release plans draft and verify with the draft input's KV-allocation bound
  when ``batch.seq_lens_cpu`` is None ("GPU-only backend: reserved is a safe
  over-estimate"); the field is ``reserved_seq_lens_cpu`` up to 0.5.18 and
  ``nxt_kv_lens_cpu`` from 0.5.19. None of them fences its own ``req_to_token`` writes
  (0.5.14's ``verify_done`` went with PR #29232), so the WAR barrier stays everywhere.
* ``fa3_needs_cpu_seq_lens``: 0.5.15 ``not is_dflash()``; 0.5.16+ False for every algorithm,
  and from 0.5.21 True again only with a KV-shard pool.
* ``tbo_from``: how ``decide_needs_cpu_seq_lens`` reads two-batch overlap: ``server_args``
  (its ``server_args.enable_two_batch_overlap`` parameter, 0.5.15 ... 0.5.18) or ``exec``
  (``get_exec().overlap.enable_two_batch_overlap``, 0.5.19 on). Every release forces
  host lengths under it and for NGRAM.
* ``fences``: whether DFLASH fences its own ``req_to_token`` writes (0.5.14's
  ``wait_event(self.verify_done)``): no release from 0.5.15 on does.
* ``war_event``: where ``_apply_war_barrier`` finds the forward's read-done event:
  ``war_fastpath`` (0.5.15 ... 0.5.17) or ``shared_read`` (0.5.18 on).
* ``host_plan``: a graphed DFLASH verify on FlashInfer plans from host lengths with no
  readback (``flashinfer_backend.py``: capture installs ``fast_prefill_plan`` for
  ``DFLASH_VERIFY``), which DFLASH's worker fills with ``nxt_kv_lens_cpu`` when
  ``seq_lens_cpu`` is None, draft and verify alike: 0.5.19 on. Before, the stock
  ``plan()`` copies the device indptr to the host: it waits anyway.
"""

from __future__ import annotations

from dataclasses import dataclass

_BASE = ("DFLASH", "EAGLE", "EAGLE3", "FROZEN_KV_MTP", "STANDALONE", "NGRAM", "NONE")
_DSPARK = ("DFLASH", "DSPARK", "EAGLE", "EAGLE3", "FROZEN_KV_MTP", "STANDALONE", "NGRAM", "NONE")
_UNO = (
    "DFLASH",
    "UNO",
    "DSPARK",
    "EAGLE",
    "EAGLE3",
    "FROZEN_KV_MTP",
    "STANDALONE",
    "NGRAM",
    "NONE",
)


@dataclass(frozen=True)
class Release:
    algorithms: tuple
    consume_once: bool
    confidence: bool
    mixed_tails: bool
    stream_ordered: bool
    relay_buffers: bool
    dflash_bound_field: str
    fa3_needs_cpu_seq_lens: str
    tbo_from: str
    war_event: str
    fences: bool = False
    host_plan: bool = False


_R = "reserved_seq_lens_cpu"
_N = "nxt_kv_lens_cpu"
_SA, _EX = "server_args", "exec"
_WF, _SR = "war_fastpath", "shared_read"

RELEASES = {
    "0.5.15": Release(_BASE, False, False, False, False, False, _R, "not DFLASH", _SA, _WF),
    "0.5.15.post1": Release(_BASE, False, False, False, False, False, _R, "not DFLASH", _SA, _WF),
    "0.5.16": Release(_DSPARK, True, True, False, False, False, _R, "False", _SA, _WF),
    "0.5.17": Release(_DSPARK, True, True, False, False, False, _R, "False", _SA, _WF),
    "0.5.18": Release(_DSPARK, True, True, False, False, False, _R, "False", _SA, _SR),
    "0.5.19": Release(
        _DSPARK, True, True, True, False, False, _N, "False", _EX, _SR, host_plan=True
    ),
    "0.5.20": Release(_UNO, True, True, True, False, False, _N, "False", _EX, _SR, host_plan=True),
    "0.5.21": Release(
        _UNO, True, True, True, False, False, _N, "KV-shard pool only", _EX, _SR, host_plan=True
    ),
    "0.5.22": Release(
        _UNO, True, True, True, False, False, _N, "KV-shard pool only", _EX, _SR, host_plan=True
    ),
    "0.5.23": Release(
        _UNO, True, True, True, True, True, _N, "KV-shard pool only", _EX, _SR, host_plan=True
    ),
}


def installed_version() -> str:
    from importlib.metadata import version

    return version("sglang")


def expectation_for(version: str = None) -> Release:
    """The facts of the installed (or given) release; a test run against a release with
    no row fails here, by name, rather than testing against another release's facts."""
    version = version or installed_version()
    if version not in RELEASES:
        raise LookupError(
            f"no expectations written for SGLang {version}; read its wheel "
            f"and add a row to tests/compat/expectations.py"
        )
    return RELEASES[version]
