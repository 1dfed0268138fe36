"""What counts as an array, and moving between pytrees and their leaves.

One predicate (`is_array_leaf`) decides, everywhere in jaxbridge, which leaves of a
user's arguments are traced arrays and which are static.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from ..errors import describe

__all__ = ["PY_SCALARS", "is_array_leaf", "is_none", "as_struct", "leaf_paths",
           "local_structs", "describe"]

PY_SCALARS = (bool, int, float, complex)


def is_array_leaf(x: Any) -> bool:
    """True for a leaf JAX traces: a JAX or NumPy array or scalar, a Python number, or
    an object with `__jax_array__`. Everything else is static."""
    return isinstance(x, (jax.Array, np.ndarray, np.generic, *PY_SCALARS)) or \
        hasattr(x, "__jax_array__")


def is_none(x: Any) -> bool:
    return x is None


def as_struct(x: Any, what: str, name: str) -> jax.ShapeDtypeStruct:
    """`x` (anything with .shape and .dtype) as a canonical ShapeDtypeStruct."""
    shape, dtype = getattr(x, "shape", None), getattr(x, "dtype", None)
    if shape is None or dtype is None:
        raise TypeError(
            f"jaxbridge: the declared {what} of {name!r} must be a pytree of "
            f"jax.ShapeDtypeStruct (or arrays), got a leaf of type {type(x).__name__}: {x!r}")
    shape = tuple(shape)
    if any(not isinstance(d, (int, np.integer)) or d < 0 for d in shape):
        raise ValueError(f"jaxbridge: the declared {what} of {name!r} has an invalid shape "
                         f"{shape}: dimensions must be non-negative integers")
    return jax.ShapeDtypeStruct(tuple(int(d) for d in shape),
                                jax.dtypes.canonicalize_dtype(dtype))


def leaf_paths(treedef: Any) -> list[str]:
    """Readable names of a treedef's leaves, e.g. "['a']" or "[1]"; "" for a lone leaf."""
    dummy = jax.tree_util.tree_unflatten(treedef, list(range(treedef.num_leaves)))
    with_path, _ = jax.tree_util.tree_flatten_with_path(dummy)
    return [jax.tree_util.keystr(path) for path, _ in with_path]


def local_structs(structs: Sequence[Any], shapes: Sequence[tuple]) -> tuple:
    """Declared structs with the shapes of one shard of a batch-partitioned call."""
    return tuple(s if tuple(s.shape) == tuple(sh) else jax.ShapeDtypeStruct(tuple(sh), s.dtype)
                 for s, sh in zip(structs, shapes))
