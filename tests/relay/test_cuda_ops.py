"""Every CUDA call the relay makes, in one object (``cuda_ops.CudaOps``): the private
stream it draws, the device it is bound to, what it records, and that a relay uses the
ops it is handed.

A CPU has no CUDA: ``torch.cuda`` itself is stood in for so ``CudaOps`` can be read."""

from types import SimpleNamespace

import pytest
import torch
from support.fake_cuda import EXACT, direct_relay

from spec_fused import cuda_ops


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


def test_the_private_stream_is_a_high_priority_stream_on_the_relays_device(monkeypatch):
    stub = _CudaStub([7])
    monkeypatch.setattr(torch.cuda, "Stream", stub.Stream)
    assert cuda_ops.CudaOps("cuda:1").new_stream().cuda_stream == 7
    assert stub.calls == [("Stream", torch.device("cuda:1"), -1)]


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


def test_the_ops_handed_in_are_the_ones_used():
    relay, fm, ops = direct_relay(EXACT)
    assert relay.ops is ops and relay.on_cuda
    assert relay.relay_stream.name == "relay3"
