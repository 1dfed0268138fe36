"""The `solve_ivp` front end: one argument preparation, then the path that solves it.

Paths: the compiled loop (`_compiled`: RK in JAX, or the implicit methods' compiled
derivatives), SciPy's loop (`_scipy_loop`), and SciPy's loop with events, dense
output or its own step times (`_trajectory`, with `_events` and `_dense` on top).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .._common import (
    FallbackBackoff,
    NotEager,
    computes_on_cpu,
    const,
    eager_device,
    program,
    repeat_program,
)
from .._numpy_functions import runs_as_scipy
from . import _dense
from ._arguments import IvpRequest, PreparedIvp, prepare
from ._compiled import compiled_ivp_program, stiff_ivp_program
from ._compiled_trajectory import applies, compiled_trajectory
from ._events import event_slot
from ._numpy_fallback import SOLVE_IVP
from ._ode import IMPLICIT_METHODS, OdeEventResult, OdeResult
from ._options import IvpConfig
from ._scipy_loop import scipy_solve
from ._trajectory import trajectory

__all__ = ["solve_ivp"]

sg = jax.lax.stop_gradient


@runs_as_scipy(SOLVE_IVP)
def solve_ivp(fun: Callable[..., Any], t_span: Any, y0: Any, method: Any = "RK45",
              t_eval: Any = None, dense_output: bool = False, events: Any = None,
              vectorized: bool = False, args: Any = None, *, rtol: Any = 1e-3,
              atol: Any = 1e-6, jac: Any = None,
              adjoint_rtol: float | None = None, adjoint_atol: float | None = None,
              sensitivity: str = "auto", stepping: str = "auto",
              checkpoints: int | None = None, on_failure: str = "raise",
              **options: Any) -> OdeResult:
    """`scipy.integrate.solve_ivp`, differentiable in y0, args, closed-over arrays, t0, t_eval.

    Same signature, defaults and `args` convention as SciPy: `fun(t, y, *args)`.

    Args:
      fun: the right-hand side, written in JAX, returning an array shaped like `y0`.
        It may close over arrays and traced values (e.g. `lambda t, y: -k * y` inside
        a function differentiated w.r.t. `k`): they are differentiated like `args`.
      t_span: `(t0, tf)`: SciPy integrates from `t0` (differentiable) to `tf`.
      y0: initial state, any shape (float).
      method: any of SciPy's: "RK23", "RK45", "DOP853", "Radau", "BDF", "LSODA", or
        SciPy's class of that name (`scipy.integrate.Radau`); not a user subclass.
      t_eval: the times at which the solution is returned, within `t_span`, monotone.
        None (SciPy's default): SciPy's own step times, padded to a static
        `max_steps + 1` with `inf` (`n_points` of them are valid).
      dense_output: True: `sol.sol` is SciPy's own interpolant as a JAX function of
        `t` (differentiable in `t` and every parameter; see `OdeSolution`).
      events: SciPy's event functions `event(t, y, *args)` (in JAX, may close over
        traced values) with SciPy's `terminal` and `direction` attributes. `t_events`
        and `y_events` are lists with one array per event, padded with NaN to a
        static `max_events` (keyword, default 16; `n_events` counts every event,
        also those past `max_events`); event times are differentiable by the
        implicit function theorem. After a terminal event `y` is NaN at later
        `t_eval` times and `status` is 1. These three run SciPy's own loop
        (forward sensitivities for gradients); a repeat eager call of RK23 or RK45
        runs it compiled (its step times then follow XLA's rounding, ~1e-9 relative to
        SciPy's; `stepping="scipy"` keeps SciPy's); see docs/guides/ode-events.md.
      vectorized: as in SciPy, True means `fun(t, y)` takes `y` of shape (n, k) and
        returns (n, k); it is called with y of shape (n, 1) for one state, as SciPy
        does (Jacobians come from JAX, so never with k > 1). `y0` must be 1-D.
      args: a tuple passed as `fun(t, y, *args)` (and `jac(t, y, *args)`). Array and
        float leaves (pytrees are fine) are traced and differentiable; Python ints,
        bools and other objects are passed unchanged (static). As in SciPy, any other
        iterable is unpacked the same way, and a non-iterable raises SciPy's TypeError.
      rtol, atol: SciPy's tolerances and defaults (1e-3, 1e-6: loose; gradients
        inherit the solution's error, so pass tighter ones for training): floats, or
        as in SciPy arrays with one value per state component (static, not traced).
      jac: for the implicit methods, as in SciPy a function `jac(t, y, *args)` (in
        JAX) or a constant (n, n) matrix, dense or `scipy.sparse` (not for LSODA;
        SciPy gets it as given, the derivatives use it densified);
        None (default): the exact Jacobian from JAX; False: SciPy's finite
        differences, in the forward solve and, with `stepping="scipy"`, in the
        continuous adjoint's solves, so that a `fun` JAX can differentiate in reverse
        mode only (a `jax.custom_vjp` inside) gets gradients there.
      adjoint_rtol, adjoint_atol: tolerances of the gradient solve (default: rtol, atol).
      sensitivity: how reverse mode (grad, vjp, jacrev) computes the gradient.
        "adjoint": with the compiled loop, the discrete adjoint (exact for the
        discrete solution; cost ~ two forward solves, independent of the number of
        parameters P); for BDF, Radau and LSODA (with jax_enable_x64 and the default
        stepping) the compiled Radau IIA adjoint over SciPy's recorded steps (exact for
        Radau's discrete solution, within tolerance for BDF and LSODA; see
        docs/guides/ode-gradients.md); with `stepping="scipy"`, the continuous adjoint
        solved by SciPy (within tolerance). "forward": forward sensitivities for
        every input at once (cost grows with `n (1 + n + P)` for `n` states). "auto"
        (default): "forward" when `n (1 + n + P) <= 64`, else "adjoint"; always
        "adjoint" for the implicit methods' compiled derivatives. Forward mode (jvp,
        jacfwd) uses forward sensitivities (the compiled tangent of the same
        discretization where reverse mode is compiled).
      stepping: who runs the step loop. "scipy": SciPy's own Python loop (one host
        round trip per right-hand-side evaluation, ~10 us each). "compiled": SciPy's
        algorithm (same tableaus, step control, first step and dense output, so the
        same steps and `nfev`) as a loop inside the caller's JAX program, for RK23,
        RK45 and DOP853 (options limited to first_step, max_step; needs
        jax_enable_x64): no host round trip at all, and `vmap` batches the loop. For
        BDF, Radau and LSODA (x64), "compiled" keeps SciPy's loop for the solve and
        compiles the derivatives over its recorded steps. "auto" (default):
        "compiled" where it applies, else "scipy".
      checkpoints: the compiled loop's reverse mode: how many states it may store
        (None: 16 MiB worth, at most 2 x 1024, which covers 1e6 steps). Each
        accepted step's `(t, y, h)` of the current segment and the loop state at
        each segment start are stored, never the stages; `checkpoints=k` covers
        about `(k/2)^2` accepted steps, at the price of one more forward solve per
        gradient. For BDF, Radau and LSODA with compiled derivatives: how many
        accepted steps the forward solve may record (one state each; None: 16 MiB
        worth, at most 16384). A solve with more steps raises ValueError naming this
        argument.
      on_failure: "raise" (default): a failed solve raises
        `jaxbridge.scipy.SolverError` with SciPy's message (eager and under `jit`);
        "nan": the outputs and gradients are NaN and `status` is -1.
      **options: passed on to `scipy.integrate.solve_ivp` (first_step, max_step, ...);
        static, so hashable. `jac_sparsity` (Radau, BDF: an (n, n) array or sparse
        matrix) is SciPy's: its finite differences use it with `jac=False`; with JAX's
        Jacobian (`jac=None`) SciPy gets that Jacobian as a sparse matrix.

    Returns:
      :class:`OdeResult` with SciPy's fields: `t` (= t_eval), `y` of shape
      `y0.shape + (len(t_eval),)`, `status`, `success`, `nfev`, `njev`, `nlu`.

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from jaxbridge.scipy.integrate import solve_ivp
      >>> decay = lambda t, y, k: -k * y
      >>> grad = jax.grad(lambda k: solve_ivp(decay, (0.0, 1.0), jnp.ones(1), t_eval=[1.0],
      ...                                     args=(k,), rtol=1e-8).y[0, 0])
      >>> round(float(grad(1.0)), 4)  # d/dk exp(-k) at k = 1
      -0.3679
    """
    # Over 80 lines: SciPy's long signature and its documentation; the body hands the
    # arguments to one preparation, `_arguments.prepare`, at once.
    prepared = prepare(IvpRequest(
        fun=fun, t_span=t_span, y0=y0, method=method, t_eval=t_eval,
        dense_output=dense_output, events=events, vectorized=vectorized, args=args,
        rtol=rtol, atol=atol, jac=jac,
        adjoint_rtol=adjoint_rtol, adjoint_atol=adjoint_atol, sensitivity=sensitivity,
        stepping=stepping, checkpoints=checkpoints, on_failure=on_failure, options=options))
    if prepared.cfg.events_path:
        return _with_events(prepared)
    return _plain(prepared)


def _plain(p: PreparedIvp) -> OdeResult:
    """y(t_eval) by the compiled loop, the compiled stiff derivatives or SciPy's loop, as
    one program per configuration (`_common.program`: a repeat eager call is one
    dispatch)."""
    run = program(("solve_ivp", p.cfg), const(functools.partial(_plain_program, p.cfg)))
    return run(p.t0, p.t1, p.y0, p.t_eval, p.params, p.fixed, p.jac_ops)


def _plain_program(cfg: IvpConfig, t0: Any, t1: Any, y0: Any, t_eval: Any, params: tuple,
                   fixed: tuple, jac_ops: tuple) -> OdeResult:
    compiled = cfg.stepping == "compiled"
    if compiled and cfg.method in IMPLICIT_METHODS and cfg.sensitivity == "adjoint":
        ys, stats = stiff_ivp_program(cfg, t0, t1, y0, t_eval, params, fixed, jac_ops)
    elif compiled and cfg.method not in IMPLICIT_METHODS:
        ys, stats = compiled_ivp_program(cfg, t0, t1, y0, t_eval, params, fixed)
    else:
        ys, stats = scipy_solve(t0, t1, y0, t_eval, params, fixed, jac_ops, cfg=cfg)
    return OdeResult(t=t_eval, y=jnp.moveaxis(ys, 0, -1), status=stats[0], nfev=stats[1],
                     njev=stats[2], nlu=stats[3], success=stats[0] == 0)


def _with_events(p: PreparedIvp) -> OdeEventResult:
    """SciPy's solve with events, dense output or its step times (`_trajectory`), its
    event times, dense output and step outputs differentiable in JAX on top: one
    program per configuration, as `_plain`. A repeat eager call of an explicit method
    runs SciPy's loop compiled instead (`_compiled_eagerly`)."""
    given = p.events is not None
    operands = (p.t0, p.t1, p.y0, p.t_eval, p.params, p.fixed, p.jac_ops, p.ev_ops)
    eager = _compiled_eagerly(p, given, operands)
    if eager is not None:
        return eager
    run = program(("solve_ivp events", p.cfg, given),
                  const(functools.partial(_events_program, p.cfg, given)))
    return run(operands)


