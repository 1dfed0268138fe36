"""The package's own house rules: no import circle inside a package; examples use only
the public API."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "jaxbridge"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, modules: set[str]) -> set[str]:
    """The jaxbridge modules `path` imports: every import statement, also the ones
    under ``if TYPE_CHECKING:`` and inside functions (a circle hidden in a function
    is still a circle in the design)."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[:len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            # `from . import x` imports the module x when there is one.
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                       for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in modules:  # a name inside a module
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def _graph() -> dict[str, set[str]]:
    paths = sorted(PACKAGE.rglob("*.py"))
    modules = {_module_name(p) for p in paths}
    return {_module_name(p): _imports(p, modules) for p in paths}


def _same_package(a: str, b: str) -> bool:
    return a.rpartition(".")[0] == b.rpartition(".")[0]


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected component of more than one module (Tarjan), among the
    edges between modules of one package."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if not _same_package(v, w):
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_import_graph_is_read_right():
    graph = _graph()
    assert "jaxbridge._foreign.signature" in graph["jaxbridge._foreign.api"]
    assert "jaxbridge._core.pair" in graph["jaxbridge._foreign.api"]
    assert _circles({"p.a": {"p.b"}, "p.b": {"p.c"}, "p.c": {"p.a"}, "p.d": {"p.a"}}) \
        == [["p.a", "p.b", "p.c"]]


def test_no_import_circle_inside_a_package():
    circles = _circles(_graph())
    assert not circles, f"import circles inside a package: {circles}"


def test_examples_import_only_the_public_api():
    private = []
    for path in sorted((ROOT / "examples").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] + [f"{node.module}.{a.name}" for a in node.names] \
                if isinstance(node, ast.ImportFrom) and not node.level else []
            private += [f"{path.relative_to(ROOT)}: {n}" for n in names
                        if n.startswith("jaxbridge") and any(
                            part.startswith("_") for part in n.split(".")[1:])]
    assert not private, f"examples importing private jaxbridge modules: {private}"
