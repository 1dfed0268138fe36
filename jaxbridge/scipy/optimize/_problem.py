"""The host-side optimality condition G(x, p) = 0 of an optimum, its JAX derivatives and solves.

`G = F` for root, `G = grad_x f` for minimize and `G = grad_x C` for least_squares
(`C` SciPy's cost, robust loss included). Each role (F, G, its Jacobian, products with
it, ...) is one jitted host-side function; `Problem.solve` is the linear solve with
`dG/dx` (or its transpose) on the free coordinates that the implicit function theorem
needs.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import scipy.linalg

from .._common import const, f64, failure, host_copies, host_jit, jnp_ravel, tangent_like
from .._trace import HostFun
from ._loss import rho
from ._options import SolveOptions

_DENSE_MAX = 1000
# root's IFT solve: dense only for small systems. Above, JAX's GMRES on exact
# matrix-free products in one compiled call is cheaper than building the Jacobian
# (n JVPs) and factorizing it (a DEQ of 512 unknowns: ~20 ms dense).
_DENSE_MAX_ROOT = 64


class Problem:
    """Host-side optimality condition `G(x, p)` and its JAX derivatives.

    `primals` are the implicit solve's inputs `(x0, lb, ub, params, fixed, jac_ops)`;
    `opts.kind` says what G is: "root" (G = F), "minimize" (G = grad f) or
    "least_squares" (G = grad of the cost).
    """

    def __init__(self, primals: tuple, opts: SolveOptions) -> None:
        x0, _, _, params, fixed, jac_ops = primals
        self.kind = opts.kind
        self.shape = tuple(x0.shape)
        self.params, self.fixed, self.jac_ops = host_copies((params, fixed, jac_ops))
        key = (opts.kind, opts.fun, opts.jac, opts.hess, opts.hessp, self.shape,
               np.dtype(x0.dtype), opts.loss, opts.f_scale)
        roles = _roles(opts, self.shape, x0.dtype)
        self._j = {r: host_jit(key + (r,), const(g)) for r, g in roles.items()}

    def __call__(self, role: str, *xs: Any) -> Any:
        if role in ("G_jac", "value_and_grad", "lsq_jac", "user_hess", "user_hessp"):
            out = self._j[role](self.fixed, self.jac_ops, xs[0], self.params, *xs[1:])
        else:
            out = self._j[role](self.fixed, xs[0], self.params, *xs[1:])
        return jax.tree_util.tree_map(f64, out)

    # ---- the implicit-function-theorem solves, on the free coordinates ----
    def solve(self, x: np.ndarray, rhs: np.ndarray, transpose: bool, free: np.ndarray,
              linear_solver: str = "auto", on_failure: str = "nan") -> np.ndarray:
        """z with z[~free] = 0 and ((dG/dx)^{T if transpose} z)[free] = rhs[free]."""
        n = int(free.sum())
        z = np.zeros(x.size)
        if n == 0:
            return z
        name = f"optimize.{self.kind}"
        method = linear_solver
        if method == "auto":
            if self.kind == "root":
                method = "direct" if n <= _DENSE_MAX_ROOT else "gmres"
            else:
                method = "direct" if n <= _DENSE_MAX else "cg"
        if method == "direct":
            J = self("G_jac", x)[np.ix_(free, free)]
            try:
                z[free] = scipy.linalg.solve(J.T if transpose else J, rhs[free])
            except (scipy.linalg.LinAlgError, ValueError) as exc:
                if on_failure == "raise":
                    raise failure(name, f"implicit differentiation: singular "
                                  f"Jacobian of the optimality condition ({exc})") from None
                z[:] = np.nan
            return z
        # "gmres" / "cg": the whole Krylov solve as one compiled program (JAX's solver on
        # JAX's exact matrix-free products of G): one host-side call, not one per iteration.
        z, rel = self("krylov_T" if transpose else "krylov", x, rhs, free.astype(np.float64),
                      method == "cg")
        if not (np.all(np.isfinite(z)) and float(rel) <= 1e-6):
            if on_failure == "raise":
                raise failure(name, f"implicit differentiation: the {method} "
                              f"solve did not converge (relative residual {float(rel):.1e})")
            z = np.full(x.size, np.nan)
        return z


def _roles(opts: SolveOptions, shape: tuple, xdtype: Any) -> dict[str, Callable]:
    """The JAX functions of `(fixed[, jac_ops], x, params, ...)` a Problem jits, by role."""
    kind, fun, jac, loss, f_scale = opts.kind, opts.fun, opts.jac, opts.loss, opts.f_scale
    jac_ops, hess_ops, hessp_ops = _host_fun_ops(opts)

    # root: the residual; minimize: the objective; least_squares: the residuals
    def F(fx: Any, x: Any, p: Any) -> Any:
        out = fun(fun.merge(p, fx), x.reshape(shape).astype(xdtype))
        if isinstance(out, tuple):  # minimize(jac=True): (f, g)
            out = out[0]
        return jnp.ravel(out).astype(x.dtype) if kind != "minimize" else \
            jnp.asarray(out).astype(x.dtype)

    def cost(fx: Any, x: Any, p: Any) -> Any:
        r = F(fx, x, p) / f_scale
        return 0.5 * f_scale ** 2 * jnp.sum(rho(loss, r * r))

    if kind == "root":
        G = F
    elif kind == "minimize":
        G = jax.grad(F, argnums=1)
    else:
        G = jax.grad(cost, argnums=1)

    def G_jac(fx: Any, jo: Any, x: Any, p: Any) -> Any:
        if kind == "root" and isinstance(jac, HostFun):
            out = jac(jac_ops(jo), x.reshape(shape).astype(xdtype))
            return jnp.reshape(out, (x.size, x.size)).astype(x.dtype)
        return jax.jacfwd(G, argnums=1)(fx, x, p)

    # minimize: the gradient the optimizer uses
    def user_grad(fx: Any, jo: Any, x: Any, p: Any) -> Any:
        if jac is True:
            return jnp.ravel(fun(fun.merge(p, fx), x.reshape(shape).astype(xdtype))[1])
        if isinstance(jac, HostFun):
            return jnp.ravel(jac(jac_ops(jo), x.reshape(shape).astype(xdtype))).astype(x.dtype)
        return G(fx, x, p)

    def value_and_grad(fx: Any, jo: Any, x: Any, p: Any) -> Any:
        return F(fx, x, p), user_grad(fx, jo, x, p)

    def lsq_jac(fx: Any, jo: Any, x: Any, p: Any) -> Any:
        if isinstance(jac, HostFun):
            out = jac(jac_ops(jo), x.reshape(shape).astype(xdtype))
            return jnp.reshape(out, (-1, x.size)).astype(x.dtype)
        return jax.jacfwd(F, argnums=1)(fx, x, p)

    # minimize's `hess`/`hessp` functions, for SciPy's forward solve only
    def user_hess(fx: Any, jo: Any, x: Any, p: Any) -> Any:
        out = opts.hess(hess_ops(jo), x.reshape(shape).astype(xdtype))
        return jnp.reshape(out, (x.size, x.size)).astype(x.dtype)

    def user_hessp(fx: Any, jo: Any, x: Any, p: Any, v: Any) -> Any:
        out = opts.hessp(hessp_ops(jo), x.reshape(shape).astype(xdtype),
                         v.reshape(shape).astype(xdtype))
        return jnp.ravel(out).astype(x.dtype)

    return dict(
        F=F, G=G, G_jac=G_jac, value_and_grad=value_and_grad, lsq_jac=lsq_jac,
        user_hess=user_hess, user_hessp=user_hessp,
        G_vjp_x=lambda fx, x, p, v: jax.vjp(lambda x: G(fx, x, p), x)[1](v)[0],
        G_jvp_x=lambda fx, x, p, v: jax.jvp(lambda x: G(fx, x, p), (x,), (v,))[1],
        G_vjp_p=lambda fx, x, p, v: jnp_ravel(jax.vjp(lambda p: G(fx, x, p), p)[1](v)[0]),
        G_jvp_p=lambda fx, x, p, dp: jax.jvp(lambda p: G(fx, x, p), (p,),
                                            (tangent_like(dp, p),))[1],
        hess=jax.hessian(F, argnums=1) if kind == "minimize" else F,
        hessp=lambda fx, x, p, v: jax.jvp(lambda x: G(fx, x, p), (x,), (v,))[1],
        krylov_T=functools.partial(_krylov, G, True),
        krylov=functools.partial(_krylov, G, False))


def _host_fun_ops(opts: SolveOptions) -> tuple[Callable, Callable, Callable]:
    """Slicers of the `jac_ops` operand tuple: the operands of the `jac`, `hess` and
    `hessp` functions, in that order (each `HostFun` knows how many it has)."""
    sizes = [len(f.diff) if isinstance(f, HostFun) else 0
             for f in (opts.jac, opts.hess, opts.hessp)]
    starts = np.cumsum([0] + sizes)
    return tuple(functools.partial(lambda jo, a, b: tuple(jo[a:b]), a=int(a), b=int(b))
                 for a, b in zip(starts[:-1], starts[1:]))  # type: ignore[return-value]


def _krylov(G: Callable, transpose: bool, fx: Any, x: Any, p: Any, rhs: Any, free: Any,
            cg: Any) -> tuple[Any, Any]:
    """Solve `(dG/dx)^{T if transpose} z = rhs` on the free coordinates (z = 0 on the
    others: the operator is the identity there), matrix-free, with JAX's GMRES (or CG
    for a symmetric positive definite dG/dx); returns z and the relative residual."""
    if transpose:
        pullback = jax.vjp(lambda x: G(fx, x, p), x)[1]
        op = lambda v: pullback(v)[0]  # noqa: E731
    else:
        op = lambda v: jax.jvp(lambda x: G(fx, x, p), (x,), (v,))[1]  # noqa: E731

    def masked(v: Any) -> Any:
        return free * op(free * v) + (1 - free) * v

    b = free * rhs
    z = jax.lax.cond(
        cg, lambda b: jax.scipy.sparse.linalg.cg(masked, b, tol=1e-12, maxiter=10 * b.size)[0],
        lambda b: jax.scipy.sparse.linalg.gmres(masked, b, tol=1e-12, restart=50,
                                                maxiter=10 * b.size)[0], b)
    norm = jnp.linalg.norm(b)
    rel = jnp.linalg.norm(masked(z) - b) / jnp.where(norm > 0, norm, 1.0)
    return z, rel
