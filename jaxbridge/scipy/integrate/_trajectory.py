"""SciPy's `solve_ivp` with events, dense output or its own step times, as one host call.

**Forward.** SciPy's own `solve_ivp` runs on the host with the same method, events
(located by SciPy, with SciPy's `terminal` and `direction`) and dense output. JAX
needs static shapes, so the variable-length results are padded: each event
function's times and states to `max_events` (NaN past the last event, with the true
count in `n_events`, which may exceed `max_events`: the extra events are counted,
not stored), SciPy's step times (`t_eval=None`) and dense-output segments to
`max_steps` (more steps raise, naming `max_steps`).

**Derivatives.** The host call returns the states at every time the outputs need --
the `t_eval` times, the event times `t*` (held fixed) and the step times (for
`t_eval=None` and the dense output) -- and its tangent and adjoint rules get their
derivatives from forward sensitivities `S = dy/d(y0, params)`, solved by SciPy
(same method) at exactly those times in one augmented solve (one direction for
`jvp`, all `n + P` for `grad`). The event times' own derivatives (`_events`) and the
dense output's (`_dense`) are JAX on top of it.

So every method, `jit`, `grad`, `jvp` and `vmap` work. The gradient always uses
forward sensitivities (an augmented system of size `n (1 + n + P)`), which is cheap
for the few-parameter problems events are used for, and grows with `P`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import scipy.integrate

from ... import _foreign
from .._common import (
    const,
    f64,
    failure,
    fill_zeros,
    host_copies,
    host_float,
    host_jit,
    np_ravel,
    np_unravel,
    on_cpu,
)
from .._trace import HostFun
from . import _dense
from ._ode import IMPLICIT_METHODS, ode_functions
from ._options import IvpConfig

__all__ = ["trajectory"]

NAME = "integrate.solve_ivp"


class _Host:
    """Host-side NumPy callables of one problem (right-hand side, Jacobian, events,
    sensitivity system), backed by JAX compiled once per converted function."""

    def __init__(self, cfg: IvpConfig, primals: tuple) -> None:
        t0, _, y0, _, params, fixed, (jac_ops, ev_ops) = primals
        fun, jac, shape, ydtype, tdtype = cfg.fun, cfg.jac, y0.shape, y0.dtype, \
            np.asarray(t0).dtype
        self.cfg = cfg
        self.shape, self.n = tuple(shape), int(np.prod(shape, dtype=int))
        self.params, self.fixed, self.jac_ops, self.ev_ops = host_copies(
            (params, fixed, jac_ops, ev_ops))
        self.P = np_ravel(params).size
        key = ("events", fun, jac, self.shape, np.dtype(ydtype), np.dtype(tdtype))
        roles = ode_functions(fun, jac, shape, ydtype, tdtype)
        self._j = {r: host_jit(key + (r,), const(g)) for r, g in roles.items()}
        self._ev = []
        for hf in cfg.events:
            def ev(ops: Any, t: Any, y: Any, hf: HostFun = hf) -> Any:
                return jnp.asarray(hf(ops, t.astype(tdtype), y.reshape(shape).astype(ydtype)))
            self._ev.append(host_jit(key + ("event", hf), const(ev)))

    def f(self, t: float, y: np.ndarray) -> np.ndarray:
        return f64(self._j["f"](self.fixed, t, y, self.params))

    def jac(self, t: float, y: np.ndarray) -> np.ndarray:
        return f64(self._j["jac"](self.fixed, self.jac_ops, t, y, self.params))

    def event(self, i: int, terminal: Any, direction: float) -> Callable[..., float]:
        fn, ops = self._ev[i], self.ev_ops[i]

        def g(t: float, y: np.ndarray) -> float:
            return host_float(fn(ops, t, y))
        g.terminal, g.direction = terminal, direction  # type: ignore[attr-defined]
        return g

    def sensitivities(self, t0: float, y0: np.ndarray, times: np.ndarray, S0: np.ndarray,
                      dp: np.ndarray) -> np.ndarray:
        """`S(t)` (len(times), n, K) of `S' = f_y S + f_p dp`, `S(t0) = S0`, at `times`
        (sorted in the direction of integration, distinct)."""
        n, K = S0.shape
        if times.size == 0 or np.all(times == t0):
            return np.broadcast_to(S0, (times.size, n, K)).copy()
        dpj = jax.device_put(np.asarray(dp, np.float64).reshape(self.P, K))
        fx, params, j, cfg = self.fixed, self.params, self._j, self.cfg
        kw = {}
        if cfg.method in IMPLICIT_METHODS:
            kw["jac"] = lambda t, z: f64(j["sens_jac"](fx, t, z, params, dpj))
        atol = np.concatenate([cfg.state_atol(n), np.full(n * K, cfg.adjoint_atol)])
        sol = scipy.integrate.solve_ivp(
            lambda t, z: f64(j["sens"](fx, t, z, params, dpj)), (t0, times[-1]),
            np.concatenate([y0, np.ravel(S0)]), method=cfg.method, t_eval=times,
            rtol=min(cfg.min_rtol, cfg.adjoint_rtol), atol=atol, **kw, **dict(cfg.options))
        if sol.status != 0:
            raise failure(NAME, f"solve_ivp(method={cfg.method!r}) sensitivity solve: "
                                f"{sol.message}")
        return sol.y[n:].T.reshape(times.size, n, K)


def _result(t0: Any, t1: Any, y0: Any, t_eval: Any, params: Any, fixed: Any, side_ops: Any,
            *, cfg: IvpConfig) -> Any:
    E, M, S = len(cfg.events), cfg.max_events, cfg.max_steps
    nodes = S + 1 if cfg.nodes else 0
    segs = S if cfg.dense else 0
    rows = _dense.n_coefficients(cfg.method)
    tdt, ydt = t0.dtype, y0.dtype
    shape = tuple(y0.shape)
    return {
        "ys": jax.ShapeDtypeStruct((t_eval.shape[0], *shape), ydt),
        "t_ev": jax.ShapeDtypeStruct((E, M), tdt),
        "y_ev": jax.ShapeDtypeStruct((E, M, *shape), ydt),
        "n_ev": jax.ShapeDtypeStruct((E,), jnp.int32),
        "nodes_t": jax.ShapeDtypeStruct((nodes,), tdt),
        "nodes_y": jax.ShapeDtypeStruct((nodes, *shape), ydt),
        "seg": jax.ShapeDtypeStruct((segs, 2), tdt),                  # t_ref, h
        "y_old": jax.ShapeDtypeStruct((segs, y0.size), ydt),
        "C": jax.ShapeDtypeStruct((segs, rows, y0.size), ydt),
        # status, nfev, njev, nlu, n_points, n_nodes, terminating event (-1: none)
        "stats": jax.ShapeDtypeStruct((7,), jnp.int32),
    }


def _fill_rows(dest: np.ndarray, a: np.ndarray, what: str) -> None:
    """Write `a`'s rows into `dest`, then repeat its last row to the end (finite, so
    derivatives of padded entries never produce NaN), in place: the padded arrays are
    `max_steps` long, and building them anew cost a repeat call ~0.3 ms."""
    size, m = dest.shape[0], a.shape[0]
    if m > size:
        raise ValueError(f"jaxbridge.scipy.{NAME}: SciPy took {m - 1} steps, more "
                         f"than max_steps={size - 1} ({what}); pass a larger max_steps=")
    if m == 0:
        dest[:] = 0
        return
    dest[:m] = a
    dest[m:] = a[-1]


@_foreign.foreign(_result)
def trajectory(t0: Any, t1: Any, y0: Any, t_eval: Any, params: Any, fixed: Any, side_ops: Any,
               *, cfg: IvpConfig) -> Any:
    """SciPy's solve with events / dense output; every array padded (see `_result`)."""
    out = jax.tree_util.tree_map(lambda a: np.full(a.shape, np.nan, a.dtype)
                                 if np.issubdtype(a.dtype, np.floating)
                                 else np.zeros(a.shape, a.dtype),
                                 _result(t0, t1, y0, t_eval, params, fixed, side_ops,
                                         cfg=cfg))
    n, shape, E, M = y0.size, y0.shape, len(cfg.events), cfg.max_events
    with on_cpu():
        host = _Host(cfg, (t0, t1, y0, t_eval, params, fixed, side_ops))
        evs = [host.event(i, term, d) for i, (term, d) in
               enumerate(zip(cfg.terminal, cfg.direction))]
        kw = cfg.state_jac_kw(host.jac)
        sol = scipy.integrate.solve_ivp(
            host.f, (float(t0), float(t1)), np.ravel(f64(y0)), method=cfg.method,
            t_eval=None if cfg.steps else f64(t_eval), dense_output=cfg.dense,
            events=evs or None, **cfg.scipy_tols, **kw, **dict(cfg.options))
    stats = out["stats"]
    stats[:4] = sol.status, sol.nfev, sol.njev, sol.nlu
    stats[6] = -1
    if sol.status == -1:
        if cfg.on_failure == "raise":
            raise failure(NAME, f"solve_ivp(method={cfg.method!r}): {sol.message}")
        return out
    m = len(sol.t)
    stats[4] = m
    if not cfg.steps and m:
        out["ys"][:m] = np.asarray(sol.y).T.reshape(m, *shape)
    for i in range(E):
        te = np.asarray(sol.t_events[i])
        ye = np.asarray(sol.y_events[i]).reshape(te.size, n)  # (n may be 0)
        k = min(te.size, M)
        out["n_ev"][i] = te.size
        out["t_ev"][i, :k] = te[:k]
        out["y_ev"][i, :k] = ye[:k].reshape(k, *shape)
    if sol.status == 1:  # which event stopped it: a terminal one at its count, latest root
        sign = 1.0 if float(t1) >= float(t0) else -1.0
        done = [i for i in range(E) if cfg.terminal[i]
                and len(sol.t_events[i]) >= cfg.terminal[i]]
        stats[6] = max(done, key=lambda i: sign * sol.t_events[i][-1]) if done else -1
    if cfg.nodes:
        if cfg.steps:
            ts, ys = np.asarray(sol.t), sol.y.T
        else:
            ts = np.asarray(sol.sol.ts)
            ys = np.stack([sol.sol(t) for t in ts])
        stats[5] = ts.size
        _fill_rows(out["nodes_t"], ts, "t_eval=None or dense_output")
        _fill_rows(out["nodes_y"], np.reshape(ys, (ts.size, *shape)), "")  # (n may be 0)
    if cfg.dense:
        rows = [_dense.coefficients(cfg.method, it, n) for it in sol.sol.interpolants]
        _fill_rows(out["seg"], np.array([(r[0], r[1]) for r in rows]), "dense_output")
        _fill_rows(out["y_old"], np.stack([r[2] for r in rows]), "")
        _fill_rows(out["C"], np.stack([r[3] for r in rows]), "")
    return out


