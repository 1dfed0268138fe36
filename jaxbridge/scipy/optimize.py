"""Differentiable `scipy.optimize`: `root`, `minimize`, `least_squares` (implicit function theorem).

SciPy finds `x*(p)`; its derivative comes from the optimality condition `G(x*, p) = 0`,
not from the iterations: `G = F` for `root`, `G = grad_x f` for `minimize`, and
`G = grad_x C` for `least_squares`, with `C(x) = 1/2 sum rho(f_i(x)^2)` SciPy's cost
(robust `loss` and `f_scale` included). Then `dx*/dp = -(dG/dx)^{-1} dG/dp`:

* reverse mode (grad): one linear solve with the transposed Jacobian,
  `(dG/dx)^T lam = x_bar`, then `p_bar = -(dG/dp)^T lam` (a JAX vector-Jacobian
  product);
* forward mode (jvp/jacfwd): one solve `(dG/dx) dx = -(dG/dp) dp`.

`p` is everything the function depends on: SciPy's `args` (called as
`fun(x, *args)`) and arrays it closes over, traced or not -- both get the same,
correct gradients. With `bounds`, coordinates at an active bound are held there:
the solve runs on the free coordinates, and the gradient flows to the bounds
themselves (`x*_i = lb_i`). A bound the solver stopped just inside of counts as
active when a Newton step from `x*` crosses it (`_weakly_held`).

The linear solves are dense (`scipy.linalg.solve` on the Jacobian JAX computes) for
`n <= 1000` (root: `n <= 64`) or `linear_solver="direct"`, and matrix-free
otherwise or with `linear_solver="gmres"` / `"cg"` (JAX's Krylov solvers on JAX's
exact matrix-free products, the whole solve one compiled host-side call; `cg`
needs a symmetric positive definite matrix, which a strict minimum's Hessian is).
The starting point `x0` gets a zero gradient: the
solution does not depend on it (it is correct, not a silent zero).

The result's other fields (`fun`, `jac`, `cost`, `grad`) are recomputed in JAX at
`x*`, so they are differentiable by the chain rule.

`root(method="df-sane")` and `root(method="krylov")` run, where they apply
(`stepping="auto"`), not on the host but as SciPy's algorithms compiled into the
caller's program (`_compiled_root`, `_dfsane`, `_newton_krylov`): no host round trip
per residual evaluation, Newton-Krylov on exact Jacobian-vector products instead of
finite differences, gradients by `jax.lax.custom_root` with the same linear solvers
on JAX's exact products.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
import scipy.linalg
import scipy.optimize
import scipy.sparse.linalg

from .. import _foreign
from . import _compiled_root
from ._common import (
    Result,
    as_float_array,
    check_policy,
    const,
    f64,
    failure,
    fill_zeros,
    host_copies,
    host_jit,
    jnp_ravel,
    nan_like,
    np_unravel,
    on_cpu,
    static_options,
    tangent_like,
    unsupported,
)
from ._trace import HostFun, check_args, convert

__all__ = ["root", "minimize", "least_squares", "OptimizeResult", "LINEAR_SOLVERS"]

LINEAR_SOLVERS = ("auto", "direct", "gmres", "cg")
STEPPINGS = ("auto", "scipy", "compiled")
_DENSE_MAX = 1000
# root's IFT solve: dense only for small systems. Above, JAX's GMRES on exact
# matrix-free products in one compiled call is cheaper than building the Jacobian
# (n JVPs) and factorizing it (a DEQ of 512 unknowns: ~20 ms dense).
_DENSE_MAX_ROOT = 64
ROOT_JAC_METHODS = ("hybr", "lm")
MIN_GRAD_FREE = ("Nelder-Mead", "Powell", "COBYLA", "COBYQA")
MIN_HESS = ("Newton-CG", "dogleg", "trust-ncg", "trust-krylov", "trust-exact")
MIN_BOUNDS = ("Nelder-Mead", "L-BFGS-B", "TNC", "SLSQP", "Powell", "trust-constr", "COBYLA",
              "COBYQA")
LOSSES = ("linear", "soft_l1", "huber", "cauchy", "arctan")


class OptimizeResult(Result):
    """What :func:`root`, :func:`minimize` and :func:`least_squares` return.

    SciPy's field names: `x` (differentiable), `fun` (F(x*) for root, f(x*) for
    minimize, the residuals for least_squares; differentiable), `success`,
    `status`, `nfev`, `njev`, `nit` (SciPy's counters, -1 where the method does not
    report one), and for least_squares `cost`, `jac`, `grad`, `optimality`,
    `active_mask`. Fields SciPy computes on the host only (`hess_inv`, ...) are None.
    """

    _fields = ("x", "fun", "jac", "cost", "grad", "optimality", "active_mask", "success",
               "status", "nfev", "njev", "nit", "hess_inv")
    _messages: ClassVar[dict[int, str]] = {}


# ------------------------------------------------------------------ losses (least_squares)
def _rho(loss: str, z: jax.Array) -> jax.Array:
    """SciPy's robust loss rho(z), z = f^2 (scipy.optimize._lsq.least_squares)."""
    if loss == "linear":
        return z
    if loss == "soft_l1":
        return 2 * (jnp.sqrt(1 + z) - 1)
    if loss == "huber":
        safe = jnp.where(z <= 1, 1.0, z)
        return jnp.where(z <= 1, z, 2 * jnp.sqrt(safe) - 1)
    if loss == "cauchy":
        return jnp.log1p(z)
    return jnp.arctan(z)  # "arctan"


