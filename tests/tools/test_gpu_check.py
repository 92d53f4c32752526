"""``bench/gpu_check.sh --dry-run``: the device check proven on a CPU before a GPU is lent.

GPU time comes in short slots (15 device minutes, starts included), so the one prepared
script must not first fail on a GPU for a reason a CPU could have shown, and its two calls
must fit the lease with room for a rerun. Its dry run prints the lease plan, runs every
stage's CPU version (the selftest --quick, the GPU tests collected and skipped, the probe's
and the loop A/B's plans with every variant and arm checked) and writes the files a GPU run
writes, marked as dry runs; its preflight stops a run that lacks its wheels in seconds."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench import carry

ROOT = Path(__file__).resolve().parents[2]
# what the runs below must not inherit: the package's switches, the script's own knobs
KNOBS = ("SPEC_FUSED_", "GPU_CHECK_", "PREFLIGHT_", "SELFTEST_", "TESTS_", "PROBE_", "AB_LOOP_")


def _run(*args, **env):
    """The script with ``env`` set over this environment, less the knobs above."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(KNOBS)}
    return subprocess.run(
        ["bash", str(ROOT / "bench" / "gpu_check.sh"), *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=base | env | {"PYTHON": sys.executable},
        timeout=900,
    )


@pytest.fixture(scope="module")
def call_1(tmp_path_factory):
    out = tmp_path_factory.mktemp("call_1")
    return out, _run(str(out), "--check", "--dry-run")


def test_call_1_runs_every_stage_and_writes_what_a_gpu_run_writes(call_1):
    out, done = call_1
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    env = (out / "env.txt").read_text()
    for stage in ("preflight", "selftest", "gpu_tests", "probe", "kernel_bench"):
        assert f"{stage}: rc=0 " in env, env
    assert "ab_loop:" not in env  # call 2's
    selftest = json.loads((out / "selftest.json").read_text())
    assert selftest["ok"] and "measured no GPU" in selftest["verdict"]
    probe = json.loads((out / "probe.json").read_text())
    assert probe["dry_run"] is True and probe["rows"] and all(r["ok"] for r in probe["rows"])


def test_each_gpu_test_outcome_is_on_disk_as_it_ends(call_1):
    """pytest -v into gpu_tests.txt, unbuffered: a run killed mid-way keeps every outcome
    before it, and the counts are read from those lines (collected, every one skipped on a
    CPU)."""
    out, _ = call_1
    log = (out / "gpu_tests.txt").read_text()
    skipped = [line for line in log.splitlines() if line.startswith("tests/test_gpu.py::")]
    assert skipped and all(" SKIPPED" in line for line in skipped), log[-2000:]
    n = len(skipped)
    assert (
        f"gpu_tests: 0 passed, 0 failed, {n} skipped of {n}; 0 not run"
        in (out / "env.txt").read_text()
    )


def test_the_plan_prints_each_calls_minutes_and_leaves_four_for_a_rerun(call_1):
    out, done = call_1
    plan = done.stdout.split("carry:")[0]
    assert (
        plan.startswith("== lease plan: 15 device minutes")
        and plan in (out / "env.txt").read_text()
    )
    assert (
        "--check: preflight 20 + selftest 65 + gpu_tests 95 + probe 90 + kernel_bench 30 "
        "= 300 s: 5.0 min; 7 of 8 files"
    ) in plan
    assert "--ab-loop" in plan and "preflight 20 + ab_loop 220 = 240 s: 4.0 min; 4 of 8" in plan
    assert "a fresh machine (1.5-2 min): 2.0 min" in plan
    assert "total    11.0 min of 15; 4.0 min left, for one rerun:" in plan
    assert "call 2 again while the machine is warm: 4.0 min" in plan
    assert "this run (--check): " in plan
    lease = [line for line in plan.splitlines() if "this run" not in line]
    assert "\n".join(lease) in (ROOT / "bench" / "README.md").read_text()  # as printed


def test_a_plan_over_the_lease_is_refused_before_anything_runs(tmp_path):
    done = _run(str(tmp_path / "out"), "--check", "--dry-run", SELFTEST_TIMEOUT="200")
    assert done.returncode == 2
    assert "call 1's stage limits sum to 435 s, over 300 s" in done.stderr
    assert "under the 4.0 min a rerun needs" in done.stderr
    assert not (tmp_path / "out").exists()


def test_each_call_writes_no_more_than_the_device_tool_brings_back(call_1, tmp_path):
    """8 files a call: the plan names each one a call writes (on a GPU call 1 adds the PNG
    and the microbenchmark's JSON), and the run fails on any it does not name."""
    out, _ = call_1
    call_2 = _run(str(tmp_path), "--ab-loop", "--dry-run")
    assert call_2.returncode == 0, call_2.stdout[-3000:] + call_2.stderr[-3000:]
    env = (tmp_path / "env.txt").read_text()
    assert "preflight: rc=0 " in env and "ab_loop: rc=0 " in env and "selftest:" not in env
    assert json.loads((tmp_path / "ab_loop.json").read_text())["dry_run"] is True
    gpu_1 = {"env.txt", "bench.log", "gpu_tests.txt", "selftest.json", "probe.json"}
    gpu_1 |= {"probe.png", "kernel_bench.json"}
    gpu_2 = {"env.txt", "bench.log", "ab_loop.json", "ab_loop.png"}
    for folder, on_a_gpu in ((out, gpu_1), (tmp_path, gpu_2)):
        written = {p.name for p in folder.iterdir()}
        assert written <= on_a_gpu and len(on_a_gpu) <= 8, written


def test_one_stage_reruns_alone_after_its_preflight(tmp_path):
    done = _run(str(tmp_path), "--stage", "gpu_tests", "--dry-run")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "this run (--stage gpu_tests): preflight 20 + gpu_tests 95 = 115 s" in done.stdout
    env = (tmp_path / "env.txt").read_text()
    assert "preflight: rc=0 " in env and "gpu_tests: rc=0 " in env
    assert "selftest:" not in env and "probe:" not in env
    unknown = _run(str(tmp_path), "--stage", "preflight", "--dry-run")
    assert unknown.returncode == 2 and "--stage takes one of: selftest" in unknown.stderr


def test_a_file_the_plan_does_not_name_fails_the_run(tmp_path):
    """Each file a call writes is named in the plan, where its count is checked: one it
    does not name (here left over) could push a call past what comes back."""
    (tmp_path / "stray.txt").write_text("left over")
    done = _run(str(tmp_path), "--stage", "kernel_bench", "--dry-run")
    assert done.returncode == 1
    assert "gpu_check: files the plan does not name: stray.txt" in done.stderr


def _wheels(folder: Path, *names: str) -> Path:
    folder.mkdir()
    for name in names:  # not a zip: pip refuses it
        (folder / name).write_text("not a wheel")
    return folder


@pytest.mark.parametrize(
    "wheels, says",
    [
        ((), "no wheels in"),
        (("pytest_timeout-2.4.0-py3-none-any.whl",), "holds no wheel of sglang"),
        (
            ("sglang-0.5.23-py3-none-any.whl", "pytest_timeout-2.4.0-py3-none-any.whl"),
            "pip could not install the wheels in",
        ),
    ],
    ids=["none", "no-sglang", "broken"],
)
def test_missing_wheels_stop_the_run_in_seconds_with_one_line(tmp_path, wheels, says):
    """GPU_CHECK_WHEELS makes the dry run's preflight a GPU run's: wheels required and
    installed (into a temporary folder). What is missing stops it before any stage."""
    folder = _wheels(tmp_path / "whl", *wheels)
    out = tmp_path / "out"
    done = _run(str(out), "--check", "--dry-run", GPU_CHECK_WHEELS=str(folder))
    assert done.returncode == 4, done.stdout[-2000:] + done.stderr[-2000:]
    (line,) = done.stderr.splitlines()
    assert line.startswith("gpu_check: preflight: ") and says in line, line
    env = (out / "env.txt").read_text()
    assert "preflight: FAILED: " in env and "rc=" not in env  # no stage ran
    assert {p.name for p in out.iterdir()} == {"env.txt", "bench.log"}


def test_a_module_that_does_not_import_after_the_install_stops_the_run(tmp_path):
    """As a broken install would: pytest_timeout shadowed by one that raises."""
    shadow = tmp_path / "shadow"
    shadow.mkdir()
    (shadow / "pytest_timeout.py").write_text("raise ImportError('planted: a broken install')\n")
    out = tmp_path / "out"
    done = _run(str(out), "--check", "--dry-run", PYTHONPATH=str(shadow))
    assert done.returncode == 4, done.stdout[-2000:] + done.stderr[-2000:]
    assert done.stderr.splitlines() == [
        "gpu_check: preflight: pytest_timeout does not import "
        "(ImportError: planted: a broken install)"
    ]
    assert "selftest:" not in (out / "env.txt").read_text()


def test_without_a_gpu_it_refuses_to_pass_for_a_gpu_check(tmp_path):
    done = _run(str(tmp_path), CUDA_VISIBLE_DEVICES="")
    assert done.returncode == 3 and "not a GPU check" in done.stderr
    assert "== lease plan" in done.stdout  # printed first, by every run


# ----------------------------------------------------------------------- the carry


def _tree(root: Path) -> Path:
    """A git working tree: one tracked file, one untracked, one ignored."""
    root.mkdir()
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    (root / ".gitignore").write_text("/.whl/\n/ignored\n")
    (root / "tracked").write_bytes(b"x" * 1000)
    subprocess.run(["git", "-C", str(root), "add", "tracked", ".gitignore"], check=True)
    (root / "untracked").write_bytes(b"x" * 500)
    (root / "ignored").write_bytes(b"x" * 10_000)
    return root


def test_the_carry_counts_what_travels_and_fails_above_its_limit(tmp_path, capsys):
    root = _tree(tmp_path / "tree")
    wheels = root / ".whl"
    wheels.mkdir()
    with open(wheels / "big-1.0-py3-none-any.whl", "wb") as f:
        f.truncate(61 * carry.MIB)  # sparse: 61 MiB to stat, nothing on disk
    tree = 1000 + 500 + len((root / ".gitignore").read_bytes())
    assert carry.tree_bytes(root) == tree  # the ignored file stays behind
    assert carry.main(["--root", str(root)]) == 1
    printed = capsys.readouterr()
    assert "carry: 61.0 MiB = the tree 0.0 MiB + .whl/ 61.0 MiB" in printed.out
    assert "over 60 MiB" in printed.err
    assert carry.main(["--root", str(root), "--limit-mib", "62"]) == 0


def test_a_dry_run_with_a_carry_over_60_mib_fails_before_its_preflight(tmp_path):
    wheels = tmp_path / "whl"
    wheels.mkdir()
    with open(wheels / "sglang-0.5.23-py3-none-any.whl", "wb") as f:
        f.truncate(61 * carry.MIB)
    out = tmp_path / "out"
    done = _run(str(out), "--check", "--dry-run", GPU_CHECK_WHEELS=str(wheels))
    assert done.returncode == 2 and "the carry does not fit the lease" in done.stderr
    assert "preflight:" not in (out / "env.txt").read_text()


# ----------------------------------------------------------------------- the GPU tests' limits


_LIMITS_PLUGIN = """
import inspect, json

def pytest_collection_finish(session):
    for item in session.items:
        mark = item.get_closest_marker("timeout")
        child = "_child(" in inspect.getsource(item.function)
        print("LIMIT", json.dumps([item.name, mark.args, mark.kwargs, child,
                                   item.module.CHILD_TIMEOUT_S]))
"""


def test_every_gpu_test_has_a_thread_limit_of_its_own_and_the_fault_children_run_last(tmp_path):
    """pytest-timeout by its thread method (a hung CUDA call never returns to Python for
    SIGALRM's handler), each limit inside the stage's; the children that fault get theirs
    on top of their own timeout and run last, so a hung one loses no later outcome."""
    (tmp_path / "limits_plugin.py").write_text(_LIMITS_PLUGIN)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"]
        + ["-p", "limits_plugin", "tests/test_gpu.py"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=os.environ | {"PYTHONPATH": f"{tmp_path}:{ROOT}"},
        timeout=300,
    )
    seen = [json.loads(line[6:]) for line in done.stdout.splitlines() if line.startswith("LIMIT ")]
    assert seen, done.stdout[-2000:] + done.stderr[-2000:]
    for name, args, kwargs, child, child_s in seen:
        assert kwargs == {"method": "thread"} and 0 < args[0] < 95, name
        assert not child or args[0] > child_s, name
    children = [child for *_, child, _ in seen]
    assert 0 < sum(children) and children == sorted(children)  # the children last
