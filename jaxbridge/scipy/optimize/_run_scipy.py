"""Runs SciPy's root, minimize or least_squares on the host, on a Problem's JAX functions."""

from __future__ import annotations

from typing import Any

import numpy as np
import scipy.optimize

from ._options import SolveOptions
from ._problem import Problem

ROOT_JAC_METHODS = ("hybr", "lm")
MIN_GRAD_FREE = ("Nelder-Mead", "Powell", "COBYLA", "COBYQA")
MIN_HESS = ("Newton-CG", "dogleg", "trust-ncg", "trust-krylov", "trust-exact")


def run(pr: Problem, xf: np.ndarray, lb: np.ndarray, ub: np.ndarray,
        opts: SolveOptions) -> Any:
    """SciPy's solution (its OptimizeResult) from the flat float64 start `xf`."""
    options = dict(opts.options)
    if opts.kind == "root":
        return _run_root(pr, xf, opts, options)
    if opts.kind == "minimize":
        return _run_minimize(pr, xf, lb, ub, opts, options)
    return _run_least_squares(pr, xf, lb, ub, opts, options)


def _run_root(pr: Problem, xf: np.ndarray, opts: SolveOptions, options: dict) -> Any:
    kw = {"jac": (lambda x: pr("G_jac", x))} if (
        opts.method in ROOT_JAC_METHODS and opts.jac is not False) else {}
    return scipy.optimize.root(lambda x: pr("F", x), xf, method=opts.method, tol=opts.tol,
                               callback=opts.callback, options=options or None, **kw)


def _run_minimize(pr: Problem, xf: np.ndarray, lb: np.ndarray, ub: np.ndarray,
                  opts: SolveOptions, options: dict) -> Any:
    method = opts.method
    kw: dict[str, Any] = {}  # scipy.optimize.minimize's keyword arguments
    if method not in MIN_GRAD_FREE:
        kw["jac"] = True
        obj = lambda x: pr("value_and_grad", x)  # noqa: E731
    else:
        obj = lambda x: float(pr("F", x))  # noqa: E731
    if method in MIN_HESS:
        if method in ("dogleg", "trust-exact"):
            kw["hess"] = lambda x: pr("hess", x)
        else:
            kw["hessp"] = lambda x, v: pr("hessp", x, v)
    if np.isfinite(lb).any() or np.isfinite(ub).any():
        kw["bounds"] = scipy.optimize.Bounds(lb, ub)
    return scipy.optimize.minimize(obj, xf, method=method, tol=opts.tol,
                                   callback=opts.callback, options=options or None, **kw)


def _run_least_squares(pr: Problem, xf: np.ndarray, lb: np.ndarray, ub: np.ndarray,
                       opts: SolveOptions, options: dict) -> Any:
    if "tr_options" in options:
        options["tr_options"] = dict(options["tr_options"])
    if isinstance(options.get("x_scale"), tuple):
        options["x_scale"] = np.asarray(options["x_scale"])
    return scipy.optimize.least_squares(
        lambda x: pr("F", x), xf, jac=lambda x: pr("lsq_jac", x), bounds=(lb, ub),
        callback=opts.callback, **options)