class _Problem:
    """Host-side optimality condition `G(x, p)` and its JAX derivatives.

    `kind`: "root" (G = F), "minimize" (G = grad f) or "lsq" (G = grad of the cost).
    `free` masks the coordinates not held at a bound (all of them without bounds).
    """

    def __init__(self, kind: str, fun: HostFun, jac: Any, shape: tuple, xdtype: Any,
                 params: tuple, fixed: tuple, jac_ops: tuple, loss: str = "linear",
                 f_scale: float = 1.0) -> None:
        self.shape = tuple(shape)
        self.params, self.fixed, self.jac_ops = host_copies((params, fixed, jac_ops))
        key = (kind, fun, jac, self.shape, np.dtype(xdtype), loss, f_scale)
        shape_ = self.shape

        # root: the residual; minimize: the objective; least_squares: the residuals
        def F(fx: Any, x: Any, p: Any) -> Any:
            out = fun(fun.merge(p, fx), x.reshape(shape_).astype(xdtype))
            if isinstance(out, tuple):  # minimize(jac=True): (f, g)
                out = out[0]
            return jnp.ravel(out).astype(x.dtype) if kind != "minimize" else \
                jnp.asarray(out).astype(x.dtype)

        def cost(fx: Any, x: Any, p: Any) -> Any:
            r = F(fx, x, p) / f_scale
            return 0.5 * f_scale ** 2 * jnp.sum(_rho(loss, r * r))

        if kind == "root":
            G = F
        elif kind == "minimize":
            G = jax.grad(F, argnums=1)
        else:
            G = jax.grad(cost, argnums=1)

        def G_jac(fx: Any, jo: Any, x: Any, p: Any) -> Any:
            if kind == "root" and isinstance(jac, HostFun):
                out = jac(jo, x.reshape(shape_).astype(xdtype))
                return jnp.reshape(out, (x.size, x.size)).astype(x.dtype)
            return jax.jacfwd(G, argnums=1)(fx, x, p)

        # minimize: the gradient the optimizer uses
        def user_grad(fx: Any, jo: Any, x: Any, p: Any) -> Any:
            if jac is True:
                return jnp.ravel(fun(fun.merge(p, fx), x.reshape(shape_).astype(xdtype))[1])
            if isinstance(jac, HostFun):
                return jnp.ravel(jac(jo, x.reshape(shape_).astype(xdtype))).astype(x.dtype)
            return G(fx, x, p)

        def value_and_grad(fx: Any, jo: Any, x: Any, p: Any) -> Any:
            return F(fx, x, p), user_grad(fx, jo, x, p)

        def lsq_jac(fx: Any, jo: Any, x: Any, p: Any) -> Any:
            if isinstance(jac, HostFun):
                out = jac(jo, x.reshape(shape_).astype(xdtype))
                return jnp.reshape(out, (-1, x.size)).astype(x.dtype)
            return jax.jacfwd(F, argnums=1)(fx, x, p)

        roles = dict(
            F=F, G=G, G_jac=G_jac, value_and_grad=value_and_grad, lsq_jac=lsq_jac,
            G_vjp_x=lambda fx, x, p, v: jax.vjp(lambda x: G(fx, x, p), x)[1](v)[0],
            G_jvp_x=lambda fx, x, p, v: jax.jvp(lambda x: G(fx, x, p), (x,), (v,))[1],
            G_vjp_p=lambda fx, x, p, v: jnp_ravel(jax.vjp(lambda p: G(fx, x, p), p)[1](v)[0]),
            G_jvp_p=lambda fx, x, p, dp: jax.jvp(lambda p: G(fx, x, p), (p,),
                                                (tangent_like(dp, p),))[1],
            hess=jax.hessian(F, argnums=1) if kind == "minimize" else F,
            hessp=lambda fx, x, p, v: jax.jvp(lambda x: G(fx, x, p), (x,), (v,))[1],
            krylov_T=functools.partial(_krylov, G, True),
            krylov=functools.partial(_krylov, G, False))
        self._j = {r: host_jit(key + (r,), const(g)) for r, g in roles.items()}

    def __call__(self, role: str, *xs: Any) -> Any:
        if role in ("G_jac", "value_and_grad", "lsq_jac"):
            out = self._j[role](self.fixed, self.jac_ops, xs[0], self.params, *xs[1:])
        else:
            out = self._j[role](self.fixed, xs[0], self.params, *xs[1:])
        return jax.tree_util.tree_map(f64, out)

    # ---- the implicit-function-theorem solves, on the free coordinates ----
    def solve(self, x: np.ndarray, rhs: np.ndarray, transpose: bool, free: np.ndarray,
              linear_solver: str, name: str, on_failure: str) -> np.ndarray:
        """z with z[~free] = 0 and ((dG/dx)^{T if transpose} z)[free] = rhs[free]."""
        n = int(free.sum())
        z = np.zeros(x.size)
        if n == 0:
            return z
        method = linear_solver
        if method == "auto":
            if name == "root":
                method = "direct" if n <= _DENSE_MAX_ROOT else "gmres"
            else:
                method = "direct" if n <= _DENSE_MAX else "cg"
        if method == "direct":
            J = self("G_jac", x)[np.ix_(free, free)]
            try:
                z[free] = scipy.linalg.solve(J.T if transpose else J, rhs[free])
            except (scipy.linalg.LinAlgError, ValueError) as exc:
                if on_failure == "raise":
                    raise failure(f"optimize.{name}", f"implicit differentiation: singular "
                                  f"Jacobian of the optimality condition ({exc})") from None
                z[:] = np.nan
            return z
        # "gmres" / "cg": the whole Krylov solve as one compiled program (JAX's solver on
        # JAX's exact matrix-free products of G): one host-side call, not one per iteration.
        z, rel = self("krylov_T" if transpose else "krylov", x, rhs, free.astype(np.float64),
                      method == "cg")
        if not (np.all(np.isfinite(z)) and float(rel) <= 1e-6):
            if on_failure == "raise":
                raise failure(f"optimize.{name}", f"implicit differentiation: the {method} "
                              f"solve did not converge (relative residual {float(rel):.1e})")
            z = np.full(x.size, np.nan)
        return z


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


