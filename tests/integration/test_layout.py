"""The package's layout holds: the serving core never imports a tool, and no two
spec_fused modules import each other, at module level or inside a function.

Read from the source (AST), not by importing: an import inside a function counts, since it
runs the moment that function does. The core is every module outside ``spec_fused.tools``
(and ``spec_fused.__main__``, the command's entry point)."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "spec_fused"
TOOLS = "spec_fused.tools"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict:
    """``{module name: path}`` of every spec_fused module."""
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _imports(name: str, path: Path, known) -> dict:
    """``{imported spec_fused module: first line}`` of one module, function-local imports
    included (``from package import name`` counts as the module ``package.name`` where
    that is one, else as the package)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = {}

    def add(target, line):
        if target in known and target != name:
            found.setdefault(target, line)

    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                full = f"{base}.{alias.name}"
                add(full if full in known else base, node.lineno)
    return found


def _graph() -> dict:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def _is_tool(name: str) -> bool:
    return name == TOOLS or name.startswith(TOOLS + ".") or name == "spec_fused.__main__"


def _cycles(graph: dict) -> list:
    """Every strongly connected group of more than one module (Tarjan), sorted."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


def test_the_scan_sees_the_package():
    graph = _graph()
    assert {
        "spec_fused.relay",
        "spec_fused.caps",
        "spec_fused.tools.doctor",
        "spec_fused.kernels.backend",
    } <= set(graph)
    assert "spec_fused.tools.doctor" in graph["spec_fused.tools.cli"]  # function-local
    assert "spec_fused.caps" in graph["spec_fused.relay"]


def test_the_core_never_imports_a_tool():
    graph = _graph()
    bad = [
        f"{name} imports {target} (line {line})"
        for name, targets in sorted(graph.items())
        if not _is_tool(name)
        for target, line in sorted(targets.items())
        if _is_tool(target)
    ]
    assert bad == []


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 1}, "d": {"a": 1}}) == [
        ["a", "b", "c"]
    ]
    assert _cycles({"a": {"b": 1}, "b": {}}) == []


def test_no_import_cycle_among_spec_fused_modules():
    assert _cycles(_graph()) == []


def _reads_the_environment(path: Path) -> list:
    """Lines of ``path`` that touch ``os.environ`` or call ``os.getenv``/``getenv``."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv"):
            lines.append(node.lineno)
        elif isinstance(node, ast.Name) and node.id in ("environ", "getenv"):
            lines.append(node.lineno)
        elif (
            isinstance(node, ast.ImportFrom)
            and node.module == "os"
            and any(a.name in ("environ", "getenv") for a in node.names)
        ):
            lines.append(node.lineno)
    return lines


def test_only_the_settings_module_reads_the_environment():
    readers = {
        name: lines for name, path in _modules().items() if (lines := _reads_the_environment(path))
    }
    assert set(readers) == {"spec_fused.settings"}, readers


def test_every_variable_the_package_or_readme_names_is_declared_in_the_settings():
    import re

    from spec_fused import settings

    declared = {s.name for s in settings.SETTINGS}
    root = PACKAGE.parent
    sources = [*PACKAGE.rglob("*.py"), root / "README.md"]  # what a user sees
    named = {
        m
        for p in sources
        if p.exists()
        for m in re.findall(r"\bSPEC_FUSED_[A-Z][A-Z_]*[A-Z]\b", p.read_text("utf-8"))
    }
    assert named and named <= declared, sorted(named - declared)
