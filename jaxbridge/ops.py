"""Built-in C++/CUDA kernels as differentiable JAX ops (`jaxbridge.ops`).

Every op has forward, VJP and JVP kernels (so `grad`, `jacrev`, `jvp` and
`jacfwd` all work), float32 and float64, any number of leading batch dimensions
(`vmap` is one kernel call), CPU always and CUDA where jaxbridge was built with it.

* `softplus(x, beta=1.0)`              log(1 + exp(beta x)) / beta, stable for any x
* `tridiagonal_solve(dl, d, du, b)`    batched tridiagonal solve (Thomas on CPU,
                                       parallel cyclic reduction on GPU)
* `rbf_kernel(x, y, length_scale)`     exp(-|x_i - y_j|^2 / (2 l^2))

Arguments are checked at trace time; a bad dtype, rank or shape raises
`KernelError` (a TypeError) naming the op, the argument, what was expected and
what was received. The C++ handlers check again and return an XLA FFI error.
"""

from __future__ import annotations

import functools
import os
import threading
import warnings
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ._core import extensions
from ._core.scalars import convert_scalar, is_scalar
from ._kernel import Kernel, kernel, register_target
from .errors import KernelError

__all__ = ["softplus", "tridiagonal_solve", "rbf_kernel", "available", "export_checks",
           "KernelError"]

_FLOATS = (np.dtype("float32"), np.dtype("float64"))
_lock = threading.Lock()
_platforms: tuple[str, ...] | None = None

_builtin_ext = extensions.load("_builtin")


def available() -> bool:
    """True when the compiled built-in kernels (the C++ extension module) are importable.

    Without them (Python started in the repository root with a non-editable install,
    or a failed build), calling an op raises; `jaxbridge.info()["kernels_error"]` says
    why they are missing.

    Returns:
      Whether `softplus`, `tridiagonal_solve` and `rbf_kernel` can run here.

    Example:
        >>> from jaxbridge import ops
        >>> ops.available()
        True
    """
    return _builtin_ext is not None


_ISA_VALUES = ("baseline", "avx2", "avx512")


def _check_isa_env() -> None:
    value = os.environ.get("JAXBRIDGE_CPU_ISA", "")
    if value and value.lower() not in _ISA_VALUES:
        warnings.warn(f"jaxbridge.ops: JAXBRIDGE_CPU_ISA={value!r} is not one of "
                      f"{', '.join(_ISA_VALUES)}; the CPU kernels use the best instruction "
                      "set the CPU supports", RuntimeWarning, stacklevel=3)


def _register() -> tuple[str, ...]:
    global _platforms
    with _lock:
        if _platforms is None:
            _check_isa_env()
            if _builtin_ext is None:
                raise ImportError("jaxbridge.ops: the compiled kernels (jaxbridge._builtin) are "
                                  f"not available: {extensions.missing_reason('_builtin')}")
            plats = []
            for platform, targets in _builtin_ext.registrations().items():
                plat = platform.lower()
                for name, capsule in targets.items():
                    register_target(name, capsule, platform=plat, builtin=True)
                plats.append(plat)
            _platforms = tuple(plats)
    return _platforms


def _builtin(op: str, result: Any, arg_names: tuple, attrs: dict | None = None,
             **options: Any) -> Kernel:
    plats = _register()
    assert _builtin_ext is not None  # _register() raised otherwise
    targets = _builtin_ext.targets()[op]  # the C++ target table (csrc/builtin/targets.h)
    # The targets are registered above (under the reserved prefix, as built-ins), so
    # jaxbridge.kernel accepts their names like any registered target's.
    return kernel(targets["forward"], targets["vjp"], targets["jvp"],
                  result=result, platforms=plats, vmap="vectorized", name=op,
                  arg_names=arg_names, attrs=attrs, **options)


