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

**solve_ivp, forward sensitivities.** The sensitivity equations
`S' = df/dy S + df/dp D`, `S(t0) = S0`, are solved together with `y` in one augmented
solve, for K directions at once (the columns of `S`, `n x K`). Forward mode
(jvp/jacfwd) uses them with K = 1. Reverse mode can use them too, with one column per
input (K = n + P: the whole Jacobian of the outputs), then contracts with the
cotangents: one smooth solve from t0 with no restarts, no interpolation and no
backward transients, which for small systems is several times cheaper than the
adjoint (SciML's `ForwardDiffSensitivity` rule of thumb), and costs
`O(n (n + P))` per right-hand side, so the adjoint wins for large systems.
`sensitivity="auto"` (the default) picks forward sensitivities when the augmented
system is small (`n (1 + n + P) <= 64`) and the continuous adjoint otherwise.
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

__all__ = ["solve_ivp", "quad", "OdeResult", "METHODS", "IMPLICIT_METHODS", "SENSITIVITIES"]

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

        def sens(t, z, p, dp):
            # z = [y, vec(S)] with S (n, K); dp (P, K): the parameter directions.
            n = self.n
            y, S = z[:n], z[n:].reshape(n, -1)
            flat, unravel = ravel_pytree(p)

            def column(s, d):
                return jax.jvp(lambda y, q: f(t, y, unravel(q)), (y, flat), (s, d))[1]
            dS = jax.vmap(column, in_axes=1, out_axes=1)(S, dp.astype(flat.dtype))
            return jnp.concatenate([f(t, y, p), jnp.ravel(dS)])

        def sens_jac(t, z, p, dp):
            return jax.jacfwd(sens, argnums=1)(t, z, p, dp)

        self._f = host_jit(key + ("f",), lambda: f)
        self._jac = host_jit(key + ("jac",), lambda: jac_y)
        self._adj = host_jit(key + ("adj",), lambda: adj)
        self._adj_jac = host_jit(key + ("adj_jac",), lambda: adj_jac)
        self._sens = host_jit(key + ("sens",), lambda: sens)
        self._sens_jac = host_jit(key + ("sens_jac",), lambda: sens_jac)

    # SciPy-facing callables (float64 NumPy in and out)
    def f(self, t, y):
        return f64(self._f(t, y, self.params))

    def jac(self, t, y):
        return f64(self._jac(t, y, self.params))

    def jac_kw(self, method, jac):
        if method in IMPLICIT_METHODS and jac is not False:
            return {"jac": self.jac}
        return {}

    def sensitivities(self, t0, y0, t_eval, S0, dp, *, method, rtol, atol, sens_rtol,
                      sens_atol, jac, options):
        """`S(t_i)` (T, n, K) of `S' = f_y S + f_p dp`, `S(t0) = S0` (n, K); dp (P, K).

        Returns `(S, None)`, or `(None, SciPy's message)` when the solve fails.
        """
        n, K = S0.shape
        T = t_eval.shape[0]
        if np.all(t_eval == t0):
            return np.broadcast_to(S0, (T, n, K)).copy(), None
        dp = jax.device_put(np.asarray(dp, np.float64).reshape(self.P, K))
        params = self.params
        kw = {}
        if method in IMPLICIT_METHODS and jac is not False:
            kw["jac"] = lambda t, z: f64(self._sens_jac(t, z, params, dp))
        sol = scipy.integrate.solve_ivp(
            lambda t, z: f64(self._sens(t, z, params, dp)), (t0, t_eval[-1]),
            np.concatenate([y0, np.ravel(S0)]), method=method, t_eval=t_eval,
            rtol=min(rtol, sens_rtol), atol=np.concatenate([np.full(n, atol),
                                                            np.full(n * K, sens_atol)]),
            **kw, **dict(options))
        if sol.status != 0:
            return None, sol.message
        return sol.y[n:].T.reshape(T, n, K), None


def _ivp_result(t0, y0, t_eval, params, **_):
    return jax.ShapeDtypeStruct((t_eval.shape[0], *y0.shape), y0.dtype)


def _fail(name, method, message, on_failure):
    if on_failure == "raise":
        raise failure(name, f"solve_ivp(method={method!r}): {message}")


@_foreign.foreign(_ivp_result)
def _ivp(t0, y0, t_eval, params, *, fun, has_args, method, rtol, atol, jac, adjoint_rtol,
         adjoint_atol, sensitivity, on_failure, options):
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
             adjoint_atol, sensitivity, on_failure, options):
    """Reverse mode: forward sensitivities, or the continuous adjoint with checkpoints
    at the evaluation times (`sensitivity`; see the module docstring)."""
    t0, y0, t_eval, params = primals
    t0, t_eval = float(t0), f64(t_eval)
    T = t_eval.shape[0]
    if T == 0:  # no outputs, nothing to differentiate
        return tuple(jax.tree_util.tree_map(lambda x: np.zeros_like(np.asarray(x)), p)
                     for p in primals)
    if not np.all(np.isfinite(ys)):  # failed forward solve ("nan" policy)
        return _ivp_vjp_nan(primals)
    with on_cpu():
        ode = _Ode(fun, has_args, y0.shape, jac, params)
        n, P = ode.n, ode.P
        Y = f64(ys).reshape(T, n)
        G = f64(ct).reshape(T, n)
        t_bar = np.array([G[i] @ ode.f(t_eval[i], Y[i]) for i in range(T)])
        if sensitivity == "forward":
            # The whole Jacobian d y(t_i) / d(y0, params) in one solve, then contracted.
            eye = np.eye(n + P)
            S, message = ode.sensitivities(
                t0, np.ravel(f64(y0)), t_eval, eye[:n], eye[n:], method=method, rtol=rtol,
                atol=atol, sens_rtol=adjoint_rtol, sens_atol=adjoint_atol, jac=jac,
                options=options)
            if S is None:
                _fail("integrate.solve_ivp", method, f"sensitivity solve: {message}",
                      on_failure)
                return _ivp_vjp_nan(primals)
            g = np.einsum("ti,tik->k", G, S)
            a, mu = g[:n], g[n:]
            return _ivp_cotangents(primals, ode, t0, y0, a, t_bar, mu)
        implicit = method in IMPLICIT_METHODS
        a, mu = np.zeros(n), np.zeros(P)
        # The parameter-gradient quadrature mu is left out of the step-size control
        # (as CVODES does by default): it is a pure quadrature of a and y, so the steps
        # that resolve them integrate it to the same order, and controlling it too makes
        # BDF stall on stiff problems whose adjoint has a fast initial transient.
        adj_atol = np.concatenate([np.full(n, adjoint_atol), np.full(P, 1e100)])
        starts = [(t0, np.ravel(f64(y0)))] + [(t_eval[i], Y[i]) for i in range(T - 1)]
        for i in range(T - 1, -1, -1):
            t_i = t_eval[i]
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
        return _ivp_cotangents(primals, ode, t0, y0, a, t_bar, mu)


