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
    assert _lines(SOURCES) <= 4_500
    # 1,000 until issue 34: tools/timing.py (203 lines) times a relay step as serving sees
    # it - queued behind a busy GPU, blocked time apart from host time, ABBA rounds - for
    # selftest and bench/probe.py; torch.utils.benchmark and do_bench time an idle GPU.
    assert _lines(p for p in SOURCES if "tools" in p.relative_to(PACKAGE).parts) <= 1_275
    assert _lines([PACKAGE / "kernels" / "publish_gather.py"]) <= 250
    # 2,500 until issue 38: the FlashInfer lease (bench/flashinfer_carry.py 300 lines,
    # flashinfer_check.py 510, flashinfer_cell.py 270) checks FlashInfer 0.7.2's real fa2
    # wrapper planned by SGLang's fast_prefill_plan on a GPU - bound against exact plans, the
    # pinned-buffer race with and without the guard, the loop A/B - and builds and proves the
    # trimmed carry that check needs. Neither SGLang nor FlashInfer maintains such a check.
    assert _lines((ROOT / "bench").rglob("*.py")) <= 3_600


def test_no_module_or_class_outgrows_its_budget():
    for path in SOURCES:
        assert _lines([path]) <= 400, path
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                assert node.end_lineno - node.lineno + 1 <= 250, f"{path}: {node.name}"