_compiled_gave_up = FallbackBackoff()


def _compiled_eagerly(p: PreparedIvp, given: bool, operands: tuple) -> OdeEventResult | None:
    """The result from SciPy's RK loop compiled (`_compiled_trajectory`), where the call
    is eager (`eager_device`: nothing is traced, so nothing is differentiated and the
    host call's derivative rules have nothing to do) on the CPU, repeats a
    configuration met before (`repeat_program`) and the loop is sure of SciPy's result;
    else None (the caller runs SciPy's loop). One evaluation of the user's function
    from SciPy's loop is one JAX call (~20 us); compiled, a repeat call is one
    dispatch. A configuration whose loop keeps giving up tries it on fewer and fewer
    calls (`FallbackBackoff`)."""
    try:
        device = eager_device(operands)
    except NotEager:
        return None
    if not computes_on_cpu(device) or not applies(p.cfg, p.t0, p.t1, p.y0.size):
        return None
    key = ("solve_ivp events compiled", p.cfg, given)
    if not _compiled_gave_up.should_try(key):
        return None
    run = repeat_program(key, const(functools.partial(_compiled_program, p.cfg, given)))
    if run is None:  # a first call: SciPy's loop (a new configuration compiles nothing)
        return None
    result, sure = run(operands)
    sure = bool(np.asarray(sure))
    _compiled_gave_up.record(key, sure)
    return result if sure else None


