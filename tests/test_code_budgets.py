"""The package stays within the line budgets it was cut to (docs/design.md, "What was cut"):
a mechanism that comes back has to make room, or raise a budget with its reason."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "spec_fused"
SOURCES = [p for p in PACKAGE.rglob("*.py") if p.name != "tested_code.py"]


def _lines(paths) -> int:
    return sum(len(p.read_text().splitlines()) for p in paths)


def test_the_package_and_its_tools_stay_within_their_budgets():
    # 4,500 until issue 37: the tools' 210 lines below (no serving code grew).
    # 4,600 until issue 38: the bound variant, DFLASH on FlashInfer without the FutureMap's
    # host wait - integration/flashinfer_plan.py (~225: the pinned plan buffer's guard, a
    # safety need, and where the bound may stand), caps.HostBound (~50: which steps it
    # covers, its debug check); host_waits.py (~195), the per-step host-wait counter the
    # issue asks for as its instrument (no maintained tool counts waits per scheduler
    # step: torch's sync detector misses Event.synchronize and knows no step).
    # 5,150 until issue 41: the partition guard (~135: flashinfer_plan's chunk read-back,
    # straddle check and exact replan, caps.BoundStep, cuda_ops.read_later, the relay's
    # floor), a safety need: without it a plan from DFLASH's bound is wrong attention; the
    # FlashInfer gate and doctor's row for it (~20), which the issue asks for.
    assert _lines(SOURCES) <= 5_350
    # 1,000 until issue 34: tools/timing.py (203 lines) times a relay step as serving sees
    # it - queued behind a busy GPU, blocked time apart from host time, ABBA rounds - for
    # selftest and bench/probe.py; torch.utils.benchmark and do_bench time an idle GPU.
    # 1,275 until issue 37: tools/forward.py (~100 lines), the graphed bf16 GEMMs queued
    # cells run behind (a sleep kernel left the SMs free) and bench/ab_loop.py's forward,
    # in the package because timing.py needs it and cannot import bench/; the engagement
    # check (a step handed back to SGLang reads as "level"), its verdict, selftest's grid
    # and time budget (~110 lines in timing.py and selftest.py).
    # 1,500 until issue 38: impact.py's DFLASH + FlashInfer row (host waits 2 -> 1 where
    # the release plans DFLASH from host lengths) and doctor's line for it.
    # 1,530 until issue 41: doctor's FlashInfer row (whether DFLASH's bound may plan the
    # installed FlashInfer), which the issue asks for.
    assert _lines(p for p in SOURCES if "tools" in p.relative_to(PACKAGE).parts) <= 1_560
    assert _lines([PACKAGE / "kernels" / "publish_gather.py"]) <= 250
    # 2,500 until issue 37: the pytest-benchmark kernel sweep (test_kernel_bench.py and
    # its conftest, ~150) the issue brings back, the carry's one size check (carry.py,
    # ~60), the EAGLE-like exact cell and per-block engagement check in ab_loop.py.
    # 2,700 until issue 38: the FlashInfer lease (flashinfer_carry.py ~290 lines,
    # flashinfer_check.py ~510, flashinfer_cell.py ~275) checks FlashInfer 0.7.2's real fa2
    # wrapper planned by SGLang's fast_prefill_plan on a GPU - bound against exact plans, the
    # pinned-buffer race with and without the guard, the loop A/B - and builds and proves the
    # trimmed carry that check needs. Neither SGLang nor FlashInfer maintains such a check.
    # 3,800 until issue 41: bench/fa2_split.py (~300), the Python mirror of FlashInfer's fa2
    # split-KV plan, kernel layout and merge that the partition guard's tests run and the
    # design doc's straddle table comes from; FlashInfer ships no such model.
    # 4,150 until issue 41 item 5: the GPU check with teeth (flashinfer_check.py ~+170: the
    # straddle cases three ways, threshold verdicts on every error, the mirror's chunk held
    # to the real plan's, and the stand-in fa2 the dry run and the guard's tests compute
    # attention through, moved from tests/support): without them the lease could not fail.
    # 4,300 until its cell part: B tells the guard each step's floor, and the cell reports
    # host waits per step apart on straddle steps and replans per step (flashinfer_cell.py
    # ~+35), so "2 -> 1 outside straddle steps" is what it measures.
    assert _lines((ROOT / "bench").rglob("*.py")) <= 4_350


def test_no_module_or_class_outgrows_its_budget():
    for path in SOURCES:
        assert _lines([path]) <= 400, path
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                assert node.end_lineno - node.lineno + 1 <= 250, f"{path}: {node.name}"
