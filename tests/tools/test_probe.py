"""The GPU probe's plan and its variants, proven on CPU.

Why: ``bench/probe.py`` times only on a lent GPU, where no time is left to find a bug. Its
dry run is held here to what issues 34 and 37 ask of it: every variant x mode x cell
planned (pool 1,024 in, each batch below its pool), null figures, a device-time estimate
within the 75 s budget, printed as the plan (not a table of empty rows), and every
variant's lengths and sum checked against the published ones on CPU tensors (the kernel
in the Triton interpreter), so a wrong variant fails the dry run; a relay that hands steps
back to SGLang fails it too. On CPU without ``--dry-run`` it refuses. Nothing here times
anything.
"""

import itertools
import json
import os
import sys

import torch
from support.hand_back import plant_hand_backs

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from bench import probe  # noqa: E402
from spec_fused.tools import timing  # noqa: E402

FIGURES = ("host_us", "device_us", "late", "host_us_median", "device_us_median", "host_x",
           "device_x", "late_steps")  # fmt: skip


def test_the_dry_run_plans_every_cell_and_checks_every_variant(tmp_path, capsys):
    assert probe.main(["--dry-run", "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "probe.json").read_text())
    assert data["dry_run"] is True and data["gpu"] == {"before": None, "after": None}
    assert data["versions"]["torch"] == torch.__version__
    planned = {(v["variant"], v["needs_cpu_seq_lens"]) for v in data["plan"]["variants"]}
    assert planned == set(probe.VARIANTS) and len(planned) == 16
    assert {v for v, _ in planned} >= {"upstream", "spec_fused", *probe.HAND, *probe.FLOORS}
    assert (1024, 1) in probe.CELLS and all(b < p for p, b in probe.CELLS)
    grid = itertools.product(planned, timing.MODES, probe.CELLS)
    want = sorted((v, n, m, p, b) for (v, n), m, (p, b) in grid)
    keys = [(r["variant"], r["needs_cpu_seq_lens"], r["mode"], r["pool"], r["batch"])
            for r in data["rows"]]  # fmt: skip
    assert sorted(keys) == want and len(keys) == data["plan"]["rows"] == 16 * 2 * 9
    assert all(r[f] is None for r in data["rows"] for f in FIGURES)
    assert all(r["ok"] and r["error"] is None for r in data["rows"])
    # relayed: what spec_fused does by default on a GPU (exact host lengths handed over)
    relayed = {r["needs_cpu_seq_lens"]: r["relayed"] for r in data["rows"]
               if r["variant"] == "spec_fused"}  # fmt: skip
    assert relayed == {0: True, 1: False}
    # the one cell the dry run drives through the runner: the relay resolved every step
    first = [r for r in data["rows"] if (r["pool"], r["batch"], r["mode"]) == (1024, 1, "idle")]
    assert {r["variant"]: r["engaged"] for r in first if r["engaged"] is not None} == {
        "spec_fused": True
    }
    plan = data["plan"]
    assert 0 < plan["estimated_device_s"] <= data["config"]["budget_s"] == 75
    assert plan["estimated_device_min"] == round(plan["estimated_device_s"] / 60, 1)
    assert plan["rounds"] % 2 == 0 and plan["rounds"] >= 4
    # printed: the plan, not 288 rows of dashes
    out = capsys.readouterr().out
    assert "plan: 9 cells x 2 modes x 16 variants = 288 rows" in out
    assert f"({plan['estimated_device_min']} min) of device time" in out
    assert len(out.splitlines()) < 30 and "host_us_median" not in out


def test_a_relay_that_hands_steps_back_fails_the_dry_run(tmp_path, monkeypatch, capsys):
    """Every other step handed back to SGLang: spec_fused's rows read "not engaged", with
    no ratio, and the exit status is 1."""
    handed = plant_hand_backs(monkeypatch)
    argv = ["--dry-run", "--out", str(tmp_path), "--pools", "64", "--batches", "4"]
    assert probe.main(argv) == 1
    rows = json.loads((tmp_path / "probe.json").read_text())["rows"]
    off = [r for r in rows if r["engaged"] is False]
    assert handed and {(r["variant"], r["mode"]) for r in off} == {("spec_fused", "idle")}
    assert all(r["host_x"] is None and r["device_x"] is None for r in off)
    assert all(r["ok"] for r in rows)  # every check passed: only the timing says it
    assert "NOT ENGAGED" in capsys.readouterr().err


def test_a_wrong_variant_fails_the_dry_run(tmp_path, monkeypatch, capsys):
    """A hand launch that gathers the batch in the wrong order: its rows fail, the others
    pass, and the exit status says so."""
    right = probe.launch_triton

    def wrong(a):
        return right(a._replace(gather_indices=a.gather_indices.flip(0).contiguous()))

    monkeypatch.setattr(probe, "launch_triton", wrong)
    argv = ["--dry-run", "--out", str(tmp_path), "--pools", "64", "--batches", "4"]
    assert probe.main(argv) == 1
    rows = json.loads((tmp_path / "probe.json").read_text())["rows"]
    failed = {r["variant"] for r in rows if not r["ok"]}
    assert failed == set(probe.HAND)
    assert all("other lengths" in r["error"] for r in rows if not r["ok"])
    assert "FAILED checks" in capsys.readouterr().err


def test_it_refuses_a_cpu_without_dry_run(tmp_path, capsys):
    assert not torch.cuda.is_available()
    assert probe.main(["--out", str(tmp_path)]) == 2
    assert "--dry-run" in capsys.readouterr().err
    assert not (tmp_path / "probe.json").exists()
