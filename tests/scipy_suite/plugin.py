"""SciPy's own test files, run against jaxbridge's drop-ins (`pytest -m scipy_suite -n 2`).

Loaded by tests/conftest.py (``pytest_plugins``). When the mark expression asks for
`scipy_suite`, the directory tests/scipy_suite collects the installed SciPy's test
files named in `FILES` (SciPy's own conftest.py comes with them, for its `xp` fixture
and markers, also from a venv outside the repository). Each collected test:

* is marked `scipy_suite` (the default run deselects the mark);
* is deselected when its code never names a swapped function: the static rule of
  `swap.names_reached` (the test function, its class's methods and the module's own
  functions they name, transitively, must name a global that `swap.swapped_globals`
  replaces and one of the swapped functions' names);
* runs with its module's globals swapped for jaxbridge's (`swap.swapped_globals`),
  restored after the test;
* runs as xfail when failures.toml lists it, with the reason: strict, unless the reason
  says ``strict = false`` (SciPy's own solve converges on some machines only); not run at
  all for a reason with ``run = false``: a time limit is no verdict, a loaded machine
  would pass it one day and fail it the next;
* fails with `SuiteTimeout` after ``--scipy-suite-timeout`` seconds (default 60; the
  few tests in `LONGER_LIMITS` get theirs), and
  the process exits 60 s later if the test is stuck where Python cannot interrupt it
  (under xdist the worker is replaced and the test reported as failed).

``--scipy-suite-record=FILE`` ignores failures.toml and writes every test's outcome and
error to FILE (JSON) for update.py.
"""

from __future__ import annotations

import faulthandler
import json
import re
import signal
import threading
from pathlib import Path
from typing import Any

import jax
import pytest

from . import explained, swap

#: SciPy's test files, relative to the installed scipy package.
FILES = (
    "integrate/_ivp/tests/test_ivp.py",
    "integrate/tests/test_bvp.py",
    "integrate/tests/test_quadpack.py",
    "optimize/tests/test__root.py",
    "optimize/tests/test_nonlin.py",
    "optimize/tests/test_least_squares.py",
    "optimize/tests/test_optimize.py",
    "optimize/tests/test_trustregion.py",
    "optimize/tests/test_minimize_constrained.py",
    "sparse/linalg/_eigen/arpack/tests/test_arpack.py",
    "signal/tests/test_signaltools.py",
    "special/tests/test_basic.py",
)
HERE = Path(__file__).resolve().parent
MARK = "scipy_suite"
SWAPPED = pytest.StashKey[dict[str, Any]]()
RANK_PROMOTION = pytest.StashKey[str]()


class SuiteTimeout(BaseException):
    """A SciPy test ran past ``--scipy-suite-timeout`` (a BaseException, so that the
    test's own ``except Exception`` cannot swallow it)."""


def scipy_dir() -> Path:
    import scipy
    return Path(scipy.__file__).resolve().parent


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("scipy_suite", "SciPy's own tests against jaxbridge")
    group.addoption("--scipy-suite-timeout", type=float, default=60.0,
                    help="seconds one SciPy test may run (default 60)")
    group.addoption("--scipy-suite-record", default=None, metavar="FILE",
                    help="ignore failures.toml; write each test's outcome to FILE (JSON)")


def _enabled(config: pytest.Config) -> bool:
    """Whether the -m expression asks for the suite (collecting it costs seconds)."""
    return re.search(rf"(?<!not )\b{MARK}\b", config.option.markexpr or "") is not None


def _wanted(path: Path) -> bool:
    """Whether `path` (inside scipy's package) is a listed file or a folder above one."""
    relative = path.resolve().relative_to(scipy_dir()).as_posix()
    return any(f == relative or f.startswith(relative + "/") or relative == "."
               for f in FILES)


@pytest.hookimpl(tryfirst=True)
def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """Inside scipy's package, only the listed files and the folders above them."""
    if not collection_path.resolve().is_relative_to(scipy_dir()):
        return None
    return not _wanted(collection_path)


class SuiteDirectory(pytest.Directory):
    """tests/scipy_suite: the installed scipy package (pruned by pytest_ignore_collect)."""

    def collect(self):
        root = scipy_dir()
        cut = self.config.getoption("confcutdir") or (
            self.config.inipath.parent if self.config.inipath else None)
        if cut is not None and not root.is_relative_to(Path(cut).resolve()):
            # pytest loads no conftest.py outside its confcutdir (the repository, unless
            # told otherwise): SciPy's (its `xp` fixture, its markers) is added by hand.
            import scipy.conftest
            if not self.config.pluginmanager.is_registered(scipy.conftest):
                self.config.pluginmanager.register(scipy.conftest, "scipy.conftest")
        yield pytest.Package.from_parent(self, path=root)


@pytest.hookimpl(tryfirst=True)
def pytest_collect_directory(path: Path, parent: pytest.Collector) -> Any:
    if path.resolve() == HERE and _enabled(parent.config):
        return SuiteDirectory.from_parent(parent, path=path)
    return None


def suite_id(nodeid: str, path: Path) -> str:
    """A test's id relative to the folder holding scipy (the same in every venv)."""
    relative = path.resolve().relative_to(scipy_dir().parent).as_posix()
    return relative + "::" + nodeid.split("::", 1)[1]


_globals_cache: dict[str, dict[str, Any]] = {}


def _swapped_for(item: pytest.Function) -> dict[str, Any]:
    module = item.module
    if module.__name__ not in _globals_cache:
        _globals_cache[module.__name__] = swap.swapped_globals(vars(module))
    return _globals_cache[module.__name__]


_names_cache: dict[Any, frozenset[str]] = {}


