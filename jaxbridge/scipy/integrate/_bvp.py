"""`scipy.integrate.solve_bvp`, differentiable by the implicit function theorem.

SciPy solves the boundary-value problem on the host (its own collocation, mesh
refinement and Newton iterations; `fun` and `bc` written in JAX, their exact Jacobians
from JAX). At convergence the solution `Z = (y at the final mesh nodes, p)` is a root
of SciPy's collocation system on that mesh (4th-order Lobatto IIIA):

    y_{i+1} - y_i - h_i/6 (f_i + f_{i+1} + 4 f(x_i + h_i/2, y_mid_i)) = 0,
    y_mid_i = (y_i + y_{i+1})/2 - h_i/8 (f_{i+1} - f_i),
    bc(y_0, y_{m-1}, p) = 0,

so `dZ = -(dR/dZ)^{-1} dR/dθ dθ`: one sparse LU of SciPy's own collocation Jacobian
(block bidiagonal plus the boundary rows) per tangent or adjoint, whatever the number
of Newton iterations. θ is everything `fun` and `bc` close over (or take from
SciPy's `p`-free arguments), and the interval's ends `x[0]`, `x[-1]` (the final mesh
scales with them; interior nodes of the initial mesh and the guess do not change the
solution, so their derivative is zero). The final mesh size is data dependent: the
results are padded to `max_nodes` (SciPy's own bound on the mesh), the count is
`n_nodes`. Host-side functions are evaluated on arrays padded to `max_nodes`, so they
compile once.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
import scipy.integrate
import scipy.sparse
import scipy.sparse.linalg

from ... import _foreign
from .._common import (
    Result,
    check_policy,
    check_real,
    const,
    f64,
    failure,
    fill_zeros,
    host_copies,
    host_jit,
    on_cpu,
    unsupported,
)
from .._numpy_functions import runs_as_scipy
from .._trace import HostFun, array_aval, convert
from ._numpy_fallback import SOLVE_BVP

__all__ = ["solve_bvp", "BvpResult", "BvpSolution"]

NAME = "integrate.solve_bvp"
sg = jax.lax.stop_gradient

MESSAGES = {
    0: "The algorithm converged to the desired accuracy.",
    1: "The maximum number of mesh nodes is exceeded.",
    2: "A singular Jacobian encountered when solving the collocation system.",
    3: "The solver was unable to satisfy boundary conditions tolerance on iteration 10.",
}


class BvpResult(Result):
    """What :func:`solve_bvp` returns: SciPy's fields with static shapes.

    `x` (max_nodes,) the final mesh, `y` (n, max_nodes), `yp` (n, max_nodes), NaN past
    `n_nodes`; `p` the unknown parameters (None without them); `sol` a
    :class:`BvpSolution` (SciPy's cubic spline, a JAX function); `rms_residuals`
    (max_nodes - 1,), `niter`, `status`, `success`.
    """

    _fields = ("sol", "p", "x", "y", "yp", "rms_residuals", "niter", "status", "success",
               "n_nodes")
    _messages: ClassVar[dict[int, str]] = MESSAGES


class BvpSolution:
    """`sol.sol` of :func:`solve_bvp`: SciPy's C1 cubic spline through `(x_i, y_i)` with
    slopes `fun(x_i, y_i, p)`, evaluated in JAX (jit, grad, vmap); `sol(x)` has shape
    `(n,)` for a scalar `x`, `(n, len(x))` for a 1-D one, as in SciPy. `sol(x, nu)` is
    its `nu`-th derivative in `x` (a static int >= 0; zero past the third), as SciPy's
    `PPoly` gives it; past the mesh the end pieces extrapolate, as in SciPy.

    Example:
      >>> import jax.numpy as jnp
      >>> from jaxbridge.scipy.integrate import solve_bvp
      >>> res = solve_bvp(lambda x, y: jnp.stack([y[1], -y[0]]),
      ...                 lambda ya, yb: jnp.stack([ya[0], yb[0] - 1.0]),
      ...                 jnp.linspace(0.0, 1.0, 5), jnp.zeros((2, 5)), tol=1e-8)
      >>> print(f"{float(res.sol(0.5)[0]):.5f}")  # sin(x) / sin(1)
      0.56975
      >>> print(f"{float(res.sol(0.5, 1)[0]):.5f}")  # cos(x) / sin(1)
      1.04291
    """

    def __init__(self, x: Any, y: Any, yp: Any, n_nodes: Any) -> None:
        self.x, self.y, self.yp, self.n_nodes = x, y, yp, n_nodes  # y, yp: (M, n)

    def _single(self, t: Any, nu: int) -> Any:
        m, size = self.n_nodes, self.x.shape[0]
        xs = jnp.where(jnp.arange(size) < m, self.x, jnp.inf)
        i = jnp.clip(jnp.searchsorted(xs, sg(t), side="right") - 1, 0, m - 2)
        xa, xb = self.x[i], self.x[i + 1]
        h = xb - xa
        s = (t - xa) / h
        ya, yb, da, db = self.y[i], self.y[i + 1], h * self.yp[i], h * self.yp[i + 1]
        # the piece in powers of s (Hermite's form, expanded): c0 + c1 s + c2 s^2 + c3 s^3
        coeffs = [ya, da, 3 * (yb - ya) - 2 * da - db, 2 * (ya - yb) + da + db]
        for _ in range(nu):  # d/dx = (1/h) d/ds
            coeffs = [k * c / h for k, c in enumerate(coeffs)][1:]
        value = jnp.zeros_like(ya)
        for c in reversed(coeffs):  # Horner
            value = value * s + c
        return value

    def __call__(self, x: Any, nu: int = 0) -> jax.Array:
        if isinstance(nu, bool) or not isinstance(nu, (int, np.integer)):
            raise TypeError(f"jaxbridge.scipy.integrate.solve_bvp: sol(x, nu): nu must be "
                            f"an int (the order of the derivative, static), got {nu!r}")
        if nu < 0:
            raise NotImplementedError(
                "jaxbridge.scipy.integrate.solve_bvp: sol(x, nu) with nu < 0 (SciPy's "
                f"antiderivative) is not supported; got nu={nu}")
        x = jnp.asarray(x, self.x.dtype)
        if x.ndim == 0:
            return self._single(x, int(nu))
        return jax.vmap(lambda t: self._single(t, int(nu)), out_axes=1)(x)


jax.tree_util.register_pytree_node(
    BvpSolution, lambda s: ((s.x, s.y, s.yp, s.n_nodes), None),
    lambda _, leaves: BvpSolution(*leaves))


# ------------------------------------------------------------------ host side
class _Host:
    """NumPy callables for SciPy and the collocation system's derivatives, compiled
    once per (fun, bc, sizes) on arrays padded to `size` points."""

    def __init__(self, st: BvpConfig, fun_ops: tuple, bc_ops: tuple) -> None:
        fun, bc, n, k = st.fun, st.bc, st.n, st.k
        self.n, self.k, self.st = n, k, st
        self.f_diff, self.f_fixed = host_copies(fun_ops)
        self.b_diff, self.b_fixed = host_copies(bc_ops)
        key = ("bvp", fun, bc, n, k)

        def F(fd: Any, ff: Any, x: Any, y: Any, p: Any) -> Any:
            ops = fun.merge(fd, ff)
            return (fun(ops, x, y, p) if k else fun(ops, x, y)).astype(y.dtype)

        def BC(bd: Any, bf: Any, ya: Any, yb: Any, p: Any) -> Any:
            ops = bc.merge(bd, bf)
            return (bc(ops, ya, yb, p) if k else bc(ops, ya, yb)).astype(ya.dtype)

        def col(fd: Any, ff: Any, xa: Any, xb: Any, ya: Any, yb: Any, p: Any) -> Any:
            h = xb - xa
            fa, fb = F(fd, ff, xa, ya, p), F(fd, ff, xb, yb, p)
            ym = 0.5 * (ya + yb) - 0.125 * h * (fb - fa)
            fm = F(fd, ff, xa + 0.5 * h, ym, p)
            return yb - ya - h / 6 * (fa + fb + 4 * fm)

        def residual(fd: Any, ff: Any, bd: Any, bf: Any, x: Any, Y: Any, p: Any) -> Any:
            c = jax.vmap(col, (None, None, 0, 0, 0, 0, None))(fd, ff, x[:-1], x[1:], Y[:-1],
                                                              Y[1:], p)
            return jnp.concatenate([jnp.ravel(c), BC(bd, bf, Y[0], Y[-1], p)])

        def blocks(fd: Any, ff: Any, bd: Any, bf: Any, x: Any, Y: Any, p: Any) -> Any:
            jc = jax.vmap(jax.jacfwd(col, argnums=(4, 5, 6)), (None, None, 0, 0, 0, 0, None))
            A, B, C = jc(fd, ff, x[:-1], x[1:], Y[:-1], Y[1:], p)
            Da, Db, Dp = jax.jacfwd(BC, argnums=(2, 3, 4))(bd, bf, Y[0], Y[-1], p)
            return A, B, C, Da, Db, Dp

        def tangent(fd: Any, ff: Any, bd: Any, bf: Any, x: Any, Y: Any, p: Any, dfd: Any,
                    dbd: Any, dx: Any) -> Any:
            return jax.jvp(lambda fd, bd, x: residual(fd, ff, bd, bf, x, Y, p),
                           (fd, bd, x), (dfd, dbd, dx))[1]

        def adjoint(fd: Any, ff: Any, bd: Any, bf: Any, x: Any, Y: Any, p: Any, lam: Any
                    ) -> Any:
            _, pull = jax.vjp(lambda fd, bd, x: residual(fd, ff, bd, bf, x, Y, p), fd, bd, x)
            return pull(lam)

        def fv(fd: Any, ff: Any, x: Any, y: Any, p: Any) -> Any:  # (m,), (m, n)
            return jax.vmap(F, (None, None, 0, 0, None))(fd, ff, x, y, p)

        def fv_jac(fd: Any, ff: Any, x: Any, y: Any, p: Any) -> Any:
            return jax.vmap(jax.jacfwd(F, argnums=(3, 4)), (None, None, 0, 0, None))(
                fd, ff, x, y, p)

        def bc_jac(bd: Any, bf: Any, ya: Any, yb: Any, p: Any) -> Any:
            return jax.jacfwd(BC, argnums=(2, 3, 4))(bd, bf, ya, yb, p)

        roles = {"F": fv, "F_jac": fv_jac, "BC": BC, "BC_jac": bc_jac, "blocks": blocks,
                 "tangent": tangent, "adjoint": adjoint}
        self._j = {r: host_jit(key + (r,), const(g)) for r, g in roles.items()}

    def _padded(self, role: str, x: np.ndarray, y: np.ndarray, p: np.ndarray) -> Any:
        m = x.shape[0]
        size = max(self.st.max_nodes, 1 << max(m - 1, 0).bit_length())
        xp = np.concatenate([x, np.full(size - m, x[-1] if m else 0.0)])
        yp = np.concatenate([y, np.zeros((size - m, self.n))])
        out = self._j[role](self.f_diff, self.f_fixed, xp, yp, p)
        return jax.tree_util.tree_map(lambda a: f64(a)[:m], out)

    # SciPy-facing (vectorized: x (m,), y (n, m))
    def fun(self, x: np.ndarray, y: np.ndarray, p: Any = None) -> np.ndarray:
        return self._padded("F", x, y.T, self._p(p)).T

    def fun_jac(self, x: np.ndarray, y: np.ndarray, p: Any = None) -> Any:
        jy, jp = self._padded("F_jac", x, y.T, self._p(p))
        jy, jp = np.moveaxis(jy, 0, -1), np.moveaxis(jp, 0, -1)
        return (jy, jp) if self.k else jy

    def bc(self, ya: np.ndarray, yb: np.ndarray, p: Any = None) -> np.ndarray:
        return f64(self._j["BC"](self.b_diff, self.b_fixed, ya, yb, self._p(p)))

    def bc_jac(self, ya: np.ndarray, yb: np.ndarray, p: Any = None) -> Any:
        da, db, dp = (f64(a) for a in self._j["BC_jac"](self.b_diff, self.b_fixed, ya, yb,
                                                         self._p(p)))
        return (da, db, dp) if self.k else (da, db)

    def _p(self, p: Any) -> np.ndarray:
        return np.zeros(0) if p is None else np.asarray(p, np.float64)

    def args(self, x: np.ndarray, Y: np.ndarray, p: np.ndarray) -> tuple:
        return (self.f_diff, self.f_fixed, self.b_diff, self.b_fixed, x, Y, p)

    def jacobian(self, x: np.ndarray, Y: np.ndarray, p: np.ndarray) -> Any:
        """SciPy's collocation Jacobian d(residuals)/d(Y, p) at the padded solution
        (padded intervals have h = 0, so they read y_{i+1} = y_i: still square and
        nonsingular), as a sparse CSC matrix."""
        n, k = self.n, self.k
        M = x.shape[0]
        A, B, C, Da, Db, Dp = (f64(a) for a in self._j["blocks"](*self.args(x, Y, p)))
        rows, cols, vals = [], [], []
        r = (np.arange(M - 1)[:, None, None] * n + np.arange(n)[None, :, None])
        c = np.arange(n)[None, None, :]
        for block, offset in ((A, 0), (B, n)):
            rows.append(np.broadcast_to(r, block.shape).ravel())
            cols.append(np.broadcast_to(r - np.arange(n)[None, :, None] + c + offset,
                                        block.shape).ravel())
            vals.append(block.ravel())
        if k:
            rows.append(np.broadcast_to(r, C.shape).ravel())
            cols.append(np.broadcast_to(n * M + np.arange(k)[None, None, :], C.shape).ravel())
            vals.append(C.ravel())
        rb = (M - 1) * n + np.arange(n + k)[:, None]
        for block, start in ((Da, 0), (Db, (M - 1) * n), (Dp, n * M)):
            if block.size:
                rows.append(np.broadcast_to(rb, block.shape).ravel())
                cols.append(np.broadcast_to(start + np.arange(block.shape[1])[None, :],
                                            block.shape).ravel())
                vals.append(block.ravel())
        N = n * M + k
        return scipy.sparse.csc_matrix(
            (np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))), shape=(N, N))


def _result(x: Any, y: Any, p: Any, fun_ops: Any, bc_ops: Any, *, st: BvpConfig) -> Any:
    M, n, k = st.max_nodes, st.n, st.k
    dt = y.dtype
    return {"x": jax.ShapeDtypeStruct((M,), dt), "Y": jax.ShapeDtypeStruct((M, n), dt),
            "p": jax.ShapeDtypeStruct((k,), dt), "rms": jax.ShapeDtypeStruct((M - 1,), dt),
            "stats": jax.ShapeDtypeStruct((3,), jnp.int32)}  # status, niter, n_nodes


@dataclasses.dataclass(frozen=True)
class BvpConfig:
    """Everything static about one `solve_bvp` call (hashable: the host call's key)."""

    fun: HostFun           # fun(x, y[, p]) at one point
    bc: HostFun            # bc(ya, yb[, p])
    n: int                 # the state size
    k: int                 # the number of unknown parameters p
    tol: float
    max_nodes: int         # also the padded results' static length
    bc_tol: float | None
    on_failure: str


def _pad(a: np.ndarray, size: int) -> np.ndarray:
    return np.concatenate([a, np.repeat(a[-1:], size - a.shape[0], axis=0)])


@_foreign.foreign(_result)
def _bvp(x: Any, y: Any, p: Any, fun_ops: Any, bc_ops: Any, *, st: BvpConfig) -> Any:
    M, n = st.max_nodes, st.n
    with on_cpu():
        host = _Host(st, fun_ops, bc_ops)
        res = scipy.integrate.solve_bvp(
            host.fun, host.bc, f64(x), f64(y), p=f64(p) if st.k else None,
            fun_jac=host.fun_jac, bc_jac=host.bc_jac, tol=st.tol, max_nodes=M,
            bc_tol=st.bc_tol)
    dt = y.dtype
    stats = np.array([res.status, res.niter, res.x.size], np.int32)
    if res.status != 0:
        if st.on_failure == "raise":
            raise failure(NAME, res.message)
        return {"x": np.full(M, np.nan, dt), "Y": np.full((M, n), np.nan, dt),
                "p": np.full(st.k, np.nan, dt), "rms": np.full(M - 1, np.nan, dt),
                "stats": stats}
    rms = np.full(M - 1, np.nan)
    rms[:res.rms_residuals.size] = res.rms_residuals
    return {"x": _pad(res.x, M).astype(dt), "Y": _pad(res.y.T, M).astype(dt),
            "p": (f64(res.p) if st.k else np.zeros(0)).astype(dt), "rms": rms.astype(dt),
            "stats": stats}


def _solution(out: dict) -> np.ndarray:
    return np.concatenate([np.ravel(f64(out["Y"])), f64(out["p"])])


def _x_tangent(x_in: Any, x_out: np.ndarray, dx_in: Any) -> np.ndarray:
    """The final mesh moves with the interval's ends: x_i = a + (b - a) xi_i."""
    if dx_in is None:
        return np.zeros_like(x_out)
    a, b = float(x_in[0]), float(x_in[-1])
    xi = (x_out - a) / (b - a)
    return (1 - xi) * float(dx_in[0]) + xi * float(dx_in[-1])


@_bvp.defjvp
def _bvp_jvp(primals: tuple, out: dict, tangents: tuple, *, st: BvpConfig) -> Any:
    x, y, p, fun_ops, bc_ops = primals
    dx, _, _, dfun, dbc = tangents
    if int(out["stats"][0]) != 0:
        return {"x": None, "Y": np.full_like(out["Y"], np.nan), "p": np.full_like(out["p"], np.nan),
                "rms": None, "stats": None}
    with on_cpu():
        host = _Host(st, fun_ops, bc_ops)
        X, Y, P = f64(out["x"]), f64(out["Y"]), f64(out["p"])
        dX = _x_tangent(x, X, dx)
        d_fd = fill_zeros(None if dfun is None else dfun[0], fun_ops[0])
        d_bd = fill_zeros(None if dbc is None else dbc[0], bc_ops[0])
        rhs = f64(host._j["tangent"](*host.args(X, Y, P), d_fd, d_bd, dX))
        dz = -scipy.sparse.linalg.splu(host.jacobian(X, Y, P)).solve(rhs)
    n, M = st.n, st.max_nodes
    return {"x": dX.astype(out["x"].dtype), "Y": dz[:n * M].reshape(M, n).astype(Y.dtype),
            "p": dz[n * M:].astype(out["p"].dtype), "rms": None, "stats": None}


@_bvp.defvjp
def _bvp_vjp(primals: tuple, out: dict, ct: dict, *, st: BvpConfig) -> Any:
    x, y, p, fun_ops, bc_ops = primals
    zero_guess = (np.zeros_like(y), np.zeros_like(p))
    if int(out["stats"][0]) != 0:
        nan = lambda t: jax.tree_util.tree_map(lambda a: np.full(np.shape(a), np.nan,  # noqa
                                                                 np.asarray(a).dtype), t)
        return (nan(x), *zero_guess, (nan(fun_ops[0]), _none(fun_ops[1])),
                (nan(bc_ops[0]), _none(bc_ops[1])))
    with on_cpu():
        host = _Host(st, fun_ops, bc_ops)
        X, Y, P = f64(out["x"]), f64(out["Y"]), f64(out["p"])
        g = np.concatenate([np.ravel(f64(ct["Y"])), f64(ct["p"])])
        lam = scipy.sparse.linalg.splu(host.jacobian(X, Y, P).T.tocsc()).solve(g)
        fd_bar, bd_bar, X_bar = host._j["adjoint"](*host.args(X, Y, P), -lam)
        X_bar = f64(X_bar) + f64(ct["x"])
        a, b = float(x[0]), float(x[-1])
        xi = (X - a) / (b - a)
        x_bar = np.zeros(np.shape(x))
        x_bar[0] += np.sum((1 - xi) * X_bar)
        x_bar[-1] += np.sum(xi * X_bar)
    return (x_bar.astype(np.asarray(x).dtype), *zero_guess,
            (jax.tree_util.tree_map(lambda v, like: f64(v).astype(np.asarray(like).dtype),
                                    tuple(fd_bar), fun_ops[0]), _none(fun_ops[1])),
            (jax.tree_util.tree_map(lambda v, like: f64(v).astype(np.asarray(like).dtype),
                                    tuple(bd_bar), bc_ops[0]), _none(bc_ops[1])))


def _none(fixed: tuple) -> tuple:
    return tuple(None for _ in fixed)


# ------------------------------------------------------------------ public
def _check_out(hf: HostFun, want: tuple, what: str, call: str) -> None:
    got = [tuple(array_aval(v.aval).shape) for v in hf.jaxpr.outvars]
    if len(got) != 1 or got[0] != want:
        raise ValueError(f"jaxbridge.scipy.{NAME}: `{what}` must return one array of shape "
                         f"{want} per point as {call}; it returned shapes {got}")


@runs_as_scipy(SOLVE_BVP, BvpResult)
def solve_bvp(fun: Callable[..., Any], bc: Callable[..., Any], x: Any, y: Any, p: Any = None,
              S: Any = None, fun_jac: Any = None, bc_jac: Any = None, tol: float = 1e-3,
              max_nodes: int = 1000, verbose: int = 0, bc_tol: float | None = None, *,
              on_failure: str = "raise") -> BvpResult:
    """`scipy.integrate.solve_bvp`, differentiable by the implicit function theorem.

    Same signature and conventions as SciPy: `fun(x, y)` or `fun(x, y, p)`, vectorized
    (`x` (m,), `y` (n, m) -> (n, m)), and `bc(ya, yb)` or `bc(ya, yb, p)` -> (n + k,),
    both written in JAX; they may close over traced values (parameters), whose
    gradients come from one sparse linear solve with the converged collocation
    Jacobian (see the module docstring). Differentiable outputs: `y`, `yp`, `p`,
    `sol(x)` and `x` (with respect to the interval's ends `x[0]`, `x[-1]`); the guess
    `y` and the initial `p` have zero derivative (the solution does not depend on
    them). `fun` must act pointwise (SciPy's vectorized convention requires it).

    Args:
      fun, bc, x, y, p, tol, max_nodes, bc_tol: as in SciPy. `max_nodes` is also the
        static length of the padded results (`n_nodes` says how many are valid).
      S: the singular term is not supported (raises).
      fun_jac, bc_jac: accepted and ignored: SciPy gets JAX's exact Jacobians.
      verbose: accepted and ignored (the solve runs inside a host call).
      on_failure: "raise" (default): a SciPy status other than 0 raises
        `jaxbridge.scipy.SolverError` with SciPy's message; "nan": NaN results and
        gradients, `status` and `success` as SciPy's.

    Returns:
      :class:`BvpResult` (`sol`, `p`, `x`, `y`, `yp`, `rms_residuals`, `niter`,
      `status`, `success`, `n_nodes`).

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from jaxbridge.scipy.integrate import solve_bvp
      >>> def mid(k):  # y'' = -k^2 y, y(0) = 0, y(1) = 1: y = sin(k x) / sin(k)
      ...     res = solve_bvp(lambda x, y: jnp.stack([y[1], -k ** 2 * y[0]]),
      ...                     lambda ya, yb: jnp.stack([ya[0], yb[0] - 1.0]),
      ...                     jnp.linspace(0.0, 1.0, 11), jnp.zeros((2, 11)), tol=1e-8)
      ...     return res.sol(0.5)[0]
      >>> print(f"{float(mid(1.0)):.5f} {float(jax.grad(mid)(1.0)):.5f}")
      0.56975 0.15563
    """
    # Over 80 lines: the docstring documents every option of this public front end.
    check_policy(on_failure, NAME)
    if S is not None:
        raise unsupported(NAME, "S", "the singular term has no derivative rule here; "
                          "write the problem without it")
    del fun_jac, bc_jac, verbose
    for what, v in (("x", x), ("y", y), ("p", p)):
        check_real(v, NAME, what)
    x = jnp.asarray(x)
    y = jnp.asarray(y)
    dtype = jnp.result_type(x.dtype, y.dtype, float)
    x, y = x.astype(dtype), y.astype(dtype)
    if x.ndim != 1 or y.ndim != 2 or y.shape[1] != x.shape[0]:
        raise ValueError(f"jaxbridge.scipy.{NAME}: x must be 1-D (m,) and y (n, m); got "
                         f"x {x.shape}, y {y.shape}")
    if not isinstance(max_nodes, (int, np.integer)) or max_nodes < x.shape[0]:
        raise ValueError(f"jaxbridge.scipy.{NAME}: max_nodes must be an int >= len(x) = "
                         f"{x.shape[0]} (a static size), got {max_nodes!r}")
    n = y.shape[0]
    # (np.ndim: `p` may be a list, as in SciPy, which jnp.ndim deprecates)
    if p is not None and np.ndim(p) != 1:
        raise ValueError(f"jaxbridge.scipy.{NAME}: `p` must be 1-D (one value per unknown "
                         f"parameter), as in SciPy; got shape {np.shape(p)}")
    pa = jnp.zeros(0, dtype) if p is None else jnp.asarray(p, dtype)
    k = pa.shape[0]
    s_x, s_y, s_p = (jax.ShapeDtypeStruct((), dtype), jax.ShapeDtypeStruct((n,), dtype),
                     jax.ShapeDtypeStruct((k,), dtype))

    def point(xs: Any, ys: Any, *ps: Any) -> Any:
        return fun(xs[None], ys[:, None], *ps)[:, 0]

    f_call = "fun(x, y, p)" if k else "fun(x, y)"
    fun_hf, fun_ops = convert(point, NAME, "fun", (s_x, s_y) + ((s_p,) if k else ()))
    _check_out(fun_hf, (n,), "fun", f_call)
    bc_hf, bc_ops = convert(bc, NAME, "bc", (s_y, s_y) + ((s_p,) if k else ()))
    _check_out(bc_hf, (n + k,), "bc", "bc(ya, yb, p)" if k else "bc(ya, yb)")
    st = BvpConfig(fun=fun_hf, bc=bc_hf, n=n, k=k, tol=float(tol), max_nodes=int(max_nodes),
                 bc_tol=None if bc_tol is None else float(bc_tol), on_failure=on_failure)
    out = _bvp(x, y, pa, fun_hf.split(fun_ops), bc_hf.split(bc_ops), st=st)
    status, m = out["stats"][0], out["stats"][2]
    X, Y, P = out["x"], out["Y"], out["p"]
    args = (P,) if k else ()
    yp = jax.vmap(lambda xs, ys: point(xs, ys, *args))(X, Y)
    valid = jnp.arange(max_nodes) < m
    nan = jnp.asarray(jnp.nan, dtype)
    return BvpResult(
        sol=BvpSolution(X, Y, yp, m), p=P if p is not None else None,
        x=jnp.where(valid, X, nan), y=jnp.where(valid[:, None], Y, nan).T,
        yp=jnp.where(valid[:, None], yp, nan).T, rms_residuals=out["rms"],
        niter=out["stats"][1], status=status, success=status == 0, n_nodes=m)
