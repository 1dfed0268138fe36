"""The docs do not rot: the examples in public docstrings run and print what they claim
(doctest), every Python block of README.md and docs/ runs and checks its result (Sybil),
and every public name is on an API reference page."""

import doctest
import importlib
import importlib.util
import pkgutil
import re
import subprocess
import sys
import unittest
import warnings
from pathlib import Path

import jax
import pytest
from sybil import Sybil
from sybil.example import NotEvaluated
from sybil.parsers.markdown import PythonCodeBlockParser, SkipParser

import jaxbridge

ALL_MODULES = ["jaxbridge"] + sorted(
    m.name for m in pkgutil.walk_packages(jaxbridge.__path__, "jaxbridge.")
    if m.name not in ("jaxbridge.__main__",))
FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


def _count_examples(name: str) -> int:
    module = importlib.import_module(name)
    return sum(not e.options.get(doctest.SKIP)  # +SKIP examples are not attempted
               for t in doctest.DocTestFinder().find(module) for e in t.examples)


def _modules_with_examples() -> list:
    """A case per module that has docstring examples (a module without any is not a
    case: it would pass without testing anything). A module that fails to import is
    a case, so the test reports the import error instead of hiding the module."""
    for name in ALL_MODULES:  # first import them all: some re-home their classes
        try:  # (e.g. jaxbridge.testing sets __module__ of _report's), which moves the
            importlib.import_module(name)  # examples to the module that shows them
        except Exception:  # noqa: BLE001 - reported by the test itself
            pass
    cases = []
    for name in ALL_MODULES:
        try:
            if _count_examples(name) == 0:
                continue
        except Exception:  # noqa: BLE001 - reported by the test itself
            pass
        cases.append(name)
    return cases


MODULES = _modules_with_examples()
# Long by nature (a solver compiled per example): in the slow run
SLOW_MODULES = {"jaxbridge.scipy.integrate._ivp", "jaxbridge.scipy.integrate._quad",
                "jaxbridge.scipy.integrate._bvp", "jaxbridge.scipy.integrate._dense",
                "jaxbridge.scipy.optimize._root", "jaxbridge.scipy.optimize._minimize",
                "jaxbridge.scipy.optimize._least_squares"}


@pytest.mark.parametrize("name", [pytest.param(m, marks=pytest.mark.slow)
                                  if m in SLOW_MODULES else m for m in MODULES])
def test_docstring_examples(name):
    if name.split(".")[:2] == ["jaxbridge", "torch"]:
        pytest.importorskip("torch", reason="jaxbridge.torch needs PyTorch: "
                            "pip install -e '.[torch]' (Python 3.11)")
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=FLAGS, report=True, verbose=False)
    assert result.attempted > 0, f"{name}: no docstring example ran"
    assert result.attempted == _count_examples(name)
    assert result.failed == 0, f"{result.failed} docstring example(s) failed in {name}"


# ---------------------------------------------------------------- the docs' code blocks
# Every ```python block in README.md and docs/ runs, in order, one namespace per page,
# with Sybil (its Markdown parsers: fenced code blocks, and `<!-- skip: next "why" -->`
# comments that skip a block and say why). A block checks its own result with `assert`
# or a doctest-style `>>>` session. docs/guides/kernels.md and ffi-tutorial.md are run by
# tests/test_guide.py, which first writes their C++ blocks to the files their Python
# blocks compile.
ROOT = Path(__file__).resolve().parents[1]
RUN_ELSEWHERE = {"docs/guides/kernels.md": "tests/test_guide.py",
                 "docs/guides/ffi-tutorial.md": "tests/test_guide.py"}
PAGES = ["README.md"] + sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").rglob("*.md"))


def _sybil() -> Sybil:
    return Sybil(parsers=[PythonCodeBlockParser(), SkipParser()])


# Long by nature (ODE gradients compiled block by block): in the slow run; for the default
# run's budget also the host-functions guide (5 s), whose examples are the ones
# test_foreign.py checks in more detail
SLOW_PAGES = {"docs/guides/ode-events.md", "docs/guides/ode-gradients.md",
              "docs/guides/scipy.md", "docs/guides/host-functions.md"}


@pytest.mark.parametrize("page", [pytest.param(p, marks=pytest.mark.slow) if p in SLOW_PAGES
                                  else p for p in PAGES if p not in RUN_ELSEWHERE])
