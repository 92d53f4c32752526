"""The FlashInfer lease (issue 38 item 5) proven on a CPU before a GPU is lent to it.

The lease is one device command of a few minutes, so nothing in it may fail on a GPU for a
reason a CPU could have shown: its dry run runs the check and the cell on a stand-in device;
the race - SGLang's real ``fast_prefill_plan`` and spec_fused's real guard, on a device whose
copies wait until the host synchronizes - must tear the plan without the guard and never with
it; the straddle cases, run through the mirror's fa2 kernel, must be wrong attention without
the partition check and the reference's with it, and a check that cannot tell fails the run;
and the carry's trim keeps what the scan found and nothing else."""

import contextlib
import hashlib
import io
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bench import fa2_split, flashinfer_carry, flashinfer_check
from spec_fused.integration import flashinfer_plan

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def fresh_guard(monkeypatch):
    """The guard's process-wide state, put back after the test (the race arms it)."""
    monkeypatch.setattr(flashinfer_plan, "_state", dict(flashinfer_plan._state))
    monkeypatch.setattr(flashinfer_plan, "_rings", {})


def test_a_pending_plan_copy_reads_a_later_plan_without_the_guard_and_never_with_it(fresh_guard):
    result = flashinfer_check.run_standin()
    race = result["race"]
    unguarded, guarded = race["unguarded"], race["guarded"]
    assert unguarded["window_held"] and all(unguarded["torn"][:-1])  # each reads the last plan
    assert unguarded["holds_a_later_plan"][0] and unguarded["first_output_max_diff"] > 0
    assert not any(guarded["torn"]) and guarded["first_output_max_diff"] == 0.0
    assert guarded["guard_waits"] == 1  # once, at the ring's wrap, for the first plan's copy
    assert race["shows_the_corruption"] and race["guard_holds"] and race["guard_waited_once"]
    assert result["source"]["releases"] == ["0.5.23"]  # SGLang's own, by its fingerprint


def test_the_race_fails_a_guard_that_reuses_a_pending_buffer(fresh_guard, monkeypatch):
    """A planted fault: a ring of one buffer whose wait never blocks is no guard."""
    monkeypatch.setattr(flashinfer_plan, "RING", 1)
    monkeypatch.setattr(flashinfer_plan._Ring, "take", lambda self: 0)
    assert not flashinfer_check.run_standin()["race"]["guard_holds"]


def test_every_straddle_is_wrong_attention_unguarded_and_the_reference_guarded(fresh_guard):
    """The dry run's straddle cases (``fa2_split.straddling_case`` 1 and 8) through SGLang's
    fast_prefill_plan, the guard and the mirror's kernel: the bound plan alone is a mismatch,
    told the step the guard replans once from one read of the exact lengths, bit for bit the
    exact plan; every grid cell's guarded plan is clean, and the verdict passes."""
    result = flashinfer_check.run_standin()
    assert [c["bs"] for c in result["straddles"]] == [1, 8]
    for case in result["straddles"]:
        assert case["verdict"] == {"exact": "clean", "unguarded": "mismatch", "guarded": "clean"}
        assert case["replans"] == {"exact": 0, "unguarded": 0, "guarded": 1} and case["reads"] == 1
        assert case["mirror_chunk_matches"] and case["bitwise_guarded"]
    assert all(r["verdict"] == {"exact": "clean", "guarded": "clean"} for r in result["rows"])
    v = flashinfer_check.verdict(result)
    assert flashinfer_check.passed(v) and v["cells_replanned"] >= 1


def test_a_skipped_partition_check_fails_the_check(fresh_guard, monkeypatch, tmp_path):
    """A planted break: the guard never finds a straddle. The unguarded cases still show the
    bug, the guarded ones are no longer clean nor replanned, and the lease's stage fails."""
    monkeypatch.setattr(flashinfer_plan, "_disagrees", lambda *a: False)
    v = flashinfer_check.verdict(flashinfer_check.run_standin())
    assert v["straddles_caught_unguarded"] and not v["straddles_clean_guarded"]
    assert not v["replans_counted"] and not flashinfer_check.passed(v)
    with contextlib.redirect_stdout(io.StringIO()):
        assert flashinfer_check.main(["--dry-run", "--out", str(tmp_path)]) == 1


def test_a_mirror_that_picks_another_chunk_than_the_plan_fails_the_check(fresh_guard, monkeypatch):
    """The check's mirror told another SM count than the (stand-in's) real plan used: its
    chunks differ, so the guard's arithmetic would not stand for that plan."""
    monkeypatch.setitem(fa2_split.H100, "num_sm", 66)
    v = flashinfer_check.verdict(flashinfer_check.run_standin())
    assert not v["mirror_chunk_matches"] and not flashinfer_check.passed(v)


def test_an_error_is_clean_within_bf16s_band_a_mismatch_far_above_and_unclear_between():
    judge = flashinfer_check.judge
    assert judge(0.03, 0.001) == "clean" and judge(0.05, 0.02) == "clean"  # 3 x the exact's
    assert judge(0.05, 0.001) == "unclear" and judge(0.1, 0.001) == "mismatch"
    nan = flashinfer_check.max_err(torch.tensor([math.nan, 0.0]), torch.zeros(2))
    assert nan == math.inf and judge(nan, 0.0) == "mismatch"  # a never-written partial


