"""SciPy's dense output (`OdeSolution`) as a JAX function, differentiable in `t` and parameters.

The host solve hands back, per step, the coefficients of SciPy's own interpolant for
the method, padded to a static number of steps:

* RK23/RK45 (`RkDenseOutput`): `y_old + h Q p(x)`, `p = (x, x^2, ...)`, `x = (t - t_old)/h`;
* DOP853 (`Dop853DenseOutput`): the nested form over its 7 rows `F`;
* Radau (`RadauDenseOutput`): `y_old + Q p(x)` (no factor `h`, as in SciPy);
* BDF (`BdfDenseOutput`): `D[0] + sum_j D[j+1] prod_{i<=j} (t - t + h i)/(h (i + 1))`,
  rows past the step's order are zero;
* LSODA (`LsodaDenseOutput`): the Nordsieck array `yh @ ((t - t_n)/h)^j`, j <= 12.

:class:`OdeSolution` picks the segment as SciPy's `OdeSolution` does (same
`searchsorted` side, extrapolation with the first/last segment) and evaluates the
polynomial in JAX: its value is SciPy's to rounding and its `t`-derivative is the
interpolant's own. Its derivative with respect to parameters, `y0` and `t0` is the
sensitivity `dy/dθ` interpolated on the step: a quintic Hermite correction from the
sensitivities at the step's ends (`dY_k`, from the host call's rules) and their first
and second time derivatives (`dF_k`, `dG_k`, with `F_k = fun(t_k, Y_k)` and
`G_k = fun_t + fun_y F_k` evaluated in JAX), added with value zero. Its error is
O(h^6) in the step, below the solution's own error for every method.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["OdeSolution", "DenseArrays", "n_coefficients", "coefficients", "segment"]

sg = jax.lax.stop_gradient

_KIND = {"RK23": "rk", "RK45": "rk", "DOP853": "dop853", "Radau": "radau", "BDF": "bdf",
         "LSODA": "lsoda"}
_ROWS = {"RK23": 3, "RK45": 4, "DOP853": 7, "Radau": 3, "BDF": 6, "LSODA": 13}
ALT_SEGMENT = ("BDF", "LSODA")  # SciPy's OdeSolution(alt_segment=True) for these


def n_coefficients(method: str) -> int:
    """Rows of the padded per-step coefficient array for `method`."""
    return _ROWS[method]


def coefficients(method: str, interpolant: Any, n: int) -> tuple[float, float, np.ndarray,
                                                                  np.ndarray]:
    """`(t_ref, h, y_old (n,), C (rows, n))` of one SciPy `DenseOutput` (host side)."""
    C = np.zeros((_ROWS[method], n))
    y_old = np.zeros(n)
    kind = _KIND[method]
    if type(interpolant).__name__ == "ConstantDenseOutput":
        # A zero-length span (t0 == t1): SciPy's one segment is the constant y0, for
        # every method. As this method's polynomial: the constant term alone (h is
        # then arbitrary; 1 keeps every power of (t - t_ref)/h finite).
        value = np.asarray(interpolant.value, np.float64)
        if kind in ("bdf", "lsoda"):
            C[0] = value
            return interpolant.t_old, 1.0, y_old, C
        return interpolant.t_old, 1.0, value, C
    if kind in ("rk", "radau"):
        Q = np.asarray(interpolant.Q)
        C[:Q.shape[1]] = Q.T
        return interpolant.t_old, interpolant.h, np.asarray(interpolant.y_old), C
    if kind == "dop853":
        C[:] = interpolant.F
        return interpolant.t_old, interpolant.h, np.asarray(interpolant.y_old), C
    if kind == "bdf":
        D = np.asarray(interpolant.D)
        C[:D.shape[0]] = D
        return interpolant.t, float(interpolant.denom[0]), y_old, C
    yh = np.asarray(interpolant.yh)  # LSODA: (n, order + 1)
    C[:yh.shape[1]] = yh.T
    return interpolant.t, interpolant.h, y_old, C


def segment(method: str, t_ref: Any, h: Any, y_old: Any, C: Any, t: Any) -> Any:
    """SciPy's interpolant of one step at scalar `t` (the arithmetic of `_call_impl`)."""
    kind = _KIND[method]
    rows = C.shape[0]
    if kind in ("rk", "radau"):
        x = (t - t_ref) / h
        p = jnp.cumprod(jnp.full((rows,), x))
        return y_old + (h * (p @ C) if kind == "rk" else p @ C)
    if kind == "dop853":
        x = (t - t_ref) / h
        y = jnp.zeros_like(y_old)
        for i in range(rows):
            y = (y + C[rows - 1 - i]) * (x if i % 2 == 0 else 1 - x)
        return y + y_old
    if kind == "bdf":
        j = jnp.arange(rows - 1, dtype=C.dtype)
        p = jnp.cumprod((t - (t_ref - h * j)) / (h * (1 + j)))
        return C[0] + p @ C[1:]
    x = (t - t_ref) / h
    p = jnp.concatenate([jnp.ones((1,), C.dtype), jnp.cumprod(jnp.full((rows - 1,), x))])
    return p @ C


