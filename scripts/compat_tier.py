"""The compat tier: spec_fused tested against every SGLang release it supports.

Why: "supported" must be tested, not assumed. SGLang ships every week or two and the code
the relay touches (``overlap_utils.py``, ``scheduler.py``, the DFLASH worker, the
attention backends' ``needs_cpu_seq_lens``) moves between releases. For each release in
:data:`spec_fused.releases.TESTED_RELEASES` (plus 0.5.14, which must be refused, and any
newer release the package index serves, which must run or be refused cleanly) this:

1. installs that SGLang wheel without dependencies into its own overlay
   (``.compat/sglang-X``), one download per release (pip's cache keeps it for reruns);
2. runs, in the light environment (``.venv``: CPU torch, the Triton interpreter) with the
   overlay first on ``PYTHONPATH``: ``tests/test_compat.py`` (API probe, exact
   apply/remove, the release's FutureMap features and established capabilities against
   ``tests/compat/expectations.py``), the capability tests (``tests/caps/``), the
   trace-equivalence tests, and the relay's FutureMap tests (``tests/relay/``: stream
   order, host lengths, hot path, fallbacks, where it engages), with a few hypothesis
   cases each;
3. beside step 2, runs the Scheduler tests in the heavy environment (``.venv-sched``) with
   the same overlay, plus the release's own pins of transformers, tokenizers and xgrammar
   where they differ from the environment's (another small overlay); where the release's
   scheduler still does not import on a CPU the row says why;
4. writes its results to ``.compat/results.json``; ``--results tests/compat/results.json``
   (a maintainer's run) writes the committed ones and renders the README's table.

Releases whose relay code is the same (the recorded fingerprints of every function the
patch touches, ``tested_code.py``) share steps 2 and 3's heavy columns: the newest of
each group runs them, the others run the facts read from their own wheel (code, facts,
apply/remove) and their other columns say which release's run covers them.

``record`` writes what the tier tested into the package: the fingerprints (signature and
code) of every SGLang function the patch touches, per listed release
(``spec_fused/integration/tested_code.py``, which ``code_check`` holds the installed
SGLang to). The CI run checks that the committed record is exactly what the listed
releases' wheels contain (``record --check``).

    python scripts/compat_tier.py                    # every release, the CI run
    python scripts/compat_tier.py --results tests/compat/results.json   # a maintainer's run
    python scripts/compat_tier.py --releases 0.5.19  # one
    python scripts/compat_tier.py table --readme README.md
    python scripts/compat_tier.py record [--check]

Exit status 1 when a tested release fails anything (a newer release's result is reported
and never fails the run: the list has not claimed it yet).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from spec_fused.integration import code_check  # noqa: E402
from spec_fused.releases import TESTED_RELEASES, parse, support_status  # noqa: E402

COMPAT_DIR = ROOT / ".compat"
STANDINS = ROOT / "tests" / "standins"  # torchvision: see its docstring
RESULTS = ROOT / "tests" / "compat" / "results.json"
TESTED_CODE = ROOT / "spec_fused" / "integration" / "tested_code.py"
LIGHT_PY = ROOT / ".venv" / "bin" / "python"
HEAVY_PY = ROOT / ".venv-sched" / "bin" / "python"
BELOW_RANGE = "0.5.14"  # the last release before the shared relay: must be refused
LIGHT_TESTS = (
    "tests/test_compat.py",
    "tests/integration/test_code_check.py",
    "tests/caps",
    "tests/tools/test_impact.py",
    "tests/integration/test_trace_equivalence.py",
    "tests/integration/test_upstream_contracts.py",
    "tests/relay",
)
HEAVY_TESTS = ("tests/test_scheduler_tier.py",)
# What a release whose relay code another release's run covers still runs: what is read
# from its own wheel.
FACT_TESTS = LIGHT_TESTS[:2] + ("tests/tools/test_impact.py",)
SHARED = ("decisions", "traces", "relay", "scheduler")  # what a same-code run covers
# Table columns and the test modules (or test_compat tests) each one covers.
COLUMNS = {
    "apply/remove": (
        "test_compat",
        (
            "test_the_installed_release_is_tested_or_refused",
            "test_a_release_below_the_range_is_refused_cleanly",
            "test_api_probe_then_apply_and_remove_exactly",
        ),
    ),
    "code": (
        ("test_compat", "test_code_check"),
        (
            "test_the_installed_code_is_the_recorded_code_of_this_release",
            "test_the_installed_release_is_recorded_as_tested",
            "test_a_new_keyword_on_publish_is_refused_naming_it",
            "test_a_new_branch_in_resolve_is_refused_naming_it",
            "test_comments_blank_lines_and_docstrings_are_not_changes",
            "test_a_mix_of_releases_is_not_a_tested_release",
            "test_an_edited_release_is_refused_in_one_line_and_sglang_runs",
            "test_untested_code_runs_only_when_allowed_and_says_so",
            "test_arguments_the_replacements_do_not_know_go_to_sglangs_original",
        ),
    ),
    "facts": (
        ("test_compat", "test_impact"),
        (
            "test_future_map_features_are_the_releases",
            "test_the_facts_spec_fused_reads_are_the_releases",
            "test_the_fence_check_finds_0_5_14s_verify_done",
            "test_fa3_needs_host_lengths_as_the_release_says",
            "test_the_backend_facts_are_this_releases",
            "test_dflash_keeps_the_draft_backends_the_table_says",
            "test_upstreams_step_costs_are_what_the_columns_claim",
            "test_every_row_says_where_it_helps_from_the_host_lengths",
            "test_flashinfer_blocks_the_host_later_in_the_step_as_the_rows_say",
            "test_dflash_plans_flashinfer_from_host_lengths_where_the_release_says",
            "test_dflash_on_flashinfer_loses_a_host_wait_exactly_where_the_release_plans_from_the_host",
        ),
    ),
    "decisions": (
        ("test_decisions", "test_barrier_decision", "test_bound_capability", "test_bound_holds"),
        None,
    ),
    "traces": ("test_trace_equivalence", None),
    "relay": (
        (
            "test_upstream_contracts",
            "test_stream_order",
            "test_host_lengths",
            "test_hot_path",
            "test_fallbacks",
            "test_engagement",
            "test_cuda_ops",
            "test_sticky_faults",
            "test_confidential_computing",
            "test_measured_gate",
            "test_bound_variant",
        ),
        None,
    ),
    "scheduler": ("test_scheduler_tier", None),
}
HEAVY_PINNED = ("transformers", "tokenizers", "xgrammar")


def pip(python: Path, *args: str) -> None:
    subprocess.run(
        [str(python), "-m", "pip", "--disable-pip-version-check", "-q", *args], check=True
    )


def install_overlay(python: Path, target: Path, *specs: str) -> None:
    """``specs`` into ``target`` alone (no dependencies, no bytecode): a PYTHONPATH overlay."""
    pip(
        python, "install", "--no-deps", "--no-compile", "--upgrade", "--target", str(target), *specs
    )


def overlay(release: str) -> Path:
    """``.compat/sglang-<release>``: the wheel, no dependencies (pip's cache reuses it)."""
    target = COMPAT_DIR / f"sglang-{release}"
    done = target / ".spec_fused-complete"
    if not done.exists():
        print(
            f"[{release}] installing sglang=={release} into {target.relative_to(ROOT)}", flush=True
        )
        install_overlay(LIGHT_PY, target, f"sglang=={release}")
        done.write_text(release)
    return target


def _requires(metadata: Path) -> dict:
    """``{name: specifier}`` of a METADATA file's unconditional Requires-Dist lines."""
    out = {}
    for line in metadata.read_text(encoding="utf-8", errors="replace").splitlines():
        if not line.startswith("Requires-Dist:") or ";" in line:
            continue
        m = re.match(r"Requires-Dist:\s*([A-Za-z0-9_.\-]+)\s*(?:\[[^\]]*\])?\s*\(?([^)]*)\)?", line)
        if m:
            out[m.group(1).lower().replace("_", "-")] = m.group(2).strip()
    return out


def _installed(python: Path, names) -> dict:
    code = (
        "import json, importlib.metadata as m\n"
        "out = {}\n"
        f"for n in {list(names)!r}:\n"
        "    try: out[n] = m.version(n)\n"
        "    except Exception: out[n] = None\n"
        "print(json.dumps(out))"
    )
    proc = subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True)
    return json.loads(proc.stdout)


