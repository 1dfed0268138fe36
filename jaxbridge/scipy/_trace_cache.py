"""Traces of user functions kept for repeat eager calls, and when they are still valid.

A repeat eager call (a notebook, SciPy's own test files) passes the same function
object with the same argument shapes again. Tracing it anew (`jax.make_jaxpr`) costs
more than many small SciPy solves, so `_trace.convert` keeps the trace -- but only
while everything the trace read is provably unchanged, because a trace bakes in the
values a function reads when it is traced: a closed-over Python float becomes a
literal, a closed-over array a constant. A function may read a global rebound since,
a closure cell rebound since, or a NumPy array written in place since.

So with each trace goes a *snapshot* of what the function can reach: its closure
cells, the globals its code names (also those of nested code and of the Python
functions it calls, recursively), its defaults, and for `functools.partial` its
arguments. A later call reuses the trace only when every one of them is the same
again:

* `None`, bools, ints, strings and floats by value (a float by its exact bits);
* JAX arrays (immutable) and functions, builtins and NumPy ufuncs by identity
  (functions also by their own snapshot);
* NumPy arrays by dtype, shape and contents (a private copy is kept; at most
  `MAX_ARRAY_BYTES`);
* modules and classes of JAX, NumPy, SciPy and Python's standard names by identity;
* tuples, frozensets and slices element by element.

Anything else (a list, a dict, an object with attributes, a callable object, a tracer,
a large NumPy array) makes the function *untracked*: it is traced on every call, as
before. Traces are keyed on the function by a weak reference (dropped with it) and
kept in a bounded LRU (`TRACE_CACHE_SIZE`).

What a snapshot cannot see: a function that reads state through an allowed module
(e.g. draws `np.random` numbers while traced) gets the values of its first trace,
as under `jax.jit`.
"""

from __future__ import annotations

import builtins
import functools
import types
import weakref
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import jax
import numpy as np

from .._core.jaxapi import is_tracer
from ._common import LruCache

__all__ = ["TRACE_CACHE_SIZE", "MAX_ARRAY_BYTES", "cached_trace", "store_trace",
           "trace_cache_info", "snapshot", "values_key"]

TRACE_CACHE_SIZE = 128
MAX_ARRAY_BYTES = 1 << 16   # closed-over NumPy arrays compared by contents up to this
_MAX_DEPTH = 6              # functions called through functions
_TRUSTED_MODULES = frozenset({"jax", "jaxlib", "numpy", "scipy", "math", "cmath",
                              "operator", "functools", "builtins", "jaxbridge", "typing"})

_traces = LruCache(lambda: max(TRACE_CACHE_SIZE, 1))


class Untracked(Exception):
    """The function reaches something whose changes a snapshot cannot see."""


def _trusted(obj: Any) -> bool:
    """Whether `obj` (a module, class or function) is JAX's, NumPy's, SciPy's or Python's."""
    name = obj.__name__ if isinstance(obj, types.ModuleType) else \
        getattr(obj, "__module__", None)
    return isinstance(name, str) and name.split(".", 1)[0] in _TRUSTED_MODULES


def _value(v: Any, depth: int, seen: frozenset) -> Hashable:
    """A hashable stand-in for `v` that compares equal while `v` reads the same
    (raises Untracked). Objects compared by identity lead with their `id`, so that two
    different objects are never compared with `==`."""
    if v is None or type(v) in (bool, int, str, bytes):
        return (type(v), v)
    if type(v) is float:
        return (float, v.hex())
    if type(v) is complex:
        return (complex, v.real.hex(), v.imag.hex())
    if type(v) is np.ndarray:  # (not a subclass: a masked array's mask is elsewhere)
        if v.dtype == object or v.nbytes > MAX_ARRAY_BYTES:
            raise Untracked
        return ("ndarray", v.dtype.str, v.shape, v.tobytes())
    if isinstance(v, np.generic):
        return ("scalar", v.dtype.str, v.tobytes())
    if isinstance(v, jax.Array):  # immutable, unless it is a tracer
        if is_tracer(v):
            raise Untracked
        return ("identity", id(v), v)
    if type(v) in (tuple, frozenset):
        return (type(v), tuple(_value(x, depth, seen) for x in v))
    if type(v) is slice:
        return (slice, _value((v.start, v.stop, v.step), depth, seen))
    if isinstance(v, types.FunctionType) and not _trusted(v):
        return ("function", id(v), v, _function(v, depth + 1, seen))
    if type(v) is functools.partial:
        return ("partial", _value(v.func, depth, seen), _value(v.args, depth, seen),
                _value(tuple(sorted(v.keywords.items())), depth, seen))
    if isinstance(v, (types.BuiltinFunctionType, np.ufunc)) or \
            (isinstance(v, (types.ModuleType, type)) or callable(v)) and _trusted(v):
        return ("identity", id(v), v)
    raise Untracked


