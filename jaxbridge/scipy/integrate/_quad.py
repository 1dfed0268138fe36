"""Differentiable `scipy.integrate.quad`: the host call and its Leibniz-rule derivatives."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import scipy.integrate

from ... import _foreign
from ..._core.jaxapi import jax_setting
from .._common import (
    NotEager,
    check_policy,
    eager_device,
    f64,
    failure,
    fill_zeros,
    host_copies,
    host_float,
    host_jit,
    jnp_ravel,
    nan_like,
    np_unravel,
    on_cpu,
    static_options,
    tangent_like,
    to_device,
    unsupported,
)
from .._numpy_functions import runs_as_scipy
from .._trace import HostFun, check_args, convert
from ._arguments import check_returns
from ._gk21_nodes import NodeTable, seed_intervals
from ._numpy_fallback import QUAD

__all__ = ["quad"]


def _roles(fun: HostFun, xdtype: Any) -> dict[str, Callable[..., Any]]:
    """The JAX functions of the integrand `fun` the host side calls, each taking the
    fixed operands, the abscissa(e) and the parameters: the value `f`, `f_many` at a
    vector of abscissae, the parameter gradient `df` and a tangent `jvp`."""
    def f(fx: Any, x: Any, p: Any) -> Any:
        return jnp.asarray(fun(fun.merge(p, fx), x.astype(xdtype))).astype(
            jnp.result_type(float))

    def df_dp(fx: Any, x: Any, p: Any) -> Any:
        return jnp_ravel(jax.grad(f, argnums=2)(fx, x, p))

    def jvp_p(fx: Any, x: Any, p: Any, dp: Any) -> Any:
        return jax.jvp(lambda q: f(fx, x, q), (p,), (tangent_like(dp, p),))[1]

    def f_many(fx: Any, xs: Any, p: Any) -> Any:
        return jax.vmap(f, in_axes=(None, 0, None))(fx, xs, p)

    return {"f": f, "f_many": f_many, "df": df_dp, "jvp": jvp_p}


class _Integrand:
    """The integrand on the host, its JAX functions compiled once per converted
    function and role (`host_jit`), looked up when first used."""

    def __init__(self, fun: HostFun, xdtype: Any, params: tuple, fixed: tuple) -> None:
        self._fun, self._xdtype = fun, np.dtype(xdtype)
        self.params, self.fixed = host_copies((params, fixed))

    def _jitted(self, role: str) -> Callable[..., Any]:
        return host_jit((self._fun, self._xdtype, role),
                        lambda: _roles(self._fun, self._xdtype)[role])

    def f(self, x: float) -> float:
        return host_float(self._jitted("f")(self.fixed, x, self.params))

    def f_many(self, xs: np.ndarray) -> np.ndarray:
        return np.asarray(self._jitted("f_many")(self.fixed, xs, self.params))

    def nodes(self, a: float, b: float, options: tuple) -> NodeTable:
        """`f` for SciPy's quad, evaluated a Gauss-Kronrod interval at a time."""
        seeds = seed_intervals(a, b, dict(options).get("points", ()))
        return NodeTable(self.f, self.f_many, seeds)

    def df(self, x: float) -> np.ndarray:
        return f64(self._jitted("df")(self.fixed, x, self.params))

    def jvp(self, x: float, dp: Any) -> float:
        return host_float(self._jitted("jvp")(self.fixed, x, self.params, dp))


def _quad_result(a: Any, b: Any, params: Any, fixed: Any, **_: Any) -> Any:
    dtype = jnp.result_type(a.dtype, b.dtype)
    return jax.ShapeDtypeStruct((), dtype), jax.ShapeDtypeStruct((), dtype)


def _quad_run(integrand: Any, a: Any, b: Any, options: tuple, on_failure: str, what: str) -> Any:
    res = scipy.integrate.quad(integrand, a, b, full_output=1, **dict(options))
    if len(res) > 3:  # SciPy appends a message when ier != 0
        if on_failure == "raise":
            raise failure("integrate.quad", f"quad{what}: {res[3]}")
        return np.nan, np.nan
    return res[0], res[1]


def _solve(a: np.ndarray, b: np.ndarray, params: Any, fixed: Any, fun: Any, options: tuple,
           on_failure: str) -> tuple[np.ndarray, np.ndarray]:
    """SciPy's quad of the converted integrand on the host: (y, abserr)."""
    dtype = np.result_type(a.dtype, b.dtype)
    with on_cpu():
        q = _Integrand(fun, a.dtype, params, fixed)
        val, err = _quad_run(q.nodes(float(a), float(b), options), float(a), float(b),
                             options, on_failure, "")
    return np.asarray(val, dtype), np.asarray(err, dtype)