@functools.cache
def _softplus_kernel() -> Kernel:
    # The derivative sigmoid(beta x) needs only x: without the forward output
    # jax.grad drops the forward kernel. The VJP kernel overwrites its cotangent, which
    # under grad is an intermediate (one fresh buffer instead of two: 10M elements
    # 23 -> 14 ms on CPU); a cotangent that is a jit argument costs XLA a copy first
    # (a vjp at 100k elements 46 -> 126 us, still faster than jax.nn.softplus). Not
    # for the JVP kernel: jvp tangents are often arguments.
    return _builtin("softplus", lambda x, **_: x, ("x",), {"beta": 1.0},
                    pass_outputs=False, aliases={"vjp": {1: 0}},
                    batch_dims=lambda x, **_: x.ndim - 1)  # x[..., None]: all of x's dims


@functools.cache
def _tridiag_kernel() -> Kernel:
    return _builtin("tridiagonal_solve", lambda dl, d, du, b: b, ("dl", "d", "du", "b"),
                    batch_dims=lambda dl, d, du, b: b.ndim - 1)  # (..., n) systems


@functools.cache
def _rbf_kernel() -> Kernel:
    def result(x, y, l):
        return jax.ShapeDtypeStruct((*x.shape[:-1], y.shape[-2]), x.dtype)
    def batch_dims(x, y, l):  # (..., n, d), (..., m, d), (...): the shared leading dims
        k = x.ndim - 2
        return k if y.ndim - 2 == k and l.ndim == k else 0

    return _builtin("rbf_kernel", result, ("x", "y", "length_scale"), batch_dims=batch_dims)


def export_checks() -> list:
    """`disabled_checks` for `jax.export.export` of functions that use these ops.

    The ops' FFI targets are not among JAX's stable custom calls, so an export that
    contains them must opt in explicitly (the artifact runs where jaxbridge is
    installed).

    Returns:
      A list of `jax.export.DisabledSafetyCheck`, one per target of every op.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from jaxbridge import ops
        >>> exported = jax.export.export(jax.jit(ops.softplus),
        ...                              disabled_checks=ops.export_checks())(jnp.zeros(3))
        >>> float(exported.call(jnp.zeros(3))[0])  # doctest: +ELLIPSIS
        0.693...
    """
    return [c for k in (_softplus_kernel(), _tridiag_kernel(), _rbf_kernel())
            for c in k.export_checks()]


# ----------------------------------------------------------------- validation
def _as_array(fn: str, name: str, v: Any) -> Any:
    if isinstance(v, (jax.Array, np.ndarray)) or hasattr(v, "aval"):
        arr = v
    else:
        try:
            arr = jnp.asarray(v)
        except TypeError as e:
            raise KernelError(f"jaxbridge.ops.{fn}: argument {name!r}: expected an array, "
                              f"received {type(v).__name__}") from e
    if np.dtype(arr.dtype) not in _FLOATS:
        raise KernelError(f"jaxbridge.ops.{fn}: argument {name!r}: expected dtype float32 or "
                          f"float64, received {np.dtype(arr.dtype).name} with shape "
                          f"{tuple(np.shape(arr))}")
    return arr


def _same_dtype(fn: str, ref: str, arrays: dict) -> None:
    dt = np.dtype(arrays[ref].dtype)
    for k, a in arrays.items():
        if np.dtype(a.dtype) != dt:
            raise KernelError(f"jaxbridge.ops.{fn}: argument {k!r}: expected dtype {dt.name} "
                              f"(the dtype of {ref!r}), received {np.dtype(a.dtype).name}")


