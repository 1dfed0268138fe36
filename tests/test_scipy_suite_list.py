"""The explained-failures list of SciPy's own tests (tests/scipy_suite/failures.toml)
against the docs, and the suite's machinery (swapping a test module's globals, choosing
the tests that reach jaxbridge, refreshing the list) on small stand-ins. The suite itself
runs with `pytest -m scipy_suite -n 2` (CI's scipy-suite stage)."""

from __future__ import annotations

import re
import types
import unicodedata
from pathlib import Path

import pytest
import scipy.integrate
import scipy.optimize
import scipy.special
from scipy_suite import explained, plugin, swap, update

import jaxbridge.scipy.integrate as jb_integrate
import jaxbridge.scipy.optimize as jb_optimize
import jaxbridge.scipy.special as jb_special

ROOT = Path(__file__).resolve().parent.parent
GUIDE = ROOT / "docs" / "guides" / "scipy.md"
LISTED = explained.load()


def _slug(title: str) -> str:
    """Python-Markdown's toc anchor for a heading (mkdocs' default slugify)."""
    text = unicodedata.normalize("NFKD", title).encode("ascii", "ignore").decode()
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def _sections(markdown: str) -> dict[str, str]:
    """{anchor: the text from that heading to the next heading of its level or above}."""
    heads = [(m.start(), len(m.group(1)), _slug(m.group(2)))
             for m in re.finditer(r"^(#{1,6})\s+(.+?)\s*$", markdown, re.M)]
    sections = {}
    for i, (start, level, anchor) in enumerate(heads):
        end = next((s for s, lv, _ in heads[i + 1:] if lv <= level), len(markdown))
        sections[anchor] = markdown[start:end]
    return sections


def _catalog_rows() -> dict[str, str]:
    """{function as the catalog names it ("optimize.minimize"): its table row}."""
    rows = {}
    for line in GUIDE.read_text().splitlines():
        m = re.match(r"\| `([a-z_.]+)", line)
        if m:
            rows[m.group(1).split("(")[0]] = line
    return rows


def test_every_failure_has_an_explained_reason():
    unknown = {t: k for t, k in LISTED.failures.items() if k not in LISTED.reasons}
    assert not unknown, (
        f"{len(unknown)} failures of SciPy's tests have no reason (UNEXPLAINED or an "
        f"unknown key) in {explained.LIST}: write a reason with its docs line, e.g. "
        f"{sorted(unknown.items())[:5]}")


@pytest.mark.parametrize("key", sorted(LISTED.reasons))
def test_each_reason_is_stated_where_its_docs_anchor_points(key):
    reason = LISTED.reasons[key]
    page, _, anchor = reason.docs.partition("#")
    sections = _sections((ROOT / page).read_text())
    assert anchor in sections, f"{key}: {page} has no heading with the anchor #{anchor}"
    text = " ".join(sections[anchor].split())
    assert reason.words in text, f"{key}: {page}#{anchor} does not say {reason.words!r}"
    assert reason.reason.strip() and "\n" not in reason.reason


@pytest.mark.parametrize("key", sorted(LISTED.reasons))
def test_the_catalog_flags_each_function_a_reason_limits(key):
    """The guide's catalog is checked against the suite: each function whose SciPy tests
    fail for a reason links that reason's section from its row's limits."""
    reason = LISTED.reasons[key]
    rows = _catalog_rows()
    for function in reason.functions:
        assert function in rows, f"{key}: the catalog has no row for {function}"
        anchor = reason.docs.partition("#")[2]
        assert f"(#{anchor})" in rows[function], (
            f"{key}: SciPy's tests show a limit of {function} that its catalog row does "
            f"not flag: link #{anchor} from the row's limits")
    assert reason.functions, f"{key}: name the catalog rows (functions) it limits"


def test_every_reason_is_used():
    used = set(LISTED.failures.values())
    assert not set(LISTED.reasons) - used, "reasons no failure uses: remove them"


# ---- the machinery, on small stand-ins ----------------------------------------------