def _hermite(s: Any, dt: Any, ya: Any, yb: Any, fa: Any, fb: Any, ga: Any, gb: Any) -> Any:
    """The quintic Hermite interpolant on one step from values, first and second
    time derivatives at both ends (`s` in [0, 1], step `dt`)."""
    s2 = s * s
    s3, s4, s5 = s2 * s, s2 * s2, s2 * s2 * s
    return ((1 - 10 * s3 + 15 * s4 - 6 * s5) * ya + (10 * s3 - 15 * s4 + 6 * s5) * yb
            + dt * ((s - 6 * s3 + 8 * s4 - 3 * s5) * fa + (-4 * s3 + 7 * s4 - 3 * s5) * fb)
            + dt * dt * ((0.5 * s2 - 1.5 * s3 + 1.5 * s4 - 0.5 * s5) * ga
                         + (0.5 * s3 - s4 + 0.5 * s5) * gb))


class DenseArrays(NamedTuple):
    """The arrays of one :class:`OdeSolution` (its pytree leaves), padded to a static
    number of segments."""

    ts: Any       # segment boundaries (SciPy's `ts`)
    n_nodes: Any  # valid entries of ts
    t_ref: Any    # per segment: the interpolant's reference time
    h: Any        # per segment: its step
    y_old: Any    # per segment: its base state (n,)
    C: Any        # per segment: its coefficients (rows, n)
    Y: Any        # the states at ts (for the derivative's Hermite correction)
    F: Any        # y' at ts
    G: Any        # y'' at ts