def _count(sol: Any, field: str) -> int:
    value = sol.get(field, -1) if hasattr(sol, "get") else getattr(sol, field, -1)
    return -1 if value is None else int(value)


def _stats(sol: Any) -> np.ndarray:
    return np.array([int(getattr(sol, "status", 0) or 0), _count(sol, "nfev"),
                     _count(sol, "njev"), _count(sol, "nit")], np.int32)


def _result(x0: Any, lb: Any, ub: Any, params: Any, fixed: Any, jac_ops: Any, *, kind: str,
            **_: Any) -> Any:
    return (jax.ShapeDtypeStruct(x0.shape, x0.dtype),
            jax.ShapeDtypeStruct(x0.shape, jnp.int8),    # active bound: -1, 0, 1
            jax.ShapeDtypeStruct((4,), jnp.int32),       # status, nfev, njev, nit
            jax.ShapeDtypeStruct((), jnp.bool_))         # success


def _problem(primals: tuple, kind: str, fun: Any, jac: Any, options: tuple) -> Any:
    x0, lb, ub, params, fixed, jac_ops = primals
    opts = dict(options)
    return _Problem(kind, fun, jac, x0.shape, x0.dtype, params, fixed, jac_ops,
                    loss=opts.get("loss", "linear"), f_scale=opts.get("f_scale", 1.0))


def _run_root(pr: Any, xf: Any, method: str, jac: Any, tol: Any, opts: Any, callback: Any) -> Any:
    kw = {"jac": (lambda x: pr("G_jac", x))} if (
        method in ROOT_JAC_METHODS and jac is not False) else {}
    return scipy.optimize.root(lambda x: pr("F", x), xf, method=method, tol=tol,
                               callback=callback, options=opts or None, **kw)


def _run_minimize(pr: Any, xf: Any, method: str, lb: Any, ub: Any, tol: Any, opts: Any,
                  callback: Any) -> Any:
    kw: dict[str, Any] = {}  # scipy.optimize.minimize's keyword arguments
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
    if np.isfinite(lb).any() or np.isfinite(ub).any():
        kw["bounds"] = scipy.optimize.Bounds(lb, ub)
    return scipy.optimize.minimize(obj, xf, method=method, tol=tol, callback=callback,
                                   options=opts or None, **kw)


def _run_lsq(pr: Any, xf: Any, lb: Any, ub: Any, opts: Any, callback: Any) -> Any:
    if "tr_options" in opts:
        opts["tr_options"] = dict(opts["tr_options"])
    if isinstance(opts.get("x_scale"), tuple):
        opts["x_scale"] = np.asarray(opts["x_scale"])
    return scipy.optimize.least_squares(
        lambda x: pr("F", x), xf, jac=lambda x: pr("lsq_jac", x), bounds=(lb, ub),
        callback=callback, **opts)


def _active(kind: str, sol: Any, x: Any, lb: Any, ub: Any, pr: Any, dtype: Any) -> Any:
    """-1/+1 where x* is held at its lower/upper bound, else 0."""
    if kind == "root" or not (np.isfinite(lb).any() or np.isfinite(ub).any()):
        return np.zeros(x.size, np.int8)
    g = pr("G", x)  # at an active bound the gradient pushes outwards
    # least_squares: x* within a few ulps of the bound in the user's dtype. SciPy's
    # "trf" is an interior method that stops a little inside the bound (2e-10 here in
    # float32), and its `active_mask` (relative tolerance `xtol`) misses that for a
    # tight xtol; the derivative w.r.t. the bound would be a silent zero.
    rel = max(1e-10, 4 * float(np.finfo(dtype).eps)) if kind == "lsq" else 1e-10
    at_lb = (x <= lb + rel * _scale(lb)) & (g > 0)
    at_ub = (x >= ub - rel * _scale(ub)) & (g < 0)
    ours = _weakly_held(at_ub.astype(np.int8) - at_lb.astype(np.int8), x, g, lb, ub, pr)
    if kind == "lsq":  # SciPy's mask too, as before: it also holds bounds where g ~ 0
        scipy_mask = np.asarray(sol.active_mask, np.int8)
        return np.where(scipy_mask != 0, scipy_mask, ours).astype(np.int8)
    return ours


def _scale(bound: np.ndarray) -> np.ndarray:
    """1 + |bound|, the scale of the distances to a bound (1 where it is infinite: the
    distance to an infinite bound is infinite, so no tolerance reaches it)."""
    return 1 + np.abs(np.where(np.isfinite(bound), bound, 0))


#: How far inside a bound (relative to 1 + |bound|) a solver may have stopped for the
#: bound still to be tested as held by `_weakly_held`.
_WEAK_WINDOW = 1e-2