def heavy_overlay(sglang_dir: Path, release: str):
    """The release's own pins of the packages its scheduler import is sensitive to, as
    an overlay, where they differ from the heavy environment's; None when they agree."""
    metas = list(sglang_dir.glob("sglang-*.dist-info/METADATA"))
    if not metas:
        return None
    pins = {
        n: s for n, s in _requires(metas[0]).items() if n in HEAVY_PINNED and s.startswith("==")
    }
    have = _installed(HEAVY_PY, pins)
    if all(have.get(n) == s[2:] for n, s in pins.items()):
        return None
    tag = "-".join(f"{n}{s[2:]}" for n, s in sorted(pins.items()))
    target = COMPAT_DIR / f"heavy-{tag}"
    done = target / ".spec_fused-complete"
    if done.exists():
        return target
    print(
        f"[{release}] pinned for the scheduler import: "
        f"{', '.join(f'{n}{s}' for n, s in sorted(pins.items()))}",
        flush=True,
    )
    specs = [f"{n}{s}" for n, s in pins.items()]
    install_overlay(HEAVY_PY, target, *specs)
    # What that transformers itself needs of the two it is strict about.
    for meta in target.glob("transformers-*.dist-info/METADATA"):
        needs = _requires(meta)
        extra = [
            f"{n}{needs[n]}"
            for n in ("huggingface-hub", "tokenizers")
            if n in needs and n not in pins
        ]
        if extra:
            install_overlay(HEAVY_PY, target, *extra)
    done.write_text(release)
    return target


