"""Write the README's generated tables from their sources, so no figure there is typed.

* ``impact``: where spec_fused helps, per release range x attention backend x algorithm
  (``spec_fused.tools.impact``, held to every release's source by tests/tools/test_impact.py);
* ``results``: the committed CPU host-cost table and the engine A/B's parity, in one line
  (the full tables: ``python -m bench.report bench/results/cpu``).

A maintainer's step, run by hand after committing new results: ``./run.sh bench`` writes
``bench/results/<device>/`` and never the README. The compatibility table has its own
command (``python scripts/compat_tier.py table``).

    python scripts/readme_tables.py            # rewrite both sections of README.md
    python scripts/readme_tables.py --check    # exit 1 if README.md is not current
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def impact_table() -> str:
    from spec_fused.releases import TESTED_RELEASES
    from spec_fused.tools import impact

    return impact.render_markdown(impact.ranged_rows(TESTED_RELEASES))


def results_tables() -> str:
    """The CPU figure that means something - the relay's host µs against SGLang's, the
    production CPU path and the null seam - and the engine A/B's parity, in one line."""
    import json

    from bench import report

    cpu = ROOT / "bench" / "results" / "cpu"
    import re

    lines = report.host_table(cpu / "host_overhead.json").splitlines()
    lines[0] = "Host µs per relay step (median; × upstream: the median of per-round ratios)"
    out = [re.sub(r"; worst of the best-of-rounds ratios .*$", "", line) for line in lines]
    # One algorithm's rows: EAGLE's take the same relay path (host_overhead.json has both,
    # and the worst/median lines below cover every cell).
    out = [line for line in out if not line.startswith("| EAGLE |")]
    engine = json.loads((cpu / "ab_engine.json").read_text())
    cells = engine["summary"]
    same = all(c.get("parity") in (True, "True") for c in cells)
    out = ["\n".join(out)]
    out.append(
        f"\nab_engine on CPU (toy Llama, {engine['plan']['rounds']} rounds, concurrency "
        f"{', '.join(str(c['concurrency']) for c in cells)}): "
        + (
            "tokens identical and the relay on every step of B in every cell"
            if same
            else "**parity failed**: see bench/results/cpu/ab_engine.md"
        )
        + "; a parity check, not a throughput result."
    )
    out.append(f"\n_{report.versions_line(cpu / 'host_overhead.json')}_")
    return "\n".join(out)


SECTIONS = {"impact": impact_table, "results": results_tables}


def replace(text: str, name: str, body: str) -> str:
    begin, end = f"<!-- {name}-table:begin -->", f"<!-- {name}-table:end -->"
    if begin not in text or end not in text:
        raise SystemExit(f"README.md has no {begin} ... {end} markers")
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{begin}\n{body}\n{end}{tail}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python scripts/readme_tables.py", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--check", action="store_true")
    parser.add_argument("--readme", default=str(ROOT / "README.md"))
    args = parser.parse_args(argv)
    readme = Path(args.readme)
    text = new = readme.read_text()
    for name, render in SECTIONS.items():
        new = replace(new, name, render())
    if args.check:
        if new != text:
            print(f"{readme} is not current: run python scripts/readme_tables.py", file=sys.stderr)
            return 1
        return 0
    readme.write_text(new)
    print(f"{readme}: {', '.join(SECTIONS)} tables written")
    return 0


if __name__ == "__main__":
    sys.exit(main())
