"""Everything that depends on the JAX version lives here.

jaxbridge defines its own primitives (with JVP, transpose, batching and lowering
rules) through the public extension points `jax.extend.core.Primitive` and
`jax.interpreters.{ad,batching,mlir}`; the few attribute names that moved between
JAX releases are resolved once, in this module.
"""

from __future__ import annotations

from typing import Any

import jax
from jax.core import ShapedArray
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir

__all__ = [
    "Primitive",
    "ShapedArray",
    "ad",
    "batching",
    "mlir",
    "aval_of",
    "zero_tangent",
    "is_zero",
    "add_keepalive",
    "lowering_platforms",
    "JAX_VERSION",
]

JAX_VERSION: tuple[int, ...] = tuple(int(p) for p in jax.__version__.split(".")[:3] if p.isdigit())


def aval_of(x: Any) -> Any:
    """The abstract value (shape, dtype, weak type) of an array or tracer."""
    typeof = getattr(jax, "typeof", None)
    if typeof is not None:
        return typeof(x)
    return jax.core.get_aval(x)  # JAX < 0.6


def zero_tangent(primal_aval: Any) -> Any:
    """A symbolic-zero tangent for a value of `primal_aval` (float0 for ints)."""
    return ad.Zero(primal_aval.to_tangent_aval())


def is_zero(t: Any) -> bool:
    """True for a symbolic zero tangent/cotangent (`ad.Zero`)."""
    return type(t) is ad.Zero


def add_keepalive(ctx: Any, obj: Any) -> None:
    """Keep `obj` alive as long as the executable being lowered lives.

    The native host-call registry holds borrowed references; an executable that
    will call a Python object must therefore own a reference to it.
    """
    ctx.module_context.add_keepalive(obj)


def lowering_platforms(ctx: Any) -> tuple[str, ...]:
    """The platforms a lowering rule is being asked to lower for."""
    platforms = getattr(ctx.module_context, "platforms", None)
    return tuple(platforms) if platforms else ()