def _points(out: dict, steps: bool) -> tuple[list, list]:
    """(times, (output, index)) of every valid differentiable output entry."""
    stats = out["stats"]
    m, n_nodes = int(stats[4]), int(stats[5])
    times: list[float] = []
    where: list[tuple[str, tuple[int, ...]]] = []
    if not steps:
        for i in range(m):
            times.append(float(out["t_eval_"][i]))
            where.append(("ys", (i,)))
    for e in range(out["t_ev"].shape[0]):
        for j in range(min(int(out["n_ev"][e]), out["t_ev"].shape[1])):
            times.append(float(out["t_ev"][e, j]))
            where.append(("y_ev", (e, j)))
    for k in range(n_nodes if out["nodes_y"].shape[0] else 0):
        times.append(float(out["nodes_t"][k]))
        where.append(("nodes_y", (k,)))
    return times, where


def _sens_at(primals: tuple, out: dict, S0: np.ndarray, dp: np.ndarray, cfg: IvpConfig
             ) -> tuple[_Host, list, np.ndarray]:
    """The sensitivities at every valid output entry: (host, where, S (N, n, K))."""
    t0, t1, y0, t_eval, *_ = primals
    out = dict(out, t_eval_=f64(t_eval))
    times, where = _points(out, cfg.steps)
    host = _Host(cfg, primals)
    t = np.asarray(times, np.float64)
    sign = 1.0 if float(t1) >= float(t0) else -1.0
    uniq, inverse = np.unique(sign * t, return_inverse=True)
    S = host.sensitivities(float(t0), np.ravel(f64(y0)), sign * uniq, S0, dp)
    return host, where, S[np.ravel(inverse)] if len(times) else S


