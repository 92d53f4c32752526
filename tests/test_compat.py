"""The installed SGLang release, held to what its source says (tests/compat/expectations.py).

The compat tier (``scripts/compat_tier.py``) runs this file, the trace-equivalence tests
and the relay's other FutureMap tests once per tested release, each release installed as
an overlay on ``PYTHONPATH``; the everyday tier runs it against the one in ``.venv``. It
checks the API probe and an exact apply/remove, that the release's code is the recorded
tested code, the FutureMap features the relay adapts to, and the facts spec_fused reads
from the release (DFLASH's bound and fence, how two-batch overlap is read) against the
table written by reading each wheel.
"""

import ast
import importlib.util
import inspect
import logging

import pytest
from compat.expectations import RELEASES

from spec_fused import upstream
from spec_fused.integration import code_check, sglang_patch
from spec_fused.releases import TESTED_RELEASES, support_status

VERSION = sglang_patch._sglang_version()
STATUS = support_status(VERSION) if VERSION else None
IN_RANGE = STATUS is not None and not STATUS.refused

in_range = pytest.mark.skipif(not IN_RANGE, reason=f"SGLang {VERSION} is below the range")


def test_the_installed_release_is_tested_or_refused():
    print(f"SGLang under test: {VERSION}")
    assert VERSION is not None
    if IN_RANGE:
        assert VERSION in TESTED_RELEASES and VERSION in RELEASES, (
            f"SGLang {VERSION} is in the range but not a tested release with expectations"
        )
    else:
        assert STATUS.kind == "older", STATUS.message


@pytest.mark.skipif(IN_RANGE, reason="only a release below the range is refused")
def test_a_release_below_the_range_is_refused_cleanly(caplog):
    """0.5.14 (DFLASH's direct carry, before the shared relay): apply() refuses before
    importing anything, register() says so in one line, SGLang runs as shipped."""
    with pytest.raises(sglang_patch.UnsupportedSGLangError, match="older"):
        sglang_patch.apply()
    with caplog.at_level(logging.WARNING, logger="spec_fused"):
        sglang_patch.register()
    lines = [r.getMessage() for r in caplog.records if r.name == "spec_fused"]
    assert len(lines) == 1 and "not loaded" in lines[0] and VERSION in lines[0]
    assert not sglang_patch.is_applied()


PATCHED = ("publish", "resolve_seq_lens_cpu", "resolve_mixed_spec_tails", "new_seq_lens_buf")


@in_range
def test_api_probe_then_apply_and_remove_exactly():
    from sglang.srt.managers.overlap_utils import FutureMap

    before = {n: FutureMap.__dict__.get(n, "<absent>") for n in PATCHED}
    assert sglang_patch.check_supported() == VERSION
    report = sglang_patch.apply()
    try:
        assert report.applied and report.sglang_version == VERSION
        assert report.code == VERSION and not report.warning
        for name in PATCHED:
            if before[name] == "<absent>" and name == "resolve_mixed_spec_tails":
                assert name not in FutureMap.__dict__  # 0.5.15 ... 0.5.18 have none
            else:
                assert FutureMap.__dict__[name] is not before[name], name
        assert sglang_patch.apply() is report  # idempotent
    finally:
        sglang_patch.remove()
    assert {n: FutureMap.__dict__.get(n, "<absent>") for n in PATCHED} == before


@in_range
def test_the_installed_code_is_the_recorded_code_of_this_release():
    """What the tier tested is what the package accepts: this release's functions, as
    a whole, fingerprint to its own row of ``tested_code.py``."""
    from sglang.srt.managers import overlap_utils

    found = code_check.check_module(overlap_utils, prefer=VERSION)
    assert found.release == VERSION, found.describe()


def _expected():
    return RELEASES[VERSION]


@in_range
def test_future_map_features_are_the_releases():
    from sglang.srt.managers import overlap_utils
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    want = _expected()
    fm = overlap_utils.FutureMap
    assert tuple(m.name for m in SpeculativeAlgorithm) == want.algorithms
    assert ("_publish_fresh" in inspect.getsource(fm.__init__)) == want.consume_once
    assert ("confidence" in inspect.signature(fm.publish).parameters) == want.confidence
    assert ("resolve_mixed_spec_tails" in fm.__dict__) == want.mixed_tails
    assert (
        "stream_ordered" in inspect.signature(fm.resolve_seq_lens_cpu).parameters
    ) == want.stream_ordered
    assert hasattr(overlap_utils, "FutureRelayBuffers") == want.relay_buffers


