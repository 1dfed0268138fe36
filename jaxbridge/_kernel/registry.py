"""XLA FFI target names: validation, the reserved `jaxbridge_` prefix, and registration
with XLA (a process-wide table: the same name may not be given two handlers). Each
handler is also handed to the guarded call (guard.py), which runs it by name."""

from __future__ import annotations

import ctypes
import re
import threading
from typing import Any

import jax

from .._core import extensions
from ..errors import KernelError

__all__ = ["PLATFORMS", "RESERVED_PREFIX", "platform_key", "check_name", "register_target",
           "is_registered", "make_batch_partitionable"]

# Our platform keys -> the names jax.ffi.register_ffi_target expects.
PLATFORMS = {"cpu": "cpu", "cuda": "CUDA", "rocm": "ROCM"}
RESERVED_PREFIX = "jaxbridge_"
_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
_registry: dict[tuple[str, str], int] = {}
_lock = threading.Lock()


def _capsule_pointer(capsule: Any) -> int:
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    name = ctypes.pythonapi.PyCapsule_GetName
    name.restype, name.argtypes = ctypes.c_char_p, [ctypes.py_object]
    return int(get(capsule, name(capsule)) or 0)


def platform_key(p: str) -> str:
    """'cpu' | 'cuda' | 'rocm' from any spelling ('gpu' means CUDA)."""
    key = str(p).lower()
    if key == "gpu":
        key = "cuda"
    if key not in PLATFORMS:
        raise KernelError(f"jaxbridge: unknown platform {p!r}; expected one of "
                          f"{sorted(PLATFORMS)}")
    return key


def check_name(name: str, *, builtin: bool = False) -> None:
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise KernelError(f"jaxbridge: invalid FFI target name {name!r}: use letters, digits "
                          "and underscores, optionally namespaced with dots ('mylib.op_fwd')")
    if not builtin and name.startswith(RESERVED_PREFIX):
        raise KernelError(f"jaxbridge: FFI target name {name!r}: the prefix "
                          f"{RESERVED_PREFIX!r} is reserved for jaxbridge's built-in kernels")


def register_target(name: str, handler: Any, *, platform: str = "cpu",
                    namespace: str | None = None, builtin: bool = False) -> str:
    """Register an XLA FFI handler (a PyCapsule) under a validated, namespaced name.

    Registering the same handler twice is a no-op. Kernels made by `jaxbridge.kernel`
    from capsules, and `jaxbridge.cpp.Library.kernel`, register their targets
    themselves; call this to register a handler from your own extension module under
    a name that `jaxbridge.kernel` (or `jax.ffi.ffi_call`) then refers to.

    Args:
      name: the target name: letters, digits and underscores, optionally namespaced
        with dots (``"mylib.op_fwd"``); the prefix ``jaxbridge_`` is reserved for the
        built-in kernels.
      handler: the handler, a PyCapsule (e.g. from a pybind11 module built against
        `jaxbridge.get_include()` and ``jax.ffi.include_dir()``).
      platform: the XLA platform (``"cpu"``, ``"cuda"``).
      namespace: prefixed to the name (``f"{namespace}.{name}"``).
      builtin: for jaxbridge's own kernels only.

    Returns:
      The full target name (``f"{namespace}.{name}"`` when a namespace is given).

    Raises:
      KernelError: an invalid or reserved name, or a different handler registered
        under the same name.

    Example:
        >>> import jaxbridge as jb
        >>> jb.register_target("jaxbridge_mine", None)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        jaxbridge.errors.KernelError: ... the prefix 'jaxbridge_' is reserved for ...
    """
    full = f"{namespace}.{name}" if namespace else name
    check_name(full, builtin=builtin)
    plat = platform_key(platform)
    if type(handler).__name__ != "PyCapsule":
        raise KernelError(f"jaxbridge: handler for FFI target {full!r} must be a PyCapsule "
                          f"(got {type(handler).__name__}); wrap a ctypes function pointer "
                          "with jax.ffi.pycapsule")
    ptr = _capsule_pointer(handler)
    with _lock:
        old = _registry.get((full, plat))
        if old is not None:
            if old != ptr:
                raise KernelError(f"jaxbridge: FFI target {full!r} on {plat} is already "
                                  "registered with a different handler")
            return full
        jax.ffi.register_ffi_target(full, handler, platform=PLATFORMS[plat])
        _registry[(full, plat)] = ptr
        native = extensions.load("_builtin")
        if native is not None and plat in ("cpu", "cuda"):
            native.guard_register(plat, full, handler)
    return full


def is_registered(name: str, platform: str = "cpu") -> bool:
    return (name, platform_key(platform)) in _registry


_batch_partitionable: set[str] = set()


def make_batch_partitionable(name: str) -> None:
    """Let XLA split calls of target `name` along leading batch dimensions (once)."""
    with _lock:
        if name not in _batch_partitionable:
            jax.ffi.register_ffi_target_as_batch_partitionable(name)
            _batch_partitionable.add(name)