def test_code_blocks(page, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)  # a page may write files (a C++ source, a plot)
    monkeypatch.setenv("JAXBRIDGE_CACHE_DIR", str(tmp_path / "cache"))
    document = _sybil().parse(ROOT / page)
    # `<!-- skip: start if(find_spec("flax") is None, reason=...) -->` skips what needs
    # an optional package (the examples extra) where it is not installed
    document.namespace["find_spec"] = importlib.util.find_spec
    skipped = []
    for example in document.examples():
        try:
            # as users run them: JAX's default rank promotion, not the suite's "raise"
            with jax.numpy_rank_promotion("allow"):
                example.evaluate()
        except NotEvaluated:
            pass
        except unittest.SkipTest as why:
            skipped.append(f"{page}:{example.line}: {why}")
    for line in skipped:  # shown by -ra; the other blocks of the page still ran
        warnings.warn(f"code block skipped: {line}", stacklevel=1)


# ---------------------------------------------------------------- the API reference
PUBLIC_MODULES = ["jaxbridge", "jaxbridge.errors", "jaxbridge.testing", "jaxbridge.cpp",
                  "jaxbridge.ops", "jaxbridge.scipy", "jaxbridge.scipy.integrate",
                  "jaxbridge.scipy.optimize", "jaxbridge.scipy.signal",
                  "jaxbridge.scipy.special", "jaxbridge.scipy.sparse.linalg"]
if importlib.util.find_spec("torch") is not None:  # the torch extra (Python 3.11 only)
    PUBLIC_MODULES.append("jaxbridge.torch")
# `::: identifier` and its indented options block (mkdocstrings' syntax)
_DIRECTIVE = re.compile(r"^::: (\S+)\n((?:[ \t]+.*\n|[ \t]*\n)*)", re.MULTILINE)


def public_names(module_name: str) -> list[str]:
    module = importlib.import_module(module_name)
    names = getattr(module, "__all__", None)
    if names is None:
        names = [n for n in vars(module) if not n.startswith("_")]
    return sorted(names)


def _is_module(target: str) -> bool:
    """Whether `target` names a module that can be found without importing it; not so
    for a lazily imported attribute (`jaxbridge.testing.strategies`: `jaxbridge.testing`
    is a module, not a package)."""
    try:
        return importlib.util.find_spec(target) is not None
    except ModuleNotFoundError:
        return False


def documented() -> tuple[set[str], str]:
    """The identifiers the API pages render (`module.name`), and the pages' text."""
    text = "".join(p.read_text() for p in sorted((ROOT / "docs" / "api").glob("*.md")))
    names: set[str] = set()
    for target, options in _DIRECTIVE.findall(text):
        names.add(target)
        members = re.search(r"^\s+members:(.*)\n((?:\s+- .*\n)*)", options, re.MULTILINE)
        if members is None:  # the whole module: every public name
            if _is_module(target):
                names.update(f"{target}.{n}" for n in public_names(target))
        else:
            names.update(f"{target}.{m}" for m in re.findall(r"- (\w+)", members.group(2)))
    return names, text


@pytest.mark.parametrize("module", PUBLIC_MODULES)
def test_every_public_name_is_in_the_api_reference(module):
    names, text = documented()
    missing = [n for n in public_names(module)
               if f"{module}.{n}" not in names and f"`{module}.{n}`" not in text]
    assert not missing, (f"{module}: public names missing from docs/api/*.md (add a `:::` "
                         f"directive or a members entry): {missing}")


def test_the_errors_guide_covers_every_exception():
    from jaxbridge import errors
    guide = (ROOT / "docs" / "guides" / "errors.md").read_text()
    classes = [n for n in errors.__all__ if isinstance(getattr(errors, n), type)]
    missing = [n for n in classes if f"`{n}`" not in guide]
    assert not missing, f"docs/guides/errors.md does not explain {missing}"
    headed = re.findall(r"^## `(\w+)`", guide, re.MULTILINE)
    assert set(classes) - {"JaxbridgeError"} <= set(headed)


