"""The counts the README's kernel-sweep table reports, pinned on CPU.

Why: on CPU the benchmark's result *is* the counts (launches, host syncs, D2H bytes per
relay step); a counter that silently stops seeing something (the relay's host row once
went uncounted after a refactor, and the table showed 0 bytes) would publish a false
comparison. These run the sweep's own cases on the real ``FutureMap``s.
"""

import json
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
    cpu = torch.device("cpu")
    rows = {
        p: kernel_sweep.prepare(kernel_sweep.build_case(relays, cpu, 64, batch, p, seed=1), cpu)
        for p in kernel_sweep.PROVIDERS
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


def test_the_sweep_writes_pytest_benchmarks_json_with_the_counts(tmp_path):
    """``python -m bench.kernel_sweep`` runs the benchmarks through pytest-benchmark and
    keeps its JSON, each benchmark carrying its counts (no time is checked)."""
    data = kernel_sweep.main(
        ["--no-plot", "--out", str(tmp_path), "--batches", "2", "--pools", "64"]
    )
    written = json.loads((tmp_path / "kernel_sweep.json").read_text())
    assert {b["extra_info"]["provider"] for b in written["benchmarks"]} == set(
        kernel_sweep.PROVIDERS
    )
    assert written["rows"] == data["rows"] and len(data["rows"]) == len(kernel_sweep.PROVIDERS)
    for row in data["rows"]:
        assert row["host_rounds"] >= 1 and row["launches"] >= 1
