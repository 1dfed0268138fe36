"""Loading jaxbridge's compiled extensions (`_hostcall`: the host-call trampoline;
`_builtin`: the built-in C++/CUDA kernels), the one place that knows why one is missing.

The usual reason is not a broken build: Python started in the repository root imports
the *source tree* (the current directory comes first on `sys.path`), which has no
compiled extension, instead of the installed package. That silently costs the native
host call (jax.pure_callback is ~35x slower) and the built-in kernels, so it is named,
with the fix, in the error and in a warning at first use.
"""

from __future__ import annotations

import importlib
import pathlib
import warnings
from types import ModuleType

__all__ = ["PACKAGE_DIR", "load", "missing_reason", "warn_once_if_missing"]

PACKAGE_DIR = pathlib.Path(__file__).resolve().parent.parent  # the imported jaxbridge package
_loaded: dict[str, tuple[ModuleType | None, str | None]] = {}
_warned: set[str] = set()


def _in_source_tree() -> bool:
    root = PACKAGE_DIR.parent
    return (root / "pyproject.toml").is_file() and (root / "csrc").is_dir()


def _explain(name: str, err: ImportError) -> str:
    reason = f"{type(err).__name__}: {err}"
    if _in_source_tree():
        reason += (
            f". jaxbridge was imported from its source tree ({PACKAGE_DIR}), which has no "
            f"compiled extension: Python puts the current directory first on sys.path, so "
            f"running it from the repository root shadows the installed package. Run from "
            f"another directory, or install in editable mode (pip install -e .), which "
            f"makes the source tree import the compiled extension.")
    return reason


def load(name: str) -> ModuleType | None:
    """The extension module `jaxbridge.<name>`, or None (see `missing_reason`)."""
    if name not in _loaded:
        try:
            _loaded[name] = (importlib.import_module(f"jaxbridge.{name}"), None)
        except ImportError as err:
            _loaded[name] = (None, _explain(name, err))
    return _loaded[name][0]


def missing_reason(name: str) -> str | None:
    """Why `load(name)` returned None (None if it loaded)."""
    load(name)
    return _loaded[name][1]


def warn_once_if_missing(name: str, consequence: str) -> None:
    """Warn (once per extension) that `name` is missing, what that costs and why."""
    if load(name) is not None or name in _warned:
        return
    _warned.add(name)
    warnings.warn(f"jaxbridge: the compiled extension jaxbridge.{name} is not available, so "
                  f"{consequence}. Reason: {missing_reason(name)}", RuntimeWarning,
                  stacklevel=3)
