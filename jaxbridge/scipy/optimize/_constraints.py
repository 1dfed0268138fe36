"""minimize's `constraints` in every form SciPy takes, as one JAX function `lo <= g(x) <= hi`.

SciPy accepts a dict ``{'type': 'eq'|'ineq', 'fun', 'jac'?, 'args'?}``, a
`NonlinearConstraint` (``lb <= fun(x) <= ub``), a `LinearConstraint`
(``lb <= A @ x <= ub``), or a list or tuple of them. All become one function
``constraint_values(x, *args) -> (g, lo, hi)`` with SciPy's meaning: an 'eq' dict is
``0 <= fun(x) <= 0``, an 'ineq' dict ``0 <= fun(x) <= inf``. `lo` and `hi` are outputs
(not constants), so a `NonlinearConstraint` whose `lb`/`ub` are traced values is
differentiable in them like in anything `fun` closes over; the dicts' `args` are the
function's own `args`, lifted out as operands the way minimize's `args` are.
A constraint's `jac` is not called: JAX's exact Jacobian of its `fun` is used (as for
minimize's finite-difference `jac` strings).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import scipy.optimize

from .._trace import check_args, raise_if_not_traceable

_NAME = "jaxbridge.scipy.optimize.minimize"


@dataclasses.dataclass(frozen=True)
class ConstraintSet:
    """The user's constraints as one function of `(x, *args)` returning `(g, lo, hi)`.

    `args` holds each dict constraint's `args` tuple (an empty tuple for the other
    forms), in order; `keep_feasible` is SciPy's flag per component of `g` (honoured by
    'trust-constr', as in SciPy).
    """

    values: Callable[..., Any]
    args: tuple
    keep_feasible: tuple[bool, ...]


def normalize(constraints: Any, x0: jax.Array) -> ConstraintSet | None:
    """The ConstraintSet of SciPy's `constraints` argument (None when there are none).

    Raises SciPy's exception types with messages naming minimize and `constraints`:
    KeyError (a dict without 'type'), TypeError (not a dict or constraint object, or a
    non-string type), ValueError (unknown type, no 'fun', shapes that do not match).
    """
    if constraints is None:
        return None
    if isinstance(constraints, (dict, scipy.optimize.NonlinearConstraint,
                                scipy.optimize.LinearConstraint)):
        constraints = [constraints]
    if not isinstance(constraints, (list, tuple)):
        raise TypeError(f"{_NAME}: constraints must be a dict, a NonlinearConstraint, a "
                        f"LinearConstraint or a list or tuple of them; got "
                        f"{type(constraints).__name__}")
    if not constraints:
        return None
    parts = [_part(i, con, x0) for i, con in enumerate(constraints)]
    values = _combined([p[0] for p in parts])
    args = tuple(p[1] for p in parts)
    x_aval = jax.ShapeDtypeStruct(x0.shape, x0.dtype)
    keep = np.concatenate([np.broadcast_to(np.asarray(p[2], bool), (size,)) for p, size in
                           zip(parts, _sizes(parts, x_aval, args))])
    return ConstraintSet(values, args, tuple(bool(k) for k in keep))


def _sizes(parts: list, x_aval: Any, args: tuple) -> list[int]:
    """The number of components of each constraint's `g` (a constraint written in NumPy
    is an `UntraceableFunctionError`: minimize then runs as SciPy's, undifferentiated)."""
    sizes = []
    for i, (p, a) in enumerate(zip(parts, args)):
        try:
            g = jax.eval_shape(p[0], x_aval, *a)[0]
        except Exception as exc:
            raise_if_not_traceable(exc, "optimize.minimize", f"constraints[{i}]",
                                   "fun(x, *args)")
            raise
        sizes.append(int(np.prod(g.shape)))
    return sizes


def _combined(pieces: list[Callable[..., Any]]) -> Callable[..., Any]:
    """One function of `(x, *args_per_piece)`: the pieces' (g, lo, hi) concatenated."""
    def values(x: Any, *args: Any) -> tuple[Any, Any, Any]:
        outs = [piece(x, *a) for piece, a in zip(pieces, args)]
        g, lo, hi = (jnp.concatenate([o[k] for o in outs]) for k in range(3))
        return g, lo, hi
    return values


