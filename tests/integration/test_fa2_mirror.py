"""A plan of fa2 from an upper bound is the same attention exactly where every request has
as many split-KV chunks as its bound.

``bench/fa2_split.py`` mirrors FlashInfer 0.7.2's plan (from host lengths), kernel (on
device lengths) and merge, computing real attention through both; these tests hold what
it shows. The GPU check holds the mirror's chunk to the real plan's
(``bench/flashinfer_check.py``)."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from bench import fa2_split
from spec_fused.integration import flashinfer_plan

TOL = 1e-9  # float64 attention: a right partition is exact to rounding


def test_the_mirror_shows_a_bound_plan_corrupting_the_merge_and_an_exact_one_not():
    """Device 1020, bound 1032, chunk 128: the plan counts 9 chunks, the kernel writes 8."""
    wrong = fa2_split.attention_error([1032], [1020])
    assert wrong["chunk"] == 128 and wrong["plan"].chunks(1032) == 9
    assert wrong["max_err"] > 0.1 and wrong["collisions"] > 0
    assert fa2_split.attention_error([1020], [1020])["max_err"] < TOL


lengths = st.lists(st.integers(1, 3000), min_size=1, max_size=8)


@settings(deadline=None)
@given(lengths, st.data())
def test_an_exact_plan_is_always_the_attention_and_a_bound_one_exactly_where_counts_agree(
    device, data
):
    """The straddle rule is the corruption's condition, on the mirror: a bound plan is the
    reference attention exactly where every request has as many chunks as its bound."""
    bound = [d + data.draw(st.integers(0, 40)) for d in device]
    assert fa2_split.attention_error(device, device)["max_err"] < TOL
    got = fa2_split.attention_error(bound, device)
    agree = all(got["plan"].chunks(b) == got["plan"].chunks(d) for b, d in zip(bound, device))
    assert (got["max_err"] < TOL) is agree, (device, bound, got["chunk"])
    lower, upper = torch.tensor(device), torch.tensor(bound)
    assert flashinfer_plan.straddles(lower, upper, got["chunk"]) is (not agree)


def test_the_plan_picks_the_smallest_chunk_whose_work_fits_twice_the_sms_per_kv_head():
    """H100 (132 SMs), 8 KV heads: at most 33 work items; never below 128 tokens; from 33
    requests on, one chunk each, as long as the longest."""
    assert fa2_split.plan([16], [1032]).chunk == 128
    assert fa2_split.plan([16], [32768]).chunk == 993  # ceil(32768 / 33)
    assert fa2_split.plan([16] * 8, [1032] * 8).chunk == 258  # 8 x 4 chunks
    wide = fa2_split.plan([16] * 40, [500 + i for i in range(40)])
    assert wide.chunk == 539 and len(wide.work) == 40 and wide.split_kv
    assert fa2_split.plan([16], [50]).chunk == 128 and fa2_split.plan([16], [50]).split_kv


def test_disabling_split_kv_is_the_attention_whatever_the_host_lengths():
    """Option (b) of issue 41: no partition, no merge, each CTA a request's whole device KV."""
    q, k, v, starts = fa2_split.tensors([16], [1032])
    p = fa2_split.plan([16], [1032], disable_split_kv=True)
    got = fa2_split.run(p, [1020], q, k, v, starts)["out"]
    assert float((got - fa2_split.reference([16], [1020], q, k, v, starts)).abs().max()) < TOL


def test_the_deterministic_straddling_cases_straddle_and_corrupt():
    for bs in (1, 8):
        case = fa2_split.straddling_case(bs)
        got = fa2_split.attention_error(case["bound_kv"], case["device_kv"])
        assert case["straddling"] and got["chunk"] == case["chunk"] and got["max_err"] > 0.1
    one = fa2_split.straddling_case(1)
    assert (one["device_kv"], one["bound_kv"], one["chunk"]) == ([1020], [1032], 128)


def test_the_straddle_table_counts_replans_at_least_where_plans_would_corrupt():
    rows = fa2_split.straddle_table(bss=(1, 64), contexts=(512, 32768), steps=40)
    assert all(r["replanned"] >= r["corrupt_unguarded"] for r in rows)
    assert {(r["bs"], r["context"]): r["replanned"] for r in rows}[64, 512] == 0.0
