"""`solve_ivp` with `events`, `dense_output=True` or `t_eval=None`, differentiable.

**Forward.** SciPy's own `solve_ivp` runs on the host with the same method, events
(located by SciPy, with SciPy's `terminal` and `direction`) and dense output. JAX
needs static shapes, so the variable-length results are padded: each event
function's times and states to `max_events` (NaN past the last event, with the true
count in `n_events`, which may exceed `max_events`: the extra events are counted,
not stored), SciPy's step times (`t_eval=None`) and dense-output segments to
`max_steps` (more steps raise, naming `max_steps`).

**Derivatives.** One host call returns the states at every time the outputs need --
the `t_eval` times, the event times `t*` (held fixed) and the step times (for
`t_eval=None` and the dense output) -- and its tangent and adjoint rules get their
derivatives from forward sensitivities `S = dy/d(y0, params)`, solved by SciPy
(same method) at exactly those times in one augmented solve (one direction for
`jvp`, all `n + P` for `grad`). Everything else is JAX on top of it:

* the event times by the implicit function theorem, with `g(t*, y(t*), θ) = 0`:
  `dt* = -(g_y dy(t*) + g_θ dθ) / (g_t + g_y f)`, written as
  `t* + (g - stop_gradient(g)) / -stop_gradient(dg/dt)` so the value is SciPy's and the
  derivative flows through `g` (the user's event function, evaluated in JAX, so its
  own closed-over parameters are differentiated too); the event states add `f dt*`;
* the dense output (see `_dense`).

So every method, `jit`, `grad`, `jvp` and `vmap` work. The gradient always uses
forward sensitivities (an augmented system of size `n (1 + n + P)`), which is cheap
for the few-parameter problems events are used for, and grows with `P`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
import scipy.integrate

from .. import _foreign
from . import _dense
from ._common import (
    as_float_array,
    check_policy,
    const,
    f64,
    failure,
    fill_zeros,
    host_copies,
    host_jit,
    np_ravel,
    np_unravel,
    on_cpu,
    static_options,
    unsupported,
)
from ._ivp_common import IMPLICIT_METHODS, METHODS, OdeResult, ode_functions
from ._linear import linear_with_transpose
from ._trace import HostFun, array_aval, check_args, convert

__all__ = ["OdeEventResult", "solve_ivp", "MAX_EVENTS", "MAX_STEPS"]

MAX_EVENTS = 16   # default slots per event function
MAX_STEPS = 4096  # default slots for SciPy's steps (t_eval=None, dense_output)
NAME = "integrate.solve_ivp"
sg = jax.lax.stop_gradient


class OdeEventResult(OdeResult):
    """:class:`OdeResult` of a solve with events, dense output or `t_eval=None`.

    SciPy's fields, with static shapes: `t` (= t_eval, or SciPy's step times padded
    with `inf` to `max_steps + 1`), `y` (`y0.shape + (len(t),)`; NaN at t_eval times
    after a terminal event, `inf` past the last step), `t_events` (a list, one array
    of length `max_events` per event function, NaN past the last stored event),
    `y_events` (likewise, `(max_events,) + y0.shape`), `sol` (an
    :class:`OdeSolution`, a JAX function, with dense_output=True), `status` (0, 1: a
    terminal event, -1), plus the counts `n_events` (int array, one per event
    function: all events SciPy found, which may exceed `max_events`) and `n_points`
    (valid entries of `t`, SciPy's `len(sol.t)`).
    """

    # (OdeResult's _fields is inferred as a fixed-length tuple; this one is longer)
    _fields = OdeResult._fields + ("n_events", "n_points")  # type: ignore[assignment]
    _messages: ClassVar[dict[int, str]] = {
        **OdeResult._messages, 1: "A termination event occurred."}


# ------------------------------------------------------------------ host side
class _Host:
    """Host-side NumPy callables of one problem (right-hand side, Jacobian, events,
    sensitivity system), backed by JAX compiled once per converted function."""

    def __init__(self, fun: HostFun, jac: Any, events: tuple, shape: tuple, ydtype: Any,
                 tdtype: Any, params: tuple, fixed: tuple, jac_ops: tuple, ev_ops: tuple
                 ) -> None:
        self.shape, self.n = tuple(shape), int(np.prod(shape, dtype=int))
        self.params, self.fixed, self.jac_ops, self.ev_ops = host_copies(
            (params, fixed, jac_ops, ev_ops))
        self.P = np_ravel(params).size
        key = ("events", fun, jac, self.shape, np.dtype(ydtype), np.dtype(tdtype))
        roles = ode_functions(fun, jac, shape, ydtype, tdtype)
        self._j = {r: host_jit(key + (r,), const(g)) for r, g in roles.items()}
        self._ev = []
        for hf in events:
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
            return float(fn(ops, t, y))
        g.terminal, g.direction = terminal, direction  # type: ignore[attr-defined]
        return g

    def sensitivities(self, t0: float, y0: np.ndarray, times: np.ndarray, S0: np.ndarray,
                      dp: np.ndarray, st: dict) -> np.ndarray:
        """`S(t)` (len(times), n, K) of `S' = f_y S + f_p dp`, `S(t0) = S0`, at `times`
        (sorted in the direction of integration, distinct)."""
        n, K = S0.shape
        if times.size == 0 or np.all(times == t0):
            return np.broadcast_to(S0, (times.size, n, K)).copy()
        dpj = jax.device_put(np.asarray(dp, np.float64).reshape(self.P, K))
        fx, params, j = self.fixed, self.params, self._j
        kw = {}
        if st["method"] in IMPLICIT_METHODS:
            kw["jac"] = lambda t, z: f64(j["sens_jac"](fx, t, z, params, dpj))
        atol = np.concatenate([np.full(n, st["atol"]), np.full(n * K, st["sens_atol"])])
        sol = scipy.integrate.solve_ivp(
            lambda t, z: f64(j["sens"](fx, t, z, params, dpj)), (t0, times[-1]),
            np.concatenate([y0, np.ravel(S0)]), method=st["method"], t_eval=times,
            rtol=min(st["rtol"], st["sens_rtol"]), atol=atol, **kw, **dict(st["options"]))
        if sol.status != 0:
            raise failure(NAME, f"solve_ivp(method={st['method']!r}) sensitivity solve: "
                                f"{sol.message}")
        return sol.y[n:].T.reshape(times.size, n, K)


def _host(primals: tuple, st: dict) -> _Host:
    t0, t1, y0, t_eval, params, fixed, jac_ops, ev_ops = primals
    return _Host(st["fun"], st["jac"], st["events"], y0.shape, y0.dtype,
                 np.asarray(t0).dtype, params, fixed, jac_ops, ev_ops)


def _result(t0: Any, t1: Any, y0: Any, t_eval: Any, params: Any, fixed: Any, jac_ops: Any,
            ev_ops: Any, *, st: Any) -> Any:
    s = st.value
    E, M, S = len(s["events"]), s["max_events"], s["max_steps"]
    nodes = S + 1 if s["nodes"] else 0
    segs = S if s["dense"] else 0
    rows = _dense.n_coefficients(s["method"])
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


class _Static:
    """The static options of one call, hashable by identity of their content."""

    def __init__(self, **kw: Any) -> None:
        self.value = kw
        self._key = tuple(sorted((k, v if not isinstance(v, np.ndarray) else v.tobytes())
                                 for k, v in kw.items()))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Static) and self._key == other._key

    def __hash__(self) -> int:
        return hash(self._key)


def _pad_rows(a: np.ndarray, size: int, what: str) -> np.ndarray:
    """`a` padded to `size` rows by repeating its last row (finite, so derivatives of
    padded entries never produce NaN)."""
    if a.shape[0] > size:
        raise ValueError(f"jaxbridge.scipy.{NAME}: SciPy took {a.shape[0] - 1} steps, more "
                         f"than max_steps={size - 1} ({what}); pass a larger max_steps=")
    if a.shape[0] == 0:
        return np.zeros((size, *a.shape[1:]), a.dtype)
    return np.concatenate([a, np.repeat(a[-1:], size - a.shape[0], axis=0)])


@_foreign.foreign(_result)
def _trajectory(t0: Any, t1: Any, y0: Any, t_eval: Any, params: Any, fixed: Any, jac_ops: Any,
                ev_ops: Any, *, st: Any) -> Any:
    """SciPy's solve with events / dense output; every array padded (see `_result`)."""
    s = st.value
    out = jax.tree_util.tree_map(lambda a: np.full(a.shape, np.nan, a.dtype)
                                 if np.issubdtype(a.dtype, np.floating)
                                 else np.zeros(a.shape, a.dtype),
                                 _result(t0, t1, y0, t_eval, params, fixed, jac_ops, ev_ops,
                                         st=st))
    n, shape, E, M = y0.size, y0.shape, len(s["events"]), s["max_events"]
    with on_cpu():
        host = _host((t0, t1, y0, t_eval, params, fixed, jac_ops, ev_ops), s)
        evs = [host.event(i, term, d) for i, (term, d) in
               enumerate(zip(s["terminal"], s["direction"]))]
        kw = {}
        if s["method"] in IMPLICIT_METHODS and s["jac"] is not False:
            kw["jac"] = host.jac
        sol = scipy.integrate.solve_ivp(
            host.f, (float(t0), float(t1)), np.ravel(f64(y0)), method=s["method"],
            t_eval=None if s["steps"] else f64(t_eval), dense_output=s["dense"],
            events=evs or None, rtol=s["rtol"], atol=s["atol"], **kw, **dict(s["options"]))
    stats = out["stats"]
    stats[:4] = sol.status, sol.nfev, sol.njev, sol.nlu
    stats[6] = -1
    if sol.status == -1:
        if s["on_failure"] == "raise":
            raise failure(NAME, f"solve_ivp(method={s['method']!r}): {sol.message}")
        return out
    m = len(sol.t)
    stats[4] = m
    if not s["steps"] and m:
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
        done = [i for i in range(E) if s["terminal"][i]
                and len(sol.t_events[i]) >= s["terminal"][i]]
        stats[6] = max(done, key=lambda i: sign * sol.t_events[i][-1]) if done else -1
    if s["nodes"]:
        if s["steps"]:
            ts, ys = np.asarray(sol.t), sol.y.T
        else:
            ts = np.asarray(sol.sol.ts)
            ys = np.stack([sol.sol(t) for t in ts])
        stats[5] = ts.size
        size = s["max_steps"] + 1
        out["nodes_t"][:] = _pad_rows(ts, size, "t_eval=None or dense_output")
        out["nodes_y"][:] = _pad_rows(ys, size, "").reshape(size, *shape)  # (n may be 0)
    if s["dense"]:
        rows = [_dense.coefficients(s["method"], it, n) for it in sol.sol.interpolants]
        S = s["max_steps"]
        out["seg"][:] = _pad_rows(np.array([(r[0], r[1]) for r in rows]), S, "dense_output")
        out["y_old"][:] = _pad_rows(np.stack([r[2] for r in rows]), S, "")
        out["C"][:] = _pad_rows(np.stack([r[3] for r in rows]), S, "")
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


def _sens_at(primals: tuple, out: dict, S0: np.ndarray, dp: np.ndarray, s: dict
             ) -> tuple[_Host, list, np.ndarray]:
    """The sensitivities at every valid output entry: (host, where, S (N, n, K))."""
    t0, t1, y0, t_eval, *_ = primals
    out = dict(out, t_eval_=f64(t_eval))
    times, where = _points(out, s["steps"])
    host = _host(primals, s)
    t = np.asarray(times, np.float64)
    sign = 1.0 if float(t1) >= float(t0) else -1.0
    uniq, inverse = np.unique(sign * t, return_inverse=True)
    S = host.sensitivities(float(t0), np.ravel(f64(y0)), sign * uniq, S0, dp, s)
    return host, where, S[np.ravel(inverse)] if len(times) else S


@_trajectory.defjvp
def _trajectory_jvp(primals: tuple, out: dict, tangents: tuple, *, st: Any) -> Any:
    s = st.value
    t0, t1, y0, t_eval, params, *_ = primals
    dt0, _, dy0, dt_eval, dparams, *_ = tangents
    tan: dict[str, Any] = {k: None for k in out}
    if int(out["stats"][0]) == -1:  # a failed solve ("nan" policy): NaN, as reverse mode
        for key in ("ys", "y_ev", "nodes_y"):
            tan[key] = np.full(out[key].shape, np.nan, out[key].dtype)
        return tan
    with on_cpu():
        host = _host(primals, s)
        y0f = np.ravel(f64(y0))
        s0 = np.zeros(host.n) if dy0 is None else np.ravel(f64(dy0))
        if dt0 is not None:
            s0 = s0 - host.f(float(t0), y0f) * float(dt0)
        dp = np_ravel(fill_zeros(dparams, params))
        host, where, S = _sens_at(primals, out, s0[:, None], dp[:, None], s)
        for key in ("ys", "y_ev", "nodes_y"):
            tan[key] = np.zeros(out[key].shape, out[key].dtype)
        for (key, idx), Si in zip(where, S):
            tan[key][idx] = Si[:, 0].reshape(y0.shape)
        if dt_eval is not None and not s["steps"]:
            te = f64(t_eval)
            for i in range(int(out["stats"][4])):
                f = host.f(te[i], np.ravel(f64(out["ys"][i])))
                tan["ys"][i] += (f * float(dt_eval[i])).reshape(y0.shape)
    return tan


@_trajectory.defvjp
def _trajectory_vjp(primals: tuple, out: dict, ct: dict, *, st: Any) -> Any:
    s = st.value
    t0, t1, y0, t_eval, params, fixed, jac_ops, ev_ops = primals
    zeros = (np.zeros((), np.asarray(t0).dtype), None, np.zeros(y0.shape, y0.dtype),
             np.zeros(t_eval.shape, t_eval.dtype), np_unravel(np.zeros(np_ravel(params).size),
                                                              params), None, None, None)
    if int(out["stats"][0]) == -1:
        return tuple(None if z is None else jax.tree_util.tree_map(
            lambda a: np.full_like(a, np.nan), z) for z in zeros)
    with on_cpu():
        host = _host(primals, s)
        n, P = host.n, host.P
        eye = np.eye(n + P)
        host, where, S = _sens_at(primals, out, eye[:n], eye[n:], s)
        g = np.zeros(n + P)
        for (key, idx), Si in zip(where, S):
            c = ct[key]
            if c is not None:
                g += np.ravel(f64(c[idx])) @ Si
        a, mu = g[:n], g[n:]
        t0_bar = -(a @ host.f(float(t0), np.ravel(f64(y0))))
        te_bar = np.zeros(t_eval.shape)
        if ct["ys"] is not None and not s["steps"]:
            te = f64(t_eval)
            for i in range(int(out["stats"][4])):
                te_bar[i] = np.ravel(f64(ct["ys"][i])) @ host.f(te[i], np.ravel(f64(out["ys"][i])))
    return (np.asarray(t0_bar, np.asarray(t0).dtype), None, a.reshape(y0.shape).astype(y0.dtype),
            te_bar.astype(t_eval.dtype), np_unravel(mu, params), None, None, None)


# ------------------------------------------------------------------ JAX side
def _event_spec(events: Any, name: str) -> tuple[list, tuple, tuple]:
    evs = [events] if callable(events) else list(events)
    terminal, direction = [], []
    for i, ev in enumerate(evs):
        if not callable(ev):
            raise TypeError(f"jaxbridge.scipy.{name}: events[{i}] must be callable, got "
                            f"{type(ev).__name__}")
        term = getattr(ev, "terminal", None)
        if term is None or term is False or term == 0:
            term = 0
        elif term is True:
            term = 1
        elif isinstance(term, (int, np.integer)) and term > 0:
            term = int(term)
        else:
            raise ValueError(f"jaxbridge.scipy.{name}: the `terminal` attribute of events[{i}] "
                             f"must be a boolean or positive integer, got {term!r}")
        terminal.append(term)
        direction.append(float(getattr(ev, "direction", 0)))
    return evs, tuple(terminal), tuple(direction)


def _ift(event: Callable, fun: Callable, args: tuple, t_c: Any, y_c: Any, valid: Any,
         t_safe: Any, y_safe: Any) -> tuple[Any, Any]:
    """One event slot: (t*, y(t*)) with the implicit-function derivative (value unchanged)."""
    t = jnp.where(valid, sg(t_c), t_safe)
    y = jnp.where(valid, y_c, y_safe)
    g = event(t, y, *args)
    f = sg(fun(sg(t), sg(y)))
    _, g_dot = jax.jvp(lambda t, y: event(t, y, *args), (sg(t), sg(y)),
                       (jnp.ones_like(t), f))
    g_dot = jnp.where(valid, sg(g_dot), 1.0)
    dt = _time_shift(g - sg(g), g_dot)
    nan = jnp.asarray(jnp.nan, t.dtype)
    # (components that do not move at t* follow y(t*) alone, even where dt* has none)
    return (jnp.where(valid, sg(t_c) + dt, nan),
            jnp.where(valid, y + jnp.where(f == 0, 0.0, f * dt), nan))


@jax.custom_jvp
def _time_shift(delta: Any, g_dot: Any) -> Any:
    """The event time's implicit-function shift `-delta / g_dot`, valued exactly 0.

    `delta = g - stop_gradient(g)` is zero, only its derivative `dg` is not, so this is
    `dt* = -dg / (dg/dt)` as a derivative, and adds nothing to SciPy's t*. Where
    `dg/dt = 0` (the event function touches zero without crossing it, e.g. an event
    at t0 with a zero time derivative) t* has no derivative: its tangent is NaN, and
    so is a cotangent through it -- but a zero cotangent (the slot is not used) stays
    zero, so that the gradients of the other outputs (other event slots, y at
    t_eval) stay exact. A plain division would be 0/0 there and make the value itself
    NaN (issue #38).
    """
    return jnp.zeros_like(delta)


@_time_shift.defjvp
def _time_shift_jvp(primals: tuple, tangents: tuple) -> tuple[Any, Any]:
    delta, g_dot = primals
    flat = g_dot == 0
    scale = jnp.where(flat, jnp.nan, -1.0 / jnp.where(flat, 1.0, g_dot))

    def tangent(v: Any) -> Any:
        return v * scale

    def cotangent(c: Any) -> Any:  # (a scalar map is its own transpose)
        return jnp.where(flat & (c == 0), 0.0, c * scale)

    d = jnp.reshape(tangents[0], (1,))
    return jnp.zeros_like(delta), linear_with_transpose(tangent, cotangent, d, d).reshape(
        jnp.shape(delta))


def solve_ivp(fun: Callable[..., Any], t_span: Any, y0: Any, method: str = "RK45",
              t_eval: Any = None, dense_output: bool = False, events: Any = None,
              args: tuple | None = None, *, rtol: float = 1e-3, atol: float = 1e-6,
              jac: Any = None, adjoint_rtol: float | None = None,
              adjoint_atol: float | None = None, sensitivity: str = "auto",
              stepping: str = "auto", on_failure: str = "raise",
              max_events: int = MAX_EVENTS, max_steps: int = MAX_STEPS,
              **options: Any) -> OdeEventResult:
    """The `events` / `dense_output` / `t_eval=None` path of
    :func:`jaxbridge.scipy.integrate.solve_ivp` (see its docstring)."""
    name = NAME
    check_policy(on_failure, name)
    if method not in METHODS:
        raise ValueError(f"jaxbridge.scipy.{name}: method must be one of {METHODS}, "
                         f"got {method!r}")
    if sensitivity == "adjoint":
        raise unsupported(name, "sensitivity='adjoint'", "with events, dense output or "
                          "t_eval=None the gradient uses forward sensitivities; pass "
                          "sensitivity='auto' or 'forward'")
    if stepping == "compiled":
        raise unsupported(name, "stepping='compiled'", "events and dense output are located "
                          "by SciPy's own step loop; pass stepping='auto' or 'scipy'")
    for what, v in (("max_events", max_events), ("max_steps", max_steps)):
        if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 1:
            raise ValueError(f"jaxbridge.scipy.{name}: {what} must be a positive int (a "
                             f"static size), got {v!r}")
    call = "fun(t, y, *args)"
    args = check_args(args, name, call, "unpack_checked")
    y0 = as_float_array(y0, name, "y0")
    if len(t_span) != 2:
        raise ValueError(f"jaxbridge.scipy.{name}: t_span must be (t0, tf), got {t_span!r}")
    steps = t_eval is None
    te = jnp.zeros((0,)) if steps else jnp.asarray(t_eval)
    if te.ndim != 1:
        raise ValueError(f"jaxbridge.scipy.{name}: t_eval must be 1-D, got shape {te.shape}")
    tdtype = jnp.result_type(te.dtype, jnp.asarray(t_span[0]).dtype, float)
    te = te.astype(tdtype)
    t0, t1 = jnp.asarray(t_span[0], tdtype), jnp.asarray(t_span[1], tdtype)
    t_aval = jax.ShapeDtypeStruct((), tdtype)
    y_aval = jax.ShapeDtypeStruct(y0.shape, y0.dtype)
    rhs, ops = convert(fun, name, "fun", (t_aval, y_aval), args, call)
    _check_shape(rhs, y0.shape, name, "fun")
    params, fixed = rhs.split(ops)
    jac_hf: Any = jac
    jac_ops: Sequence[Any] = ()
    if callable(jac):
        jac_hf, jac_ops = convert(jac, name, "jac", (t_aval, y_aval), args, "jac(t, y, *args)")
        jac_ops = tuple(sg(o) for o in jac_ops)
    evs, terminal, direction = _event_spec(() if events is None else events, name)
    for i, term in enumerate(terminal):
        if term > max_events:
            raise ValueError(f"jaxbridge.scipy.{name}: events[{i}].terminal={term} needs "
                             f"max_events >= {term}, got max_events={max_events}")
    ev_hfs, ev_ops = [], []
    for i, ev in enumerate(evs):
        hf, o = convert(ev, name, f"events[{i}]", (t_aval, y_aval), args,
                        "event(t, y, *args)")
        _check_shape(hf, (), name, f"events[{i}]")
        ev_hfs.append(hf)
        ev_ops.append(tuple(sg(x) for x in o))
    st = _Static(fun=rhs, jac=jac_hf, events=tuple(ev_hfs), terminal=terminal,
                 direction=direction, method=method, rtol=float(rtol), atol=float(atol),
                 sens_rtol=float(rtol if adjoint_rtol is None else adjoint_rtol),
                 sens_atol=float(atol if adjoint_atol is None else adjoint_atol),
                 options=static_options(options, name), on_failure=on_failure,
                 max_events=int(max_events), max_steps=int(max_steps),
                 steps=steps, dense=bool(dense_output), nodes=steps or bool(dense_output))
    out = _trajectory(t0, t1, y0, te, params, fixed, tuple(jac_ops), tuple(ev_ops), st=st)
    stats = out["stats"]
    status, n_points = stats[0], stats[4]

    def f_jax(t: Any, y: Any) -> Any:
        return fun(t, y, *args)

    # events: value from SciPy, derivative by the implicit function theorem
    t_events, y_events = [], []
    for i, ev in enumerate(evs):
        valid = jnp.arange(max_events) < out["n_ev"][i]
        slot = jax.vmap(lambda t, y, v, ev=ev: _ift(ev, f_jax, args, t, y, v, sg(t0), sg(y0)))
        t_i, y_i = slot(out["t_ev"][i], out["y_ev"][i], valid)
        t_events.append(t_i)
        y_events.append(y_i)

    sol = None
    m = stats[5]
    nodes_t, nodes_y = out["nodes_t"], out["nodes_y"]
    if dense_output:
        def derivatives(t: Any, y: Any) -> Any:  # y' and y'' along the solution
            f, g = jax.jvp(f_jax, (t, y), (jnp.ones_like(t), f_jax(t, y)))
            return jnp.ravel(f), jnp.ravel(g)
        F, G = jax.vmap(derivatives)(sg(nodes_t), nodes_y)
        sol = _dense.OdeSolution(method, y0.shape, nodes_t, m, out["seg"][:, 0],
                                 out["seg"][:, 1], out["y_old"], out["C"],
                                 nodes_y.reshape(nodes_y.shape[0], -1), F, G)
    if steps:
        k = jnp.arange(max_steps + 1)
        t_out = jnp.where(k == 0, t0, nodes_t)
        y_out = nodes_y
        if evs:  # the last step ends at a terminal event: its differentiable t*, y*
            e = jnp.maximum(stats[6], 0)
            j = jnp.clip(jnp.take(out["n_ev"], e) - 1, 0, max_events - 1)
            t_star = jnp.stack(t_events)[e, j]
            y_star = jnp.stack(y_events)[e, j]
            last = (k == m - 1) & (stats[6] >= 0)
            t_out = jnp.where(last, t_star, t_out)
            y_out = jnp.where(last.reshape(-1, *([1] * y0.ndim)), y_star, y_out)
        past = k >= m
        t_out = jnp.where(past, jnp.inf, t_out)
        y_out = jnp.where(past.reshape(-1, *([1] * y0.ndim)), jnp.inf, y_out)
    else:
        t_out, y_out = te, out["ys"]
    return OdeEventResult(
        t=t_out, y=jnp.moveaxis(y_out, 0, -1), sol=sol,
        t_events=t_events if events is not None else None,
        y_events=y_events if events is not None else None,
        nfev=stats[1], njev=stats[2], nlu=stats[3], status=status, success=status >= 0,
        n_events=out["n_ev"] if events is not None else None, n_points=n_points)


def _check_shape(hf: HostFun, want: tuple, name: str, what: str) -> None:
    outs = hf.jaxpr.outvars
    got = [tuple(array_aval(v.aval).shape) for v in outs]
    if len(outs) != 1 or got[0] != tuple(want):
        kind = "a scalar (shape ())" if want == () else f"one array of shape {tuple(want)}"
        raise ValueError(f"jaxbridge.scipy.{name}: `{what}` must return {kind}; it returned "
                         f"shapes {got}")
