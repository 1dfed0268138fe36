"""Differentiable `scipy.integrate`: `solve_ivp` (continuous adjoint) and `quad`.

The integrands and right-hand sides are written in JAX; SciPy does the solving on
the host; the derivatives come from the problem's structure (adjoint ODE, Leibniz
rule), never from differentiating SciPy's iterations.

**solve_ivp, reverse mode (the continuous adjoint).** For `y' = f(t, y, p)` and
outputs `y_i = y(t_i)`, the cotangent `a(t) = dL/dy(t)` solves `a' = -a^T df/dy`
backward in time, jumping by `dL/dy_i` at each evaluation time, and
`dL/dp = int a^T df/dp dt` is integrated alongside it. Both are solved by SciPy with
the same `method` (implicit methods get the exact adjoint Jacobian from JAX); the
vector-Jacobian products of `f` are computed by JAX, compiled once per function.

*Memory (checkpointing choice).* The backward pass needs `y(t)` between the
evaluation times. Re-integrating `y` backward is unstable for stiff and dissipative
problems, and storing the whole forward trajectory's dense output costs memory in
proportion to the number of steps. We therefore use the outputs `y(t_i)` themselves
as checkpoints: for each interval `[t_{i-1}, t_i]`, last first, `y` is re-solved
forward from the checkpoint with dense output and the adjoint is solved backward
against that interpolant. Memory is O(len(t_eval) + steps in one interval), and a
gradient costs about one extra forward solve plus one adjoint solve.

**solve_ivp, forward mode (jvp/jacfwd).** The forward sensitivity equations
`s' = df/dy s + df/dp dp` are solved together with `y` (one augmented solve per
tangent).
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import scipy.integrate
import scipy.sparse
from jax.flatten_util import ravel_pytree

from .. import _foreign
from ._common import (_NO_ARGS, as_float_array, as_params, call_args, check_policy, f64, failure, fill_zeros,
                      host_jit, jnp_ravel, np_ravel, np_unravel, on_cpu, static_options)

__all__ = ["solve_ivp", "quad", "OdeResult", "METHODS", "IMPLICIT_METHODS"]

METHODS = ("RK23", "RK45", "DOP853", "Radau", "BDF", "LSODA")
IMPLICIT_METHODS = ("Radau", "BDF", "LSODA")
_SPARSE_ADJOINT_JAC = 64  # parameter count above which the adjoint Jacobian is sparse


class OdeResult(NamedTuple):
    """What :func:`solve_ivp` returns (SciPy's layout)."""

    t: jax.Array  #: the evaluation times, shape (T,)
    y: jax.Array  #: the solution, shape y0.shape + (T,)


# =================================================================== solve_ivp
class _Ode:
    """Host-side view of one ODE: NumPy callables for SciPy, backed by jitted JAX."""

    def __init__(self, fun, has_args, shape, jac, params):
        self.shape = tuple(shape)
        self.n = int(np.prod(self.shape, dtype=int))
        self.params = params
        self.p_flat = np_ravel(params)
        self.P = self.p_flat.size
        key = (fun, has_args, self.shape, jac)
        call = call_args(has_args)
        shape_ = self.shape

        def f(t, y, p):
            return jnp.ravel(fun(*call(t, y.reshape(shape_), p=p))).astype(y.dtype)

        def jac_y(t, y, p):
            if callable(jac):
                n = y.size
                return jnp.reshape(jac(*call(t, y.reshape(shape_), p=p)), (n, n))
            return jax.jacfwd(f, argnums=1)(t, y, p)

        def adj(t, y, a, p):
            _, pullback = jax.vjp(lambda y, p: f(t, y, p), y, p)
            ay, ap = pullback(a)
            return jnp.concatenate([-ay, -jnp_ravel(ap)])

        def adj_jac(t, y, p):
            flat, unravel = ravel_pytree(p)
            jy = jax.jacfwd(f, argnums=1)(t, y, p)
            jp = jax.jacfwd(lambda q: f(t, y, unravel(q)))(flat).reshape(y.size, -1)
            return -jy.T, -jp.T

        def tan(t, z, p, dp):
            n = z.size // 2
            fy, fs = jax.jvp(lambda y, p: f(t, y, p), (z[:n], p), (z[n:], dp))
            return jnp.concatenate([fy, fs])

        def tan_jac(t, z, p, dp):
            return jax.jacfwd(tan, argnums=1)(t, z, p, dp)

        self._f = host_jit(key + ("f",), lambda: f)
        self._jac = host_jit(key + ("jac",), lambda: jac_y)
        self._adj = host_jit(key + ("adj",), lambda: adj)
        self._adj_jac = host_jit(key + ("adj_jac",), lambda: adj_jac)
        self._tan = host_jit(key + ("tan",), lambda: tan)
        self._tan_jac = host_jit(key + ("tan_jac",), lambda: tan_jac)

    # SciPy-facing callables (float64 NumPy in and out)
    def f(self, t, y):
        return f64(self._f(t, y, self.params))

    def jac(self, t, y):
        return f64(self._jac(t, y, self.params))

    def jac_kw(self, method, jac):
        if method in IMPLICIT_METHODS and jac is not False:
            return {"jac": self.jac}
        return {}


def _ivp_result(t0, y0, t_eval, params, **_):
    return jax.ShapeDtypeStruct((t_eval.shape[0], *y0.shape), y0.dtype)


def _fail(name, method, message, on_failure):
    if on_failure == "raise":
        raise failure(name, f"solve_ivp(method={method!r}): {message}")


@_foreign.foreign(_ivp_result)
def _ivp(t0, y0, t_eval, params, *, fun, has_args, method, rtol, atol, jac, adjoint_rtol,
         adjoint_atol, on_failure, options):
    """The forward solve: y(t_eval) of y' = fun(t, y, params), y(t0) = y0."""
    t0, t_eval = float(t0), f64(t_eval)
    T = t_eval.shape[0]
    nan = np.full((T, *y0.shape), np.nan, y0.dtype)
    with on_cpu():
        ode = _Ode(fun, has_args, y0.shape, jac, params)
        y0f = np.ravel(f64(y0))
        if T == 0:
            return nan
        if np.all(t_eval == t0):
            return np.broadcast_to(y0, (T, *y0.shape)).astype(y0.dtype)
        sol = scipy.integrate.solve_ivp(
            ode.f, (t0, t_eval[-1]), y0f, method=method, t_eval=t_eval, rtol=rtol, atol=atol,
            **ode.jac_kw(method, jac), **dict(options))
    if sol.status != 0:
        _fail("integrate.solve_ivp", method, sol.message, on_failure)
        return nan
    if not np.all(np.isfinite(sol.y)):
        _fail("integrate.solve_ivp", method, "the solution is not finite", on_failure)
        return nan
    return sol.y.T.reshape(T, *y0.shape).astype(y0.dtype)


@_ivp.defvjp
def _ivp_vjp(primals, ys, ct, *, fun, has_args, method, rtol, atol, jac, adjoint_rtol,
             adjoint_atol, on_failure, options):
    """Continuous adjoint with checkpoints at the evaluation times (see module doc)."""
    t0, y0, t_eval, params = primals
    t0, t_eval = float(t0), f64(t_eval)
    T = t_eval.shape[0]
    if T == 0 or not np.all(np.isfinite(ys)):  # failed forward solve ("nan" policy)
        nan = lambda x: np.full(np.shape(x), np.nan, np.asarray(x).dtype)  # noqa: E731
        return (nan(t0), nan(y0), nan(t_eval), jax.tree_util.tree_map(nan, params))
    implicit = method in IMPLICIT_METHODS
    with on_cpu():
        ode = _Ode(fun, has_args, y0.shape, jac, params)
        n, P = ode.n, ode.P
        Y = f64(ys).reshape(T, n)
        G = f64(ct).reshape(T, n)
        a, mu = np.zeros(n), np.zeros(P)
        t_bar = np.zeros(T)
        # The parameter-gradient quadrature mu is left out of the step-size control
        # (as CVODES does by default): it is a pure quadrature of a and y, so the steps
        # that resolve them integrate it to the same order, and controlling it too makes
        # BDF stall on stiff problems whose adjoint has a fast initial transient.
        adj_atol = np.concatenate([np.full(n, adjoint_atol), np.full(P, 1e100)])
        starts = [(t0, np.ravel(f64(y0)))] + [(t_eval[i], Y[i]) for i in range(T - 1)]
        for i in range(T - 1, -1, -1):
            t_i = t_eval[i]
            t_bar[i] = G[i] @ ode.f(t_i, Y[i])
            a = a + G[i]
            t_prev, y_prev = starts[i]
            if t_prev == t_i:
                continue
            fwd = scipy.integrate.solve_ivp(
                ode.f, (t_prev, t_i), y_prev, method=method, dense_output=True, rtol=rtol,
                atol=atol, **ode.jac_kw(method, jac), **dict(options))
            if fwd.status != 0:
                _fail("integrate.solve_ivp", method,
                      f"re-solving the forward problem for the adjoint: {fwd.message}",
                      on_failure)
                return _ivp_vjp_nan(primals)
            y_of = fwd.sol

            def rhs(t, z, y_of=y_of):
                return f64(ode._adj(t, y_of(t), z[:n], ode.params))

            kw = {}
            if implicit and jac is not False:
                def adj_jac(t, z, y_of=y_of):
                    jy, jp = ode._adj_jac(t, y_of(t), ode.params)
                    jy, jp = f64(jy), f64(jp)
                    if P > _SPARSE_ADJOINT_JAC and method != "LSODA":
                        col = scipy.sparse.vstack([scipy.sparse.csc_matrix(jy),
                                                   scipy.sparse.csc_matrix(jp)])
                        return scipy.sparse.hstack(
                            [col, scipy.sparse.csc_matrix((n + P, P))], format="csc")
                    m = np.zeros((n + P, n + P))
                    m[:n, :n], m[n:, :n] = jy, jp
                    return m
                kw["jac"] = adj_jac
            back = scipy.integrate.solve_ivp(
                rhs, (t_i, t_prev), np.concatenate([a, mu]), method=method,
                rtol=adjoint_rtol, atol=adj_atol, **kw, **dict(options))
            if back.status != 0:
                _fail("integrate.solve_ivp", method, f"adjoint solve: {back.message}",
                      on_failure)
                return _ivp_vjp_nan(primals)
            a, mu = back.y[:n, -1], back.y[n:, -1]
        t0_bar = -(a @ ode.f(t0, np.ravel(f64(y0))))
    return (np.asarray(t0_bar, np.asarray(primals[0]).dtype),
            a.reshape(y0.shape).astype(y0.dtype),
            t_bar.astype(np.asarray(primals[2]).dtype),
            np_unravel(mu, params))


def _ivp_vjp_nan(primals):
    nan = lambda x: np.full(np.shape(x), np.nan, np.asarray(x).dtype)  # noqa: E731
    return tuple(jax.tree_util.tree_map(nan, p) for p in primals)


@_ivp.defjvp
def _ivp_jvp(primals, ys, tangents, *, fun, has_args, method, rtol, atol, jac, adjoint_rtol,
             adjoint_atol, on_failure, options):
    """Forward sensitivities: (y, s)' = (f, df/dy s + df/dp dp), s(t0) = dy0 - f dt0."""
    t0, y0, t_eval, params = primals
    dt0, dy0, dt_eval, dparams = tangents
    t0, t_eval = float(t0), f64(t_eval)
    T = t_eval.shape[0]
    if T == 0 or not np.all(np.isfinite(ys)):
        return np.full(np.shape(ys), np.nan, ys.dtype)
    with on_cpu():
        ode = _Ode(fun, has_args, y0.shape, jac, params)
        n = ode.n
        y0f = np.ravel(f64(y0))
        s0 = np.zeros(n) if dy0 is None else np.ravel(f64(dy0))
        if dt0 is not None:
            s0 = s0 - ode.f(t0, y0f) * float(dt0)
        dp = fill_zeros(dparams, params)
        Y = f64(ys).reshape(T, n)
        if np.all(t_eval == t0):
            S = np.broadcast_to(s0, (T, n)).copy()
        else:
            kw = {}
            if method in IMPLICIT_METHODS and jac is not False:
                kw["jac"] = lambda t, z: f64(ode._tan_jac(t, z, ode.params, dp))
            atol_s = np.concatenate([np.full(n, atol), np.full(n, atol)])
            sol = scipy.integrate.solve_ivp(
                lambda t, z: f64(ode._tan(t, z, ode.params, dp)), (t0, t_eval[-1]),
                np.concatenate([y0f, s0]), method=method, t_eval=t_eval, rtol=rtol,
                atol=atol_s, **kw, **dict(options))
            if sol.status != 0:
                _fail("integrate.solve_ivp", method, f"sensitivity solve: {sol.message}",
                      on_failure)
                return np.full(np.shape(ys), np.nan, ys.dtype)
            S = sol.y[n:].T
        if dt_eval is not None:
            S = S + np.stack([ode.f(t, y) for t, y in zip(t_eval, Y)]) * f64(dt_eval)[:, None]
    return S.reshape(ys.shape).astype(ys.dtype)


def solve_ivp(fun: Callable[..., Any], t_span: Any, y0: Any, t_eval: Any, args: Any = None,
              *, method: str = "RK45", rtol: float = 1e-6, atol: float = 1e-9,
              jac: Callable[..., Any] | bool | None = None, adjoint_rtol: float | None = None,
              adjoint_atol: float | None = None, on_failure: str = "raise",
              **options: Any) -> OdeResult:
    """Solve `y' = fun(t, y, args)` with SciPy; differentiable in y0, args, t_span[0], t_eval.

    Args:
      fun: the right-hand side, written in JAX: `fun(t, y, args)` (or `fun(t, y)` when
        `args` is None), returning an array shaped like `y`. Must be hashable (any
        function is); it selects a compiled version, so pass the same function object
        across calls.
      t_span: `(t0, t1)`. The integration runs from `t0` to `t_eval[-1]`; `t0` is
        differentiable, `t1` is not used beyond SciPy's conventions.
      y0: initial state, any shape (float).
      t_eval: the times at which the solution is returned (required: JAX needs a
        fixed output shape); monotone in the direction of integration.
      args: a pytree of float arrays passed as the third argument of `fun` (one
        argument, not unpacked as in SciPy); the parameters gradients flow to.
      method: any of SciPy's: "RK23", "RK45", "DOP853", "Radau", "BDF", "LSODA".
      rtol, atol: forward tolerances (scalars; tighter than SciPy's defaults because
        gradients inherit the solution's error).
      jac: for the implicit methods. None: the exact Jacobian computed by JAX
        (`jax.jacfwd(fun)`); a JAX function `jac(t, y, args)`; False: SciPy's finite
        differences (forward solve only; the adjoint always uses JAX's Jacobian).
      adjoint_rtol, adjoint_atol: tolerances of the backward adjoint solve (default:
        rtol, atol).
      on_failure: "raise" (default): a failed SciPy solve raises an error naming the
        solver and SciPy's message; "nan": the outputs (and gradients) are NaN.
      **options: passed on to `scipy.integrate.solve_ivp` (e.g. max_step,
        first_step); static, so hashable.

    Returns:
      `OdeResult(t, y)` with `t = t_eval` and `y` of shape `y0.shape + (len(t_eval),)`.

    Gradients: continuous adjoint (reverse mode) and forward sensitivities
    (forward mode); see the module docstring for the checkpointing scheme.
    """
    name = "integrate.solve_ivp"
    check_policy(on_failure, name)
    if method not in METHODS:
        raise ValueError(f"jaxbridge.scipy.{name}: method must be one of {METHODS}, "
                         f"got {method!r}")
    y0 = as_float_array(y0)
    t_eval = jnp.asarray(t_eval)
    if t_eval.ndim != 1:
        raise ValueError(f"jaxbridge.scipy.{name}: t_eval must be 1-D, got shape {t_eval.shape}")
    tdtype = jnp.result_type(t_eval.dtype, float)
    t_eval = t_eval.astype(tdtype)
    t0 = jnp.asarray(t_span[0], tdtype)
    has_args = args is not None
    params = as_params(args, name) if has_args else _NO_ARGS()
    ys = _ivp(t0, y0, t_eval, params, fun=fun, has_args=has_args, method=method,
              rtol=float(rtol), atol=float(atol), jac=jac,
              adjoint_rtol=float(rtol if adjoint_rtol is None else adjoint_rtol),
              adjoint_atol=float(atol if adjoint_atol is None else adjoint_atol),
              on_failure=on_failure, options=static_options(options))
    return OdeResult(t=t_eval, y=jnp.moveaxis(ys, 0, -1))


# =================================================================== quad
class _Integrand:
    def __init__(self, fun, has_args, params, dtype_key):
        call = call_args(has_args)
        key = (fun, has_args, dtype_key)
        self.params = params

        def f(x, p):
            return jnp.asarray(fun(*call(x, p=p))).astype(jnp.result_type(float))

        def df_dp(x, p):
            return jnp_ravel(jax.grad(f, argnums=1)(x, p))

        def jvp_p(x, p, dp):
            return jax.jvp(lambda q: f(x, q), (p,), (dp,))[1]

        self._f = host_jit(key + ("f",), lambda: f)
        self._df = host_jit(key + ("df",), lambda: df_dp)
        self._jvp = host_jit(key + ("jvp",), lambda: jvp_p)

    def f(self, x):
        return float(self._f(x, self.params))


def _quad_result(a, b, params, **_):
    return jax.ShapeDtypeStruct((), jnp.result_type(a.dtype, b.dtype))


def _scalar_fun_check(out, name):
    if np.shape(out) != ():
        raise TypeError(f"jaxbridge.scipy.{name}: the integrand must return a scalar")


def _quad_run(integrand, a, b, epsabs, epsrel, limit, on_failure, what):
    res = scipy.integrate.quad(integrand, a, b, epsabs=epsabs, epsrel=epsrel, limit=limit,
                               full_output=1)
    if len(res) > 3:  # SciPy appends a message when ier != 0
        if on_failure == "raise":
            raise failure("integrate.quad", f"quad{what}: {res[3]}")
        return np.nan
    return res[0]


@_foreign.foreign(_quad_result)
def _quad(a, b, params, *, fun, has_args, epsabs, epsrel, limit, on_failure):
    with on_cpu():
        q = _Integrand(fun, has_args, params, ())
        val = _quad_run(q.f, float(a), float(b), epsabs, epsrel, limit, on_failure, "")
    return np.asarray(val, np.result_type(a.dtype, b.dtype))


def _f_at(q, x):
    return 0.0 if np.isinf(x) else q.f(float(x))


@_quad.defvjp
def _quad_vjp(primals, out, ct, *, fun, has_args, epsabs, epsrel, limit, on_failure):
    a, b, params = primals
    ct = float(ct)
    if not np.isfinite(out):
        nan = lambda x: np.full(np.shape(x), np.nan, np.asarray(x).dtype)  # noqa: E731
        return nan(a), nan(b), jax.tree_util.tree_map(nan, params)
    with on_cpu():
        q = _Integrand(fun, has_args, params, ())
        a_bar, b_bar = -ct * _f_at(q, a), ct * _f_at(q, b)
        p_bar = ()
        if has_args and np_ravel(params).size:
            res = scipy.integrate.quad_vec(lambda x: f64(q._df(x, q.params)), float(a),
                                           float(b), epsabs=epsabs, epsrel=epsrel,
                                           limit=limit, full_output=True)
            if not res[2].success:
                if on_failure == "raise":
                    raise failure("integrate.quad", f"quad_vec of the parameter gradient: "
                                  f"{res[2].message}")
                res = (np.full_like(res[0], np.nan),) + res[1:]
            p_bar = np_unravel(ct * f64(res[0]), params)
    return (np.asarray(a_bar, a.dtype), np.asarray(b_bar, b.dtype),
            p_bar if has_args else None)


@_quad.defjvp
def _quad_jvp(primals, out, tangents, *, fun, has_args, epsabs, epsrel, limit, on_failure):
    a, b, params = primals
    da, db, dparams = tangents
    if not np.isfinite(out):
        return np.asarray(np.nan, out.dtype)
    with on_cpu():
        q = _Integrand(fun, has_args, params, ())
        total = 0.0
        if da is not None:
            total -= float(da) * _f_at(q, a)
        if db is not None:
            total += float(db) * _f_at(q, b)
        if has_args and dparams is not None:
            dp = fill_zeros(dparams, params)
            total += _quad_run(lambda x: float(q._jvp(x, q.params, dp)), float(a), float(b),
                               epsabs, epsrel, limit, on_failure, " of the tangent")
    return np.asarray(total, out.dtype)


def quad(fun: Callable[..., Any], a: Any, b: Any, args: Any = None, *,
         epsabs: float = 1.49e-8, epsrel: float = 1.49e-8, limit: int = 50,
         on_failure: str = "raise") -> jax.Array:
    """`int_a^b fun(x, args) dx` by `scipy.integrate.quad`; differentiable in a, b, args.

    `fun(x, args)` (or `fun(x)` when `args` is None) is written in JAX and returns a
    scalar. Gradients: w.r.t. `args`, the integral of the gradient (SciPy's
    `quad_vec` over JAX's `grad`); w.r.t. the limits, the Leibniz rule
    (`dI/db = fun(b)`, `dI/da = -fun(a)`; zero for infinite limits). Forward mode
    (`jvp`) likewise. `on_failure` as in :func:`solve_ivp` (SciPy's `ier != 0`,
    e.g. "the maximum number of subdivisions has been achieved", is a failure).

    Returns only the value (SciPy's `abserr` is dropped).
    """
    name = "integrate.quad"
    check_policy(on_failure, name)
    dtype = jnp.result_type(jnp.asarray(a).dtype, jnp.asarray(b).dtype, float)
    a, b = jnp.asarray(a, dtype), jnp.asarray(b, dtype)
    has_args = args is not None
    params = as_params(args, name) if has_args else _NO_ARGS()
    return _quad(a, b, params, fun=fun, has_args=has_args, epsabs=float(epsabs),
                 epsrel=float(epsrel), limit=int(limit), on_failure=on_failure)
