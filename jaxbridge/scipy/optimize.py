"""Differentiable `scipy.optimize`: `root` and `minimize` by the implicit function theorem.

SciPy finds `x*(p)`; its derivative comes from the optimality condition, not from
the iterations. For `root`, `F(x*, p) = 0` gives `dx*/dp = -(dF/dx)^{-1} dF/dp`; for
`minimize`, the condition is `grad_x f(x*, p) = 0` and `dF/dx` is the Hessian.

* reverse mode (grad): one linear solve with the transposed Jacobian,
  `(dF/dx)^T lam = x_bar`, then `p_bar = -(dF/dp)^T lam` (a JAX vector-Jacobian
  product);
* forward mode (jvp/jacfwd): one solve `(dF/dx) dx = -(dF/dp) dp`.

The linear solves are dense (`scipy.linalg.solve` on the Jacobian JAX computes) for
`n <= 1000` or `linear_solver="direct"`, and matrix-free otherwise or with
`linear_solver="gmres"` / `"cg"` (SciPy's Krylov solvers driven by JAX's
Jacobian-vector products; `cg` needs a symmetric positive definite matrix, which a
strict minimum's Hessian is). The starting point `x0` gets a zero gradient: the
solution does not depend on it.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import scipy.linalg
import scipy.optimize
import scipy.sparse.linalg

from .. import _foreign
from ._common import (_NO_ARGS, as_float_array, as_params, call_args, check_policy, f64, failure, fill_zeros,
                      host_jit, jnp_ravel, np_unravel, on_cpu, static_options)

__all__ = ["root", "minimize", "OptimizeResult"]

LINEAR_SOLVERS = ("auto", "direct", "gmres", "cg")
_DENSE_MAX = 1000
ROOT_JAC_METHODS = ("hybr", "lm")
MIN_GRAD_FREE = ("Nelder-Mead", "Powell", "COBYLA", "COBYQA")
MIN_HESS = ("Newton-CG", "dogleg", "trust-ncg", "trust-krylov", "trust-exact")


class OptimizeResult(NamedTuple):
    """What :func:`root` and :func:`minimize` return (a subset of SciPy's)."""

    x: jax.Array        #: the solution, shaped like x0 (differentiable)
    fun: jax.Array      #: F(x) for root, f(x) for minimize (differentiable)
    success: jax.Array  #: SciPy's flag (False only with on_failure="nan")


class _Problem:
    """Host-side `F(x, p)` (root) or `f(x, p)` (minimize) and its JAX derivatives.

    `G` is the optimality condition: `F` itself for root, `grad_x f` for minimize.
    """

    def __init__(self, kind, fun, has_args, shape, params, jac):
        self.shape = tuple(shape)
        self.params = params
        call = call_args(has_args)
        key = (kind, fun, has_args, self.shape, jac)
        shape_ = self.shape

        def F(x, p):  # root: residual; minimize: objective (scalar)
            out = fun(*call(x.reshape(shape_), p=p))
            return jnp.ravel(out).astype(x.dtype) if kind == "root" else \
                jnp.asarray(out).astype(x.dtype)

        if kind == "root":
            G = F
        else:
            G = jax.grad(F, argnums=0)

        def G_jac(x, p):
            if kind == "root" and callable(jac):
                return jnp.reshape(jac(*call(x.reshape(shape_), p=p)), (x.size, x.size))
            return jax.jacfwd(G, argnums=0)(x, p)

        def G_vjp_x(x, p, v):
            return jax.vjp(lambda x: G(x, p), x)[1](v)[0]

        def G_jvp_x(x, p, v):
            return jax.jvp(lambda x: G(x, p), (x,), (v,))[1]

        def G_vjp_p(x, p, v):
            return jnp_ravel(jax.vjp(lambda p: G(x, p), p)[1](v)[0])

        def G_jvp_p(x, p, dp):
            return jax.jvp(lambda p: G(x, p), (p,), (dp,))[1]

        def F_vjp(x, p, v):  # cotangent of the `fun` output, pulled back to (x, p)
            gx, gp = jax.vjp(F, x, p)[1](v)
            return gx, jnp_ravel(gp)

        def F_jvp(x, p, dx, dp):
            return jax.jvp(F, (x, p), (dx, dp))[1]

        def value_and_grad(x, p):
            return jax.value_and_grad(F)(x, p)

        roles = dict(F=F, G=G, G_jac=G_jac, G_vjp_x=G_vjp_x, G_jvp_x=G_jvp_x,
                     G_vjp_p=G_vjp_p, G_jvp_p=G_jvp_p, F_vjp=F_vjp, F_jvp=F_jvp,
                     value_and_grad=value_and_grad,
                     hess=jax.hessian(F, argnums=0) if kind == "minimize" else F,
                     hessp=lambda x, p, v: G_jvp_x(x, p, v))
        self._j = {r: host_jit(key + (r,), (lambda f: lambda: f)(f)) for r, f in roles.items()}

    def __call__(self, role, *xs):
        out = self._j[role](*xs[:1], self.params, *xs[1:])
        return jax.tree_util.tree_map(f64, out)

    # ---- the implicit-function-theorem solves ----
    def solve(self, x, rhs, transpose, linear_solver, name, on_failure):
        """(dG/dx)^{T if transpose} z = rhs."""
        n = x.size
        method = linear_solver
        if method == "auto":
            method = "direct" if n <= _DENSE_MAX else ("cg" if name == "minimize" else "gmres")
        if method == "direct":
            J = self("G_jac", x)
            try:
                return scipy.linalg.solve(J.T if transpose else J, rhs)
            except (scipy.linalg.LinAlgError, ValueError) as exc:
                if on_failure == "raise":
                    raise failure(f"optimize.{name}",
                                  f"implicit differentiation: singular Jacobian ({exc})") from None
                return np.full(n, np.nan)
        role = "G_vjp_x" if transpose else "G_jvp_x"
        op = scipy.sparse.linalg.LinearOperator((n, n), matvec=lambda v: self(role, x, v),
                                                dtype=np.float64)
        solver = scipy.sparse.linalg.cg if method == "cg" else scipy.sparse.linalg.gmres
        z, info = solver(op, rhs, rtol=1e-10, atol=0.0, maxiter=10 * n)
        if info != 0:
            if on_failure == "raise":
                raise failure(f"optimize.{name}", f"implicit differentiation: "
                              f"scipy.sparse.linalg.{method} did not converge (info={info})")
            return np.full(n, np.nan)
        return z


def _result(x0, params, *, kind, **_):
    fun_shape = x0.shape if kind == "root" else ()
    return OptimizeResult(jax.ShapeDtypeStruct(x0.shape, x0.dtype),
                          jax.ShapeDtypeStruct(fun_shape, x0.dtype),
                          jax.ShapeDtypeStruct((), jnp.bool_))


@_foreign.foreign(_result)
def _solve(x0, params, *, kind, fun, has_args, method, jac, tol, options, linear_solver,
           on_failure):
    name = f"optimize.{kind}"
    with on_cpu():
        pr = _Problem(kind, fun, has_args, x0.shape, params, jac)
        xf = np.ravel(f64(x0))
        opts = dict(options)
        if kind == "root":
            kw = {"jac": (lambda x: pr("G_jac", x))} if (
                method in ROOT_JAC_METHODS and jac is not False) else {}
            sol = scipy.optimize.root(lambda x: pr("F", x), xf, method=method, tol=tol,
                                      options=opts or None, **kw)
        else:
            kw = {}
            if method not in MIN_GRAD_FREE:
                kw["jac"] = True
                obj = lambda x: pr("value_and_grad", x)  # noqa: E731
            else:
                obj = lambda x: float(pr("F", x))  # noqa: E731
            if method in MIN_HESS:
                if method in ("dogleg", "trust-exact"):
                    kw["hess"] = lambda x: pr("hess", x)
                else:
                    kw["hessp"] = lambda x, v: pr("hessp", x, v)
            sol = scipy.optimize.minimize(obj, xf, method=method, tol=tol,
                                          options=opts or None, **kw)
        x = np.asarray(sol.x, np.float64)
        ok = bool(sol.success) and bool(np.all(np.isfinite(x)))
        fval = pr("F", x) if ok else None
    if not ok:
        if on_failure == "raise":
            raise failure(name, f"{kind}(method={method!r}): {sol.message}")
        nan = np.full(x0.shape, np.nan, x0.dtype)
        fshape = x0.shape if kind == "root" else ()
        return OptimizeResult(nan, np.full(fshape, np.nan, x0.dtype), np.bool_(False))
    fshape = x0.shape if kind == "root" else ()
    return OptimizeResult(x.reshape(x0.shape).astype(x0.dtype),
                          np.reshape(fval, fshape).astype(x0.dtype), np.bool_(True))


@_solve.defvjp
def _solve_vjp(primals, out, ct, *, kind, fun, has_args, method, jac, tol, options,
               linear_solver, on_failure):
    x0, params = primals
    if not bool(out.success):
        return None, jax.tree_util.tree_map(
            lambda p: np.full(np.shape(p), np.nan, np.asarray(p).dtype), params)
    with on_cpu():
        pr = _Problem(kind, fun, has_args, x0.shape, params, jac)
        x = np.ravel(f64(out.x))
        g = np.ravel(f64(ct.x))
        ct_fun = f64(ct.fun).reshape(-1 if kind == "root" else ())
        fun_x, fun_p = pr("F_vjp", x, ct_fun)  # the `fun` output's own dependence
        lam = pr.solve(x, g + fun_x, True, linear_solver, kind, on_failure)
        p_bar = fun_p - pr("G_vjp_p", x, lam)
    return None, (np_unravel(p_bar, params) if has_args else None)


@_solve.defjvp
def _solve_jvp(primals, out, tangents, *, kind, fun, has_args, method, jac, tol, options,
               linear_solver, on_failure):
    x0, params = primals
    _, dparams = tangents
    fshape = x0.shape if kind == "root" else ()
    if not bool(out.success):
        return OptimizeResult(np.full(x0.shape, np.nan, x0.dtype),
                              np.full(fshape, np.nan, x0.dtype), None)
    if not has_args or dparams is None:
        return None
    with on_cpu():
        pr = _Problem(kind, fun, has_args, x0.shape, params, jac)
        x = np.ravel(f64(out.x))
        dp = fill_zeros(dparams, params)
        dx = -pr.solve(x, pr("G_jvp_p", x, dp), False, linear_solver, kind, on_failure)
        dfun = pr("F_jvp", x, dx, dp)
    return OptimizeResult(dx.reshape(x0.shape).astype(x0.dtype),
                          np.reshape(dfun, fshape).astype(x0.dtype), None)


def _call(kind, fun, x0, args, method, jac, tol, options, linear_solver, on_failure):
    name = f"optimize.{kind}"
    check_policy(on_failure, name)
    if linear_solver not in LINEAR_SOLVERS:
        raise ValueError(f"jaxbridge.scipy.{name}: linear_solver must be one of "
                         f"{LINEAR_SOLVERS}, got {linear_solver!r}")
    x0 = as_float_array(x0)
    has_args = args is not None
    params = as_params(args, name) if has_args else _NO_ARGS()
    return _solve(x0, params, kind=kind, fun=fun, has_args=has_args, method=method, jac=jac,
                  tol=None if tol is None else float(tol), options=static_options(options),
                  linear_solver=linear_solver, on_failure=on_failure)


def root(fun: Callable[..., Any], x0: Any, args: Any = None, *, method: str = "hybr",
         jac: Callable[..., Any] | bool | None = None, tol: float | None = None,
         options: dict | None = None, linear_solver: str = "auto",
         on_failure: str = "raise") -> OptimizeResult:
    """Solve `fun(x, args) = 0` with `scipy.optimize.root`; differentiable in `args`.

    Args:
      fun: the residual, in JAX: `fun(x, args)` (or `fun(x)` when args is None),
        returning an array shaped like `x`.
      x0: the starting point (its gradient is zero).
      args: a pytree of float arrays (one argument, not unpacked as in SciPy).
      method: any of SciPy's root methods. "hybr" and "lm" get the Jacobian from JAX
        (`jax.jacfwd`) unless `jac` is a JAX function `jac(x, args)` or False.
      tol, options: as in SciPy (options must have hashable values).
      linear_solver: for the implicit-function-theorem solve: "auto" (dense up to
        n = 1000, then "gmres"), "direct", "gmres" (matrix-free), "cg".
      on_failure: "raise" (SciPy's success flag is False: an error naming the
        method and SciPy's message) or "nan" (NaN outputs, `success=False`).

    Returns:
      `OptimizeResult(x, fun, success)`.
    """
    return _call("root", fun, x0, args, method, jac, tol, options, linear_solver, on_failure)


def minimize(fun: Callable[..., Any], x0: Any, args: Any = None, *, method: str = "BFGS",
             tol: float | None = None, options: dict | None = None,
             linear_solver: str = "auto", on_failure: str = "raise") -> OptimizeResult:
    """Minimize scalar `fun(x, args)` with `scipy.optimize.minimize`; differentiable in args.

    Unconstrained methods: the gradient-based ones get JAX's gradient (and Hessian or
    Hessian-vector products for Newton-CG, dogleg, trust-*); the gradient-free ones
    (Nelder-Mead, Powell, ...) only function values. The gradient of `x*` w.r.t.
    `args` uses the stationarity condition `grad_x fun = 0` (implicit function
    theorem with the Hessian); the optimal value's gradient follows by the chain
    rule. `linear_solver` "auto" is dense up to n = 1000, then "cg". Other arguments
    as in :func:`root`.
    """
    return _call("minimize", fun, x0, args, method, None, tol, options, linear_solver,
                 on_failure)


