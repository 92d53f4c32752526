"""The README says what the code and the committed results say: its generated tables are
current (the impact table from spec_fused/impact.py, the results from bench/results/cpu,
the compatibility table from tests/compat/results.json), and each row of the impact table
says what its costs mean."""

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"


def _load(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_readmes_generated_tables_are_current():
    assert _load("readme_tables").main(["--check"]) == 0


def test_each_impact_row_says_what_its_costs_mean():
    """Where a backend reads host lengths: 3 device ops become 1, the 8·pool-byte copy
    becomes 8·(bs+2) written by the launch, the host still waits; where every backend
    opts out: 2 become 1, nothing is copied and nothing waits either way. Both keep the
    WAR barrier. (tests/test_impact.py holds the costs to upstream's source.)"""
    text = README.read_text()
    table = text.split("<!-- impact-table:begin -->")[1].split("<!-- impact-table:end -->")[0]
    header, *rows = [line for line in table.splitlines() if line.startswith("| ")]
    columns = [c.strip() for c in header.strip("|").split("|")]
    assert len(rows) >= 6
    for line in rows:
        row = dict(zip(columns, (c.strip() for c in line.strip("|").split("|")), strict=True))
        if row["host lengths"] == "read":
            assert row["device ops"] == "3 → 1", line
            assert row["D2H bytes"] == "8·pool → 8·(bs+2)", line
            assert row["spec_fused saves per step"].startswith("**helps**: 2 device ops and "
                                                               "the 8·pool-byte D2H copy"), line
            assert row["spec_fused saves per step"].endswith("the host still waits"), line
        else:
            assert row["host lengths"] == "opted out", line
            assert (row["device ops"], row["D2H bytes"]) == ("2 → 1", "0 → 0"), line
            assert row["host waits for"] == "nothing → nothing", line
            assert row["spec_fused saves per step"] == ("**nothing that matters**: 1 device "
                                                        "op; no host wait either way"), line
    assert {row.split("|")[4].strip() for row in rows} == {"read", "opted out"}
    assert "Both keep SGLang's WAR barrier on every row." in table


def test_the_readmes_compatibility_table_is_the_committed_results():
    tier = _load("compat_tier")
    table = tier.render(json.loads((ROOT / "tests" / "compat" / "results.json").read_text()))
    assert table in README.read_text()
