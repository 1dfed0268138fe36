"""`minimize`: SciPy's minimization on the host, differentiated at the stationary point."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

from .._common import unsupported
from .._numpy_functions import runs_as_scipy
from . import _constraints, _frontend
from ._numpy_fallback import MINIMIZE
from ._result import OptimizeResult
from ._run_scipy import HESS_METHODS, HESSP_METHODS

MIN_BOUNDS = ("Nelder-Mead", "L-BFGS-B", "TNC", "SLSQP", "Powell", "trust-constr", "COBYLA",
              "COBYQA")
#: The methods whose constraints are solved and differentiated.
CONSTRAINED = ("SLSQP", "trust-constr")


@runs_as_scipy(MINIMIZE)
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
    `(f, g)`), or `hess`/`hessp` are given; a finite-difference string ("2-point",
    ...) for `jac` also means JAX's exact gradient. The gradient-free methods
    (Nelder-Mead, Powell, ...) use values only. `method=None` picks as SciPy does:
    "SLSQP" with constraints, else "L-BFGS-B" with bounds, else "BFGS".

    Gradients of `x*`: without constraints, the stationarity condition
    `grad_x fun = 0` on the free coordinates (implicit function theorem with the
    Hessian); coordinates held at a bound follow the bound. With `constraints`
    (SLSQP, trust-constr), the KKT conditions of the active set at x*:
    ``grad f = J_A^T lam`` and the active constraints (equalities, inequalities and
    bounds that hold) at their limits, the multipliers `lam` recovered by least
    squares from stationarity, the KKT system ``[[H, -J_A^T], [J_A, 0]]`` (H JAX's
    exact Hessian of the Lagrangian) solved densely. A degenerate x* (linearly
    dependent active constraints, an active constraint with a zero multiplier, no
    unique solution of the KKT system) raises `SolverError` when differentiated
    (NaN with ``on_failure="nan"``). `hess`/`hessp` steer SciPy's forward solve
    only; derivatives use JAX's exact Hessian. `linear_solver` "auto" is dense up to
    n = 1000, then "cg". Other arguments as in :func:`root`.

    Args:
      fun: the scalar objective ``fun(x, *args)``, written in JAX.
      x0: the starting point (zero gradient: the minimum does not depend on it).
      args: a tuple passed as ``fun(x, *args)``; array and float leaves are
        differentiable, other leaves static.
      method: any of SciPy's methods; None picks "SLSQP" with constraints, else
        "L-BFGS-B" with bounds, else "BFGS".
      jac: None (JAX's gradient), a JAX function ``jac(x, *args)``, True (`fun`
        returns ``(f, g)``) or a finite-difference string (also JAX's gradient).
      hess: None (JAX's exact Hessian for the methods that need one), a JAX function
        ``hess(x, *args)``, or SciPy's "2-point", "3-point", "cs" or a
        `HessianUpdateStrategy`, for Newton-CG, dogleg, trust-* (SciPy's
        RuntimeWarning and ignored for the other methods).
      hessp: None or a JAX function ``hessp(x, p, *args)``, for Newton-CG, trust-ncg,
        trust-krylov, trust-constr (SciPy's RuntimeWarning for the others).
      bounds: as in SciPy (a sequence of ``(lo, hi)`` or a `Bounds`); only with the
        bounded methods. Gradients flow to active bounds.
      constraints: as in SciPy, for SLSQP and trust-constr: a dict ``{'type': 'eq' or
        'ineq', 'fun', 'jac', 'args'}``, a `NonlinearConstraint`, a
        `LinearConstraint`, or a list or tuple of them; functions written in JAX
        (their `jac` is not called: JAX's Jacobian is exact). Gradients flow to what
        the constraint functions close over, to the dicts' `args` and to a
        NonlinearConstraint's `lb`/`ub`. `keep_feasible` reaches trust-constr.
      tol: as in SciPy.
      callback: as in SciPy (called on the host; static, so hashable).
      options: as in SciPy (static: hashable values).
      linear_solver: the implicit-function-theorem solve: "auto" (dense up to
        n = 1000, then "cg"), "direct", "gmres", "cg"; with constraints "auto" or
        "direct" (the KKT system is solved densely).
      on_failure: "raise" (`jaxbridge.scipy.SolverError`) or "nan".

    Returns:
      :class:`OptimizeResult` (SciPy's, a dict) with `x`, `fun`, `jac` (the
      gradient at `x`, from JAX), `success`, `status`, `nfev`, `njev`, `nit`,
      SciPy's `message` and the method's own fields (`direc`, `final_simplex`,
      `hess_inv`, `hess`, `nhev`, `maxcv`); `x`, `fun` and `jac` are differentiable.

    Raises:
      SolverError: SciPy reported failure, or the implicit-function-theorem system is
        singular or degenerate, with ``on_failure="raise"``.
      NotImplementedError: `constraints` with COBYLA or COBYQA, or with a Krylov
        `linear_solver`.
      ValueError: bounds with a method that does not take them, an unknown
        `linear_solver` or `on_failure`, a constraint dict without 'fun' or of
        another type than 'eq'/'ineq', a LinearConstraint whose `A` does not match x0.
      KeyError: a constraint dict without 'type' (SciPy's exception type).
      TypeError: constraints of another kind than SciPy's.

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from jaxbridge.scipy.optimize import minimize
      >>> f = lambda x, c: jnp.sum((x - c) ** 2) + 0.1 * jnp.sum(x ** 4)
      >>> g = jax.grad(lambda c: minimize(f, jnp.zeros(2), args=(c,), method="Newton-CG",
      ...                                 tol=1e-12).x.sum())
      >>> [round(float(v), 4) for v in g(jnp.array([1.0, -1.0]))]
      [0.6883, 0.6883]

      Projection onto the simplex (sum(x) = 1, x >= 0); its derivative is known:

      >>> simplex = {"type": "eq", "fun": lambda x: jnp.sum(x) - 1.0}
      >>> proj = lambda p: minimize(lambda x: jnp.sum((x - p) ** 2), jnp.zeros(3),
      ...                           bounds=[(0, None)] * 3, constraints=simplex,
      ...                           tol=1e-12).x
      >>> p = jnp.array([0.5, 0.3, -0.4])
      >>> [round(float(v), 4) for v in proj(p)], jax.jacrev(proj)(p)[0].round(4).tolist()
      ([0.6, 0.4, 0.0], [0.5, -0.5, 0.0])
    """
    # Over 80 lines: SciPy's long signature and its documentation; the body hands the
    # checked request to _frontend.solve.
    given = constraints is not None and not (isinstance(constraints, (list, tuple))
                                             and len(constraints) == 0)
    if method is None:
        method = "SLSQP" if given else "L-BFGS-B" if bounds is not None else "BFGS"
    method = _frontend.canonical_method(method, "minimize")
    if bounds is not None and method not in MIN_BOUNDS:
        raise ValueError(f"jaxbridge.scipy.optimize.minimize: method {method!r} does not take "
                         f"bounds (SciPy's bounded methods: {MIN_BOUNDS})")
    _warn_unused(method, hess, hessp)
    cset = _constraint_set(constraints, method, x0) if given else None
    if cset is not None and linear_solver in ("gmres", "cg"):
        raise unsupported("optimize.minimize", "linear_solver",
                          f"{linear_solver!r} with constraints (the KKT system is "
                          f"indefinite and solved densely): use 'auto' or 'direct'")
    request = _frontend.Request("minimize", method, jac=None if isinstance(jac, str) else jac,
                                bounds=bounds, tol=tol, options=options, callback=callback,
                                linear_solver=linear_solver, on_failure=on_failure,
                                hess=hess, hessp=hessp, constraints=cset)
    sol = _frontend.solve(fun, x0, args, request)
    grad = sol.user_grad(sol.x)
    return OptimizeResult(x=sol.x, fun=sol.user_fun(sol.x), jac=grad, success=sol.success,
                          status=sol.stats[0], nfev=sol.stats[1], njev=sol.stats[2],
                          nit=sol.stats[3], message=sol.message, **sol.extras)


