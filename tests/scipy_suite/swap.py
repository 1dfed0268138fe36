"""Which of SciPy's names jaxbridge replaces, and the replacement of a test module's globals.

A SciPy test module reaches a solver either as a global bound to the function
(``from scipy.optimize import minimize``) or through a global bound to a SciPy module
(``from scipy import optimize``; ``optimize.minimize(...)``). `swapped_globals` gives,
for one test module, the new value of each such global: the jaxbridge function, or a
`ProxyModule` that answers the swapped names with jaxbridge's and everything else with
SciPy's own module. SciPy itself is never modified: only the test module's globals
change, and only while one of its tests runs.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import types
from collections.abc import Iterator
from typing import Any

#: jaxbridge submodule -> the SciPy module whose names it replaces.
MODULES = {
    "integrate": "scipy.integrate",
    "optimize": "scipy.optimize",
    "sparse.linalg": "scipy.sparse.linalg",
    "signal": "scipy.signal",
    "special": "scipy.special",
}


def _is_function(value: Any) -> bool:
    # Result classes (OptimizeResult, OdeSolution) and constants are not swapped: SciPy's
    # tests build SciPy's own objects with them, which jaxbridge's functions never return.
    return callable(value) and not inspect.isclass(value)


def swapped_functions() -> dict[str, dict[str, tuple[Any, Any]]]:
    """{SciPy module name: {name: (SciPy's function, jaxbridge's function)}} for every
    public function a jaxbridge.scipy submodule exports under SciPy's name."""
    table: dict[str, dict[str, tuple[Any, Any]]] = {}
    for ours, theirs in MODULES.items():
        jb = importlib.import_module(f"jaxbridge.scipy.{ours}")
        sp = importlib.import_module(theirs)
        table[theirs] = {name: (getattr(sp, name), getattr(jb, name))
                         for name in jb.__all__
                         if _is_function(getattr(jb, name)) and hasattr(sp, name)}
    return table


@functools.cache
def swapped_names() -> frozenset[str]:
    """Every swapped function's name (``minimize``, ``solve_ivp``, ``kv``, ...)."""
    return frozenset(name for names in swapped_functions().values() for name in names)


class ProxyModule(types.ModuleType):
    """SciPy's module `real`, except for the names in `overrides`.

    >>> import scipy.optimize
    >>> proxy = ProxyModule(scipy.optimize, {"minimize": print})
    >>> proxy.minimize is print, proxy.rosen is scipy.optimize.rosen
    (True, True)
    """

    def __init__(self, real: types.ModuleType, overrides: dict[str, Any]):
        super().__init__(real.__name__, real.__doc__)
        self.__dict__.update(overrides)
        self.__dict__["_proxied"] = real

    def __getattr__(self, name: str) -> Any:  # only for names not in overrides
        return getattr(self.__dict__["_proxied"], name)

    def __dir__(self) -> list[str]:
        return sorted(set(dir(self.__dict__["_proxied"])) | set(self.__dict__))


def _proxies(table: dict[str, dict[str, tuple[Any, Any]]]) -> dict[str, ProxyModule]:
    """A proxy for each SciPy module on the way to a swapped function (``scipy``,
    ``scipy.sparse``, ``scipy.sparse.linalg``, ...), each pointing at its children."""
    overrides: dict[str, dict[str, Any]] = {}
    for module, names in table.items():
        overrides.setdefault(module, {}).update({n: ours for n, (_, ours) in names.items()})
        parts = module.split(".")
        for depth in range(1, len(parts)):
            overrides.setdefault(".".join(parts[:depth]), {})
    proxies: dict[str, ProxyModule] = {}
    for module in sorted(overrides, key=lambda m: -m.count(".")):  # children first
        children = {m.rpartition(".")[2]: p for m, p in proxies.items()
                    if m.rpartition(".")[0] == module}
        proxies[module] = ProxyModule(importlib.import_module(module),
                                      {**overrides[module], **children})
    return proxies


def swapped_globals(namespace: dict[str, Any]) -> dict[str, Any]:
    """{global name: jaxbridge's replacement} for a test module's global namespace."""
    table = swapped_functions()
    by_identity = {id(theirs): ours for names in table.values()
                   for theirs, ours in names.values()}
    proxies = _proxies(table)
    new: dict[str, Any] = {}
    for name, value in namespace.items():
        if isinstance(value, types.ModuleType) and value.__name__ in proxies:
            new[name] = proxies[value.__name__]
        elif _is_function(value) and id(value) in by_identity:
            new[name] = by_identity[id(value)]
    return new


def _code_names(code: types.CodeType) -> Iterator[str]:
    yield from code.co_names
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _code_names(const)


def _functions_of(value: Any) -> Iterator[types.FunctionType]:
    if isinstance(value, (staticmethod, classmethod)):
        value = value.__func__
    value = getattr(value, "__wrapped__", value)
    if isinstance(value, types.FunctionType):
        yield value
    elif inspect.isclass(value):
        for klass in value.__mro__[:-1]:
            for member in vars(klass).values():
                yield from _functions_of(member)


def names_reached(roots: Any, namespace: dict[str, Any]) -> frozenset[str]:
    """The global and attribute names the code of `roots` (a test function or a test
    class) can reach statically: its functions (a class's methods and its bases'), and
    the test module's own functions and classes they name, transitively."""
    todo = list(_functions_of(roots))
    seen: set[types.CodeType] = set()
    names: set[str] = set()
    while todo:
        fn = todo.pop()
        if fn.__code__ in seen:
            continue
        seen.add(fn.__code__)
        for name in _code_names(fn.__code__):
            names.add(name)
            value = namespace.get(name)
            if getattr(value, "__module__", None) == namespace.get("__name__"):
                todo.extend(_functions_of(value))
    return frozenset(names)
