"""A synthetic forward: bf16 GEMMs of Llama-3-8B layers, CUDA-graphed, for the benchmarks.

Why real GEMMs: what a relay step costs in serving depends on what the GPU is doing. The
draft extend fills the SMs right after the publish point, and a fused launch needs an SM
where SGLang's copy needs a copy engine; a sleep kernel (one thread) leaves them free.
One place for both users: ``tools/timing.py``'s queued mode (a verify before the publish
point, a draft after it, each calibrated to the wanted µs) and ``bench/ab_loop.py``'s
overlap loop (verify and draft by layer count); the package cannot import ``bench/``.

A chain runs one layer's GEMMs in order, on that one layer's weights (436 MB in bf16, so
every layer reads the weights from HBM as a real one does): qkv, o, gate_up with SiLU-mul,
down, and again. On CUDA each chain is warmed up on a side stream (cuBLAS set up outside
the capture), then captured once and replayed on the caller's stream; elsewhere it runs
eagerly (the CPU dry runs).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch

__all__ = ["LLAMA", "TOY", "Forward"]

LLAMA = (4096, 6144, 14336)  # hidden, qkv (32 q + 2 x 8 kv heads of 128), MLP
TOY = (64, 96, 128)  # the same structure, small: CPU dry runs


def _nothing() -> None:
    pass


class Forward:
    """One layer's weights and ``tokens`` input rows on ``device``."""

    def __init__(self, device, tokens: int, dims=LLAMA, dtype=torch.bfloat16):
        self.device, self.dims = torch.device(device), dims
        hidden, qkv, mlp = dims
        gen = torch.Generator(self.device).manual_seed(0)
        shapes = ((qkv, hidden), (hidden, hidden), (2 * mlp, hidden), (hidden, mlp))
        self.w = [self._normal(s, s[1] ** -0.5, dtype, gen) for s in shapes]
        self.x0 = self._normal((tokens, hidden), 1.0, dtype, gen)

    def _normal(self, shape, std: float, dtype, gen) -> torch.Tensor:
        return torch.empty(shape, device=self.device, dtype=dtype).normal_(0, std, generator=gen)

    def _chain(self, gemms: int) -> None:
        f, w, (hidden, _, mlp), x = torch.nn.functional, self.w, self.dims, self.x0
        for i in range(gemms):
            if i % 4 == 2:
                g = f.linear(x, w[2])
                x = f.silu(g[:, :mlp]) * g[:, mlp:]
            else:
                x = f.linear(x, w[i % 4])[:, :hidden]  # qkv: the q heads go on

    def part(self, gemms: int) -> Callable[[], None]:
        """A chain of ``gemms`` GEMMs on the current stream: a graph's replay on CUDA, else
        the eager chain. It keeps this object alive: a graph holds no reference to the
        weights and input it reads, and freed memory would be read at its next replay."""
        fn = partial(self._chain, gemms)
        if self.device.type != "cuda" or gemms <= 0:
            return fn if gemms > 0 else _nothing
        with torch.cuda.device(self.device):
            side, main = torch.cuda.Stream(), torch.cuda.current_stream()
            side.wait_stream(main)
            with torch.cuda.stream(side):
                fn()
            main.wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                fn()

        def replay(graph=graph, weights=self) -> None:
            graph.replay()

        return replay

    def time_us(self, fn: Callable[[], None], reps: int = 5) -> float:
        """µs a call of ``fn`` takes on the current stream (CUDA), after two warm-ups."""
        start, end = (torch.cuda.Event(enable_timing=True) for _ in "se")
        fn(), fn()
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) * 1e3 / reps

    def calibrated(self, *wanted_us: float) -> list:
        """``[(replay, gemms, measured µs)]``, one per wanted µs (CUDA): the chain whose
        estimate is nearest (one layer timed, shared out by weight size), then timed."""
        layer_us = self.time_us(self.part(4))
        per = [layer_us * w.numel() / sum(w.numel() for w in self.w) for w in self.w]
        out = []
        for us in wanted_us:
            k, t = 0, 0.0
            while t + per[k % 4] / 2 < us:  # the next GEMM brings the chain nearer to us
                t, k = t + per[k % 4], k + 1
            fn = self.part(max(k, 1))
            out.append((fn, max(k, 1), self.time_us(fn)))
        return out