def test_the_trim_keeps_the_python_what_the_scan_found_and_the_prebuilt_module(tmp_path):
    full, trim = tmp_path / "full", tmp_path / "trim"
    files = ["flashinfer/__init__.py", "flashinfer/data/include/a.h", "flashinfer/data/include/b.h",
             "flashinfer/data/csrc/t.jinja", "flashinfer/fused_moe/x.json", "b12x/__init__.py",
             "flashinfer_python-0.7.2.dist-info/METADATA",
             "flashinfer_python-0.7.2.dist-info/RECORD"]  # fmt: skip
    for name in files:
        (full / name).parent.mkdir(parents=True, exist_ok=True)
        (full / name).write_text(name)
    (tmp_path / "m.so").write_bytes(b"\x7fELF")
    found = {"uri": "u", "opened": ["data/csrc/t.jinja"], "deps": ["data/include/a.h"]}
    kept = flashinfer_carry.trim_flashinfer(full, trim, found, tmp_path / "m.so")
    assert sorted(kept) == sorted([*(files[i] for i in (0, 1, 3, 5, 6)),
                                   "flashinfer/data/aot/u/u.so"])  # fmt: skip
    assert sorted(str(p.relative_to(trim)) for p in trim.rglob("*") if p.is_file()) == sorted(kept)


def test_a_carry_is_complete_only_with_every_file_of_its_manifest(tmp_path):
    def build(carry, files, so=b"\x7fELF"):
        (carry / "wheels").mkdir(parents=True)
        (carry / "wheels" / "x.whl").write_bytes(b"w")
        for name, members in (("flashinfer", files), ("sglang", ["overlap_utils"])):
            src = tmp_path / f"src-{carry.name}-{name}"
            for m in members:
                path = src / ("sglang/srt/managers/overlap_utils.py" if name == "sglang" else m)
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(so if m.endswith(".so") else b"x")
            if name == "sglang":
                other = src / "sglang/srt/layers/attention/flashinfer_backend.py"
                other.parent.mkdir(parents=True)
                other.write_bytes(b"x")
            flashinfer_carry.pack(src, carry / f"{name}.tar.xz")
        so_name = "flashinfer/data/aot/u/u.so"
        manifest = {"deps": ["data/include/a.h"], "opened": ["data/csrc/t.jinja"],
                    "so": [so_name, hashlib.sha256(b"\x7fELF").hexdigest(), 4],
                    "sizes": {"wheels/x.whl": 1}}  # fmt: skip
        (carry / "manifest.json").write_text(json.dumps(manifest))
        return flashinfer_carry.verify(carry)

    whole = [
        "flashinfer/data/include/a.h",
        "flashinfer/data/csrc/t.jinja",
        "flashinfer/data/aot/u/u.so",
    ]
    assert build(tmp_path / "ok", whole) == []
    assert build(tmp_path / "lacks", whole[1:]) == ["flashinfer/data/include/a.h"]
    assert build(tmp_path / "other-so", whole, so=b"stale")[0].startswith("flashinfer/data/aot")


def test_compile_times_read_the_last_build_of_each_object_from_ninja_log():
    log = "# ninja log v7\n0\t50000\t0\ta.cuda.o\tx\n0\t40000\t0\tb.cuda.o\tx\n"
    log += "1000\t60000\t0\ta.cuda.o\tx\n60000\t61000\t0\tm.so\tx\n"
    got = flashinfer_carry.compile_times(log)
    assert got["objects"] == 2 and got["slowest_s"] == 59.0 and got["wall_s"] == 61.0


def test_the_lease_dry_run_plans_it_and_writes_what_a_gpu_run_writes(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPEC_FUSED_")}
    done = subprocess.run(
        ["bash", str(ROOT / "bench" / "flashinfer_lease.sh"), str(tmp_path), "--dry-run"],
        capture_output=True, text=True, cwd=ROOT, timeout=600,
        env=env | {"PYTHON": sys.executable, "CARRY": str(tmp_path / "no-carry")},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    text = (tmp_path / "env.txt").read_text()
    assert "lease plan (minutes" in text and "check: rc=0 " in text and "cell: rc=0 " in text
    check = json.loads((tmp_path / "flashinfer_check.json").read_text())
    assert check["dry_run"] and check["rows"] and len(check["straddles"]) == 2
    assert all(check["verdict"][k] for k in flashinfer_check.REQUIRED)
    assert check["thresholds"]["mismatch"] > 3 * check["thresholds"]["clean_floor"]
    cell = json.loads((tmp_path / "flashinfer_cell.json").read_text())
    assert [r["concurrency"] for r in cell["rows"]] == [1, 8]
    for row in cell["rows"]:
        waits, sites = row["host_waits_per_step_outside_straddles"], row["host_wait_sites"]
        assert (waits["A"], waits["B"]) == (2, 1)  # the FutureMap's host wait, SGLang's only
        resolve = [s for s in sites["A"] if "overlap_utils" in s]
        assert resolve and not [s for s in sites["B"] if "overlap_utils" in s]
        assert row["guard"]["plans"] > 0 and row["guard"]["waits"] == 0
    assert any(row["straddle_steps"]["B"] for row in cell["rows"])  # the guard replanned
    assert len(list(tmp_path.iterdir())) <= 8  # what the device tool brings back
