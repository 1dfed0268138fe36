"""root, minimize and least_squares with a user function written in NumPy: SciPy's run.

See `jaxbridge.scipy._numpy_functions`. The results are the fields the traceable path
returns, taken from SciPy's own result, with SciPy's `message`.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import scipy.optimize

from .._numpy_functions import Fallback, check_success, scipy_arguments
from ._result import OptimizeResult

_OURS = ("linear_solver", "on_failure", "stepping")  # jaxbridge's own keywords
_COUNTERS = ("nfev", "njev", "nit")


def _run(name: str, scipy_fn: Any, functions: tuple, fields: tuple) -> Any:
    """Bound arguments -> SciPy's run -> every field of its result (`allvecs`,
    `hess_inv`, `direc`, ... as SciPy gives them), with `fields`' counters -1 where SciPy
    reports none (a run under jit keeps the declared fields only)."""
    def run(a: dict) -> dict:
        res = scipy_fn(**scipy_arguments(a, name, _OURS, functions))
        check_success(name, res.success, res.message, a["on_failure"])
        out = dict(res)
        out.update({k: res.get(k, -1) for k in _COUNTERS if k in fields})
        return out
    return run


def _x_shapes(a: dict, **more: tuple | None) -> dict:
    """Under jit: x shaped like x0 (a scalar as (1,), as SciPy gives it), the status
    fields, and `more` (name -> shape; None: x's shape) in x's float dtype."""
    x0 = jnp.asarray(a["x0"])
    dtype = jnp.result_type(x0.dtype, float)
    shape = x0.shape or (1,)
    out = {"x": jax.ShapeDtypeStruct(shape, dtype)}
    out.update({k: jax.ShapeDtypeStruct(shape if s is None else s, dtype)
                for k, s in more.items()})
    out["success"] = jax.ShapeDtypeStruct((), np.bool_)
    out.update({k: jax.ShapeDtypeStruct((), np.int32) for k in ("status",) + _COUNTERS})
    return out


def _root_result(fields: dict, a: dict) -> OptimizeResult:
    return OptimizeResult(**{"method": a["method"], **fields})


ROOT = Fallback(
    "optimize.root",
    _run("optimize.root", scipy.optimize.root, ("fun", "jac"),
         ("x", "fun", "success", "status", "nfev", "njev", "nit", "method")),
    _root_result, lambda a: _x_shapes(a, fun=None))


def _minimize_result(fields: dict, a: dict) -> OptimizeResult:
    return OptimizeResult(**fields)


MINIMIZE = Fallback(
    "optimize.minimize",
    _run("optimize.minimize", scipy.optimize.minimize, ("fun", "jac"),
         ("x", "fun", "jac", "success", "status", "nfev", "njev", "nit")),
    _minimize_result, lambda a: _x_shapes(a, fun=()))

LEAST_SQUARES = Fallback(
    "optimize.least_squares",
    _run("optimize.least_squares", scipy.optimize.least_squares, ("fun", "jac"),
         ("x", "cost", "fun", "jac", "grad", "optimality", "active_mask", "success",
          "status", "nfev", "njev")),
    _minimize_result,
    lambda a: "the number of residuals `fun` returns is known only once it runs; call "
              "least_squares outside jit")
