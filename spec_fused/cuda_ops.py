"""Where the relay runs on a device, and every CUDA call it makes there.

Why a module of its own: the relay's ordering - which stream waits for what, where a
launch runs, where ``publish_ready`` is recorded, when the host blocks - is its most
delicate logic and the one a CPU cannot run. With every CUDA call behind one object, a
CPU test stands in for it and records the calls in order (tests/relay/test_stream_order.py),
and tests/test_gpu.py runs the same paths on real streams. The devices the relay engages
on are decided here too: NVIDIA CUDA and CPU only.
"""

from __future__ import annotations

from typing import Optional

import torch

__all__ = ["CudaOps", "ops_for", "unsupported_device"]


def unsupported_device(device) -> Optional[str]:
    """Why the relay does not engage on ``device`` (SGLang's own path runs), or None."""
    device = torch.device(device)
    if device.type == "cpu":
        return None
    if device.type == "cuda":
        if getattr(torch.version, "hip", None):
            return (
                "ROCm (HIP): upstream takes HIP-only branches here (publish_ready."
                "synchronize(), the stream_ordered resolve) that spec_fused does not "
                "reproduce"
            )
        return None
    return f"{device.type}: spec_fused's ordering was only ever run on NVIDIA CUDA and CPU"


class CudaOps:
    """Every CUDA call the relay makes, in one place (see the module docstring)."""

    def __init__(self, device):
        self.device = torch.device(device)
        self.current_stream = lambda: torch.cuda.current_stream(self.device)
        self.capturing = torch.cuda.is_current_stream_capturing
        self.stream_ctx = torch.cuda.stream
        self.event = torch.cuda.Event

    def new_stream(self):
        """The private stream: high priority, so the short relay launch is not queued
        behind bulk work (SGLang's own scheduler streams are priority 0)."""
        return torch.cuda.Stream(self.device, priority=-1)

    def read_later(self, tensor):
        """A read of ``tensor`` to the host, to be made later in the current stream's order:
        it waits for what that stream has queued so far, not for what another runs since."""
        stream = self.current_stream()

        def read():
            with self.stream_ctx(stream):
                return tensor.to("cpu")

        return read

    @staticmethod
    def record_stream(tensor, stream) -> None:
        if tensor.device.type == "cuda":
            tensor.record_stream(stream)


def ops_for(device) -> Optional[CudaOps]:
    """The CUDA calls for a relay on ``device``; None where the device is the host."""
    return CudaOps(device) if torch.device(device).type == "cuda" else None
