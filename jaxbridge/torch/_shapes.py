"""A wrapped torch function's result shapes, found without the caller's data.

At trace time the function runs on **meta tensors** (shapes and dtypes, no data): the
shapes it returns there cannot depend on data. Where it fails on meta tensors (control
flow on values, ``.item()``, an operation without a meta kernel such as ``nonzero``), it
runs on **zero-filled tensors**, and, since those are data, on two more fillings (ones,
and a spread of values of both signs): a result whose shape differs between them
depends on the data, and so does one that is empty on every filling while the
arguments are not (``x[x > 100]``). Both are errors that name ``result=``: the shape of
one filling would be a silent lie about the next call's.

These runs draw nothing from torch's random generators (their state is put back), and
they note whether the function draws random numbers at all (`Inferred.random`), which
decides whether its calls carry the generators' state (`_rng`). An exception the
function raises on zero-filled tensors reaches the caller as itself, with a note.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import torch

from ..errors import ResultMismatchError
from . import _rng
from ._convert import struct_of, torch_dtype
from ._device import zeros_device
from ._torchapi import RandomDraws

__all__ = ["Inferred", "infer"]


class Inferred(NamedTuple):
    """What the runs found: the results' structs (None where they were not needed, or
    could not be found) and whether the function draws random numbers."""

    structs: Any
    random: bool


def _zeros(s: Any, device: str) -> torch.Tensor:
    return torch.zeros(s.shape, dtype=torch_dtype(s.dtype, "jaxbridge.torch"), device=device)


def _ones(s: Any, device: str) -> torch.Tensor:
    return torch.ones(s.shape, dtype=torch_dtype(s.dtype, "jaxbridge.torch"), device=device)


def _spread(s: Any, device: str) -> torch.Tensor:
    """Distinct values of both signs (0, 1 alternating for bool)."""
    dtype = torch_dtype(s.dtype, "jaxbridge.torch")
    n = int(torch.Size(s.shape).numel())
    values = torch.arange(n, device=device) - n // 2
    if dtype == torch.bool:
        values = values % 2
    return values.to(dtype).reshape(s.shape)


FILLINGS = {"ones": _ones, "a spread of values": _spread}


def _run(fn: Callable[..., Any], leaves: Sequence[Any], tree: Any, static: dict,
         make: Callable[[Any], torch.Tensor], where: str) -> tuple[Any, bool]:
    """`fn` on tensors made by `make` in place of the ShapeDtypeStruct leaves: (the
    results' structs, whether it drew random numbers)."""
    tensors = [make(x) if isinstance(x, jax.ShapeDtypeStruct) else x for x in leaves]
    draws = RandomDraws()
    # As on the host, not as part of the JAX trace in progress: torch code that calls
    # JAX itself gets concrete values.
    with torch.no_grad(), jax.ensure_compile_time_eval(), draws:
        value = fn(*jax.tree_util.tree_unflatten(tree, tensors), **static)
    return jax.tree_util.tree_map(lambda t: struct_of(t, where), value), draws.seen


def infer(fn: Callable[..., Any], leaves: Sequence[Any], tree: Any, static: dict, name: str,
          shapes: bool) -> Inferred:
    """Run `fn` on meta tensors, else on fillings, for the array leaves of its arguments
    (ShapeDtypeStructs): its result structs where `shapes` is asked for, and whether it
    draws random numbers. Raises where the shapes are asked for and cannot be found."""
    where = f"jaxbridge.torch: function {name!r}"
    with _rng.preserved():
        try:
            structs, random = _run(fn, leaves, tree, static,
                                   lambda s: _zeros(s, "meta"), where)
            return Inferred(structs, random)
        except Exception as meta_error:  # noqa: BLE001 - needs data: try the fillings
            device = zeros_device()
            try:
                structs, random = _run(fn, leaves, tree, static,
                                       lambda s: _zeros(s, device), where)
            except Exception as error:
                if not shapes:  # found nothing: carry the state, to be safe
                    return Inferred(None, True)
                error.add_note(_zeros_failed(name, meta_error))
                raise
            if not shapes:
                return Inferred(None, random)
            found = {"zeros": structs}
            for filling, make in FILLINGS.items():
                try:
                    found[filling], drew = _run(fn, leaves, tree, static,
                                                _filled(make, device), where)
                    random = random or drew
                except Exception:  # noqa: BLE001 - this filling tells nothing
                    pass
            _check_fixed(name, leaves, found)
            return Inferred(structs, random)


def _filled(make: Callable[[Any, str], torch.Tensor], device: str
            ) -> Callable[[Any], torch.Tensor]:
    return lambda s: make(s, device)


def _zeros_failed(name: str, meta_error: BaseException) -> str:
    return (f"jaxbridge.torch: function {name!r} raised this while its result shapes were "
            f"found on zero-filled tensors, at trace time (on meta tensors, which have no "
            f"data, it raised {type(meta_error).__name__}: {meta_error}). If it needs real "
            f"data, declare its results: wrap(fn, result=jax.ShapeDtypeStruct(shape, "
            f"dtype)), or result=lambda *args: ... (args as ShapeDtypeStructs).")


def _describe(structs: Any) -> str:
    shapes = [list(s.shape) for s in jax.tree_util.tree_leaves(structs)]
    return str(shapes[0]) if len(shapes) == 1 else str(shapes)


def _layout(structs: Any) -> tuple:
    return jax.tree_util.tree_structure(structs), jax.tree_util.tree_leaves(structs)


def _check_fixed(name: str, leaves: Sequence[Any], found: dict[str, Any]) -> None:
    """The fillings' results must agree, and not be empty for non-empty arguments."""
    seen = "; ".join(f"{_describe(s)} on {filling}" for filling, s in found.items())
    first = found["zeros"]
    differ = any(_layout(s) != _layout(first) for s in found.values())
    arrays = [x for x in leaves if isinstance(x, jax.ShapeDtypeStruct)]
    empty = not differ and all(x.size for x in arrays) and \
        any(s.size == 0 for s in jax.tree_util.tree_leaves(first))
    if not (differ or empty):
        return
    why = "differs between fillings" if differ else \
        "is empty on every filling while its arguments are not"
    raise ResultMismatchError(
        f"jaxbridge.torch: the shape of the result of function {name!r} depends on the "
        f"data: it {why} ({seen}). It fails on meta tensors, which have no data, so its "
        f"shapes were looked for on these fillings, and none of them can stand for your "
        f"data. Declare the result: wrap(fn, result=jax.ShapeDtypeStruct(shape, dtype)) "
        f"(a fixed size: pad to a maximum), or result=lambda *args: ... (args as "
        f"ShapeDtypeStructs).", function=name, what="output", problem="shape",
        declared="found by tracing", received=seen)