def _weakly_held(active: np.ndarray, x: np.ndarray, g: np.ndarray, lb: np.ndarray,
                 ub: np.ndarray, pr: Any) -> np.ndarray:
    """`active` (-1/0/+1) with the bounds that hold although x* stopped inside them.

    Interior and derivative-free methods (least_squares' "trf", minimize's
    "trust-constr" and "Powell") stop short of a bound that holds only weakly, the
    unconstrained optimum just beyond it: 4e-10 to 8e-4 inside at SciPy's default
    tolerances, where a fixed tolerance cannot tell a held bound from a free
    coordinate, and the derivative with respect to the bound would be a silent zero.
    A bound near x* holds if the gradient pushes outwards and the Newton step on the
    coordinates not held (where G = 0 to first order) crosses it; each bound found is
    held in the next step, until no step crosses a new one (an active-set search: one
    linear solve per round, none when no bound is near).
    """
    near_lb = (g > 0) & (x - lb <= _WEAK_WINDOW * _scale(lb))
    near_ub = (g < 0) & (ub - x <= _WEAK_WINDOW * _scale(ub))
    candidate = (near_lb | near_ub) & (active == 0)
    active = active.copy()
    while candidate.any():
        step = pr.solve(x, g, False, active == 0, "auto", "", "nan")
        if not np.all(np.isfinite(step)):  # no Newton step (singular): keep what is known
            break
        newton = x - step
        cross_lb = candidate & near_lb & (newton <= lb)
        cross_ub = candidate & near_ub & (newton >= ub)
        if not (cross_lb.any() or cross_ub.any()):
            break
        active[cross_lb], active[cross_ub] = -1, 1
        candidate &= ~(cross_lb | cross_ub)
    return active


@_foreign.foreign(_result)
def _solve(x0: Any, lb: Any, ub: Any, params: Any, fixed: Any, jac_ops: Any, *, kind: str, fun: Any,
           method: str, jac: Any, tol: Any, options: tuple, callback: Any, linear_solver: Any,
           on_failure: str) -> Any:
    name = {"lsq": "least_squares"}.get(kind, kind)
    primals = (x0, lb, ub, params, fixed, jac_ops)
    lbf, ubf = np.ravel(f64(lb)), np.ravel(f64(ub))
    with on_cpu():
        pr = _problem(primals, kind, fun, jac, options)
        xf = np.ravel(f64(x0))
        opts = dict(options)
        if kind == "root":
            sol = _run_root(pr, xf, method, jac, tol, opts, callback)
        elif kind == "minimize":
            sol = _run_minimize(pr, xf, method, lbf, ubf, tol, opts, callback)
        else:
            sol = _run_lsq(pr, xf, lbf, ubf, opts, callback)
        x = np.asarray(sol.x, np.float64)
        ok = bool(sol.success) and bool(np.all(np.isfinite(x)))
        active = (_active(kind, sol, x, lbf, ubf, pr, x0.dtype) if ok
                  else np.zeros(x.size, np.int8))
    stats = _stats(sol)
    if not ok:
        if on_failure == "raise":
            raise failure(f"optimize.{name}", f"{name}(method={method!r}): {sol.message}")
        return (np.full(x0.shape, np.nan, x0.dtype), active.reshape(x0.shape), stats,
                np.bool_(False))
    return x.reshape(x0.shape).astype(x0.dtype), active.reshape(x0.shape), stats, np.bool_(True)


def _free_and_x(out: Any) -> Any:
    x, active = out[0], out[1]
    return np.ravel(f64(x)), np.ravel(np.asarray(active)) == 0


@_solve.defvjp
def _solve_vjp(primals: tuple, out: Any, ct: Any, *, kind: str, fun: Any, method: str, jac: Any,
               tol: Any, options: tuple, callback: Any, linear_solver: Any, on_failure: str) -> Any:
    x0, lb, ub, params, fixed, jac_ops = primals
    name = {"lsq": "least_squares"}.get(kind, kind)
    if not bool(out[3]):
        return (None, *nan_like((lb, ub, params)), None, None)
    with on_cpu():
        pr = _problem(primals, kind, fun, jac, options)
        x, free = _free_and_x(out)
        g = np.ravel(f64(ct[0]))
        lam = pr.solve(x, g, True, free, linear_solver, name, on_failure)
        p_bar = -pr("G_vjp_p", x, lam)
        # x*_i = bound_i where active; the bound also moves the free coordinates.
        b_bar = np.where(free, 0.0, g - pr("G_vjp_x", x, lam))
        active = np.ravel(np.asarray(out[1]))
    lb_bar = np.where(active < 0, b_bar, 0.0).reshape(lb.shape).astype(lb.dtype)
    ub_bar = np.where(active > 0, b_bar, 0.0).reshape(ub.shape).astype(ub.dtype)
    return None, lb_bar, ub_bar, np_unravel(p_bar, params), None, None


@_solve.defjvp
def _solve_jvp(primals: tuple, out: Any, tangents: Any, *, kind: str, fun: Any, method: str,
               jac: Any, tol: Any, options: tuple, callback: Any, linear_solver: Any,
               on_failure: str) -> Any:
    x0, lb, ub, params, fixed, jac_ops = primals
    _, dlb, dub, dparams, _, _ = tangents
    name = {"lsq": "least_squares"}.get(kind, kind)
    if not bool(out[3]):
        return np.full(x0.shape, np.nan, x0.dtype), None, None, None
    with on_cpu():
        pr = _problem(primals, kind, fun, jac, options)
        x, free = _free_and_x(out)
        active = np.ravel(np.asarray(out[1]))
        dx_bound = np.zeros(x.size)
        if dlb is not None:
            dx_bound += np.where(active < 0, np.ravel(f64(dlb)), 0.0)
        if dub is not None:
            dx_bound += np.where(active > 0, np.ravel(f64(dub)), 0.0)
        rhs = pr("G_jvp_p", x, fill_zeros(dparams, params)) + pr("G_jvp_x", x, dx_bound)
        dx = dx_bound - pr.solve(x, rhs, False, free, linear_solver, name, on_failure)
    return dx.reshape(x0.shape).astype(x0.dtype), None, None, None


