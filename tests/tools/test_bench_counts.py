"""The counts the README's kernel-sweep table reports, pinned on CPU.

Why: on CPU the benchmark's result *is* the counts (launches, host syncs, D2H bytes per
relay step); a counter that silently stops seeing something (the relay's host row once
went uncounted after a refactor, and the table showed 0 bytes) would publish a false
comparison. These run the sweep's own cases on the real ``FutureMap``s.
"""

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from bench import kernel_sweep  # noqa: E402


@pytest.fixture(scope="module")
def relays():
    from bench import measure

    try:
        yield kernel_sweep.Relays.build(torch.device("cpu"), 64)
    finally:
        measure.set_patched(False)


@pytest.mark.parametrize("batch", [1, 5, 64])
def test_counts_per_provider(relays, batch):
    cfg = kernel_sweep.Settings(
        host_reps=1, host_warmup=0, count_reps=2, bench_warmup_ms=0, bench_rep_ms=0
    )
    rows = {
        c.provider: kernel_sweep.measure_case(c, torch.device("cpu"), 64, batch, cfg, "interpreter")
        for c in kernel_sweep.build_cases(relays, torch.device("cpu"), 64, batch, seed=1)
    }
    up, exact, free = rows["upstream"], rows["fused-exact"], rows["fused-barrier-free"]
    # upstream: scatter, gather, the .cpu() copy; one blocking read; the batch's lengths
    assert (up["launches"], up["host_syncs"], up["d2h_bytes"]) == (3, 1, 8 * batch)
    # war_guarded: one launch, no host sync; the host row (lengths, sum, stamp) on CUDA
    assert (exact["launches"], exact["host_syncs"]) == (1, 0)
    assert exact["d2h_bytes"] == 8 * (batch + 2)
    assert exact["relay_reported_launches"] == 1
    # barrier_free: one launch and nothing back to the host
    assert (free["launches"], free["host_syncs"], free["d2h_bytes"]) == (1, 0, 0)
    assert rows["floor"]["launches"] == 1