def _names(roots: Any, namespace: dict[str, Any]) -> frozenset[str]:
    if roots not in _names_cache:
        _names_cache[roots] = swap.names_reached(roots, namespace)
    return _names_cache[roots]


def _reaches_jaxbridge(item: pytest.Item) -> bool:
    if not isinstance(item, pytest.Function):
        return False
    replaced = _swapped_for(item)
    namespace = vars(item.module)
    names = _names(item.function, namespace)
    if item.cls is not None:
        names |= _names(item.cls, namespace)
    return bool(names & replaced.keys()) and bool(names & swap.swapped_names())


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by mark
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    root = scipy_dir()
    ours = [i for i in items if i.path.resolve().is_relative_to(root)]
    if not ours:
        return
    listed = {} if config.option.scipy_suite_record else explained.load()
    unreached = [i for i in ours if not _reaches_jaxbridge(i)]
    if unreached:
        config.hook.pytest_deselected(items=unreached)
        dropped = set(map(id, unreached))
        items[:] = [i for i in items if id(i) not in dropped]
    ours_ids = set(map(id, ours))
    for item in items:
        if id(item) not in ours_ids:
            continue
        item.add_marker(MARK)
        key = listed.failures.get(suite_id(item.nodeid, item.path)) if listed else None
        if key and key in listed.reasons:
            reason = listed.reasons[key]
            # first, so that it decides over SciPy's own xfail marks of the test
            item.add_marker(pytest.mark.xfail(
                strict=reason.strict, run=reason.run, reason=f"{key}: {reason.reason}"),
                append=False)


def _is_suite_item(item: pytest.Item) -> bool:
    return item.get_closest_marker(MARK) is not None and isinstance(item, pytest.Function)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item):
    if _is_suite_item(item):
        namespace = vars(item.module)
        new = _swapped_for(item)
        item.stash[SWAPPED] = {name: namespace[name] for name in new}
        namespace.update(new)
        # SciPy's tests are user code: JAX's default broadcasting, not the strict
        # rank promotion our own tests run with (tests/conftest.py)
        item.stash[RANK_PROMOTION] = jax.config.jax_numpy_rank_promotion
        jax.config.update("jax_numpy_rank_promotion", "allow")
    return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: Any):
    try:
        return (yield)
    finally:
        if SWAPPED in item.stash:
            vars(item.module).update(item.stash[SWAPPED])
        if RANK_PROMOTION in item.stash:
            jax.config.update("jax_numpy_rank_promotion", item.stash[RANK_PROMOTION])


# SciPy tests that legitimately run long against the drop-ins, with their own limit in
# seconds: test_filtfilt_gust's reference solution fits the initial conditions with
# SciPy's optimizer, which calls the swapped `lfilter` tens of thousands of times
# (44 s on a quiet 2-core machine in 2026-11; past 60 s on a loaded one).
LONGER_LIMITS = {"test_filtfilt_gust": 300.0}


def _limit(item: pytest.Item, seconds: float) -> float:
    name = getattr(item, "originalname", None) or item.name
    return max(seconds, LONGER_LIMITS.get(name, 0.0))


def _alarm(signum: int, frame: Any) -> None:
    raise SuiteTimeout("the test ran past --scipy-suite-timeout")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    seconds = item.config.option.scipy_suite_timeout
    if not _is_suite_item(item) or not seconds:
        return (yield)
    seconds = _limit(item, seconds)
    main = threading.current_thread() is threading.main_thread()
    if main:
        previous = signal.signal(signal.SIGALRM, _alarm)
        signal.setitimer(signal.ITIMER_REAL, seconds)
    faulthandler.dump_traceback_later(seconds + 60, exit=True)
    try:
        return (yield)
    finally:
        faulthandler.cancel_dump_traceback_later()
        if main:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)


def _error_line(excinfo: pytest.ExceptionInfo[BaseException]) -> str:
    text = " ".join(str(excinfo.value).split())
    return f"{excinfo.type.__name__}: {text[:600]}"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):
    report = yield
    if _is_suite_item(item):
        report.user_properties.append(("suite_id", suite_id(item.nodeid, item.path)))
        if call.excinfo is not None and report.failed:
            report.user_properties.append(("error", _error_line(call.excinfo)))
        elif report.failed:  # XPASS(strict) of SciPy's own xfail marks
            report.user_properties.append(("error", f"XPASS: {report.longreprtext[:300]}"))
    return report


class Recorder:
    """Each suite test's outcome (the worst of its phases) and first error, as JSON."""

    def __init__(self, path: str):
        self.path = path
        self.outcomes: dict[str, dict[str, str]] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        props = dict(report.user_properties)
        if "suite_id" not in props:
            return
        entry = self.outcomes.setdefault(props["suite_id"], {"outcome": "passed"})
        if report.failed and entry["outcome"] != "failed":
            entry.update(outcome="failed", error=props.get("error", report.longreprtext[-300:]))
        elif report.skipped and entry["outcome"] == "passed":
            entry["outcome"] = "skipped"

    def pytest_sessionfinish(self) -> None:
        Path(self.path).write_text(json.dumps(self.outcomes, indent=1, sort_keys=True))


def pytest_configure(config: pytest.Config) -> None:
    if _enabled(config):
        # SciPy's conftest.py uses this marker while it is imported, before its own
        # pytest_configure registers it (SciPy's pytest.ini, not installed, lists it).
        config.addinivalue_line("markers", "array_api_backends: SciPy's array API backends")
    record = config.option.scipy_suite_record
    if record and not hasattr(config, "workerinput"):  # the xdist controller, or no xdist
        config.pluginmanager.register(Recorder(record), "scipy_suite_recorder")