@_foreign.foreign(_quad_result)
def _quad(a: Any, b: Any, params: Any, fixed: Any, *, fun: Any, options: tuple,
          on_failure: str) -> Any:
    return _solve(a, b, params, fixed, fun, options, on_failure)


def _solve_eagerly(a: Any, b: Any, params: Any, fixed: Any, fun: Any, options: tuple,
                   on_failure: str, dtype: Any) -> tuple[jax.Array, jax.Array] | None:
    """`_quad`'s value without the host-call machinery, where nothing is traced (an eager
    call: no derivative or program can see the call, so the host call's primitive has
    nothing to do); None where something is (also a `jit` of constants: its host call
    runs when the program runs, as before). Saves the conversions of the operands and
    results one by one, which cost a repeat call more than SciPy's whole quad."""
    try:
        device = eager_device((a, b, params, fixed))
    except NotEager:
        return None
    y, err = _solve(np.asarray(a, dtype), np.asarray(b, dtype), params, fixed, fun, options,
                    on_failure)
    y_out, err_out = to_device(y, err, device=device)
    return y_out, err_out


def _limits_dtype(a: Any, b: Any) -> Any:
    """The limits' common float dtype, as `jnp.asarray` would make them, without moving
    scalars to the device (a dispatch each)."""
    def dtype(x: Any) -> Any:
        if isinstance(x, (jax.Array, np.ndarray, np.generic)):
            return x.dtype
        if type(x) in (bool, int, float):
            return jax.dtypes.canonicalize_dtype(np.asarray(x).dtype)
        return jnp.asarray(x).dtype
    return _promoted(np.dtype(dtype(a)), np.dtype(dtype(b)), jax_setting("jax_enable_x64"),
                     jax_setting("jax_numpy_dtype_promotion"))


@functools.lru_cache(maxsize=64)
def _promoted(a: np.dtype, b: np.dtype, x64: bool, promotion: str) -> Any:
    """JAX's promotion of the limits' dtypes with float (JAX's `result_type` costs a
    repeat call ~20 us; `x64` and `promotion` key the settings it depends on)."""
    return jnp.result_type(a, b, float)


def _f_at(q: Any, x: Any) -> Any:
    return 0.0 if np.isinf(x) else q.f(float(x))


@_quad.defvjp
def _quad_vjp(primals: tuple, out: Any, ct: Any, *, fun: Any, options: tuple,
              on_failure: str) -> Any:
    a, b, params, fixed = primals
    ct_val, ct_err = float(ct[0]), float(ct[1])
    if not np.isfinite(out[0]) or ct_err != 0.0:  # failure, or abserr differentiated
        return (*nan_like((a, b, params)), None)
    with on_cpu():
        q = _Integrand(fun, a.dtype, params, fixed)
        a_bar, b_bar = -ct_val * _f_at(q, a), ct_val * _f_at(q, b)
        p_bar = nan_like(params)
        if params:
            grad = _gradient_integral(q, float(a), float(b), options, on_failure)
            p_bar = np_unravel(ct_val * grad, params)
    return np.asarray(a_bar, a.dtype), np.asarray(b_bar, b.dtype), p_bar, None


def _gradient_integral(q: Any, a: float, b: float, options: tuple, on_failure: str) -> Any:
    """`int_a^b d func / d params dx`, the whole gradient in one pass (SciPy's
    `quad_vec`); where that does not converge, one `quad` per parameter.

    `quad_vec` bisects without extrapolation, so an endpoint singularity that `quad`'s
    extrapolation gets in 10 subintervals (`c / sqrt(x)` on (0, 1)) can exhaust its
    `limit`; `quad` is how the value itself was computed, so the gradient then
    converges where the value did (for an integrand no worse than its derivative).
    """
    kw = {k: v for k, v in options if k in ("epsabs", "epsrel", "limit")}
    res = scipy.integrate.quad_vec(q.df, a, b, full_output=True, **kw)
    if res[2].success:
        return f64(res[0])
    return np.array([
        _quad_run(lambda x, j=j: q.df(x)[j], a, b, options, on_failure,
                  f" of the parameter gradient (component {j}; quad_vec: {res[2].message})")[0]
        for j in range(np.size(res[0]))])


