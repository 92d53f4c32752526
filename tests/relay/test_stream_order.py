"""The relay's CUDA stream and event logic, on a CPU: which stream waits for what, where
each launch runs, where ``publish_ready`` is recorded, when the host blocks.

Every CUDA call the relay makes goes through one object (``cuda_ops.CudaOps``); here a
stand-in (``support.fake_cuda.FakeOps``) records the calls in order while the launches
themselves run on CPU tensors (Triton interpreter), so the lengths are checked too.
``tests/test_gpu.py`` runs the same paths on real streams. In order: a patched FutureMap's
resolve and publish, the landing of a pending publish, publishes under CUDA-graph capture,
and the private stream's draw (never one of SGLang's)."""

from types import SimpleNamespace

import pytest
import torch
from support.fake_cuda import (
    EXACT,
    FakeOps,
    direct_relay,
)

from spec_fused import log
from spec_fused import relay as relay_mod
from spec_fused.integration import sglang_patch
from spec_fused.tools.traces import TraceConfig, decode_batch, make_future_map

CFG = TraceConfig(pool=16, max_len=32)


# ----------------------------------------------------------------------------- resolve and publish


@pytest.fixture
def fake(monkeypatch):
    """A patched FutureMap whose relay makes its CUDA calls through a FakeOps, with its
    launches marked in the log (which stream was current)."""
    ops = FakeOps()
    monkeypatch.setattr(relay_mod, "ops_for", lambda device: ops)
    log.reset()
    sglang_patch.apply()
    fm = make_future_map("EAGLE", CFG, needs_cpu_seq_lens=True)
    with ops.on(ops.forward):
        fm.publish(torch.tensor([1, 2]), torch.tensor([10, 20]))
    relay = relay_mod.relay_for(fm)
    launcher = relay.launcher
    launch, upload, down = launcher.launch, launcher.upload_host_indices, launcher.row_to_host

    def logged(gi, pi, pv, row):
        ops.log.append((ops.current.name, "launch", "row" if row else "device"))
        return launch(gi, pi, pv, row)

    def logged_upload(staged):
        ops.log.append((ops.current.name, "copy", "host indices up"))
        return upload(staged)

    def logged_down(row):
        ops.log.append((ops.current.name, "copy", "row down"))
        return down(row)

    # looked up by the relay at every step
    launcher.launch, launcher.upload_host_indices = logged, logged_upload
    launcher.row_to_host = logged_down
    ops.log.clear()
    yield SimpleNamespace(
        ops=ops, fm=fm, relay=relay, ready=fm.publish_ready.name, done=relay.done_event.name
    )
    sglang_patch.remove()


def test_exact_lengths_wait_for_the_publish_only_and_the_host_for_that_stream(fake):
    """Host indices up, the one launch, its row down: all on the private stream, the
    launch gated on ``publish_ready`` alone; the host waits for that stream's event, and
    no stream waits on the device (everything was done when the host returned).

    The upload is enqueued before the wait, so it is done by the publish point instead of
    trailing it: it reads only the pinned staging the host just wrote (rewritten by the
    next step's host, after this step's wait) and writes the device upload buffer, which
    only this launch reads, behind it on the same stream. Nothing the forward writes."""
    ops, fm = fake.ops, fake.fm
    batch = decode_batch([1, 2], CFG)
    fm.resolve_seq_lens_cpu(batch)  # on the schedule stream
    relay = fake.relay.relay_stream.name
    assert ops.log == [
        (relay, "copy", "host indices up"),  # depends on nothing the forward writes
        (relay, "wait_event", fake.ready),  # the launch gated on publish_ready, nothing else
        (relay, "launch", "row"),  # the one launch, on the private stream
        (relay, "copy", "row down"),
        (relay, "record", fake.done),
        ("host", "synchronize", fake.done),  # the host waits for this stream only
        ("schedule", "record_stream"),  # the lengths, made on the private stream
    ]
    assert batch.seq_lens.tolist() == [10, 20]
    assert batch.seq_lens_cpu.tolist() == [10, 20] and batch.seq_lens_sum == 30


