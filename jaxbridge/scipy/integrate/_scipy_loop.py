"""SciPy's own step loop on the host for `solve_ivp` (`stepping="scipy"`, and the
forward solve of the implicit methods): the host calls and their derivative rules.

`scipy_solve` is `y(t_eval)` from `scipy.integrate.solve_ivp`; its reverse mode is
forward sensitivities (the whole Jacobian, contracted) or the continuous adjoint with
checkpoints at the evaluation times, its forward mode the sensitivity equations (see
the package docstring). `recorded_solve` also returns SciPy's accepted steps, what
`_stiff`'s compiled derivatives run on.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import scipy.integrate
import scipy.sparse
from jax.flatten_util import ravel_pytree

from ... import _foreign
from .._common import (
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
)
from .._trace import HostFun
from ._ode import IMPLICIT_METHODS, ode_functions
from ._options import IvpConfig

__all__ = ["scipy_solve", "recorded_solve", "fail"]

_SPARSE_ADJOINT_JAC = 64  # parameter count above which the adjoint Jacobian is sparse


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

    def solve(self, role: str, span: tuple[float, float], z0: np.ndarray, t_eval: np.ndarray,
              cfg: IvpConfig, tol: tuple[float, Any], extra: tuple = (), jac: Any = None
              ) -> Any:
        """`scipy.integrate.solve_ivp` of `z' = role(t, z, params, *extra)` on `span` with
        `cfg`'s method and options and `tol = (rtol, atol)` (SciPy's loop; the compiled
        loop does not come here: see `_compiled`); `jac` a function of (t, z) or, for
        the state's own solve, `cfg.state_jac_kw`'s dict."""
        kw = {}
        if isinstance(jac, dict):
            kw = jac
        elif jac is not None and cfg.method in IMPLICIT_METHODS:
            kw["jac"] = jac
        return scipy.integrate.solve_ivp(
            lambda t, z: f64(self(role, t, z, self.params, *extra)), span, z0,
            method=cfg.method, t_eval=t_eval, rtol=tol[0], atol=tol[1], **kw,
            **dict(cfg.options))

    def sensitivities(self, cfg: IvpConfig, span: tuple[float, float], y0: Any, t_eval: Any,
                      S0: Any, dp: Any, sens_tol: tuple[float, float]) -> Any:
        """`S(t_i)` (T, n, K) of `S' = f_y S + f_p dp`, `S(t0) = S0` (n, K); dp (P, K), solved
        with `y` at `cfg`'s tolerances and `S` at `sens_tol = (rtol, atol)`.

        Returns `(S, None)`, or `(None, SciPy's message)` when the solve fails.
        """
        (t0, _), (sens_rtol, sens_atol) = span, sens_tol
        n, K = S0.shape
        T = t_eval.shape[0]
        if np.all(t_eval == t0):
            return np.broadcast_to(S0, (T, n, K)).copy(), None
        dp = jax.device_put(np.asarray(dp, np.float64).reshape(self.P, K))
        params = self.params
        sens_jac = None
        if cfg.method in IMPLICIT_METHODS and cfg.jac is not False:
            sens_jac = lambda t, z: f64(self("sens_jac", t, z, params, dp))  # noqa: E731
        tol = (min(cfg.min_rtol, sens_rtol),
               np.concatenate([cfg.state_atol(n), np.full(n * K, sens_atol)]))
        sol = self.solve("sens", span, np.concatenate([y0, np.ravel(S0)]), t_eval, cfg, tol,
                         extra=(dp,), jac=sens_jac)
        if sol.status != 0:
            return None, sol.message
        return sol.y[n:].T.reshape(T, n, K), None


def _ivp_result(t0: Any, t1: Any, y0: Any, t_eval: Any, params: Any, fixed: Any, jac_ops: Any,
                **_: Any) -> Any:
    return (jax.ShapeDtypeStruct((t_eval.shape[0], *y0.shape), y0.dtype),
            jax.ShapeDtypeStruct((5,), jnp.int32))  # status, nfev, njev, nlu, accepted steps


def fail(name: str, method: str, message: str, on_failure: str) -> Any:
    """Raise SciPy's `message` as a SolverError under on_failure="raise"; else nothing."""
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
        fail("integrate.solve_ivp", method, sol.message, on_failure)
        return True
    if not np.all(np.isfinite(ys)):
        fail("integrate.solve_ivp", method, "the solution is not finite", on_failure)
        stats[0] = -1
        return True
    return False