def _warn_unused(method: Any, hess: Any, hessp: Any) -> None:
    """SciPy's RuntimeWarnings for a `hess`/`hessp` the method does not use (ignored)."""
    if hess is not None and method not in HESS_METHODS:
        warnings.warn(f"Method {method} does not use Hessian information (hess).",
                      RuntimeWarning, stacklevel=3)
    if hessp is not None and method not in HESSP_METHODS:
        warnings.warn(f"Method {method} does not use Hessian-vector product information "
                      f"(hessp).", RuntimeWarning, stacklevel=3)


def _constraint_set(constraints: Any, method: Any, x0: Any) -> Any:
    """The ConstraintSet for SLSQP and trust-constr; SciPy's RuntimeWarning (and the
    constraints ignored) for the methods that cannot handle them; NotImplementedError
    for COBYLA and COBYQA (SciPy's own derivative-free handling is not differentiated)."""
    if method in ("COBYLA", "COBYQA"):
        raise unsupported("optimize.minimize", "constraints", f"with method {method!r}: "
                          f"use 'SLSQP' or 'trust-constr' (differentiated through the KKT "
                          f"conditions at x*)")
    if method not in CONSTRAINED:
        warnings.warn(f"Method {method} cannot handle constraints.", RuntimeWarning,
                      stacklevel=3)
        return None
    return _constraints.normalize(constraints, _frontend.starting_point(x0, "minimize"))
