"""`root`: SciPy's root finding, on the host or compiled, differentiated at the root."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .._common import check_policy, static_options
from .._numpy_functions import runs_as_scipy
from .._trace import check_args, convert
from . import _compiled_root, _eager_hybr, _frontend
from ._numpy_fallback import ROOT
from ._result import OptimizeResult

STEPPINGS = ("auto", "scipy", "compiled")
FLAT_METHODS = ("hybr", "lm")  # MINPACK's: SciPy passes them x0 flattened


@runs_as_scipy(ROOT)
def root(fun: Callable[..., Any], x0: Any, args: Any = (), method: str = "hybr",
         jac: Callable[..., Any] | bool | None = None, tol: float | None = None,
         callback: Callable[..., Any] | None = None, options: dict | None = None, *,
         linear_solver: str = "auto", on_failure: str = "raise",
         stepping: str = "auto") -> OptimizeResult:
    """`scipy.optimize.root`: solve `fun(x, *args) = 0`; differentiable in args and closures.

    Same signature and `args` convention as SciPy. `fun` is written in JAX and may
    close over traced values (their gradients equal those through `args`).

    Args:
      fun: the residual, returning an array shaped like `x`.
      x0: the starting point (the solution does not depend on it: zero gradient).
      args: a tuple, passed as `fun(x, *args)`; array and float leaves (pytrees are
        fine) are differentiable, Python ints and other objects static. As in SciPy,
        anything else (an array, a dict, a list) is one argument: `args = (args,)`.
      method: any of SciPy's root methods. "hybr" and "lm" get the Jacobian from JAX
        (`jax.jacfwd`) unless `jac` is a JAX function `jac(x, *args)`, or False
        (SciPy's finite differences).
      jac: None or True (JAX's Jacobian; True: `fun` returns `(f, J)`), a JAX
        function `jac(x, *args)`, or False (SciPy's finite differences).
      tol: as in SciPy.
      callback: as in SciPy (called on the host with NumPy values).
      options: as in SciPy (static: must be hashable).
      linear_solver: for the implicit-function-theorem solve: "auto" (dense up to
        n = 1000, then "gmres"), "direct", "gmres" (matrix-free), "cg" (for a
        symmetric positive definite Jacobian). With stepping "compiled", CG stops after
        10 n iterations and GMRES (restarts of 20) after 10 n cycles; a solve that
        has not converged then is a failure, as `on_failure` says.
      on_failure: "raise" (`jaxbridge.scipy.SolverError` with SciPy's message, eager
        and under `jit`) or "nan" (NaN outputs, `success=False`).
      stepping: who runs the solver loop. "scipy": SciPy's own loop on the host (one
        host round trip per residual evaluation, tens of microseconds each).
        "compiled": SciPy's algorithm as a loop inside the caller's JAX program (no
        host round trip; `vmap` batches the loop), without `callback` and with
        jax_enable_x64 on, for method "df-sane" (same iterates, `nfev` and `nit` up to
        rounding, which a chaotic line search can amplify; options ftol, fatol,
        maxfev, M, sigma_eps, sigma_0, line_search "cruz") and method "krylov"
        (SciPy's Newton-Krylov: its termination test, forcing terms and Armijo line
        search, but exact Jacobian-vector products from `jax.linearize` and GMRES
        instead of finite differences and LGMRES, so the iterates differ slightly
        while the accepted root passes SciPy's test;
        options nit, maxiter, ftol, fatol, xtol, xatol, line_search "armijo" or None,
        jac_options method "lgmres"/"gmres", inner_maxiter, inner_inner_m,
        inner_rtol, inner_atol; `nfev` counts residual evaluations, none for the
        products). An option it cannot honour is named in a ValueError. Its
        gradients: `jax.lax.custom_root` with the same `linear_solver` choices,
        matrix-free GMRES on JAX's exact products above 64 unknowns. "auto"
        (default): "compiled" where it applies, else "scipy"; and an eager "hybr"
        call whose configuration came before runs MINPACK's loop as one program,
        with SciPy's results (`_eager_hybr`); "scipy" keeps SciPy's own loop.

    Returns:
      :class:`OptimizeResult` (SciPy's, a dict) with `x`, `fun` (1-D, as SciPy's),
      `success`, `status`, `nfev`, `njev`, `nit`, `method` (SciPy's spelling, as
      SciPy's root reports it), SciPy's `message`, and hybr's and lm's `fjac`, `r`,
      `qtf`, `ipvt`, `cov_x`. As in SciPy, hybr and lm flatten a 2-D `x0`.

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from jaxbridge.scipy.optimize import root
      >>> sol = root(lambda x, a: x ** 3 + a * x - 1.0, jnp.zeros(1), args=(2.0,))
      >>> print(f"{float(sol.x[0]):.6f}")
      0.453398
      >>> g = jax.grad(lambda a: root(lambda x: x ** 3 + a * x - 1.0, jnp.zeros(1)).x[0])
      >>> print(f"{float(g(2.0)):.5f}")  # -x / (3 x^2 + a)
      -0.17327
    """
    # Over 80 lines: SciPy's signature and its documentation; the body picks the path
    # (compiled, eager hybr, SciPy's loop) and builds SciPy's result.
    method = _frontend.canonical_method(method, "root")
    if method in FLAT_METHODS and np.ndim(x0) > 1:
        x0 = jnp.reshape(x0, -1)  # SciPy's hybr and lm flatten x0: fun sees, x is, 1-D
    request = _frontend.Request("root", method, jac=jac, tol=tol, options=options,
                                callback=callback, linear_solver=linear_solver,
                                on_failure=on_failure)
    if _stepping(stepping, method, options, callback) == "compiled":
        return _compiled(fun, x0, args, request)
    if method == "hybr" and stepping == "auto":
        eager = _eager_hybr.root(fun, x0, args, request)
        if eager is not None:
            return eager
    sol = _frontend.solve(fun, x0, args, request)
    return OptimizeResult(x=sol.x, fun=jnp.ravel(sol.user_fun(sol.x)), success=sol.success,
                          status=sol.stats[0], nfev=sol.stats[1], njev=sol.stats[2],
                          nit=sol.stats[3], method=method, message=sol.message, **sol.extras)


def _compiled(fun: Callable, x0: Any, args: Any, request: _frontend.Request) -> OptimizeResult:
    """root with SciPy's loop compiled into the caller's program (`_compiled_root`)."""
    check_policy(request.on_failure, "optimize.root")
    _frontend.check_linear_solver(request.linear_solver, "optimize.root")
    args = check_args(args, "optimize.root", "fun(x, *args)", "wrap")
    x0 = _frontend.starting_point(x0, "root")
    hf, ops = convert(fun, "optimize.root", "fun", (jax.ShapeDtypeStruct(x0.shape, x0.dtype),),
                      args, "fun(x, *args)", vary_like=(x0,))
    options = request.options
    if options and isinstance(options.get("jac_options"), dict):  # static: hashable
        options = {**options, "jac_options": static_options(options["jac_options"],
                                                            "optimize.root")}
    tol = request.tol
    x, stats = _compiled_root.root(
        x0, ops, fun=hf, method=request.method, tol=None if tol is None else float(tol),
        options=static_options(options, "optimize.root"), linear_solver=request.linear_solver,
        on_failure=request.on_failure)
    return OptimizeResult(x=x, fun=jnp.ravel(fun(x, *args)), success=stats[4] == 1,
                          status=stats[0], nfev=stats[1], njev=stats[2], nit=stats[3],
                          method=request.method,
                          message=_compiled_root.message(request.method, stats))


def _stepping(stepping: str, method: str, options: dict | None, callback: Any) -> str:
    """Who runs the loop: "compiled" or "scipy" (`stepping` checked, "auto" resolved)."""
    if stepping not in STEPPINGS:
        raise ValueError(f"jaxbridge.scipy.optimize.root: stepping must be one of "
                         f"{STEPPINGS}, got {stepping!r}")
    if not isinstance(method, str):
        return "scipy"  # SciPy's own error for a callable/odd method
    why = _compiled_root.unsupported(method, dict(options or {}), callback)
    ok = why is None
    if stepping == "compiled" and not ok:
        raise ValueError(
            f"jaxbridge.scipy.optimize.root: stepping='compiled' runs the methods "
            f"{_compiled_root.METHODS} without callback and needs jax_enable_x64; it cannot "
            f"run {why}. stepping='scipy' runs SciPy's own loop")
    if stepping == "auto":
        return "compiled" if ok else "scipy"
    return stepping
