"""The relay's edges, pinned down where mutation testing found them loose
(scripts/mutation.py, tests/MUTATION.md).

Expected values come from the module's documented contract (spec_fused/relay.py: which
stream waits for what, what is logged once and why, when SGLang's own path runs), from
SGLang's FutureMap unpatched (``traces.unpatched_then_patched``) or from literals -
never from the relay's own output. CUDA calls go through ``CudaOps``: here they are
recorded by the stand-ins of tests/test_stream_order.py, or ``torch.cuda`` itself is
stood in for so ``CudaOps`` can be read on a CPU."""

import logging
from types import SimpleNamespace

import pytest
import torch
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
from test_stream_order import FakeOps, FakeStream

from spec_fused import cuda_ops, upstream
from spec_fused import relay as relay_mod
from spec_fused.caps import SpecCaps
from spec_fused.integration import sglang_patch
from spec_fused.kernels.checks import StaleHostMirrorError
from spec_fused.traces import TraceConfig, decode_batch, make_future_map

CFG = TraceConfig(pool=16, max_len=32)
EXACT = SpecCaps(True, "exact", "test")
NO_HOST = SpecCaps(False, "none", "test")


@pytest.fixture(autouse=True)
def _fresh_log_once():
    relay_mod._logged.clear()
    yield
    relay_mod._logged.clear()


def _messages(caplog):
    return [r.getMessage() for r in caplog.records if r.name == "spec_fused"]


def _relay(caps=EXACT, *, ops="fake", debug=False, fm=None, algo="EAGLE", needs_cpu=True):
    """A FusedRelay on an unpatched FutureMap, driven directly."""
    fm = fm if fm is not None else make_future_map(algo, CFG, needs_cpu_seq_lens=needs_cpu)
    ops = FakeOps() if ops == "fake" else ops
    return relay_mod.FusedRelay(fm, caps, debug=debug, ops=ops), fm, ops


# ----------------------------------------------------------------------------- debug switches


def test_sglangs_poisoning_is_not_assumed_when_its_source_cannot_be_read(monkeypatch):
    import inspect

    def unreadable(obj):
        raise OSError("could not get source code")

    monkeypatch.setattr(inspect, "getsource", unreadable)
    assert upstream.sglang_poisons_seq_lens() is False


# ----------------------------------------------------------------------------- devices


def test_rocm_is_refused_with_the_hip_only_branches_named(monkeypatch):
    monkeypatch.setattr(torch.version, "hip", "6.2", raising=False)
    why = relay_mod.unsupported_device("cuda:0")
    assert why == ("ROCm (HIP): upstream takes HIP-only branches here (publish_ready."
                   "synchronize(), the stream_ordered resolve) that spec_fused does not "
                   "reproduce")


# ----------------------------------------------------------------------------- decisions


def _fm_for_caps(tbo_reader, monkeypatch, how="because"):
    from spec_fused import upstream

    monkeypatch.setattr(upstream, "two_batch_overlap", lambda server_args=None: (tbo_reader, how))
    return make_future_map("EAGLE", CFG, needs_cpu_seq_lens=False)


@pytest.mark.parametrize("tbo", [False, True])
def test_a_known_two_batch_overlap_setting_is_not_logged(monkeypatch, caplog, tbo):
    fm = _fm_for_caps(tbo, monkeypatch)
    with caplog.at_level(logging.INFO, logger="spec_fused"):
        caps = relay_mod.future_map_caps(fm)
    assert caps.host_seq_lens == ("exact" if tbo else "none")
    assert not [m for m in _messages(caplog) if "two-batch overlap" in m]


def test_an_unknown_two_batch_overlap_setting_is_logged_once_with_how(monkeypatch, caplog):
    fm = _fm_for_caps(None, monkeypatch, how="the flag is 'maybe'")
    with caplog.at_level(logging.WARNING, logger="spec_fused"):
        for _ in range(2):
            caps = relay_mod.future_map_caps(fm)
    assert (caps.host_seq_lens, caps.host_source) == ("exact", "forced")
    assert _messages(caplog) == [
        "spec_fused: cannot tell whether two-batch overlap is on (the flag is 'maybe'); "
        "exact host lengths, as upstream gives them under it"]


def test_a_refused_override_is_logged_once_as_refused(monkeypatch, caplog):
    monkeypatch.setenv("SPEC_FUSED_HOST_SEQ_LENS", "none")
    fm = make_future_map("EAGLE", CFG, needs_cpu_seq_lens=True)
    with caplog.at_level(logging.WARNING, logger="spec_fused"):
        relay_mod.future_map_caps(fm)
        relay_mod.future_map_caps(fm)
    assert _messages(caplog) == [
        "spec_fused: override refused: SPEC_FUSED_HOST_SEQ_LENS=none for EAGLE: an attention "
        "backend reads host lengths (needs_cpu_seq_lens)"]


