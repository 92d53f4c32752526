"""The decode-loop A/B's plan and its loop, proven on CPU.

Why: ``bench/ab_loop.py`` runs only on a lent GPU, where no time is left to find a bug;
its dry run is held here to what issues 34 and 37 ask of it: every cell (concurrency 1 to
256 x NGRAM-like, EAGLE-like exact with its draft, GPU-only; pools 4,096 and, for exact
host lengths, 1,024) and every arm (A, B, and C where host lengths are exact) planned,
rows with every promised key and null figures, at least 4 rounds, a GPU estimate within
the budget, and on CPU without ``--dry-run`` a refusal. The dry run drives every arm's
loop through SGLang's real ``FutureMap``; a relay that hands back wrong lengths must stop
it, and one that hands steps back to SGLang reads "not engaged". Nothing here times
anything.
"""

import contextlib
import io
import json
import os
import sys

import pytest
import torch
from support.hand_back import plant_hand_backs

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from bench import ab_loop, measure  # noqa: E402

ROW_KEYS = {
    "config",
    "needs_cpu_seq_lens",
    "draft",
    "pool",
    "concurrency",
    "arms",
    "rounds",
    "steps_per_block",
    "b_over_a",
    "band",
    "c_over_a",
    "c_band",
    "steps_per_s",
    "gpu_idle_us_per_step",
    "relayed",
    "engaged",
    "skipped",
}


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("ab_loop")
    with contextlib.redirect_stdout(io.StringIO()):
        assert ab_loop.main(["--dry-run", "--out", str(out)]) == 0
    return json.loads((out / "ab_loop.json").read_text()), out


def test_the_dry_run_writes_the_promised_schema(dry_run):
    data, out = dry_run
    assert data["dry_run"] is True and data["device"]
    assert {"sglang", "torch", "triton", "python"} <= set(data["versions"])
    plan = data["plan"]
    assert plan["rounds"] >= 4 and plan["order"] == "ABBA then BAAB"
    assert 0 < plan["least_device_s"] < plan["estimated_device_s"] <= plan["budget_s"] == 200
    assert plan["estimated_device_min"] == round(plan["estimated_device_s"] / 60, 1)
    assert plan["forward"]["verify_layers"] >= 1 and "4096x28672" in plan["forward"]["layer"]
    assert "busy loop" in plan["host_work_us"] and plan["barrier"] in ("read_done", "coarse")
    for row in data["rows"]:
        assert set(row) == ROW_KEYS, row
        arms = row["arms"]
        assert set(row["gpu_idle_us_per_step"]) == set(row["steps_per_s"]) == set(arms)
        assert {"A", "B"} <= set(row["gpu_idle_us_per_step"])
        figures = [row[k] for k in ("b_over_a", "band", "c_over_a", "c_band")]
        figures += [*row["steps_per_s"].values(), *row["gpu_idle_us_per_step"].values()]
        assert figures == [None] * len(figures) and row["rounds"] == 0
        assert row["skipped"] is None and row["engaged"] is True  # B's 3 toy steps, its own
    assert not (out / "ab_loop.png").exists()  # a dry run has nothing to plot


def test_every_cell_and_arm_is_planned(dry_run):
    data, _ = dry_run
    kinds = {  # exact host lengths, a draft after the publish, pools
        "NGRAM-like": (True, False, (4096, 1024)),
        "EAGLE-like exact": (True, True, (4096, 1024)),
        "DFLASH/EAGLE-like": (False, True, (4096,)),
    }
    want = {(bs, label, pool) for bs in (1, 8, 32, 64, 128, 256)
            for label, (_, _, pools) in kinds.items() for pool in pools}  # fmt: skip
    for cells in (data["plan"]["cells"], data["rows"]):
        assert {(c["concurrency"], c["config"], c["pool"]) for c in cells} == want
        assert len(cells) == len(want)
        for c in cells:  # C only where host lengths are exact (GPU-only: C is A in kind)
            assert (c["needs_cpu_seq_lens"], c["draft"]) == kinds[c["config"]][:2]
            assert c["arms"] == (["A", "B", "C"] if c["needs_cpu_seq_lens"] else ["A", "B"])
    assert set(data["plan"]["arms"]) == {"A", "B", "C"}
    assert data["plan"]["forward"]["draft_layers"]["EAGLE-like exact"] >= 1


def test_relayed_is_what_spec_fused_does_on_cuda_by_default(dry_run, monkeypatch):
    from spec_fused import measured

    monkeypatch.setenv("SPEC_FUSED_UNMEASURED", "")
    for row in dry_run[0]["rows"]:
        exact = row["needs_cpu_seq_lens"]
        assert row["relayed"] == (measured.handed_to_sglang(torch.device("cuda"), exact) is None)


def test_cpu_without_dry_run_refuses(monkeypatch, tmp_path):
    monkeypatch.setattr(ab_loop.torch.cuda, "is_available", lambda: False)
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        assert ab_loop.main(["--out", str(tmp_path)]) == 2
    assert "--dry-run" in err.getvalue() and "CUDA" in err.getvalue()
    assert not list(tmp_path.iterdir())


