"""Differentiable `scipy.signal.lfilter`: gradients for b, a, x and zi.

`lfilter` solves, sample by sample, the difference equation (with `K =
max(len(a), len(b)) - 1`, SciPy's direct form II transposed and its initial state
`zi`)::

    sum_k a[k] y[n-k] = sum_k b[k] x[n-k] + a[0] zi[n]     (zi[n] = 0 for n >= K)

i.e. `A y = B x + a0 zi` with `A`, `B` lower-triangular Toeplitz (convolution)
matrices. Everything follows from this linear system:

* tangent: `A dy = db * x + b * dx - da * y + d(a0 zi)` (`*`: causal convolution),
  so `dy` is one more `lfilter(1, a, ...)`;
* adjoint: Toeplitz matrices are persymmetric (`T^T = J T J`, `J` the reversal), so
  `g = A^{-T} y_bar` is the **time-reversed filter** `rev(lfilter(1, a, rev(y_bar)))`;
  then `x_bar = B^T g` (reversed again), `b_bar[k] = sum_n g[n] x[n-k]`,
  `a_bar[k] = -sum_n g[n] y[n-k]` (+ `sum g zi` for `a[0]`), `zi_bar = a0 g[:K]`.

The final state `zf` comes from filtering `K` more zero samples: with zero input the
state is read back from the output, `zf[m] = sum_{k<=m} (a[k]/a[0]) y[N+m-k]`.

Both rules are written in JAX around the one host primitive (SciPy's `lfilter`),
so higher derivatives (`hessian`, `jacfwd(jacrev)`) work too. SciPy runs on the
host, one call per filter; `vmap` over b or a loops (`lax.map`), while extra
leading dimensions of `x` are filtered in one call.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import scipy.signal

from .. import _foreign
from ._common import (
    NotEager,
    as_float_array,
    as_float_operand,
    check_real,
    eager_device,
    to_device,
)

__all__ = ["lfilter"]


@_foreign.foreign(lambda b, a, x, zi: x)
def _lf(b: np.ndarray, a: np.ndarray, x: np.ndarray, zi: np.ndarray) -> np.ndarray:
    """y of `A y = B x + a0 zi` along the last axis (SciPy's lfilter)."""
    y, _ = scipy.signal.lfilter(b, a, x, axis=-1, zi=zi)
    return np.asarray(y, x.dtype)


def _causal_conv(c: jax.Array, s: jax.Array) -> jax.Array:
    """`(c * s)[n] = sum_k c[k] s[n-k]`, n < N, along the last axis of `s`."""
    N = s.shape[-1]
    rows = s.reshape(-1, N)
    out = jax.vmap(lambda r: jnp.convolve(r, c, precision="highest")[:N])(rows)
    return out.reshape(s.shape)


def _lag_products(g: jax.Array, s: jax.Array, m: int) -> jax.Array:
    """`[sum_n g[n] s[n-k] for k < m]`, summed over leading dimensions too."""
    N = s.shape[-1]
    return jnp.stack([jnp.sum(g[..., k:] * s[..., :N - k]) if k < N else jnp.zeros((), g.dtype)
                      for k in range(m)])


def _pad_state(zi: jax.Array, N: int) -> jax.Array:
    """The length-N sequence that carries `zi` (zero after its K samples)."""
    K = zi.shape[-1]
    if K >= N:
        return zi[..., :N]
    return jnp.concatenate([zi, jnp.zeros((*zi.shape[:-1], N - K), zi.dtype)], axis=-1)


def _reversed_solve(a: jax.Array, v: jax.Array) -> jax.Array:
    """`A^{-T} v`: the time-reversed filter `rev(lfilter(1, a, rev(v)))`."""
    zeros = jnp.zeros((*v.shape[:-1], a.shape[0] - 1), v.dtype)
    return jnp.flip(_lf(jnp.ones(1, a.dtype), a, jnp.flip(v, -1), zeros), -1)


@_lf.defjvp(kind="jax")
def _lf_jvp(primals: tuple, y: jax.Array, tangents: tuple) -> jax.Array | None:
    b, a, x, zi = primals
    db, da, dx, dzi = tangents
    N = x.shape[-1]
    r = jnp.zeros_like(y)
    if db is not None:
        r = r + _causal_conv(db, x)
    if dx is not None:
        r = r + _causal_conv(b, dx)
    if da is not None:
        r = r - _causal_conv(da, y) + da[0] * _pad_state(zi, N)
    if dzi is not None:
        r = r + a[0] * _pad_state(dzi, N)
    zeros = jnp.zeros((*x.shape[:-1], a.shape[0] - 1), x.dtype)
    return _lf(jnp.ones(1, a.dtype), a, r, zeros)


@_lf.defvjp(kind="jax")
def _lf_vjp(primals: tuple, y: jax.Array, ct: jax.Array) -> tuple:
    b, a, x, zi = primals
    N, K = x.shape[-1], zi.shape[-1]
    g = _reversed_solve(a, ct)
    x_bar = jnp.flip(_causal_conv(b, jnp.flip(g, -1)), -1)
    b_bar = _lag_products(g, x, b.shape[0])
    a_bar = -_lag_products(g, y, a.shape[0])
    a_bar = a_bar.at[0].add(jnp.sum(g * _pad_state(zi, N)))
    zi_bar = a[0] * g[..., :K]
    if K > N:
        zi_bar = jnp.concatenate([zi_bar, jnp.zeros((*zi.shape[:-1], K - N), g.dtype)], -1)
    return b_bar, a_bar, x_bar, zi_bar


def _checked_operands(b: Any, a: Any, x: Any, axis: int, name: str) -> tuple:
    """`b`, `a` and `x` checked as SciPy checks them (before any JAX operation runs, so
    a repeat eager call costs one compiled program's dispatch); non-arrays (lists,
    scalars) as NumPy arrays."""
    b, a, x = (as_float_operand(v if isinstance(v, (jax.Array, np.ndarray)) else
                                np.asarray(v), "signal.lfilter", arg)
               for v, arg in ((b, "b"), (a, "a"), (x, "x")))  # (real: `check_real`)
    for arg, v in (("b", b), ("a", a)):  # SciPy's scalar coefficients are 1-D
        if v.ndim > 1 or v.size == 0:
            raise ValueError(f"{name}: `{arg}` must be a non-empty 1-D array of filter "
                             f"coefficients, got shape {v.shape}")
    if x.ndim == 0:
        raise ValueError(f"{name}: `x` must have at least one dimension, got a scalar")
    if not -x.ndim <= axis < x.ndim:  # SciPy's AxisError (a ValueError and an IndexError)
        raise np.exceptions.AxisError(f"{name}: axis {axis} is out of bounds for `x` of "
                                      f"dimension {x.ndim}")
    try:
        a0 = float(np.ravel(a)[0])
    except (jax.errors.ConcretizationTypeError, jax.errors.TracerArrayConversionError):
        a0 = None
    if a0 == 0.0:
        raise ValueError(f"{name}: a[0] must be nonzero (the filter is normalized by it)")
    return b, a, x


def lfilter(b: Any, a: Any, x: Any, axis: int = -1, zi: Any = None) -> Any:
    """`scipy.signal.lfilter`: an IIR/FIR filter; differentiable in b, a, x and zi.

    Same signature and results as SciPy: `y`, or `(y, zf)` when `zi` is given (`zi`
    of shape `x.shape` with `axis` replaced by `max(len(a), len(b)) - 1`, SciPy's
    direct form II transposed state). Real floating inputs; `a[0]` must be nonzero.
    Gradients and tangents come from the filter's structure (the adjoint is the
    time-reversed filter; see the module docstring), for every argument, to any
    order.

    Args:
      b: the numerator coefficients, a non-empty 1-D array (or, as in SciPy, a scalar).
      a: the denominator coefficients, a non-empty 1-D array (or a scalar) with
        ``a[0] != 0``.
      x: the signal, at least 1-D; filtered along `axis` (other dimensions are
        filtered independently, in one host call).
      axis: the axis of `x` to filter along (static).
      zi: the initial state (optional), shaped like `x` with `axis` replaced by
        ``max(len(a), len(b)) - 1`` (its other axes may have length 1: broadcast, as
        in SciPy).

    Returns:
      ``y`` shaped like `x`; with `zi`, the tuple ``(y, zf)`` with the final state
      shaped like `zi`.

    Raises:
      ValueError: empty or non-1-D coefficients, a scalar `x`, ``a[0] == 0``, or a
        `zi` of the wrong shape.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from jaxbridge.scipy.signal import lfilter
        >>> b, a = jnp.array([0.5, 0.5]), jnp.array([1.0, -0.3])
        >>> x = jnp.array([1.0, 0.0, 0.0, 2.0])
        >>> [round(float(v), 4) for v in lfilter(b, a, x)]
        [0.5, 0.65, 0.195, 1.0585]
        >>> [round(float(v), 4) for v in jax.grad(lambda a: lfilter(b, a, x).sum())(a)]
        [-2.924, -1.735]
    """
    name = "jaxbridge.scipy.signal.lfilter"
    b, a, x = _checked_operands(b, a, x, axis, name)
    if zi is not None and not isinstance(zi, (jax.Array, np.ndarray)):
        zi = np.asarray(zi)
    if zi is not None:
        check_real(zi, "signal.lfilter", "zi")
        return _filter_program(b, a, x, zi, axis=axis)
    eager = _filter_eagerly(b, a, x, axis)
    return _filter_program(b, a, x, zi, axis=axis) if eager is None else eager


# The dtypes SciPy's lfilter computes in itself (others it would cast).
_SCIPY_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))
# Signals shorter than this take the compiled program eagerly too: at n = 1,000 the two
# measured within noise of each other (100-200 us; 2026-11-29), at n = 100,000 the
# direct call was 1.0 ms against the program's 3.9 ms.
_EAGER_FROM = 16384


