"""torch's random generators, replayed for the derivative calls that run a function again.

The VJP and JVP rules of a wrapped function run it again (torch's graph cannot
cross from one XLA call to the next). A function that draws random numbers (dropout,
``torch.bernoulli``, ``torch.randn``) must draw the same ones there as in its forward
call. So the forward call of such a function writes the generators' state, as it was
before the call, into a residual output of the call (`state_struct`): the state then
travels with the call through XLA, whatever runs in between and on whichever thread,
and reaches the derivative rules, whose calls set it before running the function and
put the generators back where they were afterwards (`replaying`): a derivative call
draws nothing from the global generators.

The state: the CPU generator's (`torch.get_rng_state`), then one byte saying whether
CUDA's were taken, then CUDA's per device (`torch.cuda.get_rng_state_all`, taken where
CUDA is initialized; before that no CUDA generator has drawn anything).

The generators are global, and calls may run at once on XLA's threads (one per shard):
a state taken before one call is the state its draws start from only if no other call
draws in between. So everything here that takes, sets or draws from them for a call
holds one lock (`holding`): calls of functions that draw random numbers run one at a
time.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

import jax
import numpy as np
import torch

from ..errors import ForeignCallError
from ._convert import to_torch
from ._device import torch_has_cuda
from ._torchapi import is_batched, outside_transforms

__all__ = ["state_struct", "holding", "capture_into", "replaying", "preserved", "replayed"]

CPU_BYTES = int(torch.get_rng_state().numel())
CUDA_BYTES = 16  # per device: the Philox generator's seed and offset, 8 bytes each
# Reentrant: torch code may trace a wrapped function (finding its shapes) inside a call.
_GENERATORS = threading.RLock()
#: How long a call waits for another call's use of the generators before it fails (a
#: wrapped function that calls JAX, which runs another such function on another thread,
#: would otherwise wait for ever).
WAIT_SECONDS = 120.0


@contextlib.contextmanager
def holding() -> Iterator[None]:
    """Hold torch's generators for one call: no other call takes, sets or draws from
    them meanwhile (see the module docstring)."""
    if not _GENERATORS.acquire(timeout=WAIT_SECONDS):
        raise ForeignCallError(
            f"jaxbridge.torch: a call of a function that draws random numbers waited "
            f"{WAIT_SECONDS:.0f} s for torch's random generators, held by another such call "
            f"on another thread (calls that draw random numbers run one at a time, so that "
            f"their derivatives replay their draws). A wrapped function that calls JAX, "
            f"which runs another wrapped function that draws random numbers on another "
            f"thread, waits for itself: draw those numbers outside the call.")
    try:
        yield
    finally:
        _GENERATORS.release()


def _cuda_devices() -> int:
    return torch.cuda.device_count() if torch_has_cuda() else 0


def state_struct() -> jax.ShapeDtypeStruct:
    """The residual output that carries the generators' state."""
    return jax.ShapeDtypeStruct((CPU_BYTES + 1 + CUDA_BYTES * _cuda_devices(),), np.uint8)


# Both run inside the derivative calls' torch.func transforms, whose wrapped tensors
# torch.set_rng_state cannot read: they work outside them (`outside_transforms`).
def _current() -> torch.Tensor:
    with outside_transforms():
        state = torch.zeros(CPU_BYTES + 1 + CUDA_BYTES * _cuda_devices(), dtype=torch.uint8)
        state[:CPU_BYTES] = torch.get_rng_state()
        if state.numel() > CPU_BYTES + 1 and torch.cuda.is_initialized():
            state[CPU_BYTES] = 1
            state[CPU_BYTES + 1:] = torch.cat(torch.cuda.get_rng_state_all())
        return state


def _set(state: torch.Tensor) -> None:
    with outside_transforms():
        # one row: with batch_dims, every row of a shard's residual holds its state
        state = state.reshape(-1, state.shape[-1])[0].cpu()
        torch.set_rng_state(state[:CPU_BYTES].clone())
        if state.numel() > CPU_BYTES + 1 and bool(state[CPU_BYTES]):
            torch.cuda.set_rng_state_all(list(state[CPU_BYTES + 1:].clone().split(CUDA_BYTES)))


def capture_into(buffer: Any) -> None:
    """Write the generators' current state into `buffer` (XLA's residual buffer: a NumPy
    view, or a tensor of XLA's device buffer)."""
    target = buffer if isinstance(buffer, torch.Tensor) else to_torch(buffer)
    target.copy_(_current())


@contextlib.contextmanager
def preserved() -> Iterator[None]:
    """Whatever runs inside draws nothing from the global generators (they are put
    back afterwards): for runs that only find shapes."""
    with holding():
        before = _current()
        try:
            yield
        finally:
            _set(before)


@contextlib.contextmanager
def replaying(state: torch.Tensor) -> Iterator[None]:
    """Run with the generators set to `state` (captured by `capture_into`), and put
    them back where they were afterwards."""
    with preserved():
        _set(state)
        yield


def replayed(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn` taking the generators' state as a first argument, drawing from it. Under
    ``torch.vmap`` (a batched derivative call) it raises: the generators hold one state,
    not one per element, so the call falls back to one run per element."""
    def replay(state: torch.Tensor, *args: Any, **static: Any) -> Any:
        if is_batched(state):
            raise NotImplementedError("jaxbridge.torch: a generator state per element "
                                      "(torch.vmap): run the elements one by one")
        with replaying(state):
            return fn(*args, **static)

    return replay
