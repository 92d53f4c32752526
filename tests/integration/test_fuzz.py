"""Fuzzing (hypothesis, bounded for CI): arbitrary inputs to the public kernel API and
arbitrary op sequences on the patched FutureMap.

The kernel API is held to an oracle written here from its documented contract - plain
torch indexing for the results, the argument rules for the errors - not to its own
checks: the only allowed outcomes are the oracle's error class with nothing written, or
the oracle's buffer, lengths, sum and host row. The FutureMap sequences are held to the
unpatched FutureMap."""

import random
from types import SimpleNamespace

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
from support.arms import unpatched_then_patched

from spec_fused.kernels.publish_gather import publish_gather, publish_gather_reference
from spec_fused.kernels.step_launcher import StepLauncher
from spec_fused.tools.traces import TraceConfig, decode_batch

DTYPES = [
    torch.int64,
    torch.int32,
    torch.int16,
    torch.int8,
    torch.uint8,
    torch.bool,
    torch.float32,
    torch.float16,
]
INDEX = (torch.int32, torch.int64)


@st.composite
def any_tensor(draw, max_len=40, lo=-5, hi=60):
    dtype = draw(st.sampled_from(DTYPES))
    shape = draw(st.sampled_from(["1d", "2d", "0d", "strided"]))
    n = draw(st.integers(0, max_len))
    vals = draw(st.lists(st.integers(lo, hi), min_size=n, max_size=n))
    if dtype == torch.uint8:
        vals = [abs(v) for v in vals]
    t = torch.tensor(vals, dtype=torch.int64)
    t = t > 10 if dtype == torch.bool else t.to(dtype)
    if shape == "2d" and n % 2 == 0 and n:
        t = t.reshape(2, -1)
    elif shape == "0d":
        t = torch.tensor(vals[0] if vals else 0).to(dtype)
    elif shape == "strided":
        t = torch.cat([t, t])[::2]
    return t


def _integer(t):
    return not t.dtype.is_floating_point and t.dtype != torch.bool


def oracle(buf, gather, pub, val):
    """``("error", {classes of the rules broken})`` per the documented argument rules,
    else ``("ok", (buffer after, lengths, sum))`` from plain torch indexing."""
    broken = set()
    if buf.dtype != torch.int64:
        broken.add(TypeError)
    if buf.dim() != 1 or not buf.is_contiguous():
        broken.add(ValueError)
    if gather.dim() != 1:
        broken.add(ValueError)
    if gather.dtype not in INDEX:
        broken.add(TypeError)
    if pub is not None or val is not None:
        if pub is None or val is None or pub.dim() != 1 or val.dim() != 1:
            broken.add(ValueError)
        if (pub is not None and pub.dtype not in INDEX) or (val is not None and not _integer(val)):
            broken.add(TypeError)
        if (
            pub is not None
            and val is not None
            and pub.dim() == 1
            and val.dim() == 1
            and pub.shape[0] != val.shape[0]
        ):
            broken.add(ValueError)
    if broken:
        return "error", broken
    pool = buf.shape[0]
    for idx in (gather, pub):
        if idx is not None and idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= pool):
            return "error", {ValueError}
    if pub is not None and len(set(pub.tolist())) != pub.shape[0]:
        return "error", {ValueError}
    after = buf.clone()
    if pub is not None and pub.numel():
        after[pub.long()] = val.to(torch.int64)
    lens = after[gather.long()]
    total = int(lens.sum())
    return "ok", (after.tolist(), lens.tolist(), total)


@settings(max_examples=200)
@given(
    buf=any_tensor(hi=10**6),
    gather=any_tensor(),
    pub=st.none() | any_tensor(),
    val=st.none() | any_tensor(hi=10**4),
)
def test_public_api_fuzz(buf, gather, pub, val):
    want = oracle(buf, gather, pub, val)
    for fn in (publish_gather, publish_gather_reference):
        b = torch.empty_strided(buf.shape, buf.stride(), dtype=buf.dtype)  # strides kept
        b.copy_(buf)
        try:
            res = fn(b, gather, pub, val)
        except (TypeError, ValueError) as exc:
            assert want[0] == "error" and isinstance(exc, tuple(want[1])), (fn.__name__, exc, want)
            assert str(exc)
            assert torch.equal(b, buf), "written before the error"
            continue
        assert want[0] == "ok", (fn.__name__, want)
        got = (b.tolist(), res.seq_lens.tolist(), int(res.seq_lens_sum))
        assert got == want[1], fn.__name__


