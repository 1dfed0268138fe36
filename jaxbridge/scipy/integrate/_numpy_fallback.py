"""solve_ivp, quad and solve_bvp with a user function written in NumPy: SciPy's run.

See `jaxbridge.scipy._numpy_functions`. The results are the drop-ins' result types
with SciPy's own values: SciPy's sizes (no padding to `max_steps`, `max_events` or
`max_nodes`: nothing here is traced), SciPy's `OdeSolution`/`PPoly` as `sol`.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import scipy.integrate

from .._numpy_functions import Fallback, check_success, guarded, scipy_arguments
from ._ode import OdeEventResult, OdeResult

IVP = "integrate.solve_ivp"
_IVP_OURS = ("adjoint_rtol", "adjoint_atol", "sensitivity", "stepping", "checkpoints",
             "on_failure", "options", "events", "jac")
_IVP_SIZES = ("max_events", "max_steps")  # jaxbridge's static sizes, in **options


def _events(events: Any) -> Any:
    if events is None or callable(events):
        return guarded(events, IVP, "events")
    return [guarded(ev, IVP, f"events[{i}]") for i, ev in enumerate(events)]


def _ivp_run(a: dict) -> dict:
    kw = scipy_arguments(a, IVP, _IVP_OURS, ("fun",))
    kw.update({k: v for k, v in a["options"].items() if k not in _IVP_SIZES})
    if a["jac"] is not None:  # (SciPy warns of a jac=None its explicit methods ignore)
        kw["jac"] = guarded(a["jac"], IVP, "jac")
    sol = scipy.integrate.solve_ivp(events=_events(a["events"]), **kw)
    check_success(IVP, sol.success, sol.message, a["on_failure"])
    fields = {k: sol[k] for k in ("t", "y", "sol", "t_events", "y_events", "nfev", "njev",
                                  "nlu", "status", "success")}
    if _events_path(a):
        fields["n_events"] = None if sol.t_events is None else \
            np.array([len(t) for t in sol.t_events])
        fields["n_points"] = len(sol.t)
    return fields


def _events_path(a: dict) -> bool:
    """Whether the traceable path returns `OdeEventResult` (as `_arguments.prepare`)."""
    return a["events"] is not None or bool(a["dense_output"]) or a["t_eval"] is None


def _ivp_result(fields: dict, a: dict) -> OdeResult:
    return (OdeEventResult if _events_path(a) else OdeResult)(**fields)


def _ivp_shapes(a: dict) -> dict | str:
    if _events_path(a):
        return ("the output times are SciPy's own steps, or events or dense output are "
                "asked for; pass `t_eval` (the output times), without `events` and "
                "`dense_output`")
    y0, t_eval = jnp.asarray(a["y0"]), jnp.asarray(a["t_eval"])
    dtype = jnp.result_type(y0.dtype, float)
    shapes = {"t": jax.ShapeDtypeStruct(t_eval.shape, jnp.result_type(t_eval.dtype, float)),
              "y": jax.ShapeDtypeStruct((y0.size,) + t_eval.shape, dtype),
              "success": jax.ShapeDtypeStruct((), np.bool_)}
    shapes.update({k: jax.ShapeDtypeStruct((), np.int32)
                   for k in ("nfev", "njev", "nlu", "status")})
    return shapes


SOLVE_IVP = Fallback(IVP, _ivp_run, _ivp_result, _ivp_shapes)


def _quad_run(a: dict) -> dict:
    y, abserr = scipy.integrate.quad(**scipy_arguments(
        a, "integrate.quad", ("on_failure",), ("func",)))
    return {"y": y, "abserr": abserr}


def _quad_shapes(a: dict) -> dict:
    dtype = jnp.result_type(jnp.asarray(a["a"]).dtype, jnp.asarray(a["b"]).dtype, float)
    return {k: jax.ShapeDtypeStruct((), dtype) for k in ("y", "abserr")}


QUAD = Fallback("integrate.quad", _quad_run, lambda f, a: (f["y"], f["abserr"]),
                _quad_shapes)

BVP = "integrate.solve_bvp"


def _bvp_run(a: dict) -> dict:
    res = scipy.integrate.solve_bvp(**scipy_arguments(
        a, BVP, ("on_failure",), ("fun", "bc", "fun_jac", "bc_jac")))
    check_success(BVP, res.success, res.message, a["on_failure"])
    fields = {k: res[k] for k in ("sol", "p", "x", "y", "yp", "rms_residuals", "niter",
                                  "status", "success")}
    fields["n_nodes"] = len(res.x)
    return fields


SOLVE_BVP = Fallback(BVP, _bvp_run, None,  # built as BvpResult(**fields) by _bvp
                     lambda a: "the number of mesh nodes is known only once SciPy has run")
