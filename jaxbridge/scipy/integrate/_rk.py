"""SciPy's explicit Runge-Kutta solvers (RK23, RK45, DOP853) as one compiled loop.

Profiling `solve_ivp` on small non-stiff problems (benchmarks/RESULTS.md) showed
where a step's time goes: SciPy's Python step loop costs ~7 us per right-hand-side
evaluation even with a NumPy right-hand side, and each evaluation of a JAX function
from it is one more dispatch (~5-9 us). No cheaper call path removes both. So for
the explicit methods, SciPy's algorithm itself runs as a `lax.while_loop` compiled
on the host CPU, with no round trip per step:

* the Butcher tableaus, error estimators and interpolants are read from SciPy's own
  classes (`scipy.integrate.RK45.A`, ...);
* the step control is SciPy's `RungeKutta._step_impl`: `SAFETY = 0.9`,
  `MIN_FACTOR = 0.2`, `MAX_FACTOR = 10`, no growth right after a rejection, the same
  `min_step` and `max_step`, clipping at `t_bound`; the first step is SciPy's
  `select_initial_step`; the RMS error norm (DOP853's combined 3rd/5th-order one);
* outputs at `t_eval` come from the same dense output, evaluated on the step that
  contains them, as `solve_ivp` does (DOP853's three extra stages included).

The same arithmetic in the same order gives SciPy's values to rounding, and the same
steps (`nfev` is checked equal to SciPy's in the tests).

**Reverse mode (`adjoint`): the discrete adjoint of the accepted steps.** Each
accepted step is a map `y_{k+1} = Phi(t_k, y_k, h_k, p)` (the RK stages), and each
output is the step's dense output `y(t_i) = D(t_k, y_k, h_k, p; t_i)`. With the step
sizes held at the values the forward solve chose (as diffrax and most discrete
adjoints do: the step-size controller is not differentiated), the gradient of the
outputs is the chain rule backward over the steps: `a_k = Phi_y^T a_{k+1} + D_y^T g`,
`mu += Phi_p^T a_{k+1} + D_p^T g`, each term one JAX VJP of the recomputed stages. It is
the exact gradient of the discrete solution (to rounding), not an approximation
within the tolerance. Memory: the stages are never stored; only `(t_k, y_k, h_k)` per
accepted step, and when more steps than the checkpoint budget were taken, two-level
checkpointing: the loop state at every L-th step, then one segment of L steps at a
time re-run forward and swept backward (one more forward solve; memory ~2 sqrt(N)
records for N steps).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import scipy.integrate
from jax.flatten_util import ravel_pytree

from .. import _loops as loops
from ._linear import linear_with_transpose

EXPLICIT = ("RK23", "RK45", "DOP853")
OPTIONS = ("first_step", "max_step")  # solve_ivp options this loop implements
SAFETY, MIN_FACTOR, MAX_FACTOR = 0.9, 0.2, 10.0


def supported(method: str, options: tuple) -> bool:
    """Whether `method` with these (static) options can run as the compiled loop."""
    x64 = jnp.result_type(float) == jnp.float64  # SciPy's step control is float64
    return method in EXPLICIT and all(k in OPTIONS for k, _ in options) and bool(x64)


def _tableau(method: str) -> dict[str, Any]:
    cls = getattr(scipy.integrate, method)
    t: dict[str, Any] = {name: np.asarray(getattr(cls, name), np.float64)
                         for name in ("A", "B", "C") if hasattr(cls, name)}
    t["n_stages"] = int(cls.n_stages)
    t["exponent"] = -1.0 / (cls.error_estimator_order + 1)
    t["order"] = int(cls.error_estimator_order)
    if method == "DOP853":
        for name in ("E3", "E5", "A_EXTRA", "C_EXTRA", "D"):
            t[name] = np.asarray(getattr(cls, name), np.float64)
    else:
        t["E"], t["P"] = np.asarray(cls.E, np.float64), np.asarray(cls.P, np.float64)
    return t


def _rms(x: jax.Array) -> jax.Array:
    return jnp.linalg.norm(x) / np.sqrt(x.size)


def _factor_min(cap: float, v: jax.Array) -> jax.Array:
    """Python's `min(cap, v)` (NaN-safe as Python's is)."""
    return jnp.where(v < cap, v, cap)


def _factor_max(floor: float, v: jax.Array) -> jax.Array:
    """Python's `max(floor, v)` (`max(0.2, nan)` is 0.2)."""
    return jnp.where(v > floor, v, floor)