@trajectory.defjvp
def _trajectory_jvp(primals: tuple, out: dict, tangents: tuple, *, cfg: IvpConfig) -> Any:
    t0, t1, y0, t_eval, params, *_ = primals
    dt0, _, dy0, dt_eval, dparams, *_ = tangents
    tan: dict[str, Any] = {k: None for k in out}
    if int(out["stats"][0]) == -1:  # a failed solve ("nan" policy): NaN, as reverse mode
        for key in ("ys", "y_ev", "nodes_y"):
            tan[key] = np.full(out[key].shape, np.nan, out[key].dtype)
        return tan
    with on_cpu():
        host = _Host(cfg, primals)
        y0f = np.ravel(f64(y0))
        s0 = np.zeros(host.n) if dy0 is None else np.ravel(f64(dy0))
        if dt0 is not None:
            s0 = s0 - host.f(float(t0), y0f) * float(dt0)
        dp = np_ravel(fill_zeros(dparams, params))
        host, where, S = _sens_at(primals, out, s0[:, None], dp[:, None], cfg)
        for key in ("ys", "y_ev", "nodes_y"):
            tan[key] = np.zeros(out[key].shape, out[key].dtype)
        for (key, idx), Si in zip(where, S):
            tan[key][idx] = Si[:, 0].reshape(y0.shape)
        if dt_eval is not None and not cfg.steps:
            te = f64(t_eval)
            for i in range(int(out["stats"][4])):
                f = host.f(te[i], np.ravel(f64(out["ys"][i])))
                tan["ys"][i] += (f * float(dt_eval[i])).reshape(y0.shape)
    return tan


