"""How many threads the BLAS libraries and torch use inside a host call.

The policy is the host-call runtime's (csrc/hostcall/threads.cc, which says why): by
default ("auto") calls running at once share the cores, and a call that runs alone gets
the libraries' own thread count or one thread, whichever its function runs faster with
(measured on its first calls, and again every few seconds). ``JAXBRIDGE_HOST_BLAS_THREADS``
overrides it: a number fixes the count during host calls (never above a library's own
setting), ``unlimited`` leaves the libraries alone, ``auto`` is the default.

Example:
    >>> from jaxbridge._foreign import threads
    >>> threads.setting()[0] in ("auto", "fixed", "leave")
    True
"""

from __future__ import annotations

import ctypes
import os
import sys

from .._core import extensions

__all__ = ["setting", "use", "refresh", "budget"]

_native = extensions.load("_hostcall")

# (get, set) symbol names of libraries whose thread count is process-wide and an int.
_BLAS_SYMBOLS = {
    "openblas": [("openblas_get_num_threads", "openblas_set_num_threads"),
                 ("scipy_openblas_get_num_threads64_", "scipy_openblas_set_num_threads64_"),
                 ("scipy_openblas_get_num_threads", "scipy_openblas_set_num_threads"),
                 ("openblas_get_num_threads64_", "openblas_set_num_threads64_")],
    "mkl": [("MKL_Get_Max_Threads", "MKL_Set_Num_Threads")],
}
_scanned_modules = -1  # len(sys.modules) when the libraries were last looked for
_override: str | int | None = None


def setting() -> tuple[str, int]:
    """("auto", 0), ("fixed", N) or ("leave", 0): `use`'s override, else the environment's
    JAXBRIDGE_HOST_BLAS_THREADS (default auto)."""
    value = _override if _override is not None else \
        os.environ.get("JAXBRIDGE_HOST_BLAS_THREADS", "auto")
    text = str(value).strip().lower()
    if text in ("auto", ""):
        return "auto", 0
    if text in ("0", "unlimited", "none"):
        return "leave", 0
    try:
        limit = int(text)
    except ValueError:
        raise ValueError(f"jaxbridge: environment variable JAXBRIDGE_HOST_BLAS_THREADS must "
                         f"be 'auto', a positive integer or 'unlimited', got {value!r}") from None
    return ("fixed", limit) if limit > 0 else ("leave", 0)


def use(value: str | int | None) -> None:
    """Override the setting ("auto", "unlimited", N; None: the environment's), for
    benchmarks and tests; users set JAXBRIDGE_HOST_BLAS_THREADS."""
    global _override, _scanned_modules
    _override, _scanned_modules = value, -1
    refresh()


def refresh() -> None:
    """(Re)discover the loaded BLAS libraries when modules were imported since the last
    look (SciPy, say, brings its own), and hand the setting to the runtime."""
    global _scanned_modules
    if _native is None or len(sys.modules) == _scanned_modules:
        return
    policy, limit = setting()
    functions = [] if policy == "leave" else _blas_functions()
    if _native.set_thread_policy(policy, limit, functions):
        _scanned_modules = len(sys.modules)


def budget() -> int:
    """The thread budget of the host call running on this thread (0: leave the
    libraries' own setting alone): torch's intra-op threads follow it."""
    return 0 if _native is None else int(_native.thread_budget())


def _blas_functions() -> list[tuple[int, int]]:
    """(get, set) addresses of every loaded BLAS library's thread-count functions."""
    try:
        from threadpoolctl import ThreadpoolController
    except ImportError:  # pragma: no cover - threadpoolctl is a dependency
        return []
    found = []
    for lib in ThreadpoolController().lib_controllers:
        for get, set_ in _BLAS_SYMBOLS.get(lib.internal_api, ()):
            g, s = getattr(lib.dynlib, get, None), getattr(lib.dynlib, set_, None)
            if g is not None and s is not None:
                g_ptr = ctypes.cast(g, ctypes.c_void_p).value
                s_ptr = ctypes.cast(s, ctypes.c_void_p).value
                if g_ptr and s_ptr:
                    found.append((g_ptr, s_ptr))
                break
    return found