def _ivp_cotangents(primals, ode, t0, y0, a, t_bar, mu):
    """(t0, y0, t_eval, params) cotangents from a = dL/dy0, dL/dt_eval and dL/dparams."""
    t0_bar = -(a @ ode.f(t0, np.ravel(f64(y0))))  # moving t0 = moving y0 by -f dt0
    return (np.asarray(t0_bar, np.asarray(primals[0]).dtype),
            a.reshape(y0.shape).astype(y0.dtype),
            t_bar.astype(np.asarray(primals[2]).dtype),
            np_unravel(mu, ode.params))


def _ivp_vjp_nan(primals):
    nan = lambda x: np.full(np.shape(x), np.nan, np.asarray(x).dtype)  # noqa: E731
    return tuple(jax.tree_util.tree_map(nan, p) for p in primals)


@_ivp.defjvp
def _ivp_jvp(primals, ys, tangents, *, fun, has_args, method, rtol, atol, jac, adjoint_rtol,
             adjoint_atol, sensitivity, on_failure, options):
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
        Y = f64(ys).reshape(T, n)
        S, message = ode.sensitivities(
            t0, y0f, t_eval, s0[:, None], np_ravel(fill_zeros(dparams, params))[:, None],
            method=method, rtol=rtol, atol=atol, sens_rtol=rtol, sens_atol=atol, jac=jac,
            options=options)
        if S is None:
            _fail("integrate.solve_ivp", method, f"sensitivity solve: {message}", on_failure)
            return np.full(np.shape(ys), np.nan, ys.dtype)
        S = S[..., 0]
        if dt_eval is not None:
            S = S + np.stack([ode.f(t, y) for t, y in zip(t_eval, Y)]) * f64(dt_eval)[:, None]
    return S.reshape(ys.shape).astype(ys.dtype)