def start_pytest(python: Path, tests, pythonpath, junit: Path, extra=()) -> tuple:
    """pytest on ``tests``, started; its output goes to a log beside ``junit`` (two runs of
    a release go side by side: see :func:`test_release`). Returns (process, log)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(str(p) for p in pythonpath)
    env.setdefault("SPEC_FUSED_HYPOTHESIS_PROFILE", "compat")
    env["TRITON_INTERPRET"] = "1"
    # Bytecode is written (mostly into the overlay, installed without it): a release's
    # light run, scheduler run and that run's fresh process import the same modules, and
    # compiling them anew each time cost 4-5 s a scheduler run.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    log = junit.with_suffix(".log")
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [
                str(python),
                "-m",
                "pytest",
                "-q",
                "-p",
                "no:cacheprovider",
                "-o",
                "junit_family=xunit1",
                f"--junitxml={junit}",
                *extra,
                *tests,
            ],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    return proc, log


def finish_pytest(run: tuple) -> None:
    """Wait for a run from :func:`start_pytest`, then print its output."""
    proc, log = run
    proc.wait()
    print(log.read_text(errors="replace"), end="", flush=True)


def _cases(junit: Path) -> list:
    """``[(module, name, outcome, message)]`` from a junit file (missing: no cases)."""
    if not junit.exists():
        return []
    out = []
    for case in ET.parse(junit).getroot().iter("testcase"):
        module = case.get("classname", "").split(".")[-1]
        name = case.get("name", "").split("[")[0]
        outcome, message = "passed", ""
        for kind in ("failure", "error", "skipped"):
            node = case.find(kind)
            if node is not None:
                outcome = "skipped" if kind == "skipped" else "failed"
                message = (node.get("message") or "").strip()
                break
        out.append((module, name, outcome, message))
    return out


def _in_column(cases, modules, names) -> list:
    modules = (modules,) if isinstance(modules, str) else modules
    return [c for c in cases if c[0] in modules and (names is None or c[1] in names)]


def stray_failures(cases) -> list:
    """Failed tests no column counts: they still fail their release (a module added to
    the runs but not to ``COLUMNS`` must not pass unseen)."""
    counted = {c[:2] for spec in COLUMNS.values() for c in _in_column(cases, *spec)}
    return sorted(f"{c[0]}::{c[1]}" for c in cases if c[2] == "failed" and c[:2] not in counted)


def column(cases, modules, names) -> dict:
    mine = _in_column(cases, modules, names)
    count = {k: sum(c[2] == k for c in mine) for k in ("passed", "failed", "skipped")}
    failed = sorted({c[1] for c in mine if c[2] == "failed"})
    skips = sorted({c[3] for c in mine if c[2] == "skipped"})
    if not mine:
        result = "not run"
    elif count["failed"]:
        result = "fail"
    elif count["passed"]:
        result = "pass"
    else:
        result = "skip"
    return {"result": result, **count, "failed_tests": failed, "skip_reasons": skips[:3]}


def row_ok(cols: dict, below: bool) -> bool:
    """Every column of a tested release must pass (or be covered by the run of a release
    with the same code): a skipped or empty column is a failure (a tier that ran nothing
    proves nothing). A release below the range passes by being refused."""
    allowed = ("n/a", "pass") if below else ("pass", "same code")
    return all(c["result"] in allowed for c in cols.values())


def same_code_groups(releases) -> dict:
    """``{release: the release whose run covers its shared columns}``: the newest listed
    release with the same recorded relay code (itself where it is the newest, or not
    listed). The bound variant's code does not split a group: its facts and decisions are
    read from every release's wheel and record, not from a run."""
    from spec_fused.integration.tested_code import TESTED_CODE

    def relay_code(release: str) -> str:
        code = TESTED_CODE[release]
        return json.dumps({m: code.get(m) for m in code_check.RELAY_MODULES}, sort_keys=True)

    newest: dict = {}
    for release in sorted(releases, key=parse):
        if release in TESTED_CODE:
            newest[relay_code(release)] = release
    return {r: newest[relay_code(r)] if r in TESTED_CODE else r for r in releases}


