"""DFLASH's bound covers every verify it plans, and its floor never overtakes the device,
grammar-truncated commits included.

The overlap loop, step by step, as SGLang 0.5.19+ runs it: launching step k, the host
prepares batch k from what it has committed (the results up to step k-2: step k-1's are
processed after step k is launched) with SGLang's own ``page_aligned_decode_alloc_lens``
(``reserve = 2 * block``, page-rounded: ``nxt_kv_lens``), the device verifies ``block``
tokens past what it has committed, then commits ``1..block`` of them. A grammar request
may commit fewer on the host than the device accepted: ``_accept_grammar_tokens`` stops
at the token that terminates the grammar (or aborts on an illegal one), and either way the
request finishes and leaves the batches prepared after. Read from 0.5.23's
``batch_result_processor.py`` (``advance_grammar_fsm``); the model holds that rule and
the verify's length to the bound (above) and to the partition guard's floor, the host's
committed length + the block (below: ``caps.BoundStep``).
"""

import importlib
import types

import pytest
from compat.expectations import expectation_for
from hypothesis import given, settings
from hypothesis import strategies as st

# The bound variant exists from 0.5.19 (nxt_kv_lens_cpu, page_aligned_decode_alloc_lens);
# the compat tier runs this file against older releases too, which have neither.
pytestmark = pytest.mark.skipif(
    not expectation_for().host_plan, reason="this release plans DFLASH with a readback"
)


def page_aligned_decode_alloc_lens(reqs, **kwargs):
    module = importlib.import_module("sglang.srt.mem_cache.allocation_sizing")
    return module.page_aligned_decode_alloc_lens(reqs, **kwargs)


def run_loop(accepts, block, page, truncate_at: dict, finish_on_truncate=True, floor_plus=0):
    """The verifies a bound failed to cover, and those whose floor (the host's committed
    length + ``floor_plus``, as prepared) was above the device's: ``[(step, request)]``
    each. ``accepts[i][k]``: what the device commits at request i's k-th step;
    ``truncate_at[i] = (k, kept)``: at step k the host keeps only ``kept`` of them (the
    grammar ended there)."""
    n = len(accepts)
    kv = [types.SimpleNamespace(kv_allocated_len=64, kv_committed_len=64) for _ in range(n)]
    device = [64] * n  # committed on the device
    running, done_steps, short, above = set(range(n)), [0] * n, [], []
    launched: list = []  # per step: the requests in it
    for k in range(max(len(a) for a in accepts) + 2):
        batch = [i for i in sorted(running) if done_steps[i] < len(accepts[i])]
        reqs = [types.SimpleNamespace(kv=kv[i]) for i in batch]
        _, nxt, _ = page_aligned_decode_alloc_lens(reqs, reserve=2 * block, page_size=page)
        for i, bound in zip(batch, nxt):
            kv[i].kv_allocated_len = bound
            if device[i] + block > bound:  # the verify's KV length against its plan
                short.append((k, i))
            if kv[i].kv_committed_len + floor_plus > device[i]:  # the floor against it
                above.append((k, i))
            device[i] += accepts[i][done_steps[i]]
            done_steps[i] += 1
        launched.append(batch)
        if k >= 1:  # step k-1's results, processed after step k was launched
            for i in launched[k - 1]:
                step = done_steps[i] - (2 if i in launched[k] else 1)
                got = accepts[i][step]
                cut = truncate_at.get(i)
                if cut is not None and cut[0] == step:
                    got = min(got, cut[1])
                    if finish_on_truncate:
                        running.discard(i)
                kv[i].kv_committed_len += got
    return short, above


accept_runs = st.integers(1, 16).flatmap(
    lambda block: st.tuples(
        st.just(block),
        st.lists(st.lists(st.integers(1, block), min_size=1, max_size=12), min_size=1, max_size=6),
    )
)


@settings(deadline=None)
@given(accept_runs, st.sampled_from([1, 16, 64]), st.data())
def test_the_bound_covers_every_verify_with_or_without_grammar(run, page, data):
    block, accepts = run
    truncate_at = {
        i: (data.draw(st.integers(0, len(a) - 1)), data.draw(st.integers(1, block)))
        for i, a in enumerate(accepts)
        if data.draw(st.booleans())
    }
    assert run_loop(accepts, block, page, truncate_at) == ([], [])


@settings(deadline=None)
@given(accept_runs, st.sampled_from([1, 16, 64]))
def test_a_floor_one_above_the_committed_length_overtakes_the_device(run, page):
    """Why the floor is the committed length itself, not + 1 for "the device accepted at
    least one token": a request level with the host (its first step, or its last one
    processed already) has a device length equal to what the host committed."""
    block, accepts = run
    assert (0, 0) in run_loop(accepts, block, page, {}, floor_plus=1)[1]


def test_a_truncated_request_that_stayed_would_break_the_bound():
    """Why the grammar rule matters: were a truncated request kept running, the host would
    fall behind the device for good and the bound would come up short."""
    accepts = [[8] * 8]
    assert run_loop(accepts, 8, 1, {0: (1, 1)}, finish_on_truncate=False)[0] != []
    assert run_loop(accepts, 8, 1, {0: (1, 1)}) == ([], [])
