"""Mutation testing of the relay's core modules against the fast test tier.

The mutants are mutmut's: ``mutmut.mutation.file_mutation`` (mutmut 3.x) with its
operator set - comparison/boolean/arithmetic operator swaps, ``True``/``False``, number
+1, string ``XX``/case changes, a call argument -> ``None`` or dropped, ``not`` removed,
assignment -> ``None``, ``is``/``is not`` and ``in``/``not in`` swaps, ternaries forced
down each arm - over every function and method body (mutmut's scope; module- and
class-level constants are not mutated). mutmut's own runner is not used: it rewrites each
mutated function into a trampoline in a ``mutants/`` copy, which skips decorated functions
(``@property``, the launcher's ``backend`` setter) and fights this project's layout. This
driver applies ONE mutant at a time as plain source in a scratch copy of the working tree
(never the real file: another engineer may be running tests in the tree) and runs the
module's tests on it with ``-x`` and a fixed hypothesis seed.

How a mutant is judged (all in a fork server: the parent imports torch, Triton with
``TRITON_INTERPRET=1``, hypothesis, pytest and SGLang once - never ``spec_fused`` - and
forks one child per run, which imports the mutated source fresh):

1. The module's test subset runs once unmutated under coverage, each test in its own
   coverage context; it must pass.
2. A mutant in function ``f`` runs first the tests that executed any line of ``f`` (a
   test that never runs ``f`` cannot see a change inside it), checked to pass unmutated.
   None: "no_coverage" (a survivor).
3. With ``--confirm``, a mutant those tests do not kill runs the whole subset again
   before it counts as survived (a module-scoped fixture's lines are attributed to the
   first test that used it). The first pass leaves this out; the survivors' re-run
   (``--survivors --confirm``) does it.

Bytecode is never written (a same-size mutant written within the same second would
otherwise reuse a stale ``.pyc``); hypothesis runs the fast profile's 20 examples, seeded,
with no example database and no shrinking, so no result depends on the mutant before it.
A child that pytest fails in any way (a failed test, a collection error from a mutant
that breaks the import, a segfault) kills the mutant: the same tests pass unmutated.

    .venv/bin/python scripts/mutation.py list
    .venv/bin/python scripts/mutation.py run caps relay host_ring step_launcher
    .venv/bin/python scripts/mutation.py run relay --ids 12 40      # re-run some
    .venv/bin/python scripts/mutation.py run relay --survivors --confirm  # re-run survivors
    .venv/bin/python scripts/mutation.py show relay 12               # the mutant's diff
    .venv/bin/python scripts/mutation.py report [--equivalent scripts/mutation_equivalent.txt]

Results go to ``.mutation/`` (ignored by git); the scratch copy is
``$TMPDIR/spec_fused_mutation``.
"""

from __future__ import annotations

import argparse
import difflib
import hashlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / ".mutation"
WORK = Path(os.environ.get("TMPDIR", "/tmp")) / "spec_fused_mutation"

_KERNEL_TESTS = [
    "tests/relay/test_host_lengths.py",
    "tests/kernels/test_direct_launch.py",
    "tests/integration/test_fuzz.py",
    "tests/kernels/test_kernel_errors.py",
    "tests/kernels/test_canary.py",
    "tests/kernels/test_host_ring.py",
    "tests/kernels/test_step_launcher.py",
]
# module -> (file, its fast-tier test subset)
MODULES = {
    "caps": ("spec_fused/caps.py", ["tests/caps"]),
    "relay": (
        "spec_fused/relay.py",
        [
            "tests/relay",
            "tests/integration/test_upstream_contracts.py",
            "tests/integration/test_trace_equivalence.py",
            "tests/integration/test_code_check.py",
        ],
    ),
    # CudaOps and the device rule lived in relay.py during the recorded run (bffb675)
    "cuda_ops": (
        "spec_fused/cuda_ops.py",
        [
            "tests/relay/test_stream_order.py",
            "tests/relay/test_fallbacks.py",
            "tests/relay/test_cuda_ops.py",
            "tests/relay/test_engagement.py",
        ],
    ),
    "host_ring": ("spec_fused/kernels/host_ring.py", _KERNEL_TESTS),
    "step_launcher": ("spec_fused/kernels/step_launcher.py", _KERNEL_TESTS),
}
PYTEST_ARGS = [
    "-q",
    "-p",
    "no:cacheprovider",
    "-m",
    "not scheduler and not gpu",
    "--hypothesis-seed=0",
    "-W",
    "ignore",
    "-rfE",
]
PRELOAD = [
    "numpy",
    "torch",
    "triton",
    "triton.language",
    "hypothesis",
    "pytest",
    "sglang.srt.managers.overlap_utils",
    "sglang.srt.speculative.spec_info",
    "coverage",
]


