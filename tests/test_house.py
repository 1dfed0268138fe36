"""The package's own house rules: no import circle inside a package; examples use only
the public API; JAX internals only in _core/jaxapi.py; no module reads another module's
private names; every repository path a comment or docstring names exists; private
functions take at most 8 parameters, and a function over 80 lines says why."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

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



# ---------------------------------------------------------------- JAX internals: one module
JAXAPI = PACKAGE / "_core" / "jaxapi.py"
# Modules whose names say they are JAX's internals or extension points; public JAX
# (jax.numpy, jax.lax, jax.tree_util, jax.ffi, jax.experimental...) is fine anywhere.
PRIVATE_JAX = re.compile(r"^(jax\._src|jax\.core|jax\.interpreters|jax\.extend|jaxlib)(\.|$)")


def _dotted(node: ast.AST) -> str | None:
    """`a.b.c` of an attribute chain on a name, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return ".".join([node.id, *reversed(parts)]) if isinstance(node, ast.Name) else None


def private_jax_uses(source: str) -> list[str]:
    """The JAX internals `source` imports or reads (`jax.core.Tracer`, `import jaxlib`)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names = [node.module or ""]
        elif isinstance(node, ast.Attribute):
            names = [_dotted(node) or ""]
        else:
            continue
        found += [f"line {node.lineno}: {n}" for n in names if PRIVATE_JAX.match(n)]
    return found


def test_the_private_jax_check_sees_each_way_in():
    assert private_jax_uses("from jax._src import core") == ["line 1: jax._src"]
    assert private_jax_uses("import jax.extend.core as c") == ["line 1: jax.extend.core"]
    assert private_jax_uses("import jaxlib") == ["line 1: jaxlib"]
    assert private_jax_uses("def f(x):\n    return isinstance(x, jax.core.Tracer)") \
        == ["line 2: jax.core.Tracer", "line 2: jax.core"]
    assert private_jax_uses("import jax.numpy as jnp\nfrom jax import lax\njax.ffi.ffi_call") \
        == []


def test_jax_internals_are_used_only_in_jaxapi():
    used = {str(p.relative_to(ROOT)): uses for p in sorted(PACKAGE.rglob("*.py"))
            if p != JAXAPI and (uses := private_jax_uses(p.read_text()))}
    assert not used, ("JAX internals outside jaxbridge/_core/jaxapi.py (give jaxapi a named "
                      f"function for them): {used}")


# ---------------------------------------------------------------- private names stay home
def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _module_bindings(tree: ast.AST, name: str, is_package: bool, modules: set[str]
                     ) -> tuple[dict[str, str], list[str]]:
    """(local name -> jaxbridge module it is bound to, private names imported with
    `from module import _name` where `_name` is not a submodule)."""
    package = name if is_package else name.rpartition(".")[0]
    bound: dict[str, str] = {}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name in modules:
                    bound[a.asname or a.name.split(".")[0]] = a.name if a.asname \
                        else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            if base not in modules:
                continue
            for a in node.names:
                if f"{base}.{a.name}" in modules:
                    bound[a.asname or a.name] = f"{base}.{a.name}"
                elif _is_private(a.name):
                    found.append(f"line {node.lineno}: from {base} import {a.name}")
    return bound, found


def private_name_uses(source: str, name: str, modules: set[str],
                      is_package: bool = False) -> list[str]:
    """Where the module `name` (source `source`) imports or reads a private name of
    another jaxbridge module: `from .x import _y`, `x._y` (private modules are fine:
    `from . import _loops`)."""
    tree = ast.parse(source)
    bound, found = _module_bindings(tree, name, is_package, modules)
    for node in ast.walk(tree):
        dotted = _dotted(node) if isinstance(node, ast.Attribute) else None
        if dotted is None or dotted.split(".")[0] not in bound:
            continue
        module, *attrs = dotted.split(".")
        module = bound[module]
        for attr in attrs:
            if f"{module}.{attr}" not in modules:
                if _is_private(attr):
                    found.append(f"line {node.lineno}: {module}.{attr}")
                break
            module = f"{module}.{attr}"
    return sorted(set(found))


def test_the_private_name_check_sees_each_way_in():
    modules = {"jaxbridge", "jaxbridge.p", "jaxbridge.p.a", "jaxbridge.p._m"}
    assert private_name_uses("from .a import _x, y", "jaxbridge.p.b", modules) \
        == ["line 1: from jaxbridge.p.a import _x"]
    assert private_name_uses("from . import a\na.b._c = a._d", "jaxbridge.p.b", modules) \
        == ["line 2: jaxbridge.p.a._d"]
    assert private_name_uses("import jaxbridge.p.a as q\nq._z", "jaxbridge.x", modules) \
        == ["line 2: jaxbridge.p.a._z"]
    assert private_name_uses("from . import _m\n_m.f(_m.__doc__)\nself._x", "jaxbridge.p.b",
                             modules) == []


def test_no_module_reads_another_modules_private_names():
    paths = sorted(PACKAGE.rglob("*.py"))
    modules = {_module_name(p) for p in paths}
    used = {str(p.relative_to(ROOT)): uses for p in paths
            if (uses := private_name_uses(p.read_text(), _module_name(p), modules,
                                          p.name == "__init__.py"))}
    assert not used, ("private names read across modules (make the name public in its "
                      f"module, or move it): {used}")


# ---------------------------------------------------------------- paths in comments exist
SCANNED = ("jaxbridge", "csrc", "benchmarks", ".ci", "tests")
PACKAGE_DIRS = ("_core", "_foreign", "_kernel", "_testing")  # named from inside jaxbridge/
TOP_DIRS = tuple(sorted(p.name for p in ROOT.iterdir() if p.is_dir() and p.name not in
                        (".git", "build", ".venv") and not p.name.endswith("cache")))
# `dir/file.ext` or `dir/`, starting with a top-level directory (or a jaxbridge subpackage)
_DIRS = "|".join(re.escape(d) for d in TOP_DIRS + PACKAGE_DIRS)
PATH_IN_TEXT = re.compile(r"(?<![\w./-])((?:" + _DIRS
                          + r")/(?:[\w.*-]+/)*(?:[\w*-]*\.[\w*]+\b|(?!\w)))")
# Placeholders, not paths: a results file per section, "a test file".
PLACEHOLDERS = ("benchmarks/results/SECTION.json", "tests/...py")
C_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
HASH_COMMENT = re.compile(r"(?:^|\s)#(?![a-z]+\b[ (<\"])[^\n]*", re.M)


def _comments_and_docstrings(path: Path) -> list[tuple[int, str]]:
    text = path.read_text()
    if path.suffix == ".py":
        found = [(t.start[0], t.string) for t in
                 tokenize.generate_tokens(io.StringIO(text).readline)
                 if t.type == tokenize.COMMENT]
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef,
                                 ast.AsyncFunctionDef)) and (doc := ast.get_docstring(node)):
                found.append((node.body[0].lineno, doc))
        return found
    comment = C_COMMENT if path.suffix in (".cc", ".h", ".cu") else HASH_COMMENT
    return [(text.count("\n", 0, m.start()) + 1, m.group()) for m in comment.finditer(text)]


def named_paths(text: str) -> list[str]:
    """The repository paths `text` names (trailing punctuation dropped)."""
    return [m.group(1).rstrip(".") for m in PATH_IN_TEXT.finditer(text)
            if m.group(1).rstrip(".") not in PLACEHOLDERS]


def _exists(path: str) -> bool:
    bases = [ROOT / "jaxbridge"] if path.split("/")[0] in PACKAGE_DIRS else \
        [ROOT, ROOT / "csrc" / "include"]  # jaxbridge/ffi_helpers.h: an #include path
    return any(any(base.glob(path)) if "*" in path else (base / path).exists()
               for base in bases)


def test_paths_in_text_are_found():
    assert named_paths("see jaxbridge/_hostcall.py, csrc/kernels/ and tests/x.py.") \
        == ["jaxbridge/_hostcall.py", "csrc/kernels/", "tests/x.py"]
    assert named_paths("xla/python/x.cc, 10 examples/s, scipy/optimize/_root.py") == []
    assert not _exists("jaxbridge/_hostcall.py") and _exists("csrc/builtin/*.cc")
    assert _exists("_core/pair.py") and _exists("jaxbridge/ffi_helpers.h")


@pytest.mark.parametrize("top", SCANNED)
def test_every_path_a_comment_names_exists(top):
    files = [p for p in sorted((ROOT / top).rglob("*")) if p.is_file()
             and "__pycache__" not in p.parts and "results" not in p.parts
             and (p.suffix in (".py", ".cc", ".h", ".cu", ".sh")
                  or p.name in ("CMakeLists.txt", "run"))]
    if top == "csrc":
        files.append(ROOT / "CMakeLists.txt")
    stale = [f"{p.relative_to(ROOT)}:{line}: {path}" for p in files
             for line, text in _comments_and_docstrings(p) for path in named_paths(text)
             if not _exists(path)]
    assert not stale, f"comments and docstrings name paths that do not exist: {stale}"


def _function_sizes() -> list[tuple[str, str, int, int, str]]:
    """(where, name, parameters, lines, source) of every function in the package;
    `self`/`cls` are not counted."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text()
        for node in ast.walk(ast.parse(text, str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                a = node.args
                params = [*a.posonlyargs, *a.args, *a.kwonlyargs,
                          *filter(None, (a.vararg, a.kwarg))]
                if a.args and a.args[0].arg in ("self", "cls"):
                    params = params[1:]
                found.append((f"{path.relative_to(ROOT)}:{node.lineno}", node.name, len(params),
                              node.end_lineno - node.lineno + 1,
                              ast.get_source_segment(text, node) or ""))
    return found


def test_private_functions_take_at_most_eight_parameters():
    # More travel together as one frozen options object (e.g. scipy.optimize's SolveOptions).
    many = [f"{where} {name} ({n})" for where, name, n, _, _ in _function_sizes()
            if name.startswith("_") and not name.startswith("__") and n > 8]
    assert not many, "private functions with over 8 parameters:\n" + "\n".join(many)


def test_functions_over_80_lines_say_why():
    # The reason is a comment ("# Over 80 lines: ..."), not docstring text users read.
    long = [f"{where} {name} ({lines} lines)" for where, name, _, lines, src in _function_sizes()
            if lines > 80 and "# over 80 lines" not in src.lower()]
    assert not long, ("functions over 80 lines without a comment saying why "
                      "(\"# Over 80 lines: ...\"):\n" + "\n".join(long))


def test_every_test_the_budget_list_names_exists():
    """tests/slow_by_budget.txt names tests by node id: a renamed or removed test would
    silently drop out of its effect (and the renamed one back into the default run)."""
    missing = []
    for line in (ROOT / "tests" / "slow_by_budget.txt").read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        path, _, name = line.strip().partition("::")
        test = name.split("[", 1)[0]
        source = ROOT / "tests" / path
        if not source.is_file() or not re.search(rf"^\s*(async )?def {re.escape(test)}\(",
                                                 source.read_text(), re.MULTILINE):
            missing.append(line)
    assert not missing, f"tests/slow_by_budget.txt names tests that do not exist: {missing}"