def test_release(release: str, work: Path, covered_by: str = "") -> dict:
    status = support_status(release)
    t0 = time.perf_counter()
    sglang_dir = overlay(release)
    light_junit, heavy_junit = work / f"{release}-light.xml", work / f"{release}-heavy.xml"
    for f in (light_junit, heavy_junit):
        f.unlink(missing_ok=True)
    below = status.kind == "older"
    shared = bool(covered_by) and covered_by != release
    # The light run (.venv) and the scheduler run (.venv-sched) write nothing in common and
    # go side by side: one after another, the tier was one process at a time, and its last
    # releases kept one core busy while the other tiers' work was done.
    print(f"[{release}] light tier ({status.kind})", flush=True)
    light = start_pytest(
        LIGHT_PY,
        LIGHT_TESTS[:1] if below else FACT_TESTS if shared else LIGHT_TESTS,
        [sglang_dir, STANDINS, ROOT],
        light_junit,
        ("-m", "not scheduler and not gpu"),
    )
    heavy = None
    heavy_note = ""
    if below:
        heavy_note = "refused below the range: nothing to patch"
    elif shared:
        heavy_note = "shared"
    elif not HEAVY_PY.exists():
        heavy_note = f"no heavy environment ({HEAVY_PY.relative_to(ROOT)})"
    else:
        pins = heavy_overlay(sglang_dir, release)
        print(f"[{release}] scheduler tier", flush=True)
        heavy = start_pytest(
            HEAVY_PY,
            HEAVY_TESTS,
            [p for p in (sglang_dir, pins, STANDINS, ROOT) if p],
            heavy_junit,
            ("-m", "scheduler"),
        )
    finish_pytest(light)
    if heavy is not None:
        finish_pytest(heavy)
    cases = _cases(light_junit) + _cases(heavy_junit)
    cols = {name: column(cases, *spec) for name, spec in COLUMNS.items()}
    if shared:
        for name in SHARED:
            cols[name] = {"result": "same code", "as": covered_by, "passed": 0, "failed": 0}
    elif heavy_note:
        cols["scheduler"] = {
            "result": "skip",
            "passed": 0,
            "failed": 0,
            "skipped": 0,
            "failed_tests": [],
            "skip_reasons": [heavy_note],
        }
    if below:  # a refused release runs only its refusal and the facts read from it
        for name in COLUMNS:
            if name != "apply/remove" and not cols[name]["passed"] + cols[name]["failed"]:
                cols[name] = {
                    "result": "n/a",
                    "passed": 0,
                    "failed": 0,
                    "skipped": 0,
                    "failed_tests": [],
                    "skip_reasons": ["refused"],
                }
    if stray := stray_failures(cases):
        cols["other"] = {"result": "fail", "passed": 0, "failed": len(stray), "skipped": 0,
                         "failed_tests": stray, "skip_reasons": []}  # fmt: skip
    ok = row_ok(cols, below) and not stray
    row = {
        "release": release,
        "status": status.kind,
        "ok": ok,
        "columns": cols,
        "wall_s": round(time.perf_counter() - t0, 1),
    }
    ran = sum(c["passed"] + c["failed"] for c in cols.values())
    row["tests_run"] = ran
    print(
        f"[{release}] {'ok' if ok else 'FAILED'}: {ran} tests: "
        + ", ".join(f"{n} {c['result']} ({c['passed']})" for n, c in cols.items())
        + f" ({row['wall_s']} s)",
        flush=True,
    )
    return row


