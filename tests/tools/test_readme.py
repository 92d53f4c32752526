"""The README says what the code and the committed results say: its generated tables are
current (the impact table from spec_fused/tools/impact.py, the results from bench/results/cpu,
the compatibility table from tests/compat/results.json), each row of the impact table says
what its costs mean, and it stays a front door: short prose, `pip install` early, the
sections in the order a user needs them, and every link it gives leads somewhere."""

import importlib.util
import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"

MAX_PROSE_WORDS = 1800
PIP_INSTALL_WITHIN = 600
# The front door's sections, in order (the README's ## headings must start with these).
SECTIONS = [
    "What it changes on your server",
    "GPU status",
    "Install and enable",
    "A/B it",
    "The two commands",
    "Compatibility",
    "Troubleshooting",
]


def _load(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def prose_words(text: str) -> list:
    """The words a reader reads as prose: not inside HTML comments, fenced code blocks or
    tables (lines starting with ``|``); a word has at least one letter or digit."""
    text = re.sub(r"<!--.*?-->", " ", text, flags=re.S)
    kept, fenced = [], False
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("```"):
            fenced = not fenced
            continue
        if fenced or stripped.startswith("|"):
            continue
        kept.append(line)
    return [w for w in " ".join(kept).split() if re.search(r"\w", w)]


def test_prose_words_skips_tables_code_and_comments():
    text = (
        "# Title here\n\none two `three`\n\n| a | b |\n|---|---|\n| c | d |\n\n"
        "```bash\npip install x\n```\n<!-- a\ncomment -->\n- four -- five\n"
    )
    assert prose_words(text) == ["Title", "here", "one", "two", "`three`", "four", "five"]


def test_the_readme_is_a_short_front_door_with_pip_install_early():
    words = prose_words(README.read_text())
    assert len(words) <= MAX_PROSE_WORDS, f"README prose is {len(words)} words"
    joined = " ".join(words)
    assert "pip install" in joined, "README prose never says pip install"
    position = len(joined[: joined.index("pip install")].split())
    assert position <= PIP_INSTALL_WITHIN, f"`pip install` first at prose word {position}"


def test_the_readmes_sections_come_in_the_front_doors_order():
    headings = [h.strip() for h in re.findall(r"^## (.+)$", README.read_text(), flags=re.M)]
    found = [next((i for i, h in enumerate(headings) if h.startswith(s)), None) for s in SECTIONS]
    assert None not in found, dict(zip(SECTIONS, found, strict=True))
    assert found == sorted(found), headings


def _anchors(path: Path) -> set:
    """GitHub's heading anchors and explicit ``<a id=...>`` targets of a markdown file."""
    text = path.read_text()
    ids = set(re.findall(r'<a id="([^"]+)"', text))
    for heading in re.findall(r"^#+ (.+)$", text, flags=re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        ids.add(slug)
    return ids


def test_every_relative_link_leads_somewhere():
    for doc in (README, ROOT / "docs" / "design.md", ROOT / "bench" / "README.md"):
        for target in re.findall(r"\]\(([^)\s]+)\)", doc.read_text()):
            if re.match(r"[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            dest = (doc.parent / path).resolve() if path else doc
            assert dest.exists(), f"{doc.name}: {target}: no such file"
            if anchor:
                assert anchor in _anchors(dest), f"{doc.name}: {target}: no such anchor"


def test_the_readmes_generated_tables_are_current():
    assert _load("readme_tables").main(["--check"]) == 0


def test_each_impact_row_says_what_it_saves():
    """Where a backend reads host lengths: nothing by default (SGLang's relay until a GPU
    measures the fused step level), and what relaying it would save: the pool copy (on
    FlashInfer the host still waits later in the step, except where DFLASH's own bound
    takes that wait away: 2 host waits a step -> 1); where every backend opts out:
    nothing that matters. (tests/tools/test_impact.py holds the rows to upstream's source.)"""
    text = README.read_text()
    table = text.split("<!-- impact-table:begin -->")[1].split("<!-- impact-table:end -->")[0]
    header, *rows = [line for line in table.splitlines() if line.startswith("| ")]
    columns = [c.strip() for c in header.strip("|").split("|")]
    assert len(rows) >= 6
    for line in rows:
        row = dict(zip(columns, (c.strip() for c in line.strip("|").split("|")), strict=True))
        saves = row["what relaying it changes per step"]
        if row["host lengths"].startswith("read"):
            assert row["relayed"] == "no: not measured level yet", line
            bound = "DFLASH's own bound" in row["notes"]
            assert ("host waits per step 2 → 1" in saves) is bound, line
            assert bound or "8·pool-byte D2H → 8·n up, 8·(n+1) down" in saves, line
            assert ("later" in saves) is ("FlashInfer blocks" in row["notes"]), line
        else:
            assert row["host lengths"] == "opted out" and row["relayed"] == "yes", line
            assert saves.startswith("nothing that"), line


def test_the_readme_stays_within_its_budget():
    assert len(README.read_text()) <= 12_000


def test_the_readmes_compatibility_table_is_the_committed_results():
    tier = _load("compat_tier")
    table = tier.render(json.loads((ROOT / "tests" / "compat" / "results.json").read_text()))
    assert table in README.read_text()
