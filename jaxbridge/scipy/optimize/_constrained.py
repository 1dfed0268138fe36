"""minimize with `constraints`: SciPy's SLSQP or trust-constr on the host, differentiated by KKT.

`solve` takes the same inputs and gives the same outputs as `_implicit.solve` (one
foreign function of `(x0, lb, ub, params, fixed, jac_ops)`, one static
`SolveOptions`), but its rules differentiate the KKT conditions of the active set at
x* (`_kkt`) instead of `grad f = 0`: bounds and the user's constraints are rows of one
system, so gradients flow to the parameters of the objective and of the constraints
(closures, dict `args`, a NonlinearConstraint's `lb`/`ub`) and to the bounds.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ... import _foreign
from .._common import f64, failure, fill_zeros, nan_like, np_unravel, on_cpu
from . import _fields, _run_scipy
from ._implicit import result_shapes, scipy_stats
from ._kkt import KKT
from ._options import SolveOptions
from ._problem import Problem


@_foreign.foreign(result_shapes)
def solve(x0: Any, lb: Any, ub: Any, params: Any, fixed: Any, jac_ops: Any, *,
          opts: SolveOptions) -> Any:
    """x* (shaped like x0), zeros where `_implicit.solve` gives the active bounds (the
    active set is found by the rules, at x*), SciPy's (status, nfev, njev, nit, message
    number), success and the method's own fields; `params` and the bounds are
    differentiable."""
    primals = (x0, lb, ub, params, fixed, jac_ops)
    lbf, ubf = np.ravel(f64(lb)), np.ravel(f64(ub))
    with on_cpu():
        sol = _run_scipy.run(Problem(primals, opts), np.ravel(f64(x0)), lbf, ubf, opts,
                             KKT(primals, opts))
    x = np.asarray(sol.x, np.float64)
    ok = bool(sol.success) and bool(np.all(np.isfinite(x)))
    active = np.zeros(x0.shape, np.int8)
    extras = _fields.host_values(sol, _fields.spec(opts.kind, opts.method, x0.size))
    if not ok:
        if opts.on_failure == "raise":
            raise failure(opts.qualname, f"{opts.kind}(method={opts.method!r}): {sol.message}")
        return (np.full(x0.shape, np.nan, x0.dtype), active, scipy_stats(sol),
                np.bool_(False), extras)
    return (x.reshape(x0.shape).astype(x0.dtype), active, scipy_stats(sol), np.bool_(True),
            extras)


def _at_solution(primals: tuple, out: Any, opts: SolveOptions) -> tuple | None:
    """(kkt, x*, side, lam), or None where the derivative is NaN (a failed solve, or a
    degenerate x* with on_failure="nan")."""
    if not bool(out[3]):
        return None
    kkt = KKT(primals, opts)
    x = np.ravel(f64(out[0]))
    found = kkt.active_set(x, opts.on_failure)
    return None if found is None else (kkt, x, *found)


@solve.defvjp
def _solve_vjp(primals: tuple, out: Any, ct: Any, *, opts: SolveOptions) -> Any:
    x0, lb, ub, params, fixed, jac_ops = primals
    if _fields.has_cotangent(ct[4]):  # (the fields have no rule)
        return (None, *nan_like((lb, ub, params)), None, None)
    with on_cpu():
        at = _at_solution(primals, out, opts)
        if at is None:
            return (None, *nan_like((lb, ub, params)), None, None)
        kkt, x, side, lam = at
        rhs = np.concatenate([np.ravel(f64(ct[0])), np.zeros(lam.size)])
        w = kkt.solve(x, lam, side, rhs, True, opts.on_failure)
        p_bar, lb_bar, ub_bar = kkt("theta_vjp", x, lam, side.astype(np.float64), -w)
    return (None, lb_bar.reshape(lb.shape).astype(lb.dtype),
            ub_bar.reshape(ub.shape).astype(ub.dtype), np_unravel(p_bar, params), None, None)


@solve.defjvp
def _solve_jvp(primals: tuple, out: Any, tangents: Any, *, opts: SolveOptions) -> Any:
    x0, lb, ub, params, fixed, jac_ops = primals
    _, dlb, dub, dparams, _, _ = tangents
    with on_cpu():
        at = _at_solution(primals, out, opts)
        if at is None:
            return (np.full(x0.shape, np.nan, x0.dtype), None, None, None,
                    _fields.no_tangents(out[4]))
        kkt, x, side, lam = at
        zeros = np.zeros(x.size)
        dR = kkt("theta_jvp", x, lam, side.astype(np.float64), fill_zeros(dparams, params),
                 zeros if dlb is None else np.ravel(f64(dlb)),
                 zeros if dub is None else np.ravel(f64(dub)))
        dz = -kkt.solve(x, lam, side, dR, False, opts.on_failure)
    return (dz[:x.size].reshape(x0.shape).astype(x0.dtype), None, None, None,
            _fields.no_tangents(out[4]))
