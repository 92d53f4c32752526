"""SGLang's own CPU contracts for ``FutureMap``, asserted on the patched FutureMap with the
relay engaged.

SGLang's unit tests (``test/registered/unit/managers/test_overlap_seq_lens.py``, the
mixed-spec-tail async contract, ``TestFutureMapHostSync``) build a bare
``object.__new__(FutureMap)`` without ``spec_algo``, so run against spec_fused they only
reach SGLang's fallback. These build real FutureMaps of the installed release with a
speculative algorithm, feed lengths through ``publish`` (so the fused relay holds them),
and assert the same contracts: the GPU-only path waits for ``publish_ready``, gathers, and
leaves ``seq_lens_cpu``/``seq_lens_sum`` None without touching the D2H stream; the
legacy host consumer keeps its one wait and gets the lengths and their sum; mixed tails
are rebuilt from the published lengths without mutating the originals, with one wait off
HIP, and an empty tail is a no-op. Each runs on the unpatched FutureMap too, so the
contract is checked to be upstream's, not ours."""

from types import SimpleNamespace

import pytest
import torch
from compat.expectations import expectation_for

from spec_fused import log
from spec_fused import relay as relay_mod
from spec_fused.integration import sglang_patch
from spec_fused.tools.traces import TraceConfig, decode_batch, make_future_map

RELEASE = expectation_for()
CFG = TraceConfig(pool=8, max_len=32)
_SLOTS, _FRESH = [3, 7], [11, 21]


class RecordingEvent:
    """Stands in for ``publish_ready``: records host-side calls."""

    def __init__(self):
        self.wait_calls = self.synchronize_calls = self.record_calls = 0

    def wait(self, stream=None):
        self.wait_calls += 1

    def synchronize(self):
        self.synchronize_calls += 1

    def record(self, stream=None):
        self.record_calls += 1

    def query(self):
        return True


class FailingD2HStream:
    def wait_event(self, event):
        raise AssertionError("the GPU-only seq-lens path must not touch the D2H stream")

    def synchronize(self):
        raise AssertionError("the GPU-only seq-lens path must not synchronize D2H")


@pytest.fixture(params=["upstream", "spec_fused"])
def side(request):
    if request.param == "spec_fused":
        sglang_patch.apply()
        yield request.param
        sglang_patch.remove()
    else:
        yield request.param


def _published_future_map(side, *, algorithm="EAGLE", needs_cpu=True):
    fm = make_future_map(algorithm, CFG, needs_cpu_seq_lens=needs_cpu)
    fm.publish_ready = RecordingEvent()
    fm.publish(torch.tensor(_SLOTS), torch.tensor(_FRESH))
    if side == "spec_fused":
        relay = relay_mod.relay_for(fm)
        assert relay is not None and relay.pending is not None, "the relay is not engaged"
    return fm


@pytest.mark.parametrize("algorithm", ["EAGLE", "DFLASH"])
def test_gpu_only_path_waits_gathers_and_leaves_host_lengths_none(side, algorithm):
    fm = _published_future_map(side, algorithm=algorithm, needs_cpu=False)
    fm.fwd_prepare_d2h_stream = FailingD2HStream()
    batch = decode_batch(_SLOTS, CFG)
    batch.seq_lens_cpu, batch.seq_lens_sum = torch.tensor([99, 99]), 198
    fm.resolve_seq_lens_cpu(batch)
    assert fm.publish_ready.wait_calls == 1 and fm.publish_ready.synchronize_calls == 0
    assert batch.seq_lens.tolist() == _FRESH
    assert batch.seq_lens_cpu is None and batch.seq_lens_sum is None


