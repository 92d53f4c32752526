"""The fused kernel against its torch reference, over random pools, batches and dtypes.

Every case asserts the Triton kernel itself ran (interpreted on CPU, compiled on GPU), so
a silent fallback to the reference cannot pass for the kernel."""

import torch
from hypothesis import given
from hypothesis import strategies as st

from spec_fused.kernels.backend import backend_for
from spec_fused.kernels.checks import PoisonedSlotError
from spec_fused.kernels.publish_gather import (
    Args,
    launch_reference,
    launch_triton,
    publish_gather,
    publish_gather_reference,
)

INDEX_DTYPES = st.sampled_from([torch.int32, torch.int64])
VALUE_DTYPES = st.sampled_from([torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8])


@st.composite
def relay_case(draw, max_pool=65536, max_batch=4096):
    pool = draw(st.integers(1, max_pool))
    seed = draw(st.integers(0, 2**31 - 1))
    g = torch.Generator().manual_seed(seed)
    n = draw(st.integers(0, min(max_batch, pool * 2)))
    m = draw(st.integers(0, min(max_batch, pool)))
    layout = draw(st.sampled_from(["overlapping", "disjoint", "same", "random"]))
    slots = torch.randperm(pool, generator=g)
    publish_idx = slots[:m]
    if layout == "same":
        gather_idx = publish_idx[torch.randperm(m, generator=g)][:n]
    elif layout == "disjoint":
        gather_idx = slots[m:][:n]
    elif layout == "overlapping":
        half = publish_idx[: m // 2 + 1][: max(0, n // 2)]
        rest = torch.randint(0, pool, (max(0, n - half.numel()),), generator=g)
        gather_idx = torch.cat([half, rest])
    else:  # random, duplicates allowed in the gather
        gather_idx = torch.randint(0, pool, (n,), generator=g)
    vdtype = draw(VALUE_DTYPES)
    hi = 100 if vdtype in (torch.int8, torch.uint8) else 30000 if vdtype == torch.int16 else 2**40
    hi = min(hi, 2**31 - 1) if vdtype == torch.int32 else hi
    values = torch.randint(0, hi, (m,), generator=g).to(vdtype)
    buf = torch.randint(0, 2**40, (pool,), generator=g, dtype=torch.int64)
    return dict(
        buf=buf,
        gather=gather_idx.to(draw(INDEX_DTYPES)),
        pub=publish_idx.to(draw(INDEX_DTYPES)),
        val=values,
        with_publish=draw(st.booleans()) or m > 0,
    )


def _both(case, **kw):
    buf_k, buf_r = case["buf"].clone(), case["buf"].clone()
    pub = (case["pub"], case["val"]) if case["with_publish"] else (None, None)
    got = publish_gather(buf_k, case["gather"], *pub, **kw)
    want = publish_gather_reference(buf_r, case["gather"], *pub, **kw)
    return buf_k, buf_r, got, want


def _launches_expected(case):
    return int(case["gather"].numel() > 0 or (case["with_publish"] and case["pub"].numel() > 0))


def test_kernel_backend_is_triton_not_reference():
    expected = "triton" if torch.cuda.is_available() else "interpreter"
    assert backend_for("cuda" if torch.cuda.is_available() else "cpu") == expected


@given(relay_case())
def test_matches_reference(kernel_launches, case):
    kernel_launches.reset()
    buf_k, buf_r, got, want = _both(case)
    assert kernel_launches.count == _launches_expected(case)
    assert torch.equal(buf_k, buf_r)
    assert torch.equal(got.seq_lens, want.seq_lens)
    assert got.seq_lens.dtype == torch.int64 and got.seq_lens_sum.shape == ()
    assert (
        int(got.seq_lens_sum) == int(want.seq_lens_sum) == int(buf_r[case["gather"].long()].sum())
    )


@given(relay_case(max_pool=4096, max_batch=1500), st.booleans())
def test_preallocated_outputs(kernel_launches, case, one_d_sum):
    kernel_launches.reset()
    n = case["gather"].numel()
    out = torch.full((n,), -7, dtype=torch.int64)
    out_sum = torch.full((1,) if one_d_sum else (), -7, dtype=torch.int64)
    buf_k, buf_r, got, want = _both(case, out=out, out_sum=out_sum)
    assert got.seq_lens.data_ptr() == out.data_ptr()
    assert torch.equal(out, want.seq_lens)
    assert int(out_sum.reshape(())) == int(want.seq_lens_sum)
    assert torch.equal(buf_k, buf_r)
    assert kernel_launches.count == _launches_expected(case)


@given(relay_case(max_pool=4096, max_batch=1500))
def test_a_row_holds_the_lengths_then_their_sum_and_leaves_out_sum_alone(case):
    """The row ``[*lens, sum]`` one copy brings to the host: kernel and reference alike."""
    n = case["gather"].numel()
    pub = (case["pub"], case["val"]) if case["with_publish"] and case["pub"].numel() else None
    rows = []
    for launch in (launch_triton, launch_reference):
        buf, out = case["buf"].clone(), torch.full((n + 1,), -7, dtype=torch.int64)
        out_sum = torch.full((), -7, dtype=torch.int64)
        launch(Args(buf, case["gather"], *(pub or (None, None)), out, out_sum, row=True))
        assert int(out_sum) == -7
        rows.append((buf, out))
    (buf_k, row_k), (buf_r, row_r) = rows
    assert torch.equal(buf_k, buf_r) and torch.equal(row_k, row_r)
    assert row_r[:n].tolist() == buf_r[case["gather"].long()].tolist()
    assert int(row_r[n]) == int(buf_r[case["gather"].long()].sum())


@given(relay_case(max_pool=2048, max_batch=1200))
def test_poison_consumes_once(case):
    case["gather"] = torch.unique(case["gather"])  # a slot is consumed by one request
    case["with_publish"] = True
    case["pub"], case["val"] = case["gather"].clone(), torch.arange(case["gather"].numel())
    buf_k, buf_r, got, want = _both(case, poison=True)
    assert torch.equal(buf_k, buf_r)
    assert torch.equal(got.seq_lens, want.seq_lens)
    if case["gather"].numel():
        assert bool((buf_k[case["gather"].long()] == -1).all())
        slot = int(case["gather"][0])
        for fn in (publish_gather, publish_gather_reference):  # the second read trips
            try:
                fn(buf_k.clone(), case["gather"], poison=True)
            except PoisonedSlotError as exc:
                assert exc.slot in set(case["gather"].tolist())
                assert str(exc.slot) in str(exc)
            else:
                raise AssertionError(f"{fn.__name__} missed a consumed slot (e.g. {slot})")


def test_publish_happens_before_gather_for_the_same_slot(kernel_launches):
    buf = torch.zeros(8, dtype=torch.int64)
    res = publish_gather(buf, torch.tensor([3, 3, 5]), torch.tensor([3]), torch.tensor([41]))
    assert res.seq_lens.tolist() == [41, 41, 0] and int(res.seq_lens_sum) == 82
    assert kernel_launches.count == 1


def test_empty_batch_launches_nothing(kernel_launches):
    buf = torch.arange(4, dtype=torch.int64)
    res = publish_gather(buf, torch.empty(0, dtype=torch.int64))
    assert res.seq_lens.numel() == 0 and int(res.seq_lens_sum) == 0
    assert kernel_launches.count == 0
    res = publish_gather(
        buf, torch.empty(0, dtype=torch.int32), torch.tensor([1]), torch.tensor([9])
    )  # an empty gather still publishes
    assert buf.tolist() == [0, 9, 2, 3] and int(res.seq_lens_sum) == 0
    assert kernel_launches.count == 1


def test_large_pool_and_batch_beyond_single_block(kernel_launches):
    pool = 1 << 20
    g = torch.Generator().manual_seed(0)
    buf = torch.randint(0, 1 << 30, (pool,), generator=g)
    slots = torch.randperm(pool, generator=g)
    pub, gat = slots[:5000], torch.cat([slots[2500:7500], slots[-1:]])
    vals = torch.randint(0, 1 << 30, (5000,), generator=g, dtype=torch.int32)
    ref = buf.clone()
    got = publish_gather(buf, gat, pub, vals)
    want = publish_gather_reference(ref, gat, pub, vals)
    assert kernel_launches.count == 1
    assert torch.equal(got.seq_lens, want.seq_lens) and torch.equal(buf, ref)
    assert int(got.seq_lens_sum) == int(want.seq_lens_sum)


def test_non_contiguous_index_and_value_views_are_read_correctly():
    buf = torch.arange(100, dtype=torch.int64)
    ref = buf.clone()
    gat = torch.arange(0, 80, dtype=torch.int64)[::4]
    pub = torch.arange(10, 50, dtype=torch.int32)[::8]
    val = (torch.arange(0, 40, dtype=torch.int64) * 1000)[::8]
    got = publish_gather(buf, gat, pub, val)
    want = publish_gather_reference(ref, gat, pub, val)
    assert torch.equal(got.seq_lens, want.seq_lens) and torch.equal(buf, ref)
