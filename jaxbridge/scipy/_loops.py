"""JAX's loops and branches for the compiled solvers, typed right inside `jax.shard_map`.

Inside `shard_map`, a value that depends on the shard varies over the mesh axes, and
`lax.while_loop` and `lax.cond` want the loop's carry (its start and each step's
result) and the branches' results typed alike: a counter started at 0 and an iterate
started at the (varying) `x0` make a carry that is neither. The compiled solvers
(`_rk`, `_stiff`, the root finders, GMRES) cast their inputs to vary over the same
axes on entry (`join`), and run their loops through these functions, which cast the
carry and the branches' results to those axes too. Outside `shard_map` they are
JAX's own functions, unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .._core.jaxapi import aval_of, cast_to_varying, varying_axes

__all__ = ["mesh_axes", "join", "no_tangent", "while_loop", "fori_loop", "cond"]


def mesh_axes(*trees: Any) -> frozenset:
    """The mesh axes any array leaf of `trees` varies over (empty outside shard_map)."""
    return frozenset().union(*(varying_axes(aval_of(x))
                               for x in jax.tree_util.tree_leaves(trees)))


def join(tree: Any, axes: frozenset | None = None) -> Any:
    """`tree` with every array leaf varying over `axes` (default: all the axes its
    leaves vary over): what the solvers do with their inputs on entry."""
    axes = mesh_axes(tree) if axes is None else axes
    if not axes:
        return tree
    return jax.tree_util.tree_map(lambda x: cast_to_varying(x, axes), tree)


def no_tangent(primal: Any) -> Any:
    """The (float0) tangent of an integer output, typed like it on the mesh."""
    return join(np.zeros(np.shape(primal), jax.dtypes.float0), mesh_axes(primal))


def while_loop(cond_fun: Callable[[Any], Any], body_fun: Callable[[Any], Any],
               init: Any) -> Any:
    """`jax.lax.while_loop`, the carry cast to the axes its start varies over."""
    axes = mesh_axes(init)
    if not axes:
        return jax.lax.while_loop(cond_fun, body_fun, init)
    return jax.lax.while_loop(cond_fun, lambda c: join(body_fun(c), axes), join(init, axes))


def fori_loop(lower: Any, upper: Any, body_fun: Callable[[Any, Any], Any], init: Any
              ) -> Any:
    """`jax.lax.fori_loop`, the carry cast as in :func:`while_loop`."""
    axes = mesh_axes(init, lower, upper)
    if not axes:
        return jax.lax.fori_loop(lower, upper, body_fun, init)
    return jax.lax.fori_loop(lower, upper, lambda i, c: join(body_fun(i, c), axes),
                             join(init, axes))


def cond(pred: Any, true_fun: Callable[..., Any], false_fun: Callable[..., Any],
         *operands: Any) -> Any:
    """`jax.lax.cond`; inside `shard_map`, both branches and a select.

    (`vmap` of a `cond` inside `shard_map` fails in JAX 0.10: the batched predicate
    turns the branches' closed-over constants into varying operands of a branch traced
    for replicated ones. `vmap` runs both branches and selects anyway; here that is
    done without `vmap` too, so the branches must be free of side effects beyond
    checks that raise only on failure.)
    """
    axes = mesh_axes(pred, operands)
    if not axes:
        return jax.lax.cond(pred, true_fun, false_fun, *operands)
    yes, no = join(true_fun(*operands), axes), join(false_fun(*operands), axes)
    return jax.tree_util.tree_map(lambda a, b: jnp.where(pred, a, b), yes, no)
