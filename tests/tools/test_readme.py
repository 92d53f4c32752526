"""The README says what the code and the committed results say: its generated tables are
current (the impact table from spec_fused/tools/impact.py, the results from bench/results/cpu,
the compatibility table from tests/compat/results.json)."""

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _load(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_readmes_generated_tables_are_current():
    assert _load("readme_tables").main(["--check"]) == 0


def test_the_readmes_compatibility_table_is_the_committed_results():
    tier = _load("compat_tier")
    table = tier.render(json.loads((ROOT / "tests" / "compat" / "results.json").read_text()))
    assert table in (ROOT / "README.md").read_text()
