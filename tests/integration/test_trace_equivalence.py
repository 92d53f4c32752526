"""The patched FutureMap against the real, unpatched one, through the same random traces.

Both sides are the installed SGLang's own ``FutureMap`` class on CPU: first as shipped,
then with ``sglang_patch.apply()``; every step's observables must be equal - device
lengths, host lengths and sums, mixed-tail fields - for every algorithm the release has,
``needs_cpu_seq_lens`` 0 and 1, int32/int64 inputs, and the release's optional paths
(the confidence relay, ``FutureRelayBuffers``, the ``stream_ordered`` resolve)."""

import pytest
import torch
from compat.expectations import expectation_for
from hypothesis import given
from hypothesis import strategies as st
from sglang.srt.managers import overlap_utils
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
from support.arms import unpatched_then_patched

from spec_fused import relay as relay_mod
from spec_fused.integration import sglang_patch
from spec_fused.tools.traces import TraceConfig, decode_batch, make_future_map, run_trace

RELEASE = expectation_for()
ALGORITHMS = [m.name for m in SpeculativeAlgorithm if m.name != "NONE"]


def _run(algo, cfg, *, patched, **fm_kwargs):
    if patched:
        sglang_patch.apply()
    try:
        fm = make_future_map(algo, cfg, **fm_kwargs)
        records = run_trace(fm, cfg)
        return records, relay_mod.relay_for(fm) if patched else None, fm
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


@given(cfg=configs, algo_name=st.sampled_from(ALGORITHMS), needs_cpu=st.booleans())
def test_every_algorithm_matches_upstream_step_for_step(cfg, algo_name, needs_cpu, kernel_launches):
    algo = SpeculativeAlgorithm[algo_name]
    want, _, _ = _run(algo, cfg, patched=False, needs_cpu_seq_lens=needs_cpu)
    kernel_launches.reset()
    got, relay, _ = _run(algo, cfg, patched=True, needs_cpu_seq_lens=needs_cpu)
    assert relay is not None, "the relay declined a FutureMap it should relay"
    for step, (g, w) in enumerate(zip(got, want, strict=True)):
        assert g == w, f"step {step} ({w.kind}) differs"
    decodes = sum(r.kind == "decode" and bool(r.seq_lens) for r in want)
    # One fused launch per decode step with a batch (and the occasional landing of a
    # pending publish).
    assert decodes <= relay.launcher.launches == kernel_launches.count


@pytest.mark.parametrize("algo_name", ["EAGLE", "DFLASH"])
def test_sglang_debug_mode_consume_once_still_holds(monkeypatch, algo_name):
    """Under SGLang's own debug switch both sides poison consumed rows identically."""
    monkeypatch.setattr(overlap_utils, "_DEBUG_ASSERT", True)
    cfg = TraceConfig(seed=11, steps=40, p_idle=0.0, p_mixed=0.0)
    algo = SpeculativeAlgorithm[algo_name]
    want, _, fm_a = _run(algo, cfg, patched=False)
    got, relay, fm_b = _run(algo, cfg, patched=True)
    assert got == want
    if RELEASE.consume_once:  # 0.5.16+: consume-once on seq lens, poisoned rows
        assert relay.debug and relay.launcher.poison
        assert torch.equal(fm_a.new_seq_lens_buf, fm_b.new_seq_lens_buf)
    else:
        assert not relay.debug


def test_int32_indices_and_lengths_pool_reuse_long_trace():
    cfg = TraceConfig(
        seed=5,
        pool=9,
        steps=200,
        max_running=8,
        p_finish=0.4,
        value_dtype=torch.int32,
        index_dtype=torch.int32,
    )
    want, _, _ = _run(SpeculativeAlgorithm.EAGLE, cfg, patched=False)
    got, _, _ = _run(SpeculativeAlgorithm.EAGLE, cfg, patched=True)
    assert got == want


@pytest.mark.skipif(not RELEASE.confidence, reason="this release has no confidence relay")
def test_the_confidence_relay_is_left_to_sglang():
    """DSPARK's ragged-verify confidence relay gates its own D2H on ``publish_ready``: the
    relay declines such a FutureMap and SGLang's path serves it, publish and resolve."""
    cfg = TraceConfig(seed=4, steps=30)
    algo = SpeculativeAlgorithm.DSPARK
    want, _, _ = _run(algo, cfg, patched=False, needs_confidence_relay=True)
    got, relay, _ = _run(algo, cfg, patched=True, needs_confidence_relay=True)
    assert relay is None and got == want


@pytest.mark.skipif(not RELEASE.confidence, reason="this release's publish has no confidence")
def test_a_publish_with_confidence_goes_to_sglang_after_the_pending_one_lands():
    def drive(fm):
        fm.publish(torch.tensor([1, 2]), torch.tensor([10, 20]))
        fm.publish(torch.tensor([2, 3]), torch.tensor([21, 30]), torch.ones((2, 4)))
        batch = decode_batch([1, 2, 3], TraceConfig())
        fm.resolve_seq_lens_cpu(batch)
        return batch.seq_lens.tolist(), batch.seq_lens_cpu.tolist(), batch.seq_lens_sum

    want, got = unpatched_then_patched(drive, "DSPARK", TraceConfig())
    assert got == want == ([10, 21, 30], [10, 21, 30], 61)


