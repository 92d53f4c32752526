"""The patched FutureMap against the real, unpatched one, through the same random traces.

Both sides are SGLang 0.5.23's own ``FutureMap`` class on CPU: first it runs as shipped,
then with ``sglang_patch.apply()``; every step's observables must match (device lengths
always; host lengths where the variant provides exact ones)."""

import pytest
import torch
from hypothesis import given, strategies as st

from traces import TraceConfig, installed, make_future_map, run_trace

overlap_utils = pytest.importorskip("sglang.srt.managers.overlap_utils")
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm  # noqa: E402

from spec_fused import relay as relay_mod  # noqa: E402
from spec_fused.caps import plans_with_reserved_bound  # noqa: E402
from spec_fused.integration import sglang_patch  # noqa: E402


def _run(algo, cfg, *, patched, needs_cpu_seq_lens=True):
    if patched:
        sglang_patch.apply()
    try:
        fm = make_future_map(algo, cfg, needs_cpu_seq_lens=needs_cpu_seq_lens)
        records = run_trace(fm, cfg)
        relay = relay_mod.relay_for(fm) if patched else None
        return records, relay, fm
    finally:
        if patched:
            sglang_patch.remove()


configs = st.builds(
    TraceConfig,
    seed=st.integers(0, 10_000),
    pool=st.integers(4, 300),
    steps=st.integers(5, 40),
    max_running=st.integers(1, 64),
    value_dtype=st.sampled_from([torch.int32, torch.int64]),
    index_dtype=st.sampled_from([torch.int32, torch.int64]),
    p_idle=st.sampled_from([0.0, 0.1, 0.3]),
    p_mixed=st.sampled_from([0.0, 0.2]),
)


@given(cfg=configs, algo_name=st.sampled_from(installed("EAGLE", "EAGLE3", "STANDALONE", "NGRAM", "UNO")))
def test_exact_variant_matches_upstream_step_for_step(cfg, algo_name, kernel_launches):
    algo = SpeculativeAlgorithm[algo_name]
    want, _, _ = _run(algo, cfg, patched=False)
    kernel_launches.reset()
    got, relay, _ = _run(algo, cfg, patched=True)
    assert relay is not None and relay.host_seq_lens == "exact"
    assert [r.kind for r in got] == [r.kind for r in want]
    for step, (g, w) in enumerate(zip(got, want, strict=True)):
        assert g == w, f"step {step} ({w.kind}) differs"
    decodes = sum(r.kind == "decode" for r in want)
    assert relay.launches >= decodes and kernel_launches.count == relay.launches


@given(configs)
def test_reserved_variant_gives_exact_device_lengths_and_no_host_mirror(cfg):
    want, _, _ = _run(SpeculativeAlgorithm.DFLASH, cfg, patched=False)
    got, relay, _ = _run(SpeculativeAlgorithm.DFLASH, cfg, patched=True)
    if not plans_with_reserved_bound("DFLASH"):  # e.g. 0.5.15's worker: exact lengths
        assert relay.host_seq_lens == "exact" and got == want
        return
    assert relay.host_seq_lens == "reserved"
    for g, w in zip(got, want, strict=True):
        assert g.kind == w.kind and g.seq_lens == w.seq_lens and g.extra == w.extra
        if g.kind in ("decode", "idle"):
            # The DFLASH worker plans with its own nxt_kv_lens_cpu bound when these are None.
            assert g.seq_lens_cpu is None and g.seq_lens_sum is None
        else:
            assert (g.seq_lens_cpu, g.seq_lens_sum) == (w.seq_lens_cpu, w.seq_lens_sum)


@given(configs, st.sampled_from(["EAGLE", "DFLASH"]))
def test_gpu_only_backends_match_upstream_none_path(cfg, algo_name):
    algo = SpeculativeAlgorithm[algo_name]
    want, _, _ = _run(algo, cfg, patched=False, needs_cpu_seq_lens=False)
    got, relay, _ = _run(algo, cfg, patched=True, needs_cpu_seq_lens=False)
    assert got == want  # upstream leaves seq_lens_cpu/sum None too


def test_barrier_free_variant_when_forced_by_env(monkeypatch):
    monkeypatch.setenv("SPEC_FUSED_WAR_BARRIER", "0")
    cfg = TraceConfig(seed=3, steps=40)
    want, _, _ = _run(SpeculativeAlgorithm.DFLASH, cfg, patched=False)
    got, relay, _ = _run(SpeculativeAlgorithm.DFLASH, cfg, patched=True)
    assert relay.variant == "barrier_free" or not plans_with_reserved_bound("DFLASH")
    assert [g.seq_lens for g in got] == [w.seq_lens for w in want]


@pytest.mark.parametrize("algo_name", ["EAGLE", "DFLASH"])
def test_sglang_debug_mode_consume_once_still_holds(monkeypatch, algo_name):
    """Under SGLang's own debug switch both sides poison consumed rows identically."""
    monkeypatch.setattr(overlap_utils, "_DEBUG_ASSERT", True)
    cfg = TraceConfig(seed=11, steps=40, p_idle=0.0, p_mixed=0.0)
    algo = SpeculativeAlgorithm[algo_name]
    want, _, fm_a = _run(algo, cfg, patched=False)
    got, relay, fm_b = _run(algo, cfg, patched=True)
    assert [g.seq_lens for g in got] == [w.seq_lens for w in want]
    if relay_mod._sglang_poisons_seq_lens():  # 0.5.23: consume-once on seq lens
        assert relay.debug and relay.launcher.poison
        assert torch.equal(fm_a.new_seq_lens_buf, fm_b.new_seq_lens_buf)  # same rows poisoned
    else:
        assert not relay.debug


def test_int32_indices_and_lengths_pool_reuse_long_trace():
    cfg = TraceConfig(seed=5, pool=9, steps=200, max_running=8, p_finish=0.4,
                      value_dtype=torch.int32, index_dtype=torch.int32)
    want, _, _ = _run(SpeculativeAlgorithm.EAGLE, cfg, patched=False)
    got, _, _ = _run(SpeculativeAlgorithm.EAGLE, cfg, patched=True)
    assert got == want