@in_range
def test_the_facts_spec_fused_reads_are_the_releases():
    """DFLASH does not fence its own writes (so the barrier stays); the FutureMap's own
    ``needs_cpu_seq_lens`` folds two-batch overlap and NGRAM in (so the relay reads host
    lengths there, never again from the server's settings); the barrier waits on the
    read-done event this release names."""
    from sglang.srt.managers import overlap_utils

    want = _expected()
    assert upstream.fences_own_shared_writes("DFLASH") is want.fences
    code = ast.unparse(ast.parse(inspect.getsource(overlap_utils.decide_needs_cpu_seq_lens)))
    assert "enable_two_batch_overlap:\n        return True" in code
    assert "is_ngram():\n        return True" in code
    spec = importlib.util.find_spec("sglang.srt.managers.scheduler")
    scheduler = open(spec.origin, encoding="utf-8").read()
    event = {
        "war_fastpath": "war_fastpath_read_done_event",
        "shared_read": "shared_read_done_event",
    }[want.war_event]
    assert event in scheduler


def _source(module: str) -> str:
    """A module's source, read, not imported (FlashInfer's backend pulls GPU kernels)."""
    return open(importlib.util.find_spec(module).origin, encoding="utf-8").read()


def _function(src: str, qualname: str) -> str:
    scope, node = ast.parse(src).body, None
    for part in qualname.split("."):
        node = next(n for n in scope if getattr(n, "name", None) == part)
        scope = node.body
    return ast.unparse(node)


@in_range
def test_dflash_plans_flashinfer_from_host_lengths_where_the_release_says():
    """The bound variant's facts (``integration/flashinfer_plan.py``), read per release:
    capture installs the no-readback ``fast_prefill_plan`` for a graphed DFLASH verify,
    the worker hands it ``nxt_kv_lens_cpu`` for the draft and the verify when
    ``seq_lens_cpu`` is None, and the plan passes the wrapper's one pinned buffer to
    FlashInfer (the hazard the guard exists for) - together exactly where the bound
    variant is allowed."""
    from spec_fused.integration.flashinfer_plan import BOUND_RELEASES

    flashinfer = _source("sglang.srt.layers.attention.flashinfer_backend")
    capture = _function(flashinfer, "FlashInferAttnBackend.init_forward_metadata_out_graph")
    worker = _function(
        _source("sglang.srt.speculative.dflash_worker_v2"),
        "DFlashWorkerV2.forward_batch_generation",
    )
    plan = _function(flashinfer, "fast_prefill_plan")
    installs = (
        "SpecInputType.DFLASH_VERIFY" in capture and "partial(fast_prefill_plan, w)" in capture
    )
    substitutes = worker.count("elif draft_input.nxt_kv_lens_cpu is not None:") >= 2
    assert "self._pin_memory_int_workspace_buffer" in plan
    assert (installs and substitutes) is _expected().host_plan
    assert (VERSION in BOUND_RELEASES) is _expected().host_plan


@pytest.mark.skipif(VERSION != "0.5.14", reason="only 0.5.14 fenced DFLASH's own writes")
def test_the_fence_check_finds_0_5_14s_verify_done():
    """The one fact that would drop the barrier, read from the real 0.5.14 wheel (its plan
    stream waits ``verify_done`` before writing req_to_token); every later release lacks
    it (test_the_facts_spec_fused_reads_are_the_releases)."""
    assert upstream.fences_own_shared_writes("DFLASH") is True
    assert upstream.fences_own_shared_writes("EAGLE") is False


@in_range
def test_fa3_needs_host_lengths_as_the_release_says():
    """Read, not imported (the backend pulls GPU kernels): which algorithms FA3, Hopper's
    default for DFLASH and top-k-1 EAGLE, makes pay the host mirror upstream."""
    spec = importlib.util.find_spec("sglang.srt.layers.attention.flashattention_backend")
    src = open(spec.origin, encoding="utf-8").read()
    want = _expected().fa3_needs_cpu_seq_lens
    if want == "not DFLASH":
        assert "self.needs_cpu_seq_lens = not SpeculativeAlgorithm.from_string(" in src
    else:
        assert "needs_cpu_seq_lens: bool = False" in src
        kv_shard = "self.needs_cpu_seq_lens = self._kv_shard_pool is not None" in src
        assert kv_shard == (want == "KV-shard pool only")
