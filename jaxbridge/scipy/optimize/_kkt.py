"""minimize with constraints on the host: the constraint rows, the active set at x*, the KKT solve.

Every constraint, bounds included, is a row of ``lo <= g(x) <= hi`` with
``g = [x, user constraints]``, ``lo = [lb, ...]``, ``hi = [ub, ...]``. At x* a row is
an equality (``lo == hi``), active at its lower or upper limit (`side` -1/+1), or
inactive (0). With the multipliers `lam` (signed: stationarity is
``grad f(x*) = J(x*)^T lam``), x* and lam solve

    R(x, lam, theta) = [grad f(x) - J(x)^T lam,  g_i(x) - limit_i on active rows,
                        lam_i on inactive rows] = 0,

`theta` being the parameters (`args`, closures) and the bounds. `dR/d(x, lam)` is the
KKT matrix ``[[H, -J_A^T], [J_A, 0]]`` (H the exact Hessian of the Lagrangian
``f - lam . g``), with the identity on inactive rows; the implicit function theorem
gives ``d(x, lam) = -(dR/d(x, lam))^{-1} dR/dtheta dtheta``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import scipy.linalg

from .._common import const, f64, failure, host_copies, host_jit, jnp_ravel, tangent_like
from ._options import SolveOptions

#: A limit within this distance of g(x*) (relative to 1 + |limit|) is a candidate for
#: the active set (kept if its multiplier holds x* there): SLSQP lands on its active
#: constraints; trust-constr, an interior method, stops up to 1e-5 inside them.
_NEAR = 1e-3
#: A multiplier under this (relative to 1 + |grad f|) is zero; a zero multiplier on a
#: limit that holds to `_TIGHT` (relative) violates strict complementarity.
_ZERO_MULTIPLIER = 1e-7
_TIGHT = 1e-9
#: Stationarity must hold at x* to this (relative) precision for the KKT solve to mean
#: anything: a solver stopped early gives derivatives of a point that is not a solution.
_STATIONARY = 1e-4


class KKT:
    """The constraint rows of one constrained minimize, their JAX derivatives and solves.

    `primals` are the solve's inputs `(x0, lb, ub, params, fixed, jac_ops)`; `params`
    and `fixed` hold the objective's operands, then the constraints'.
    """

    def __init__(self, primals: tuple, opts: SolveOptions) -> None:
        x0, lb, ub, params, fixed, _ = primals
        self.name = opts.qualname
        self.params, self.fixed = host_copies((params, fixed))
        self.lb, self.ub = np.ravel(f64(lb)), np.ravel(f64(ub))
        shape, dtype = tuple(x0.shape), np.dtype(x0.dtype)
        key = ("kkt", opts.fun, opts.constraints[0], shape, dtype)
        roles = _roles(opts, shape, dtype)
        self._j = {r: host_jit(key + (r,), const(g)) for r, g in roles.items()}

    def __call__(self, role: str, x: np.ndarray, *xs: Any) -> Any:
        out = self._j[role](self.fixed, x, self.params, self.lb, self.ub, *xs)
        return jax.tree_util.tree_map(f64, out)

    def active_set(self, x: np.ndarray, on_failure: str) -> tuple[np.ndarray, np.ndarray] | None:
        """(side, lam) at x*: each row's side (-1 lower or equality, +1 upper, 0 inactive)
        and its multiplier (least squares on stationarity, rows of the wrong sign or zero
        multiplier dropped); None (on_failure "nan") or SolverError at a degenerate x*."""
        g, lo, hi = self("rows", x)
        grad, J = self("grad", x), self("rows_jac", x)
        eq = np.isfinite(lo) & (lo == hi)
        dist_lo, dist_hi = g - lo, hi - g
        near_lo = ~eq & (dist_lo <= _NEAR * _scale(lo))
        near_hi = ~eq & ~near_lo & (dist_hi <= _NEAR * _scale(hi))
        side = np.where(near_hi, 1, np.where(eq | near_lo, -1, 0)).astype(np.int8)
        dist = np.where(side > 0, dist_hi / _scale(hi), dist_lo / _scale(lo))
        zero = _ZERO_MULTIPLIER * (1 + np.max(np.abs(grad), initial=0.0))
        while True:
            lam = _least_squares(J, grad, side != 0)
            held = ~eq & (side != 0)
            push = side * lam  # > 0: the row would pull x* out of the feasible set
            wrong = held & (push > zero)
            if wrong.any():  # not active after all: drop the worst, solve again
                side[np.argmax(np.where(wrong, push, -np.inf))] = 0
                continue
            idle = held & (np.abs(lam) <= zero) & (dist > _TIGHT)
            if not idle.any():
                break
            side[idle] = 0  # near, but not held: inactive
        return self._checked(side, lam, (J, grad, eq, dist, zero), on_failure)

    def _checked(self, side: np.ndarray, lam: np.ndarray, facts: tuple,
                 on_failure: str) -> tuple[np.ndarray, np.ndarray] | None:
        """(side, lam), or the reason the KKT system at x* has no unique derivative."""
        J, grad, eq, dist, zero = facts
        act = side != 0
        weak = np.flatnonzero(~eq & act & (np.abs(lam) <= zero))
        residual = np.max(np.abs(grad - J[act].T @ lam[act]), initial=0.0)
        sv = np.linalg.svd(J[act], compute_uv=False) if act.any() else np.ones(1)
        why = None
        if weak.size:
            why = (f"strict complementarity fails: constraint row(s) {weak.tolist()} hold "
                   f"at x* with a zero multiplier (x* is not differentiable there)")
        elif act.sum() > J.shape[1] or np.min(sv) <= 1e-10 * max(np.max(sv), 1.0):
            why = ("the active constraints are linearly dependent at x* (their "
                   "multipliers, and so the derivative, are not unique)")
        elif residual > _STATIONARY * (1 + np.max(np.abs(grad), initial=0.0)):
            why = (f"x* is not a stationary point of the Lagrangian (residual "
                   f"{residual:.1e}); tighten `tol`")
        if why is None:
            return side, lam
        if on_failure == "raise":
            raise failure(self.name, f"implicit differentiation with constraints: {why}")
        return None

    def solve(self, x: np.ndarray, lam: np.ndarray, side: np.ndarray, rhs: np.ndarray,
              transpose: bool, on_failure: str) -> np.ndarray:
        """z with (dR/d(x, lam))^{T if transpose} z = rhs (dense)."""
        K = self("kkt_jac", x, lam, side.astype(np.float64))
        try:
            z = scipy.linalg.solve(K.T if transpose else K, rhs)
        except (scipy.linalg.LinAlgError, ValueError) as exc:
            if on_failure == "raise":
                raise failure(self.name, f"implicit differentiation with constraints: "
                              f"singular KKT matrix ({exc}); second-order conditions fail "
                              f"at x*") from None
            z = np.full(rhs.size, np.nan)
        return z


def _scale(limit: np.ndarray) -> np.ndarray:
    return 1 + np.abs(np.where(np.isfinite(limit), limit, 0))


def _least_squares(J: np.ndarray, grad: np.ndarray, act: np.ndarray) -> np.ndarray:
    """The multipliers of the rows `act` minimizing |grad - J_act^T lam|; 0 elsewhere."""
    lam = np.zeros(J.shape[0])
    if act.any():
        lam[act] = scipy.linalg.lstsq(J[act].T, grad)[0]
    return lam


def _roles(opts: SolveOptions, shape: tuple, xdtype: Any) -> dict[str, Callable]:
    """The JAX functions of `(fixed, x, params, lb, ub, ...)` a KKT jits, by role."""
    fun, cons = opts.fun, opts.constraints[0]
    n_diff = sum(fun.diff)
    n_fixed = len(fun.diff) - n_diff

    def f(fx: Any, x: Any, p: Any) -> Any:
        out = fun(fun.merge(p, fx), x.reshape(shape).astype(xdtype))
        return jnp.sum(out[0] if isinstance(out, tuple) else out).astype(x.dtype)

    def user_rows(fx: Any, x: Any, p: Any) -> Any:
        ops = cons.merge(p[n_diff:], fx[n_fixed:])
        return tuple(v.astype(x.dtype) for v in cons(ops, x.reshape(shape).astype(xdtype)))

    def rows(fx: Any, x: Any, p: Any, lb: Any, ub: Any) -> Any:
        g, lo, hi = user_rows(fx, x, p)
        return (jnp.concatenate([x, g]), jnp.concatenate([lb, lo]), jnp.concatenate([ub, hi]))

    def residual(fx: Any, x: Any, p: Any, lb: Any, ub: Any, lam: Any, side: Any) -> Any:
        g_of_x = lambda x: rows(fx, x, p, lb, ub)[0]  # noqa: E731
        g, pullback = jax.vjp(g_of_x, x)
        _, lo, hi = rows(fx, x, p, lb, ub)
        limit = jnp.where(side > 0, hi, lo)
        limit = jnp.where(side != 0, limit, 0.0)  # (inactive limits may be infinite)
        stationarity = jax.grad(f, argnums=1)(fx, x, p) - pullback(lam)[0]
        return jnp.concatenate([stationarity, jnp.where(side != 0, g - limit, lam)])

    def kkt_jac(fx: Any, x: Any, p: Any, lb: Any, ub: Any, lam: Any, side: Any) -> Any:
        n = x.size
        R = lambda z: residual(fx, z[:n], p, lb, ub, z[n:], side)  # noqa: E731
        return jax.jacfwd(R)(jnp.concatenate([x, lam]))

    def theta_vjp(fx: Any, x: Any, p: Any, lb: Any, ub: Any, lam: Any, side: Any,
                  w: Any) -> Any:
        R = lambda th: residual(fx, x, th[0], th[1], th[2], lam, side)  # noqa: E731
        p_bar, lb_bar, ub_bar = jax.vjp(R, (p, lb, ub))[1](w)[0]
        return jnp_ravel(p_bar), lb_bar, ub_bar

    def theta_jvp(fx: Any, x: Any, p: Any, lb: Any, ub: Any, lam: Any, side: Any,
                  dp: Any, dlb: Any, dub: Any) -> Any:
        R = lambda th: residual(fx, x, th[0], th[1], th[2], lam, side)  # noqa: E731
        return jax.jvp(R, ((p, lb, ub),), ((tangent_like(dp, p), dlb, dub),))[1]

    return dict(
        rows=rows, rows_jac=lambda fx, x, p, lb, ub: jax.jacfwd(
            lambda x: rows(fx, x, p, lb, ub)[0])(x),
        grad=lambda fx, x, p, lb, ub: jax.grad(f, argnums=1)(fx, x, p),
        user_rows=lambda fx, x, p, lb, ub: user_rows(fx, x, p),
        user_jac=lambda fx, x, p, lb, ub: jax.jacfwd(lambda x: user_rows(fx, x, p)[0])(x),
        kkt_jac=kkt_jac, theta_vjp=theta_vjp,
        theta_jvp=theta_jvp)
