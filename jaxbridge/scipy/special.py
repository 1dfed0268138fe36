"""Differentiable `scipy.special` functions that JAX lacks or cannot differentiate.

| function | JAX has it? | derivative (x or m) |
|---|---|---|
| `kv(v, x)`, `kve(v, x)` | no | `kv' = -(kv(v-1, x) + kv(v+1, x)) / 2` |
| `iv(v, x)`, `ive(v, x)` | only `i0`, `i1` | `iv' = (iv(v-1, x) + iv(v+1, x)) / 2` |
| `hyp1f1(a, b, x)` | not differentiable in x | `(a / b) hyp1f1(a+1, b+1, x)` |
| `ellipk(m)`, `ellipe(m)` | no | `K' = (E - (1-m) K) / (2m(1-m))`, `E' = (E - K) / (2m)` |

Values come from SciPy on the host, in float64, one call per batch
(`vmap="vectorized"`; arguments broadcast like NumPy ufuncs). The tangent rules are
written in JAX in terms of the functions themselves, so derivatives of every order
work (`jax.hessian`, `jacfwd(jacrev)`), in forward and reverse mode.

Derivatives with respect to the order `v` (and `a`, `b` of `hyp1f1`) have no such
closed form and are **not provided: they are NaN** (never a silent zero). Orders
and parameters held constant, or merely traced and not differentiated, are fine.
"""

from __future__ import annotations

from typing import Any, Callable

import jax.numpy as jnp
import numpy as np
import scipy.special as sp

from .. import _foreign

__all__ = ["kv", "kve", "iv", "ive", "hyp1f1", "ellipk", "ellipe"]


def _host(name: str, np_fn: Callable[..., Any]) -> _foreign.ForeignFunction:
    def run(*xs):
        with np.errstate(all="ignore"):
            out = np_fn(*(np.asarray(x, np.float64) for x in xs))
        return np.asarray(out).astype(xs[-1].dtype)

    run.__name__ = run.__qualname__ = name
    return _foreign.foreign(lambda *xs: xs[-1], vmap="vectorized")(run)


def _prep(*xs):
    dtype = jnp.result_type(*(jnp.asarray(x).dtype for x in xs), float)
    return jnp.broadcast_arrays(*(jnp.asarray(x, dtype) for x in xs))


def _no_order_derivative(t):
    return None if t is None else t * jnp.nan


def _sum(*terms):
    terms = [t for t in terms if t is not None]
    return None if not terms else sum(terms[1:], terms[0])


def _times(t, d):
    return None if t is None else t * d


_kv, _kve = _host("kv", sp.kv), _host("kve", sp.kve)
_iv, _ive = _host("iv", sp.iv), _host("ive", sp.ive)
_hyp1f1 = _host("hyp1f1", sp.hyp1f1)
_ellipk, _ellipe = _host("ellipk", sp.ellipk), _host("ellipe", sp.ellipe)


@_kv.defjvp(kind="jax")
def _kv_jvp(primals, out, tangents):
    (v, x), (dv, dx) = primals, tangents
    return _sum(_no_order_derivative(dv), _times(dx, -(_kv(v - 1, x) + _kv(v + 1, x)) / 2))


@_kve.defjvp(kind="jax")
def _kve_jvp(primals, out, tangents):
    (v, x), (dv, dx) = primals, tangents
    d = _kve(v, x) - (_kve(v - 1, x) + _kve(v + 1, x)) / 2
    return _sum(_no_order_derivative(dv), _times(dx, d))


@_iv.defjvp(kind="jax")
def _iv_jvp(primals, out, tangents):
    (v, x), (dv, dx) = primals, tangents
    return _sum(_no_order_derivative(dv), _times(dx, (_iv(v - 1, x) + _iv(v + 1, x)) / 2))


@_ive.defjvp(kind="jax")
def _ive_jvp(primals, out, tangents):
    (v, x), (dv, dx) = primals, tangents
    d = (_ive(v - 1, x) + _ive(v + 1, x)) / 2 - jnp.sign(x) * _ive(v, x)
    return _sum(_no_order_derivative(dv), _times(dx, d))


@_hyp1f1.defjvp(kind="jax")
def _hyp1f1_jvp(primals, out, tangents):
    (a, b, x), (da, db, dx) = primals, tangents
    d = a / b * _hyp1f1(a + 1, b + 1, x)
    return _sum(_no_order_derivative(da), _no_order_derivative(db), _times(dx, d))


@_ellipk.defjvp(kind="jax")
def _ellipk_jvp(primals, out, tangents):
    (m,), (dm,) = primals, tangents
    safe = jnp.where(m == 0, 0.5, m)
    d = (_ellipe(safe) - (1 - safe) * _ellipk(safe)) / (2 * safe * (1 - safe))
    return _times(dm, jnp.where(m == 0, jnp.pi / 8, d))


@_ellipe.defjvp(kind="jax")
def _ellipe_jvp(primals, out, tangents):
    (m,), (dm,) = primals, tangents
    safe = jnp.where(m == 0, 0.5, m)
    d = (_ellipe(safe) - _ellipk(safe)) / (2 * safe)
    return _times(dm, jnp.where(m == 0, -jnp.pi / 8, d))


def kv(v: Any, x: Any) -> Any:
    """Modified Bessel function of the second kind, `scipy.special.kv`."""
    return _kv(*_prep(v, x))


def kve(v: Any, x: Any) -> Any:
    """Exponentially scaled `kv`: `kv(v, x) * exp(x)` (`scipy.special.kve`)."""
    return _kve(*_prep(v, x))


def iv(v: Any, x: Any) -> Any:
    """Modified Bessel function of the first kind, `scipy.special.iv`."""
    return _iv(*_prep(v, x))


def ive(v: Any, x: Any) -> Any:
    """Exponentially scaled `iv`: `iv(v, x) * exp(-|x|)` (`scipy.special.ive`)."""
    return _ive(*_prep(v, x))


def hyp1f1(a: Any, b: Any, x: Any) -> Any:
    """Confluent hypergeometric function 1F1(a; b; x) (`scipy.special.hyp1f1`)."""
    return _hyp1f1(*_prep(a, b, x))


def ellipk(m: Any) -> Any:
    """Complete elliptic integral of the first kind K(m) (`scipy.special.ellipk`)."""
    return _ellipk(*_prep(m))


def ellipe(m: Any) -> Any:
    """Complete elliptic integral of the second kind E(m) (`scipy.special.ellipe`)."""
    return _ellipe(*_prep(m))
