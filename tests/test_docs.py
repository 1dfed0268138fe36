"""The examples in public docstrings run and print what they claim (doctest)."""

import doctest
import importlib
import pkgutil

import pytest

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


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=FLAGS, report=True, verbose=False)
    assert result.attempted > 0, f"{name}: no docstring example ran"
    assert result.attempted == _count_examples(name)
    assert result.failed == 0, f"{result.failed} docstring example(s) failed in {name}"