def test_a_workers_claim_against_a_backend_is_refused_and_logged_once(monkeypatch, caplog):
    """Through the path the scheduler takes: a worker that says it needs no host lengths,
    on a FutureMap whose backends read them, gets exact host lengths and one log line."""
    monkeypatch.delenv("SPEC_FUSED_HOST_SEQ_LENS", raising=False)
    fm = make_future_map("EAGLE", CFG, needs_cpu_seq_lens=True)
    worker = SimpleNamespace(host_seq_lens="none")
    with caplog.at_level(logging.WARNING, logger="spec_fused"):
        for _ in range(2):
            caps = relay_mod.future_map_caps(fm, worker=worker)
    assert caps.host_seq_lens == "exact"
    assert _messages(caplog) == [
        "spec_fused: override refused: SimpleNamespace.host_seq_lens='none' for EAGLE: an "
        "attention backend reads host lengths (needs_cpu_seq_lens)"]


@pytest.mark.parametrize("how", ["worker", "env"])
def test_an_explicit_exact_claim_gives_the_batch_host_lengths_on_opted_out_backends(
        how, monkeypatch):
    """Where every backend opts out upstream hands the step no host lengths; a worker's
    ``host_seq_lens="exact"`` or ``SPEC_FUSED_HOST_SEQ_LENS=exact`` puts them back - on
    the batch, not only in the caps."""
    monkeypatch.delenv("SPEC_FUSED_HOST_SEQ_LENS", raising=False)
    fm = make_future_map("EAGLE", CFG, needs_cpu_seq_lens=False)
    worker = None
    if how == "worker":
        worker = SimpleNamespace(host_seq_lens="exact")
    else:
        monkeypatch.setenv("SPEC_FUSED_HOST_SEQ_LENS", "exact")
    caps = relay_mod.future_map_caps(fm, worker=worker)
    assert (caps.host_seq_lens, caps.host_source) == ("exact", how)
    relay = relay_mod.FusedRelay(fm, caps, debug=False, ops=None)
    assert relay.gives_host_lengths(fm)
    relay.publish(fm, torch.tensor([3, 5, 7]), torch.tensor([11, 4, 9]))
    batch = decode_batch([7, 3], CFG)
    relay.resolve(fm, batch)
    assert batch.seq_lens.tolist() == [9, 11]
    assert batch.seq_lens_cpu.tolist() == [9, 11] and batch.seq_lens_sum == 20


def test_no_claim_on_opted_out_backends_gives_the_batch_no_host_lengths(monkeypatch):
    monkeypatch.delenv("SPEC_FUSED_HOST_SEQ_LENS", raising=False)
    fm = make_future_map("EAGLE", CFG, needs_cpu_seq_lens=False)
    relay = relay_mod.FusedRelay(fm, relay_mod.future_map_caps(fm), debug=False, ops=None)
    assert not relay.gives_host_lengths(fm)
    relay.publish(fm, torch.tensor([3, 7]), torch.tensor([11, 9]))
    batch = decode_batch([7, 3], CFG)
    relay.resolve(fm, batch)
    assert batch.seq_lens.tolist() == [9, 11]
    assert (batch.seq_lens_cpu, batch.seq_lens_sum) == (None, None)


@pytest.mark.parametrize("algo, needs_cpu, gives", [
    ("EAGLE", True, True),    # a backend reads host lengths: upstream gives them
    ("NGRAM", False, False),  # exact caps, but this FutureMap (unlike a server's) says no
    ("NGRAM", True, True),
])
def test_unclaimed_exact_host_lengths_follow_upstreams_flag(algo, needs_cpu, gives,
                                                             monkeypatch):
    """Without an explicit claim the batch gets host lengths exactly where SGLang's own
    FutureMap would: its ``needs_cpu_seq_lens`` (upstream forces it for NGRAM)."""
    monkeypatch.delenv("SPEC_FUSED_HOST_SEQ_LENS", raising=False)
    fm = make_future_map(algo, CFG, needs_cpu_seq_lens=needs_cpu)
    caps = relay_mod.future_map_caps(fm)
    assert caps.host_seq_lens == "exact"
    relay = relay_mod.FusedRelay(fm, caps, debug=False, ops=None)
    assert relay.gives_host_lengths(fm) is gives
    relay.publish(fm, torch.tensor([2]), torch.tensor([6]))
    batch = decode_batch([2], CFG)
    relay.resolve(fm, batch)
    assert (batch.seq_lens_cpu is not None) is gives


def test_each_distinct_refusal_is_logged_once(monkeypatch, caplog):
    """Once per refusal, not once per process: a second, different unsafe override (here
    under another algorithm) still gets its own line."""
    monkeypatch.setenv("SPEC_FUSED_HOST_SEQ_LENS", "none")
    with caplog.at_level(logging.WARNING, logger="spec_fused"):
        for algo in ("EAGLE", "EAGLE", "NGRAM"):
            relay_mod.future_map_caps(make_future_map(algo, CFG, needs_cpu_seq_lens=True))
    refused = [m for m in _messages(caplog) if "override refused" in m]
    assert len(refused) == 2
    assert "for EAGLE" in refused[0] and "for NGRAM" in refused[1]


# ----------------------------------------------------------------------------- CudaOps