def test_a_test_modules_globals_are_swapped_for_jaxbridges():
    namespace = {"__name__": "fake_tests", "solve_ivp": scipy.integrate.solve_ivp,
                 "optimize": scipy.optimize, "scipy": scipy, "ellipk": scipy.special.ellipk,
                 "rosen": scipy.optimize.rosen, "np": pytest}
    new = swap.swapped_globals(namespace)
    assert new["solve_ivp"] is jb_integrate.solve_ivp
    assert new["ellipk"] is jb_special.ellipk
    assert new["optimize"].minimize is jb_optimize.minimize
    assert new["optimize"].rosen is scipy.optimize.rosen  # SciPy's own for the rest
    assert new["scipy"].optimize.root is jb_optimize.root
    assert new["scipy"].sparse.linalg.aslinearoperator is scipy.sparse.linalg.aslinearoperator
    assert set(new) == {"solve_ivp", "optimize", "scipy", "ellipk"}
    assert scipy.optimize.minimize is not jb_optimize.minimize  # SciPy untouched


def test_result_classes_are_not_swapped():
    assert "OptimizeResult" not in swap.swapped_names()
    assert {"minimize", "solve_ivp", "quad", "lfilter", "eigsh", "kv"} <= swap.swapped_names()


def test_the_names_a_test_reaches_follow_its_class_and_module_helpers():
    module = types.ModuleType("fake_tests")
    exec(
        "def helper(f):\n    return optimize.minimize(f, 0)\n"
        "class Base:\n    def check(self):\n        return helper(len)\n"
        "class TestX(Base):\n    def test_a(self):\n        self.check()\n"
        "def test_plain():\n    return [x for x in optimize.rosen([1])]\n",
        vars(module))
    ns = vars(module)
    assert {"optimize", "minimize", "helper"} <= swap.names_reached(ns["TestX"], ns)
    assert "minimize" not in swap.names_reached(ns["test_plain"], ns)


def test_refresh_keeps_reasons_assigns_rules_and_flags_the_rest():
    reasons = {"numpy": explained.Reason("numpy", "NumPy fails on tracers", "d.md#a",
                                         "tracers",
                                         rules=(("TracerArrayConversionError", "."),)),
               "hand": explained.Reason("hand", "given by hand", "d.md#b", "hand")}
    listed = explained.Explained(reasons, {"t::fixed": "numpy", "t::hand": "hand",
                                           "t::moved": "numpy", "t::not_run": "hand"})
    outcomes = {"t::fixed": {"outcome": "passed"},
                "t::hand": {"outcome": "failed", "error": "ValueError: anything"},
                "t::moved": {"outcome": "failed", "error": "KeyError: 'x'"},
                "t::new": {"outcome": "failed", "error": "TracerArrayConversionError: x"}}
    update.refresh(listed, outcomes)
    assert listed.failures == {"t::hand": "hand", "t::moved": explained.UNEXPLAINED,
                               "t::new": "numpy", "t::not_run": "hand"}


def test_the_list_survives_a_round_trip(tmp_path):
    path = tmp_path / "failures.toml"
    explained.dump(LISTED, path)
    again = explained.load(path)
    assert again.failures == LISTED.failures
    assert again.reasons == LISTED.reasons


@pytest.mark.parametrize("expression, collected", [
    ("scipy_suite", True), ("scipy_suite and not slow", True), ("", False),
    ("not slow and not docs and not scipy_suite", False), ("not scipy_suite", False)])
def test_the_suite_is_collected_only_when_the_mark_expression_asks_for_it(expression,
                                                                         collected):
    config = types.SimpleNamespace(option=types.SimpleNamespace(markexpr=expression))
    assert plugin._enabled(config) is collected  # the default run never imports SciPy's tests


def test_a_tests_id_is_the_same_in_every_venv():
    import scipy
    path = Path(scipy.__file__).parent / "optimize" / "tests" / "test__root.py"
    test = "scipy/optimize/tests/test__root.py::TestRoot::test_a[x]"
    assert plugin.suite_id(f"any/venv/lib/site-packages/{test}", path) == test


def test_a_reason_that_holds_on_some_machines_only_keeps_its_passing_tests():
    # Whether SciPy's own solve converges depends on the CPU (OpenBLAS picks its kernels
    # by CPU): such a reason is not strict, and a test that passes here stays listed.
    listed = explained.load()
    assert not listed.reasons["failure_raises"].strict
    listed.failures = {"a::passes_here": "failure_raises", "b::fixed": "jax_arrays"}
    update.refresh(listed, {"a::passes_here": {"outcome": "passed"},
                            "b::fixed": {"outcome": "passed"}})
    assert listed.failures == {"a::passes_here": "failure_raises"}
