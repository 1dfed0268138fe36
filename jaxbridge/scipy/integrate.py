"""Differentiable `scipy.integrate`: `solve_ivp` (discrete or continuous adjoint) and `quad`.

The integrands and right-hand sides are written in JAX. Two ways to solve:

* **The explicit methods (RK23, RK45, DOP853), `stepping="compiled"`** (the default
  with jax_enable_x64): SciPy's algorithm (same tableaus, step control, dense output:
  the same steps and values, `_rk`) runs as a `lax.while_loop` inside the caller's
  own program -- no host call, on whatever device the program runs, batched by `vmap`
  (one loop for the batch). Forward mode is JAX's derivative of the loop with the
  step sizes held; reverse mode is the **discrete adjoint** of the accepted steps
  (stages recomputed from stored `(t, y, h)`, JAX's VJP of the vector field), with
  two-level checkpointing under the `checkpoints` budget. Both are the exact
  derivative of the discrete solution (to rounding), not within-tolerance
  approximations; the cost of a gradient is about two forward solves whatever the
  number of parameters.
* **The implicit methods (BDF, Radau, LSODA), `stepping="compiled"`** (the default
  with jax_enable_x64): SciPy solves on the host and records its accepted steps;
  reverse and forward mode are one compiled JAX loop over them, the derivative of
  Radau IIA on those steps (`_stiff`): exact for Radau's discrete solution, within
  tolerance for BDF and LSODA. Cost per step: a few Newton iterations on 3n unknowns
  and one VJP of the vector field, whatever the number of parameters.
* **SciPy's own loop, `stepping="scipy"`** (every method): SciPy solves on the host and
  the derivatives come from the
  problem's structure (the continuous adjoint or forward sensitivity equations, below;
  quad's Leibniz rule), never from differentiating SciPy's iterations. These are
  accurate to the solver's tolerance.

**Calling conventions** are SciPy's: `fun(t, y, *args)`, `func(x, *args)`, with
`args` a tuple (pytrees inside it are fine). Functions may also close over traced
values (`lambda t, y: -k * y` under `jax.grad` w.r.t. `k`): closed-over arrays are
lifted out as inputs of the host call (`_trace.convert`), so their gradients are the
same as through `args`.

**solve_ivp, reverse mode (the continuous adjoint).** For `y' = f(t, y, p)` and
outputs `y_i = y(t_i)`, the cotangent `a(t) = dL/dy(t)` solves `a' = -a^T df/dy`
backward in time, jumping by `dL/dy_i` at each evaluation time, and
`dL/dp = int a^T df/dp dt` is integrated alongside it. Both are solved by SciPy with
the same `method` (implicit methods get the exact adjoint Jacobian from JAX); the
vector-Jacobian products of `f` are computed by JAX, compiled once per function.

*Memory (checkpointing choice).* The backward pass needs `y(t)` between the
evaluation times. Re-integrating `y` backward is unstable for stiff and dissipative
problems, and storing the whole forward trajectory's dense output costs memory in
proportion to the number of steps. We therefore use the outputs `y(t_i)` themselves
as checkpoints: for each interval `[t_{i-1}, t_i]`, last first, `y` is re-solved
forward from the checkpoint with dense output and the adjoint is solved backward
against that interpolant. Memory is O(len(t_eval) + steps in one interval), and a
gradient costs about one extra forward solve plus one adjoint solve.

**solve_ivp, forward sensitivities.** The sensitivity equations
`S' = df/dy S + df/dp D`, `S(t0) = S0`, are solved together with `y` in one augmented
solve, for K directions at once (the columns of `S`, `n x K`). Forward mode
(jvp/jacfwd) uses them with K = 1. Reverse mode can use them too, with one column per
input (K = n + P: the whole Jacobian of the outputs), then contracts with the
cotangents: one smooth solve from t0 with no restarts, no interpolation and no
backward transients, which for small systems is several times cheaper than the
adjoint (SciML's `ForwardDiffSensitivity` rule of thumb), and costs
`O(n (n + P))` per right-hand side, so the adjoint wins for large systems.
`sensitivity="auto"` (the default) picks forward sensitivities when the augmented
system is small (`n (1 + n + P) <= 64`) and the adjoint otherwise (the same rule for
the compiled loop, where "forward" means JAX's forward mode over all n + P inputs).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import scipy.integrate
import scipy.sparse
from jax.flatten_util import ravel_pytree

from .. import _foreign
from . import _loops as loops
from . import _rk, _stiff
from ._common import (
    as_float_array,
    check_policy,
    const,
    f64,
    failure,
    fill_zeros,
    host_copies,
    host_jit,
    jnp_ravel,
    nan_like,
    np_ravel,
    np_unravel,
    on_cpu,
    static_options,
    tangent_like,
    unsupported,
)
from ._ivp_common import IMPLICIT_METHODS, METHODS, OdeResult, ode_functions
from ._trace import HostFun, array_aval, check_args, convert

__all__ = ["solve_ivp", "quad", "OdeResult", "METHODS", "IMPLICIT_METHODS", "SENSITIVITIES",
           "OdeSolution", "solve_bvp"]

_SPARSE_ADJOINT_JAC = 64  # parameter count above which the adjoint Jacobian is sparse


# =================================================================== solve_ivp
class _Ode:
    """Host-side view of one ODE: NumPy callables for SciPy, backed by jitted JAX.

    `params` are the differentiable operands of `fun` (SciPy `args` leaves and
    closed-over arrays), `fixed` its other operands, `jac_ops` those of `jac`.
    """

    def __init__(self, fun: HostFun, jac: HostFun | bool | None, shape: tuple, ydtype: Any,
                 tdtype: Any, params: tuple, fixed: tuple, jac_ops: tuple) -> None:
        self.shape = tuple(shape)
        self.n = int(np.prod(self.shape, dtype=int))
        self.params, self.fixed, self.jac_ops = host_copies((params, fixed, jac_ops))
        self.p_flat = np_ravel(params)
        self.P = self.p_flat.size
        key = (fun, jac, self.shape, np.dtype(ydtype), np.dtype(tdtype))
        shape_ = self.shape  # (the compiled functions must not hold `self`)

        # Every host function takes the fixed operands `fx` first (see __call__).
        roles = ode_functions(fun, jac, shape_, ydtype, tdtype)
        f = roles["f"]

        def adj(fx: Any, t: Any, y: Any, a: Any, p: Any) -> Any:
            _, pullback = jax.vjp(lambda y, p: f(fx, t, y, p), y, p)
            ay, ap = pullback(a)
            return jnp.concatenate([-ay, -jnp_ravel(ap)])

        def adj_jac(fx: Any, t: Any, y: Any, p: Any) -> Any:
            flat, unravel = ravel_pytree(p)
            jy = jax.jacfwd(f, argnums=2)(fx, t, y, p)
            jp = jax.jacfwd(lambda q: f(fx, t, y, unravel(q)))(flat).reshape(y.size, -1)
            return -jy.T, -jp.T

        roles.update(adj=adj, adj_jac=adj_jac)
        self._j = {r: host_jit(key + (r,), const(g)) for r, g in roles.items()}

    def __call__(self, role: str, *xs: Any) -> Any:
        return self._j[role](self.fixed, *xs)

    # SciPy-facing callables (float64 NumPy in and out)
    def f(self, t: float, y: np.ndarray) -> np.ndarray:
        return f64(self("f", t, y, self.params))

    def jac(self, t: float, y: np.ndarray) -> np.ndarray:
        return f64(self("jac", self.jac_ops, t, y, self.params))

    def jac_kw(self, method: str, jac: Any) -> dict:
        if method in IMPLICIT_METHODS and jac is not False:
            return {"jac": self.jac}
        return {}

    def solve(self, role: str, t0: float, z0: np.ndarray, t1: float, t_eval: np.ndarray, *,
              method: str, rtol: float, atol: Any, options: tuple,
              extra: tuple = (), jac: Any = None) -> Any:
        """`scipy.integrate.solve_ivp` of `z' = role(t, z, params, *extra)` (SciPy's loop;
        the compiled loop does not come here: see `_compiled_ivp`)."""
        kw = {}
        if jac is not None and method in IMPLICIT_METHODS:
            kw["jac"] = jac
        return scipy.integrate.solve_ivp(
            lambda t, z: f64(self(role, t, z, self.params, *extra)), (t0, t1), z0,
            method=method, t_eval=t_eval, rtol=rtol, atol=atol, **kw, **dict(options))

    def sensitivities(self, t0: Any, y0: Any, t1: Any, t_eval: Any, S0: Any, dp: Any, *,
                      method: str, rtol: Any, atol: Any, sens_rtol: Any, sens_atol: Any, jac: Any,
                      options: tuple) -> Any:
        """`S(t_i)` (T, n, K) of `S' = f_y S + f_p dp`, `S(t0) = S0` (n, K); dp (P, K).

        Returns `(S, None)`, or `(None, SciPy's message)` when the solve fails.
        """
        n, K = S0.shape
        T = t_eval.shape[0]
        if np.all(t_eval == t0):
            return np.broadcast_to(S0, (T, n, K)).copy(), None
        dp = jax.device_put(np.asarray(dp, np.float64).reshape(self.P, K))
        params = self.params
        sens_jac = None
        if method in IMPLICIT_METHODS and jac is not False:
            sens_jac = lambda t, z: f64(self("sens_jac", t, z, params, dp))  # noqa: E731
        sol = self.solve("sens", t0, np.concatenate([y0, np.ravel(S0)]), t1, t_eval,
                         method=method, rtol=min(rtol, sens_rtol),
                         atol=np.concatenate([np.full(n, atol), np.full(n * K, sens_atol)]),
                         options=options, extra=(dp,), jac=sens_jac)
        if sol.status != 0:
            return None, sol.message
        return sol.y[n:].T.reshape(T, n, K), None


@dataclasses.dataclass(frozen=True)
class IvpConfig:
    """Everything static about one `solve_ivp` call (hashable: the host call's key)."""

    fun: HostFun
    jac: Any               # a HostFun, None (JAX's Jacobian) or False (SciPy's)
    method: str
    rtol: float
    atol: float
    adjoint_rtol: float
    adjoint_atol: float
    sensitivity: str       # "forward" or "adjoint" (resolved from "auto")
    on_failure: str
    options: tuple         # SciPy's **options, as sorted items
    stepping: str          # "compiled" or "scipy" (resolved from "auto")
    checkpoints: int | None = None


def _ivp_result(t0: Any, t1: Any, y0: Any, t_eval: Any, params: Any, fixed: Any, jac_ops: Any,
                **_: Any) -> Any:
    return (jax.ShapeDtypeStruct((t_eval.shape[0], *y0.shape), y0.dtype),
            jax.ShapeDtypeStruct((5,), jnp.int32))  # status, nfev, njev, nlu, accepted steps


def _fail(name: str, method: str, message: str, on_failure: str) -> Any:
    if on_failure == "raise":
        raise failure(name, f"solve_ivp(method={method!r}): {message}")


def _at_t0(y0: Any, t_eval: np.ndarray, t0: float) -> Any:
    """y(t_eval) when there is nothing to integrate (no times, or all of them t0), else
    None."""
    if t_eval.shape[0] and not np.all(t_eval == t0):
        return None
    return np.broadcast_to(y0, (t_eval.shape[0], *y0.shape)).astype(y0.dtype)


def _solve_failed(sol: Any, ys: Any, stats: np.ndarray, method: str,
                  on_failure: str) -> bool:
    """Whether SciPy's solve failed (its status, or a non-finite solution `ys`, None
    when the status says it failed): raises the SolverError under on_failure="raise";
    else marks `stats` and returns True."""
    if sol.status != 0:
        _fail("integrate.solve_ivp", method, sol.message, on_failure)
        return True
    if not np.all(np.isfinite(ys)):
        _fail("integrate.solve_ivp", method, "the solution is not finite", on_failure)
        stats[0] = -1
        return True
    return False


def _ode(primals: tuple, fun: Any, jac: Any) -> Any:
    t0, t1, y0, t_eval, params, fixed, jac_ops = primals
    return _Ode(fun, jac, y0.shape, y0.dtype, np.asarray(t_eval).dtype, params, fixed,
                jac_ops)


@_foreign.foreign(_ivp_result)
def _ivp(t0: Any, t1: Any, y0: Any, t_eval: Any, params: Any, fixed: Any, jac_ops: Any, *,
         cfg: IvpConfig) -> Any:
    """The forward solve: y(t_eval) of y' = fun(t, y), y(t0) = y0, on [t0, t1]."""
    fun, jac, method, on_failure = cfg.fun, cfg.jac, cfg.method, cfg.on_failure
    t_eval_in = t_eval
    t0, t1, t_eval = float(t0), float(t1), f64(t_eval)
    T = t_eval.shape[0]
    if (still := _at_t0(y0, t_eval, t0)) is not None:
        return still, np.zeros(5, np.int32)
    with on_cpu():
        ode = _ode((t0, t1, y0, t_eval_in, params, fixed, jac_ops), fun, jac)
        sol = ode.solve("f", t0, np.ravel(f64(y0)), t1, t_eval, method=method, rtol=cfg.rtol,
                        atol=cfg.atol, options=cfg.options,
                        jac=ode.jac if jac is not False else None)
    stats = np.array([sol.status, sol.nfev, sol.njev, sol.nlu, getattr(sol, "steps", -1)],
                     np.int32)
    if _solve_failed(sol, sol.y, stats, method, on_failure):
        return np.full((T, *y0.shape), np.nan, y0.dtype), stats
    return sol.y.T.reshape(T, *y0.shape).astype(y0.dtype), stats


def _recorded_result(t0: Any, t1: Any, y0: Any, t_eval: Any, params: Any, fixed: Any,
                     jac_ops: Any, *, cfg: IvpConfig, capacity: int) -> Any:
    f64_ = jnp.result_type(float)
    return (*_ivp_result(t0, t1, y0, t_eval, params, fixed, jac_ops),
            jax.ShapeDtypeStruct((capacity + 1,), f64_),
            jax.ShapeDtypeStruct((capacity + 1, y0.size), f64_))


@_foreign.foreign(_recorded_result)
def _ivp_recorded(t0: Any, t1: Any, y0: Any, t_eval: Any, params: Any, fixed: Any,
                  jac_ops: Any, *, cfg: IvpConfig, capacity: int) -> Any:
    """The forward solve, plus SciPy's accepted steps: `(ys, stats, grid_t (M+1,),
    grid_y (M+1, n))` with M = capacity (padded with the last step; stats[4] is the
    number of accepted steps). What `_stiff`'s compiled derivatives run on."""
    method, on_failure = cfg.method, cfg.on_failure
    t0, t1, t_eval = float(t0), float(t1), f64(t_eval)
    T, n = t_eval.shape[0], int(np.size(y0))
    grid_t, grid_y = np.full(capacity + 1, t0), np.zeros((capacity + 1, n))
    grid_y[:] = np.ravel(f64(y0))
    nan = np.full((T, *y0.shape), np.nan, y0.dtype)
    if (still := _at_t0(y0, t_eval, t0)) is not None:
        return still, np.zeros(5, np.int32), grid_t, grid_y
    with on_cpu():
        ode = _ode((t0, t1, y0, t_eval, params, fixed, jac_ops), cfg.fun, cfg.jac)
        kw = {"jac": ode.jac} if cfg.jac is not False else {}
        sol = scipy.integrate.solve_ivp(ode.f, (t0, t1), np.ravel(f64(y0)), method=method,
                                        dense_output=True, rtol=cfg.rtol, atol=cfg.atol, **kw,
                                        **dict(cfg.options))
    steps = len(sol.t) - 1
    stats = np.array([sol.status, sol.nfev, sol.njev, sol.nlu, steps], np.int32)
    ys: Any = sol.sol(t_eval).T if sol.status == 0 else None
    if _solve_failed(sol, ys, stats, method, on_failure):
        return nan, stats, grid_t, grid_y
    if steps > capacity:
        if on_failure == "raise":
            raise ValueError(
                f"jaxbridge.scipy.integrate.solve_ivp: the checkpoint budget is too small: "
                f"the {method} solve took {steps} accepted steps, and the compiled adjoint "
                f"of the implicit methods stores one state per step, {capacity} at most. "
                f"Pass checkpoints >= {steps}, or sensitivity='forward'.")
        return nan, stats, grid_t, grid_y
    grid_t[:steps + 1], grid_t[steps + 1:] = sol.t, sol.t[-1]
    grid_y[:steps + 1], grid_y[steps + 1:] = sol.y.T, sol.y[:, -1]
    return ys.reshape(T, *y0.shape).astype(y0.dtype), stats, grid_t, grid_y


@_ivp.defvjp
def _ivp_vjp(primals: tuple, out: Any, ct: Any, *, cfg: IvpConfig) -> Any:
    """Reverse mode: forward sensitivities, the discrete adjoint of the compiled loop, or
    the continuous adjoint with checkpoints at the evaluation times (see the module
    docstring)."""
    fun, jac, method, on_failure, options = cfg.fun, cfg.jac, cfg.method, cfg.on_failure, \
        cfg.options
    rtol, atol, adjoint_rtol, adjoint_atol = cfg.rtol, cfg.atol, cfg.adjoint_rtol, \
        cfg.adjoint_atol
    t0, t1, y0, t_eval, params, fixed, jac_ops = primals
    ys, ct = out[0], ct[0]
    t0, t1, t_eval = float(t0), float(t1), f64(t_eval)
    T = t_eval.shape[0]
    if T == 0:  # no outputs, nothing to differentiate
        return _ivp_cotangents(primals, None, np.zeros(np.shape(y0)), np.zeros(0),
                               np.zeros(np_ravel(params).size), zero_t0=True)
    if not np.all(np.isfinite(ys)):  # failed forward solve ("nan" policy)
        return _ivp_vjp_nan(primals)
    with on_cpu():
        ode = _ode(primals, fun, jac)
        n, P = ode.n, ode.P
        Y = f64(ys).reshape(T, n)
        G = f64(ct).reshape(T, n)
        t_bar = np.array([G[i] @ ode.f(t_eval[i], Y[i]) for i in range(T)])
        if cfg.sensitivity == "forward":
            # The whole Jacobian d y(t_i) / d(y0, params) in one solve, then contracted.
            eye = np.eye(n + P)
            S, message = ode.sensitivities(
                t0, np.ravel(f64(y0)), t1, t_eval, eye[:n], eye[n:], method=method,
                rtol=rtol, atol=atol, sens_rtol=adjoint_rtol, sens_atol=adjoint_atol,
                jac=jac, options=options)
            if S is None:
                _fail("integrate.solve_ivp", method, f"sensitivity solve: {message}",
                      on_failure)
                return _ivp_vjp_nan(primals)
            g = np.einsum("ti,tik->k", G, S)
            return _ivp_cotangents(primals, ode, g[:n], t_bar, g[n:])
        implicit = method in IMPLICIT_METHODS
        a, mu = np.zeros(n), np.zeros(P)
        # The parameter-gradient quadrature mu is left out of the step-size control
        # (as CVODES does by default): it is a pure quadrature of a and y, so the steps
        # that resolve them integrate it to the same order, and controlling it too makes
        # BDF stall on stiff problems whose adjoint has a fast initial transient.
        adj_atol = np.concatenate([np.full(n, adjoint_atol), np.full(P, 1e100)])
        starts = [(t0, np.ravel(f64(y0)))] + [(t_eval[i], Y[i]) for i in range(T - 1)]
        for i in range(T - 1, -1, -1):
            t_i = t_eval[i]
            a = a + G[i]
            t_prev, y_prev = starts[i]
            if t_prev == t_i:
                continue
            fwd = scipy.integrate.solve_ivp(
                ode.f, (t_prev, t_i), y_prev, method=method, dense_output=True, rtol=rtol,
                atol=atol, **ode.jac_kw(method, jac), **dict(options))
            if fwd.status != 0:
                _fail("integrate.solve_ivp", method,
                      f"re-solving the forward problem for the adjoint: {fwd.message}",
                      on_failure)
                return _ivp_vjp_nan(primals)
            y_of = fwd.sol

            def rhs(t: Any, z: Any, y_of: Any = y_of) -> Any:
                return f64(ode("adj", t, y_of(t), z[:n], ode.params))

            kw = {}
            if implicit and jac is not False:
                def adj_jac(t: Any, z: Any, y_of: Any = y_of) -> Any:
                    jy, jp = ode("adj_jac", t, y_of(t), ode.params)
                    jy, jp = f64(jy), f64(jp)
                    if P > _SPARSE_ADJOINT_JAC and method != "LSODA":
                        col = scipy.sparse.vstack([scipy.sparse.csc_matrix(jy),
                                                   scipy.sparse.csc_matrix(jp)])
                        return scipy.sparse.hstack(
                            [col, scipy.sparse.csc_matrix((n + P, P))], format="csc")
                    m = np.zeros((n + P, n + P))
                    m[:n, :n], m[n:, :n] = jy, jp
                    return m
                kw["jac"] = adj_jac
            back = scipy.integrate.solve_ivp(
                rhs, (t_i, t_prev), np.concatenate([a, mu]), method=method,
                rtol=adjoint_rtol, atol=adj_atol, **kw, **dict(options))
            if back.status != 0:
                _fail("integrate.solve_ivp", method, f"adjoint solve: {back.message}",
                      on_failure)
                return _ivp_vjp_nan(primals)
            a, mu = back.y[:n, -1], back.y[n:, -1]
        return _ivp_cotangents(primals, ode, a, t_bar, mu)


def _ivp_cotangents(primals: tuple, ode: Any, a: Any, t_bar: Any, mu: Any,
                    zero_t0: Any = False) -> Any:
    """Cotangents of (t0, t1, y0, t_eval, params, fixed, jac_ops) from a = dL/dy0,
    t_bar = dL/dt_eval and mu = dL/dparams (flat)."""
    t0, t1, y0, t_eval, params, fixed, jac_ops = primals
    t0_bar = 0.0 if zero_t0 else -(a @ ode.f(float(t0), np.ravel(f64(y0))))
    return (np.asarray(t0_bar, np.asarray(t0).dtype), None,  # y(t_eval) does not depend on t1
            np.reshape(a, y0.shape).astype(y0.dtype),
            np.asarray(t_bar, np.asarray(t_eval).dtype),
            np_unravel(mu, params), None, None)


def _ivp_vjp_nan(primals: tuple) -> Any:
    t0, t1, y0, t_eval, params, fixed, jac_ops = primals
    return (*nan_like((t0, None, y0, t_eval, params)), None, None)


@_ivp.defjvp
def _ivp_jvp(primals: tuple, out: Any, tangents: Any, *, cfg: IvpConfig) -> Any:
    """Forward sensitivities: (y, s)' = (f, df/dy s + df/dp dp), s(t0) = dy0 - f dt0."""
    fun, jac, method, on_failure = cfg.fun, cfg.jac, cfg.method, cfg.on_failure
    rtol, atol = cfg.rtol, cfg.atol
    t0, t1, y0, t_eval, params, fixed, jac_ops = primals
    dt0, _, dy0, dt_eval, dparams, _, _ = tangents
    ys = out[0]
    t0, t1, t_eval = float(t0), float(t1), f64(t_eval)
    T = t_eval.shape[0]
    if T == 0 or not np.all(np.isfinite(ys)):
        return np.full(np.shape(ys), np.nan, ys.dtype), None
    with on_cpu():
        ode = _ode(primals, fun, jac)
        n = ode.n
        y0f = np.ravel(f64(y0))
        s0 = np.zeros(n) if dy0 is None else np.ravel(f64(dy0))
        if dt0 is not None:
            s0 = s0 - ode.f(t0, y0f) * float(dt0)
        Y = f64(ys).reshape(T, n)
        S, message = ode.sensitivities(
            t0, y0f, t1, t_eval, s0[:, None], np_ravel(fill_zeros(dparams, params))[:, None],
            method=method, rtol=rtol, atol=atol, sens_rtol=rtol, sens_atol=atol, jac=jac,
            options=cfg.options)
        if S is None:
            _fail("integrate.solve_ivp", method, f"sensitivity solve: {message}", on_failure)
            return np.full(np.shape(ys), np.nan, ys.dtype), None
        S = S[..., 0]
        if dt_eval is not None:
            S = S + np.stack([ode.f(t, y) for t, y in zip(t_eval, Y)]) * f64(dt_eval)[:, None]
    return S.reshape(ys.shape).astype(ys.dtype), None


SENSITIVITIES = ("auto", "adjoint", "forward")
_FORWARD_SENSITIVITY_MAX = 64  # augmented size n (1 + n + P) up to which "auto" -> forward


def _sensitivity_choice(sensitivity: str, n: int, P: int, compiled_implicit: bool = False
                        ) -> str:
    """"auto": forward sensitivities for a small augmented system, else the adjoint; for
    the implicit methods with compiled derivatives, always the adjoint (measured faster
    than SciPy solving the augmented sensitivity system even for n = P = 3: Robertson,
    benchmarks/RESULTS.md)."""
    if sensitivity not in SENSITIVITIES:
        raise ValueError(f"jaxbridge.scipy.integrate.solve_ivp: sensitivity must be one of "
                         f"{SENSITIVITIES}, got {sensitivity!r}")
    if sensitivity == "auto":
        if compiled_implicit:
            return "adjoint"
        return "forward" if n * (1 + n + P) <= _FORWARD_SENSITIVITY_MAX else "adjoint"
    return sensitivity


def _check_method(method: str, name: str) -> None:
    if isinstance(method, str) and method in METHODS:
        return
    if not isinstance(method, str) and (hasattr(method, "shape") or
                                        isinstance(method, (list, tuple))):
        raise TypeError(
            f"jaxbridge.scipy.{name}: the 4th positional argument is `method`, as in SciPy's "
            f"solve_ivp(fun, t_span, y0, method='RK45', t_eval=None, ...); got an array. "
            f"Pass the evaluation times as t_eval=...")
    raise ValueError(f"jaxbridge.scipy.{name}: method must be one of {METHODS}, "
                     f"got {method!r}")


def solve_ivp(fun: Callable[..., Any], t_span: Any, y0: Any, method: str = "RK45",
              t_eval: Any = None, dense_output: bool = False, events: Any = None,
              vectorized: bool = False, args: Any = None, *, rtol: float = 1e-3,
              atol: float = 1e-6, jac: Callable[..., Any] | bool | None = None,
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
      method: any of SciPy's: "RK23", "RK45", "DOP853", "Radau", "BDF", "LSODA".
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
        `t_eval` times and `status` is 1. These three use the module `_events`
        (forward sensitivities for gradients); see docs/guides/ode-events.md.
      vectorized: accepted and ignored (Jacobians come from JAX, not from finite
        differences, so SciPy's vectorized evaluation has nothing to speed up).
      args: a tuple passed as `fun(t, y, *args)` (and `jac(t, y, *args)`). Array and
        float leaves (pytrees are fine) are traced and differentiable; Python ints,
        bools and other objects are passed unchanged (static). As in SciPy, any other
        iterable is unpacked the same way, and a non-iterable raises SciPy's TypeError.
      rtol, atol: SciPy's tolerances and defaults (1e-3, 1e-6: loose; gradients
        inherit the solution's error, so pass tighter ones for training).
      jac: for the implicit methods, as in SciPy a function `jac(t, y, *args)` (in
        JAX); None (default): the exact Jacobian from JAX; False: SciPy's finite
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
        static, so hashable.

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
    name = "integrate.solve_ivp"
    check_policy(on_failure, name)
    _check_method(method, name)
    budget = _check_checkpoints(checkpoints, name)  # before the events path, which ignores it
    if events is not None or dense_output or t_eval is None:
        from . import _events  # SciPy's events, dense output and step times (issue 26)
        return _events.solve_ivp(
            fun, t_span, y0, method, t_eval, dense_output, events, args, rtol=rtol, atol=atol,
            jac=jac, adjoint_rtol=adjoint_rtol, adjoint_atol=adjoint_atol,
            sensitivity=sensitivity, stepping=stepping, on_failure=on_failure, **options)
    del vectorized  # Jacobians come from JAX
    call = "fun(t, y, *args)"
    args = check_args(args, name, call, "unpack_checked")
    y0 = as_float_array(y0, name, "y0")
    t_eval = jnp.asarray(t_eval)
    if t_eval.ndim != 1:
        raise ValueError(f"jaxbridge.scipy.{name}: t_eval must be 1-D, got shape {t_eval.shape}")
    if len(t_span) != 2:
        raise ValueError(f"jaxbridge.scipy.{name}: t_span must be (t0, tf), got {t_span!r}")
    tdtype = jnp.result_type(t_eval.dtype, float)
    t_eval = t_eval.astype(tdtype)
    t0, t1 = jnp.asarray(t_span[0], tdtype), jnp.asarray(t_span[1], tdtype)
    _check_t_eval(t0, t1, t_eval, name)
    t_aval = jax.ShapeDtypeStruct((), tdtype)
    y_aval = jax.ShapeDtypeStruct(y0.shape, y0.dtype)
    rhs, ops = convert(fun, name, "fun", (t_aval, y_aval), args, call,
                       vary_like=(t0, t1, y0, t_eval))
    _check_out(rhs, y0, name, "fun")
    params, fixed = rhs.split(ops)
    jac_hf = jac
    jac_ops: Sequence[Any] = ()
    if callable(jac):
        jac_hf, jac_ops = convert(jac, name, "jac", (t_aval, y_aval), args,
                                  "jac(t, y, *args)")
        jac_ops = tuple(jax.lax.stop_gradient(o) for o in jac_ops)
    static = static_options(options, name)
    stepping = _stepping_choice(stepping, method, static, name)
    sensitivity = _sensitivity_choice(sensitivity, y0.size, sum(p.size for p in params),
                                      stepping == "compiled" and method in IMPLICIT_METHODS)
    cfg = IvpConfig(fun=rhs, jac=jac_hf, method=method, rtol=float(rtol), atol=float(atol),
                    adjoint_rtol=float(rtol if adjoint_rtol is None else adjoint_rtol),
                    adjoint_atol=float(atol if adjoint_atol is None else adjoint_atol),
                    sensitivity=sensitivity, on_failure=on_failure, options=static,
                    stepping=stepping, checkpoints=budget)
    if stepping == "compiled" and method in IMPLICIT_METHODS and sensitivity == "adjoint":
        ys, stats = _stiff_ivp_program(cfg, t0, t1, y0, t_eval, params, fixed, tuple(jac_ops))
    elif stepping == "compiled" and method not in IMPLICIT_METHODS:
        ys, stats = _compiled_ivp_program(cfg, t0, t1, y0, t_eval, params, fixed)
    else:
        ys, stats = _ivp(t0, t1, y0, t_eval, params, fixed, tuple(jac_ops), cfg=cfg)
    return OdeResult(t=t_eval, y=jnp.moveaxis(ys, 0, -1), status=stats[0], nfev=stats[1],
                     njev=stats[2], nlu=stats[3], success=stats[0] == 0)


STEPPINGS = ("auto", "scipy", "compiled")


def _compiled_ivp(cfg: IvpConfig, t0: Any, t1: Any, y0: Any, t_eval: Any, params: tuple,
                  fixed: tuple) -> tuple[jax.Array, jax.Array]:
    """SciPy's explicit RK loop in the caller's program (`_rk.differentiable_solve`):
    no host call, derivatives by JAX (forward) and the discrete adjoint (reverse);
    `vmap` batches the loop itself."""
    rhs, shape, ydtype, tdtype = cfg.fun, y0.shape, y0.dtype, t_eval.dtype
    t0, t1, y0, t_eval, params, fixed = loops.join((t0, t1, y0, t_eval, params, fixed))

    def fun(t: Any, y: Any, p: Any, fx: Any) -> Any:
        out = rhs(rhs.merge(p, fx), t.astype(tdtype), y.reshape(shape).astype(ydtype))
        return jnp.ravel(out).astype(y.dtype)

    opts = dict(cfg.options)
    n = int(np.prod(shape, dtype=int))
    if n == 0:  # SciPy's OdeSolver.step: an empty state ends in one step, after one f call
        # (the loop's error norm over no components is NaN: every step would be rejected)
        return (jnp.zeros((t_eval.shape[0], *shape), ydtype),
                jnp.array([0, 1, 0, 0, 1], jnp.int32))
    L, S = _rk.checkpoint_sizes(cfg.checkpoints, n)
    spec = _rk.Spec(cfg.method, fun, cfg.rtol, opts.get("max_step", np.inf),
                    opts.get("first_step"), L, S, cfg.sensitivity)
    f64_ = jnp.result_type(float)
    ys, status, nfev, steps = _rk.differentiable_solve(
        spec, t0.astype(f64_), jnp.ravel(y0).astype(f64_), t1.astype(f64_),
        t_eval.astype(f64_), jnp.full(n, cfg.atol, f64_), params, fixed)
    finite = jnp.all(jnp.isfinite(ys))
    if cfg.on_failure == "raise":
        status = _check_status(status, finite, steps, method=cfg.method, budget=L * S)
    status = jnp.where((status == 0) & ~finite, -1, status)
    ys = jnp.where(status == 0, ys, jnp.nan).reshape((t_eval.shape[0], *shape)).astype(ydtype)
    zero = jnp.zeros((), jnp.int32)
    return ys, jnp.stack([status, nfev, zero, zero, steps])


# One jitted program per *structural* configuration (IvpConfig compares its HostFun by
# the traced structure), not per call: eager `grad` through a fresh closure per call
# then reuses the traced loop and its compiled derivatives. Called without it, every
# eager call traced a new while-loop jaxpr (the body closes over a fresh function),
# and JAX compiled and cached it anew: +13 MiB and seconds per call.
_compiled_ivp_program = jax.jit(_compiled_ivp, static_argnums=0)


@dataclasses.dataclass(frozen=True)
class _StiffProblem:
    """What `_stiff` needs of one BDF/Radau/LSODA problem (`_stiff.StiffSpec`): frozen
    and compared by value (IvpConfig compares the user's function structurally), so
    repeated solves of the same problem share JAX's caches."""

    cfg: IvpConfig
    shape: tuple
    ydtype: Any
    tdtype: Any
    capacity: int

    @property
    def eps(self) -> float:
        return float(np.finfo(self.ydtype).eps)

    @property
    def atol(self) -> float:
        return self.cfg.atol

    def fun(self, t: Any, y: Any, p: Any, fx: Any) -> Any:
        rhs = self.cfg.fun
        out = rhs(rhs.merge(p, fx), t.astype(self.tdtype),
                  y.reshape(self.shape).astype(self.ydtype))
        return jnp.ravel(out).astype(y.dtype)

    def _host(self, t0: Any, t1: Any, y0: Any, t_eval: Any) -> tuple:
        return t0.astype(self.tdtype), t1.astype(self.tdtype), \
            y0.reshape(self.shape).astype(self.ydtype), t_eval.astype(self.tdtype)

    def solve(self, t0: Any, t1: Any, y0: Any, t_eval: Any, params: Any, fixed: Any,
              jac_ops: Any) -> tuple:
        ys, stats = _ivp(*self._host(t0, t1, y0, t_eval), params, fixed, jac_ops,
                         cfg=self.cfg)
        return ys.reshape(t_eval.shape[0], -1).astype(y0.dtype), stats

    def record(self, t0: Any, t1: Any, y0: Any, t_eval: Any, params: Any, fixed: Any,
               jac_ops: Any) -> tuple:
        ys, stats, grid_t, grid_y = _ivp_recorded(
            *self._host(t0, t1, y0, t_eval), params, fixed, jac_ops, cfg=self.cfg,
            capacity=self.capacity)
        return ys.reshape(t_eval.shape[0], -1).astype(y0.dtype), stats, grid_t, grid_y


def _stiff_ivp(cfg: IvpConfig, t0: Any, t1: Any, y0: Any, t_eval: Any, params: tuple,
               fixed: tuple, jac_ops: tuple) -> tuple[jax.Array, jax.Array]:
    """BDF, Radau, LSODA: SciPy's loop forward (on the host), derivatives compiled from
    its recorded steps (`_stiff`: the Radau IIA discrete adjoint / tangent)."""
    t0, t1, y0, t_eval, params, fixed, jac_ops = loops.join(
        (t0, t1, y0, t_eval, params, fixed, jac_ops))
    f64_ = jnp.result_type(float)
    n = int(np.prod(y0.shape, dtype=int))
    if n == 0:  # SciPy's loop ends at once; nothing to differentiate (and to record)
        return _ivp(*jax.lax.stop_gradient((t0, t1, y0, t_eval, params, fixed, jac_ops)),
                    cfg=cfg)
    problem = _StiffProblem(cfg, tuple(y0.shape), np.dtype(y0.dtype), np.dtype(t_eval.dtype),
                            _stiff.max_states(cfg.checkpoints, n))
    ys, stats = _stiff.differentiable_solve(problem, t0.astype(f64_), t1.astype(f64_),
                                            jnp.ravel(y0).astype(f64_), t_eval.astype(f64_),
                                            params, fixed, jac_ops)
    return ys.reshape((t_eval.shape[0], *y0.shape)).astype(y0.dtype), stats


# Jitted on the structural configuration, as `_compiled_ivp_program` (same reason).
_stiff_ivp_program = jax.jit(_stiff_ivp, static_argnums=0)


@_foreign.foreign(lambda status, finite, steps, **_: jax.ShapeDtypeStruct((), jnp.int32))
def _check_status(status: Any, finite: Any, steps: Any, *, method: str, budget: int) -> Any:
    """on_failure="raise" for the compiled loop: SciPy's message as a SolverError."""
    code = int(status)
    if code == -2:
        raise ValueError(
            f"jaxbridge.scipy.integrate.solve_ivp: the checkpoint budget is too small: the "
            f"solve took {int(steps)} accepted steps, and the discrete adjoint covers "
            f"{budget} (checkpoints=k covers about (k/2)^2 steps). Pass a larger "
            f"`checkpoints`, or sensitivity='forward'.")
    if code == -1:
        _fail("integrate.solve_ivp", method, "Required step size is less than spacing "
              "between numbers.", "raise")
    if not bool(finite):
        _fail("integrate.solve_ivp", method, "the solution is not finite", "raise")
    return np.asarray(code, np.int32)


def _check_checkpoints(checkpoints: Any, name: str) -> int | None:
    if checkpoints is None:
        return None
    if isinstance(checkpoints, bool) or not isinstance(checkpoints, (int, np.integer)) \
            or checkpoints < 2:
        raise ValueError(f"jaxbridge.scipy.{name}: checkpoints must be None or an int >= 2 "
                         f"(how many states the discrete adjoint may store), got "
                         f"{checkpoints!r}")
    return int(checkpoints)


def _stepping_choice(stepping: str, method: str, options: tuple, name: str) -> str:
    if stepping not in STEPPINGS:
        raise ValueError(f"jaxbridge.scipy.{name}: stepping must be one of {STEPPINGS}, got "
                         f"{stepping!r}")
    x64 = jnp.result_type(float) == jnp.float64
    ok = _rk.supported(method, options) or (method in IMPLICIT_METHODS and bool(x64))
    if stepping == "compiled" and not ok:
        raise ValueError(
            f"jaxbridge.scipy.{name}: stepping='compiled' runs SciPy's explicit methods "
            f"{_rk.EXPLICIT} with the options {_rk.OPTIONS} only (and compiles the "
            f"derivatives of the implicit ones {IMPLICIT_METHODS}), with jax_enable_x64 on; "
            f"got method={method!r}, options={[k for k, _ in options]}")
    if stepping == "auto":
        return "compiled" if ok else "scipy"
    return stepping


def _check_t_eval(t0: jax.Array, t1: jax.Array, t_eval: jax.Array, name: str) -> None:
    """SciPy's check that t_eval lies in t_span (when the values are concrete)."""
    try:
        a, b, te = float(t0), float(t1), np.asarray(t_eval)
    except (jax.errors.ConcretizationTypeError, jax.errors.TracerArrayConversionError):
        return
    lo, hi = min(a, b), max(a, b)
    if te.size and (te.min() < lo or te.max() > hi):
        raise ValueError(f"jaxbridge.scipy.{name}: values in t_eval are not within t_span "
                         f"({a}, {b})")


def _check_out(hf: HostFun, like: jax.Array, name: str, what: str, shape: tuple | None = None
               ) -> None:
    want = like.shape if shape is None else shape
    outs = hf.jaxpr.outvars
    got = [tuple(array_aval(v.aval).shape) for v in outs]
    if len(outs) != 1 or got[0] != tuple(want):
        raise ValueError(f"jaxbridge.scipy.{name}: `{what}` must return one array of shape "
                         f"{tuple(want)}; it returned shapes {got}")


# =================================================================== quad
class _Integrand:
    def __init__(self, fun: HostFun, xdtype: Any, params: tuple, fixed: tuple) -> None:
        key = (fun, np.dtype(xdtype))
        self.params, self.fixed = host_copies((params, fixed))

        def f(fx: Any, x: Any, p: Any) -> Any:
            return jnp.asarray(fun(fun.merge(p, fx), x.astype(xdtype))).astype(
                jnp.result_type(float))

        def df_dp(fx: Any, x: Any, p: Any) -> Any:
            return jnp_ravel(jax.grad(f, argnums=2)(fx, x, p))

        def jvp_p(fx: Any, x: Any, p: Any, dp: Any) -> Any:
            return jax.jvp(lambda q: f(fx, x, q), (p,), (tangent_like(dp, p),))[1]

        self._f = host_jit(key + ("f",), lambda: f)
        self._df = host_jit(key + ("df",), lambda: df_dp)
        self._jvp = host_jit(key + ("jvp",), lambda: jvp_p)

    def f(self, x: float) -> float:
        return float(self._f(self.fixed, x, self.params))

    def df(self, x: float) -> np.ndarray:
        return f64(self._df(self.fixed, x, self.params))

    def jvp(self, x: float, dp: Any) -> float:
        return float(self._jvp(self.fixed, x, self.params, dp))


def _quad_result(a: Any, b: Any, params: Any, fixed: Any, **_: Any) -> Any:
    dtype = jnp.result_type(a.dtype, b.dtype)
    return jax.ShapeDtypeStruct((), dtype), jax.ShapeDtypeStruct((), dtype)


def _quad_run(integrand: Any, a: Any, b: Any, options: tuple, on_failure: str, what: str) -> Any:
    res = scipy.integrate.quad(integrand, a, b, full_output=1, **dict(options))
    if len(res) > 3:  # SciPy appends a message when ier != 0
        if on_failure == "raise":
            raise failure("integrate.quad", f"quad{what}: {res[3]}")
        return np.nan, np.nan
    return res[0], res[1]


@_foreign.foreign(_quad_result)
def _quad(a: Any, b: Any, params: Any, fixed: Any, *, fun: Any, options: tuple,
          on_failure: str) -> Any:
    dtype = np.result_type(a.dtype, b.dtype)
    with on_cpu():
        q = _Integrand(fun, a.dtype, params, fixed)
        val, err = _quad_run(q.f, float(a), float(b), options, on_failure, "")
    return np.asarray(val, dtype), np.asarray(err, dtype)


def _f_at(q: Any, x: Any) -> Any:
    return 0.0 if np.isinf(x) else q.f(float(x))


@_quad.defvjp
def _quad_vjp(primals: tuple, out: Any, ct: Any, *, fun: Any, options: tuple,
              on_failure: str) -> Any:
    a, b, params, fixed = primals
    ct_val, ct_err = float(ct[0]), float(ct[1])
    if not np.isfinite(out[0]) or ct_err != 0.0:  # failure, or abserr differentiated
        return (*nan_like((a, b, params)), None)
    with on_cpu():
        q = _Integrand(fun, a.dtype, params, fixed)
        a_bar, b_bar = -ct_val * _f_at(q, a), ct_val * _f_at(q, b)
        p_bar = nan_like(params)
        if params:
            grad = _gradient_integral(q, float(a), float(b), options, on_failure)
            p_bar = np_unravel(ct_val * grad, params)
    return np.asarray(a_bar, a.dtype), np.asarray(b_bar, b.dtype), p_bar, None


def _gradient_integral(q: Any, a: float, b: float, options: tuple, on_failure: str) -> Any:
    """`int_a^b d func / d params dx`, the whole gradient in one pass (SciPy's
    `quad_vec`); where that does not converge, one `quad` per parameter.

    `quad_vec` bisects without extrapolation, so an endpoint singularity that `quad`'s
    extrapolation gets in 10 subintervals (`c / sqrt(x)` on (0, 1)) can exhaust its
    `limit`; `quad` is how the value itself was computed, so the gradient then
    converges where the value did (for an integrand no worse than its derivative).
    """
    kw = {k: v for k, v in options if k in ("epsabs", "epsrel", "limit")}
    res = scipy.integrate.quad_vec(q.df, a, b, full_output=True, **kw)
    if res[2].success:
        return f64(res[0])
    return np.array([
        _quad_run(lambda x, j=j: q.df(x)[j], a, b, options, on_failure,
                  f" of the parameter gradient (component {j}; quad_vec: {res[2].message})")[0]
        for j in range(np.size(res[0]))])


@_quad.defjvp
def _quad_jvp(primals: tuple, out: Any, tangents: Any, *, fun: Any, options: tuple,
              on_failure: str) -> Any:
    a, b, params, fixed = primals
    da, db, dparams, _ = tangents
    nan = np.asarray(np.nan, out[0].dtype)
    if not np.isfinite(out[0]):
        return nan, nan
    with on_cpu():
        q = _Integrand(fun, a.dtype, params, fixed)
        total = 0.0
        if da is not None:
            total -= float(da) * _f_at(q, a)
        if db is not None:
            total += float(db) * _f_at(q, b)
        if dparams is not None:
            dp = fill_zeros(dparams, params)
            total += _quad_run(lambda x: q.jvp(x, dp), float(a), float(b), options,
                               on_failure, " of the tangent")[0]
    # abserr has no derivative: NaN (never a silent zero)
    return np.asarray(total, out[0].dtype), nan


def quad(func: Callable[..., Any], a: Any, b: Any, args: Any = (), full_output: int = 0,
         epsabs: float = 1.49e-8, epsrel: float = 1.49e-8, limit: int = 50,
         points: Any = None, weight: Any = None, wvar: Any = None, wopts: Any = None,
         maxp1: int = 50, limlst: int = 50, complex_func: bool = False, *,
         on_failure: str = "raise") -> tuple[jax.Array, jax.Array]:
    """`scipy.integrate.quad`: `(y, abserr)` of `int_a^b func(x, *args) dx`; differentiable.

    Same signature and `args` convention as SciPy (`func(x, *args)`, written in JAX,
    returning a scalar; it may close over traced values; a non-tuple `args` is one
    argument, as in SciPy). Gradients of `y`: w.r.t.
    `args` and closed-over arrays, the integral of the gradient (SciPy's `quad_vec`
    over JAX's `grad`, or `quad` per parameter where `quad_vec`, which has no
    extrapolation, does not converge: endpoint singularities); w.r.t. the limits, the
    Leibniz rule (`dy/db = func(b)`, `dy/da = -func(a)`; zero for infinite limits).
    Forward mode likewise. `abserr` has no derivative: its gradient is NaN, never a
    silent zero.

    `points` (static) is passed to SciPy. Not supported, with the reason in the
    error: `full_output` (a host-side dict), `weight`/`wvar`/`wopts` and
    `complex_func`. `on_failure` as in :func:`solve_ivp` (SciPy's `ier != 0`, e.g.
    "the maximum number of subdivisions has been achieved", is a failure).

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from jaxbridge.scipy.integrate import quad
      >>> y, err = quad(lambda x, c: jnp.exp(-c * x), 0.0, 1.0, args=(2.0,))
      >>> print(f"{float(y):.6f}")
      0.432332
      >>> g = jax.grad(lambda c: quad(lambda x: jnp.exp(-c * x), 0.0, 1.0)[0])
      >>> print(f"{float(g(2.0)):.6f}")
      -0.148499
    """
    name = "integrate.quad"
    check_policy(on_failure, name)
    if full_output:
        raise unsupported(name, "full_output", "SciPy's infodict is a host-side dict of "
                          "variable size; the error estimate is returned as abserr")
    for arg, value in (("weight", weight), ("wvar", wvar), ("wopts", wopts)):
        if value is not None:
            raise unsupported(name, arg, "weighted integrals (QAWO/QAWF/QAWS/QAWC) have no "
                              "derivative rule here; write the weight into func")
    if complex_func:
        raise unsupported(name, "complex_func", "only real integrands are differentiable here")
    call = "func(x, *args)"
    args = check_args(args, name, call, "wrap")
    dtype = jnp.result_type(jnp.asarray(a).dtype, jnp.asarray(b).dtype, float)
    a, b = jnp.asarray(a, dtype), jnp.asarray(b, dtype)
    f_hf, ops = convert(func, name, "func", (jax.ShapeDtypeStruct((), dtype),), args, call)
    _check_out(f_hf, a, name, "func", ())
    params, fixed = f_hf.split(ops)
    options: dict[str, float | tuple[float, ...]] = {
        "epsabs": float(epsabs), "epsrel": float(epsrel), "limit": int(limit),
        "maxp1": int(maxp1), "limlst": int(limlst)}
    if points is not None:
        options["points"] = tuple(float(p) for p in np.ravel(points))
    y, err = _quad(a, b, params, fixed, fun=f_hf, options=static_options(options, name),
                   on_failure=on_failure)
    return y, err


# issue 26: dense output (sol.sol) and solve_bvp live in their own modules
from ._bvp import solve_bvp  # noqa: E402
from ._dense import OdeSolution  # noqa: E402