class _CudaStub:
    """``torch.cuda`` calls CudaOps makes, recorded (a CPU has no CUDA)."""

    def __init__(self, handles):
        self.handles = list(handles)
        self.calls = []

    def Stream(self, device, priority=0):  # noqa: N802 - torch's name
        self.calls.append(("Stream", device, priority))
        return SimpleNamespace(cuda_stream=self.handles.pop(0) if self.handles else 99)

    def current_stream(self, device=None):
        self.calls.append(("current_stream", device))
        return "current"


def test_cuda_ops_draw_high_priority_streams_none_of_sglangs(monkeypatch):
    stub = _CudaStub([1, 2, 1, 7])
    monkeypatch.setattr(torch.cuda, "Stream", stub.Stream)
    ops = cuda_ops.CudaOps("cuda:1")
    stream = ops.new_stream({1, 2})
    assert stream.cuda_stream == 7 and ops.handle(stream) == 7
    assert stub.calls == [("Stream", torch.device("cuda:1"), -1)] * 4


def test_cuda_ops_give_up_once_every_stream_of_the_pool_was_tried(monkeypatch):
    """CUDA's pools hold 32 streams per priority: well past that, a distinct stream will
    not come, and the relay is declined (SGLang's path runs) instead of looping."""
    stub = _CudaStub([])
    monkeypatch.setattr(torch.cuda, "Stream", stub.Stream)
    with pytest.raises(RuntimeError, match="^spec_fused: unable to allocate a stream "
                                           "distinct from SGLang's$"):
        cuda_ops.CudaOps("cuda:0").new_stream({99})
    assert len(stub.calls) > 32


def test_cuda_ops_current_stream_is_the_relays_devices(monkeypatch):
    stub = _CudaStub([])
    monkeypatch.setattr(torch.cuda, "current_stream", stub.current_stream)
    ops = cuda_ops.CudaOps("cuda:1")
    assert ops.current_stream() == "current"
    assert stub.calls == [("current_stream", torch.device("cuda:1"))]


@pytest.mark.parametrize("device", ["cuda", "cuda:1", torch.device("cuda:0")])
def test_a_cuda_device_gets_cuda_ops_bound_to_torch_cuda(device):
    """What the relay will call on CUDA - built without touching a device, so readable
    on a CPU: the capture query, the stream context and the event type of ``torch.cuda``,
    for this device."""
    ops = cuda_ops.ops_for(device)
    assert isinstance(ops, cuda_ops.CudaOps) and ops.device == torch.device(device)
    assert ops.capturing is torch.cuda.is_current_stream_capturing
    assert ops.stream_ctx is torch.cuda.stream and ops.event is torch.cuda.Event


@pytest.mark.parametrize("device", ["cpu", torch.device("cpu"), "meta"])
def test_a_host_device_gets_no_cuda_ops(device):
    assert cuda_ops.ops_for(device) is None


def test_cuda_ops_record_stream_only_for_device_tensors():
    seen = []
    cuda_tensor = SimpleNamespace(device=torch.device("cuda:0"), record_stream=seen.append)
    cuda_ops.CudaOps.record_stream(cuda_tensor, "the stream")
    cuda_ops.CudaOps.record_stream(torch.zeros(2), "the stream")  # host: nothing to record
    assert seen == ["the stream"]


# ----------------------------------------------------------------------------- FusedRelay


def test_the_ops_handed_in_are_the_ones_used():
    relay, fm, ops = _relay()
    assert relay.ops is ops and relay.on_cuda
    assert relay.relay_stream.name == "relay3"


@pytest.mark.parametrize("caps, variant", [(EXACT, "war_guarded"), (NO_HOST, "barrier_free")])
def test_the_chosen_variant_follows_the_caps(caps, variant):
    relay, _, _ = _relay(caps, ops=None)
    assert relay.variant == variant and relay.host_seq_lens == caps.host_seq_lens


class _ScatteredByAGraph:
    """A FutureMap whose relay buffers are a class-level property (no instance ``_relay``):
    a captured verify graph has already scattered ``published_seq_lens``."""

    _relay = property(lambda self: self._buffers)

    def __init__(self, published):
        self.new_seq_lens_buf = torch.zeros(CFG.pool, dtype=torch.int64)
        self.needs_cpu_seq_lens = True
        self.publish_ready = None
        self._buffers = SimpleNamespace(published_seq_lens=published)


def test_relay_buffers_found_on_the_class_are_used():
    published = torch.tensor([5])
    fm = _ScatteredByAGraph(published)
    relay = relay_mod.FusedRelay(fm, EXACT, debug=False, ops=None)
    relay.publish(fm, torch.tensor([1]), published)
    assert relay.pending is None and fm._buffers.published_seq_lens is None


def test_a_debug_relay_reads_the_host_mirror_strictly():
    """Debug mode never waits again for a stale row: it raises at once."""
    relay, fm, ops = _relay(debug=True)
    relay.launcher.buf[torch.tensor([1, 2])] = torch.tensor([7, 8])
    out = relay.launcher.launch_checked(torch.tensor([1, 2]), None, None, True)
    stamp = relay.launcher.stamp
    relay.launcher.ring.np[stamp & 1, -1] = -12345
    waits = []
    with pytest.raises(StaleHostMirrorError) as info:
        relay._read_host(stamp, out, wait=lambda: waits.append(1))
    assert info.value.cause == "stale" and waits == []


