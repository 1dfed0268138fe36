"""Checks shared by host functions and kernels; each caller says how to fix its own.

* `is_differentiable`: which dtypes carry tangents and cotangents.
* `check_batch_dims`: arrays that declare shared leading batch dimensions have them.
* `refuse_gather`: never let XLA silently all-gather the operands of an opaque call
  compiled for several devices (JAX issue #32098).
* `check_aliases_arg`, `check_alias_types`: ``aliases=`` (a result written into an
  operand's buffer), for host functions and kernels alike, raising `AliasError`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np

from ..errors import AliasError, ShardingError, describe
from . import jaxapi

__all__ = ["is_differentiable", "check_batch_dims", "refuse_gather", "check_aliases_arg",
           "check_alias_types"]

AliasPairs = tuple[tuple[int, int], ...]


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


def _is_index(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool) \
        and bool(value >= 0)


def check_aliases_arg(where: str, aliases: Any, roles: Sequence[str],
                      why_not: str = "") -> dict[str, AliasPairs]:
    """Normalize ``aliases={role: {operand index: result index}}`` to
    ``{role: ((operand, result), ...)}`` (sorted), or raise `AliasError`.

    `where` opens the message ("jaxbridge.kernel 'k': argument 'aliases'"); `roles` are
    the roles that may alias, `why_not` says why the others may not. Shapes and dtypes
    are checked per call (`check_alias_types`).

    >>> check_aliases_arg("f: argument 'aliases'", {"forward": {1: 0}}, ("forward",))
    {'forward': ((1, 0),)}
    """
    if aliases is None:
        return {}
    if not isinstance(aliases, Mapping):
        raise AliasError(f"{where}: expected a dict {{role: {{operand index: result index}}}} "
                         f"with role in {list(roles)}, received {type(aliases).__name__}")
    normalized = {}
    for role, mapping in aliases.items():
        if role not in roles:
            raise AliasError(f"{where}: unknown role {role!r}; expected one of {list(roles)}"
                             f"{' (' + why_not + ')' if why_not else ''}")
        if not isinstance(mapping, Mapping) or not all(
                _is_index(k) and _is_index(v) for k, v in mapping.items()):
            raise AliasError(f"{where}: {role!r} must map operand indices to result indices "
                             f"(non-negative ints), received {mapping!r}")
        if len(set(mapping.values())) != len(mapping):
            raise AliasError(f"{where}: {role!r}: two operands aliased to the same result "
                             f"({dict(mapping)})")
        normalized[role] = tuple(sorted((int(k), int(v)) for k, v in mapping.items()))
    return normalized


def check_alias_types(where: str, role: str, pairs: Sequence[tuple[int, int]],
                      operands: Sequence[Any], results: Sequence[Any], call: str) -> None:
    """Raise `AliasError` unless every aliased (operand, result) pair of this call exists
    and has one shape and dtype. `call` names the call in the message ("this call",
    "the vjp kernel")."""
    for o, r in pairs:
        if o >= len(operands) or r >= len(results):
            raise AliasError(
                f"{where}: aliases[{role!r}] maps operand {o} to result {r}, but {call} has "
                f"{len(operands)} array operand(s) and {len(results)} result(s)")
        a, b = operands[o], results[r]
        if (tuple(a.shape), np.dtype(a.dtype)) != (tuple(b.shape), np.dtype(b.dtype)):
            raise AliasError(
                f"{where}: aliases[{role!r}] maps operand {o} ({describe(a)}) to result {r} "
                f"({describe(b)}); aliased buffers need the same shape and dtype")
