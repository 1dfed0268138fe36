"""A large result written by torch straight into XLA's output buffer (``redirect=True``).

A function like ``lambda x: x + 1`` returns a fresh tensor, which the host call then
copies into XLA's preallocated output buffer: at 1M float32 elements the allocation and
the copy cost about as much as the addition itself. With ``wrap(fn, redirect=True)``
this module removes both where it can. The first call of a function (per input and
result signature) runs under a recording torch dispatch mode that finds which aten
operation produced the returned tensor. If that operation has an ``out=`` overload and
its output was exactly the declared result (dtype, shape, contiguous, not a view, no
autograd), later calls run under a dispatch mode that sends that one operation (the
same position in the sequence, the same overload) to its ``out=`` overload with XLA's
buffer as ``out``: the returned tensor *is* XLA's buffer, and nothing is copied.

Where it applies: unbatched calls with one result on the CPU path, whose result is at
least `MIN_BYTES` and at least `BYTES_PER_OP` per aten operation of the function (the
dispatch mode costs a few microseconds an operation; the copy it saves ~0.1 us a KiB).
Anything unexpected on a later call -- another operation at that position (data-
dependent control flow), an ``out=`` call that fails, a result that is not the buffer --
falls back to the copy, and the function is not redirected again for that signature.

Kept memory. XLA's buffer is valid only during the call; a tensor the function keeps
that shares it (the result in a cache, ``y.detach()``, ``y.view(-1)``, a slice, an
intermediate that the buffer held) would read freed memory later. After every
redirected call the buffer's users are counted (`_torchapi.memory_users`); any beyond
the call's own move, all at once, to a private copy (`_torchapi.move_to_private_memory`)
and stay valid, and the signature falls back to the copy. A NumPy array or DLPack
capsule made from such a tensor is the one thing no swap reaches: that is why the
redirect is opt-in (the guide, docs/guides/torch.md, has the measurements).
"""

from __future__ import annotations

import sys
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from ._convert import SAME_MEMORY_DTYPES, to_torch
from ._torchapi import TorchDispatchMode, memory_of, memory_users, move_to_private_memory

__all__ = ["MIN_BYTES", "BYTES_PER_OP", "Plan", "worth_trying", "plan_key", "learn",
           "run_redirected", "overlaps_inputs"]

#: Results below this size are copied as before (the dispatch mode would cost more).
MIN_BYTES = 1 << 20
#: ... and so are results smaller than this per aten operation the function runs.
BYTES_PER_OP = 256 << 10


class Plan:
    """Where the result comes from: the `index`-th aten call, overload `func`, whose
    ``out=`` overload is `out_func`."""

    __slots__ = ("index", "func", "out_func")

    def __init__(self, index: int, func: Any, out_func: Any) -> None:
        self.index, self.func, self.out_func = index, func, out_func


def worth_trying(out: Any) -> bool:
    """Whether a call writing into `out` may use a plan: one result on the CPU path
    (a NumPy view of XLA's buffer) of at least `MIN_BYTES`."""
    return type(out) is np.ndarray and out.nbytes >= MIN_BYTES


def plan_key(tensors: list[Any], out: np.ndarray) -> tuple:
    """The signature a plan holds for: every argument's dtype and shape, and the result's."""
    return (*((t.dtype, t.shape) if isinstance(t, torch.Tensor) else type(t) for t in tensors),
            out.dtype, out.shape)


def _out_overload(func: Any) -> Any:
    """The ``out=`` overload of aten overload `func` (same arguments plus a keyword-only
    `out`, one tensor result), or None."""
    try:
        packet = func.overloadpacket
        args = [(a.name, str(a.type)) for a in func._schema.arguments]
    except AttributeError:
        return None
    for name in packet.overloads():
        candidate = getattr(packet, name)
        schema = candidate._schema
        outs = [a for a in schema.arguments if a.name == "out"]
        rest = [(a.name, str(a.type)) for a in schema.arguments if a.name != "out"]
        if len(outs) == 1 and outs[0].kwarg_only and rest == args and \
                len(schema.returns) == 1:
            return candidate
    return None


class _Record(TorchDispatchMode):
    """Records each aten call's overload and (weakly) its single tensor output."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[Any, Any]] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None):
        result = func(*args, **(kwargs or {}))
        ref = weakref.ref(result) if type(result) is torch.Tensor else None
        self.calls.append((func, ref))
        return result


def learn(call: Callable[[], Any], out: np.ndarray) -> tuple[Any, Plan | None]:
    """Run `call` once under the recording mode: (its value, the plan or None)."""
    recorder = _Record()
    with recorder:
        value = call()
    calls = recorder.calls
    want = SAME_MEMORY_DTYPES.get(out.dtype)
    if type(value) is not torch.Tensor or value.dtype is not want or \
            tuple(value.shape) != out.shape or not value.is_contiguous() or \
            value._base is not None or value.requires_grad or value.device.type != "cpu" or \
            out.nbytes < max(MIN_BYTES, BYTES_PER_OP * len(calls)):
        return value, None
    for index in range(len(calls) - 1, -1, -1):
        func, ref = calls[index]
        if ref is not None and ref() is value:
            out_func = _out_overload(func)
            return value, None if out_func is None else Plan(index, func, out_func)
    return value, None


class _Redirect(TorchDispatchMode):
    """Sends the plan's aten call to its ``out=`` overload, writing into `target`."""

    def __init__(self, plan: Plan, target: torch.Tensor) -> None:
        super().__init__()
        self.plan, self.count = plan, 0
        self.target: torch.Tensor | None = target

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None):
        kwargs = kwargs or {}
        index, self.count = self.count, self.count + 1
        if index == self.plan.index and func is self.plan.func:
            try:
                return self.plan.out_func(*args, **kwargs, out=self.target)
            except Exception:  # noqa: BLE001 - not the learned shapes: run it plainly
                return func(*args, **kwargs)
        return func(*args, **kwargs)


def run_redirected(call: Callable[[], Any], out: np.ndarray, plan: Plan
                   ) -> tuple[Any, bool, bool]:
    """Run `call` with the plan's operation writing into `out`: (value, written, moved).

    `written`: the value is XLA's buffer itself (nothing left to copy). Otherwise the
    value is to be copied into `out` as usual. `moved`: when the call ended, tensors
    besides the call's own shared the buffer (a result or an intermediate the function
    kept, or the value as a view of it: the buffer held an intermediate and the result
    is, say, its transpose); they were moved to private memory, all at once, so they
    stay valid and the value can be copied into `out` without reading what the copy
    writes. XLA's buffer itself still holds what was written into it."""
    target = to_torch(out)
    memory = memory_of(target)
    own = memory_users(memory)  # tensors sharing the buffer (a bfloat16 view has two)
    redirect = _Redirect(plan, target)
    refs = sys.getrefcount(target) - 1  # `target` and the argument, after the call
    value = moved = None
    try:
        with redirect:
            value = call()
    finally:  # a call that raised may have kept the buffer as well
        redirect.target = None
        # other tensors sharing the buffer, or the result object itself kept elsewhere
        if memory_users(memory) > own or sys.getrefcount(target) - (value is target) > refs:
            move_to_private_memory(target)
            moved = True
    return value, value is target, bool(moved)


def overlaps_inputs(tensors: list[Any], out: np.ndarray) -> bool:
    """Whether XLA's output buffer shares memory with an input (aliased buffers): an
    operation writing into it would read what it has already written."""
    lo = out.ctypes.data
    hi = lo + out.nbytes
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.numel():
            start = t.data_ptr()
            if start < hi and lo < start + t.numel() * t.element_size():
                return True
    return False

