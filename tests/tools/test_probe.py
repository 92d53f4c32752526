"""The GPU probe's plan and its variants, proven on CPU.

Why: ``bench/probe.py`` times only on a lent GPU, where no time is left to find a bug. Its
dry run is held here to what issue 34 asks of it: every variant x mode x pool x batch
planned, null figures, a device-time estimate within the budget, and every variant's
lengths and sum checked against the published ones on CPU tensors (the kernel in the
Triton interpreter), so a wrong variant fails the dry run. On CPU without ``--dry-run``
it refuses. Nothing here times anything.
"""

import itertools
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from bench import probe  # noqa: E402
from spec_fused.tools import timing  # noqa: E402

FIGURES = ("host_us", "device_us", "late", "host_us_median", "device_us_median", "host_x",
           "device_x", "late_steps")  # fmt: skip


def test_the_dry_run_plans_every_cell_and_checks_every_variant(tmp_path):
    assert probe.main(["--dry-run", "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "probe.json").read_text())
    assert data["dry_run"] is True and data["gpu"] == {"before": None, "after": None}
    assert data["versions"]["torch"] == torch.__version__
    planned = {(v["variant"], v["needs_cpu_seq_lens"]) for v in data["plan"]["variants"]}
    assert planned == set(probe.VARIANTS) and len(planned) == 16
    assert {v for v, _ in planned} >= {"upstream", "spec_fused", *probe.HAND, *probe.FLOORS}
    grid = itertools.product(planned, timing.MODES, probe.POOLS, probe.BATCHES)
    want = sorted((v, n, m, p, b) for (v, n), m, p, b in grid)
    keys = [(r["variant"], r["needs_cpu_seq_lens"], r["mode"], r["pool"], r["batch"])
            for r in data["rows"]]  # fmt: skip
    assert sorted(keys) == want and len(keys) == data["plan"]["rows"] == 256
    assert all(r[f] is None for r in data["rows"] for f in FIGURES)
    assert all(r["ok"] and r["error"] is None for r in data["rows"])
    # relayed: what spec_fused does by default on a GPU (exact host lengths handed over)
    relayed = {r["needs_cpu_seq_lens"]: r["relayed"] for r in data["rows"]
               if r["variant"] == "spec_fused"}  # fmt: skip
    assert relayed == {0: True, 1: False}
    assert 0 < data["plan"]["estimated_device_s"] <= data["config"]["budget_s"] <= 180
    assert data["plan"]["rounds"] % 2 == 0 and data["plan"]["rounds"] >= 4


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