def _failing_launch(relay, exc_factory):
    calls = []

    def launch(*args):
        calls.append(args)
        raise exc_factory()

    relay._launch = launch
    relay.launcher.launch = launch
    relay.launcher.launch_checked = launch
    return calls


@pytest.mark.parametrize("backend", ["reference", "null"])
def test_a_failing_reference_or_null_backend_is_not_retried(backend, caplog):
    relay, fm, _ = _relay(ops=None)
    relay.launcher.backend = backend
    calls = _failing_launch(relay, lambda: RuntimeError("boom"))
    with caplog.at_level(logging.WARNING, logger="spec_fused"):
        with pytest.raises(RuntimeError, match="boom"):
            relay._fall_back(RuntimeError("boom"), torch.tensor([1]), None, None, False)
    assert calls == [] and relay.launcher.backend == backend
    assert not [m for m in _messages(caplog) if "falling back" in m]


def test_each_kind_of_kernel_failure_is_logged_once_with_the_device(caplog):
    relay, fm, _ = _relay(ops=None)
    with caplog.at_level(logging.WARNING, logger="spec_fused"):
        for exc in (RuntimeError("boom"), RuntimeError("boom again"), KeyError("k")):
            relay.launcher.backend = "interpreter"
            relay._bind_launch()
            out = relay._fall_back(exc, torch.tensor([1]), None, None, False)
            assert relay.launcher.backend == "reference"
            assert out.tolist() == fm.new_seq_lens_buf[1:2].tolist()
    assert [m for m in _messages(caplog) if "falling back" in m] == [
        "spec_fused: fused kernel failed on cpu (RuntimeError: boom); falling back to the "
        "torch reference",
        "spec_fused: fused kernel failed on cpu (KeyError: 'k'); falling back to the torch "
        "reference"]


def test_the_private_stream_is_redrawn_when_it_is_futuremaps_d2h_stream():
    ops = FakeOps(relay_handles=(7, 5))
    fm = make_future_map("EAGLE", CFG, needs_cpu_seq_lens=True)
    fm.fwd_prepare_d2h_stream = FakeStream("d2h", ops.log, 7)
    relay = relay_mod.FusedRelay(fm, EXACT, debug=False, ops=ops)
    assert relay.relay_stream.cuda_stream == 7
    with ops.on(ops.forward):
        relay.publish(fm, torch.tensor([1]), torch.tensor([10]))
    batch = decode_batch([1], CFG)
    relay.resolve(fm, batch)
    assert relay.relay_stream.cuda_stream == 5
    assert batch.seq_lens_cpu.tolist() == [10] and batch.seq_lens_sum == 10


# ----------------------------------------------------------------------------- graph capture


def test_a_captured_publish_runs_on_the_kernel_and_logs_the_pending_one_once(caplog):
    relay, fm, ops = _relay()
    backend = relay.launcher.backend
    with caplog.at_level(logging.INFO, logger="spec_fused"):
        for value in (10, 11):
            with ops.on(ops.forward):
                relay.publish(fm, torch.tensor([1]), torch.tensor([value]))  # pending
            ops.capturing_now = True
            with ops.on(ops.forward):
                relay.publish(fm, torch.tensor([2]), torch.tensor([value + 10]))
            ops.capturing_now = False
    assert relay.launcher.backend == backend and relay.pending is None
    assert fm.new_seq_lens_buf[1:3].tolist() == [11, 21]
    assert _messages(caplog) == ["spec_fused: a publish pending when CUDA-graph capture began "
                                 "was landed outside the capture"]


def _warm_publish_variant(relay, fm, ops, values_dtype=torch.int64):
    """Launch the publish-only variant once, eagerly, as a flush does before a capture."""
    with ops.on(ops.forward):
        relay.publish(fm, torch.tensor([9]), torch.tensor([90], dtype=values_dtype))
    relay.flush()
    ops.log.clear()


def test_a_captured_publish_of_a_variant_never_launched_is_sglangs_own(caplog):
    """Nothing compiles, and no full check runs, inside a capture: a variant this
    launcher has not launched eagerly before is left to SGLang's publish (here, float
    values, which SGLang's own publish casts), and the kernel stays."""
    relay, fm, ops = _relay()
    backend = relay.launcher.backend
    ops.capturing_now = True
    with caplog.at_level(logging.INFO, logger="spec_fused"):
        with pytest.raises(relay_mod.HandToSGLang, match="publish under capture"):
            with ops.on(ops.forward):
                relay.publish(fm, torch.tensor([1]), torch.tensor([1.5]))
    assert relay.launcher.backend == backend and relay.pending is None
    assert ops.log == []  # not launched, not recorded: SGLang's publish does both
    assert _messages(caplog) == ["spec_fused: a publish under CUDA-graph capture is "
                                 "SGLang's own (its launch variant was not compiled before "
                                 "the capture)"]


