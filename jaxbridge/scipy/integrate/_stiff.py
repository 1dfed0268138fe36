"""Reverse (and forward) mode of the implicit methods (BDF, Radau, LSODA), compiled.

SciPy runs the stiff solve on the host, as before: its Newton iterations, Jacobian
reuse and order selection are what make BDF and LSODA robust, and they run at
SciPy's speed. What used to be slow was the derivative: the continuous adjoint was a
second SciPy solve driven from Python (one host round trip per right-hand side). Here
the forward host call also returns SciPy's **accepted steps** (times and states,
`record`), and the derivative is one compiled JAX loop over them:

* each accepted step `[t_k, t_k + h_k]` is re-expressed as one step of **Radau IIA**
  (order 5, SciPy's `Radau` tableau): the collocation equations
  `G(Z) = Z - h (A (x) I) F(t_k + c h, y_k + Z) = 0` are solved by Newton in JAX from
  the stored `y_k` (full Jacobian from JAX, to rounding), and `y_{k+1} = y_k + Z_3`;
* an output `y(t_i)` inside the step is Radau's dense output, the collocation
  polynomial `y_k + Z^T P [x, x^2, x^3]` (what SciPy's Radau returns at `t_eval`);
* the derivative of a step follows from the implicit function theorem,
  `dZ = G_Z^{-1} (h (A (x) I) (F_y dy + F_p dp))`: forward mode applies it step by
  step from `t0`; reverse mode (the discrete adjoint) sweeps the steps backward,
  one transposed solve `G_Z^T lam = Zbar` and one VJP of the vector field per step.

**What the gradient is exact for.** With `method="Radau"` the steps are SciPy's own
Radau steps, so this is the exact derivative of the converged Radau IIA solution on
those steps (SciPy stops its Newton iteration at a tolerance tied to `rtol`; the
gradient is the derivative of the fully converged collocation solution through the
states SciPy returned, so it agrees with SciPy's discrete solution to that
tolerance). With BDF and LSODA the steps and states are theirs but the derivative is
that of Radau IIA on the same steps: **within the solver's tolerance**, like a
continuous adjoint. The tests check both claims (exactness against JAX autodiff of a
jnp twin of the Radau chain; tolerance against closed forms and finite differences).

Cost: per accepted step a few Newton iterations on a `3n x 3n` system plus one VJP of
the vector field -- it grows with the state size and the step count, not with the
number of parameters. Memory: one state per accepted step (the `checkpoints`
budget), never the stages or the factorizations. `vmap` batches the JAX loops into
one loop over the batch (SciPy's host solves run one per batch member).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from .. import _loops as loops
from ._linear import linear_with_transpose

NEWTON_MAX_ITER = 12
# Newton on the stages stops, at the latest, once its corrections fall below this
# fraction of the solve's atol (SciPy's own Newton stops near 0.03 of its error scale).
NEWTON_ATOL_FRACTION = 1e-6
DEFAULT_MAX_STATES = 16384


def _radau_tableau() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(C, A, P) of 3-stage Radau IIA, from the collocation conditions (the same
    numbers as `scipy.integrate._ivp.radau`: C, and P of its dense output)."""
    s6 = np.sqrt(6.0)
    C = np.array([(4.0 - s6) / 10.0, (4.0 + s6) / 10.0, 1.0])
    powers = np.arange(3)
    W = C[:, None] ** powers[None, :]                     # W[j, m] = c_j^m
    R = C[:, None] ** (powers[None, :] + 1) / (powers[None, :] + 1)
    A = np.linalg.solve(W.T, R.T).T                       # sum_j A_ij c_j^m = c_i^(m+1)/(m+1)
    V = C[:, None] ** (powers[None, :] + 1)               # u(c_j) = sum_k q_k c_j^(k+1)
    P = np.linalg.inv(V).T                                # Q = Z^T P (SciPy's convention)
    return C, A, P


C_RADAU, A_RADAU, P_RADAU = _radau_tableau()