class LoopState(NamedTuple):
    """The state of SciPy's step loop between two step attempts."""

    t: jax.Array           # current time
    y: jax.Array           # (n,) current state
    f: jax.Array           # (n,) f(t, y) (first same as last)
    h_abs: jax.Array       # the next step size to try
    rejected: jax.Array    # whether the last attempt was rejected (no growth then)
    ys: jax.Array          # (T, n) outputs at t_eval filled so far
    done_eval: jax.Array   # (T,) which outputs are filled
    nfev: jax.Array        # right-hand-side evaluations
    status: jax.Array      # 1: running, 0: reached t_bound, -1: step size too small
    n_accepted: jax.Array  # accepted steps


class _Rk:
    """One explicit RK method's arithmetic, as SciPy's classes do it."""

    def __init__(self, method: str, fun: Callable[[Any, Any], Any], rtol: float | tuple,
                 atol: Any,
                 max_step: float, t_bound: Any, t_eval: Any, direction: Any) -> None:
        self.method, self.f, self.atol = method, fun, atol
        self.rtol = rtol if isinstance(rtol, float) else jnp.asarray(rtol, atol.dtype)
        self.max_step, self.t_bound, self.t_eval, self.direction = (max_step, t_bound, t_eval,
                                                                      direction)
        self.tab = tab = _tableau(method)
        self.S = tab["n_stages"]
        self.A, self.B, self.C = (jnp.asarray(tab[k]) for k in ("A", "B", "C"))

    def initial_step(self, t0: Any, y0: Any, f0: Any, first_step: float | None) -> Any:
        """SciPy's `select_initial_step` (or `first_step`); returns (h_abs, evaluations)."""
        if first_step is not None:
            return jnp.asarray(first_step, y0.dtype), 0
        f, rtol, atol, direction = self.f, self.rtol, self.atol, self.direction
        interval = jnp.abs(self.t_bound - t0)
        scale = atol + jnp.abs(y0) * rtol
        d0, d1 = _rms(y0 / scale), _rms(f0 / scale)
        h0 = jnp.where((d0 < 1e-5) | (d1 < 1e-5), 1e-6, 0.01 * d0 / jnp.where(d1 > 0, d1, 1.0))
        h0 = jnp.minimum(h0, interval)
        f1 = f(t0 + h0 * direction, y0 + h0 * direction * f0)
        d2 = _rms((f1 - f0) / scale) / h0
        big = jnp.maximum(d1, d2)
        h1 = jnp.where((d1 <= 1e-15) & (d2 <= 1e-15), jnp.maximum(1e-6, h0 * 1e-3),
                       (0.01 / jnp.where(big > 0, big, 1.0)) ** (1.0 / (self.tab["order"] + 1)))
        h_abs = jnp.minimum(jnp.minimum(100 * h0, h1), jnp.minimum(interval, self.max_step))
        h_abs = jax.lax.stop_gradient(h_abs)  # (step sizes are not differentiated)
        return jnp.where(interval == 0.0, 0.0, h_abs).astype(y0.dtype), 1

    def stages(self, t: Any, y: Any, fy: Any, h: Any) -> Any:
        """(K (S + 1, n) with f_new last, y_new, f_new) of one step from (t, y)."""
        A, B, C, S, f = self.A, self.B, self.C, self.S, self.f
        K = [fy]
        for s in range(1, S):
            dy = sum(K[j] * A[s, j] for j in range(s)) * h
            K.append(f(t + C[s] * h, y + dy))
        y_new = y + h * sum(K[j] * B[j] for j in range(S))
        f_new = f(t + h, y_new)
        return jnp.stack(K + [f_new]), y_new, f_new

    def error_norm(self, K: Any, h: Any, scale: Any) -> Any:
        tab, n = self.tab, K.shape[1]
        if self.method == "DOP853":
            err5 = (K.T @ jnp.asarray(tab["E5"])) / scale
            err3 = (K.T @ jnp.asarray(tab["E3"])) / scale
            e5, e3 = jnp.sum(err5 ** 2), jnp.sum(err3 ** 2)
            denom = e5 + 0.01 * e3
            value = jnp.abs(h) * e5 / jnp.sqrt(jnp.where(denom > 0, denom, 1.0) * n)
            return jnp.where((e5 == 0) & (e3 == 0), 0.0, value)
        return _rms((K.T @ jnp.asarray(tab["E"])) * h / scale)

    def coefficients(self, t_old: Any, y_old: Any, y_new: Any, f_new: Any, K: Any,
                     h: Any) -> tuple[Any, int]:
        """The step's interpolant as `_dense.coefficients` lays it out: `(C (rows, n),
        extra evaluations)`: RK23/RK45 `Q.T` (SciPy's `K.T @ P`), DOP853 its rows `F`
        (after its extra stages, which SciPy counts in `nfev`)."""
        tab = self.tab
        if self.method != "DOP853":
            return (K.T @ jnp.asarray(tab["P"])).T, 0
        Ks = [K[j] for j in range(K.shape[0])]
        AX, CX = tab["A_EXTRA"], tab["C_EXTRA"]
        for s in range(AX.shape[0]):
            dy = sum(Ks[j] * AX[s, j] for j in range(len(Ks))) * h
            Ks.append(self.f(t_old + CX[s] * h, y_old + dy))
        Kx = jnp.stack(Ks)
        delta = y_new - y_old
        F0 = [delta, h * Ks[0] - delta, 2 * delta - h * (f_new + Ks[0])]
        return jnp.concatenate([jnp.stack(F0), h * (jnp.asarray(tab["D"]) @ Kx)]), \
            int(AX.shape[0])

    def dense(self, t_old: Any, y_old: Any, y_new: Any, f_new: Any, K: Any, h: Any) -> Any:
        """The step's interpolant at all of t_eval: ((T, n), extra evaluations)."""
        ts = self.t_eval
        T, n = ts.shape[0], y_old.shape[0]
        x = (ts - t_old) / h
        C, extra = self.coefficients(t_old, y_old, y_new, f_new, K, h)
        if self.method != "DOP853":
            p = jnp.cumprod(jnp.broadcast_to(x[:, None], (T, C.shape[0])), axis=1)
            return h * (p @ C) + y_old[None, :], 0
        y = jnp.zeros((T, n), y_old.dtype)
        for i, Fi in enumerate(C[::-1]):
            y = y + Fi[None, :]
            y = y * (x[:, None] if i % 2 == 0 else (1 - x)[:, None])
        return y + y_old[None, :], extra

    def attempt(self, state: LoopState, outputs: bool = True) -> tuple[LoopState, Any, Any]:
        """One step attempt of SciPy's `RungeKutta._step_impl`; also returns whether it
        was accepted and the step `h` taken. `outputs=False` skips the dense output."""
        return self.attempt_stages(state, outputs)[:3]

    def attempt_stages(self, state: LoopState, outputs: bool = True
                       ) -> tuple[LoopState, Any, Any, Any]:
        """:meth:`attempt`, also returning the attempt's stages `K` (S + 1, n), from
        which the step's interpolant is built (`coefficients`)."""
        direction, max_step, t_bound = self.direction, self.max_step, self.t_bound
        # Step sizes (and times) are not differentiated: the discrete adjoint holds them
        # at the values chosen, and this makes JAX's own jvp of the loop the same thing.
        t, y, h_abs = jax.lax.stop_gradient(state.t), state.y, jax.lax.stop_gradient(state.h_abs)
        min_step = 10 * jnp.abs(jnp.nextafter(t, direction * jnp.inf) - t)
        clamped = jnp.where(h_abs > max_step, max_step, jnp.where(h_abs < min_step, min_step,
                                                                  h_abs))
        h_abs = jnp.where(state.rejected, h_abs, clamped)
        too_small = h_abs < min_step
        h = h_abs * direction
        t_new = t + h
        t_new = jnp.where(direction * (t_new - t_bound) > 0, t_bound, t_new)
        h = t_new - t
        h_abs = jnp.abs(h)
        K, y_new, f_new = self.stages(t, y, state.f, h)
        nfev = state.nfev + jnp.where(too_small, 0, self.S).astype(jnp.int32)
        scale = self.atol + jnp.maximum(jnp.abs(y), jnp.abs(y_new)) * self.rtol
        err = self.error_norm(K, h, scale)
        accepted = (err < 1) & ~too_small
        exponent = self.tab["exponent"]
        grow = jnp.where(err == 0, MAX_FACTOR, _factor_min(MAX_FACTOR, SAFETY * err ** exponent))
        grow = jnp.where(state.rejected, jnp.minimum(1.0, grow), grow)
        shrink = _factor_max(MIN_FACTOR, SAFETY * err ** exponent)
        h_next = h_abs * jnp.where(accepted, grow, shrink)
        ys, done_eval = state.ys, state.done_eval
        if outputs:
            # outputs at the t_eval points this step covers (SciPy's searchsorted rule)
            covers = accepted & ~done_eval & (direction * (self.t_eval - t_new) <= 0)

            def fill(ys: Any) -> Any:
                values, extra = self.dense(t, y, y_new, f_new, K, h)
                return jnp.where(covers[:, None], values, ys), jnp.asarray(extra, jnp.int32)

            ys, extra = loops.cond(jnp.any(covers), fill,
                                     lambda ys: (ys, jnp.asarray(0, jnp.int32)), ys)
            nfev = nfev + extra
            done_eval = done_eval | covers
        finished = accepted & (direction * (t_new - t_bound) >= 0)
        status = jnp.where(too_small, -1, jnp.where(finished, 0, 1)).astype(jnp.int32)
        new = LoopState(
            t=jnp.where(accepted, t_new, t), y=jnp.where(accepted, y_new, y),
            f=jnp.where(accepted, f_new, state.f), h_abs=h_next, rejected=~accepted, ys=ys,
            done_eval=done_eval, nfev=nfev, status=status,
            n_accepted=state.n_accepted + accepted.astype(jnp.int32))
        return new, accepted, h, K

    def start(self, t0: Any, y0: Any, first_step: float | None) -> LoopState:
        f0 = self.f(t0, y0)
        h_abs, evals = self.initial_step(t0, y0, f0, first_step)
        T, n = self.t_eval.shape[0], y0.shape[0]
        empty = (T == 0) | (self.t_bound == t0)
        # (no step at all when t_bound == t0: the outputs, all at t0, are y0)
        ys = jnp.where(self.t_bound == t0, jnp.broadcast_to(y0, (T, n)), jnp.nan)
        return LoopState(t=t0, y=y0, f=f0, h_abs=h_abs, rejected=jnp.asarray(False),
                         ys=ys.astype(y0.dtype), done_eval=jnp.zeros(T, bool),
                         nfev=jnp.asarray(1 + evals, jnp.int32),
                         status=jnp.where(empty, 0, 1).astype(jnp.int32),
                         n_accepted=jnp.asarray(0, jnp.int32))


