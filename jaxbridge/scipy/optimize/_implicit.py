"""The implicit-function core: SciPy finds x*(p); the tangent and adjoint rules solve with dG/dx.

`solve` is one foreign function of `(x0, lb, ub, params, fixed, jac_ops)` with one
static `SolveOptions`: its forward runs SciPy on the host, its rules differentiate the
optimality condition `G(x*, p) = 0` (see the package docstring), holding the
coordinates at an active bound there.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ... import _foreign
from .._common import f64, failure, fill_zeros, nan_like, np_unravel, on_cpu
from . import _active, _fields, _run_scipy
from ._options import SolveOptions
from ._problem import Problem


def _count(sol: Any, field: str) -> int:
    value = sol.get(field, -1) if hasattr(sol, "get") else getattr(sol, field, -1)
    return -1 if value is None else int(value)


def scipy_stats(sol: Any) -> np.ndarray:
    """SciPy's (status, nfev, njev, nit), -1 where the method does not report one."""
    return np.array([int(getattr(sol, "status", 0) or 0), _count(sol, "nfev"),
                     _count(sol, "njev"), _count(sol, "nit"),
                     _fields.message_id(getattr(sol, "message", ""))], np.int32)


def result_shapes(x0: Any, lb: Any, ub: Any, params: Any, fixed: Any, jac_ops: Any, *,
                  opts: SolveOptions) -> Any:
    """The shapes of a solve's outputs (x*, active bounds, SciPy's counters, success,
    the method's own fields)."""
    return (jax.ShapeDtypeStruct(x0.shape, x0.dtype),
            jax.ShapeDtypeStruct(x0.shape, jnp.int8),    # active bound: -1, 0, 1
            jax.ShapeDtypeStruct((5,), jnp.int32),       # status, nfev, njev, nit, message
            jax.ShapeDtypeStruct((), jnp.bool_),         # success
            _fields.spec(opts.kind, opts.method, x0.size))  # the method's own fields


@_foreign.foreign(result_shapes)
def solve(x0: Any, lb: Any, ub: Any, params: Any, fixed: Any, jac_ops: Any, *,
          opts: SolveOptions) -> Any:
    """x* (shaped like x0), the active bounds (-1/0/+1), SciPy's (status, nfev, njev,
    nit, message number), success and the method's own fields (`_fields.spec`);
    `params` and the bounds are differentiable."""
    primals = (x0, lb, ub, params, fixed, jac_ops)
    lbf, ubf = np.ravel(f64(lb)), np.ravel(f64(ub))
    with on_cpu():
        pr = Problem(primals, opts)
        sol = _run_scipy.run(pr, np.ravel(f64(x0)), lbf, ubf, opts)
        x = np.asarray(sol.x, np.float64)
        ok = bool(sol.success) and bool(np.all(np.isfinite(x)))
        active = (_active.active(sol, x, lbf, ubf, pr, x0.dtype) if ok
                  else np.zeros(x.size, np.int8))
    stats = scipy_stats(sol)
    extras = _fields.host_values(sol, _fields.spec(opts.kind, opts.method, x0.size))
    if not ok:
        if opts.on_failure == "raise":
            raise failure(opts.qualname, f"{opts.kind}(method={opts.method!r}): {sol.message}")
        return (np.full(x0.shape, np.nan, x0.dtype), active.reshape(x0.shape), stats,
                np.bool_(False), extras)
    return (x.reshape(x0.shape).astype(x0.dtype), active.reshape(x0.shape), stats,
            np.bool_(True), extras)


def _free_and_x(out: Any) -> Any:
    x, active = out[0], out[1]
    return np.ravel(f64(x)), np.ravel(np.asarray(active)) == 0


@solve.defvjp
def _solve_vjp(primals: tuple, out: Any, ct: Any, *, opts: SolveOptions) -> Any:
    x0, lb, ub, params, fixed, jac_ops = primals
    if not bool(out[3]) or _fields.has_cotangent(ct[4]):  # (the fields have no rule)
        return (None, *nan_like((lb, ub, params)), None, None)
    with on_cpu():
        pr = Problem(primals, opts)
        x, free = _free_and_x(out)
        g = np.ravel(f64(ct[0]))
        lam = pr.solve(x, g, True, free, opts.linear_solver, opts.on_failure)
        p_bar = -pr("G_vjp_p", x, lam)
        # x*_i = bound_i where active; the bound also moves the free coordinates.
        b_bar = np.where(free, 0.0, g - pr("G_vjp_x", x, lam))
        active = np.ravel(np.asarray(out[1]))
    lb_bar = np.where(active < 0, b_bar, 0.0).reshape(lb.shape).astype(lb.dtype)
    ub_bar = np.where(active > 0, b_bar, 0.0).reshape(ub.shape).astype(ub.dtype)
    return None, lb_bar, ub_bar, np_unravel(p_bar, params), None, None


@solve.defjvp
def _solve_jvp(primals: tuple, out: Any, tangents: Any, *, opts: SolveOptions) -> Any:
    x0, lb, ub, params, fixed, jac_ops = primals
    _, dlb, dub, dparams, _, _ = tangents
    if not bool(out[3]):
        return (np.full(x0.shape, np.nan, x0.dtype), None, None, None,
                _fields.no_tangents(out[4]))
    with on_cpu():
        pr = Problem(primals, opts)
        x, free = _free_and_x(out)
        active = np.ravel(np.asarray(out[1]))
        dx_bound = np.zeros(x.size)
        if dlb is not None:
            dx_bound += np.where(active < 0, np.ravel(f64(dlb)), 0.0)
        if dub is not None:
            dx_bound += np.where(active > 0, np.ravel(f64(dub)), 0.0)
        rhs = pr("G_jvp_p", x, fill_zeros(dparams, params)) + pr("G_jvp_x", x, dx_bound)
        dx = dx_bound - pr.solve(x, rhs, False, free, opts.linear_solver, opts.on_failure)
    return dx.reshape(x0.shape).astype(x0.dtype), None, None, None, _fields.no_tangents(out[4])
