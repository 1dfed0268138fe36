"""The docs do not rot: the examples in public docstrings run and print what they claim
(doctest), every Python block of README.md and docs/ runs and checks its result (Sybil),
and every public name is on an API reference page."""

import doctest
import importlib
import pkgutil
import unittest
import warnings
from pathlib import Path

import pytest
from sybil import Sybil
from sybil.example import NotEvaluated
from sybil.parsers.markdown import PythonCodeBlockParser, SkipParser

import jaxbridge

MODULES = ["jaxbridge"] + sorted(
    m.name for m in pkgutil.walk_packages(jaxbridge.__path__, "jaxbridge.")
    if m.name not in ("jaxbridge.__main__",))


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE,
                             report=True, verbose=False)
    assert result.failed == 0, f"{result.failed} docstring example(s) failed in {name}"


# ---------------------------------------------------------------- the docs' code blocks
# Every ```python block in README.md and docs/ runs, in order, one namespace per page,
# with Sybil (its Markdown parsers: fenced code blocks, and `<!-- skip: next "why" -->`
# comments that skip a block and say why). A block checks its own result with `assert`
# or a doctest-style `>>>` session. docs/guides/kernels.md is run by tests/test_guide.py,
# which first writes its C++ blocks to the files its Python blocks compile.
ROOT = Path(__file__).resolve().parents[1]
RUN_ELSEWHERE = {"docs/guides/kernels.md": "tests/test_guide.py"}
PAGES = ["README.md"] + sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").rglob("*.md"))


def _sybil() -> Sybil:
    return Sybil(parsers=[PythonCodeBlockParser(), SkipParser()])


@pytest.mark.parametrize("page", [p for p in PAGES if p not in RUN_ELSEWHERE])
def test_code_blocks(page, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)  # a page may write files (a C++ source, a plot)
    monkeypatch.setenv("JAXBRIDGE_CACHE_DIR", str(tmp_path / "cache"))
    document = _sybil().parse(ROOT / page)
    skipped = []
    for example in document.examples():
        try:
            example.evaluate()
        except NotEvaluated:
            pass
        except unittest.SkipTest as why:
            skipped.append(f"{page}:{example.line}: {why}")
    for line in skipped:  # shown by -ra; the other blocks of the page still ran
        warnings.warn(f"code block skipped: {line}", stacklevel=1)