def test_without_host_indices_the_step_is_sglangs_never_behind_the_schedule(fake):
    """Gathering through the device ``future_indices`` would order the private stream
    behind the schedule stream (a filtered batch makes them there), which sits behind the
    WAR barrier: the host would wait for the forward's reads where upstream waits for
    ``publish_ready`` only. So the pending publish lands, gated on ``publish_ready``, and
    SGLang's own resolve runs the step."""
    ops = fake.ops
    batch = decode_batch([1, 2], CFG)
    batch.req_pool_indices_cpu = None
    fake.fm.resolve_seq_lens_cpu(batch)
    relay = fake.relay.relay_stream.name
    assert ops.log == [
        (relay, "wait_event", fake.ready),
        (relay, "record_stream"),
        (relay, "record_stream"),
        (relay, "launch", "device"),  # the pending publish lands ...
        (relay, "record", fake.ready),  # ... and publish_ready follows it
        ("schedule", "wait_event", fake.ready),  # the caller's stream, on the device
        ("schedule", "wait_event", fake.ready),  # SGLang's resolve: its own wait
    ]
    assert not [e for e in ops.log if e[1] == "wait_stream"]
    assert batch.seq_lens.tolist() == [10, 20] and batch.seq_lens_cpu.tolist() == [10, 20]
    assert fake.relay.pending is None and fake.fm.__dict__[relay_mod.RELAY_ATTR] is fake.relay


def test_gpu_only_lengths_wait_on_the_device_and_launch_on_the_callers_stream(fake):
    fake.fm.needs_cpu_seq_lens = False
    batch = decode_batch([1, 2], CFG)
    fake.fm.resolve_seq_lens_cpu(batch)
    assert fake.ops.log == [
        ("schedule", "wait_event", fake.ready),
        ("schedule", "launch", "device"),
    ]
    assert batch.seq_lens_cpu is None and batch.seq_lens_sum is None


def test_a_mixed_chunk_landing_runs_on_the_private_stream_gated_on_the_publish(fake):
    """A mixed batch (``spec_info=None``) lands the pending publish: on the private stream,
    behind ``publish_ready`` only, which is re-recorded there - not on the schedule stream,
    which sits behind the WAR barrier, so SGLang's mixed-tail resolve (which blocks the
    host on ``publish_ready``) waits for the publish point, not for the forward."""
    ops, fm = fake.ops, fake.fm
    fm.resolve_seq_lens_cpu(SimpleNamespace(spec_info=None))
    relay = fake.relay.relay_stream.name
    assert ops.log == [
        (relay, "wait_event", fake.ready),
        (relay, "record_stream"),
        (relay, "record_stream"),  # the publish's tensors
        (relay, "launch", "device"),  # publish-only
        (relay, "record", fake.ready),  # re-recorded after it
        ("schedule", "wait_event", fake.ready),  # on the device only
    ]
    assert not [e for e in ops.log if e[0] == "schedule" and e[1] in ("launch", "record")]
    assert fm.__dict__["new_seq_lens_buf"][1:3].tolist() == [10, 20]


def test_a_second_publish_orders_the_forward_behind_the_landed_first(fake):
    ops, fm = fake.ops, fake.fm
    with ops.on(ops.forward):
        fm.publish(torch.tensor([2, 3]), torch.tensor([21, 30]))
    relay = fake.relay.relay_stream.name
    assert ops.log == [
        (relay, "wait_event", fake.ready),
        (relay, "record_stream"),
        (relay, "record_stream"),
        (relay, "launch", "device"),  # the first publish lands ...
        (relay, "record", fake.ready),
        ("forward", "wait_event", fake.ready),  # ... before the forward goes on
        ("forward", "record", fake.ready),  # and the second publish is recorded
    ]
    batch = decode_batch([1, 2, 3], CFG)
    fm.resolve_seq_lens_cpu(batch)
    assert batch.seq_lens.tolist() == [10, 21, 30]


# ----------------------------------------------------------------------------- landing


def test_a_landing_whose_future_map_is_gone_orders_behind_the_callers_stream():
    import gc

    relay, fm, ops = direct_relay(EXACT)
    relay.pending = (torch.tensor([1]), torch.tensor([10]))
    buf = fm.new_seq_lens_buf
    del fm
    gc.collect()
    ops.log.clear()
    relay.land_pending()
    assert ops.log[0] == ("relay3", "wait_stream", "schedule")
    assert relay.pending is None and buf[1] == 10


def test_a_landed_publish_records_a_fresh_publish_ready_when_it_was_cleared():
    relay, fm, ops = direct_relay(EXACT)
    with ops.on(ops.forward):
        relay.publish(fm, torch.tensor([1]), torch.tensor([10]))
    fm.publish_ready = None
    relay.land_pending()
    assert fm.publish_ready is not None
    assert ("relay3", "record", fm.publish_ready.name) in ops.log