# ----------------------------------------------------------------- ops
def softplus(x: Any, *, beta: float = 1.0) -> jax.Array:
    """Numerically stable softplus ``log(1 + exp(beta x)) / beta`` (C++/CUDA kernel).

    Computed as ``max(x, 0) + log1p(exp(-|z|)) / beta`` with ``z = beta x``, so it
    is finite for every finite ``x``, also where ``beta x`` overflows (``x = 1e300,
    beta = 1e10`` gives ``1e300``); the derivative is ``sigmoid(beta x)``. ``beta`` is
    static (an FFI attribute): a positive, finite Python number such that ``beta`` and
    ``1 / beta`` are normal numbers of ``x``'s dtype (the kernel computes in that dtype,
    and flushes subnormals to zero): about ``[1.2e-38, 8.5e37]`` for float32,
    ``[2.2e-308, 4.5e307]`` for float64. Anything else raises `KernelError` at trace time.

    Args:
      x: a float32 or float64 array of any shape (leading dimensions run as one call
        under `vmap`, and split per shard under `jit` on a mesh).
      beta: the sharpness (static).

    Returns:
      An array shaped like `x`, of its dtype. Differentiable (`grad`, `jvp`, any order
      through the kernel's VJP and JVP kernels).

    Raises:
      KernelError: `x` is not float32/float64, or `beta` is out of range.

    Example:
    >>> import jax.numpy as jnp
    >>> from jaxbridge import ops
    >>> float(ops.softplus(jnp.float32(0.0)))  # doctest: +ELLIPSIS
    0.693...
    >>> float(ops.softplus(jnp.float32(0.0), beta=2.0))  # doctest: +ELLIPSIS
    0.346...
    """
    x = _as_array("softplus", "x", x)
    beta = _softplus_beta(beta, np.dtype(x.dtype))
    # A trailing unit axis makes every dimension of x a batch dimension XLA can split
    # (it splits only leading dimensions that leave one more): free, it is a bitcast.
    shape = jnp.shape(x)
    return _softplus_kernel()(jnp.reshape(x, (*shape, 1)), beta=beta).reshape(shape)


def _softplus_beta(beta: Any, dtype: np.dtype) -> float:
    where = "jaxbridge.ops.softplus: argument 'beta': expected a positive, finite"
    if isinstance(beta, (bool, np.bool_)) or not isinstance(
            beta, (int, float, np.integer, np.floating)):
        raise KernelError(f"{where} Python number (static: it becomes an FFI attribute), "
                          f"received {type(beta).__name__} {beta!r}. For a traced beta use "
                          "softplus(beta * x) / beta")
    try:
        value = float(beta)
    except OverflowError:  # an int past float's range, e.g. 10**400
        value = float("inf")
    if not (np.isfinite(value) and value > 0):
        raise KernelError(f"{where} number, received {beta!r}")
    # The CPU kernel multiplies by 1/beta in x's dtype, with subnormals flushed to zero:
    # a beta past these bounds gives 0 * inf = NaN (beta=1e39 in float32 did).
    lo = float(np.finfo(dtype).tiny)
    if not lo <= value <= 1 / lo:
        raise KernelError(f"{where} number in [{lo:.3g}, {1 / lo:.3g}] for x of dtype "
                          f"{dtype.name} (beta and 1/beta must be normal {dtype.name} numbers), "
                          f"received {beta!r}")
    return value


def tridiagonal_solve(dl: Any, d: Any, du: Any, b: Any) -> jax.Array:
    """Solve ``A x = b`` for tridiagonal ``A``, batched over leading dimensions.

    ``dl, d, du, b`` all have shape ``(..., n)``: ``A[i, i-1] = dl[i]``,
    ``A[i, i] = d[i]``, ``A[i, i+1] = du[i]``; ``dl[..., 0]`` and ``du[..., n-1]``
    are ignored (their gradients are 0), as in ``jax.lax.linalg.tridiagonal_solve``.
    No pivoting: meant for diagonally dominant or symmetric positive definite
    systems. Gradients flow to all three diagonals and to ``b``.

    Args:
      dl: the lower diagonal, shape ``(..., n)`` (``dl[..., 0]`` ignored).
      d: the diagonal, shape ``(..., n)``.
      du: the upper diagonal, shape ``(..., n)`` (``du[..., n-1]`` ignored).
      b: the right-hand side, shape ``(..., n)``.

    Returns:
      ``x`` of shape ``(..., n)``.

    Raises:
      KernelError: the dtypes differ or are not float32/float64, or the shapes differ.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from jaxbridge import ops
        >>> d, off, b = jnp.full(4, 4.0), jnp.ones(4), jnp.arange(4.0)
        >>> x = ops.tridiagonal_solve(off, d, off, b)
        >>> A = jnp.diag(d) + jnp.diag(off[1:], -1) + jnp.diag(off[:-1], 1)
        >>> bool(jnp.allclose(A @ x, b, atol=1e-5))
        True
        >>> g = jax.grad(lambda b: ops.tridiagonal_solve(off, d, off, b).sum())(b)
        >>> bool(jnp.allclose(g, jnp.linalg.solve(A.T, jnp.ones(4)), atol=1e-5))
        True
    """
    fn = "tridiagonal_solve"
    arrs = {k: _as_array(fn, k, v) for k, v in (("dl", dl), ("d", d), ("du", du), ("b", b))}
    _same_dtype(fn, "d", arrs)
    dshape = tuple(np.shape(arrs["d"]))
    if len(dshape) < 1:
        raise KernelError(f"jaxbridge.ops.{fn}: argument 'd': expected rank >= 1 (shape "
                          f"(..., n)), received a scalar")
    for k in ("dl", "du", "b"):
        if tuple(np.shape(arrs[k])) != dshape:
            raise KernelError(f"jaxbridge.ops.{fn}: argument {k!r}: expected shape {dshape} "
                              f"(the shape of 'd'), received {tuple(np.shape(arrs[k]))}")
    return _tridiag_kernel()(arrs["dl"], arrs["d"], arrs["du"], arrs["b"])