# ---------------------------------------------------------------------------- mutants


def mutants(module: str) -> list[dict]:
    """Every mutmut mutant of ``module`` inside a function or method body, in source order:
    ``{"id", "line", "func": [first, last line], "op", "diff", "code"}`` (``code``: the
    whole mutated file). Cached in ``.mutation/`` by the source's hash."""
    path = ROOT / MODULES[module][0]
    code = path.read_text()
    digest = hashlib.sha256(code.encode()).hexdigest()[:16]
    cache = RESULTS / f"mutants-{module}-{digest}.json"
    if cache.exists():
        return json.loads(cache.read_text())

    import libcst as cst
    from libcst.metadata import MetadataWrapper, PositionProvider
    from mutmut import configuration
    from mutmut.mutation import file_mutation as fm
    from mutmut.mutation.pragma_handling import get_ignored_lines

    # mutmut guesses its source path from the directory's name ("main" here); say it
    # (only its defaults are read: no do-not-mutate patterns are configured).
    configuration._guess_source_paths = lambda: ["spec_fused"]

    class Visitor(fm.MutationVisitor):
        # mutmut skips decorated functions only because its trampolines cannot wrap them;
        # a mutant applied as plain source can (the decorator itself is left alone).
        def _skip_node_and_children(self, node):
            if isinstance(node, cst.FunctionDef) and node.decorators:
                return False
            return super()._skip_node_and_children(node)

        def _create_mutations(self, node):  # mutmut's, also recording the operator
            for t, operator in self._operators:
                if isinstance(node, t):
                    for mutated in operator(node):
                        if self._removes_ignored_code(node, mutated):
                            continue
                        mutation = fm.Mutation(
                            node, mutated, self.get_metadata(fm.OuterFunctionProvider, node, None)
                        )
                        mutation.op = operator.__name__.removeprefix("operator_")
                        self.mutations.append(mutation)

    wrapper = MetadataWrapper(cst.parse_module(code))
    visitor = Visitor(fm.mutation_operators, get_ignored_lines(str(path), code, wrapper, None))
    tree = wrapper.visit(visitor)  # the wrapper's copy, which the mutations' nodes are in
    positions = wrapper.resolve(PositionProvider)
    out, seen = [], set()
    original_lines = code.splitlines(keepends=True)
    for mutation in visitor.mutations:
        func = mutation.contained_by_top_level_function
        if not isinstance(func, cst.FunctionDef):
            continue  # module/class level: mutmut does not mutate it either
        new = tree.deep_replace(mutation.original_node, mutation.mutated_node).code
        if new == code or new in seen:
            continue
        try:
            compile(new, str(path), "exec")
        except SyntaxError:
            continue
        seen.add(new)
        new_lines = new.splitlines(keepends=True)
        diff = "".join(difflib.unified_diff(original_lines, new_lines, n=0)).splitlines()[2:]
        line = positions[mutation.original_node].start.line
        span = positions[func]
        out.append(
            {
                "id": len(out),
                "line": line,
                "func": [span.start.line, span.end.line],
                "op": mutation.op,
                "diff": "\n".join(diff),
                "code": new,
            }
        )
    RESULTS.mkdir(exist_ok=True)
    for old in RESULTS.glob(f"mutants-{module}-*.json"):
        old.unlink()
    cache.write_text(json.dumps(out))
    return out


# ---------------------------------------------------------------------------- workspace