class _Controls(NamedTuple):
    """The step control's static settings: SciPy's method, rtol and max_step."""

    method: str
    rtol: float | tuple
    max_step: float


def _setup(controls: _Controls, fun: Callable, t0: Any, y0: Any, t_bound: Any, t_eval: Any,
           atol: Any) -> _Rk:
    direction = jnp.where(t_bound >= t0, 1.0, -1.0)
    atol = jnp.broadcast_to(atol, (y0.shape[0],))
    return _Rk(controls.method, fun, controls.rtol, atol, controls.max_step, t_bound, t_eval,
               direction)


def stepper(method: str, fun: Callable[[Any, Any], Any], t0: Any, y0: Any, t_bound: Any,
            t_eval: Any, rtol: float | tuple, atol: Any, max_step: float = np.inf) -> _Rk:
    """SciPy's RK method `method` for `y' = fun(t, y)` on (t0, t_bound), outputs at
    `t_eval`: `start` and `attempt_stages` run its step loop one attempt at a time."""
    return _setup(_Controls(method, rtol, max_step), fun, t0, y0, t_bound, t_eval, atol)


def solve(method: str, fun: Callable[[jax.Array, jax.Array], jax.Array], t0: jax.Array,
          y0: jax.Array, t_bound: jax.Array, t_eval: jax.Array, rtol: float | tuple,
          atol: jax.Array, max_step: float = np.inf, first_step: float | None = None
          ) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """`scipy.integrate.solve_ivp(fun, (t0, t_bound), y0, method, t_eval)`, traceable.

    Returns `(ys (T, n), status, nfev, accepted steps)`: status 0 (reached t_bound) or
    -1 (the step size fell below SciPy's minimum).
    """
    rk = _setup(_Controls(method, rtol, max_step), fun, t0, y0, t_bound, t_eval, atol)
    state = loops.while_loop(lambda s: s.status == 1, lambda s: rk.attempt(s)[0],
                               rk.start(t0, y0, first_step))
    return state.ys, state.status, state.nfev, state.n_accepted


