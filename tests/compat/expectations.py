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
"""

from __future__ import annotations

from dataclasses import dataclass

_BASE = ("DFLASH", "EAGLE", "EAGLE3", "FROZEN_KV_MTP", "STANDALONE", "NGRAM", "NONE")
_DSPARK = ("DFLASH", "DSPARK", "EAGLE", "EAGLE3", "FROZEN_KV_MTP", "STANDALONE", "NGRAM",
           "NONE")
_UNO = ("DFLASH", "UNO", "DSPARK", "EAGLE", "EAGLE3", "FROZEN_KV_MTP", "STANDALONE", "NGRAM",
        "NONE")


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

    def caps(self, algorithm: str) -> tuple:
        """``(needs_war_barrier, host_seq_lens, variant)`` established on this release."""
        if algorithm == "DFLASH":  # the bound holds, the barrier exemption does not
            return (True, "reserved", "war_guarded")
        return (True, "exact", "war_guarded")


_R = "reserved_seq_lens_cpu"
_N = "nxt_kv_lens_cpu"

RELEASES = {
    "0.5.15": Release(_BASE, False, False, False, False, False, _R, "not DFLASH"),
    "0.5.15.post1": Release(_BASE, False, False, False, False, False, _R, "not DFLASH"),
    "0.5.16": Release(_DSPARK, True, True, False, False, False, _R, "False"),
    "0.5.17": Release(_DSPARK, True, True, False, False, False, _R, "False"),
    "0.5.18": Release(_DSPARK, True, True, False, False, False, _R, "False"),
    "0.5.19": Release(_DSPARK, True, True, True, False, False, _N, "False"),
    "0.5.20": Release(_UNO, True, True, True, False, False, _N, "False"),
    "0.5.21": Release(_UNO, True, True, True, False, False, _N, "KV-shard pool only"),
    "0.5.22": Release(_UNO, True, True, True, False, False, _N, "KV-shard pool only"),
    "0.5.23": Release(_UNO, True, True, True, True, True, _N, "KV-shard pool only"),
}