@settings(max_examples=60)
@given(
    ops=st.lists(
        st.tuples(
            st.sampled_from(["publish", "resolve", "mixed", "read"]),
            st.lists(st.integers(0, 31), max_size=12, unique=True),
            st.integers(0, 500),
        ),
        max_size=30,
    ),
    algo=st.sampled_from(["EAGLE", "DFLASH", "NGRAM"]),
    needs_cpu=st.booleans(),
)
def test_patched_future_map_op_sequence_fuzz(ops, algo, needs_cpu):
    """Any sequence of publish/resolve/mixed-tail/buffer reads, patched vs unpatched."""
    cfg = TraceConfig(pool=32, max_len=1024)

    def drive(fm):
        seen = []
        fm.new_seq_lens_buf.zero_()  # defined start (upstream allocates with empty)
        for op, slots, v in ops:
            if op == "publish":
                fm.publish(
                    torch.tensor(slots, dtype=torch.int64),
                    torch.tensor([v + s for s in slots], dtype=torch.int32),
                )
            elif op == "resolve":
                b = decode_batch(slots, cfg)
                fm.resolve_seq_lens_cpu(b)
                seen.append(
                    (
                        "r",
                        b.seq_lens.tolist(),
                        None if b.seq_lens_cpu is None else b.seq_lens_cpu.tolist(),
                        b.seq_lens_sum,
                    )
                )
            elif op == "mixed" and slots and hasattr(fm, "resolve_mixed_spec_tails"):
                n = len(slots)
                b = SimpleNamespace(
                    mix_running_indices=torch.tensor(slots),
                    mix_running_indices_cpu=torch.tensor(slots),
                    seq_lens=torch.zeros(n + 1, dtype=torch.int64),
                    seq_lens_cpu=torch.zeros(n + 1, dtype=torch.int64),
                    seq_lens_sum=0,
                    out_cache_loc=torch.zeros(n + 1, dtype=torch.int64),
                    prefix_lens=[0] * (n + 1),
                )
                fm.resolve_mixed_spec_tails(b)
                seen.append(("m", b.seq_lens.tolist(), b.prefix_lens, b.seq_lens_sum))
            else:
                seen.append(("b", fm.new_seq_lens_buf.tolist()))
        return seen

    want, got = unpatched_then_patched(
        drive, SpeculativeAlgorithm[algo], cfg, needs_cpu_seq_lens=needs_cpu
    )
    assert got == want


@given(st.lists(st.integers(0, 63), max_size=64), st.integers(1, 64), st.integers(0, 10**6))
def test_stateful_launcher_host_rows_fuzz(slots, max_batch, seed):
    """The per-step launcher's row ``[*lens, sum]``, brought to the host, against plain
    torch indexing, whatever the batch against ``max_batch`` (it only sizes the host
    buffers)."""
    buf = torch.arange(64, dtype=torch.int64) * 3
    r = random.Random(seed)
    pub = r.sample(range(64), r.randint(0, 5))
    vals = [r.randrange(1000) for _ in pub]
    want = buf.clone()
    want[torch.tensor(pub, dtype=torch.int64)] = torch.tensor(vals, dtype=torch.int64)
    pg = StepLauncher(buf, max_batch=max_batch)
    gi = torch.tensor(slots, dtype=torch.int64)
    pi, pv = torch.tensor(pub, dtype=torch.int64), torch.tensor(vals, dtype=torch.int32)
    pg.row_to_host(pg.launch_checked(gi, pi, pv, True))
    lens, total = pg.host_lengths(len(slots))
    assert lens.tolist() == want[gi].tolist() and total == int(want[gi].sum())
    assert torch.equal(buf, want)
