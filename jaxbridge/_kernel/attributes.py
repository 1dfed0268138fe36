"""FFI attributes: the static keyword arguments of a kernel call, typed as the C++
handler binds them with ``.Attr<T>()``."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from .._core.jaxapi import is_tracer
from ..errors import KernelError, describe

__all__ = ["ATTR_TYPES", "RESERVED_ATTR_PREFIX", "attr_type", "convert_attr"]

#: Attribute names of jaxbridge's own (the guarded call's); a kernel may not use them.
RESERVED_ATTR_PREFIX = "jaxbridge_"

# Python value (or declared type) -> the C++ type the handler binds with .Attr<T>().
ATTR_TYPES: dict[Any, str] = {
    bool: "bool", int: "int64_t", float: "double", str: "std::string_view",
    np.bool_: "bool", np.int8: "int8_t", np.int16: "int16_t", np.int32: "int32_t",
    np.int64: "int64_t", np.uint8: "uint8_t", np.uint16: "uint16_t", np.uint32: "uint32_t",
    np.uint64: "uint64_t", np.float32: "float", np.float64: "double",
}


def attr_type(value: Any) -> type | None:
    """The attribute type a default value or a declared type stands for."""
    if isinstance(value, type):
        return bool if value is np.bool_ else value if value in ATTR_TYPES else None
    if isinstance(value, (bool, np.bool_)):
        return bool
    if isinstance(value, str):
        return str
    if isinstance(value, np.generic) and type(value) in ATTR_TYPES:
        return type(value)
    if isinstance(value, int):
        return int
    if isinstance(value, float):
        return float
    return None


def _not_static(where: str, key: str, value: Any, declared: type | None) -> KernelError:
    """The error for a JAX value given as an attribute (a static value)."""
    wanted = (f"declared {ATTR_TYPES[declared]} ({declared.__name__})" if declared
              else "an FFI attribute")
    if is_tracer(value):
        got = f"a traced value ({describe(value)}, inside jit, grad, vmap or a loop)"
    else:
        got = f"a JAX array ({describe(value)})"
    return KernelError(
        f"{where}: attribute {key!r} ({wanted}) received {got}. Attributes are static: "
        f"compiled into the program, one compilation per value, like jax.jit's "
        f"static_argnums. Pass a Python or NumPy scalar; for a value that changes at run "
        f"time, make it an array argument of the kernel instead (a positional argument, "
        f"an .Arg<ffi::Buffer<...>>() in the C++ binding; listed in nondiff_argnums if it "
        f"is not differentiated).")


def convert_attr(where: str, key: str, value: Any, declared: type | None) -> Any:
    """`value` as the FFI attribute of type `declared` (inferred from `value` if None)."""
    if isinstance(value, jax.Array):  # tracers are too
        raise _not_static(where, key, value, declared)
    if str(key).startswith(RESERVED_ATTR_PREFIX):
        raise KernelError(f"{where}: attribute {key!r}: the prefix {RESERVED_ATTR_PREFIX!r} is "
                          f"reserved for jaxbridge's own attributes; rename it")
    kind = declared or attr_type(value)
    if kind is None:
        raise KernelError(f"{where}: attribute {key!r} must be a bool, int, float, str or "
                          f"NumPy scalar (an FFI attribute); received "
                          f"{type(value).__name__} {value!r}")
    ok = {
        bool: isinstance(value, (bool, np.bool_)),
        str: isinstance(value, str),
    }.get(kind)
    if ok is None:  # numbers: ints for integer attributes; ints or floats for floats
        is_int = isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))
        is_float = isinstance(value, (float, np.floating))
        ok = is_int if np.issubdtype(np.dtype(kind), np.integer) else (is_int or is_float)
    if not ok:
        raise KernelError(
            f"{where}: attribute {key!r} is declared {ATTR_TYPES[kind]} "
            f"({kind.__name__}); received {type(value).__name__} {value!r}")
    if kind is bool:
        return np.bool_(value)
    if kind is str:
        return value
    if kind is int:
        return np.int64(value)
    if kind is float:
        return np.float64(value)
    return kind(value)
