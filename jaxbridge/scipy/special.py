"""Differentiable `scipy.special` functions that JAX lacks or cannot differentiate.

| function | JAX has it? | derivative (x or m) |
|---|---|---|
| `kv(v, x)`, `kve(v, x)` | no | `kv' = -(kv(v-1, x) + kv(v+1, x)) / 2` |
| `iv(v, x)`, `ive(v, x)` | only `i0`, `i1` | `iv' = (iv(v-1, x) + iv(v+1, x)) / 2` |
| `hyp1f1(a, b, x)` | not differentiable in x | `(a / b) hyp1f1(a+1, b+1, x)` |
| `ellipk(m)`, `ellipe(m)` | no | `K' = (E - (1-m) K) / (2m(1-m))`, `E' = (E - K) / (2m)` |
| `erfcx(x)` | yes, but `exp(x^2) erfc(x)`-style overflow to NaN | `2x erfcx(x) - 2/sqrt(pi)` |
| `erfi(x)` | no | `2/sqrt(pi) exp(x^2)` |
| `dawsn(x)` | no | `1 - 2x dawsn(x)` |

`erfcx` and `dawsn` are computed by SciPy without overflow for any x (the naive
`jnp.exp(x**2) * jax.scipy.special.erfc(x)` is `inf * 0 = nan` from x ~ 27). Their
derivatives, written above as differences of nearly equal terms for large |x|, use
the asymptotic series there (|x| > 50), so they stay accurate to the last digits.

Values come from SciPy on the host, in float64, one call per batch
(`vmap="vectorized"`; arguments broadcast like NumPy ufuncs). The tangent rules are
written in JAX in terms of the functions themselves, so derivatives of every order
work (`jax.hessian`, `jacfwd(jacrev)`), in forward and reverse mode.

Derivatives with respect to the order `v` (and `a`, `b` of `hyp1f1`) have no such
closed form and are **not provided: they are NaN** (never a silent zero). Orders
and parameters held constant, or merely traced and not differentiated, are fine.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import scipy.special as sp

from .. import _foreign
from ._common import check_real

__all__ = ["kv", "kve", "iv", "ive", "hyp1f1", "ellipk", "ellipe", "erfcx", "erfi", "dawsn"]


def _host(name: str, np_fn: Callable[..., Any]) -> _foreign.ForeignFunction:
    def run(*xs: np.ndarray) -> np.ndarray:
        with np.errstate(all="ignore"):
            out = np_fn(*(np.asarray(x, np.float64) for x in xs))
        return np.asarray(out).astype(xs[-1].dtype)

    run.__name__ = run.__qualname__ = name
    return _foreign.foreign(lambda *xs: xs[-1], vmap="vectorized")(run)


def _apply(fn: _foreign.ForeignFunction, name: str, **xs: Any) -> jax.Array:
    """`fn` of the arguments `xs` (by SciPy's names), checked real, then broadcast and
    cast to one floating dtype inside one compiled program (`_broadcast_call`): a
    repeat eager call is one dispatch, not one per operation."""
    for what, x in xs.items():
        check_real(x, f"special.{name}", what)
    return _broadcast_call(fn, *(x if isinstance(x, (jax.Array, np.ndarray, np.generic,
                                                     float, int)) else np.asarray(x)
                                 for x in xs.values()))


def _broadcast(*xs: Any) -> Sequence[jax.Array]:
    """The arguments broadcast, in one floating dtype."""
    arrays = [jnp.asarray(x) for x in xs]
    dtype = jnp.result_type(*(x.dtype for x in arrays), float)
    return jnp.broadcast_arrays(*(x.astype(dtype) for x in arrays))


@functools.partial(jax.jit, static_argnums=0)
def _broadcast_call(fn: _foreign.ForeignFunction, *xs: Any) -> jax.Array:
    return fn(*_broadcast(*xs))


def _no_order_derivative(t: Any) -> Any:
    return None if t is None else t * jnp.nan


def _sum(*terms: Any) -> Any:
    present = [t for t in terms if t is not None]
    return None if not present else sum(present[1:], present[0])


def _times(t: Any, d: Any) -> Any:
    return None if t is None else t * d


_kv, _kve = _host("kv", sp.kv), _host("kve", sp.kve)
_iv, _ive = _host("iv", sp.iv), _host("ive", sp.ive)
_hyp1f1 = _host("hyp1f1", sp.hyp1f1)
_ellipk, _ellipe = _host("ellipk", sp.ellipk), _host("ellipe", sp.ellipe)
_erfcx, _erfi, _dawsn = _host("erfcx", sp.erfcx), _host("erfi", sp.erfi), _host("dawsn", sp.dawsn)
_TWO_OVER_SQRT_PI = float(2.0 / np.sqrt(np.pi))  # a Python float: weakly typed, keeps float32
_ASYMPTOTIC = 50.0  # |x| beyond which the derivatives use their asymptotic series


@_kv.defjvp(kind="jax")
def _kv_jvp(primals: tuple, out: Any, tangents: tuple) -> Any:
    (v, x), (dv, dx) = primals, tangents
    return _sum(_no_order_derivative(dv), _times(dx, -(_kv(v - 1, x) + _kv(v + 1, x)) / 2))


@_kve.defjvp(kind="jax")
def _kve_jvp(primals: tuple, out: Any, tangents: tuple) -> Any:
    (v, x), (dv, dx) = primals, tangents
    d = _kve(v, x) - (_kve(v - 1, x) + _kve(v + 1, x)) / 2
    return _sum(_no_order_derivative(dv), _times(dx, d))


@_iv.defjvp(kind="jax")
def _iv_jvp(primals: tuple, out: Any, tangents: tuple) -> Any:
    (v, x), (dv, dx) = primals, tangents
    return _sum(_no_order_derivative(dv), _times(dx, (_iv(v - 1, x) + _iv(v + 1, x)) / 2))


@_ive.defjvp(kind="jax")
def _ive_jvp(primals: tuple, out: Any, tangents: tuple) -> Any:
    (v, x), (dv, dx) = primals, tangents
    d = (_ive(v - 1, x) + _ive(v + 1, x)) / 2 - jnp.sign(x) * _ive(v, x)
    return _sum(_no_order_derivative(dv), _times(dx, d))


@_hyp1f1.defjvp(kind="jax")
def _hyp1f1_jvp(primals: tuple, out: Any, tangents: tuple) -> Any:
    (a, b, x), (da, db, dx) = primals, tangents
    d = a / b * _hyp1f1(a + 1, b + 1, x)
    return _sum(_no_order_derivative(da), _no_order_derivative(db), _times(dx, d))


@_ellipk.defjvp(kind="jax")
def _ellipk_jvp(primals: tuple, out: Any, tangents: tuple) -> Any:
    (m,), (dm,) = primals, tangents
    safe = jnp.where(m == 0, 0.5, m)
    d = (_ellipe(safe) - (1 - safe) * _ellipk(safe)) / (2 * safe * (1 - safe))
    return _times(dm, jnp.where(m == 0, jnp.pi / 8, d))


@_ellipe.defjvp(kind="jax")
def _ellipe_jvp(primals: tuple, out: Any, tangents: tuple) -> Any:
    (m,), (dm,) = primals, tangents
    safe = jnp.where(m == 0, 0.5, m)
    d = (_ellipe(safe) - _ellipk(safe)) / (2 * safe)
    return _times(dm, jnp.where(m == 0, -jnp.pi / 8, d))


def _tail(x: jax.Array, alternating: bool) -> tuple[jax.Array, jax.Array]:
    """(|x| > 50, sum_{n>=1} (+-1)^n (2n-1)!! / (2x^2)^n), with a safe x elsewhere.

    The terms fall by (2n+1)/(2x^2) < 1e-3: ten terms are exact in float64.
    """
    big = jnp.abs(x) > _ASYMPTOTIC
    u = 1.0 / (2.0 * jnp.square(jnp.where(big, x, 2 * _ASYMPTOTIC)))
    term, total = jnp.ones_like(u), jnp.zeros_like(u)
    for n in range(1, 11):
        term = term * (2 * n - 1) * (-u if alternating else u)
        total = total + term
    return big, total


@_erfcx.defjvp(kind="jax")
def _erfcx_jvp(primals: tuple, out: Any, tangents: tuple) -> Any:
    (x,), (dx,) = primals, tangents
    # 2x erfcx(x) - 2/sqrt(pi) = (2/sqrt(pi)) sum_{n>=1} (-1)^n (2n-1)!!/(2x^2)^n, x -> +inf
    big, series = _tail(x, alternating=True)
    d = jnp.where(big & (x > 0), _TWO_OVER_SQRT_PI * series,
                  2 * x * _erfcx(x) - _TWO_OVER_SQRT_PI)
    return _times(dx, d)


@_erfi.defjvp(kind="jax")
def _erfi_jvp(primals: tuple, out: Any, tangents: tuple) -> Any:
    (x,), (dx,) = primals, tangents
    return _times(dx, _TWO_OVER_SQRT_PI * jnp.exp(jnp.square(x)))


@_dawsn.defjvp(kind="jax")
def _dawsn_jvp(primals: tuple, out: Any, tangents: tuple) -> Any:
    (x,), (dx,) = primals, tangents
    # 1 - 2x dawsn(x) = -sum_{n>=1} (2n-1)!!/(2x^2)^n for |x| -> inf
    big, series = _tail(x, alternating=False)
    return _times(dx, jnp.where(big, -series, 1 - 2 * x * _dawsn(x)))


def kv(v: Any, x: Any) -> Any:
    """Modified Bessel function of the second kind, `scipy.special.kv`.

    Args:
      v: the order (real; broadcast with `x`). Not differentiable: its derivative
        is NaN, never a silent zero.
      x: the argument (real, > 0 for finite values); differentiable to any order.

    Returns:
      An array of the broadcast shape of the arguments, in their floating dtype
      (computed by SciPy in float64 on the host; `vmap` makes one call).

    Example:
        >>> import jax
        >>> from jaxbridge.scipy.special import kv
        >>> f = lambda x: kv(1.5, x)
        >>> print(f"{float(kv(1.5, 2.0)):.6f} {float(jax.grad(f)(2.0)):.6f}")
        0.179907 -0.254868
    """
    return _apply(_kv, "kv", v=v, x=x)


def kve(v: Any, x: Any) -> Any:
    """Exponentially scaled `kv`: `kv(v, x) * exp(x)` (`scipy.special.kve`).

    Args:
      v: the order (real; broadcast with `x`). Not differentiable: its derivative
        is NaN, never a silent zero.
      x: the argument (real); differentiable to any order.

    Returns:
      An array of the broadcast shape of the arguments, in their floating dtype
      (computed by SciPy in float64 on the host; `vmap` makes one call).

    Example:
        >>> import jax
        >>> from jaxbridge.scipy.special import kve
        >>> f = lambda x: kve(1.5, x)
        >>> print(f"{float(kve(1.5, 2.0)):.6f} {float(jax.grad(f)(2.0)):.6f}")
        1.329340 -0.553892
    """
    return _apply(_kve, "kve", v=v, x=x)


def iv(v: Any, x: Any) -> Any:
    """Modified Bessel function of the first kind, `scipy.special.iv`.

    Args:
      v: the order (real; broadcast with `x`). Not differentiable: its derivative
        is NaN, never a silent zero.
      x: the argument (real); differentiable to any order.

    Returns:
      An array of the broadcast shape of the arguments, in their floating dtype
      (computed by SciPy in float64 on the host; `vmap` makes one call).

    Example:
        >>> import jax
        >>> from jaxbridge.scipy.special import iv
        >>> f = lambda x: iv(1.5, x)
        >>> print(f"{float(iv(1.5, 2.0)):.6f} {float(jax.grad(f)(2.0)):.6f}")
        1.099473 1.221632
    """
    return _apply(_iv, "iv", v=v, x=x)


def ive(v: Any, x: Any) -> Any:
    """Exponentially scaled `iv`: `iv(v, x) * exp(-|x|)` (`scipy.special.ive`).

    Args:
      v: the order (real; broadcast with `x`). Not differentiable: its derivative
        is NaN, never a silent zero.
      x: the argument (real); differentiable to any order.

    Returns:
      An array of the broadcast shape of the arguments, in their floating dtype
      (computed by SciPy in float64 on the host; `vmap` makes one call).

    Example:
        >>> import jax
        >>> from jaxbridge.scipy.special import ive
        >>> f = lambda x: ive(1.5, x)
        >>> print(f"{float(ive(1.5, 2.0)):.6f} {float(jax.grad(f)(2.0)):.6f}")
        0.148798 0.016532
    """
    return _apply(_ive, "ive", v=v, x=x)


def hyp1f1(a: Any, b: Any, x: Any) -> Any:
    """Confluent hypergeometric function 1F1(a; b; x) (`scipy.special.hyp1f1`).

    Args:
      a: the first parameter (real). Not differentiable: NaN.
      b: the second parameter (real). Not differentiable: NaN.
      x: the argument (real); differentiable to any order.

    Returns:
      An array of the broadcast shape of the arguments, in their floating dtype
      (computed by SciPy in float64 on the host; `vmap` makes one call).

    Example:
        >>> import jax
        >>> from jaxbridge.scipy.special import hyp1f1
        >>> f = lambda x: hyp1f1(0.5, 1.5, x)
        >>> print(f"{float(hyp1f1(0.5, 1.5, 2.0)):.6f} {float(jax.grad(f)(2.0)):.6f}")
        2.364454 1.256151
    """
    return _apply(_hyp1f1, "hyp1f1", a=a, b=b, x=x)


def ellipk(m: Any) -> Any:
    """Complete elliptic integral of the first kind K(m) (`scipy.special.ellipk`).

    Args:
      m: the parameter (real, m < 1); differentiable to any order.

    Returns:
      An array of the broadcast shape of the arguments, in their floating dtype
      (computed by SciPy in float64 on the host; `vmap` makes one call).

    Example:
        >>> import jax
        >>> from jaxbridge.scipy.special import ellipk
        >>> f = ellipk
        >>> print(f"{float(ellipk(0.3)):.6f} {float(jax.grad(f)(0.3)):.6f}")
        1.713889 0.584858
    """
    return _apply(_ellipk, "ellipk", m=m)


def ellipe(m: Any) -> Any:
    """Complete elliptic integral of the second kind E(m) (`scipy.special.ellipe`).

    Args:
      m: the parameter (real, m <= 1); differentiable to any order.

    Returns:
      An array of the broadcast shape of the arguments, in their floating dtype
      (computed by SciPy in float64 on the host; `vmap` makes one call).

    Example:
        >>> import jax
        >>> from jaxbridge.scipy.special import ellipe
        >>> f = ellipe
        >>> print(f"{float(ellipe(0.3)):.6f} {float(jax.grad(f)(0.3)):.6f}")
        1.445363 -0.447544
    """
    return _apply(_ellipe, "ellipe", m=m)


def erfcx(x: Any) -> Any:
    """Scaled complementary error function `exp(x^2) erfc(x)` (`scipy.special.erfcx`).

    Finite where the `jnp` formula overflows (x > ~27), with an accurate derivative.

    Args:
      x: the argument (real, any size: no overflow); differentiable to any order.

    Returns:
      An array of the broadcast shape of the arguments, in their floating dtype
      (computed by SciPy in float64 on the host; `vmap` makes one call).

    Example:
        >>> import jax
        >>> from jaxbridge.scipy.special import erfcx
        >>> print(f"{float(erfcx(30.0)):.6e}  {float(jax.grad(erfcx)(1e3)):.6e}")
        1.879589e-02  -5.641887e-07
    """
    return _apply(_erfcx, "erfcx", x=x)


def erfi(x: Any) -> Any:
    """Imaginary error function `-i erf(i x)` (`scipy.special.erfi`).

    Args:
      x: the argument (real); differentiable to any order.

    Returns:
      An array of the broadcast shape of the arguments, in their floating dtype
      (computed by SciPy in float64 on the host; `vmap` makes one call).

    Example:
        >>> from jaxbridge.scipy.special import erfi
        >>> print(f"{float(erfi(1.0)):.6f}")
        1.650426
    """
    return _apply(_erfi, "erfi", x=x)


def dawsn(x: Any) -> Any:
    """Dawson's integral `exp(-x^2) int_0^x exp(t^2) dt` (`scipy.special.dawsn`).

    Args:
      x: the argument (real, any size); differentiable to any order.

    Returns:
      An array of the broadcast shape of the arguments, in their floating dtype
      (computed by SciPy in float64 on the host; `vmap` makes one call).

    Example:
        >>> import jax
        >>> from jaxbridge.scipy.special import dawsn
        >>> print(f"{float(dawsn(1.0)):.6f}  {float(jax.grad(dawsn)(1.0)):.6f}")
        0.538080  -0.076159
    """
    return _apply(_dawsn, "dawsn", x=x)
