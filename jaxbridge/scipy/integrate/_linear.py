"""A linear map with a transpose of our choosing: how the compiled solvers' derivative
rules hand JAX their tangent map and its adjoint (reverse mode runs the adjoint, never
the tangent map).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from .. import _loops as loops

__all__ = ["linear_with_transpose"]


def linear_with_transpose(forward: Callable[[Any], Any], transpose: Callable[[Any], Any],
                          b: jax.Array, out_like: jax.Array) -> jax.Array:
    """`forward(b)` (a linear map of the flat vector b), whose transpose JAX takes to be
    `transpose` (reverse mode then runs `transpose`, never `forward`).

    `lax.custom_linear_solve` is JAX's public way to give a linear map its own
    transpose; it wants the argument and result shaped alike, so both are padded to
    one length.

    Example:
      >>> import jax, jax.numpy as jnp
      >>> A = jnp.array([[1.0, 2.0], [3.0, 4.0]])
      >>> f = lambda b: linear_with_transpose(lambda v: A @ v, lambda c: A.T @ c, b, b)
      >>> [float(v) for v in jax.grad(lambda b: f(b)[0])(jnp.ones(2))]
      [1.0, 2.0]
    """
    nb, no = b.size, out_like.size
    m = max(nb, no)
    b = loops.join(b, loops.mesh_axes(b, out_like))  # (inside shard_map: typed alike)

    def solve(_: Any, v: Any) -> Any:
        return jnp.pad(jnp.ravel(forward(v[:nb])), (0, m - no))

    def transpose_solve(_: Any, v: Any) -> Any:
        return jnp.pad(transpose(v[:no].reshape(out_like.shape)), (0, m - nb))

    x = jax.lax.custom_linear_solve(lambda v: v, jnp.pad(b, (0, m - nb)), solve,
                                    transpose_solve)
    return x[:no].reshape(out_like.shape)