def make_workspace() -> Path:
    """A scratch copy of the working tree as it is (tracked and untracked, not ignored)."""
    files = (
        subprocess.run(
            ["git", "ls-files", "-co", "--exclude-standard", "-z"],
            cwd=ROOT,
            check=True,
            capture_output=True,
        )
        .stdout.decode()
        .split("\0")
    )
    if WORK.exists():
        shutil.rmtree(WORK)
    for rel in filter(None, files):
        src = ROOT / rel
        if src.is_file():
            (WORK / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, WORK / rel)
    return WORK


def _wipe_caches() -> None:
    shutil.rmtree(WORK / ".hypothesis", ignore_errors=True)
    for cache in list((WORK / "spec_fused").rglob("__pycache__")):
        shutil.rmtree(cache, ignore_errors=True)


# ---------------------------------------------------------------------------- fork server


def _serve() -> None:
    os.chdir(WORK)
    sys.path.insert(0, str(WORK))
    sys.dont_write_bytecode = True
    os.environ.update(PYTHONDONTWRITEBYTECODE="1", TRITON_INTERPRET="1")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import importlib

    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except Exception:
            pass
    from hypothesis import HealthCheck, Phase, settings

    # The fast profile's examples (conftest.py), seeded, with no example database (so no
    # result depends on the mutant before it) and no shrinking (a failure is a failure).
    settings.register_profile(
        "mutation",
        max_examples=20,
        deadline=None,
        database=None,
        phases=[Phase.explicit, Phase.reuse, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    os.environ["SPEC_FUSED_HYPOTHESIS_PROFILE"] = "mutation"
    leaked = [m for m in sys.modules if m == "spec_fused" or m.startswith("spec_fused.")]
    if leaked:
        raise SystemExit(f"preloading imported {leaked}: mutants would not be seen")


class _Contexts:
    """pytest plugin: each test in its own coverage context; the collection order."""

    def __init__(self, cov):
        self.cov, self.order = cov, []

    def pytest_collection_modifyitems(self, items):
        self.order = [item.nodeid for item in items]

    def pytest_runtest_setup(self, item):
        self.cov.switch_context(item.nodeid)


def _child(args: list[str], log: Path, coverage_of: Path | None, coverage_out: Path | None) -> int:
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    import pytest

    plugins = []
    cov = None
    if coverage_of is not None:
        import coverage

        cov = coverage.Coverage(data_file=None, include=[str(coverage_of)])
        cov.start()
        plugins.append(_Contexts(cov))
    rc = int(pytest.main(PYTEST_ARGS + args, plugins=plugins))
    if cov is not None:
        cov.stop()
        by_line = cov.get_data().contexts_by_lineno(str(coverage_of))
        coverage_out.write_text(json.dumps({"order": plugins[0].order, "lines": by_line}))
    import spec_fused

    if not spec_fused.__file__.startswith(str(WORK)):
        return 99  # imported the real tree, not the scratch copy
    return rc


def run_tests(
    args: list[str], log: Path, timeout: float, coverage_of=None, coverage_out=None
) -> tuple:
    """pytest ``args`` in a forked child: ("passed" | "failed" | "timeout" | "error", secs)."""
    _wipe_caches()
    sys.stdout.flush()
    sys.stderr.flush()
    start = time.monotonic()
    pid = os.fork()
    if pid == 0:
        try:
            os.setpgid(0, 0)
            rc = _child(args, log, coverage_of, coverage_out)
        except BaseException:  # noqa: BLE001 - the child must never return
            rc = 98
        os._exit(rc)
    while True:
        done, wstatus = os.waitpid(pid, os.WNOHANG)
        if done:
            rc = os.waitstatus_to_exitcode(wstatus)
            # pytest: 0 passed, 1 failed, 2 interrupted (e.g. an import error), 3 internal
            # error, 4 usage (a mutant that breaks the import: "found no collectors"), 5
            # nothing collected - the same tests passed unmutated, so each is the mutant's
            # doing and fails the tier; so does a signal (a segfault: a mutant that writes
            # out of bounds). 98/99: this driver's own failure.
            status = "passed" if rc == 0 else "error" if rc in (98, 99) else "failed"
            if rc < 0:
                status = "crashed"
            return status, time.monotonic() - start
        if time.monotonic() - start > timeout:
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            os.waitpid(pid, 0)
            return "timeout", time.monotonic() - start
        time.sleep(0.02)


def _first_failure(log: Path) -> str:
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return ""
    m = re.search(r"^(FAILED|ERROR) (\S+)", text, re.M)
    return m.group(2) if m else ""


def run(modules: list[str], ids, sample: float, seed: int, survivors: bool, confirm: bool) -> None:
    RESULTS.mkdir(exist_ok=True)
    plans = {}
    for module in modules:
        ms = mutants(module)
        chosen = ms
        path = RESULTS / f"results-{module}.json"
        if ids:
            chosen = [m for m in ms if m["id"] in ids]
        elif survivors:
            old = json.loads(path.read_text())["mutants"]
            chosen = [
                m
                for m in ms
                if old.get(str(m["id"]), {}).get("status") in ("survived", "no_coverage")
            ]
        elif sample < 1.0:
            chosen = sorted(
                random.Random(seed).sample(ms, round(len(ms) * sample)), key=lambda m: m["id"]
            )
        plans[module] = (ms, chosen)
    make_workspace()
    # a SIGTERM runs the finally clauses too: the scratch copy is restored
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    _serve()
    logs = RESULTS / "logs"
    logs.mkdir(exist_ok=True)
    try:
        for module, (ms, chosen) in plans.items():
            _run_module(
                module,
                ms,
                chosen,
                logs,
                sample,
                seed,
                partial=bool(ids or survivors),
                confirm=confirm,
            )
    finally:
        for module in plans:
            rel = MODULES[module][0]
            if (WORK / rel).read_text() != (ROOT / rel).read_text():
                raise SystemExit(f"scratch copy of {rel} was left mutated")
        if subprocess.run(["git", "diff", "--quiet", "--", "spec_fused/"], cwd=ROOT).returncode:
            print(
                "note: the real tree's spec_fused/ differs from HEAD (this driver only ever "
                "writes to the scratch copy)",
                file=sys.stderr,
            )


def _run_module(module, ms, chosen, logs, sample, seed, partial, confirm) -> None:
    rel, tests = MODULES[module]
    tests = [t for t in tests if (WORK / t).exists()]
    target = WORK / rel
    original = target.read_text()
    cov_out = logs / f"{module}-coverage.json"
    status, base_secs = run_tests(tests, logs / f"{module}-base.log", 900, target, cov_out)
    if status != "passed":
        raise SystemExit(f"{module}: unmutated tests {status}; see {logs}/{module}-base.log")
    cov = json.loads(cov_out.read_text())
    order = {nodeid: i for i, nodeid in enumerate(cov["order"])}
    by_line = {int(k): v for k, v in cov["lines"].items()}
    print(
        f"{module}: unmutated subset passes in {base_secs:.1f}s; running {len(chosen)} of "
        f"{len(ms)} mutants",
        flush=True,
    )
    limit = max(60.0, 3 * base_secs)
    path = RESULTS / f"results-{module}.json"
    results = json.loads(path.read_text()) if path.exists() and partial else {}
    results.setdefault("mutants", {})
    results.update(
        module=module,
        file=rel,
        total=len(ms),
        tests=tests,
        sample=sample,
        seed=seed,
        source_sha=hashlib.sha256(original.encode()).hexdigest()[:16],
    )
    selection_ok: dict = {}  # tuple(nodeids) -> passes unmutated?

    def selected(m) -> tuple:
        first, last = m["func"]
        ctxs = set()
        for line in range(first, last + 1):
            ctxs.update(by_line.get(line, ()))
        if "" in ctxs:  # ran outside any test (collection time): every test may see it
            return tuple(cov["order"])
        return tuple(sorted((c for c in ctxs if c in order), key=order.get))

    try:
        for m in chosen:
            log = logs / f"{module}-{m['id']}.log"
            sel = selected(m)
            start = time.monotonic()
            how = ""
            if not sel:
                status = "no_coverage"
            else:
                if sel not in selection_ok:
                    st, _ = run_tests(["-x", *sel], logs / f"{module}-selection.log", limit)
                    selection_ok[sel] = st == "passed"
                args = ["-x", *sel] if selection_ok[sel] else ["-x", *tests]
                target.write_text(m["code"])
                try:
                    status, _ = run_tests(args, log, limit)
                    how = f"{len(sel)} selected" if selection_ok[sel] else "all"
                    if status == "passed" and selection_ok[sel] and confirm:
                        status, _ = run_tests(["-x", *tests], log, limit)
                        how = "all"
                finally:
                    target.write_text(original)
                status = {"failed": "killed", "passed": "survived", "crashed": "killed"}.get(
                    status, status
                )
            entry = {
                "line": m["line"],
                "op": m["op"],
                "diff": m["diff"],
                "status": status,
                "tests": how,
                "seconds": round(time.monotonic() - start, 1),
            }
            if status == "killed":
                entry["by"] = _first_failure(log)
            if status != "error":
                log.unlink(missing_ok=True)
            results["mutants"][str(m["id"])] = entry
            last = m["diff"].splitlines()[-1].strip() if m["diff"] else ""
            print(
                f"{module}:{m['id']:<4} L{m['line']:<4} {status:<11} {entry['seconds']:5.1f}s "
                f"{last[:80]}",
                flush=True,
            )
            path.write_text(json.dumps(results, indent=1))
    finally:
        target.write_text(original)


# ---------------------------------------------------------------------------- planted faults

# name -> (file, old text, new text, how many times old must occur): faults the fast tier
# must catch, planted in their own scratch copy of the tree.
PLANTED = {
    # a one-row ring: launch k+1 overwrites the row launch k's reader may still be copying
    "one_row_ring": ("spec_fused/kernels/host_ring.py", "stamp & 1", "stamp & 0", None),
    # the WAR barrier dropped when the backends opt out of host lengths: establish() holds
    # the table's barrier exemption to the installed worker only while host_source is
    # still the table's
    "barrier_skipped_unless_host_from_table": (
        "spec_fused/caps.py",
        '        caps.barrier_source == "table"\n        and not caps.needs_war_barrier\n',
        '        caps.host_source == "table"\n        and caps.barrier_source == "table"\n'
        "        and not caps.needs_war_barrier\n",
        1,
    ),
}
FAST_TIER = [
    "-m",
    "pytest",
    "-q",
    "-p",
    "no:cacheprovider",
    "-m",
    "not scheduler and not gpu and not e2e",
    "--ignore=tests/test_scheduler_tier.py",
    "--ignore=tests/e2e",
    "tests",
]


def plant(names: list[str]) -> None:
    """Each planted fault in a scratch copy; the fast tier, exactly as documented, must fail."""
    global WORK
    WORK = WORK.with_name("spec_fused_planted")
    for name in names:
        rel, old, new, count = PLANTED[name]
        make_workspace()
        target = WORK / rel
        text = target.read_text()
        found = text.count(old)
        if not found or (count is not None and found != count):
            raise SystemExit(f"{name}: {old!r} occurs {found} times in {rel}")
        target.write_text(text.replace(old, new))
        env = dict(
            os.environ,
            TRITON_INTERPRET="1",
            SPEC_FUSED_HYPOTHESIS_PROFILE="fast",
            PYTHONDONTWRITEBYTECODE="1",
        )
        where = subprocess.run(
            [sys.executable, "-c", "import spec_fused; print(spec_fused.__file__)"],
            cwd=WORK,
            env=env,
            capture_output=True,
            text=True,
        ).stdout.strip()
        if not where.startswith(str(WORK)):
            raise SystemExit(f"the scratch copy imports {where}, not its own spec_fused")
        start = time.monotonic()
        proc = subprocess.run(
            [sys.executable, *FAST_TIER], cwd=WORK, env=env, capture_output=True, text=True
        )
        failed = re.findall(r"^FAILED (\S+)", proc.stdout, re.M)
        summary = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
        verdict = "CAUGHT" if proc.returncode != 0 else "MISSED"
        print(
            f"{name}: {verdict} (rc {proc.returncode}, {time.monotonic() - start:.0f}s) {summary}"
        )
        for nodeid in failed:
            print(f"    FAILED {nodeid}")
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / f"planted-{name}.log").write_text(proc.stdout + proc.stderr)


# ---------------------------------------------------------------------------- report


def load_equivalent(path: Path | None) -> dict:
    """``module id reason`` lines (``#`` comments): the survivors judged equivalent."""
    eq: dict = {}
    if path is None or not path.exists():
        return eq
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip() if line.lstrip().startswith("#") else line.strip()
        if not line:
            continue
        module, mid, *reason = line.split(maxsplit=2)
        eq[(module, int(mid))] = reason[0] if reason else ""
    return eq


def report(equivalent: Path | None, verbose: bool) -> None:
    eq = load_equivalent(equivalent)
    for module in MODULES:
        path = RESULTS / f"results-{module}.json"
        if not path.exists():
            continue
        r = json.loads(path.read_text())
        counts: dict = {}
        for m in r["mutants"].values():
            counts[m["status"]] = counts.get(m["status"], 0) + 1
        ran = len(r["mutants"])
        killed = counts.get("killed", 0) + counts.get("timeout", 0)
        alive = [
            int(k) for k, m in r["mutants"].items() if m["status"] not in ("killed", "timeout")
        ]
        equiv = [i for i in alive if (module, i) in eq]
        non_eq = ran - len(equiv)
        score = 100.0 * killed / non_eq if non_eq else 100.0
        print(
            f"== {module}: {r['total']} mutants, {ran} run: {counts}; equivalent "
            f"{len(equiv)}; score {killed}/{non_eq} = {score:.1f}%"
        )
        for i in sorted(alive):
            m = r["mutants"][str(i)]
            tag = "equivalent" if (module, i) in eq else m["status"]
            if tag == "equivalent" and not verbose:
                continue
            print(
                f"  [{i}] line {m['line']} {tag} ({m['op']})"
                + (f": {eq[(module, i)]}" if (module, i) in eq else "")
            )
            print("    " + m["diff"].replace("\n", "\n    "))


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    ls = sub.add_parser("list")
    ls.add_argument("modules", nargs="*", default=list(MODULES))
    sh = sub.add_parser("show")
    sh.add_argument("module", choices=MODULES)
    sh.add_argument("ids", nargs="+", type=int)
    r = sub.add_parser("run")
    r.add_argument("modules", nargs="*", default=list(MODULES))
    r.add_argument("--ids", nargs="+", type=int)
    r.add_argument("--survivors", action="store_true", help="re-run the last run's survivors")
    r.add_argument(
        "--confirm",
        action="store_true",
        help="a mutant the selected tests miss runs the whole subset too",
    )
    r.add_argument("--sample", type=float, default=1.0, help="a seeded fraction of the mutants")
    r.add_argument("--seed", type=int, default=20260101)
    pl = sub.add_parser("plant", help="planted faults the fast tier must fail on")
    pl.add_argument("names", nargs="*", default=list(PLANTED))
    rep = sub.add_parser("report")
    rep.add_argument(
        "--equivalent", type=Path, default=ROOT / "scripts" / "mutation_equivalent.txt"
    )
    rep.add_argument("-v", "--verbose", action="store_true")
    a = p.parse_args(argv)
    if a.cmd == "list":
        for module in a.modules:
            ms = mutants(module)
            ops: dict = {}
            for m in ms:
                ops[m["op"]] = ops.get(m["op"], 0) + 1
            print(f"{module}: {len(ms)} mutants {ops}")
    elif a.cmd == "show":
        ms = mutants(a.module)
        for i in a.ids:
            print(f"[{i}] line {ms[i]['line']} ({ms[i]['op']})\n{ms[i]['diff']}\n")
    elif a.cmd == "run":
        for module in a.modules:
            if module not in MODULES:
                p.error(f"unknown module {module!r}; one of {list(MODULES)}")
        run(a.modules, a.ids, a.sample, a.seed, a.survivors, a.confirm)
    elif a.cmd == "plant":
        plant(a.names)
    else:
        report(a.equivalent, a.verbose)


if __name__ == "__main__":
    main()