def newer_on_index() -> tuple:
    """Releases the package index serves that are newer than the list, and a note."""
    proc = subprocess.run(
        [str(LIGHT_PY), "-m", "pip", "index", "versions", "sglang"], capture_output=True, text=True
    )
    m = re.search(r"Available versions:\s*(.+)", proc.stdout)
    if proc.returncode != 0 or not m:
        return [], "The package index could not be asked for newer releases."
    newest = parse(TESTED_RELEASES[-1])
    newer = [
        v.strip()
        for v in m.group(1).split(",")
        if parse(v.strip()) is not None and parse(v.strip()) > newest
    ]
    return sorted(newer, key=parse), (
        f"The index serves {', '.join(newer)} beyond the list."
        if newer
        else "The package index serves no newer release."
    )


def cmd_run(args) -> int:
    work = COMPAT_DIR / "junit"
    work.mkdir(parents=True, exist_ok=True)
    releases = list(args.releases or ([BELOW_RANGE, *TESTED_RELEASES]))
    note = ""
    if args.discover and not args.releases:
        newer, note = newer_on_index()
        releases += newer
        print(f"compat tier: {note}", flush=True)
    t0 = time.perf_counter()
    if not args.releases:  # the record the package checks against is the listed wheels'
        if cmd_record(argparse.Namespace(check=True)) != 0:
            return 1
    groups = same_code_groups(releases)
    order = sorted(releases, key=lambda r: groups[r] != r)  # the covering runs first
    by = {r: test_release(r, work, groups[r]) for r in order}
    for r in releases:  # a shared column is as good as the run that covers it
        if groups[r] != r and not by[groups[r]]["ok"]:
            by[r]["ok"] = False
    rows = [by[r] for r in releases]
    versions = {
        "light": _installed(LIGHT_PY, ("torch", "triton")),
        "heavy": _installed(HEAVY_PY, ("torch", "triton", "transformers"))
        if HEAVY_PY.exists()
        else None,
    }
    payload = {
        "generated": time.strftime("%Y-%m-%d", time.gmtime()),
        "command": "python scripts/compat_tier.py"
        + (" " + " ".join(sys.argv[1:]) if sys.argv[1:] else ""),
        "environments": versions,
        "index_note": note,
        "rows": rows,
        "wall_s": round(time.perf_counter() - t0, 1),
    }
    out = Path(args.results)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(payload, indent=1) + "\n")
    print(render(payload))
    if not args.releases and out.resolve() == RESULTS.resolve():
        # a maintainer's run: the README shows the committed results
        cmd_table(argparse.Namespace(results=str(out), readme=str(ROOT / "README.md")))
    print(
        f"\ncompat tier: {len(rows)} releases, {sum(r['tests_run'] for r in rows)} tests "
        f"in {payload['wall_s']} s -> {out}"
    )
    bad = [r["release"] for r in rows if not r["ok"] and r["status"] != "newer"]
    if bad:
        print(f"compat tier FAILED for: {', '.join(bad)}", file=sys.stderr)
    return 1 if bad else 0


def _cell(col: dict) -> str:
    if col["result"] == "same code":
        return f"as {col['as']}"
    if col["result"] == "pass":
        return f"pass ({col['passed']})"
    if col["result"] == "fail":
        return f"**FAIL** ({', '.join(col['failed_tests'])})"
    if col["result"] == "skip":
        reason = col["skip_reasons"][0] if col["skip_reasons"] else ""
        return f"skip: {reason[:90]}"
    return col["result"]


