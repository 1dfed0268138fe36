"""Rules shared by jaxbridge's primitives (host functions in `_rules`, kernels in
`_kernel`): eager evaluation through `jit`, and the two batching strategies."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from ._compat import Primitive, aval_of, cast_to_varying, varying_axes


@functools.lru_cache(maxsize=512)
def _jitted(prim: Primitive, params: tuple) -> Any:
    return jax.jit(lambda *args: prim.bind(*args, **dict(params)))


def apply_via_jit(prim: Primitive, *args: Any, **params: Any) -> Any:
    """Eager `impl`: compile the primitive once per (primitive, params) and run it,
    so eager calls take the same lowering path as traced ones."""
    return _jitted(prim, tuple(params.items()))(*args)


def batch_rule(prim: Primitive, vectorized: Callable[[Any], bool]) -> Callable[..., Any]:
    """A batching rule for a primitive whose params hold a `spec` with `.batched(n)`.

    `vectorized(spec)` true: one call with every operand given a leading batch axis
    (unbatched ones broadcast) and `spec.batched(size)`; false: a `lax.map` of calls,
    one per batch element, in order.
    """
    def rule(args, dims, *, spec: Any, **params: Any):
        size = next(a.shape[d] for a, d in zip(args, dims) if d is not None)
        if vectorized(spec):
            moved = [jnp.broadcast_to(a, (size, *jnp.shape(a))) if d is None
                     else jnp.moveaxis(a, d, 0) for a, d in zip(args, dims)]
            outs = prim.bind(*moved, spec=spec.batched(size), **params)
        else:
            mapped = [d is not None for d in dims]
            batched = [jnp.moveaxis(a, d, 0) for a, d in zip(args, dims) if d is not None]

            def one(xs):
                xs = iter(xs)
                return prim.bind(*[next(xs) if m else a for a, m in zip(args, mapped)],
                                 spec=spec, **params)

            outs = jax.lax.map(one, batched)
        return list(outs), [0] * len(outs)

    return rule


def join_varying(arrays: list) -> list:
    """Inside `shard_map`, cast replicated operands to vary over the same mesh axes as
    the others (the gradient of a replicated input is then summed over shards)."""
    axes = frozenset().union(*(varying_axes(aval_of(x)) for x in arrays))
    return [cast_to_varying(x, axes) for x in arrays] if axes else arrays