# ------------------------------------------------------------------ public functions
def _bounds(bounds: Any, x0: jax.Array, name: str) -> tuple[jax.Array, jax.Array]:
    """(lb, ub) shaped like x0 from SciPy's forms: Bounds, (lb, ub), or [(lo, hi), ...]."""
    inf = jnp.full(x0.shape, jnp.inf, x0.dtype)
    if bounds is None:
        return -inf, inf
    if isinstance(bounds, scipy.optimize.Bounds):
        lo, hi = bounds.lb, bounds.ub
    elif name != "least_squares" and isinstance(bounds, (list, tuple)) and bounds and \
            all(isinstance(b, (list, tuple)) and len(b) == 2 for b in bounds):
        lo = [(-np.inf if b[0] is None else b[0]) for b in bounds]
        hi = [(np.inf if b[1] is None else b[1]) for b in bounds]
    elif isinstance(bounds, (list, tuple)) and len(bounds) == 2:
        lo, hi = bounds
    else:
        raise TypeError(f"jaxbridge.scipy.optimize.{name}: bounds must be a "
                        f"scipy.optimize.Bounds, (lb, ub) or a sequence of (min, max) pairs, "
                        f"got {type(bounds).__name__}")
    def full(v: Any, which: str) -> jax.Array:
        if isinstance(v, (list, tuple)):  # entries may be traced (differentiable bounds)
            v = jnp.stack([jnp.asarray(e, x0.dtype).reshape(()) for e in v])
        v = jnp.asarray(v, x0.dtype)
        if v.size not in (1, x0.size):
            raise ValueError(f"jaxbridge.scipy.optimize.{name}: the {which} bounds must be a "
                             f"scalar or have x0's {x0.size} entries, got shape {v.shape}")
        return jnp.broadcast_to(v.reshape(-1), (x0.size,)).reshape(x0.shape)
    return full(lo, "lower"), full(hi, "upper")


def _call(kind: str, fun: Callable, x0: Any, args: Any, method: str, jac: Any, tol: Any,
          options: dict | None, callback: Any, linear_solver: str, on_failure: str,
          bounds: Any = None) -> tuple:
    name = {"lsq": "least_squares"}.get(kind, kind)
    qual = f"optimize.{name}"
    check_policy(on_failure, qual)
    if linear_solver not in LINEAR_SOLVERS:
        raise ValueError(f"jaxbridge.scipy.{qual}: linear_solver must be one of "
                         f"{LINEAR_SOLVERS}, got {linear_solver!r}")
    if callback is not None:
        try:
            hash(callback)
        except TypeError:
            raise TypeError(f"jaxbridge.scipy.{qual}: callback must be hashable (it is "
                            f"static); got {type(callback).__name__}") from None
    call = "fun(x, *args)"
    args = check_args(args, qual, call, "unpack" if kind == "lsq" else "wrap")
    x0 = as_float_array(x0, qual, "x0")
    x_aval = jax.ShapeDtypeStruct(x0.shape, x0.dtype)
    hf, ops = convert(fun, qual, "fun", (x_aval,), args, call)
    params, fixed = hf.split(ops)
    jac_hf = jac if jac in (None, True, False) else None
    jac_ops: Sequence[Any] = ()
    if callable(jac):
        jac_hf, jac_ops = convert(jac, qual, "jac", (x_aval,), args, "jac(x, *args)")
        jac_ops = tuple(jax.lax.stop_gradient(o) for o in jac_ops)
    lb, ub = _bounds(bounds, x0, name)
    out = _solve(x0, lb, ub, params, fixed, tuple(jac_ops), kind=kind, fun=hf, method=method,
                 jac=jac_hf, tol=None if tol is None else float(tol),
                 options=static_options(options, qual), callback=callback,
                 linear_solver=linear_solver, on_failure=on_failure)
    x, active, stats, success = out

    def user_fun(x: jax.Array) -> Any:
        y = fun(x, *args)
        return y[0] if jac is True and isinstance(y, tuple) else y
    return x, active, stats, success, user_fun