def _compiled_program(cfg: IvpConfig, given: bool, operands: tuple
                      ) -> tuple[OdeEventResult, Any]:
    """`_compiled_eagerly`'s program: `_events_program` with the compiled loop's
    results, and whether they are sure to be SciPy's."""
    t0, t1, y0, t_eval, params, fixed, _, ev_ops = operands
    out, sure = compiled_trajectory(cfg, t0, t1, y0, t_eval, params, fixed, ev_ops)
    return _results(cfg, given, operands, out), sure


def _events_program(cfg: IvpConfig, given: bool, operands: tuple) -> OdeEventResult:
    """`_with_events`' program. The user's functions are evaluated through their
    converted forms (`HostFun`) on this call's operands, never as the Python
    functions: a compiled program keeps nothing of one call's closed-over values."""
    t0, t1, y0, t_eval, params, fixed, jac_ops, ev_ops = operands
    out = trajectory(t0, t1, y0, t_eval, params, fixed,
                     (jac_ops, tuple(tuple(sg(o) for o in ops) for ops in ev_ops)), cfg=cfg)
    return _results(cfg, given, operands, out)


def _results(cfg: IvpConfig, given: bool, operands: tuple, out: dict) -> OdeEventResult:
    """The result fields from `trajectory`'s dict: event times and dense output with
    their derivatives, step outputs."""
    t0, t1, y0, t_eval, params, fixed, jac_ops, ev_ops = operands
    p = _Operands(cfg, t0, y0, t_eval, params, fixed)
    stats = out["stats"]
    t_events, y_events = _event_times(p, out, ev_ops)
    sol = _dense_solution(p, out) if cfg.dense else None
    if cfg.steps:
        t_out, y_out = _step_outputs(p, out, t_events, y_events)
    else:
        t_out, y_out = t_eval, out["ys"]
    return OdeEventResult(
        t=t_out, y=jnp.moveaxis(y_out, 0, -1), sol=sol,
        t_events=t_events if given else None, y_events=y_events if given else None,
        nfev=stats[1], njev=stats[2], nlu=stats[3], status=stats[0], success=stats[0] >= 0,
        n_events=out["n_ev"] if given else None, n_points=stats[4])


