"""`least_squares`: SciPy's nonlinear least squares on the host, differentiated at the optimum."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .._common import unsupported
from .._numpy_functions import runs_as_scipy
from . import _frontend
from ._loss import LOSSES, rho
from ._numpy_fallback import LEAST_SQUARES
from ._result import OptimizeResult


@runs_as_scipy(LEAST_SQUARES)
def least_squares(fun: Callable[..., Any], x0: Any, jac: Any = "2-point",
                  bounds: Any = (-np.inf, np.inf), method: str = "trf", ftol: float = 1e-8,
                  xtol: float = 1e-8, gtol: float = 1e-8, x_scale: Any = None,
                  loss: str = "linear", f_scale: float = 1.0, diff_step: Any = None,
                  tr_solver: str | None = None, tr_options: dict | None = None,
                  jac_sparsity: Any = None, max_nfev: int | None = None, verbose: int = 0,
                  args: Any = (), kwargs: dict | None = None, callback: Any = None,
                  workers: Any = None, *, linear_solver: str = "auto",
                  on_failure: str = "raise") -> OptimizeResult:
    """`scipy.optimize.least_squares`: minimize `1/2 sum rho(fun(x, *args)^2)`; differentiable.

    Same signature and `args` convention as SciPy: `fun(x, *args)` unpacks any
    iterable `args` (a non-iterable raises TypeError, as in SciPy). Trust-region
    "trf", "dogbox" or "lm"; `bounds`; robust `loss` and `f_scale`. `fun` is
    written in JAX; its Jacobian comes from JAX (exact) unless `jac` is a JAX
    function `jac(x, *args)` (a finite-difference string also means JAX's
    Jacobian). Gradients of the optimum w.r.t. `args`, arrays `fun` closes over,
    and active bounds: implicit function theorem on the stationarity of the cost
    (its full Hessian, from JAX, not the Gauss-Newton approximation, so the
    gradient is exact also for nonzero residuals).

    Not supported, with the reason in the error: `kwargs` (use `args` or a
    closure), a callable `loss` (write it into `fun`), `jac_sparsity`, `workers`.

    Args:
      fun: the residuals ``fun(x, *args)``, written in JAX (any shape; raveled).
      x0: the starting point (zero gradient: the optimum does not depend on it).
      jac: a JAX function ``jac(x, *args)``; anything else (the default "2-point",
        "3-point", "cs") means JAX's exact Jacobian.
      bounds: ``(lb, ub)`` as in SciPy; gradients flow to active bounds.
      method: "trf", "dogbox" or "lm".
      ftol: as in SciPy.
      xtol: as in SciPy.
      gtol: as in SciPy.
      x_scale: as in SciPy (static; a scalar applies to every variable).
      loss: one of SciPy's named losses ("linear", "soft_l1", "huber", "cauchy",
        "arctan"); the implicit function theorem uses its exact derivatives.
      f_scale: as in SciPy.
      diff_step: ignored (the Jacobian is JAX's).
      tr_solver: as in SciPy.
      tr_options: as in SciPy (static).
      jac_sparsity: not supported.
      max_nfev: as in SciPy.
      verbose: as in SciPy.
      args: a tuple passed as ``fun(x, *args)``; array and float leaves are
        differentiable, other leaves static.
      kwargs: not supported (use `args` or a closure).
      callback: as in SciPy (called on the host; static, so hashable).
      workers: not supported.
      linear_solver: the implicit-function-theorem solve: "auto" (dense up to
        n = 1000, then "cg"), "direct", "gmres", "cg".
      on_failure: "raise" (`jaxbridge.scipy.SolverError`) or "nan".

    Returns:
      :class:`OptimizeResult` with `x`, `cost`, `fun` (residuals), `jac`, `grad`,
      `optimality`, `active_mask`, `success`, `status`, `nfev`, `njev`; all but the
      counters are differentiable (recomputed in JAX at `x*`).

    Raises:
      SolverError: SciPy reported failure, or the implicit-function-theorem system is
        singular, with ``on_failure="raise"``.
      NotImplementedError: `kwargs`, a callable `loss`, `jac_sparsity` or `workers`.
      ValueError: an unknown `loss`, a 2-D x0, or as SciPy's (same type as SciPy's).

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from jaxbridge.scipy.optimize import least_squares
      >>> t = jnp.linspace(0.0, 1.0, 8)
      >>> def residual(theta, data):
      ...     return theta[0] * jnp.exp(-theta[1] * t) - data
      >>> data = 2.0 * jnp.exp(-1.5 * t)
      >>> fit = least_squares(residual, jnp.ones(2), args=(data,))
      >>> [round(float(v), 6) for v in fit.x]
      [2.0, 1.5]
      >>> float(jnp.abs(jax.jacobian(lambda d: least_squares(residual, jnp.ones(2),
      ...     args=(d,)).x)(data)).max()) > 0
      True
    """
    return _fit(_Call(**locals()))  # all of SciPy's arguments, checked in one place


@dataclasses.dataclass(frozen=True)
class _Call:
    """The arguments of one least_squares call, as given (SciPy's names)."""

    fun: Callable[..., Any]
    x0: Any
    jac: Any
    bounds: Any
    method: str
    ftol: float
    xtol: float
    gtol: float
    x_scale: Any
    loss: str
    f_scale: float
    diff_step: Any  # ignored: the Jacobian is JAX's
    tr_solver: str | None
    tr_options: dict | None
    jac_sparsity: Any
    max_nfev: int | None
    verbose: int
    args: Any
    kwargs: dict | None
    callback: Any
    workers: Any
    linear_solver: str
    on_failure: str


def _fit(call: _Call) -> OptimizeResult:
    """Check `call`, solve, and recompute the result's fields in JAX at x*."""
    _check_supported(call)
    request = _frontend.Request(
        "least_squares", call.method, jac=None if isinstance(call.jac, str) else call.jac,
        bounds=call.bounds, options=_scipy_options(call), callback=call.callback,
        linear_solver=call.linear_solver, on_failure=call.on_failure)
    sol = _frontend.solve(call.fun, call.x0, call.args, request)
    loss, f_scale = call.loss, float(call.f_scale)
    # one program (a repeat eager call: one dispatch, not ~30)
    fields = sol.program(("least_squares fields", loss, f_scale),
                         functools.partial(_fields_at, loss, f_scale))
    r, cost, jac, grad, optimality, active = fields(sol.x, sol.active)
    stats = sol.stats
    return OptimizeResult(x=sol.x, cost=cost, fun=r, jac=jac, grad=grad,
                          optimality=optimality, active_mask=active, success=sol.success,
                          status=stats[0], nfev=stats[1], njev=stats[2], nit=None,
                          message=sol.message)


def _fields_at(loss: str, f_scale: float, fun: Callable[[jax.Array], Any], x: jax.Array,
               active: jax.Array) -> tuple:
    """SciPy's result fields at x*, recomputed in JAX (differentiable in x* and the
    operands): residuals, cost, Jacobian (scaled by the robust loss as SciPy's is),
    gradient, optimality and the active mask."""
    r = jnp.ravel(fun(x))
    J = jax.jacfwd(lambda x: jnp.ravel(fun(x)))(x).reshape(r.size, -1)
    z = (r / f_scale) ** 2
    rho1 = jax.grad(lambda z: jnp.sum(rho(loss, z)))(z)
    cost = 0.5 * f_scale ** 2 * jnp.sum(rho(loss, z))
    grad = (J.T @ (rho1 * r)).reshape(jnp.shape(x))
    free = active == 0
    optimality = jnp.max(jnp.abs(jnp.where(free, grad, 0.0))) if grad.size else jnp.zeros(())
    jac = J if loss == "linear" else robust_jacobian(J, z, rho1, loss)
    return r, cost, jac, grad, optimality, active.astype(jnp.int32)


def robust_jacobian(J: jax.Array, z: jax.Array, rho1: jax.Array, loss: str) -> jax.Array:
    """The Jacobian SciPy returns with a robust loss: its rows scaled by
    `sqrt(rho'(z) + 2 z rho''(z))` (at least machine epsilon), z = (f / f_scale)^2, as
    `scipy.optimize._lsq.common.scale_for_robust_loss_function` does; `J^T (scaled f)`
    is then the gradient of the cost.

    >>> J = robust_jacobian(jnp.ones((1, 1)), jnp.array([3.0]), jnp.array([0.5]),
    ...                     "soft_l1")
    >>> round(float(J[0, 0]) ** 2, 6)  # rho' + 2 z rho'' = (1 + z)^(-3/2) at z = 3
    0.125
    """
    rho2 = jax.vmap(jax.grad(jax.grad(lambda v: rho(loss, v))))(z)
    scale = jnp.sqrt(jnp.maximum(rho1 + 2 * z * rho2, jnp.finfo(J.dtype).eps))
    return J * scale[:, None]


def _check_supported(call: _Call) -> None:
    """NotImplementedError for the arguments that have no JAX form here."""
    name = "optimize.least_squares"
    if call.kwargs:
        raise unsupported(name, "kwargs", "pass extra arguments through args, or close over "
                          "them")
    if callable(call.loss):
        raise unsupported(name, "loss", f"only SciPy's named losses {LOSSES} have a JAX form "
                          f"here; write a callable loss into fun; got {call.loss!r}")
    if call.loss not in LOSSES:  # SciPy's ValueError for a name it does not know
        raise ValueError(f"jaxbridge.scipy.{name}: loss must be one of {LOSSES} (or a "
                         f"callable in SciPy, not supported here); got {call.loss!r}")
    for arg, value in (("jac_sparsity", call.jac_sparsity), ("workers", call.workers)):
        if value is not None:
            raise unsupported(name, arg, "the Jacobian comes from JAX, dense")


def _scipy_options(call: _Call) -> dict:
    """scipy.optimize.least_squares' keyword arguments, hashable (static) values."""
    options = {"method": call.method, "ftol": call.ftol, "xtol": call.xtol, "gtol": call.gtol,
               "loss": call.loss, "f_scale": float(call.f_scale), "max_nfev": call.max_nfev,
               "verbose": int(call.verbose), "tr_solver": call.tr_solver, "diff_step": None}
    x_scale = call.x_scale  # hashable: "jac", a float (SciPy broadcasts it) or a tuple
    if x_scale is not None and not isinstance(x_scale, str):
        x_scale = float(x_scale) if np.ndim(x_scale) == 0 else \
            tuple(np.ravel(np.asarray(x_scale, np.float64)))
    if x_scale is not None:
        options["x_scale"] = x_scale
    if call.tr_options:
        options["tr_options"] = tuple(sorted(call.tr_options.items()))
    return options
