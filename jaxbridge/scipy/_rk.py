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
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import scipy.integrate

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


def solve(method: str, fun: Callable[[jax.Array, jax.Array], jax.Array], t0: jax.Array,
          y0: jax.Array, t_bound: jax.Array, t_eval: jax.Array, rtol: float,
          atol: jax.Array, max_step: float = np.inf, first_step: float | None = None
          ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """`scipy.integrate.solve_ivp(fun, (t0, t_bound), y0, method, t_eval)`, traceable.

    Returns `(ys (T, n), status, nfev)`: status 0 (reached t_bound) or -1 (the step
    size fell below SciPy's minimum).
    """
    tab = _tableau(method)
    S = tab["n_stages"]
    A, Bw, C = (jnp.asarray(tab[k]) for k in ("A", "B", "C"))
    n, T = y0.shape[0], t_eval.shape[0]
    direction = jnp.where(t_bound >= t0, 1.0, -1.0)
    atol = jnp.broadcast_to(atol, (n,))

    def f(t: Any, y: Any) -> Any:
        return fun(t, y)

    # --- SciPy's select_initial_step
    f0 = f(t0, y0)
    nfev = 1
    interval = jnp.abs(t_bound - t0)
    if first_step is None:
        scale = atol + jnp.abs(y0) * rtol
        d0, d1 = _rms(y0 / scale), _rms(f0 / scale)
        h0 = jnp.where((d0 < 1e-5) | (d1 < 1e-5), 1e-6, 0.01 * d0 / jnp.where(d1 > 0, d1, 1.0))
        h0 = jnp.minimum(h0, interval)
        f1 = f(t0 + h0 * direction, y0 + h0 * direction * f0)
        nfev += 1
        d2 = _rms((f1 - f0) / scale) / h0
        big = jnp.maximum(d1, d2)
        h1 = jnp.where((d1 <= 1e-15) & (d2 <= 1e-15), jnp.maximum(1e-6, h0 * 1e-3),
                       (0.01 / jnp.where(big > 0, big, 1.0)) ** (1.0 / (tab["order"] + 1)))
        h_abs = jnp.minimum(jnp.minimum(100 * h0, h1), jnp.minimum(interval, max_step))
        h_abs = jnp.where(interval == 0.0, 0.0, h_abs)
    else:
        h_abs = jnp.asarray(first_step, y0.dtype)

    def stages(t: Any, y: Any, fy: Any, h: Any) -> Any:
        K = [fy]
        for s in range(1, S):
            dy = sum(K[j] * A[s, j] for j in range(s)) * h
            K.append(f(t + C[s] * h, y + dy))
        y_new = y + h * sum(K[j] * Bw[j] for j in range(S))
        f_new = f(t + h, y_new)
        return jnp.stack(K + [f_new]), y_new, f_new

    def error_norm(K: Any, h: Any, scale: Any) -> Any:
        if method == "DOP853":
            err5 = (K.T @ jnp.asarray(tab["E5"])) / scale
            err3 = (K.T @ jnp.asarray(tab["E3"])) / scale
            e5, e3 = jnp.sum(err5 ** 2), jnp.sum(err3 ** 2)
            denom = e5 + 0.01 * e3
            value = jnp.abs(h) * e5 / jnp.sqrt(jnp.where(denom > 0, denom, 1.0) * n)
            return jnp.where((e5 == 0) & (e3 == 0), 0.0, value)
        return _rms((K.T @ jnp.asarray(tab["E"])) * h / scale)

    def dense(t_old: Any, y_old: Any, y_new: Any, f_new: Any, K: Any, h: Any, ts: Any) -> Any:
        """The step's interpolant at times `ts` (T,): (T, n); DOP853 adds 3 stages."""
        x = (ts - t_old) / h
        if method != "DOP853":
            Q = K.T @ jnp.asarray(tab["P"])               # (n, order + 1)
            p = jnp.cumprod(jnp.broadcast_to(x[:, None], (T, Q.shape[1])), axis=1)
            return h * (p @ Q.T) + y_old[None, :], jnp.asarray(0, jnp.int32)
        Ks = [K[j] for j in range(K.shape[0])]
        AX, CX = tab["A_EXTRA"], tab["C_EXTRA"]
        for s in range(AX.shape[0]):
            dy = sum(Ks[j] * AX[s, j] for j in range(len(Ks))) * h
            Ks.append(f(t_old + CX[s] * h, y_old + dy))
        Kx = jnp.stack(Ks)
        delta = y_new - y_old
        F0 = [delta, h * Ks[0] - delta, 2 * delta - h * (f_new + Ks[0])]
        F = jnp.concatenate([jnp.stack(F0), h * (jnp.asarray(tab["D"]) @ Kx)])
        y = jnp.zeros((T, n), y_old.dtype)
        for i, Fi in enumerate(F[::-1]):
            y = y + Fi[None, :]
            y = y * (x[:, None] if i % 2 == 0 else (1 - x)[:, None])
        return y + y_old[None, :], jnp.asarray(AX.shape[0], jnp.int32)

    def attempt(state: Any) -> Any:
        t, y, fy, h_abs, rejected, ys, done_eval, nfev, status = state
        min_step = 10 * jnp.abs(jnp.nextafter(t, direction * jnp.inf) - t)
        clamped = jnp.where(h_abs > max_step, max_step, jnp.where(h_abs < min_step, min_step,
                                                                  h_abs))
        h_abs = jnp.where(rejected, h_abs, clamped)
        too_small = h_abs < min_step
        h = h_abs * direction
        t_new = t + h
        t_new = jnp.where(direction * (t_new - t_bound) > 0, t_bound, t_new)
        h = t_new - t
        h_abs = jnp.abs(h)
        K, y_new, f_new = stages(t, y, fy, h)
        nfev = nfev + jnp.where(too_small, 0, S).astype(jnp.int32)
        scale = atol + jnp.maximum(jnp.abs(y), jnp.abs(y_new)) * rtol
        err = error_norm(K, h, scale)
        accepted = (err < 1) & ~too_small
        grow = jnp.where(err == 0, MAX_FACTOR,
                         _factor_min(MAX_FACTOR, SAFETY * err ** tab["exponent"]))
        grow = jnp.where(rejected, jnp.minimum(1.0, grow), grow)
        shrink = _factor_max(MIN_FACTOR, SAFETY * err ** tab["exponent"])
        h_next = h_abs * jnp.where(accepted, grow, shrink)
        # outputs at the t_eval points this step covers (SciPy's searchsorted rule)
        covers = accepted & ~done_eval & (direction * (t_eval - t_new) <= 0)

        def fill(ys: Any) -> Any:
            values, extra = dense(t, y, y_new, f_new, K, h, t_eval)
            return jnp.where(covers[:, None], values, ys), extra

        ys, extra = jax.lax.cond(jnp.any(covers), fill,
                                 lambda ys: (ys, jnp.asarray(0, jnp.int32)), ys)
        nfev = nfev + extra
        finished = accepted & (direction * (t_new - t_bound) >= 0)
        status = jnp.where(too_small, -1, jnp.where(finished, 0, 1)).astype(jnp.int32)
        return (jnp.where(accepted, t_new, t), jnp.where(accepted, y_new, y),
                jnp.where(accepted, f_new, fy), h_next, ~accepted, ys, done_eval | covers,
                nfev, status)

    h_abs = jnp.asarray(h_abs, y0.dtype)
    state = (t0, y0, f0, h_abs, jnp.asarray(False), jnp.full((T, n), jnp.nan, y0.dtype),
             jnp.zeros(T, bool), jnp.asarray(nfev, jnp.int32), jnp.asarray(1, jnp.int32))
    empty = (T == 0) | (interval == 0)
    state = jax.lax.cond(
        empty, lambda s: s[:8] + (jnp.asarray(0, jnp.int32),),
        lambda s: jax.lax.while_loop(lambda s: s[8] == 1, attempt, s), state)
    return state[5], state[8], state[7]
