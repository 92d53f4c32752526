"""What mutmut does not do here, around ``mutmut run`` ([tool.mutmut] in pyproject.toml;
method and results in docs/mutation.md).

* ``sample``: the recorded run's mutant names, for ``mutmut run``: every mutant of the
  smaller modules, a seeded sample (``SAMPLE``, ``SEED``) of the four whose mutants run
  the most tests (all of them take hours on 2 cores).
* ``decorated``: mutmut's trampolines skip decorated functions (``@property``, the
  launcher's ``backend`` setter). Their mutants - mutmut's operators, that skip lifted -
  are applied one at a time as plain source in a scratch copy of ``spec_fused/`` and
  ``tests/`` (never the real tree) and run, ``-x``, fastest first, against the tests
  mutmut's stats tie to their class. After ``mutmut run``; writes mutants/decorated.json.
* ``report``: per module, killed / (run - equivalent) over both; lists the survivors
  not in scripts/mutation_equivalent.txt (``mutant-name reason``, one a line).

    .venv/bin/mutmut run --max-children 2 $(.venv/bin/python scripts/mutmut_extra.py sample)
    .venv/bin/python scripts/mutmut_extra.py decorated
    .venv/bin/python scripts/mutmut_extra.py report
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: mutmut's own dependency
    import toml as tomllib  # type: ignore[no-redef]

ROOT = Path(__file__).resolve().parent.parent
MUTANTS = ROOT / "mutants"
DECORATED = MUTANTS / "decorated.json"
EQUIVALENT = ROOT / "scripts" / "mutation_equivalent.txt"
CONFIG = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mutmut"]
SAMPLE = {  # module -> the fraction of its mutants in the recorded run (others: all)
    "spec_fused/caps.py": 0.25,
    "spec_fused/relay.py": 0.25,
    "spec_fused/kernels/step_launcher.py": 0.25,
    "spec_fused/integration/sglang_patch.py": 0.25,
}
SEED = 20261206


def _module(path: str) -> str:
    return path.removesuffix(".py").replace("/", ".")


def sample(path: str) -> list[str]:
    """mutmut's names for the recorded run's mutants of ``path`` (its own generator, no
    mutants/ needed): all, or ``SAMPLE[path]`` of them drawn with ``SEED``."""
    from mutmut.mutation.file_mutation import mutate_file_contents
    from mutmut.utils.format_utils import get_mutant_name

    os.chdir(ROOT)  # mutmut reads its configuration from the working directory
    mutated = mutate_file_contents(path, (ROOT / path).read_text())
    names = sorted(get_mutant_name(Path(path), name) for name in mutated.mutant_names)
    if path in SAMPLE:
        names = sorted(random.Random(SEED).sample(names, round(SAMPLE[path] * len(names))))
    return names


def decorated_mutants(path: str) -> list[dict]:
    """mutmut's mutants inside the decorated functions of ``path`` that it skips (all but a
    lone ``@staticmethod`` / ``@classmethod``), in source order, each as a whole file."""
    import libcst as cst
    from mutmut.mutation import file_mutation as fm
    from mutmut.mutation.pragma_handling import get_ignored_lines

    def skipped(node) -> bool:
        if not isinstance(node, cst.FunctionDef) or not node.decorators:
            return False
        only = node.decorators[0].decorator if len(node.decorators) == 1 else None
        return not (isinstance(only, cst.Name) and only.value in ("staticmethod", "classmethod"))

    class Visitor(fm.MutationVisitor):
        def _skip_node_and_children(self, node):
            return False if skipped(node) else super()._skip_node_and_children(node)

    code = (ROOT / path).read_text()
    wrapper = cst.MetadataWrapper(cst.parse_module(code))
    visitor = Visitor(fm.mutation_operators, get_ignored_lines(path, code, wrapper, None))
    tree = wrapper.visit(visitor)  # the mutations' nodes are the wrapper's copy
    owner = {
        id(f): c.name.value for c in tree.body if isinstance(c, cst.ClassDef) for f in c.body.body
    }
    out: list[dict] = []
    for mutation in visitor.mutations:
        func = mutation.contained_by_top_level_function
        if not skipped(func):
            continue
        new = tree.deep_replace(mutation.original_node, mutation.mutated_node).code
        cls = owner.get(id(func))
        name = f"{_module(path)}.{cls + '.' if cls else ''}{func.name.value}@"
        name += cst.Module([]).code_for_node(func.decorators[-1].decorator)
        name += f"#{sum(m['name'].startswith(name + '#') for m in out) + 1}"
        diff = difflib.unified_diff(code.splitlines(), new.splitlines(), lineterm="", n=0)
        out.append({"name": name, "cls": cls, "diff": "\n".join(list(diff)[2:]), "code": new})
    return out


def run_decorated(timeout: float) -> None:
    stats = json.loads((MUTANTS / "mutmut-stats.json").read_text())
    by_func, durations = stats["tests_by_mangled_function_name"], stats["duration_by_test"]
    scratch = Path(tempfile.mkdtemp(prefix="spec_fused_mutmut_"))
    for part in ("spec_fused", "tests"):
        shutil.copytree(ROOT / part, scratch / part, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy2(ROOT / "pyproject.toml", scratch)
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    run = dict(cwd=scratch, env=env, capture_output=True, text=True)
    where = subprocess.run(
        [sys.executable, "-c", "import spec_fused as m; print(m.__file__)"], **run
    )
    if not where.stdout.startswith(str(scratch)):
        raise SystemExit(f"the scratch copy imports {where.stdout.strip()}, not its own")
    pytest = [sys.executable, "-m", "pytest", "-x", "-q", *CONFIG["pytest_add_cli_args"]]
    todo = []
    for path in CONFIG["only_mutate"]:
        for m in decorated_mutants(path):
            # mutmut's names for the functions of the class (or of the module)
            prefix = _module(path) + (f".x\u01c1{m['cls']}\u01c1" if m["cls"] else ".")
            tests = {t for f, ts in by_func.items() if f.startswith(prefix) for t in ts}
            todo.append((path, m, sorted(tests, key=lambda t: (durations.get(t, 0.0), t))))
    clean = subprocess.run(pytest + sorted({t for *_, ts in todo for t in ts}), **run)
    if clean.returncode:
        raise SystemExit(f"the tests fail unmutated:\n{clean.stdout[-3000:]}")
    results = {}
    try:
        for path, m, tests in todo:
            original = (ROOT / path).read_text()
            (scratch / path).write_text(m["code"])
            try:
                rc = subprocess.run(pytest + tests, timeout=timeout, **run).returncode
                # pytest: 0 passed; 1 failed, 2 a collection error, 3 internal error, < 0 a
                # signal: the mutant's doing; 4 a usage error, 5 nothing ran: ours
                status = {0: "survived", 4: "error", 5: "no tests"}.get(rc, "killed")
            except subprocess.TimeoutExpired:
                status = "timeout"
            finally:
                (scratch / path).write_text(original)
            status = status if tests else "no tests"
            results[m["name"]] = {"status": status, "diff": m["diff"]}
            print(f"{status:9} {len(tests):4} tests  {m['name']}", flush=True)
            DECORATED.write_text(json.dumps(results, indent=1))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def report(verbose: bool) -> None:
    from mutmut.stats import status_by_exit_code

    equivalent = {}
    for line in EQUIVALENT.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, why = line.partition(" ")
            equivalent[name] = why.strip()
    decorated = json.loads(DECORATED.read_text()) if DECORATED.exists() else {}
    known = set(decorated)
    for path in CONFIG["only_mutate"]:
        meta = json.loads((MUTANTS / f"{path}.meta").read_text())["exit_code_by_key"]
        known |= set(meta)
        status = {k: status_by_exit_code[meta[k]] for k in sample(path)}
        ours = {k: v["status"] for k, v in decorated.items() if k.startswith(_module(path) + ".")}
        status.update(ours)
        run = {k: s for k, s in status.items() if s != "not checked"}
        killed = [k for k, s in run.items() if s in ("killed", "timeout", "segfault")]
        alive = sorted(k for k in run if k not in killed)
        eq = [k for k in alive if k in equivalent]
        score = 100.0 * len(killed) / max(1, len(run) - len(eq))
        print(
            f"{path}: {len(status)} of {len(meta) + len(ours)} mutants ({len(ours)} in "
            f"decorated functions), {len(run)} run, {len(killed)} killed, {len(eq)} "
            f"equivalent: {len(killed)}/{len(run) - len(eq)} = {score:.1f} %"
        )
        for k in alive:
            if k not in equivalent or verbose:
                print(f"    {run[k]:9} {k}" + (f": {equivalent[k]}" if k in equivalent else ""))
    if set(equivalent) - known:
        print(f"listed as equivalent but no such mutant: {sorted(set(equivalent) - known)}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("sample", help="the recorded run's mutant names, for mutmut run")
    d = sub.add_parser("decorated", help="run the decorated functions' mutants")
    d.add_argument("--timeout", type=float, default=900.0, help="seconds per mutant")
    r = sub.add_parser("report", help="per-module scores and the survivors")
    r.add_argument("-v", "--verbose", action="store_true", help="list the equivalents too")
    a = p.parse_args()
    if a.cmd == "sample":
        print("\n".join(name for path in CONFIG["only_mutate"] for name in sample(path)))
    elif a.cmd == "decorated":
        run_decorated(a.timeout)
    else:
        report(a.verbose)


if __name__ == "__main__":
    main()