@pytest.mark.skipif(not RELEASE.relay_buffers, reason="this release has no FutureRelayBuffers")
@pytest.mark.parametrize("needs_cpu", [True, False])
def test_future_relay_buffers_adopted_and_graph_scattered_publishes(needs_cpu):
    """0.5.23: a captured verify graph scatters into buffers the FutureMap adopts, and
    ``publish`` of that very tensor skips its scatter; the relay follows the adoption
    (the buffer rebind) and the skip."""
    cfg = TraceConfig(pool=32)

    def drive(fm):
        relay_buffers = fm._relay
        seen = []
        lens = torch.arange(cfg.pool, dtype=torch.int64) + 100
        for step in range(6):
            slots = torch.tensor([1, 2, 3 + step % 3])
            if step % 2:  # the graph already scattered these: publish of the same tensor
                fm.new_seq_lens_buf[slots] = lens[slots] + step
                relay_buffers.published_seq_lens = published = lens[slots] + step
                fm.publish(slots, published)
            else:
                fm.publish(slots, lens[slots] + step)
            batch = decode_batch(slots.tolist(), cfg)
            fm.resolve_seq_lens_cpu(batch)
            seen.append(
                (
                    batch.seq_lens.tolist(),
                    None if batch.seq_lens_cpu is None else batch.seq_lens_cpu.tolist(),
                )
            )
        return seen, fm.new_seq_lens_buf is relay_buffers.new_seq_lens

    def with_buffers(fm_kwargs):
        offered = overlap_utils.FutureRelayBuffers(req_pool_size=cfg.pool, device="cpu")
        overlap_utils.offer_future_relay_buffers(offered)
        try:
            return drive(make_future_map("EAGLE", cfg, needs_cpu_seq_lens=needs_cpu))
        finally:
            overlap_utils.offer_future_relay_buffers(None)

    want = with_buffers({})
    sglang_patch.apply()
    try:
        got = with_buffers({})
    finally:
        sglang_patch.remove()
    assert got == want and got[1] is True


@pytest.mark.skipif(not RELEASE.relay_buffers, reason="this release has no FutureRelayBuffers")
@pytest.mark.parametrize("needs_cpu", [True, False])
@pytest.mark.parametrize("swap_with_pending", [False, True])
def test_buffers_adopted_after_the_relay_exists(needs_cpu, swap_with_pending):
    """SGLang's own ``_adopt_relay`` called on a FutureMap already relaying (its relay made,
    steps run): the relay launches into the new buffer from then on (the rebind), and a
    publish still pending at the swap lands in the buffer it was made for, as upstream's
    publish had already written it there (so the step after reads the new buffer's 7s)."""
    cfg = TraceConfig(pool=32)

    def adopt(fm):
        offered = overlap_utils.FutureRelayBuffers(req_pool_size=cfg.pool, device="cpu")
        offered.new_seq_lens.fill_(7)
        fm._adopt_relay(offered)

    def drive(fm):
        seen = []
        lens = torch.arange(cfg.pool, dtype=torch.int64) + 100
        for step in range(6):
            slots = torch.tensor([1, 2, 3 + step % 3])
            if step == 3 and not swap_with_pending:
                adopt(fm)
            fm.publish(slots, lens[slots] + step)
            if step == 3 and swap_with_pending:
                adopt(fm)
            batch = decode_batch(slots.tolist(), cfg)
            fm.resolve_seq_lens_cpu(batch)
            seen.append(
                (
                    batch.seq_lens.tolist(),
                    None if batch.seq_lens_cpu is None else batch.seq_lens_cpu.tolist(),
                )
            )
        # what the adopted buffer holds (the relay wrote into it, not into the old one)
        return (
            seen,
            fm.new_seq_lens_buf is fm._relay.new_seq_lens,
            fm._relay.new_seq_lens[1:6].tolist(),
        )

    want, got = unpatched_then_patched(drive, "EAGLE", cfg, needs_cpu_seq_lens=needs_cpu)
    assert got == want and got[1] is True
    assert got[0][3][0] == ([7, 7, 7] if swap_with_pending else [104, 105, 103 + 3])


@pytest.mark.skipif(not RELEASE.stream_ordered, reason="this release has no stream_ordered")
@pytest.mark.parametrize("needs_cpu", [True, False])
def test_the_stream_ordered_resolve_is_sglangs_after_the_pending_publish(needs_cpu):
    """0.5.23's HIP-only GPU path (``stream_ordered=True``): the relay lands its pending
    publish and hands the call to SGLang's own resolve."""
    cfg = TraceConfig(pool=16)

    def drive(fm):
        out = []
        for step in range(4):
            fm.publish(torch.tensor([1, 2]), torch.tensor([10 + step, 20 + step]))
            batch = decode_batch([1, 2], cfg)
            fm.resolve_seq_lens_cpu(batch, stream_ordered=bool(step % 2))
            out.append(
                (
                    batch.seq_lens.tolist(),
                    None if batch.seq_lens_cpu is None else batch.seq_lens_cpu.tolist(),
                    batch.seq_lens_sum,
                )
            )
        return out

    want, got = unpatched_then_patched(drive, "EAGLE", cfg, needs_cpu_seq_lens=needs_cpu)
    assert got == want