# ---------------------------------------------------------------- numbers come from files
def _plots():
    """benchmarks/plots.py as a module (registered: its dataclasses look themselves up)."""
    if "benchmarks_plots" not in sys.modules:
        spec = importlib.util.spec_from_file_location("benchmarks_plots",
                                                      ROOT / "benchmarks" / "plots.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules["benchmarks_plots"] = module
        spec.loader.exec_module(module)
    return sys.modules["benchmarks_plots"]


def test_the_performance_figures_are_rendered_from_the_benchmark_results():
    """docs/performance.md and benchmarks/RESULTS.md hold no figure typed by hand: their
    goals and tables are what benchmarks/plots.py renders from benchmarks/results/."""
    plots = _plots()
    results = plots.load()
    page = (ROOT / "docs" / "performance.md").read_text()
    record = (ROOT / "benchmarks" / "RESULTS.md").read_text()
    assert plots.render_page(page, results) == page, \
        "docs/performance.md is out of date: run python benchmarks/plots.py"
    assert plots.render_record(record, results) == record, \
        "benchmarks/RESULTS.md is out of date: run python benchmarks/plots.py"
    assert "<!-- goals -->\n| case |" in page and "<!-- goals -->\n| case |" in record
    # one table per results file and no history: 300 lines, and some for the tables
    # of scripts added since (threads, rms_norm, scipy_eager)
    assert len(record.splitlines()) < 400, "RESULTS.md is the current record, not a journal"
    for name, result in results.items():  # every file is shown, with where it came from
        assert f"<!-- results: {name} -->" in page, f"{name}.json is not on the page"
        assert f"<!-- record: {name} -->" in record, f"{name}.json is not in RESULTS.md"
        for key in ("script", "command", "date", "commit", "machine", "versions",
                    "conditions", "provenance"):
            assert result[key], f"benchmarks/results/{name}.json: no {key!r}"
        assert re.fullmatch(r"\d{4}-\d\d-\d\d", result["date"]), result["date"]
        assert re.fullmatch(r"[0-9a-f]{7,}(\+changes)?", result["commit"]), result["commit"]
        assert (ROOT / result["script"]).exists()
    for plot, (_, names) in plots.PLOTS.items():
        assert f"assets/performance/{plot}.png" in page
        assert all(name in results for name in names), (plot, names)


def test_every_goal_finds_its_figures():
    """Each goal of the performance page names rows and columns that its results file
    has: a renamed row or column would otherwise show "not measured"."""
    plots = _plots()
    results = plots.load()
    for goal in plots.GOALS:
        row = plots.goal_row(goal, results)
        assert "not measured" not in row, f"{goal.case}, {goal.goal}: {row}"
        assert row[5] in ("yes", "**no**"), row


def test_goal_rows_compare_the_fastest_peer():
    """The ratio is the fastest peer's time over ours, read from the cells as written."""
    plots = _plots()
    result = {"columns": ["mechanism", "time"], "date": "2026-01-02", "commit": "abcdef0",
              "rows": [["ours", "2.0 / 2.5"], ["slow", "8.0 / 9.0"], ["fast", "3.0 / 3.1"]]}
    goal = plots.Goal("case", "at least 1.4x faster", "r",
                      plots.Figure("ours", "time", {"mechanism": "ours"}),
                      (plots.Figure("slow", "time", {"mechanism": "slow"}),
                       plots.Figure("fast", "time", {"mechanism": "fa*"})), 1.4, "us")
    assert plots.goal_row(goal, {"r": result}) == [
        "case", "at least 1.4x faster", "2.0 us", "3.0 us (fast)", "1.50x faster", "yes",
        "2026-01-02 `abcdef0`"]
    slower = plots.Goal("case", "g", "r", plots.Figure("ours", "time", {"mechanism": "slow"}),
                        (plots.Figure("x", "time", {"mechanism": "ours"}),), 1.0, "us")
    assert plots.goal_row(slower, {"r": result})[4:6] == ["4.00x slower", "**no**"]
    missing = plots.Goal("case", "g", "r", plots.Figure("ours", "time", {"mechanism": "none"}),
                         (plots.Figure("x", "time", {"mechanism": "ours"}),), 1.0, "us")
    assert plots.goal_row(missing, {"r": result})[2] == "not measured"


def test_every_test_the_reliability_guide_names_exists():
    """The reliability guide promises nothing untested: each `tests/...py::test_name` it
    names is a test function in that file (a file named alone must exist)."""
    root = Path(__file__).resolve().parent.parent
    text = (root / "docs" / "guides" / "reliability.md").read_text()
    named = re.findall(r"`(tests/[\w/]+\.py)(?:::(\w+))?`", text)
    assert len(named) >= 10, named
    for path, name in named:
        source = (root / path).read_text()
        if name:
            assert re.search(rf"^def {name}\(", source, re.M), f"{path}::{name} is not a test"
    scripts = re.findall(r"`(benchmarks/[\w.]+\.sh)`", text)
    assert all((root / s).is_file() for s in scripts), scripts



def test_code_in_table_cells_breaks_between_parts_never_inside_a_name():
    tables = _hook("tables")
    cell = ("<td><code>integrate.solve_ivp(fun, t_span)</code> <code>rtol=1.5e-3</code> "
            "<code>tests/test_x.py::test_a_failure_raised_in_every_shard_is_delivered_once"
            "</code></td><p><code>a.b</code></p>")
    assert tables.soft_breaks(cell) == (
        "<td><code>integrate.<wbr>solve_ivp(<wbr>fun, t_span)</code> <code>rtol=1.5e-3</code> "
        "<code>tests/<wbr>test_x.<wbr>py::<wbr>test_<wbr>a_<wbr>failure_<wbr>raised_<wbr>in_<wbr>"
        "every_<wbr>shard_<wbr>is_<wbr>delivered_<wbr>once</code></td><p><code>a.b</code></p>")


def _hook(name: str):
    spec = importlib.util.spec_from_file_location(f"docs_hooks_{name}",
                                                  ROOT / "docs" / "_hooks" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_doctest_block_copies_its_code_without_prompts_or_output():
    block = ('<div class="highlight"><pre><span></span><code><span class="gp">&gt;&gt;&gt; </span>'
             '<span class="n">f</span><span class="p">(</span><span class="s2">&quot;a&quot;'
             '</span><span class="p">)</span>\n'
             '<span class="gp">... </span>  <span class="mi">1</span>\n'
             '<span class="gp">&gt;&gt;&gt;</span>\n'
             '<span class="go">2.0</span>\n'
             '<span class="gt">Traceback (most recent call last):</span>\n'
             '<span class="x">... RuleCheckError ...</span>\n</code></pre></div>')
    page = _hook("prompts").with_copy_text(block + '<div class="highlight"><pre><code>x = 1'
                                           '</code></pre></div>')
    assert page.count("data-copy=") == 1  # only the doctest
    assert 'data-copy="f(&quot;a&quot;)&#10;  1&#10;"' in page


# ---------------------------------------------------------------- the product speaks
# The repository speaks of the product and what a reader can use -- dates, commits,
# machines, versions -- never of numbered work periods or of who did the work. This
# file holds the pattern and is not searched.
SELF_REFERENCE = re.compile(
    r"session [0-9]+|\bhelpers? `|\bby helpers?\b|\bagents?\b|\bplanners?\b", re.IGNORECASE)


def tracked_text_files() -> dict[str, str]:
    """Every file git tracks here that reads as UTF-8 text: path -> text."""
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True,
                            timeout=60, check=True).stdout.decode().split("\0")
    texts = {}
    for path in filter(None, listed):
        try:
            texts[path] = (ROOT / path).read_text(encoding="utf-8")
        except (UnicodeDecodeError, FileNotFoundError, IsADirectoryError):
            continue  # a binary file (a PNG), or deleted in the working tree
    return texts


def self_references(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if SELF_REFERENCE.search(line)]


def test_the_repository_names_no_work_periods_or_workers():
    found = {path: self_references(text) for path, text in tracked_text_files().items()
             if path != "tests/test_docs.py"}
    found = {path: lines for path, lines in found.items() if lines}
    assert not found, ("say what a reader can use (a date, a commit, a machine) "
                       f"instead of who did the work or when: {found}")


@pytest.mark.parametrize("line, named", [
    ("measured in session 14 on the quiet machine", True),
    ("helper `hostcall` ran the fourth run", True),
    ("found by helper mutopen", True),
    ("other agents' builds loaded the cores", True),
    ("noted for the planners", True),
    ("2026-11-26, commit bbf368c, an H200", False),
    ("kernel-author helpers over the XLA FFI C++ API", False),
    ("a Python session; tests/test_docs.py", False),
])
def test_the_self_reference_pattern(line, named):
    assert bool(self_references(line)) is named
