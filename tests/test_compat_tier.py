"""The compat tier's own bookkeeping: version order, pins, junit classification, table."""

import importlib.util
import json
from pathlib import Path

import pytest

from spec_fused.releases import TESTED_RELEASES, parse

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("compat_tier", ROOT / "scripts" / "compat_tier.py")
tier = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tier)


def test_versions_sort_as_pep_440_says():
    order = [
        "0.5.14",
        "0.5.15.dev1",
        "0.5.15rc1",
        "0.5.15",
        "0.5.15.post1",
        "0.5.16",
        "0.5.23",
        "0.5.23.post1",
        "0.5.24rc1",
        "0.5.24",
        "0.6.0",
    ]
    assert sorted(order, key=parse) == order
    assert parse("0.5.23+cu130") == parse("0.5.23") and parse("nope") is None
    assert list(TESTED_RELEASES) == sorted(TESTED_RELEASES, key=parse)


def test_every_tested_release_has_an_expectation_row():
    from compat.expectations import RELEASES

    assert set(RELEASES) == set(TESTED_RELEASES)


def test_requires_reads_pins_and_ranges_but_not_markers(tmp_path):
    meta = tmp_path / "METADATA"
    meta.write_text(
        "Name: sglang\nRequires-Dist: transformers==5.12.1\n"
        "Requires-Dist: huggingface-hub<2.0,>=1.5.0\n"
        "Requires-Dist: xgrammar==0.2.1\n"
        'Requires-Dist: pytest; extra == "test"\n'
        "Requires-Dist: Tokenizers (<=0.23.0,>=0.22.0)\n"
    )
    got = tier._requires(meta)
    assert got["transformers"] == "==5.12.1" and got["xgrammar"] == "==0.2.1"
    assert got["huggingface-hub"] == "<2.0,>=1.5.0" and got["tokenizers"] == "<=0.23.0,>=0.22.0"
    assert "pytest" not in got


JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite>
<testcase classname="tests.test_compat" name="test_api_probe_then_apply_and_remove_exactly"/>
<testcase classname="tests.test_compat" name="test_the_facts_spec_fused_reads_are_the_releases">
  <failure message="assert 'server_args...' == 'get_exec()...'"/></testcase>
<testcase classname="tests.test_trace_equivalence" name="test_every_algorithm_matches_upstream_step_for_step"/>
<testcase classname="tests.test_scheduler_tier" name="tests.test_scheduler_tier">
  <skipped message="could not import 'sglang.srt.managers.scheduler': No module named 'x'"/>