@_quad.defjvp
def _quad_jvp(primals: tuple, out: Any, tangents: Any, *, fun: Any, options: tuple,
              on_failure: str) -> Any:
    a, b, params, fixed = primals
    da, db, dparams, _ = tangents
    nan = np.asarray(np.nan, out[0].dtype)
    if not np.isfinite(out[0]):
        return nan, nan
    with on_cpu():
        q = _Integrand(fun, a.dtype, params, fixed)
        total = 0.0
        if da is not None:
            total -= float(da) * _f_at(q, a)
        if db is not None:
            total += float(db) * _f_at(q, b)
        if dparams is not None:
            dp = fill_zeros(dparams, params)
            total += _quad_run(lambda x: q.jvp(x, dp), float(a), float(b), options,
                               on_failure, " of the tangent")[0]
    # abserr has no derivative: NaN (never a silent zero)
    return np.asarray(total, out[0].dtype), nan


WEIGHTS = ("cos", "sin", "alg", "alg-loga", "alg-logb", "alg-log", "cauchy")


@runs_as_scipy(QUAD)
def quad(func: Callable[..., Any], a: Any, b: Any, args: Any = (), full_output: int = 0,
         epsabs: float = 1.49e-8, epsrel: float = 1.49e-8, limit: int = 50,
         points: Any = None, weight: Any = None, wvar: Any = None, wopts: Any = None,
         maxp1: int = 50, limlst: int = 50, complex_func: bool = False, *,
         on_failure: str = "raise") -> tuple[jax.Array, jax.Array]:
    """`scipy.integrate.quad`: `(y, abserr)` of `int_a^b func(x, *args) dx`; differentiable.

    Same signature and `args` convention as SciPy (`func(x, *args)`, written in JAX,
    returning a scalar; it may close over traced values; a non-tuple `args` is one
    argument, as in SciPy). Gradients of `y`: w.r.t.
    `args` and closed-over arrays, the integral of the gradient (SciPy's `quad_vec`
    over JAX's `grad`, or `quad` per parameter where `quad_vec`, which has no
    extrapolation, does not converge: endpoint singularities); w.r.t. the limits, the
    Leibniz rule (`dy/db = func(b)`, `dy/da = -func(a)`; zero for infinite limits).
    Forward mode likewise. `abserr` has no derivative: its gradient is NaN, never a
    silent zero.

    `points` (static) is passed to SciPy. Not supported, with the reason in the
    error: `full_output` (a host-side dict), `weight`/`wvar`/`wopts` and
    `complex_func`. `on_failure` as in :func:`solve_ivp` (SciPy's `ier != 0`, e.g.
    "the maximum number of subdivisions has been achieved", is a failure).

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from jaxbridge.scipy.integrate import quad
      >>> y, err = quad(lambda x, c: jnp.exp(-c * x), 0.0, 1.0, args=(2.0,))
      >>> print(f"{float(y):.6f}")
      0.432332
      >>> g = jax.grad(lambda c: quad(lambda x: jnp.exp(-c * x), 0.0, 1.0)[0])
      >>> print(f"{float(g(2.0)):.6f}")
      -0.148499
    """
    name = "integrate.quad"
    check_policy(on_failure, name)
    if full_output:
        raise unsupported(name, "full_output", "SciPy's infodict is a host-side dict of "
                          "variable size; the error estimate is returned as abserr")
    if weight is not None and weight not in WEIGHTS:  # SciPy's ValueError
        raise ValueError(f"jaxbridge.scipy.{name}: `weight` {weight!r} is not a recognized "
                         f"weighting function (SciPy's are {WEIGHTS})")
    for arg, value in (("weight", weight), ("wvar", wvar), ("wopts", wopts)):
        if value is not None:
            raise unsupported(name, arg, "weighted integrals (QAWO/QAWF/QAWS/QAWC) have no "
                              "derivative rule here; write the weight into func")
    if complex_func:
        raise unsupported(name, "complex_func", "only real integrands are differentiable here")
    call = "func(x, *args)"
    args = check_args(args, name, call, "wrap")
    dtype = _limits_dtype(a, b)
    f_hf, ops = convert(func, name, "func", (jax.ShapeDtypeStruct((), dtype),), args, call)
    try:
        check_returns(f_hf, (), name, "func")
    except ValueError as e:  # SciPy's TypeError: "only 0-dimensional arrays can be converted"
        raise TypeError(str(e)) from None
    params, fixed = f_hf.split(ops)
    options: dict[str, float | tuple[float, ...]] = {
        "epsabs": float(epsabs), "epsrel": float(epsrel), "limit": int(limit),
        "maxp1": int(maxp1), "limlst": int(limlst)}
    if points is not None:
        options["points"] = tuple(float(p) for p in np.ravel(points))
    static = static_options(options, name)
    eager = _solve_eagerly(a, b, params, fixed, f_hf, static, on_failure, dtype)
    if eager is not None:
        return eager
    return _quad(jnp.asarray(a, dtype), jnp.asarray(b, dtype), params, fixed, fun=f_hf,
                 options=static, on_failure=on_failure)