def root(fun: Callable[..., Any], x0: Any, args: Any = (), method: str = "hybr",
         jac: Callable[..., Any] | bool | None = None, tol: float | None = None,
         callback: Callable[..., Any] | None = None, options: dict | None = None, *,
         linear_solver: str = "auto", on_failure: str = "raise",
         stepping: str = "auto") -> OptimizeResult:
    """`scipy.optimize.root`: solve `fun(x, *args) = 0`; differentiable in args and closures.

    Same signature and `args` convention as SciPy. `fun` is written in JAX and may
    close over traced values (their gradients equal those through `args`).

    Args:
      fun: the residual, returning an array shaped like `x`.
      x0: the starting point (the solution does not depend on it: zero gradient).
      args: a tuple, passed as `fun(x, *args)`; array and float leaves (pytrees are
        fine) are differentiable, Python ints and other objects static. As in SciPy,
        anything else (an array, a dict, a list) is one argument: `args = (args,)`.
      method: any of SciPy's root methods. "hybr" and "lm" get the Jacobian from JAX
        (`jax.jacfwd`) unless `jac` is a JAX function `jac(x, *args)`, or False
        (SciPy's finite differences).
      jac: None or True (JAX's Jacobian; True: `fun` returns `(f, J)`), a JAX
        function `jac(x, *args)`, or False (SciPy's finite differences).
      tol: as in SciPy.
      callback: as in SciPy (called on the host with NumPy values).
      options: as in SciPy (static: must be hashable).
      linear_solver: for the implicit-function-theorem solve: "auto" (dense up to
        n = 1000, then "gmres"), "direct", "gmres" (matrix-free), "cg" (for a
        symmetric positive definite Jacobian). With stepping "compiled", CG stops after
        10 n iterations and GMRES (restarts of 20) after 10 n cycles; a solve that
        has not converged then is a failure, as `on_failure` says.
      on_failure: "raise" (`jaxbridge.scipy.SolverError` with SciPy's message, eager
        and under `jit`) or "nan" (NaN outputs, `success=False`).
      stepping: who runs the solver loop. "scipy": SciPy's own loop on the host (one
        host round trip per residual evaluation, tens of microseconds each).
        "compiled": SciPy's algorithm as a loop inside the caller's JAX program (no
        host round trip; `vmap` batches the loop), without `callback` and with
        jax_enable_x64 on, for method "df-sane" (same iterates, `nfev` and `nit` up to
        rounding, which a chaotic line search can amplify; options ftol, fatol,
        maxfev, M, sigma_eps, sigma_0, line_search "cruz") and method "krylov"
        (SciPy's Newton-Krylov: its termination test, forcing terms and Armijo line
        search, but exact Jacobian-vector products from `jax.linearize` and GMRES
        instead of finite differences and LGMRES, so the iterates differ slightly
        while the accepted root passes SciPy's test;
        options nit, maxiter, ftol, fatol, xtol, xatol, line_search "armijo" or None,
        jac_options method "lgmres"/"gmres", inner_maxiter, inner_inner_m,
        inner_rtol, inner_atol; `nfev` counts residual evaluations, none for the
        products). An option it cannot honour is named in a ValueError. Its
        gradients: `jax.lax.custom_root` with the same `linear_solver` choices,
        matrix-free GMRES on JAX's exact products above 64 unknowns. "auto"
        (default): "compiled" where it applies, else "scipy".

    Returns:
      :class:`OptimizeResult` with `x`, `fun`, `success`, `status`, `nfev`, `njev`,
      `nit`.

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from jaxbridge.scipy.optimize import root
      >>> sol = root(lambda x, a: x ** 3 + a * x - 1.0, jnp.zeros(1), args=(2.0,))
      >>> print(f"{float(sol.x[0]):.6f}")
      0.453398
      >>> g = jax.grad(lambda a: root(lambda x: x ** 3 + a * x - 1.0, jnp.zeros(1)).x[0])
      >>> print(f"{float(g(2.0)):.5f}")  # -x / (3 x^2 + a)
      -0.17327
    """
    if _root_stepping(stepping, method, options, callback) == "compiled":
        check_policy(on_failure, "optimize.root")
        if linear_solver not in LINEAR_SOLVERS:
            raise ValueError(f"jaxbridge.scipy.optimize.root: linear_solver must be one of "
                             f"{LINEAR_SOLVERS}, got {linear_solver!r}")
        args = check_args(args, "optimize.root", "fun(x, *args)", "wrap")
        x0 = as_float_array(x0, "optimize.root", "x0")
        hf, ops = convert(fun, "optimize.root", "fun", (jax.ShapeDtypeStruct(x0.shape,
                                                                               x0.dtype),),
                          args, "fun(x, *args)", vary_like=(x0,))
        if options and isinstance(options.get("jac_options"), dict):  # static: hashable
            options = {**options, "jac_options": static_options(options["jac_options"],
                                                                "optimize.root")}
        x, stats = _compiled_root.root(
            x0, ops, fun=hf, method=method, tol=None if tol is None else float(tol),
            options=static_options(options, "optimize.root"), linear_solver=linear_solver,
            on_failure=on_failure)
        return OptimizeResult(x=x, fun=fun(x, *args), success=stats[4] == 1,
                              status=stats[0], nfev=stats[1], njev=stats[2], nit=stats[3])
    x, _, stats, success, user_fun = _call("root", fun, x0, args, method, jac, tol, options,
                                           callback, linear_solver, on_failure)
    return OptimizeResult(x=x, fun=user_fun(x), success=success, status=stats[0],
                          nfev=stats[1], njev=stats[2], nit=stats[3])


def _root_stepping(stepping: str, method: str, options: dict | None, callback: Any) -> str:
    if stepping not in STEPPINGS:
        raise ValueError(f"jaxbridge.scipy.optimize.root: stepping must be one of "
                         f"{STEPPINGS}, got {stepping!r}")
    if not isinstance(method, str):
        return "scipy"  # SciPy's own error for a callable/odd method
    why = _compiled_root.unsupported(method, dict(options or {}), callback)
    ok = why is None
    if stepping == "compiled" and not ok:
        raise ValueError(
            f"jaxbridge.scipy.optimize.root: stepping='compiled' runs the methods "
            f"{_compiled_root.METHODS} without callback and needs jax_enable_x64; it cannot "
            f"run {why}. stepping='scipy' runs SciPy's own loop")
    if stepping == "auto":
        return "compiled" if ok else "scipy"
    return stepping