# ----------------------------------------------------------------------------- resolve


def test_an_empty_exact_resolve_gives_what_upstream_gives():
    want = make_future_map("EAGLE", CFG, needs_cpu_seq_lens=True)
    upstream_batch = decode_batch([], CFG)
    want.resolve_seq_lens_cpu(upstream_batch)
    relay, fm, ops = _relay()
    with ops.on(ops.forward):
        relay.publish(fm, torch.tensor([1]), torch.tensor([10]))
    batch = decode_batch([], CFG)
    relay.resolve(fm, batch)
    assert batch.seq_lens_cpu.dtype == upstream_batch.seq_lens_cpu.dtype == torch.int64
    assert batch.seq_lens_cpu.tolist() == upstream_batch.seq_lens_cpu.tolist() == []
    assert batch.seq_lens_sum == upstream_batch.seq_lens_sum == 0


@pytest.mark.parametrize("host", [torch.tensor([5, 6, 7]), torch.tensor([5.0, 6.0]),
                                  torch.tensor([[5, 6]]), [5, 6]])
def test_host_indices_that_are_not_the_batchs_own_are_not_gathered_from(host):
    """Only a 1-D integer CPU copy of ``future_indices``, as long as it, is staged; any
    other exact step is SGLang's, after the pending publish landed - gated on
    ``publish_ready``, never on the schedule stream."""
    relay, fm, ops = _relay()
    with ops.on(ops.forward):
        relay.publish(fm, torch.tensor([1, 2, 5, 6, 7]), torch.tensor([10, 20, 50, 60, 70]))
    batch = decode_batch([1, 2], CFG)
    batch.req_pool_indices_cpu = host
    with pytest.raises(relay_mod.HandToSGLang, match="no host indices"):
        relay.resolve(fm, batch)
    assert relay.pending is None and fm.new_seq_lens_buf[[1, 2, 5]].tolist() == [10, 20, 50]
    assert not [e for e in ops.log if e[1] == "wait_stream"]


def test_debug_mode_checks_the_host_indices_against_future_indices():
    relay, fm, ops = _relay(debug=True)
    with ops.on(ops.forward):
        relay.publish(fm, torch.tensor([1, 2]), torch.tensor([10, 20]))
    batch = decode_batch([1, 2], CFG)
    batch.req_pool_indices_cpu = torch.tensor([2, 1])
    with pytest.raises(AssertionError,
                       match="^batch.req_pool_indices_cpu differs from future_indices$"):
        relay.resolve(fm, batch)


# ----------------------------------------------------------------------------- flush


def test_a_flush_before_any_resolve_runs_on_a_stream_none_of_sglangs():
    ops = FakeOps(relay_handles=(2, 5))  # the first draw aliases the forward stream (2)
    relay, fm, _ = _relay(ops=ops)
    with ops.on(ops.forward):
        relay.publish(fm, torch.tensor([1]), torch.tensor([10]))
        relay.publish(fm, torch.tensor([1]), torch.tensor([11]))  # lands the first
    ours = [e for e in ops.log if e[0].startswith("relay")]
    assert ours and all(e[0] == "relay5" for e in ours)


def test_a_flush_whose_future_map_is_gone_orders_behind_the_callers_stream():
    import gc

    relay, fm, ops = _relay()
    relay.pending = (torch.tensor([1]), torch.tensor([10]))
    buf = fm.new_seq_lens_buf
    del fm
    gc.collect()
    ops.log.clear()
    relay.flush()
    assert ops.log[0] == ("relay3", "wait_stream", "schedule")
    assert relay.pending is None and buf[1] == 10


def test_a_landed_publish_records_a_fresh_publish_ready_when_it_was_cleared():
    relay, fm, ops = _relay()
    with ops.on(ops.forward):
        relay.publish(fm, torch.tensor([1]), torch.tensor([10]))
    fm.publish_ready = None
    relay.flush()
    assert fm.publish_ready is not None
    assert ("relay3", "record", fm.publish_ready.name) in ops.log


def test_fencing_keeps_the_pending_publishs_tensors_alive_on_the_callers_stream():
    relay, fm, ops = _relay()
    with ops.on(ops.forward):
        relay.publish(fm, torch.tensor([1]), torch.tensor([10]))
    ops.log.clear()
    relay.fence_current_stream()
    assert ops.log == [("schedule", "wait_event", fm.publish_ready.name),
                       ("schedule", "record_stream"), ("schedule", "record_stream")]


def test_a_settled_int32_publish_lands_in_the_int64_buffer(caplog):
    """SGLang's publish takes int32 lengths too; landing them with plain torch must cast
    (``index_put`` refuses mixed dtypes), or the lengths would be dropped as unlandable."""
    relay, fm, ops = _relay(ops=None)
    relay.pending = (torch.tensor([2, 5]), torch.tensor([21, 51], dtype=torch.int32))
    with caplog.at_level(logging.WARNING, logger="spec_fused"):
        relay.settle_pending()
    assert relay.pending is None and not _messages(caplog)
    assert fm.new_seq_lens_buf[[2, 5]].tolist() == [21, 51]


