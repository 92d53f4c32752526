"""``bench/gpu_check.sh --dry-run``: the device check proven on a CPU before a GPU is lent.

GPU time comes in short slots, so the one prepared script must not first fail on a GPU for
a reason a CPU could have shown. Its dry run runs every stage's CPU version (the selftest
--quick, the GPU tests' collection, the probe's and the loop A/B's plans with every
variant and arm checked) and writes the files a GPU run writes, marked as dry runs."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _run(*args, env=None):
    env = {k: v for k, v in (env or os.environ).items() if not k.startswith("SPEC_FUSED_")}
    return subprocess.run(
        ["bash", str(ROOT / "bench" / "gpu_check.sh"), *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env | {"PYTHON": sys.executable},
        timeout=900,
    )


def test_the_dry_run_runs_every_stage_and_writes_what_a_gpu_run_writes(tmp_path):
    done = _run(str(tmp_path), "--dry-run")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    env = (tmp_path / "env.txt").read_text()
    for stage in ("selftest", "gpu_tests", "probe", "ab_loop"):
        assert f"{stage}: rc=0 " in env, env
    assert "gpu_tests: 0 passed, 0 failed" in env  # collected, every one skipped on a CPU
    selftest = json.loads((tmp_path / "selftest.json").read_text())
    assert selftest["ok"] and "measured no GPU" in selftest["verdict"]
    probe = json.loads((tmp_path / "probe.json").read_text())
    assert probe["dry_run"] is True and probe["rows"] and all(r["ok"] for r in probe["rows"])
    ab_loop = json.loads((tmp_path / "ab_loop.json").read_text())
    assert ab_loop["dry_run"] is True and ab_loop["rows"]
    assert len(list(tmp_path.iterdir())) <= 8  # what the device tool brings back


def test_the_second_device_call_runs_the_loop_ab_alone(tmp_path):
    """Call 1 (selftest, GPU tests, probe) and call 2 (the A/B) each fit one command."""
    done = _run(str(tmp_path), "--ab-loop", "--dry-run")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    env = (tmp_path / "env.txt").read_text()
    assert "ab_loop: rc=0 " in env and "probe:" not in env and "selftest:" not in env
    assert (tmp_path / "ab_loop.json").exists() and not (tmp_path / "probe.json").exists()


def test_without_a_gpu_it_refuses_to_pass_for_a_gpu_check(tmp_path):
    done = _run(str(tmp_path), env=os.environ | {"CUDA_VISIBLE_DEVICES": ""})
    assert done.returncode == 3 and "not a GPU check" in done.stderr
