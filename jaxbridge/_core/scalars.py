"""JAX's rule for Python and NumPy scalars: a scalar takes the dtype it is given when
its value converts exactly.

`jnp.int32(5) + 42` is int32 in JAX: the literal is weakly typed. jaxbridge follows that
wherever a dtype is declared (a foreign function's results and rule results, a kernel's
arguments): ``42`` is accepted where int32 is declared. Lossy conversions are refused,
because they would change the value: a fraction into an integer (``3.7 -> int32``), a
value outside the integer range (``-1 -> uint8``, ``2**40 -> int32``), a finite float
that overflows (``1e40 -> float32``), an imaginary part into a real dtype. Rounding a
float to a narrower float (``0.1 -> float32``) is accepted, as JAX does.
"""

from __future__ import annotations

import cmath
import math
from typing import Any

import numpy as np

from .arrays import PY_SCALARS

__all__ = ["is_scalar", "scalar_problem", "convert_scalar"]


def is_scalar(x: Any) -> bool:
    """A Python number or a NumPy scalar (not a 0-d array: that is an array)."""
    return isinstance(x, (*PY_SCALARS, np.generic))


def scalar_problem(value: Any, dtype: Any) -> str | None:
    """Why `value` (a Python or NumPy scalar) does not convert exactly to `dtype`, or
    None if it does."""
    dtype = np.dtype(dtype)
    item = value.item() if isinstance(value, np.generic) else value
    if not isinstance(item, (*PY_SCALARS,)):
        return f"{type(value).__name__} is not a number"
    shown = repr(item)  # 1e+40, not np.float64(1e+40)
    if isinstance(item, complex) and dtype.kind != "c":
        if item.imag != 0:
            return f"{shown} has an imaginary part, which {dtype.name} cannot hold"
        item = item.real
    if dtype.kind == "b":
        return None if item in (0, 1) else f"{shown} is not 0 or 1 (a {dtype.name})"
    if dtype.kind in "iu":
        if isinstance(item, float) and not (math.isfinite(item) and item == int(item)):
            return f"{shown} is not a whole number (an {dtype.name} holds integers)"
        info = np.iinfo(dtype)
        if not info.min <= int(item) <= info.max:
            return f"{shown} is outside the range of {dtype.name} [{info.min}, {info.max}]"
        return None
    if dtype.kind in "fc":
        try:
            with np.errstate(over="ignore"):
                converted = np.asarray(item).astype(dtype)
        except OverflowError:  # an int past float's range, e.g. 10**400
            converted = np.asarray(np.inf, dtype)
        if np.isfinite(converted) or (isinstance(item, (float, complex))
                                      and not cmath.isfinite(item)):
            return None  # rounding is fine; inf and nan stay what they are
        return (f"{shown} overflows {dtype.name} (largest finite value "
                f"{float(np.finfo(dtype).max):.4g})")
    return f"{dtype.name} is not a numeric dtype"


def convert_scalar(value: Any, dtype: Any) -> np.ndarray:
    """`value` as a 0-d array of `dtype`; ValueError (saying why) unless exact."""
    problem = scalar_problem(value, dtype)
    if problem is not None:
        raise ValueError(problem)
    item = value.item() if isinstance(value, np.generic) else value
    if isinstance(item, complex) and np.dtype(dtype).kind != "c":
        item = item.real
    return np.asarray(item, dtype)
