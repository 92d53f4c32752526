"""The kernel microbenchmark (``bench/test_kernel_bench.py``) runs, and checks before it times.

Why: the test tiers never time it (they collect ``tests/`` only, with ``--benchmark-skip``),
so a broken suite would first show at ``./run.sh bench`` or on a lent GPU. Here it runs as
pytest runs it, in a process of its own, on a tiny subset with ``--benchmark-disable``
(each case once, untimed); and a kernel that gathers in the wrong order fails its check
rather than being timed. Nothing here times anything.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench import test_kernel_bench as suite  # noqa: E402
from spec_fused.kernels import publish_gather  # noqa: E402


def test_the_suite_runs_both_steps_both_ways_on_a_tiny_subset():
    env = os.environ | {"PYTHONPATH": str(ROOT), "TRITON_INTERPRET": "1"}
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    cmd += ["bench/test_kernel_bench.py", "--benchmark-disable", "-k", "pool4096 and batch4"]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "4 passed, 44 deselected" in done.stdout, done.stdout[-3000:]


@pytest.mark.parametrize("step", ["gpu_only", "exact"])
def test_a_kernel_that_gathers_in_the_wrong_order_fails_before_it_is_timed(monkeypatch, step):
    right = publish_gather.launch_triton

    def wrong(a):
        return right(a._replace(gather_indices=a.gather_indices.flip(0).contiguous()))

    monkeypatch.setattr(publish_gather, "launch_triton", wrong)
    with pytest.raises(AssertionError, match=f"fused {step} pool 64 batch 8: device lengths"):
        suite.prepared(step, 64, 8, "fused")
    timed, _, info = suite.prepared(step, 64, 8, "upstream")  # its ops take no kernel
    assert info["variant"] == "upstream" and timed()[0].shape == (8,)