SENSITIVITIES = ("auto", "adjoint", "forward")
_FORWARD_SENSITIVITY_MAX = 64  # augmented size n (1 + n + P) up to which "auto" -> forward


def _sensitivity_choice(sensitivity: str, n: int, P: int) -> str:
    if sensitivity not in SENSITIVITIES:
        raise ValueError(f"jaxbridge.scipy.integrate.solve_ivp: sensitivity must be one of "
                         f"{SENSITIVITIES}, got {sensitivity!r}")
    if sensitivity == "auto":
        return "forward" if n * (1 + n + P) <= _FORWARD_SENSITIVITY_MAX else "adjoint"
    return sensitivity


def solve_ivp(fun: Callable[..., Any], t_span: Any, y0: Any, t_eval: Any, args: Any = None,
              *, method: str = "RK45", rtol: float = 1e-6, atol: float = 1e-9,
              jac: Callable[..., Any] | bool | None = None, adjoint_rtol: float | None = None,
              adjoint_atol: float | None = None, sensitivity: str = "auto",
              on_failure: str = "raise", **options: Any) -> OdeResult:
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
      adjoint_rtol, adjoint_atol: tolerances of the gradient solve: the backward
        adjoint solve, or the sensitivity components of the forward-sensitivity solve
        (default: rtol, atol).
      sensitivity: how reverse mode (grad, vjp, jacrev) computes the gradient.
        "adjoint": the continuous adjoint (one backward solve; memory independent of
        the number of steps; the choice for large systems). "forward": forward
        sensitivities for every input at once (one augmented forward solve of size
        `n (1 + n + P)` for `n` states and `P` parameters; no restarts and no backward
        transients, so much cheaper for small stiff systems). "auto" (default):
        "forward" when `n (1 + n + P) <= 64`, else "adjoint". Forward mode (jvp,
        jacfwd) always uses forward sensitivities.
      on_failure: "raise" (default): a failed SciPy solve raises an error naming the
        solver and SciPy's message; "nan": the outputs (and gradients) are NaN.
      **options: passed on to `scipy.integrate.solve_ivp` (e.g. max_step,
        first_step); static, so hashable.

    Returns:
      `OdeResult(t, y)` with `t = t_eval` and `y` of shape `y0.shape + (len(t_eval),)`.

    Gradients: continuous adjoint or forward sensitivities (reverse mode, see
    `sensitivity`) and forward sensitivities (forward mode); see the module docstring.

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from jaxbridge.scipy.integrate import solve_ivp
      >>> decay = lambda t, y, k: -k * y
      >>> grad = jax.grad(lambda k: solve_ivp(decay, (0.0, 1.0), jnp.ones(1),
      ...                                     jnp.array([1.0]), k).y[0, 0])
      >>> round(float(grad(1.0)), 4)  # d/dk exp(-k) at k = 1
      -0.3679
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
    sensitivity = _sensitivity_choice(sensitivity, y0.size,
                                      sum(x.size for x in jax.tree_util.tree_leaves(params)))
    ys = _ivp(t0, y0, t_eval, params, fun=fun, has_args=has_args, method=method,
              rtol=float(rtol), atol=float(atol), jac=jac,
              adjoint_rtol=float(rtol if adjoint_rtol is None else adjoint_rtol),
              adjoint_atol=float(atol if adjoint_atol is None else adjoint_atol),
              sensitivity=sensitivity, on_failure=on_failure, options=static_options(options))
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