def _part(i: int, con: Any, x0: jax.Array) -> tuple[Callable[..., Any], tuple, Any]:
    """(a function `(x, *args) -> (g, lo, hi)`, its args, keep_feasible) of constraint i."""
    if isinstance(con, dict):
        return _dict_part(i, con)
    if isinstance(con, scipy.optimize.NonlinearConstraint):
        fun = con.fun
        if not callable(fun):
            raise TypeError(f"{_NAME}: constraints[{i}].fun must be callable, got "
                            f"{type(fun).__name__}")
        lb, ub = con.lb, con.ub

        def nonlinear(x: Any) -> tuple[Any, Any, Any]:
            g = jnp.ravel(fun(x))
            return g, _limit(lb, g, "lb", i), _limit(ub, g, "ub", i)
        return nonlinear, (), con.keep_feasible
    if isinstance(con, scipy.optimize.LinearConstraint):
        A = np.asarray(con.A.toarray() if hasattr(con.A, "toarray") else con.A, np.float64)
        if A.shape[1] != x0.size:
            raise ValueError(f"{_NAME}: constraints[{i}] (LinearConstraint) has A of shape "
                             f"{A.shape}; A must have x0's {x0.size} columns")
        lb, ub = np.asarray(con.lb, np.float64), np.asarray(con.ub, np.float64)

        def linear(x: Any) -> tuple[Any, Any, Any]:
            g = jnp.asarray(A, x.dtype) @ jnp.ravel(x)
            return g, jnp.asarray(lb, g.dtype), jnp.asarray(ub, g.dtype)
        return linear, (), con.keep_feasible
    raise TypeError(f"{_NAME}: constraints[{i}] must be a dict, a NonlinearConstraint or a "
                    f"LinearConstraint (as in SciPy), got {type(con).__name__}")


def _dict_part(i: int, con: dict) -> tuple[Callable[..., Any], tuple, Any]:
    """An old-style dict constraint, checked as SciPy checks it (its exception types)."""
    if "type" not in con:
        raise KeyError(f"{_NAME}: constraints[{i}] has no type defined (the dict needs "
                       f"'type': 'eq' or 'ineq')")
    kind = con["type"]
    if not isinstance(kind, str):
        raise TypeError(f"{_NAME}: constraints[{i}]['type'] must be a string ('eq' or "
                        f"'ineq'), got {type(kind).__name__}")
    if kind.lower() not in ("eq", "ineq"):
        raise ValueError(f"{_NAME}: constraints[{i}] has unknown constraint type "
                         f"{kind!r}; expected 'eq' or 'ineq'")
    if "fun" not in con:
        raise ValueError(f"{_NAME}: constraints[{i}] has no function defined (the dict "
                         f"needs 'fun')")
    fun = con["fun"]
    if not callable(fun):
        raise TypeError(f"{_NAME}: constraints[{i}]['fun'] must be callable, got "
                        f"{type(fun).__name__}")
    # SciPy calls fun(x, *args): any iterable is unpacked (a list too), as here
    args = check_args(con.get("args", ()), "optimize.minimize",
                      f"constraints[{i}]['fun'](x, *args)", "unpack")
    eq = kind.lower() == "eq"

    def old_style(x: Any, *a: Any) -> tuple[Any, Any, Any]:
        g = jnp.ravel(fun(x, *a))
        zero = jnp.zeros_like(g)
        return g, zero, zero if eq else jnp.full_like(g, jnp.inf)
    return old_style, args, False


def _limit(v: Any, g: jax.Array, which: str, i: int) -> jax.Array:
    """A NonlinearConstraint's `lb`/`ub` broadcast to its values (traced values stay traced)."""
    v = jnp.ravel(jnp.asarray(v, g.dtype))
    if v.size not in (1, g.size):
        raise ValueError(f"{_NAME}: constraints[{i}] (NonlinearConstraint) has {which} of "
                         f"{v.size} entries for a fun of {g.size} values")
    return jnp.broadcast_to(v, g.shape)
