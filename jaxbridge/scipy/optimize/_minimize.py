"""`minimize`: SciPy's minimization on the host, differentiated at the stationary point."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .._common import unsupported
from . import _frontend
from ._result import OptimizeResult

MIN_BOUNDS = ("Nelder-Mead", "L-BFGS-B", "TNC", "SLSQP", "Powell", "trust-constr", "COBYLA",
              "COBYQA")


def minimize(fun: Callable[..., Any], x0: Any, args: Any = (), method: str | None = None,
             jac: Callable[..., Any] | bool | str | None = None, hess: Any = None,
             hessp: Any = None, bounds: Any = None, constraints: Any = (),
             tol: float | None = None, callback: Callable[..., Any] | None = None,
             options: dict | None = None, *, linear_solver: str = "auto",
             on_failure: str = "raise") -> OptimizeResult:
    """`scipy.optimize.minimize` of scalar `fun(x, *args)`; differentiable in args and closures.

    Same signature and `args` convention as SciPy (a non-tuple `args` is one
    argument, as in SciPy). The gradient-based methods get
    JAX's gradient (and Hessian or Hessian-vector products for Newton-CG, dogleg,
    trust-*) unless `jac` is a JAX function `jac(x, *args)` or True (`fun` returns
    `(f, g)`); a finite-difference string ("2-point", ...) also means JAX's exact
    gradient. The gradient-free methods (Nelder-Mead, Powell, ...) use values only.
    `method=None` picks as SciPy does: "BFGS", or "L-BFGS-B" with bounds.

    Gradients of `x*`: the stationarity condition `grad_x fun = 0` on the free
    coordinates (implicit function theorem with the Hessian); coordinates held at a
    bound follow the bound. Not supported, with the reason in the error:
    `constraints` (the KKT system's multipliers are not returned), `hess`/`hessp`
    functions (JAX's exact ones are used; pass None). `linear_solver` "auto" is dense
    up to n = 1000, then "cg". Other arguments as in :func:`root`.

    Args:
      fun: the scalar objective ``fun(x, *args)``, written in JAX.
      x0: the starting point (zero gradient: the minimum does not depend on it).
      args: a tuple passed as ``fun(x, *args)``; array and float leaves are
        differentiable, other leaves static.
      method: any of SciPy's methods; None picks "BFGS", or "L-BFGS-B" with bounds.
      jac: None (JAX's gradient), a JAX function ``jac(x, *args)``, True (`fun`
        returns ``(f, g)``) or a finite-difference string (also JAX's gradient).
      hess: must be None (JAX's exact Hessian is used).
      hessp: must be None (JAX's exact Hessian-vector products are used).
      bounds: as in SciPy (a sequence of ``(lo, hi)`` or a `Bounds`); only with the
        bounded methods. Gradients flow to active bounds.
      constraints: must be empty (not supported).
      tol: as in SciPy.
      callback: as in SciPy (called on the host; static, so hashable).
      options: as in SciPy (static: hashable values).
      linear_solver: the implicit-function-theorem solve: "auto" (dense up to
        n = 1000, then "cg"), "direct", "gmres", "cg".
      on_failure: "raise" (`jaxbridge.scipy.SolverError`) or "nan".

    Returns:
      :class:`OptimizeResult` (SciPy's, a dict) with `x`, `fun`, `jac` (the
      gradient at `x`, from JAX), `success`, `status`, `nfev`, `njev`, `nit`; `x`,
      `fun` and `jac` are differentiable.

    Raises:
      SolverError: SciPy reported failure, or the implicit-function-theorem system is
        singular, with ``on_failure="raise"``.
      NotImplementedError: `constraints`, `hess` or `hessp` given.
      ValueError: bounds with a method that does not take them, or an unknown
        `linear_solver` or `on_failure`.

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from jaxbridge.scipy.optimize import minimize
      >>> f = lambda x, c: jnp.sum((x - c) ** 2) + 0.1 * jnp.sum(x ** 4)
      >>> g = jax.grad(lambda c: minimize(f, jnp.zeros(2), args=(c,), method="Newton-CG",
      ...                                 tol=1e-12).x.sum())
      >>> [round(float(v), 4) for v in g(jnp.array([1.0, -1.0]))]
      [0.6883, 0.6883]
    """
    _check_supported(constraints, hess, hessp)
    if method is None:
        method = "L-BFGS-B" if bounds is not None else "BFGS"
    method = _frontend.canonical_method(method, "minimize")
    if bounds is not None and method not in MIN_BOUNDS:
        raise ValueError(f"jaxbridge.scipy.optimize.minimize: method {method!r} does not take "
                         f"bounds (SciPy's bounded methods: {MIN_BOUNDS})")
    request = _frontend.Request("minimize", method, jac=None if isinstance(jac, str) else jac,
                                bounds=bounds, tol=tol, options=options, callback=callback,
                                linear_solver=linear_solver, on_failure=on_failure)
    sol = _frontend.solve(fun, x0, args, request)
    grad = sol.user_grad(sol.x)
    return OptimizeResult(x=sol.x, fun=sol.user_fun(sol.x), jac=grad, success=sol.success,
                          status=sol.stats[0], nfev=sol.stats[1], njev=sol.stats[2],
                          nit=sol.stats[3])


def _check_supported(constraints: Any, hess: Any, hessp: Any) -> None:
    """NotImplementedError for what the implicit function theorem here cannot serve."""
    name = "optimize.minimize"
    if constraints not in ((), None, []):
        raise unsupported(name, "constraints", "the implicit function theorem needs the "
                          "KKT system's Lagrange multipliers; use bounds, or a penalty term")
    if hess is not None or hessp is not None:
        raise unsupported(name, "hess/hessp", "JAX's exact Hessian is used; pass None")