def test_fencing_keeps_the_pending_publishs_tensors_alive_on_the_callers_stream():
    relay, fm, ops = direct_relay(EXACT)
    with ops.on(ops.forward):
        relay.publish(fm, torch.tensor([1]), torch.tensor([10]))
    ops.log.clear()
    relay.fence_current_stream(*relay.pending)
    assert ops.log == [
        ("schedule", "wait_event", fm.publish_ready.name),
        ("schedule", "record_stream"),
        ("schedule", "record_stream"),
    ]


# ----------------------------------------------------------------------------- graph capture


def test_a_publish_under_graph_capture_is_sglangs_own(fake):
    """SGLang (<= 0.5.23) never publishes under capture; were one to, a deferred write
    would be made once, at capture, never at replay: SGLang's own publish runs it, as
    shipped, and the relay stays."""
    ops, fm, relay = fake.ops, fake.fm, fake.relay
    fm.resolve_seq_lens_cpu(SimpleNamespace(spec_info=None))  # lands what was pending
    ops.log.clear()
    ops.capturing_now = True
    with ops.on(ops.forward):
        fm.publish(torch.tensor([4]), torch.tensor([40]))
    assert relay.pending is None and fm.__dict__[relay_mod.RELAY_ATTR] is relay
    assert ops.log == [("forward", "record", fake.ready)]  # SGLang's scatter, its record
    assert fm.__dict__["new_seq_lens_buf"][4] == 40


def test_a_publish_pending_when_capture_begins_lands_outside_it(fake):
    """The pending publish lands on the private stream, and the capturing stream never
    waits on an event recorded outside the capture."""
    ops, fm, relay = fake.ops, fake.fm, fake.relay
    ops.capturing_now = True
    with ops.on(ops.forward):
        fm.publish(torch.tensor([4]), torch.tensor([40]))
    relay_name = relay.relay_stream.name
    assert ops.log == [
        (relay_name, "wait_event", fake.ready),
        (relay_name, "record_stream"),
        (relay_name, "record_stream"),
        (relay_name, "launch", "device"),  # the pending publish, outside the capture
        (relay_name, "record", fake.ready),
        ("forward", "record", fake.ready),  # SGLang's own publish, in the capture
    ]
    assert fm.__dict__["new_seq_lens_buf"][[1, 2, 4]].tolist() == [10, 20, 40]


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


def test_landing_with_plain_torch_fences_before_it_forgets_the_publish(fake):
    """``land_with_torch`` (a hand-back's last landing) orders the caller's stream after
    ``publish_ready`` and keeps the pending publish's forward-stream tensors alive for it
    (``record_stream``) *before* it drops them, then writes from them on that stream."""
    ops, fm, relay = fake.ops, fake.fm, fake.relay
    pending, kept, record = relay.pending, [], ops.record_stream
    ops.record_stream = lambda tensor, stream: (kept.append(tensor), record(tensor, stream))
    relay.land_with_torch()
    assert ops.log == [
        ("schedule", "wait_event", fake.ready),
        ("schedule", "record_stream"),
        ("schedule", "record_stream"),
        ("schedule", "record", fake.ready),
    ]
    assert len(kept) == 2 and all(k is p for k, p in zip(kept, pending, strict=True))
    assert relay.pending is None and fm.__dict__["new_seq_lens_buf"][1:3].tolist() == [10, 20]


def test_a_publish_under_capture_is_handed_back_saying_so():
    relay, fm, ops = direct_relay(EXACT)
    ops.capturing_now = True
    with pytest.raises(relay_mod.HandToSGLang, match="^publish under CUDA-graph capture$"):
        relay.publish(fm, torch.tensor([4]), torch.tensor([40]))


def test_a_host_relays_publish_ready_is_its_own_devices_event(monkeypatch):
    """On a machine whose default accelerator is not the relay's device, the event other
    readers gate on is still the relay device's (the host's, for a CPU relay)."""
    real = torch.get_device_module
    accelerator = SimpleNamespace(Event=lambda: pytest.fail("the default accelerator's event"))
    monkeypatch.setattr(
        torch,
        "get_device_module",
        lambda device=None: accelerator if device is None else real(device),
    )
    relay, fm, _ = direct_relay(EXACT, ops=None)
    fm.publish_ready = None
    relay.publish(fm, torch.tensor([4]), torch.tensor([40]))
    assert isinstance(fm.publish_ready, type(real(torch.device("cpu")).Event()))
