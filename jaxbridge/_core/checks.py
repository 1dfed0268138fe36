"""Checks shared by host functions and kernels; each caller says how to fix its own.

* `is_differentiable`: which dtypes carry tangents and cotangents.
* `check_batch_dims`: arrays that declare shared leading batch dimensions have them.
* `refuse_gather`: never let XLA silently all-gather the operands of an opaque call
  compiled for several devices (JAX issue #32098).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax.numpy as jnp

from ..errors import ShardingError
from . import jaxapi

__all__ = ["is_differentiable", "check_batch_dims", "refuse_gather"]


def is_differentiable(dtype: Any) -> bool:
    """True for floating and complex dtypes: the ones that have (co)tangents.

    JAX's own predicate, not NumPy's: NumPy does not know that bfloat16 (an ml_dtypes
    type) is floating, and calling it not differentiable gives silent zero gradients."""
    return bool(jnp.issubdtype(dtype, jnp.inexact))


def check_batch_dims(k: int, structs: Sequence[Any], what: str, fix: str = "",
                     error: Callable[[str], Exception] = ValueError) -> None:
    """Raise `error` unless every struct has the same `k` leading dimensions.

    `what` opens the message ("jaxbridge: foreign function 'f' declares batch_dims=2,
    so every array argument, result and residual"), `fix` ends it.
    """
    leading = {tuple(s.shape[:k]) for s in structs if len(s.shape) >= k}
    if k and (any(len(s.shape) < k for s in structs) or len(leading) != 1):
        shapes = [list(s.shape) for s in structs]
        raise error(f"{what} must share the same {k} leading dimension(s); got shapes "
                    f"{shapes}{'. ' + fix if fix else ''}")


def refuse_gather(ctx: Any, what: str, num_batch_dims: int, unsplit: str | None,
                  fix: str) -> None:
    """Raise `ShardingError` where XLA would gather the operands of the call being lowered
    in `ctx` onto every device of a partitioned computation.

    Args:
      what: the call, opening the message ("jaxbridge: the forward call of foreign
        function 'f'").
      num_batch_dims: the leading dimensions XLA may split the call along.
      unsplit: why the call cannot be split at all ("declares no batch dimensions"),
        or None when it can be (or when the caller accepts a gather).
      fix: how to fix an unsplittable call, ending the message.
    """
    devices = jaxapi.auto_partitioned_devices(ctx)
    if devices <= 1:
        return
    ranks = jaxapi.unsplittable_batch_dims(ctx, num_batch_dims) if num_batch_dims else []
    if ranks:
        raise ShardingError(
            f"{what} declares {num_batch_dims} batch dimension(s), but some of its operands "
            f"or results have no dimension beyond them (ranks {ranks}); XLA splits a call "
            f"only along leading dimensions that leave at least one, so it would gather the "
            f"inputs instead. Give such arrays a trailing axis (x[..., None]) or declare "
            f"fewer batch_dims.")
    if unsplit is not None:
        raise ShardingError(
            f"{what} is compiled into a computation partitioned over {devices} devices, but "
            f"it {unsplit}, so XLA would gather its inputs onto every device. {fix}")