@trajectory.defvjp
def _trajectory_vjp(primals: tuple, out: dict, ct: dict, *, cfg: IvpConfig) -> Any:
    t0, t1, y0, t_eval, params, fixed, side_ops = primals
    zeros = (np.zeros((), np.asarray(t0).dtype), None, np.zeros(y0.shape, y0.dtype),
             np.zeros(t_eval.shape, t_eval.dtype), np_unravel(np.zeros(np_ravel(params).size),
                                                              params), None, None)
    if int(out["stats"][0]) == -1:
        return tuple(None if z is None else jax.tree_util.tree_map(
            lambda a: np.full_like(a, np.nan), z) for z in zeros)
    with on_cpu():
        host = _Host(cfg, primals)
        n, P = host.n, host.P
        eye = np.eye(n + P)
        host, where, S = _sens_at(primals, out, eye[:n], eye[n:], cfg)
        g = np.zeros(n + P)
        for (key, idx), Si in zip(where, S):
            c = ct[key]
            if c is not None:
                g += np.ravel(f64(c[idx])) @ Si
        a, mu = g[:n], g[n:]
        t0_bar = -(a @ host.f(float(t0), np.ravel(f64(y0))))
        te_bar = np.zeros(t_eval.shape)
        if ct["ys"] is not None and not cfg.steps:
            te = f64(t_eval)
            for i in range(int(out["stats"][4])):
                te_bar[i] = np.ravel(f64(ct["ys"][i])) @ host.f(te[i],
                                                                np.ravel(f64(out["ys"][i])))
    return (np.asarray(t0_bar, np.asarray(t0).dtype), None, a.reshape(y0.shape).astype(y0.dtype),
            te_bar.astype(t_eval.dtype), np_unravel(mu, params), None, None)