class OdeSolution:
    """`sol.sol` of :func:`jaxbridge.scipy.integrate.solve_ivp(dense_output=True)`.

    Like SciPy's `OdeSolution`: `sol(t)` for a scalar `t` returns the state (shape
    `y0.shape`), for a 1-D `t` of length T the states stacked on a last axis
    (`y0.shape + (T,)`). It is a JAX function of `t` (jit, grad, vmap) and a pytree
    (it can be returned from `jit`); `ts` are SciPy's segment boundaries, padded past
    `n_segments + 1` by repeating the last one; `t_min`, `t_max` as in SciPy.

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from jaxbridge.scipy.integrate import solve_ivp
      >>> sol = solve_ivp(lambda t, y: -y, (0.0, 1.0), jnp.ones(1), dense_output=True,
      ...                 rtol=1e-10, atol=1e-12)
      >>> print(f"{float(sol.sol(0.5)[0]):.6f}")
      0.606531
    """

    def __init__(self, method: str, shape: tuple, arrays: DenseArrays) -> None:
        self.method, self.shape, self.arrays = method, tuple(shape), arrays
        self.ts, self.n_nodes, self.t_ref, self.h = arrays.ts, arrays.n_nodes, arrays.t_ref, \
            arrays.h
        self.y_old, self.C, self.Y, self.F, self.G = arrays.y_old, arrays.C, arrays.Y, \
            arrays.F, arrays.G

    @property
    def n_segments(self) -> Any:
        return self.n_nodes - 1

    @property
    def t_min(self) -> Any:
        return jnp.minimum(self.ts[0], self.ts[self.n_nodes - 1])

    @property
    def t_max(self) -> Any:
        return jnp.maximum(self.ts[0], self.ts[self.n_nodes - 1])

    def _index(self, t: Any) -> Any:
        """SciPy's OdeSolution._call_single segment choice, on padded arrays."""
        m = self.n_nodes
        size = self.ts.shape[0]
        idx = jnp.arange(size)
        ascending = self.ts[m - 1] >= self.ts[0]
        reverse = self.ts[jnp.clip(m - 1 - idx, 0, size - 1)]
        ts_sorted = jnp.where(idx < m, jnp.where(ascending, self.ts, reverse), jnp.inf)
        alt = self.method in ALT_SEGMENT
        # ascending: side "right" if alt else "left"; descending: the opposite
        right = ascending == alt
        ind = jnp.where(right, jnp.searchsorted(ts_sorted, t, side="right"),
                        jnp.searchsorted(ts_sorted, t, side="left"))
        seg = jnp.clip(ind - 1, 0, m - 2)
        return jnp.where(ascending, seg, m - 2 - seg)

    def value(self, t: Any) -> Any:
        """SciPy's interpolant at a scalar `t`, flat (n,): the value alone (no
        derivative with respect to parameters)."""
        k = self._index(t)
        return segment(self.method, self.t_ref[k], self.h[k], self.y_old[k], self.C[k], t)

    def _single(self, t: Any) -> Any:
        t = jnp.asarray(t, self.ts.dtype)
        k = self._index(sg(t))
        value = segment(self.method, sg(self.t_ref[k]), sg(self.h[k]), sg(self.y_old[k]),
                         sg(self.C[k]), t)
        # value zero, derivative: the sensitivity interpolated on the step
        ta, tb = sg(self.ts[k]), sg(self.ts[k + 1])
        dt = tb - ta
        s = (sg(t) - ta) / jnp.where(dt == 0, 1.0, dt)
        def zero(a: Any) -> Any:  # value zero, derivative that of `a`
            return a - sg(a)
        Y, F, G = self.Y, self.F, self.G
        corr = _hermite(s, dt, zero(Y[k]), zero(Y[k + 1]), zero(F[k]), zero(F[k + 1]),
                        zero(G[k]), zero(G[k + 1]))
        return (value + corr).reshape(self.shape)

    def __call__(self, t: Any) -> jax.Array:
        t = t if isinstance(t, jax.Array) else np.asarray(t)
        if t.ndim > 1:
            raise ValueError(f"jaxbridge.scipy.integrate.OdeSolution: t must be a scalar or "
                             f"1-D, got shape {t.shape}")
        return _evaluate(self, t)

    def __repr__(self) -> str:
        return f"OdeSolution(method={self.method!r}, segments={self.ts.shape[0] - 1} (padded))"


@jax.jit
def _evaluate(sol: OdeSolution, t: Any) -> jax.Array:
    """`sol(t)` as one compiled program per (method, shape, t's shape): a repeat eager
    call is one dispatch, not one per operation (the solution is the program's operand)."""
    if t.ndim == 0:
        return sol._single(t)
    return jnp.moveaxis(jax.vmap(sol._single)(t), 0, -1)


jax.tree_util.register_pytree_node(
    OdeSolution,
    lambda s: (list(s.arrays), (s.method, s.shape)),
    lambda aux, leaves: OdeSolution(*aux, DenseArrays(*leaves)))