def test_a_publish_that_cannot_land_is_dropped_with_one_line_per_kind(caplog):
    relay, fm, ops = _relay(ops=None)
    with caplog.at_level(logging.WARNING, logger="spec_fused"):
        for bad in [(torch.tensor([99]), torch.tensor([1])), (torch.tensor([98]), torch.tensor([2])),
                    (torch.tensor([1]), "not a tensor")]:
            relay.pending = bad
            relay.settle_pending()
            assert relay.pending is None
    lines = _messages(caplog)
    assert len(lines) == 2
    assert lines[0].startswith("spec_fused: a publish that cannot land was dropped (IndexError: ")
    assert lines[1].startswith("spec_fused: a publish that cannot land was dropped "
                               "(AttributeError: ")


# ----------------------------------------------------------------------------- relay_for


def test_the_schedulers_caps_are_the_ones_the_relay_runs_with():
    """The scheduler patch files its decision (it knows the worker) on the FutureMap
    before the first publish; the relay takes that, not a worker-less decision of its own."""
    fm = make_future_map("EAGLE", CFG, needs_cpu_seq_lens=True)  # alone: war_guarded, exact
    fm.__dict__[relay_mod.CAPS_ATTR] = SpecCaps(False, "none", "the scheduler's")
    relay = relay_mod.relay_for(fm)
    assert (relay.caps.needs_war_barrier, relay.host_seq_lens) == (False, "none")
    assert relay.variant == "barrier_free"


def test_a_confidence_relay_is_left_to_sglang_with_one_info_line(caplog):
    fm = make_future_map("EAGLE", CFG)
    fm.needs_confidence_relay = True
    with caplog.at_level(logging.INFO, logger="spec_fused"):
        assert relay_mod.relay_for(fm) is None
    assert _messages(caplog) == [
        "spec_fused: the confidence relay (DSPARK ragged verify) gates its own D2H on "
        "publish_ready; SGLang's relay runs for this FutureMap"]
    assert caplog.records[0].levelno == logging.INFO


def test_a_future_map_from_before_the_confidence_relay_is_relayed():
    fm = make_future_map("EAGLE", CFG)
    fm.__dict__.pop("needs_confidence_relay", None)
    assert relay_mod.relay_for(fm) is not None


def test_a_device_the_relay_does_not_engage_on_is_logged_once(caplog):
    fm = make_future_map("EAGLE", CFG)
    fm.new_seq_lens_buf = fm.new_seq_lens_buf.to("meta")
    with caplog.at_level(logging.WARNING, logger="spec_fused"):
        assert relay_mod.relay_for(fm) is None
    assert _messages(caplog) == [
        "spec_fused: not relaying on meta: spec_fused's ordering was only ever run on NVIDIA "
        "CUDA and CPU; SGLang's relay runs"]


def test_algorithms_without_capabilities_are_logged_once_each(monkeypatch, caplog):
    from spec_fused import caps as caps_mod

    monkeypatch.setattr(caps_mod, "_TABLE", {k: v for k, v in caps_mod._TABLE.items()
                                             if k not in ("EAGLE3", "STANDALONE")})
    with caplog.at_level(logging.WARNING, logger="spec_fused"):
        for algo in ("EAGLE3", "STANDALONE", "EAGLE3"):
            assert relay_mod.relay_for(make_future_map(algo, CFG)) is None
    lines = _messages(caplog)
    assert len(lines) == 2
    assert lines[0].startswith("spec_fused: no capabilities for speculative algorithm 'EAGLE3'")
    assert lines[0].endswith("SpecCaps(...)); SGLang's relay runs")


def test_a_future_map_that_cannot_be_relayed_says_why(monkeypatch, caplog):
    def broken(self, *args, **kwargs):
        raise ValueError("no good")

    monkeypatch.setattr(relay_mod.FusedRelay, "__init__", broken)
    with caplog.at_level(logging.WARNING, logger="spec_fused"):
        assert relay_mod.relay_for(make_future_map("EAGLE", CFG)) is None
    assert _messages(caplog) == [
        "spec_fused: cannot relay this FutureMap (ValueError: no good); SGLang's relay runs"]


def test_release_mode_leaves_the_buffer_as_sglang_made_it(monkeypatch):
    monkeypatch.delenv("SPEC_FUSED_DEBUG", raising=False)
    fm = make_future_map("EAGLE", CFG)
    before = fm.new_seq_lens_buf.clone()
    assert relay_mod.relay_for(fm) is not None
    assert torch.equal(fm.__dict__["new_seq_lens_buf"], before)


class _FutureMapWithoutRelayBuffers:
    """What a FutureMap before 0.5.23 carries (no ``_relay`` at all)."""

    def __init__(self):
        self.new_seq_lens_buf = torch.zeros(CFG.pool, dtype=torch.int64)
        self.needs_cpu_seq_lens = True
        self.publish_ready = None
        self.spec_algo = SpeculativeAlgorithm.EAGLE