class Spec(NamedTuple):
    """The static half of one differentiable solve (see :func:`differentiable_solve`)."""

    method: str
    fun: Callable[[Any, Any, Any, Any], Any]  # fun(t, y (n,), params, fixed) -> (n,)
    rtol: float | tuple
    max_step: float
    first_step: float | None
    seg_len: int      # L: accepted steps per checkpointed segment
    n_segs: int       # S: segment start states stored (N <= L * S steps)
    sensitivity: str  # reverse mode: "adjoint" (discrete adjoint) or "forward" (jacfwd)


def checkpoint_sizes(budget: int | None, n: int) -> tuple[int, int]:
    """(L, S) for a budget of stored states (None: 16 MiB worth, at most 1024 tape
    entries and 1024 segment starts, enough for 1e6 steps). A segment start holds two
    states of n floats (y and f), a tape entry one; the stages are never stored."""
    if budget is None:
        side = min(1024, max(16, int(16 * 2 ** 20 / (8 * (3 * n + 8)))))
        return side, side
    return max(budget // 2, 1), max(budget - budget // 2, 1)


def _core(state: LoopState) -> LoopState:
    """The loop state without the outputs (what a segment re-run needs)."""
    return state._replace(ys=state.ys[:0], done_eval=state.done_eval[:0])


def _tape0(L: int, n: int, tdtype: Any, dtype: Any) -> tuple:
    return (jnp.zeros(L + 1, tdtype), jnp.zeros((L, n), dtype), jnp.zeros(L, tdtype))


def _record(tape: tuple, k: Any, state: LoopState, h: Any) -> tuple:
    ts, ys, hs = tape
    return ts.at[k].set(state.t).at[k + 1].set(state.t + h), ys.at[k].set(state.y), \
        hs.at[k].set(h)


def _forward_recording(rk: _Rk, start: LoopState, L: int, S: int) -> tuple:
    """The forward loop (with outputs), storing the loop state at the start of every
    segment of L accepted steps and the (t, y, h) tape of the last segment."""
    segs = jax.tree_util.tree_map(lambda x: jnp.zeros((S,) + x.shape, x.dtype).at[0].set(x),
                                  _core(start))
    tape = _tape0(L, start.y.shape[0], start.t.dtype, start.y.dtype)

    def body(carry: Any) -> Any:
        state, segs, tape = carry
        new, accepted, h = rk.attempt(state)
        k = state.n_accepted % L
        tape = loops.cond(accepted, lambda tp: _record(tp, k, state, h), lambda tp: tp, tape)
        idx = new.n_accepted // L
        boundary = accepted & (new.n_accepted % L == 0) & (idx < S)
        segs = loops.cond(
            boundary, lambda sg: jax.tree_util.tree_map(lambda b, x: b.at[idx].set(x), sg,
                                                        _core(new)), lambda sg: sg, segs)
        return new, segs, tape

    return loops.while_loop(lambda c: c[0].status == 1, body, (start, segs, tape))


class _Recording(NamedTuple):
    """What the forward loop kept for the adjoint: the loop state at each segment start,
    the (t, y, h) tape of the last segment, and the number of accepted steps."""

    segs: LoopState
    tape: tuple
    n_steps: Any


def _sweep(spec: Spec, fun: Callable[[Any, Any, Any], Any], rk: _Rk, params: Any,
           t_eval: Any, recording: _Recording, ct: Any) -> tuple[Any, Any]:
    """The discrete adjoint: (dL/dy0, dL/dparams) for output cotangents `ct` (T, n)."""
    segs, tape, n_steps = recording
    L = spec.seg_len
    n, dtype = tape[1].shape[1], tape[1].dtype
    direction, T = rk.direction, t_eval.shape[0]

    def rerun(state: LoopState, until: Any) -> tuple:
        def body(carry: Any) -> Any:
            state, tape = carry
            new, accepted, h = rk.attempt(state, outputs=False)
            k = state.n_accepted % L
            return new, loops.cond(accepted, lambda tp: _record(tp, k, state, h),
                                     lambda tp: tp, tape)
        return loops.while_loop(lambda c: (c[0].status == 1) & (c[0].n_accepted < until),
                                  body, (state, _tape0(L, n, state.t.dtype, dtype)))[1]

    def step_vjp(t: Any, t_next: Any, y: Any, h: Any, a: Any, first: Any) -> Any:
        covers = (direction * (t_eval - t_next) <= 0) & (first | (direction * (t_eval - t) > 0))

        def phi(y: Any, p: Any) -> Any:
            f = lambda t, y: fun(t, y, p)  # noqa: E731
            rk_p = _Rk(spec.method, f, spec.rtol, rk.atol, spec.max_step, rk.t_bound, t_eval,
                       direction)
            K, y_new, f_new = rk_p.stages(t, y, f(t, y), h)
            return rk_p, K, y_new, f_new

        def with_output(y: Any, p: Any) -> Any:
            rk_p, K, y_new, f_new = phi(y, p)
            return y_new, rk_p.dense(t, y, y_new, f_new, K, h)[0]

        def plain(_: Any) -> Any:
            return jax.vjp(lambda y, p: phi(y, p)[2], y, params)[1](a)

        def output(_: Any) -> Any:
            g = jnp.where(covers[:, None], ct, 0.0).astype(dtype)
            return jax.vjp(with_output, y, params)[1]((a, g))

        if T == 0:
            return plain(None)
        return loops.cond(jnp.any(covers), output, plain, None)

    last = jnp.maximum(n_steps - 1, 0) // L

    def segment(carry: Any) -> Any:
        s, a, mu = carry
        ts, ys, hs = loops.cond(
            s == last, lambda _: tape,
            lambda _: rerun(jax.tree_util.tree_map(lambda b: b[s], segs), (s + 1) * L), None)
        count = jnp.minimum(n_steps, (s + 1) * L) - s * L

        def back(carry: Any) -> Any:
            k, a, mu = carry
            da, dmu = step_vjp(ts[k], ts[k + 1], ys[k], hs[k], a, (s == 0) & (k == 0))
            return k - 1, da, jax.tree_util.tree_map(jnp.add, mu, dmu)
        _, a, mu = loops.while_loop(lambda c: c[0] >= 0, back, (count - 1, a, mu))
        return s - 1, a, mu

    mu0 = jax.tree_util.tree_map(jnp.zeros_like, params)
    _, a, mu = loops.while_loop(lambda c: c[0] >= 0, segment,
                                  (last, jnp.zeros(n, dtype), mu0))
    # no step at all (t_bound == t0): the outputs are y0 itself
    a = a + jnp.where(n_steps == 0, jnp.sum(ct, axis=0), 0.0).astype(dtype)
    return a, mu


def _bind_fixed(fun: Callable, fixed: Any, t: Any, y: Any, params: Any) -> Any:
    return fun(t, y, params, fixed)


def _plain(spec: Spec, t0: Any, y0: Any, t_bound: Any, t_eval: Any, atol: Any, params: Any,
           fixed: Any) -> tuple:
    return solve(spec.method, lambda t, y: spec.fun(t, y, params, fixed), t0, y0, t_bound,
                 t_eval, spec.rtol, atol, spec.max_step, spec.first_step)


@functools.partial(jax.custom_jvp, nondiff_argnums=(0,))
def differentiable_solve(spec: Spec, t0: Any, y0: Any, t_bound: Any, t_eval: Any, atol: Any,
                         params: Any, fixed: Any) -> tuple:
    """:func:`solve` of `y' = spec.fun(t, y, params)` as a JAX function with derivatives.

    Returns `(ys (T, n), status, nfev, accepted steps)`. Forward mode (jvp, jacfwd) is
    JAX's own derivative of the loop with the step sizes held (forward sensitivities
    of the discrete solution); reverse mode is its transpose, the discrete adjoint
    (`spec.sensitivity="adjoint"`), or the full Jacobian by forward mode, contracted
    ("forward": cheaper for tiny systems). Both are exact for the discrete solution.
    Derivatives w.r.t. t0 and t_eval use the vector field there (`-J f(t0) dt0`,
    `f(t_i, y_i) dt_i`). Under differentiation status -2 means the solve took more
    than `seg_len * n_segs` accepted steps (the checkpoint budget).
    """
    return _plain(spec, t0, y0, t_bound, t_eval, atol, params, fixed)


@differentiable_solve.defjvp
def _differentiable_solve_jvp(spec: Spec, primals: tuple, tangents: tuple) -> tuple:
    t0, y0, t_bound, t_eval, atol, params, fixed = loops.join(primals)  # (shard_map)
    dt0, dy0, _, dt_eval, _, dparams, _ = tangents
    t0 = jnp.asarray(t0, jnp.result_type(float))
    t_bound = jnp.asarray(t_bound, jnp.result_type(float))
    L, S = spec.seg_len, spec.n_segs
    fun = functools.partial(_bind_fixed, spec.fun, fixed)  # fun(t, y, params)
    rk = _setup(_Controls(spec.method, spec.rtol, spec.max_step),
                lambda t, y: fun(t, y, params), t0, y0, t_bound, t_eval, atol)
    final, segs, tape = _forward_recording(rk, rk.start(t0, y0, spec.first_step), L, S)
    ys, n_steps = final.ys, final.n_accepted
    overflow = n_steps > L * S
    status = jnp.where(overflow, -2, final.status).astype(jnp.int32)
    n = y0.shape[0]
    flat_p, unravel = ravel_pytree(params)
    P = flat_p.size
    f0 = fun(t0, y0, params)
    f_out = jax.vmap(lambda t, y: fun(t, y, params))(t_eval, ys)  # (T, n)

    def flat(x: Any, like: Any) -> Any:
        return jnp.ravel(jnp.asarray(x, like.dtype))
    b = jnp.concatenate([flat(dt0, t0).astype(y0.dtype), flat(dy0, y0),
                         ravel_pytree(jax.tree_util.tree_map(flat, dparams, params))[0]
                         .astype(y0.dtype), flat(dt_eval, t_eval).astype(y0.dtype)])

    def split(v: Any) -> tuple:
        return v[0], v[1:1 + n], v[1 + n:1 + n + P], v[1 + n + P:]

    def core(dy0: Any, dp: Any) -> Any:  # d ys / d(y0, p), step sizes held
        return jax.jvp(lambda y0, q: solve(
            spec.method, lambda t, y: fun(t, y, unravel(q)), t0, y0, t_bound, t_eval,
            spec.rtol, atol, spec.max_step, spec.first_step)[0], (y0, flat_p),
            loops.join((dy0.astype(y0.dtype), dp.astype(flat_p.dtype)),
                       loops.mesh_axes(y0, flat_p)))[1]

    def forward(v: Any) -> Any:
        d0, dy, dp, dte = split(v)
        return core(dy - f0 * d0, dp) + f_out * dte[:, None]

    def transpose(c: Any) -> Any:
        if spec.sensitivity == "forward":
            J = jax.vmap(lambda e: core(e[:n], e[n:]), out_axes=-1)(jnp.eye(n + P, dtype=y0.dtype))
            g = jnp.tensordot(c, J, axes=2)
            a, mu = g[:n], g[n:]
        else:
            a, mu_tree = _sweep(spec, fun, rk, params, t_eval,
                                _Recording(segs, tape, n_steps), c)
            mu = ravel_pytree(mu_tree)[0]
        bad = overflow | (final.status != 0)
        a = jnp.where(bad, jnp.nan, a)
        return jnp.concatenate([-(a @ f0)[None], a, jnp.asarray(mu, y0.dtype),
                                jnp.sum(c * f_out, axis=1)])

    dys = linear_with_transpose(forward, transpose, b, ys)
    return (ys, status, final.nfev, n_steps), (dys, *map(loops.no_tangent,
                                                         (status, final.nfev, n_steps)))


