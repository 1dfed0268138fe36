"""Guarded outputs: a checked call of a kernel's FFI target that reports a write outside
an output instead of corrupting memory (`jaxbridge.kernel(..., guard_outputs=True)`,
`Kernel.guarded()`, and every kernel traced inside `jaxbridge.testing.check_rules`).

The program calls the built-in target ``jaxbridge_guarded`` (csrc/builtin/guard.h)
instead of the kernel's own: each result is a flat buffer holding the output between
a front and a back guard. The guarded call fills the guards with a canary byte, runs
the kernel's handler on the outputs alone (their declared shapes, at their place in
the larger buffers; an aliased operand is copied into its output first), reads the
guards back and fails, naming kernel, target and output, if any changed; the program
then slices each output out of its buffer. The back guard is as large as the output
and as every operand (at least 256 bytes): a handler that writes a shape meant for
another buffer stays inside it. Further out, a write goes unseen.

Costs: a copy of every output and 2-3x its memory, and a wait for the device after
each call on CUDA; the call is not split along batch dimensions (XLA gathers sharded
inputs); for checks, not for production.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

import jax
import numpy as np

from .._core import extensions
from .._core.jaxapi import trace_flag
from ..errors import KernelError, describe
from .registry import is_registered, register_target

__all__ = ["TARGET", "FRONT_BYTES", "MIN_BACK_BYTES", "guarding", "active", "GuardedCall",
           "back_bytes"]

TARGET = "jaxbridge_guarded"
#: Guard bytes before each output (a multiple of every element size and of the
#: alignment kernels assume of XLA's buffers).
FRONT_BYTES = 256
#: The least guard bytes after each output.
MIN_BACK_BYTES = 256

_set_guarding, _guarding = trace_flag(
    "jaxbridge_guard_outputs", "Guard the outputs of every jaxbridge kernel traced "
    "(jaxbridge.kernel(..., guard_outputs=True) for all).")
_registered: set[str] = set()
_lock = threading.Lock()


def guarding() -> Any:
    """A context manager: every kernel traced inside it guards its outputs
    (`jaxbridge.testing.check_rules` runs its checks inside one).

    The option is part of JAX's trace context: a function jitted before is traced again
    inside the block, and what is traced inside is not reused after it. The environment
    variable ``JAXBRIDGE_GUARD_OUTPUTS=1`` (before importing jaxbridge) turns it on for
    the whole process, e.g. for a test suite.
    """
    return _set_guarding(True)


def active() -> bool:
    """Whether kernels traced now guard their outputs (`guarding`)."""
    return _guarding()


def back_bytes(output: Any, operands: tuple) -> int:
    """Guard bytes after `output`: the largest of the output, every operand and
    MIN_BACK_BYTES, rounded up to a multiple of FRONT_BYTES."""
    sizes = [_nbytes(a) for a in (output, *operands)]
    most = max([MIN_BACK_BYTES, *sizes])
    return -(-most // FRONT_BYTES) * FRONT_BYTES


def _nbytes(aval: Any) -> int:
    return int(np.prod(aval.shape, dtype=np.int64)) * np.dtype(aval.dtype).itemsize


def _ensure_target(platform: str) -> None:
    """Register the guarded call's own handler for `platform` (once)."""
    with _lock:
        if platform in _registered:
            return
        native = extensions.load("_builtin")
        if native is None:
            raise KernelError("jaxbridge: guard_outputs=True needs jaxbridge's compiled kernels "
                              f"(jaxbridge._builtin): {extensions.missing_reason('_builtin')}")
        handlers = {p.lower(): h for p, h in native.guarded_call().items()}
        if platform not in handlers:
            raise KernelError(f"jaxbridge: guard_outputs=True on {platform!r}: jaxbridge was "
                              f"built without it (has: {sorted(handlers)})")
        register_target(TARGET, handlers[platform], platform=platform, builtin=True)
        _registered.add(platform)


@dataclasses.dataclass(frozen=True)
class GuardedCall:
    """One guarded call of FFI target `target` (see the module docstring); `run` is
    what the kernel's lowering traces in place of the plain custom call."""

    target: str
    platform: str
    aliases: tuple        # ((operand, result), ...) of the kernel playing this role
    attrs: tuple          # the kernel's attributes, ((name, value), ...)
    names: tuple          # the results' names, for the message
    context: str          # "jaxbridge kernel 'k', <role> target 't'"
    results: tuple        # the results' avals

    def run(self, *operands: Any) -> list:
        """The results of the call, from inside their guarded buffers."""
        if not is_registered(self.target, self.platform):
            raise KernelError(
                f"{self.context}: guard_outputs=True runs the handler that jaxbridge "
                f"registered under that name, and this target was registered elsewhere "
                f"(jax.ffi.register_ffi_target): give jaxbridge.kernel the handler's capsule, "
                f"or register it with jaxbridge.register_target")
        _ensure_target(self.platform)
        for o in self.results:
            if jax.dtypes.itemsize_bits(o.dtype) % 8:
                raise KernelError(f"{self.context}: guard_outputs=True needs outputs of whole "
                                  f"bytes; received {describe(o)}")
        outs = list(self.results)
        layout, structs, places = self._layout(outs, [jax.typeof(x) for x in operands])
        big = jax.ffi.ffi_call(TARGET, structs)(
            *operands, **dict(self.attrs), jaxbridge_guard_target=self.target,
            jaxbridge_guard_context=self.context,
            jaxbridge_guard_outputs="\n".join(self.names),
            jaxbridge_guard_layout=np.asarray(layout, np.int64))
        return [b[start:start + size].reshape(o.shape)
                for b, o, (start, size) in zip(big, outs, places)]

    def _layout(self, outs: list, operands: list) -> tuple[list, list, list]:
        """(the layout attribute, the larger results, each output's (start, size) in
        elements)."""
        layout = [len(outs), FRONT_BYTES]
        structs, places = [], []
        for o in outs:
            item = np.dtype(o.dtype).itemsize
            size = _nbytes(o)
            back = back_bytes(o, tuple(operands))
            layout += [size, back, len(o.shape), *map(int, o.shape)]
            structs.append(jax.ShapeDtypeStruct(((FRONT_BYTES + size + back) // item,), o.dtype))
            places.append((FRONT_BYTES // item, size // item))
        layout += [len(self.aliases), *(v for pair in self.aliases for v in pair)]
        return layout, structs, places
