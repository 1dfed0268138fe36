"""Runs SciPy's root, minimize or least_squares on the host, on a Problem's JAX functions."""

from __future__ import annotations

from typing import Any

import numpy as np
import scipy.optimize

from .._trace import HostFun
from ._kkt import KKT
from ._options import SolveOptions
from ._problem import Problem

ROOT_JAC_METHODS = ("hybr", "lm")
MIN_GRAD_FREE = ("Nelder-Mead", "Powell", "COBYLA", "COBYQA")
MIN_HESS = ("Newton-CG", "dogleg", "trust-ncg", "trust-krylov", "trust-exact")
#: The methods that use a user's `hess` / `hessp` (SciPy's lists).
HESS_METHODS = MIN_HESS + ("trust-constr",)
HESSP_METHODS = ("Newton-CG", "trust-ncg", "trust-krylov", "trust-constr")


def run(pr: Problem, xf: np.ndarray, lb: np.ndarray, ub: np.ndarray,
        opts: SolveOptions, kkt: KKT | None = None) -> Any:
    """SciPy's solution (its OptimizeResult) from the flat float64 start `xf`; `kkt`
    gives minimize's constraints."""
    options = dict(opts.options)
    if opts.kind == "root":
        return _run_root(pr, xf, opts, options)
    if opts.kind == "minimize":
        cons = () if kkt is None else _scipy_constraints(kkt, xf, opts)
        return _run_minimize(pr, xf, (lb, ub, cons), opts, options)
    return _run_least_squares(pr, xf, lb, ub, opts, options)


def _run_root(pr: Problem, xf: np.ndarray, opts: SolveOptions, options: dict) -> Any:
    kw = {"jac": (lambda x: pr("G_jac", x))} if (
        opts.method in ROOT_JAC_METHODS and opts.jac is not False) else {}
    return scipy.optimize.root(lambda x: pr("F", x), xf, method=opts.method, tol=opts.tol,
                               callback=opts.callback, options=options or None, **kw)


def _run_minimize(pr: Problem, xf: np.ndarray, limits: tuple, opts: SolveOptions,
                  options: dict) -> Any:
    """`limits`: (lb, ub, SciPy's constraints)."""
    lb, ub, cons = limits
    method = opts.method
    kw: dict[str, Any] = {}  # scipy.optimize.minimize's keyword arguments
    if method not in MIN_GRAD_FREE:
        kw["jac"] = True
        obj = lambda x: pr("value_and_grad", x)  # noqa: E731
    else:
        obj = lambda x: float(pr("F", x))  # noqa: E731
    kw.update(_hessian(pr, opts))
    if np.isfinite(lb).any() or np.isfinite(ub).any():
        kw["bounds"] = scipy.optimize.Bounds(lb, ub)
    if cons:
        kw["constraints"] = cons
    return scipy.optimize.minimize(obj, xf, method=method, tol=opts.tol,
                                   callback=opts.callback, options=options or None, **kw)


def _hessian(pr: Problem, opts: SolveOptions) -> dict[str, Any]:
    """minimize's `hess`/`hessp` for SciPy: the user's (a JAX function, run on the host,
    or what SciPy takes as is) for the methods that use them, else JAX's exact ones for
    the Newton and trust-region methods."""
    kw: dict[str, Any] = {}
    uses_hessp = opts.method in HESSP_METHODS
    if opts.hess is not None and opts.method in HESS_METHODS:
        kw["hess"] = (lambda x: pr("user_hess", x)) if isinstance(opts.hess, HostFun) \
            else opts.hess
    elif opts.hessp is not None and uses_hessp:
        kw["hessp"] = (lambda x, v: pr("user_hessp", x, v)) \
            if isinstance(opts.hessp, HostFun) else opts.hessp
    elif opts.method in ("dogleg", "trust-exact"):
        kw["hess"] = lambda x: pr("hess", x)
    elif opts.method in MIN_HESS:
        kw["hessp"] = lambda x, v: pr("hessp", x, v)
    return kw


def _scipy_constraints(kkt: KKT, xf: np.ndarray, opts: SolveOptions) -> list:
    """The constraints `lo <= g(x) <= hi` as SciPy's method takes them, with JAX's exact
    Jacobian: one NonlinearConstraint for trust-constr (keep_feasible honoured; SciPy's
    default quasi-Newton Hessian: given the exact one, trust-constr stops 1e-5 short of
    x* on a linear constraint at tol=1e-9, its default 4e-9), 'eq' and 'ineq' dicts for
    SLSQP (whose form is ``c(x) = 0`` and ``c(x) >= 0``)."""
    _, lo, hi = kkt("user_rows", xf)  # the limits do not depend on x
    g = lambda x: kkt("user_rows", x)[0]  # noqa: E731
    jac = lambda x: kkt("user_jac", x)  # noqa: E731
    if opts.method == "trust-constr":
        return [scipy.optimize.NonlinearConstraint(
            g, lo, hi, jac=jac, keep_feasible=np.asarray(opts.constraints[1], bool))]
    eq = np.isfinite(lo) & (lo == hi)
    above, below = np.isfinite(lo) & ~eq, np.isfinite(hi) & ~eq
    cons = []
    if eq.any():
        cons.append({"type": "eq", "fun": lambda x: g(x)[eq] - lo[eq],
                     "jac": lambda x: jac(x)[eq]})
    if above.any() or below.any():
        cons.append({"type": "ineq",
                     "fun": lambda x: np.concatenate([(v := g(x))[above] - lo[above],
                                                      hi[below] - v[below]]),
                     "jac": lambda x: np.concatenate([(d := jac(x))[above], -d[below]])})
    return cons


def _run_least_squares(pr: Problem, xf: np.ndarray, lb: np.ndarray, ub: np.ndarray,
                       opts: SolveOptions, options: dict) -> Any:
    if "tr_options" in options:
        options["tr_options"] = dict(options["tr_options"])
    if isinstance(options.get("x_scale"), tuple):
        options["x_scale"] = np.asarray(options["x_scale"])
    return scipy.optimize.least_squares(
        lambda x: pr("F", x), xf, jac=lambda x: pr("lsq_jac", x), bounds=(lb, ub),
        callback=opts.callback, **options)