def max_states(budget: int | None, n: int) -> int:
    """How many accepted steps the record holds (None: 16 MiB worth, at most 16384)."""
    if budget is None:
        return int(min(DEFAULT_MAX_STATES, max(256, 16 * 2 ** 20 // (8 * (n + 1)))))
    return int(budget)


class StiffSpec(Protocol):
    """The static half of one differentiable stiff solve (hashable: it keys JAX's
    caches, so it should compare by value, not by identity)."""

    capacity: int  # M: accepted steps the record holds
    # machine epsilon of the user's state dtype: the right-hand side computes in it, so
    # Newton on the stages converges to it (float32 states cannot reach float64's eps)
    eps: float
    # the solve's absolute tolerance: a floor for Newton's corrections on the stages
    # where the state is near zero but the right-hand side rounds terms of size one
    atol: float

    def fun(self, t: Any, y: Any, params: Any, fixed: Any) -> Any:
        """The right-hand side on flat states, (n,)."""

    def solve(self, t0: Any, t1: Any, y0: Any, t_eval: Any, params: Any, fixed: Any,
              jac_ops: Any) -> tuple:
        """The forward solve: (ys (T, n), stats (5,))."""

    def record(self, t0: Any, t1: Any, y0: Any, t_eval: Any, params: Any, fixed: Any,
               jac_ops: Any) -> tuple:
        """The same, plus SciPy's steps: (ys, stats, grid_t (M+1,), grid_y (M+1, n))."""


class _Step:
    """One Radau IIA step of `fun` from (t, y) with step h, at the converged stages."""

    def __init__(self, fun: Callable[[Any, Any, Any], Any], t: Any, h: Any, y: Any,
                 guess: Any, p: Any, eps: float, atol: float) -> None:
        self.fun, self.t, self.h, self.y, self.p = fun, t, h, y, p
        self.A = jnp.asarray(A_RADAU, y.dtype)
        self.ts = t + jnp.asarray(C_RADAU, y.dtype) * h
        n = y.shape[0]
        self.n = n
        # Newton from the stored end state (Z_3 = y_{k+1} - y_k for Radau itself)
        z0 = jnp.asarray(C_RADAU, y.dtype)[:, None] * (guess - y)[None, :]

        def body(c: Any) -> Any:
            z, it, _ = c
            dz = jnp.linalg.solve(self.matrix(z), -jnp.ravel(self.residual(z, y, p)))
            return z + dz.reshape(3, n), it + 1, jnp.max(jnp.abs(dz))

        # Relative to the state, with an absolute floor far below the solve's accuracy:
        # near an equilibrium at zero (y' = 1 - exp(y)) the state is ~1e-9 but `fun`
        # rounds terms of size one, so the corrections stall near h eps, and a purely
        # relative test would call every step unconverged (a NaN derivative).
        floor = NEWTON_ATOL_FRACTION * atol

        def more(c: Any) -> Any:
            z, it, err = c
            size = jnp.max(jnp.abs(z)) + jnp.max(jnp.abs(y))
            return (it < NEWTON_MAX_ITER) & (err > jnp.maximum(16 * eps * size, floor))

        z, it, err = loops.while_loop(more, body, (z0, jnp.asarray(0), jnp.asarray(jnp.inf,
                                                                                       y.dtype)))
        self.z = z
        size = jnp.max(jnp.abs(z)) + jnp.max(jnp.abs(y))
        # not converged: the derivative is NaN (never a silent wrong value)
        self.ok = err <= jnp.maximum(1e3 * eps * size, floor)
        self.M = self.matrix(z)

    def forcing(self, z: Any, y: Any, p: Any) -> Any:
        """h (A (x) I) F(t + c h, y + Z)."""
        F = jax.vmap(lambda t, u: self.fun(t, u, p))(self.ts, y[None, :] + z)
        return self.h * (self.A @ F)

    def residual(self, z: Any, y: Any, p: Any) -> Any:
        return z - self.forcing(z, y, p)

    def matrix(self, z: Any) -> Any:
        """G_Z = I - h (A (x) I) blockdiag(J_j), (3n, 3n)."""
        n = self.n
        J = jax.vmap(lambda t, u: jax.jacfwd(lambda v: self.fun(t, v, self.p))(u))(
            self.ts, self.y[None, :] + z)                                  # (3, n, n)
        blocks = self.h * jnp.einsum("ij,jab->iajb", self.A, J).reshape(3 * n, 3 * n)
        return jnp.eye(3 * n, dtype=z.dtype) - blocks

    def tangent(self, dy: Any, dp: Any) -> Any:
        """dZ (3, n) for tangents (dy, dp) of (y, p)."""
        _, rhs = jax.jvp(lambda y, p: self.forcing(self.z, y, p), (self.y, self.p), (dy, dp))
        return jnp.linalg.solve(self.M, jnp.ravel(rhs)).reshape(3, self.n)

    def adjoint(self, zbar: Any) -> tuple[Any, Any]:
        """(ybar, pbar) from the cotangent zbar (3, n) of Z (through G(Z, y, p) = 0)."""
        lam = jnp.linalg.solve(self.M.T, jnp.ravel(zbar)).reshape(3, self.n)
        _, pullback = jax.vjp(lambda y, p: self.forcing(self.z, y, p), self.y, self.p)
        return pullback(lam)


def _dense_weights(t_eval: Any, t: Any, t_next: Any, h: Any, first: Any, direction: Any
                   ) -> tuple[Any, Any]:
    """(covers (T,), D (T, 3)): which outputs this step holds, and y(t_i) = y_k + D_i Z."""
    covers = (direction * (t_eval - t_next) <= 0) & (first | (direction * (t_eval - t) > 0))
    x = (t_eval - t) / h
    xp = x[:, None] ** jnp.arange(1, 4, dtype=x.dtype)[None, :]
    D = xp @ jnp.asarray(P_RADAU, x.dtype).T
    return covers, jnp.where(covers[:, None], D, 0.0)


class _Record(NamedTuple):
    """SciPy's accepted steps, as the forward host call recorded them."""

    grid_t: Any   # (M+1,) step times, padded with the last
    grid_y: Any   # (M+1, n) states at them
    n_steps: Any  # accepted steps (at most M)


def _tangent_outputs(spec: StiffSpec, fun: Callable, record: _Record, t_eval: Any,
                     params: Any, dy0: Any, dp: Any) -> Any:
    """Forward mode: d y(t_eval) (T, n) for tangents (dy0, dp), step by step from t0."""
    grid_t, grid_y, n_steps = record
    eps, atol = spec.eps, spec.atol
    T, n = t_eval.shape[0], dy0.shape[0]
    direction = jnp.where(grid_t[-1] >= grid_t[0], 1.0, -1.0).astype(t_eval.dtype)
    outs = jnp.broadcast_to(dy0, (T, n)) * (n_steps == 0)

    def body(c: Any) -> Any:
        k, dy, outs = c
        t, t_next = grid_t[k], grid_t[k + 1]
        h = t_next - t
        step = _Step(fun, t, h, grid_y[k], grid_y[k + 1], params, eps, atol)
        dz = step.tangent(dy, dp)
        dz = jnp.where(step.ok, dz, jnp.nan)
        covers, D = _dense_weights(t_eval, t, t_next, h, k == 0, direction)
        outs = jnp.where(covers[:, None], dy[None, :] + D @ dz, outs)
        return k + 1, dy + dz[-1], outs

    return loops.while_loop(lambda c: c[0] < n_steps, body, (jnp.asarray(0), dy0, outs))[2]


def _adjoint(spec: StiffSpec, fun: Callable, record: _Record, t_eval: Any, params: Any,
             ct: Any) -> tuple[Any, Any]:
    """Reverse mode (the discrete adjoint): (dL/dy0, dL/dparams) for output cotangents
    ct (T, n), sweeping the accepted steps backward."""
    grid_t, grid_y, n_steps = record
    eps, atol = spec.eps, spec.atol
    direction = jnp.where(grid_t[-1] >= grid_t[0], 1.0, -1.0).astype(t_eval.dtype)
    n = grid_y.shape[1]

    def body(c: Any) -> Any:
        k, a, mu = c
        t, t_next = grid_t[k], grid_t[k + 1]
        h = t_next - t
        step = _Step(fun, t, h, grid_y[k], grid_y[k + 1], params, eps, atol)
        covers, D = _dense_weights(t_eval, t, t_next, h, k == 0, direction)
        g = jnp.where(covers[:, None], ct, 0.0)
        zbar = D.T @ g
        zbar = zbar.at[-1].add(a)
        ybar, pbar = step.adjoint(zbar)
        a_new = a + jnp.sum(g, axis=0) + ybar
        a_new = jnp.where(step.ok, a_new, jnp.nan)
        return k - 1, a_new, jax.tree_util.tree_map(jnp.add, mu, pbar)

    mu0 = jax.tree_util.tree_map(jnp.zeros_like, params)
    _, a, mu = loops.while_loop(lambda c: c[0] >= 0, body,
                                  (n_steps - 1, jnp.zeros(n, ct.dtype), mu0))
    # no step at all: the outputs are y0 itself
    return a + jnp.where(n_steps == 0, jnp.sum(ct, axis=0), 0.0), mu


def _bound(spec: StiffSpec, fixed: Any) -> Callable[[Any, Any, Any], Any]:
    return lambda t, y, p: spec.fun(t, y, p, fixed)


@functools.partial(jax.custom_jvp, nondiff_argnums=(0,))
def differentiable_solve(spec: StiffSpec, t0: Any, t1: Any, y0: Any, t_eval: Any,
                         params: Any, fixed: Any, jac_ops: Any) -> tuple:
    """`spec.solve(t0, t1, y0 (n,), t_eval, params, fixed, jac_ops)` -> (ys (T, n),
    stats), with derivatives from the recorded steps (see the module docstring) in
    t0, y0, t_eval and params. Under differentiation stats[0] is -2 when the solve took
    more accepted steps than the record holds (`spec.capacity`); the outputs are then
    NaN."""
    return spec.solve(t0, t1, y0, t_eval, params, fixed, jac_ops)


@differentiable_solve.defjvp
def _differentiable_solve_jvp(spec: StiffSpec, primals: tuple, tangents: tuple) -> tuple:
    t0, t1, y0, t_eval, params, fixed, jac_ops = loops.join(primals)  # (shard_map)
    dt0, _, dy0, dt_eval, dparams, _, _ = tangents
    ys, stats, grid_t, grid_y = spec.record(t0, t1, y0, t_eval, params, fixed, jac_ops)
    n_steps = stats[4]
    bad = (stats[0] != 0) | (n_steps > spec.capacity)
    stats = stats.at[0].set(jnp.where(n_steps > spec.capacity, -2, stats[0]))
    ys = jnp.where(bad, jnp.nan, ys)
    n_steps = jnp.minimum(n_steps, spec.capacity)
    record = _Record(grid_t, grid_y, n_steps)
    fun = _bound(spec, fixed)
    dtype = y0.dtype
    n = y0.shape[0]
    flat_p, unravel = ravel_pytree(params)
    P = flat_p.size
    f0 = fun(t0.astype(dtype), y0, params)
    f_out = jax.vmap(lambda t, y: fun(t, y, params))(t_eval.astype(dtype), ys)  # (T, n)

    def flat(x: Any, like: Any) -> Any:
        return jnp.ravel(jnp.asarray(x, like.dtype)).astype(dtype)

    b = jnp.concatenate([flat(dt0, t0), flat(dy0, y0),
                         ravel_pytree(jax.tree_util.tree_map(flat, dparams, params))[0]
                         .astype(dtype), flat(dt_eval, t_eval)])

    def split(v: Any) -> tuple:
        return v[0], v[1:1 + n], v[1 + n:1 + n + P], v[1 + n + P:]

    def forward(v: Any) -> Any:
        d0, dy, dp, dte = split(v)
        core = _tangent_outputs(spec, fun, record, t_eval, params, dy - f0 * d0,
                                unravel(dp.astype(flat_p.dtype)))
        return jnp.where(bad, jnp.nan, core + f_out * dte[:, None])

    def transpose(c: Any) -> Any:
        a, mu_tree = _adjoint(spec, fun, record, t_eval, params, c)
        a = jnp.where(bad, jnp.nan, a)
        mu = jnp.where(bad, jnp.nan, ravel_pytree(mu_tree)[0].astype(dtype))
        return jnp.concatenate([-(a @ f0)[None], a, mu, jnp.sum(c * f_out, axis=1)])

    dys = linear_with_transpose(forward, transpose, b, ys)
    return (ys, stats), (dys, loops.no_tangent(stats))