def _ode(primals: tuple, fun: Any, jac: Any) -> Any:
    t0, t1, y0, t_eval, params, fixed, jac_ops = primals
    return _Ode(fun, jac, y0.shape, y0.dtype, np.asarray(t_eval).dtype, params, fixed,
                jac_ops)


@_foreign.foreign(_ivp_result)
def scipy_solve(t0: Any, t1: Any, y0: Any, t_eval: Any, params: Any, fixed: Any, jac_ops: Any, *,
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
        sol = ode.solve("f", (t0, t1), np.ravel(f64(y0)), t_eval, cfg,
                        (cfg.scipy_tols["rtol"], cfg.scipy_tols["atol"]),
                        jac=cfg.state_jac_kw(ode.jac))
    stats = np.array([sol.status, sol.nfev, sol.njev, sol.nlu, getattr(sol, "steps", -1)],
                     np.int32)
    if _solve_failed(sol, sol.y, stats, method, on_failure):
        return np.full((T, *y0.shape), np.nan, y0.dtype), stats
    return sol.y.T.reshape(T, *y0.shape).astype(y0.dtype), stats


def _recorded_result(t0: Any, t1: Any, y0: Any, t_eval: Any, params: Any, fixed: Any,
                     jac_ops: Any, *, cfg: IvpConfig) -> Any:
    f64_, capacity = jnp.result_type(float), cfg.capacity
    return (*_ivp_result(t0, t1, y0, t_eval, params, fixed, jac_ops),
            jax.ShapeDtypeStruct((capacity + 1,), f64_),
            jax.ShapeDtypeStruct((capacity + 1, y0.size), f64_))


@_foreign.foreign(_recorded_result)
def recorded_solve(t0: Any, t1: Any, y0: Any, t_eval: Any, params: Any, fixed: Any,
                   jac_ops: Any, *, cfg: IvpConfig) -> Any:
    """The forward solve, plus SciPy's accepted steps: `(ys, stats, grid_t (M+1,),
    grid_y (M+1, n))` with M = capacity (padded with the last step; stats[4] is the
    number of accepted steps). What `_stiff`'s compiled derivatives run on."""
    method, on_failure, capacity = cfg.method, cfg.on_failure, cfg.capacity
    t0, t1, t_eval = float(t0), float(t1), f64(t_eval)
    T, n = t_eval.shape[0], int(np.size(y0))
    grid_t, grid_y = np.full(capacity + 1, t0), np.zeros((capacity + 1, n))
    grid_y[:] = np.ravel(f64(y0))
    nan = np.full((T, *y0.shape), np.nan, y0.dtype)
    if (still := _at_t0(y0, t_eval, t0)) is not None:
        return still, np.zeros(5, np.int32), grid_t, grid_y
    with on_cpu():
        ode = _ode((t0, t1, y0, t_eval, params, fixed, jac_ops), cfg.fun, cfg.jac)
        kw = cfg.state_jac_kw(ode.jac)
        sol = scipy.integrate.solve_ivp(ode.f, (t0, t1), np.ravel(f64(y0)), method=method,
                                        dense_output=True, **cfg.scipy_tols, **kw,
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


@scipy_solve.defvjp
def _ivp_vjp(primals: tuple, out: Any, ct: Any, *, cfg: IvpConfig) -> Any:
    """Reverse mode: forward sensitivities (the whole Jacobian, contracted) or the
    continuous adjoint with checkpoints at the evaluation times (see the package
    docstring)."""
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
        ode = _ode(primals, cfg.fun, cfg.jac)
        n, P = ode.n, ode.P
        Y = f64(ys).reshape(T, n)
        G = f64(ct).reshape(T, n)
        t_bar = np.array([G[i] @ ode.f(t_eval[i], Y[i]) for i in range(T)])
        if cfg.sensitivity == "forward":
            # The whole Jacobian d y(t_i) / d(y0, params) in one solve, then contracted.
            eye = np.eye(n + P)
            S, message = ode.sensitivities(cfg, (t0, t1), np.ravel(f64(y0)), t_eval, eye[:n],
                                           eye[n:], (cfg.adjoint_rtol, cfg.adjoint_atol))
            if S is None:
                fail("integrate.solve_ivp", cfg.method, f"sensitivity solve: {message}",
                     cfg.on_failure)
                return _ivp_vjp_nan(primals)
            g = np.einsum("ti,tik->k", G, S)
            return _ivp_cotangents(primals, ode, g[:n], t_bar, g[n:])
        starts = [(t0, np.ravel(f64(y0)))] + [(t_eval[i], Y[i]) for i in range(T - 1)]
        adjoint = _continuous_adjoint(ode, cfg, starts, t_eval, G)
        if adjoint is None:
            return _ivp_vjp_nan(primals)
        a, mu = adjoint
        return _ivp_cotangents(primals, ode, a, t_bar, mu)


def _continuous_adjoint(ode: _Ode, cfg: IvpConfig, starts: list, t_eval: np.ndarray,
                        G: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """(dL/dy0, dL/dparams) by the continuous adjoint, interval by interval, last
    first: `y` re-solved forward from each checkpoint `starts[i]` with dense output,
    the adjoint solved backward against it; None when a solve failed ("nan" policy)."""
    n, P, method, options = ode.n, ode.P, cfg.method, dict(cfg.options)
    a, mu = np.zeros(n), np.zeros(P)
    # The parameter-gradient quadrature mu is left out of the step-size control
    # (as CVODES does by default): it is a pure quadrature of a and y, so the steps
    # that resolve them integrate it to the same order, and controlling it too makes
    # BDF stall on stiff problems whose adjoint has a fast initial transient.
    adj_atol = np.concatenate([np.full(n, cfg.adjoint_atol), np.full(P, 1e100)])
    for i in range(t_eval.shape[0] - 1, -1, -1):
        t_i = t_eval[i]
        a = a + G[i]
        t_prev, y_prev = starts[i]
        if t_prev == t_i:
            continue
        fwd = scipy.integrate.solve_ivp(
            ode.f, (t_prev, t_i), y_prev, method=method, dense_output=True,
            **cfg.scipy_tols, **cfg.state_jac_kw(ode.jac), **options)
        if fwd.status != 0:
            fail("integrate.solve_ivp", method,
                 f"re-solving the forward problem for the adjoint: {fwd.message}",
                 cfg.on_failure)
            return None
        y_of = fwd.sol

        def rhs(t: Any, z: Any, y_of: Any = y_of) -> Any:
            return f64(ode("adj", t, y_of(t), z[:n], ode.params))

        kw = {}
        if method in IMPLICIT_METHODS and cfg.jac is not False:
            kw["jac"] = _adjoint_jacobian(ode, y_of, method)
        back = scipy.integrate.solve_ivp(
            rhs, (t_i, t_prev), np.concatenate([a, mu]), method=method,
            rtol=cfg.adjoint_rtol, atol=adj_atol, **kw, **options)
        if back.status != 0:
            fail("integrate.solve_ivp", method, f"adjoint solve: {back.message}",
                 cfg.on_failure)
            return None
        a, mu = back.y[:n, -1], back.y[n:, -1]
    return a, mu


def _adjoint_jacobian(ode: _Ode, y_of: Any, method: str) -> Any:
    """The adjoint system's exact Jacobian (from JAX) along the interpolant `y_of`,
    sparse when there are many parameters (LSODA takes dense matrices only)."""
    n, P = ode.n, ode.P

    def adj_jac(t: Any, z: Any) -> Any:
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
    return adj_jac


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


@scipy_solve.defjvp
def _ivp_jvp(primals: tuple, out: Any, tangents: Any, *, cfg: IvpConfig) -> Any:
    """Forward sensitivities: (y, s)' = (f, df/dy s + df/dp dp), s(t0) = dy0 - f dt0."""
    fun, jac, method, on_failure = cfg.fun, cfg.jac, cfg.method, cfg.on_failure
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
            cfg, (t0, t1), y0f, t_eval, s0[:, None],
            np_ravel(fill_zeros(dparams, params))[:, None], (cfg.min_rtol, cfg.min_atol))
        if S is None:
            fail("integrate.solve_ivp", method, f"sensitivity solve: {message}", on_failure)
            return np.full(np.shape(ys), np.nan, ys.dtype), None
        S = S[..., 0]
        if dt_eval is not None:
            S = S + np.stack([ode.f(t, y) for t, y in zip(t_eval, Y)]) * f64(dt_eval)[:, None]
    return S.reshape(ys.shape).astype(ys.dtype), None

