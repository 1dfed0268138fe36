"""Autograd graphs kept from a forward call for the VJP call that follows it.

Without them, the VJP call of a wrapped function runs the function again with autograd
on (torch's graph cannot cross from one XLA call to the next), so a training step pays
for two forwards where eager torch pays for one. A forward call that JAX is about to
differentiate in reverse mode (its inputs are linearize tracers: `grad`, `vjp`,
`value_and_grad`, `jacrev`) is made through a `jb.foreign` function with one more
residual output, a token (`token_struct`). That call runs the function with autograd
on, on private copies of its inputs, keeps the graph here under a fresh token, and
writes the token into the residual. The VJP call receives the token with the primals:
it takes the graph (once) and runs torch's backward on it; if the graph is not there it
runs the function again, as every other call does. So a token is only ever a hint:

* nothing a kept graph holds points into XLA's memory: its inputs are copies, its
  outputs torch's own (the results are copied into XLA's buffers, never redirected);
* a graph is used once (a second use of the same VJP, `jax.vjp`'s pullback called twice,
  finds it gone and runs the function again);
* a graph nobody takes (forward mode under `jax.linearize`, a `jax.vjp` pullback never
  called, a rematerialized forward) is dropped when `KEPT` newer ones are kept, so
  memory stays bounded by `KEPT` forward passes' activations;
* batched calls (under `jax.vmap`) keep nothing and use nothing.

Example:
    >>> import torch
    >>> from jaxbridge.torch import _graphs
    >>> x = torch.ones(2, requires_grad=True)
    >>> token = _graphs.keep([x], [(x * 3).sum()])
    >>> _graphs.take(token)[0][0] is x, _graphs.take(token)
    (True, None)
"""

from __future__ import annotations

import collections
import itertools
import threading
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

__all__ = ["KEPT", "NONE", "token_struct", "keep", "take", "kept_count", "clear"]

#: How many graphs are kept at most; the oldest is dropped first.
KEPT = 8
#: The token of "no graph kept" (batched calls, graphs that could not be kept).
NONE = 0

_lock = threading.Lock()
_graphs: collections.OrderedDict[int, tuple[list, list]] = collections.OrderedDict()
# Tokens count up from 1 and wrap within int32 (the residual's dtype whatever x64 says);
# with at most KEPT graphs held, a wrapped token never meets a live one.
_counter = itertools.count(1)


def token_struct(batch_shape: tuple = ()) -> jax.ShapeDtypeStruct:
    """The residual output carrying a token."""
    return jax.ShapeDtypeStruct(batch_shape, np.int32)


def keep(inputs: Sequence[Any], outputs: Sequence[Any]) -> int:
    """Keep a graph: `inputs` (leaf tensors requiring grad, or None where an input is not
    differentiated) and `outputs` (the function's result leaves). Returns its token."""
    with _lock:
        token = next(_counter) % 2**31 or next(_counter)
        _graphs[token] = (list(inputs), list(outputs))
        while len(_graphs) > KEPT:
            _graphs.popitem(last=False)
    return token


def take(token: int) -> tuple[list, list] | None:
    """The graph kept under `token`, removed from here; None if there is none."""
    if token == NONE:
        return None
    with _lock:
        return _graphs.pop(token, None)


def kept_count() -> int:
    """How many graphs are kept now (for tests)."""
    with _lock:
        return len(_graphs)


def clear() -> None:
    """Drop every kept graph (for tests)."""
    with _lock:
        _graphs.clear()