def test_debug_mode_poisons_a_future_map_without_relay_buffers(monkeypatch):
    monkeypatch.setenv("SPEC_FUSED_DEBUG", "1")
    monkeypatch.setattr(relay_mod, "sglang_tracks_seq_lens", lambda: False)
    fm = _FutureMapWithoutRelayBuffers()
    assert relay_mod.relay_for(fm) is not None
    assert (fm.__dict__["new_seq_lens_buf"] == -1).all()


def test_the_relay_logs_its_variant_once_per_configuration(caplog):
    with caplog.at_level(logging.INFO, logger="spec_fused"):
        for needs_cpu in (True, True, False):
            relay_mod.relay_for(make_future_map("EAGLE", CFG, needs_cpu_seq_lens=needs_cpu))
    lines = [m for m in _messages(caplog) if "variant" in m]
    backend = relay_mod.explain_relay_backend("cpu")[0]
    assert lines == [
        f"spec_fused: relaying EAGLE lengths with the fused war_guarded variant (host lengths: "
        f"exact, kernel: {backend})",
        f"spec_fused: relaying EAGLE lengths with the fused war_guarded variant (host lengths: "
        f"none, kernel: {backend})"]


@pytest.mark.parametrize("forced", ["bogus", "other"])
def test_an_ignored_force_backend_setting_is_logged_once_per_reason(monkeypatch, caplog, forced):
    monkeypatch.setenv("SPEC_FUSED_FORCE_BACKEND", forced)
    with caplog.at_level(logging.WARNING, logger="spec_fused"):
        for _ in range(2):
            relay_mod.relay_for(make_future_map("EAGLE", CFG))
        monkeypatch.setenv("SPEC_FUSED_FORCE_BACKEND", "null")
        relay_mod.relay_for(make_future_map("EAGLE", CFG))
    lines = [m for m in _messages(caplog) if "ignored" in m]
    _, why = relay_mod.explain_relay_backend("cpu")
    assert len(lines) == 2 and all(m.startswith("spec_fused: ") for m in lines)
    assert f"(SPEC_FUSED_FORCE_BACKEND={forced!r} ignored: only 'null' is known)" in lines[0]
    assert lines[1] == f"spec_fused: {why}" and "needs SPEC_FUSED_BENCH=1" in why


# ----------------------------------------------------------------------------- prewarm


class _OnCuda(torch.Tensor):
    """A CPU tensor that says it is on ``cuda:0`` (prewarm_for only reads the device)."""

    @property
    def device(self):
        return torch.device("cuda:0")


@pytest.fixture
def prewarm_calls(monkeypatch):
    from spec_fused.kernels import backend as backend_mod

    calls = []
    monkeypatch.setattr(sglang_patch, "prewarm",
                        lambda device, debug: calls.append((str(device), debug)))
    monkeypatch.setattr(sglang_patch, "_prewarmed", set())
    monkeypatch.setattr(torch.version, "hip", None, raising=False)
    return calls


def test_prewarm_compiles_once_per_cuda_device_for_speculative_maps(prewarm_calls):
    buf = torch.zeros(4).as_subclass(_OnCuda)
    eagle = SimpleNamespace(spec_algo=SpeculativeAlgorithm.EAGLE)
    sglang_patch.prewarm_for(SimpleNamespace(spec_algo=SpeculativeAlgorithm.NONE), buf)
    sglang_patch.prewarm_for(SimpleNamespace(), buf)
    sglang_patch.prewarm_for(eagle, "not a tensor")
    sglang_patch.prewarm_for(eagle, torch.zeros(4))  # a CPU buffer: nothing to compile
    assert prewarm_calls == []
    sglang_patch.prewarm_for(eagle, buf)
    sglang_patch.prewarm_for(eagle, buf)
    assert prewarm_calls == [("cuda:0", False)]


def test_the_prewarm_proves_the_debug_launcher_in_debug_mode(prewarm_calls, monkeypatch):
    """The canary checks the launcher the relay will build: the poisoning one under
    SPEC_FUSED_DEBUG=1."""
    monkeypatch.setenv("SPEC_FUSED_DEBUG", "1")
    sglang_patch.prewarm_for(SimpleNamespace(spec_algo=SpeculativeAlgorithm.EAGLE),
                             torch.zeros(4).as_subclass(_OnCuda))
    assert prewarm_calls == [("cuda:0", True)]


def test_a_failed_prewarm_is_logged_once(monkeypatch, prewarm_calls, caplog):
    def fail(device, debug):
        raise RuntimeError("no compiler")

    monkeypatch.setattr(sglang_patch, "prewarm", fail)
    eagle = SimpleNamespace(spec_algo=SpeculativeAlgorithm.EAGLE)
    with caplog.at_level(logging.WARNING, logger="spec_fused"):
        sglang_patch.prewarm_for(eagle, torch.zeros(4).as_subclass(_OnCuda))
    assert _messages(caplog) == ["spec_fused: could not compile the fused kernel ahead of "
                                 "serving (RuntimeError: no compiler)"]


# ----------------------------------------------------------------------------- hand-back