def rbf_kernel(x: Any, y: Any, length_scale: Any = 1.0) -> jax.Array:
    """Gaussian (RBF) kernel matrix ``K[..., i, j] = exp(-|x_i - y_j|^2 / (2 l^2))``.

    ``x``: ``(..., n, d)``, ``y``: ``(..., m, d)``, ``length_scale``: a scalar or an
    array of shape ``(...)`` (the batch dims); result ``(..., n, m)``. Differentiable
    in ``x``, ``y`` and ``length_scale``.

    Args:
      x: points, shape ``(..., n, d)``, float32 or float64.
      y: points, shape ``(..., m, d)``, the dtype and batch dims of ``x``.
      length_scale: ``l``, a scalar or an array of the batch shape ``(...)``.

    Returns:
      ``K`` of shape ``(..., n, m)``.

    Raises:
      KernelError: mismatched dtypes, ranks or shapes (the message names the argument).

    Example:
        >>> import jax.numpy as jnp
        >>> from jaxbridge import ops
        >>> x = jnp.array([[0.0, 0.0], [1.0, 0.0]])
        >>> K = ops.rbf_kernel(x, x, 1.0)
        >>> [round(float(v), 4) for v in K[0]]  # exp(-1/2) off the diagonal
        [1.0, 0.6065]
    """
    fn = "rbf_kernel"
    x = _as_array(fn, "x", x)
    y = _as_array(fn, "y", y)
    if is_scalar(length_scale) and not isinstance(length_scale, np.generic):
        try:  # a Python number takes x's dtype, if it converts exactly (JAX's weak typing)
            length_scale = jnp.asarray(convert_scalar(length_scale, x.dtype))
        except ValueError as why:
            raise KernelError(f"jaxbridge.ops.{fn}: argument 'length_scale': {why}") from None
    elif not hasattr(length_scale, "dtype"):
        length_scale = jnp.asarray(length_scale, dtype=x.dtype)
    l = _as_array(fn, "length_scale", length_scale)
    _same_dtype(fn, "x", {"x": x, "y": y, "length_scale": l})
    xs, ys = tuple(np.shape(x)), tuple(np.shape(y))
    if len(xs) < 2:
        raise KernelError(f"jaxbridge.ops.{fn}: argument 'x': expected rank >= 2 (shape "
                          f"(..., n, d)), received shape {xs}")
    if len(ys) != len(xs) or ys[:-2] != xs[:-2] or ys[-1] != xs[-1]:
        want = (*xs[:-2], "m", xs[-1])
        raise KernelError(f"jaxbridge.ops.{fn}: argument 'y': expected shape "
                          f"{'(' + ', '.join(map(str, want)) + ')'} (batch dims and feature "
                          f"dim of 'x'), received {ys}")
    batch = xs[:-2]
    if np.ndim(l) == 0 and batch:
        l = jnp.broadcast_to(l, batch)
    if tuple(np.shape(l)) != batch:
        raise KernelError(f"jaxbridge.ops.{fn}: argument 'length_scale': expected a scalar or "
                          f"shape {batch} (the batch dims of 'x'), received "
                          f"{tuple(np.shape(l))}")
    return _rbf_kernel()(x, y, l)