@dataclasses.dataclass(frozen=True)
class _Operands:
    """One events-path call inside its program: its configuration and operands."""

    cfg: IvpConfig
    t0: Any
    y0: Any
    t_eval: Any
    params: tuple
    fixed: tuple

    def f(self, t: Any, y: Any) -> Any:
        """The user's right-hand side `fun(t, y, *args)` at this call's operands."""
        rhs = self.cfg.fun
        return rhs(rhs.merge(self.params, self.fixed), t, y)


def _event_times(p: _Operands, out: dict, ev_ops: tuple) -> tuple[list, list]:
    """Per event function, (t*, y(t*)) padded to max_events: the values from SciPy, the
    derivatives by the implicit function theorem (`_events.event_slot`)."""
    t_events, y_events = [], []
    for i, (hf, ops) in enumerate(zip(p.cfg.events, ev_ops)):
        valid = jnp.arange(p.cfg.max_events) < out["n_ev"][i]
        t_i, y_i = event_slot(functools.partial(hf, ops), p.f, (), out["t_ev"][i],
                              out["y_ev"][i], valid, sg(p.t0), sg(p.y0))
        t_events.append(t_i)
        y_events.append(y_i)
    return t_events, y_events


def _dense_solution(p: _Operands, out: dict) -> _dense.OdeSolution:
    """`sol.sol`: SciPy's interpolant, with y' and y'' at the nodes for its derivative."""
    nodes_t, nodes_y = out["nodes_t"], out["nodes_y"]

    def derivatives(t: Any, y: Any) -> Any:  # y' and y'' along the solution
        f, g = jax.jvp(p.f, (t, y), (jnp.ones_like(t), p.f(t, y)))
        return jnp.ravel(f), jnp.ravel(g)
    F, G = jax.vmap(derivatives)(sg(nodes_t), nodes_y)
    return _dense.OdeSolution(p.cfg.method, p.y0.shape, _dense.DenseArrays(
        ts=nodes_t, n_nodes=out["stats"][5], t_ref=out["seg"][:, 0], h=out["seg"][:, 1],
        y_old=out["y_old"], C=out["C"], Y=nodes_y.reshape(nodes_y.shape[0], -1), F=F, G=G))


def _step_outputs(p: _Operands, out: dict, t_events: list, y_events: list) -> tuple:
    """(t, y) at SciPy's step times (t_eval=None), padded with inf to max_steps + 1; a
    last step at a terminal event takes that event's differentiable t*, y*."""
    stats, m, ndim = out["stats"], out["stats"][5], p.y0.ndim
    k = jnp.arange(p.cfg.max_steps + 1)
    t_out = jnp.where(k == 0, p.t0, out["nodes_t"])
    y_out = out["nodes_y"]
    if p.cfg.events:
        e = jnp.maximum(stats[6], 0)
        j = jnp.clip(jnp.take(out["n_ev"], e) - 1, 0, p.cfg.max_events - 1)
        t_star = jnp.stack(t_events)[e, j]
        y_star = jnp.stack(y_events)[e, j]
        last = (k == m - 1) & (stats[6] >= 0)
        t_out = jnp.where(last, t_star, t_out)
        y_out = jnp.where(last.reshape(-1, *([1] * ndim)), y_star, y_out)
    past = k >= m
    t_out = jnp.where(past, jnp.inf, t_out)
    y_out = jnp.where(past.reshape(-1, *([1] * ndim)), jnp.inf, y_out)
    return t_out, y_out