def test_fewer_than_four_rounds_are_refused():
    with pytest.raises(SystemExit), contextlib.redirect_stderr(io.StringIO()):
        ab_loop.parse(["--dry-run", "--rounds", "3"])


def test_the_rounds_alternate_abba_then_baab():
    orders = ["AB" if reverse == 0 else "BA" for reverse in ab_loop.ABBA]
    assert orders == ["AB", "BA", "BA", "AB", "BA", "AB", "AB", "BA"]


def test_a_relay_that_resolves_wrong_lengths_stops_the_loop():
    args = ab_loop.parse(["--dry-run"])
    loop = ab_loop.Loop(torch.device("cpu"), 8, args, ab_loop.TOY, torch.float32).at(4096)
    measure.set_patched(False)
    fm, _ = measure.arm_future_map("NGRAM", "cpu", 4096, fused=False)
    loop.block(fm, "A", True, 3)  # as shipped: the lengths check out
    publish = type(fm).publish
    fm.publish = lambda fi, lens: publish(fm, fi, lens + 1)  # an off-by-one relay
    with pytest.raises(RuntimeError, match="wrong lengths"):
        loop.block(fm, "A", True, 3)


def test_a_relay_that_hands_steps_back_reads_not_engaged(monkeypatch, tmp_path):
    """Every other step handed back to SGLang (the lengths stay right: SGLang resolves
    them): each block of B says so, every cell reads "not engaged" with no ratio, and the
    exit status is 1. Catching a retire alone would pass this loop."""
    handed = plant_hand_backs(monkeypatch)
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        rc = ab_loop.main(["--dry-run", "--concurrency", "8", "--out", str(tmp_path)])
    rows = json.loads((tmp_path / "ab_loop.json").read_text())["rows"]
    assert rc == 1 and handed and len(rows) == 5  # every config and pool at concurrency 8
    assert all(r["engaged"] is False and r["b_over_a"] is None for r in rows)
    assert all(r["skipped"].startswith("not engaged: B's relay resolved") for r in rows)


def test_a_row_pairs_each_round_and_the_plot_draws(tmp_path):
    args = ab_loop.parse(["--dry-run"])
    samples = {
        "A": [(100.0, 50.0), (200.0, 40.0), (100.0, 60.0), (100.0, 50.0)],
        "B": [(110.0, 45.0), (180.0, 40.0), (105.0, 55.0), (100.0, 50.0)],
        "C": [(120.0, 5.0), (240.0, 4.0), (120.0, 6.0), (120.0, 5.0)],
    }
    row = ab_loop.make_row(args, 8, "EAGLE-like exact", 1024, samples, steps=50, engaged=True)
    assert row["band"] == pytest.approx([0.9, 1.1]) and row["b_over_a"] == pytest.approx(1.025)
    assert row["c_over_a"] == pytest.approx(1.2) and row["c_band"] == pytest.approx([1.2, 1.2])
    assert row["steps_per_s"]["A"] == 100.0 and row["gpu_idle_us_per_step"]["C"] == 5.0
    assert (row["needs_cpu_seq_lens"], row["draft"], row["pool"]) == (True, True, 1024)
    gpu_only = ab_loop.make_row(args, 8, "DFLASH/EAGLE-like", 4096, {k: samples[k] for k in "AB"},
                                steps=50)  # fmt: skip
    assert gpu_only["c_over_a"] is None and set(gpu_only["steps_per_s"]) == {"A", "B"}
    ab_loop.plot([row, gpu_only], tmp_path / "ab_loop.png")
    assert (tmp_path / "ab_loop.png").stat().st_size > 0


def test_the_flashinfer_cell_runs_beside_the_loop_and_counts_one_wait_less(tmp_path):
    """``--flashinfer``: the DFLASH + FlashInfer cell (bench/flashinfer_cell.py) on SGLang's
    real FutureMap and SGLang's own fast_prefill_plan, here on its stand-in device: outside
    straddle steps SGLang's step waits once more than the bound variant's (the FutureMap's
    resolve), the guard never waits for a copy, and it replans B's straddle steps (A's plan
    is SGLang's, unguarded)."""
    with contextlib.redirect_stdout(io.StringIO()):
        argv = ["--dry-run", "--flashinfer", "--concurrency", "1,8", "--out", str(tmp_path)]
        assert ab_loop.main(argv) == 0
    cell = json.loads((tmp_path / "ab_loop.json").read_text())["flashinfer"]
    assert [row["concurrency"] for row in cell["rows"]] == [1, 8]
    for row in cell["rows"]:
        waits = row["host_waits_per_step_outside_straddles"]
        assert waits["A"] - waits["B"] == 1, row
        assert row["guard"]["plans"] > 0 and row["guard"]["waits"] == 0, row
        assert row["replans_per_step"]["A"] == 0 and row["straddle_steps"]["A"] == 0, row
    straddled = [row for row in cell["rows"] if row["straddle_steps"]["B"]]
    assert straddled and all(row["guard"]["replans"] > 0 for row in straddled)
