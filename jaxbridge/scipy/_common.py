"""Shared plumbing of `jaxbridge.scipy`: host-side JAX, failure policy, parameter vectors.

The solvers here call user functions written in JAX *from inside* a host call (SciPy
asks for `fun(t, y)` many times per solve). Those functions are compiled once per
(user function, role) with `jax.jit` -- JAX's own cache then keys on shapes -- and run
on the CPU device, whatever the default device is, so a GPU program does not pay a
device round trip per right-hand-side evaluation.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

ON_FAILURE = ("raise", "nan")


from ..errors import SolverError  # noqa: E402  (re-exported: jaxbridge.scipy.SolverError)


def check_policy(on_failure: str, name: str) -> None:
    if on_failure not in ON_FAILURE:
        raise ValueError(f"jaxbridge.scipy.{name}: on_failure must be one of {ON_FAILURE}, "
                         f"got {on_failure!r}")


def failure(name: str, message: str) -> SolverError:
    return SolverError(f"jaxbridge.scipy.{name}: SciPy reported failure: {message}")


# ------------------------------------------------------------------ host-side JAX
_lock = threading.Lock()
_compiled: dict[Hashable, Callable[..., Any]] = {}


def host_jit(key: Hashable, make: Callable[[], Callable[..., Any]]) -> Callable[..., Any]:
    """`jax.jit(make())`, built once per `key` (e.g. (user function, role, shape))."""
    fn = _compiled.get(key)
    if fn is None:
        with _lock:
            fn = _compiled.get(key)
            if fn is None:
                fn = jax.jit(make())
                _compiled[key] = fn
    return fn


def cpu_device() -> Any:
    return jax.devices("cpu")[0]


class on_cpu:
    """Context: JAX calls made on the host inside it run on the CPU device."""

    def __enter__(self):
        self._ctx = jax.default_device(cpu_device())
        return self._ctx.__enter__()

    def __exit__(self, *exc):
        return self._ctx.__exit__(*exc)


def f64(x: Any) -> np.ndarray:
    """A writable float64 NumPy copy (JAX results and host-call inputs are read-only)."""
    return np.array(x, dtype=np.float64)


# ------------------------------------------------------------------ parameter pytrees
def as_float_array(x: Any) -> jax.Array:
    """`x` as a JAX array, promoted to the default float dtype if it is not floating."""
    x = jnp.asarray(x)
    return x if jnp.issubdtype(x.dtype, jnp.floating) else x.astype(jnp.result_type(float))


def as_params(args: Any, name: str) -> Any:
    """`args` with every leaf a floating JAX array (the differentiable parameters)."""
    def leaf(x):
        x = jnp.asarray(x)
        if not jnp.issubdtype(x.dtype, jnp.floating):
            raise TypeError(
                f"jaxbridge.scipy.{name}: every leaf of `args` must be a floating-point array "
                f"(they are the differentiable parameters); got dtype {x.dtype}. Close over "
                f"integer or static settings in the function instead.")
        return x
    return jax.tree_util.tree_map(leaf, args)


def np_ravel(tree: Any) -> np.ndarray:
    """Concatenate a pytree's leaves (None = zeros not allowed here) into float64."""
    leaves = jax.tree_util.tree_leaves(tree)
    if not leaves:
        return np.zeros(0)
    return np.concatenate([np.ravel(f64(x)) for x in leaves])


def np_unravel(flat: np.ndarray, like: Any) -> Any:
    """Split `flat` into a pytree shaped (and typed) like `like`."""
    leaves, tree = jax.tree_util.tree_flatten(like)
    out, i = [], 0
    for x in leaves:
        x = np.asarray(x)
        out.append(np.asarray(flat[i:i + x.size]).reshape(x.shape).astype(x.dtype))
        i += x.size
    return jax.tree_util.tree_unflatten(tree, out)


def fill_zeros(tangent: Any, like: Any) -> Any:
    """A tangent pytree with its None (symbolic zero) leaves replaced by zeros."""
    if tangent is None:
        return jax.tree_util.tree_map(lambda x: np.zeros(np.shape(x), np.float64), like)
    return jax.tree_util.tree_map(
        lambda t, x: np.zeros(np.shape(x), np.float64) if t is None else f64(t),
        tangent, like, is_leaf=lambda t: t is None)


def jnp_ravel(tree: Any) -> jax.Array:
    leaves = jax.tree_util.tree_leaves(tree)
    if not leaves:
        return jnp.zeros(0, jnp.result_type(float))
    return jnp.concatenate([jnp.ravel(x).astype(jnp.result_type(float)) for x in leaves])


def static_options(options: dict | None) -> tuple:
    """A dict of solver options as a hashable (static) sorted tuple of items."""
    if options is None:
        return ()
    try:
        items = tuple(sorted(dict(options).items()))
        hash(items)
    except TypeError:
        raise TypeError("jaxbridge.scipy: solver `options` must have hashable values "
                        "(they are static)") from None
    return items


def call_args(has_args: bool) -> Callable[..., tuple]:
    """How the user's function is called: with or without the params argument."""
    return (lambda *xs, p: (*xs, p)) if has_args else (lambda *xs, p: xs)


def _NO_ARGS() -> jax.Array:  # noqa: N802
    """The `params` operand when the user passes no `args`.

    A zero-size array rather than `()`: jaxbridge core's fast argument path treats an
    empty pytree argument as a leaf and drops it (reported; see the scipy README).
    """
    return jnp.zeros(0, jnp.result_type(float))