def render(payload: dict) -> str:
    lines = [
        "| release | status | " + " | ".join(COLUMNS) + " |",
        "|---|---|" + "---|" * len(COLUMNS),
    ]
    for row in payload["rows"]:
        lines.append(
            f"| {row['release']} | {row['status']} | "
            + " | ".join(_cell(row["columns"].get(c, {"result": "not run"})) for c in COLUMNS)
            + " |"
        )
    env = payload.get("environments") or {}
    light, heavy = env.get("light") or {}, env.get("heavy") or {}
    lines += [
        "",
        f"Run {payload['generated']}: torch {light.get('torch')}, Triton "
        f"{light.get('triton')} (interpreter); the scheduler with transformers "
        f"{heavy.get('transformers')} or the release's pin. "
        f"{payload.get('index_note') or ''}".rstrip(),
    ]
    return "\n".join(lines)


BEGIN, END = "<!-- compat-table:begin -->", "<!-- compat-table:end -->"


def cmd_table(args) -> int:
    payload = json.loads(Path(args.results).read_text())
    table = render(payload)
    if not args.readme:
        print(table)
        return 0
    readme = Path(args.readme)
    text = readme.read_text()
    if BEGIN not in text or END not in text:
        print(f"{readme} has no {BEGIN} ... {END} markers", file=sys.stderr)
        return 2
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    readme.write_text(f"{head}{BEGIN}\n{table}\n{END}{tail}")
    print(f"compat table written into {readme}")
    return 0


def recorded_code(releases=TESTED_RELEASES) -> dict:
    """``{release: {module: {qualname: fingerprint}}}`` read from each release's wheel."""
    out = {}
    for release in releases:
        root = overlay(release)
        out[release] = {
            module: code_check.fingerprint_source_file(
                root / (module.replace(".", "/") + ".py"), names
            )
            for module, names in code_check.CHECKED.items()
        }
    return out


def render_tested_code(record: dict) -> str:
    lines = [
        '"""The code of every listed SGLang release that spec_fused patches or relies on:',
        "``{release: {module: {function: '(signature)|code hash'}}}``.",
        "",
        "Written by ``python scripts/compat_tier.py record`` from each release's wheel; the",
        "CI run checks it (``record --check``). Do not edit by hand.",
        '"""',
        "",
        "TESTED_CODE = {",
    ]
    for release in sorted(record, key=parse):
        lines.append(f"    {release!r}: {{")
        for module, names in record[release].items():
            lines.append(f"        {module!r}: {{")
            for name, fp in names.items():
                lines.append(f"            {name!r}:")
                lines.append(f"                {fp!r},")
            lines.append("        },")
        lines.append("    },")
    lines.append("}")
    return "\n".join(lines) + "\n"


def cmd_record(args) -> int:
    text = render_tested_code(recorded_code())
    if args.check:
        committed = TESTED_CODE.read_text() if TESTED_CODE.exists() else ""
        if committed != text:
            print(
                f"{TESTED_CODE.relative_to(ROOT)} is not what the listed releases contain; "
                f"run: python scripts/compat_tier.py record",
                file=sys.stderr,
            )
            return 1
        print(f"{TESTED_CODE.relative_to(ROOT)}: matches {len(TESTED_RELEASES)} releases")
        return 0
    TESTED_CODE.write_text(text)
    print(f"wrote {TESTED_CODE.relative_to(ROOT)} ({len(TESTED_RELEASES)} releases)")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python scripts/compat_tier.py", description=__doc__.split("\n\n")[0]
    )
    sub = parser.add_subparsers(dest="cmd")
    parser.add_argument(
        "--releases",
        nargs="+",
        help=f"only these (default: all, plus {BELOW_RANGE} and newer ones on the index)",
    )
    parser.add_argument(
        "--no-discover",
        dest="discover",
        action="store_false",
        help="do not ask the package index for newer releases",
    )
    parser.add_argument(
        "--results",
        default=str(COMPAT_DIR / "results.json"),
        help=f"where to write them ({RESULTS.relative_to(ROOT)}: the committed ones, and the "
        "README's table)",
    )
    table = sub.add_parser("table", help="render the results as the README's table")
    table.add_argument("--results", default=str(RESULTS))
    table.add_argument("--readme", help="write it between the README's markers")
    record = sub.add_parser(
        "record", help="write the tested releases' code fingerprints into the package"
    )
    record.add_argument(
        "--check", action="store_true", help="only check that the committed record is current"
    )
    args = parser.parse_args(argv)
    if args.cmd == "table":
        return cmd_table(args)
    if args.cmd == "record":
        return cmd_record(args)
    return cmd_run(args)


if __name__ == "__main__":
    sys.exit(main())
