"""Fuzzing (hypothesis, bounded for CI): arbitrary inputs to the public kernel API and
arbitrary op sequences on the patched FutureMap. The only allowed outcomes are a clear
TypeError/ValueError with nothing written, or results identical to the reference."""

import pytest
import torch
from hypothesis import given, settings, strategies as st

from spec_fused.kernels.publish_gather import PublishGather, publish_gather, publish_gather_reference

DTYPES = [torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool,
          torch.float32, torch.float16]


@st.composite
def any_tensor(draw, max_len=40, lo=-5, hi=60):
    dtype = draw(st.sampled_from(DTYPES))
    shape = draw(st.sampled_from(["1d", "2d", "0d", "strided"]))
    n = draw(st.integers(0, max_len))
    vals = draw(st.lists(st.integers(lo, hi), min_size=n, max_size=n))
    if dtype == torch.uint8:
        vals = [abs(v) for v in vals]
    t = torch.tensor(vals, dtype=torch.int64)
    if dtype == torch.bool:
        t = t > 10
    else:
        t = t.to(dtype)
    if shape == "2d" and n % 2 == 0 and n:
        t = t.reshape(2, -1)
    elif shape == "0d":
        t = torch.tensor(vals[0] if vals else 0).to(dtype)
    elif shape == "strided":
        t = torch.cat([t, t])[::2]
    return t


@settings(max_examples=200)
@given(buf=any_tensor(hi=10**6), gather=any_tensor(), pub=st.none() | any_tensor(),
       val=st.none() | any_tensor(hi=10**4), host=st.booleans(), poison=st.booleans())
def test_public_api_fuzz(buf, gather, pub, val, host, poison):
    host_out = None
    if host and gather.dim() == 1:
        host_out = torch.zeros(gather.shape[0] + 1, dtype=torch.int64)
    outcomes = []
    for fn in (publish_gather, publish_gather_reference):
        b = buf.clone()
        try:
            res = fn(b, gather, pub, val, host_out=None if host_out is None else host_out.clone(),
                     poison=poison)
        except (TypeError, ValueError) as exc:
            assert str(exc)
            assert torch.equal(b, buf), "written before the error"
            outcomes.append(("error", type(exc)))
        except RuntimeError as exc:  # only the consume-once check may raise this
            assert "consume-once" in str(exc)
            outcomes.append(("poisoned", None))
        else:
            outcomes.append(("ok", (b.tolist(), res.seq_lens.tolist(), int(res.seq_lens_sum))))
    assert outcomes[0] == outcomes[1]


overlap_utils = pytest.importorskip("sglang.srt.managers.overlap_utils")


@settings(max_examples=60)
@given(ops=st.lists(st.tuples(st.sampled_from(["publish", "resolve", "mixed", "read"]),
                              st.lists(st.integers(0, 31), max_size=12, unique=True),
                              st.integers(0, 500)), max_size=30),
       algo=st.sampled_from(["EAGLE", "DFLASH", "NGRAM"]))
def test_patched_future_map_op_sequence_fuzz(ops, algo):
    """Any sequence of publish/resolve/mixed-tail/buffer reads, patched vs unpatched."""
    from types import SimpleNamespace

    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
    from traces import TraceConfig, _decode_batch, unpatched_then_patched

    cfg = TraceConfig(pool=32, max_len=1024)

    def drive(fm):
        seen = []
        fm.new_seq_lens_buf.zero_()  # defined start (upstream allocates with empty)
        for op, slots, v in ops:
            if op == "publish":
                fm.publish(torch.tensor(slots, dtype=torch.int64),
                           torch.tensor([v + s for s in slots], dtype=torch.int32))
            elif op == "resolve":
                b = _decode_batch(slots, cfg)
                fm.resolve_seq_lens_cpu(b)
                seen.append(("r", b.seq_lens.tolist(),
                             None if b.seq_lens_cpu is None else b.seq_lens_cpu.tolist()))
            elif op == "mixed" and slots and hasattr(fm, "resolve_mixed_spec_tails"):
                n = len(slots)
                b = SimpleNamespace(
                    mix_running_indices=torch.tensor(slots),
                    mix_running_indices_cpu=torch.tensor(slots),
                    seq_lens=torch.zeros(n + 1, dtype=torch.int64),
                    seq_lens_cpu=torch.zeros(n + 1, dtype=torch.int64), seq_lens_sum=0,
                    out_cache_loc=torch.zeros(n + 1, dtype=torch.int64), prefix_lens=[0] * (n + 1))
                fm.resolve_mixed_spec_tails(b)
                seen.append(("m", b.seq_lens.tolist(), b.prefix_lens))
            else:
                seen.append(("b", fm.new_seq_lens_buf.tolist()))
        return seen

    from spec_fused.caps import plans_with_reserved_bound

    want, got = unpatched_then_patched(drive, SpeculativeAlgorithm[algo], cfg)
    reserved = algo == "DFLASH" and plans_with_reserved_bound(algo)
    for g, w in zip(got, want, strict=True):
        if reserved and g[0] == "r":
            assert g[1] == w[1] and g[2] is None
        else:
            assert g == w


@given(st.lists(st.integers(0, 63), max_size=64), st.integers(1, 64))
def test_stateful_launcher_fuzz(slots, max_batch):
    buf = torch.arange(64, dtype=torch.int64)
    pg = PublishGather(buf.clone(), max_batch=max_batch)
    gi = torch.tensor(slots, dtype=torch.int64)
    try:
        res = pg(gi, host=True)
    except ValueError as exc:
        assert len(slots) > max_batch and "max_batch" in str(exc)
        return
    lens, total = pg.read_host(res)
    assert lens.tolist() == slots and total == sum(slots) == int(res.seq_lens_sum)