def _names(code: types.CodeType) -> set[str]:
    """The global names `code` and the code nested in it (lambdas, comprehensions) use."""
    names = set(code.co_names)
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            names |= _names(c)
    return names


def _function(fn: types.FunctionType, depth: int, seen: frozenset) -> Hashable:
    """What a trace of `fn` can depend on besides its arguments (raises Untracked)."""
    if id(fn) in seen:
        return ("recursive", id(fn))
    if depth > _MAX_DEPTH:
        raise Untracked
    seen = seen | {id(fn)}
    glob = fn.__globals__
    globals_ = tuple(sorted(
        (name, _value(glob[name], depth, seen) if name in glob else
         ("builtin",) if hasattr(builtins, name) else ("missing",))
        for name in _names(fn.__code__)))
    cells = tuple(_value(_cell(c), depth, seen) for c in fn.__closure__ or ())
    return (fn.__code__, globals_, cells, _value(fn.__defaults__, depth, seen),
            _value(tuple(sorted((fn.__kwdefaults__ or {}).items())), depth, seen))


def _cell(cell: Any) -> Any:
    try:
        return cell.cell_contents
    except ValueError:  # an empty cell (a name the enclosing scope assigns later)
        raise Untracked from None


def snapshot(fun: Callable[..., Any]) -> Hashable | None:
    """What a trace of `fun` read, as a comparable value; None: `fun` is untracked.

    The snapshot never holds `fun` itself (its kept trace is dropped with `fun`).

    >>> k = 2.0
    >>> f = lambda x: k * x
    >>> before = snapshot(f)
    >>> before == snapshot(f), (k := 3.0) and before == snapshot(f)
    (True, False)
    >>> params = {"k": 2.0}
    >>> snapshot(lambda x: params["k"] * x) is None  # a dict: untracked
    True
    """
    try:
        if isinstance(fun, types.FunctionType):
            return _function(fun, 0, frozenset())
        if type(fun) is functools.partial:
            return _value(fun, 0, frozenset())
    except (Untracked, RecursionError):
        pass
    return None


def values_key(values: Sequence[Any]) -> Hashable | None:
    """`values` (e.g. the static leaves of SciPy's `args`) as a comparable value, as a
    snapshot compares them; None if one of them is untracked."""
    try:
        return _value(tuple(values), 0, frozenset())
    except (Untracked, RecursionError):
        return None


# Entries of collected functions: their weak references' callbacks only note them
# (a callback may run inside the cache's lock), and the next lookup drops them.
_dead: list = []


def cached_trace(fun: Callable[..., Any], key: Hashable) -> tuple[Any, Hashable | None]:
    """(the kept trace of `fun` for `key` if `fun` reads the same as then, else None;
    `fun`'s snapshot now, for `store_trace`, None if `fun` is untracked)."""
    while _dead:
        _traces.pop(_dead.pop())
    state = snapshot(fun)
    if state is None:
        return None, None
    entry = _traces.get((weakref.ref(fun), key))
    if entry is not None and entry[0] == state:
        return entry[1], state
    return None, state


def store_trace(fun: Callable[..., Any], key: Hashable, state: Hashable, trace: Any) -> None:
    """Keep `trace` for `(fun, key)` with the snapshot taken before tracing; the entry
    goes when `fun` is collected or falls out of the LRU."""
    def collected(ref: weakref.ref) -> None:
        _dead.append((ref, key))

    _traces.put((weakref.ref(fun, collected), key), (state, trace), replace=True)


def trace_cache_info() -> dict:
    """Hits, misses, current size and bound of the kept traces."""
    return _traces.info()
