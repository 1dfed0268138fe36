"""The examples in public docstrings run and print what they claim (doctest)."""

import doctest
import importlib
import pkgutil

import pytest

import jaxbridge

MODULES = ["jaxbridge"] + sorted(
    m.name for m in pkgutil.walk_packages(jaxbridge.__path__, "jaxbridge.")
    if m.name not in ("jaxbridge.__main__",))


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    if name.split(".")[:2] == ["jaxbridge", "torch"]:
        pytest.importorskip("torch", reason="jaxbridge.torch needs PyTorch: "
                            "pip install -e '.[torch]' (Python 3.11)")
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE,
                             report=True, verbose=False)
    assert result.failed == 0, f"{result.failed} docstring example(s) failed in {name}"