def test_a_disabled_relay_is_kept_with_its_reason_and_sglang_serves():
    fm = make_future_map("EAGLE", CFG)
    relay = relay_mod.relay_for(fm)
    relay.pending = (torch.tensor([3]), torch.tensor([30]))
    sglang_patch.disable(fm, relay, "because")
    assert relay_mod.relay_for(fm) is None and fm.__dict__[relay_mod.RELAY_ATTR] is None
    assert fm.__dict__[relay_mod.DISABLED_ATTR] is relay and relay.disabled_reason == "because"
    assert fm.__dict__["new_seq_lens_buf"][3] == 30


def test_a_reader_whose_flush_fails_gets_the_buffer_and_the_relay_is_handed_back(monkeypatch):
    fm = make_future_map("EAGLE", CFG)
    relay = relay_mod.relay_for(fm)
    relay.pending = (torch.tensor([3]), torch.tensor([30]))

    def broken(fence=True):
        raise RuntimeError("flush broke")

    monkeypatch.setattr(relay, "flush", broken)
    buf = sglang_patch.read_buffer(fm)
    assert buf is fm.__dict__["new_seq_lens_buf"] and buf[3] == 30
    assert relay_mod.relay_for(fm) is None and relay.disabled_reason == "flush failed: flush broke"


def test_a_future_map_without_the_buffer_has_no_such_attribute():
    fm = SimpleNamespace()
    with pytest.raises(AttributeError) as info:
        sglang_patch.read_buffer(fm)
    assert info.value.args == ("new_seq_lens_buf",) and info.value.__cause__ is None


def test_a_captured_publish_whose_kernel_fails_lands_on_the_reference(monkeypatch, caplog):
    from spec_fused.kernels import publish_gather as pg

    relay, fm, ops = _relay()
    _warm_publish_variant(relay, fm, ops)
    # the kernel the warmed variant launches now fails (the reference is pg's own)
    monkeypatch.setattr(relay.launcher, "_impl",
                        lambda *a, **k: (_ for _ in ()).throw(RuntimeError("x")))
    ops.capturing_now = True
    with caplog.at_level(logging.WARNING, logger="spec_fused"):
        with ops.on(ops.forward):
            relay.publish(fm, torch.tensor([4]), torch.tensor([40]))
    assert relay.launcher.backend == "reference" and fm.new_seq_lens_buf[4] == 40
    assert len([m for m in _messages(caplog) if "falling back" in m]) == 1


def test_a_captured_publish_arms_consume_once_as_upstreams_publish_does():
    upstream_fm = make_future_map("EAGLE", CFG)
    upstream_fm.publish(torch.tensor([4]), torch.tensor([40]))
    relay, fm, ops = _relay()
    assert relay.consume_once_flag
    _warm_publish_variant(relay, fm, ops)
    fm._publish_fresh = False
    ops.capturing_now = True
    with ops.on(ops.forward):
        relay.publish(fm, torch.tensor([4]), torch.tensor([40]))
    assert fm._publish_fresh is upstream_fm._publish_fresh is True


# ----------------------------------------------------------------------------- kernel failures


def _break_kernel(monkeypatch, relay):
    from spec_fused.kernels import publish_gather as pg

    monkeypatch.setattr(pg, "_launch",
                        lambda *a, **k: (_ for _ in ()).throw(RuntimeError("kernel broke")))
    relay.launcher.backend = relay.launcher.backend  # drop anything bound to the kernel
    relay._bind_launch()


FALLING_BACK = ("spec_fused: fused kernel failed on cpu (RuntimeError: kernel broke); "
                "falling back to the torch reference")


def test_an_exact_resolve_whose_kernel_fails_gets_its_lengths_from_the_reference(monkeypatch,
                                                                                caplog):
    relay, fm, ops = _relay()
    with ops.on(ops.forward):
        relay.publish(fm, torch.tensor([1, 2]), torch.tensor([10, 20]))
    _break_kernel(monkeypatch, relay)
    batch = decode_batch([1, 2], CFG)
    with caplog.at_level(logging.WARNING, logger="spec_fused"):
        relay.resolve(fm, batch)
    assert batch.seq_lens.tolist() == [10, 20] and batch.seq_lens_cpu.tolist() == [10, 20]
    assert batch.seq_lens_sum == 30 and relay.launcher.backend == "reference"
    assert _messages(caplog) == [FALLING_BACK]  # and no stale host row read from the device


@pytest.mark.parametrize("on_cuda", [False, True])
def test_a_flush_whose_kernel_fails_lands_on_the_reference(monkeypatch, caplog, on_cuda):
    relay, fm, ops = _relay(ops="fake" if on_cuda else None)
    relay.publish(fm, torch.tensor([1, 2]), torch.tensor([10, 20]))
    _break_kernel(monkeypatch, relay)
    with caplog.at_level(logging.WARNING, logger="spec_fused"):
        relay.flush()
    assert relay.pending is None and fm.new_seq_lens_buf[1:3].tolist() == [10, 20]
    assert relay.launcher.backend == "reference" and _messages(caplog) == [FALLING_BACK]
