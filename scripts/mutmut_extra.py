"""What mutmut does not do here, around ``mutmut run`` ([tool.mutmut] in pyproject.toml;
method and results in docs/mutation.md).

* ``sample``: the recorded run's mutant names, for ``mutmut run``: every mutant of the
  smaller modules, a seeded sample (``SAMPLE``, ``SEED``) of the four whose mutants run
  the most tests (all of them take hours on 2 cores).
* ``report``: per module, killed / (run - equivalent); lists the survivors not in
  scripts/mutation_equivalent.txt (``mutant-name reason``, one a line).

mutmut does not mutate decorated functions (its trampolines cannot wrap them): the five
``@property`` / setter bodies of caps.py and step_launcher.py are left to the tests.

    .venv/bin/mutmut run --max-children 2 $(.venv/bin/python scripts/mutmut_extra.py sample)
    .venv/bin/python scripts/mutmut_extra.py report
"""

from __future__ import annotations

import argparse
import json
import os
import random
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: mutmut's own dependency
    import toml as tomllib  # type: ignore[no-redef]

ROOT = Path(__file__).resolve().parent.parent
MUTANTS = ROOT / "mutants"
EQUIVALENT = ROOT / "scripts" / "mutation_equivalent.txt"
CONFIG = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mutmut"]
SAMPLE = {  # module -> the fraction of its mutants in the recorded run (others: all)
    "spec_fused/caps.py": 0.25,
    "spec_fused/relay.py": 0.25,
    "spec_fused/kernels/step_launcher.py": 0.25,
    "spec_fused/integration/sglang_patch.py": 0.25,
}
SEED = 20261206


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


def report(verbose: bool) -> None:
    from mutmut.stats import status_by_exit_code

    equivalent = {}
    for line in EQUIVALENT.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, why = line.partition(" ")
            equivalent[name] = why.strip()
    known: set[str] = set()
    for path in CONFIG["only_mutate"]:
        meta = json.loads((MUTANTS / f"{path}.meta").read_text())["exit_code_by_key"]
        known |= set(meta)
        status = {k: status_by_exit_code[meta[k]] for k in sample(path)}
        run = {k: s for k, s in status.items() if s != "not checked"}
        killed = [k for k, s in run.items() if s in ("killed", "timeout", "segfault")]
        alive = sorted(k for k in run if k not in killed)
        eq = [k for k in alive if k in equivalent]
        score = 100.0 * len(killed) / max(1, len(run) - len(eq))
        print(
            f"{path}: {len(status)} of {len(meta)} mutants, {len(run)} run, {len(killed)} "
            f"killed, {len(eq)} equivalent: {len(killed)}/{len(run) - len(eq)} = {score:.1f} %"
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
    r = sub.add_parser("report", help="per-module scores and the survivors")
    r.add_argument("-v", "--verbose", action="store_true", help="list the equivalents too")
    a = p.parse_args()
    if a.cmd == "sample":
        print("\n".join(name for path in CONFIG["only_mutate"] for name in sample(path)))
    else:
        report(a.verbose)


if __name__ == "__main__":
    main()
