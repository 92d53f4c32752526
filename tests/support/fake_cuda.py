"""CUDA on a CPU: streams and events that log what the relay asks of them.

Every CUDA call the relay makes goes through one object (``cuda_ops.CudaOps``); ``FakeOps``
stands in for it and records the calls in order - ``(stream, what, on what)`` - while the
launches themselves run on CPU tensors (Triton interpreter), so the lengths are checked
too. ``direct_relay`` builds a ``FusedRelay`` on an unpatched FutureMap, driven directly."""

import torch

from spec_fused import relay as relay_mod
from spec_fused.caps import SpecCaps
from spec_fused.tools.traces import TraceConfig, make_future_map

CFG = TraceConfig(pool=16, max_len=32)
EXACT = SpecCaps(True, "exact", "test")  # a WAR-guarded relay with exact host lengths


class FakeStream:
    def __init__(self, name, log, handle):
        self.name, self.log, self.cuda_stream = name, log, handle

    def wait_event(self, event):
        self.log.append((self.name, "wait_event", event.name))

    def wait_stream(self, stream):
        self.log.append((self.name, "wait_stream", stream.name))

    def synchronize(self):
        self.log.append(("host", "synchronize", self.name))


class FakeEvent:
    def __init__(self, name, ops):
        self.name, self.ops = name, ops

    def record(self, stream=None):
        stream = stream or self.ops.current
        self.ops.log.append((stream.name, "record", self.name))

    def wait(self, stream=None):
        (stream or self.ops.current).wait_event(self)

    def synchronize(self):
        self.ops.log.append(("host", "synchronize", self.name))

    def query(self):
        return True


class FakeOps:
    """``cuda_ops.CudaOps`` with streams that log: schedule (current), forward, relay.

    Its stream contexts can be entered again (as ``torch.cuda.stream``'s can: the relay
    binds its private stream's context once)."""

    def __init__(self, relay_handles=(3,)):
        self.log = []
        self.schedule = FakeStream("schedule", self.log, 1)
        self.forward = FakeStream("forward", self.log, 2)
        self.current = self.schedule
        self.capturing_now = False
        self._handles = list(relay_handles)
        self._events = 0

    def current_stream(self):
        return self.current

    def capturing(self):
        return self.capturing_now

    def stream_ctx(self, stream):
        ops = self

        class Ctx:
            def __enter__(self):
                self.saved, ops.current = ops.current, stream

            def __exit__(self, *exc):
                ops.current = self.saved

        return Ctx()

    def on(self, stream):
        return self.stream_ctx(stream)

    def event(self):
        self._events += 1
        return FakeEvent(f"event{self._events}", self)

    def new_stream(self):
        handle = self._handles.pop(0)
        return FakeStream(f"relay{handle}", self.log, handle)

    def record_stream(self, tensor, stream):
        self.log.append((stream.name, "record_stream"))

    def read_later(self, tensor):
        stream = self.current

        def read():
            self.log.append(("host", "reads back after", stream.name))
            return tensor.clone()

        return read


def direct_relay(caps, *, ops="fake", debug=False, fm=None, algo="EAGLE", needs_cpu=True):
    """A FusedRelay on an unpatched FutureMap, driven directly: ``(relay, fm, ops)``
    (``ops="fake"``: a fresh FakeOps; ``None``: the relay's host path)."""
    fm = fm if fm is not None else make_future_map(algo, CFG, needs_cpu_seq_lens=needs_cpu)
    ops = FakeOps() if ops == "fake" else ops
    return relay_mod.FusedRelay(fm, caps, debug=debug, ops=ops), fm, ops


def messages(caplog):
    """The spec_fused logger's lines, in order."""
    return [r.getMessage() for r in caplog.records if r.name == "spec_fused"]


def warm_publish_launch(relay, fm, ops, values_dtype=torch.int64) -> None:
    """Launch the publish-only combination once, eagerly, as a landing does before a capture
    (nothing may compile inside one)."""
    with ops.on(ops.forward):
        relay.publish(fm, torch.tensor([9]), torch.tensor([90], dtype=values_dtype))
    relay.land_pending()
    ops.log.clear()