def minimize(fun: Callable[..., Any], x0: Any, args: Any = (), method: str | None = None,
             jac: Callable[..., Any] | bool | str | None = None, hess: Any = None,
             hessp: Any = None, bounds: Any = None, constraints: Any = (),
             tol: float | None = None, callback: Callable[..., Any] | None = None,
             options: dict | None = None, *, linear_solver: str = "auto",
             on_failure: str = "raise") -> OptimizeResult:
    """`scipy.optimize.minimize` of scalar `fun(x, *args)`; differentiable in args and closures.

    Same signature and `args` convention as SciPy (a non-tuple `args` is one
    argument, as in SciPy). The gradient-based methods get
    JAX's gradient (and Hessian or Hessian-vector products for Newton-CG, dogleg,
    trust-*) unless `jac` is a JAX function `jac(x, *args)` or True (`fun` returns
    `(f, g)`); a finite-difference string ("2-point", ...) also means JAX's exact
    gradient. The gradient-free methods (Nelder-Mead, Powell, ...) use values only.
    `method=None` picks as SciPy does: "BFGS", or "L-BFGS-B" with bounds.

    Gradients of `x*`: the stationarity condition `grad_x fun = 0` on the free
    coordinates (implicit function theorem with the Hessian); coordinates held at a
    bound follow the bound. Not supported, with the reason in the error:
    `constraints` (the KKT system's multipliers are not returned), `hess`/`hessp`
    functions (JAX's exact ones are used; pass None). `linear_solver` "auto" is dense
    up to n = 1000, then "cg". Other arguments as in :func:`root`.

    Args:
      fun: the scalar objective ``fun(x, *args)``, written in JAX.
      x0: the starting point (zero gradient: the minimum does not depend on it).
      args: a tuple passed as ``fun(x, *args)``; array and float leaves are
        differentiable, other leaves static.
      method: any of SciPy's methods; None picks "BFGS", or "L-BFGS-B" with bounds.
      jac: None (JAX's gradient), a JAX function ``jac(x, *args)``, True (`fun`
        returns ``(f, g)``) or a finite-difference string (also JAX's gradient).
      hess: must be None (JAX's exact Hessian is used).
      hessp: must be None (JAX's exact Hessian-vector products are used).
      bounds: as in SciPy (a sequence of ``(lo, hi)`` or a `Bounds`); only with the
        bounded methods. Gradients flow to active bounds.
      constraints: must be empty (not supported).
      tol: as in SciPy.
      callback: as in SciPy (called on the host; static, so hashable).
      options: as in SciPy (static: hashable values).
      linear_solver: the implicit-function-theorem solve: "auto" (dense up to
        n = 1000, then "cg"), "direct", "gmres", "cg".
      on_failure: "raise" (`jaxbridge.scipy.SolverError`) or "nan".

    Returns:
      :class:`OptimizeResult` with `x`, `fun`, `success`, `status`, `nfev`, `njev`,
      `nit`; `x` and `fun` are differentiable.

    Raises:
      SolverError: SciPy reported failure, or the implicit-function-theorem system is
        singular, with ``on_failure="raise"``.
      NotImplementedError: `constraints`, `hess` or `hessp` given.
      ValueError: bounds with a method that does not take them, or an unknown
        `linear_solver` or `on_failure`.

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from jaxbridge.scipy.optimize import minimize
      >>> f = lambda x, c: jnp.sum((x - c) ** 2) + 0.1 * jnp.sum(x ** 4)
      >>> g = jax.grad(lambda c: minimize(f, jnp.zeros(2), args=(c,), method="Newton-CG",
      ...                                 tol=1e-12).x.sum())
      >>> [round(float(v), 4) for v in g(jnp.array([1.0, -1.0]))]
      [0.6883, 0.6883]
    """
    name = "optimize.minimize"
    if constraints not in ((), None, []):
        raise unsupported(name, "constraints", "the implicit function theorem needs the "
                          "KKT system's Lagrange multipliers; use bounds, or a penalty term")
    if hess is not None or hessp is not None:
        raise unsupported(name, "hess/hessp", "JAX's exact Hessian is used; pass None")
    if method is None:
        method = "L-BFGS-B" if bounds is not None else "BFGS"
    if bounds is not None and method not in MIN_BOUNDS:
        raise ValueError(f"jaxbridge.scipy.{name}: method {method!r} does not take bounds "
                         f"(SciPy's bounded methods: {MIN_BOUNDS})")
    if isinstance(jac, str):
        jac = None
    x, _, stats, success, user_fun = _call("minimize", fun, x0, args, method, jac, tol,
                                           options, callback, linear_solver, on_failure,
                                           bounds)
    return OptimizeResult(x=x, fun=user_fun(x), success=success, status=stats[0],
                          nfev=stats[1], njev=stats[2], nit=stats[3])