</testcase></testsuite></testsuites>"""


def test_columns_classify_pass_fail_and_skip(tmp_path):
    junit = tmp_path / "j.xml"
    junit.write_text(JUNIT)
    cases = tier._cases(junit)
    cols = {name: tier.column(cases, *spec) for name, spec in tier.COLUMNS.items()}
    assert cols["apply/remove"]["result"] == "pass"
    assert cols["facts"]["result"] == "fail"
    assert cols["facts"]["failed_tests"] == ["test_the_facts_spec_fused_reads_are_the_releases"]
    assert cols["traces"]["result"] == "pass" and cols["relay"]["result"] == "not run"
    assert cols["scheduler"]["result"] == "skip"
    assert "No module named 'x'" in cols["scheduler"]["skip_reasons"][0]
    assert tier._cases(tmp_path / "missing.xml") == []


def _col(result):
    return {
        "result": result,
        "passed": int(result == "pass"),
        "failed": 0,
        "skipped": 0,
        "failed_tests": [],
        "skip_reasons": [],
    }


@pytest.mark.parametrize(
    "scheduler, below, ok",
    [
        ("pass", False, True),
        ("skip", False, False),
        ("not run", False, False),
        ("fail", False, False),
        ("n/a", True, True),
        ("skip", True, False),
    ],
)
def test_a_tested_release_needs_every_column_to_pass_the_scheduler_included(scheduler, below, ok):
    cols = {
        name: _col("n/a" if below and name != "apply/remove" else "pass") for name in tier.COLUMNS
    }
    cols["scheduler"] = _col(scheduler)
    assert tier.row_ok(cols, below) is ok


def test_table_renders_every_row_and_lands_between_the_markers(tmp_path):
    committed = json.loads((ROOT / "tests" / "compat" / "results.json").read_text())
    table = tier.render(committed)
    for row in committed["rows"]:
        assert f"| {row['release']} |" in table
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{tier.BEGIN}\nold\n{tier.END}\noutro\n")
    results = tmp_path / "r.json"
    results.write_text(json.dumps(committed))
    assert tier.main(["table", "--results", str(results), "--readme", str(readme)]) == 0
    text = readme.read_text()
    assert "\nold\n" not in text and table in text and text.startswith("intro")
    assert text.rstrip().endswith("outro")


@pytest.mark.parametrize("committed_path", [False, True])
def test_only_a_run_into_the_committed_results_rewrites_the_readme(
    tmp_path, monkeypatch, committed_path
):
    """CI and a user's ./run.sh test write .compat/results.json and leave the README
    alone; a maintainer's run into tests/compat/results.json renders it into the README."""
    committed = json.loads((ROOT / "tests" / "compat" / "results.json").read_text())
    rows = {row["release"]: row for row in committed["rows"]}
    results, readme = tmp_path / "results.json", tmp_path / "README.md"
    readme.write_text(f"intro\n{tier.BEGIN}\nold\n{tier.END}\noutro\n")
    monkeypatch.setattr(tier, "RESULTS", results if committed_path else tmp_path / "other")
    monkeypatch.setattr(tier, "ROOT", tmp_path)
    monkeypatch.setattr(tier, "COMPAT_DIR", tmp_path)
    monkeypatch.setattr(tier, "cmd_record", lambda args: 0)
    monkeypatch.setattr(tier, "_installed", lambda py, names: {})
    monkeypatch.setattr(tier, "test_release", lambda release, work, covered: rows[release])
    assert tier.main(["--no-discover", "--results", str(results)]) == 0
    assert json.loads(results.read_text())["rows"][-1]["release"] == TESTED_RELEASES[-1]
    text = readme.read_text()
    assert ("\nold\n" in text) is not committed_path


def test_releases_with_the_same_relay_code_share_one_run_of_the_heavy_columns():
    """The newest release of each group of identical recorded relay code covers the others
    (the bound variant's code, recorded too, is read per release and splits no group)."""
    from spec_fused.integration.code_check import RELAY_MODULES
    from spec_fused.integration.tested_code import TESTED_CODE

    groups = tier.same_code_groups([tier.BELOW_RANGE, *TESTED_RELEASES])
    assert groups[tier.BELOW_RANGE] == tier.BELOW_RANGE
    for release, covered_by in groups.items():
        if release in TESTED_CODE:
            relay = {m: TESTED_CODE[release][m] for m in RELAY_MODULES}
            assert relay == {m: TESTED_CODE[covered_by][m] for m in RELAY_MODULES}
            assert parse(covered_by) >= parse(release)
    assert groups[TESTED_RELEASES[-1]] == TESTED_RELEASES[-1]
    assert len(set(groups.values())) < len(groups)  # some release is covered by another
    cols = {n: {"result": "same code", "as": "0.5.22"} for n in tier.SHARED}
    cols.update({n: {"result": "pass"} for n in tier.COLUMNS if n not in tier.SHARED})
    assert tier.row_ok(cols, below=False) and tier._cell(cols["relay"]) == "as 0.5.22"


def test_the_committed_results_cover_the_list():
    committed = json.loads((ROOT / "tests" / "compat" / "results.json").read_text())
    rows = {r["release"]: r for r in committed["rows"]}
    for release in TESTED_RELEASES:
        assert rows[release]["ok"], release


@pytest.mark.parametrize("release", ["0.5.14"])
def test_the_release_below_the_range_is_in_the_tier(release):
    assert tier.BELOW_RANGE == release and parse(release) < parse(TESTED_RELEASES[0])


def test_a_failure_no_column_counts_still_fails_its_release():
    cases = [
        ("test_decisions", "test_x", "failed", "boom"),  # counted by "decisions"
        ("test_new_module", "test_y", "failed", "boom"),  # in the runs, in no column
        ("test_new_module", "test_z", "passed", ""),
    ]
    assert tier.stray_failures(cases) == ["test_new_module::test_y"]