@pytest.mark.parametrize("algorithm", ["EAGLE", "DFLASH"])
def test_legacy_host_consumer_keeps_its_one_wait_and_gets_lengths_and_sum(side, algorithm):
    """DFLASH included: where a backend reads host lengths, DFLASH gets exact ones, as
    upstream gives them (its reserved bound is upstream's only for GPU-only backends)."""
    fm = _published_future_map(side, algorithm=algorithm, needs_cpu=True)
    batch = decode_batch(_SLOTS, CFG)
    fm.resolve_seq_lens_cpu(batch)
    assert fm.publish_ready.wait_calls + fm.publish_ready.synchronize_calls == 1
    assert batch.seq_lens.tolist() == _FRESH
    assert batch.seq_lens_cpu.tolist() == _FRESH and batch.seq_lens_sum == sum(_FRESH)


def test_the_publish_records_publish_ready_once(side):
    fm = _published_future_map(side)
    assert fm.publish_ready.record_calls == 1


@pytest.mark.skipif(not RELEASE.consume_once, reason="this release has no consume-once flag")
@pytest.mark.parametrize("debug", [False, True])
def test_consume_once_arms_on_publish_and_is_consumed_only_in_debug(side, monkeypatch, debug):
    from sglang.srt.managers import overlap_utils

    monkeypatch.setattr(overlap_utils, "_DEBUG_ASSERT", debug)
    log.reset()
    fm = _published_future_map(side)
    assert fm._publish_fresh is True
    fm.resolve_seq_lens_cpu(decode_batch(_SLOTS, CFG))
    assert fm._publish_fresh is (not debug)
    if debug:
        with pytest.raises(AssertionError, match="fresh forward publish"):
            fm.resolve_seq_lens_cpu(decode_batch(_SLOTS, CFG))


_BASE, _TAILS = [50, 60], [10, 20]


def _mixed_batch():
    return SimpleNamespace(
        mix_running_indices=torch.tensor(_SLOTS, dtype=torch.int64),
        mix_running_indices_cpu=torch.tensor(_SLOTS, dtype=torch.int64),
        seq_lens=torch.tensor(_BASE + _TAILS, dtype=torch.int64),
        out_cache_loc=torch.arange(100, 104, dtype=torch.int64),
        seq_lens_cpu=torch.tensor(_BASE + _TAILS, dtype=torch.int64),
        seq_lens_sum=sum(_BASE + _TAILS),
        prefix_lens=[49, 59, 9, 19],
    )


mixed = pytest.mark.skipif(not RELEASE.mixed_tails, reason="no resolve_mixed_spec_tails")


@mixed
def test_mixed_tails_are_rebuilt_from_the_published_lengths_with_one_wait(side):
    fm = _published_future_map(side)
    batch = _mixed_batch()
    originals = batch.seq_lens, batch.out_cache_loc
    fm.resolve_mixed_spec_tails(batch)
    assert fm.publish_ready.wait_calls == 1 and fm.publish_ready.synchronize_calls == 0
    want_lens = _BASE + [f + 1 for f in _FRESH]
    assert batch.seq_lens.tolist() == want_lens
    assert batch.seq_lens_cpu.tolist() == want_lens and batch.seq_lens_sum == sum(want_lens)
    req_to_token = fm.req_to_token
    assert batch.out_cache_loc[-2:].tolist() == [
        int(req_to_token[s, f]) for s, f in zip(_SLOTS, _FRESH)
    ]
    assert batch.prefix_lens == [49, 59] + _FRESH
    # rebuilt, never mutated in place: isolation snapshots and graph replay read these
    assert batch.seq_lens is not originals[0] and batch.out_cache_loc is not originals[1]
    assert originals[0].tolist() == _BASE + _TAILS
    assert originals[1].tolist() == [100, 101, 102, 103]


@mixed
def test_an_empty_mixed_tail_is_a_no_op(side):
    fm = _published_future_map(side)
    batch = _mixed_batch()
    batch.mix_running_indices = torch.tensor([], dtype=torch.int64)
    batch.mix_running_indices_cpu = torch.tensor([], dtype=torch.int64)
    original = batch.seq_lens
    fm.resolve_mixed_spec_tails(batch)
    assert fm.publish_ready.wait_calls == 0 and fm.publish_ready.synchronize_calls == 0
    assert batch.seq_lens is original and batch.prefix_lens == [49, 59, 9, 19]