def least_squares(fun: Callable[..., Any], x0: Any, jac: Any = "2-point",
                  bounds: Any = (-np.inf, np.inf), method: str = "trf", ftol: float = 1e-8,
                  xtol: float = 1e-8, gtol: float = 1e-8, x_scale: Any = None,
                  loss: str = "linear", f_scale: float = 1.0, diff_step: Any = None,
                  tr_solver: str | None = None, tr_options: dict | None = None,
                  jac_sparsity: Any = None, max_nfev: int | None = None, verbose: int = 0,
                  args: Any = (), kwargs: dict | None = None, callback: Any = None,
                  workers: Any = None, *, linear_solver: str = "auto",
                  on_failure: str = "raise") -> OptimizeResult:
    """`scipy.optimize.least_squares`: minimize `1/2 sum rho(fun(x, *args)^2)`; differentiable.

    Same signature and `args` convention as SciPy: `fun(x, *args)` unpacks any
    iterable `args` (a non-iterable raises TypeError, as in SciPy). Trust-region
    "trf", "dogbox" or "lm"; `bounds`; robust `loss` and `f_scale`. `fun` is
    written in JAX; its Jacobian comes from JAX (exact) unless `jac` is a JAX
    function `jac(x, *args)` (a finite-difference string also means JAX's
    Jacobian). Gradients of the optimum w.r.t. `args`, arrays `fun` closes over,
    and active bounds: implicit function theorem on the stationarity of the cost
    (its full Hessian, from JAX, not the Gauss-Newton approximation, so the
    gradient is exact also for nonzero residuals).

    Not supported, with the reason in the error: `kwargs` (use `args` or a
    closure), a callable `loss` (write it into `fun`), `jac_sparsity`, `workers`.

    Args:
      fun: the residuals ``fun(x, *args)``, written in JAX (any shape; raveled).
      x0: the starting point (zero gradient: the optimum does not depend on it).
      jac: a JAX function ``jac(x, *args)``; anything else (the default "2-point",
        "3-point", "cs") means JAX's exact Jacobian.
      bounds: ``(lb, ub)`` as in SciPy; gradients flow to active bounds.
      method: "trf", "dogbox" or "lm".
      ftol: as in SciPy.
      xtol: as in SciPy.
      gtol: as in SciPy.
      x_scale: as in SciPy (static).
      loss: one of SciPy's named losses ("linear", "soft_l1", "huber", "cauchy",
        "arctan"); the implicit function theorem uses its exact derivatives.
      f_scale: as in SciPy.
      diff_step: ignored (the Jacobian is JAX's).
      tr_solver: as in SciPy.
      tr_options: as in SciPy (static).
      jac_sparsity: not supported.
      max_nfev: as in SciPy.
      verbose: as in SciPy.
      args: a tuple passed as ``fun(x, *args)``; array and float leaves are
        differentiable, other leaves static.
      kwargs: not supported (use `args` or a closure).
      callback: as in SciPy (called on the host; static, so hashable).
      workers: not supported.
      linear_solver: the implicit-function-theorem solve: "auto" (dense up to
        n = 1000, then "cg"), "direct", "gmres", "cg".
      on_failure: "raise" (`jaxbridge.scipy.SolverError`) or "nan".

    Returns:
      :class:`OptimizeResult` with `x`, `cost`, `fun` (residuals), `jac`, `grad`,
      `optimality`, `active_mask`, `success`, `status`, `nfev`, `njev`; all but the
      counters are differentiable (recomputed in JAX at `x*`).

    Raises:
      SolverError: SciPy reported failure, or the implicit-function-theorem system is
        singular, with ``on_failure="raise"``.
      NotImplementedError: `kwargs`, a callable or unknown `loss`, `jac_sparsity` or
        `workers` given.

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from jaxbridge.scipy.optimize import least_squares
      >>> t = jnp.linspace(0.0, 1.0, 8)
      >>> def residual(theta, data):
      ...     return theta[0] * jnp.exp(-theta[1] * t) - data
      >>> data = 2.0 * jnp.exp(-1.5 * t)
      >>> fit = least_squares(residual, jnp.ones(2), args=(data,))
      >>> [round(float(v), 6) for v in fit.x]
      [2.0, 1.5]
      >>> float(jnp.abs(jax.jacobian(lambda d: least_squares(residual, jnp.ones(2),
      ...     args=(d,)).x)(data)).max()) > 0
      True
    """
    name = "optimize.least_squares"
    if kwargs:
        raise unsupported(name, "kwargs", "pass extra arguments through args, or close over "
                          "them")
    if callable(loss) or loss not in LOSSES:
        raise unsupported(name, "loss", f"only SciPy's named losses {LOSSES} have a JAX form "
                          f"here; got {loss!r}")
    for arg, value in (("jac_sparsity", jac_sparsity), ("workers", workers)):
        if value is not None:
            raise unsupported(name, arg, "the Jacobian comes from JAX, dense")
    if isinstance(jac, str):
        jac = None
    options = {"method": method, "ftol": ftol, "xtol": xtol, "gtol": gtol, "loss": loss,
               "f_scale": float(f_scale), "max_nfev": max_nfev, "verbose": int(verbose),
               "tr_solver": tr_solver, "diff_step": None}
    if x_scale is not None:
        options["x_scale"] = x_scale if isinstance(x_scale, str) else \
            tuple(np.ravel(np.asarray(x_scale, np.float64)))
    if tr_options:
        options["tr_options"] = tuple(sorted(tr_options.items()))
    del diff_step  # the Jacobian is JAX's
    x, active, stats, success, user_fun = _call("lsq", fun, x0, args, method, jac, None,
                                                options, callback, linear_solver,
                                                on_failure, bounds)
    r = jnp.ravel(user_fun(x))
    J = jax.jacfwd(lambda x: jnp.ravel(user_fun(x)))(x).reshape(r.size, -1)
    z = (r / f_scale) ** 2
    rho1 = jax.grad(lambda z: jnp.sum(_rho(loss, z)))(z)
    cost = 0.5 * f_scale ** 2 * jnp.sum(_rho(loss, z))
    grad = (J.T @ (rho1 * r)).reshape(jnp.shape(x))
    free = active == 0
    optimality = jnp.max(jnp.abs(jnp.where(free, grad, 0.0))) if grad.size else jnp.zeros(())
    return OptimizeResult(x=x, cost=cost, fun=r, jac=J, grad=grad, optimality=optimality,
                          active_mask=active.astype(jnp.int32), success=success,
                          status=stats[0], nfev=stats[1], njev=stats[2], nit=None)
