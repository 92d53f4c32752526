"""Kernel microbenchmark: one relay step, the fused launch against upstream's ops, by batch
and pool size, as a pytest-benchmark suite.

Why: the conventional first look a kernel engineer takes, comparable across commits with
``--benchmark-compare``. It times one step on an otherwise idle device; what serving sees
(queued behind a forward, streams and events) is ``bench/probe.py``'s. Each step both ways:

* ``gpu_only`` (no host lengths): the relay's launch (its ``StepLauncher``, on a GPU the
  direct launch) publishing and gathering into device memory, against upstream's
  ``buf[idx] = vals.to(int64)`` and ``buf[fi]``;
* ``exact`` (host lengths): the relay's host indices staged and sent up, the launch writing
  the row ``[*lens, sum]``, that row (n + 1 values) down; against the same scatter and
  gather, then ``FutureMap.resolve_seq_lens_cpu``'s CUDA path: the whole pool copied to
  pinned memory, a synchronize, the host index and sum (here without its private stream).

Every case checks its lengths and sum against the torch reference once, before it is
timed: a wrong kernel fails the bench. On a GPU each timed call ends in
``torch.cuda.synchronize()``. On a CPU the kernel runs in the Triton interpreter: the times
are not speed (``extra_info["timing"]`` says so); counts and ratios only.

    ./run.sh bench        # writes bench/results/<device>/kernel_bench.json
"""

from __future__ import annotations

import pytest
import torch

from bench import harness  # first: TRITON_INTERPRET on CPU before Triton is imported
from spec_fused.kernels.publish_gather import publish_gather_reference
from spec_fused.kernels.step_launcher import StepLauncher

POOLS = (4096, 65536)
BATCHES = (1, 4, 16, 64, 256, 1024)
DEVICE = harness.pick_device()
ON_GPU = DEVICE.type == "cuda"
TIMING = "GPU: host wall time per step, ending in a synchronize" if ON_GPU else (
    "Triton interpreter on CPU: not a speed (counts and ratios only)")  # fmt: skip
sync = torch.cuda.synchronize if ON_GPU else (lambda: None)


def _inputs(pool: int, batch: int):
    """An int64 pool as SGLang's ``new_seq_lens_buf``; step N publishes ``vals`` at
    ``idx``, step N+1 gathers the same requests reordered (``fi``)."""
    gen = torch.Generator().manual_seed(pool * 7919 + batch)
    buf = torch.randint(1, 1 << 15, (pool,), generator=gen, dtype=torch.int64)
    idx = torch.randperm(pool, generator=gen)[:batch]
    vals = torch.randint(1, 1 << 15, (batch,), generator=gen, dtype=torch.int64)
    fi = idx[torch.randperm(batch, generator=gen)]
    return buf.to(DEVICE), idx.to(DEVICE), vals.to(DEVICE), fi.to(DEVICE), fi.clone()


def fused(buf, idx, vals, fi, fi_cpu):
    """The relay's launches for one step (``spec_fused/relay.py``): ``FusedRelay.resolve``
    (GPU-only) and ``_resolve_exact_cuda`` (exact), on the caller's stream."""
    launcher, n = StepLauncher(buf), fi.shape[0]

    def gpu_only():
        out = launcher.launch(fi, idx, vals, False)
        sync()
        return out, None, None

    def exact():
        staged = launcher.stage_host_indices(fi_cpu, fi)
        row = launcher.launch(launcher.upload_host_indices(staged), idx, vals, True)
        launcher.row_to_host(row)
        sync()
        return (row[:n], *launcher.host_lengths(n))

    return {"gpu_only": gpu_only, "exact": exact}, launcher, 8 * (n + 1)  # the row down


def upstream(buf, idx, vals, fi, fi_cpu):
    """SGLang 0.5.23's ``FutureMap.publish`` and ``resolve_seq_lens_cpu``, as ops."""
    pinned = torch.empty(buf.shape, dtype=buf.dtype, pin_memory=ON_GPU)  # SGLang's mirror

    def gpu_only():
        buf[idx] = vals.to(torch.int64)
        seq_lens = buf[fi]
        sync()
        return seq_lens, None, None

    def exact():
        buf[idx] = vals.to(torch.int64)
        seq_lens = buf[fi]
        pinned.copy_(buf, non_blocking=True)
        sync()
        seq_lens_cpu = pinned[fi_cpu]
        return seq_lens, seq_lens_cpu, int(seq_lens_cpu.sum())

    return {"gpu_only": gpu_only, "exact": exact}, None, pinned.nbytes  # the whole pool


def check(got: tuple, want, what: str) -> None:
    lens, lens_cpu, total = got
    assert torch.equal(lens.cpu(), want.seq_lens.cpu()), f"{what}: device lengths differ"
    if lens_cpu is not None:
        assert torch.equal(lens_cpu, want.seq_lens.cpu()), f"{what}: host lengths differ"
        assert total == int(want.seq_lens_sum), f"{what}: sum {total} != {want.seq_lens_sum}"


def prepared(step: str, pool: int, batch: int, variant: str):
    """The case's timed call, its launcher and its extra_info, once two steps matched the
    reference: the first compiles, the second takes the timed path (a GPU's direct launch)."""
    inputs = buf, idx, vals, fi, _ = _inputs(pool, batch)
    first = buf.clone()
    want = publish_gather_reference(first.clone(), fi, idx, vals)
    steps, launcher, d2h = (fused if variant == "fused" else upstream)(*inputs)
    for _ in range(2):
        buf.copy_(first)
        launches = launcher.launches if launcher else 0
        check(steps[step](), want, f"{variant} {step} pool {pool} batch {batch}")
    info = dict(
        step=step, pool=pool, batch=batch, variant=variant, timing=TIMING,
        device=harness.device_name(DEVICE), d2h_bytes=d2h if step == "exact" else 0,
        kernel_backend=launcher.backend if launcher else "torch",
        launches_per_step=launcher.launches - launches if launcher else None,
    )  # fmt: skip
    return steps[step], launcher, info


@pytest.mark.parametrize("variant", ["fused", "upstream"])
@pytest.mark.parametrize("batch", BATCHES, ids=lambda b: f"batch{b}")
@pytest.mark.parametrize("pool", POOLS, ids=lambda p: f"pool{p}")
@pytest.mark.parametrize("step", ["gpu_only", "exact"])
def test_relay_step(benchmark, step, pool, batch, variant):
    harness.prepare_device(DEVICE)  # one torch thread on a CPU
    timed, launcher, info = prepared(step, pool, batch, variant)
    benchmark.extra_info.update(info)
    benchmark.group = f"{step} pool={pool} batch={batch}"
    benchmark(timed)
    if launcher is not None:  # the steps that took the direct launch (a GPU's), warm-up too
        benchmark.extra_info["direct_launches"] = launcher.direct_launches