def _filter_eagerly(b: Any, a: Any, x: Any, axis: int) -> jax.Array | None:
    """SciPy's own lfilter (no `zi`) where nothing is traced (`eager_device`): the same
    values as the compiled program's host call, without the program's copies of `x`,
    which cost a repeat call at n = 100,000 2.2x the goal of 2x SciPy + 100 us
    (2026-11-29). None where the call takes the compiled program (something is traced,
    a dtype SciPy would cast, or a short signal). Calls with `zi` always take the
    program: its two results cost more to hand back one by one than the program costs
    (SciPy's test_filtfilt_gust, tens of thousands of small calls, ran 55 s against
    44 s)."""
    try:
        device = eager_device((b, a, x))
    except NotEager:
        return None
    if x.size < _EAGER_FROM or not all(np.dtype(v.dtype) in _SCIPY_DTYPES for v in (b, a, x)):
        return None
    dtype = np.result_type(b.dtype, a.dtype, x.dtype)  # JAX's promotion among these two
    b, a, x = (np.atleast_1d(np.asarray(v, dtype)) for v in (b, a, x))
    y = scipy.signal.lfilter(b, a, x, axis=axis)
    return to_device(np.asarray(y, dtype), device=device)[0]


def _filter(b: Any, a: Any, x: Any, zi: Any, *, axis: int) -> Any:
    """`lfilter` after its checks (`_filter_program`: compiled once per shapes, dtypes and
    axis)."""
    name = "jaxbridge.scipy.signal.lfilter"
    b, a, x = (as_float_array(v, "signal.lfilter", arg) for v, arg in ((b, "b"), (a, "a"),
                                                                      (x, "x")))
    b, a = jnp.atleast_1d(b), jnp.atleast_1d(a)
    dtype = jnp.result_type(b.dtype, a.dtype, x.dtype)
    b, a, xm = b.astype(dtype), a.astype(dtype), jnp.moveaxis(x.astype(dtype), axis, -1)
    K = max(a.shape[0], b.shape[0]) - 1
    state_shape = (*xm.shape[:-1], K)
    if zi is None:
        return jnp.moveaxis(_lf(b, a, xm, jnp.zeros(state_shape, dtype)), -1, axis)
    zi = as_float_array(zi, "signal.lfilter", "zi").astype(dtype)
    zi = jnp.moveaxis(zi, axis, -1) if zi.ndim else zi
    if zi.ndim == len(state_shape) and zi.shape[-1] == K and all(
            z in (1, s) for z, s in zip(zi.shape[:-1], state_shape[:-1])):
        zi = jnp.broadcast_to(zi, state_shape)  # SciPy broadcasts zi's length-1 axes
    if zi.shape != state_shape:
        want = list(x.shape)
        want[axis] = K
        raise ValueError(f"{name}: `zi` must have shape {tuple(want)} (x.shape with axis "
                         f"{axis} replaced by max(len(a), len(b)) - 1 = {K}; other axes "
                         f"of length 1 broadcast), got "
                         f"{jnp.shape(zi)}")
    N = xm.shape[-1]
    padded = jnp.concatenate([xm, jnp.zeros(state_shape, dtype)], axis=-1)
    y_ext = _lf(b, a, padded, zi)
    a_hat = jnp.zeros(K + 1, dtype).at[:a.shape[0]].set(a[:K + 1]) / a[0]
    tail = y_ext[..., N:]
    zf = jnp.stack([sum(a_hat[k] * tail[..., m - k] for k in range(m + 1))
                    for m in range(K)], axis=-1) if K else tail
    return jnp.moveaxis(y_ext[..., :N], -1, axis), jnp.moveaxis(zf, -1, axis)


# A repeat eager call: one dispatch of a compiled program (not one per operation); under
# `jit`, `grad` and `vmap` it is inlined as any jitted function.
_filter_program = jax.jit(_filter, static_argnames="axis")
