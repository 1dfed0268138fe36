"""The host-call path: run a Python function on NumPy arrays from compiled JAX code.

Two mechanisms, one interface (`HostCallable` + `lower_host_call`):

* native: the XLA FFI handler `jaxbridge_host_call` in `csrc/callback/hostcall.cc`
  calls the `HostCallable` with zero-copy NumPy views of XLA's buffers (about 50x
  cheaper per call than `jax.pure_callback`; see benchmarks/RESULTS.md);
* fallback: `jax.pure_callback`, used where the native extension or a platform
  handler is unavailable, or when asked for with `backend="pure_callback"`.
"""

from __future__ import annotations

import itertools
import os
import threading
import traceback
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from . import _compat
from ._compat import mlir

try:
    from . import _native
except ImportError as _err:  # pragma: no cover - exercised only on broken installs
    _native = None
    NATIVE_IMPORT_ERROR: str | None = f"{type(_err).__name__}: {_err}"
else:
    NATIVE_IMPORT_ERROR = None

TARGET_NAME = "jaxbridge_host_call"
# The same handler under a second name that XLA may split along leading batch
# dimensions (one call per shard); only calls that declare batch dims use it.
BATCHED_TARGET_NAME = "jaxbridge_host_call_batched"
ON_MESH = ("error", "replicate")
BACKENDS = ("auto", "native", "pure_callback")
_ids = itertools.count(1)
_registered_platforms: set[str] = set()
_register_lock = threading.Lock()


from .errors import ForeignCallError  # noqa: E402


def _register_native_targets() -> set[str]:
    """Register the native handler with XLA once per process; return its platforms."""
    with _register_lock:
        if _registered_platforms or _native is None:
            return _registered_platforms
        for platform, targets in _native.registrations().items():
            capsule = targets[TARGET_NAME]
            try:
                jax.ffi.register_ffi_target(TARGET_NAME, capsule, platform=platform)
                jax.ffi.register_ffi_target(BATCHED_TARGET_NAME, capsule, platform=platform)
            except Exception:  # noqa: BLE001 - e.g. CUDA handler on a CPU-only jaxlib
                continue
            _registered_platforms.add(platform.lower())
        if _registered_platforms:
            jax.ffi.register_ffi_target_as_batch_partitionable(BATCHED_TARGET_NAME)
        return _registered_platforms


def native_platforms() -> frozenset[str]:
    """Lower-case platform names ('cpu', 'cuda') served by the native trampoline."""
    return frozenset(_register_native_targets())


def default_backend() -> str:
    """The backend used when a function says `backend="auto"` (env JAXBRIDGE_HOST_CALL)."""
    value = os.environ.get("JAXBRIDGE_HOST_CALL", "auto")
    if value not in BACKENDS:
        raise ValueError(
            f"jaxbridge: environment variable JAXBRIDGE_HOST_CALL must be one of "
            f"{BACKENDS}, got {value!r}")
    return value


def format_exception(name: str, what: str, exc: BaseException) -> str:
    """The one-line-plus-location message for an exception raised in host code."""
    if isinstance(exc, ForeignCallError):
        return str(exc)
    frames = traceback.extract_tb(exc.__traceback__)
    where = ""
    if frames:
        last = frames[-1]
        where = f"\n  (raised at {last.filename}:{last.lineno} in {last.name})"
    return (f"{type(exc).__name__}: {exc}\n  in the {what} of jaxbridge foreign function "
            f"{name!r}{where}")


class HostCallable:
    """A checked host computation that XLA can call.

    `run(inputs) -> outputs` takes and returns flat lists of NumPy arrays; it must
    return arrays of exactly `out_avals`' shapes and dtypes (it checks them itself,
    to name the offending output in its error).
    """

    def __init__(self, run: Callable[[Sequence[np.ndarray]], Sequence[np.ndarray]],
                 out_avals: Sequence[Any], name: str, what: str,
                 fill: Callable[[Sequence[np.ndarray], Sequence[np.ndarray]], None]
                 | None = None):
        self.run = run
        self.fill = fill or self._fill
        self.out_avals = tuple(out_avals)
        self.name = name
        self.what = what
        self.id = next(_ids)
        if _native is not None:
            _native.register_callback(self.id, self)
            weakref.finalize(self, _native.unregister_callback, self.id)

    def __repr__(self) -> str:
        return f"<HostCallable #{self.id} {self.what} of {self.name!r}>"

    def __call__(self, inputs: tuple, outputs: tuple) -> str | None:
        """Native protocol: fill `outputs` in place; return an error message or None."""
        try:
            self.fill(inputs, outputs)
        except BaseException as exc:  # noqa: BLE001 - reported through XLA, never lost
            return format_exception(self.name, self.what, exc)
        return None

    def _fill(self, inputs: tuple, outputs: tuple) -> None:
        for out, value in zip(outputs, self.run(inputs)):
            out[...] = value  # shapes and dtypes were checked by `run`

    def call_pure(self, *arrays: Any) -> tuple[np.ndarray, ...]:
        """`jax.pure_callback` protocol: return the outputs."""
        try:
            return tuple(self.run([np.asarray(a) for a in arrays]))
        except BaseException as exc:  # noqa: BLE001
            raise ForeignCallError(format_exception(self.name, self.what, exc)) from exc


def lower_host_call(ctx: Any, target: HostCallable, *args: Any, backend: str = "auto",
                    platform: str | None = None, num_batch_dims: int = 0,
                    on_mesh: str = "error") -> Sequence[Any]:
    """Emit the call of `target` on `args` into the MLIR module being built.

    With `num_batch_dims > 0` on the native path, XLA may split the call along those
    leading dimensions, one call per shard on the shard's own device. A call that
    cannot be split, in a computation partitioned over several devices, would have
    its inputs gathered: that is an error unless `on_mesh="replicate"` allows it.
    """
    if backend == "auto":
        backend = default_backend()
    use_native = backend != "pure_callback" and platform in native_platforms()
    devices = _compat.auto_partitioned_devices(ctx)
    if devices > 1 and not (use_native and num_batch_dims) and on_mesh != "replicate":
        how = ("declares no batch dimensions" if not num_batch_dims else
               "runs through jax.pure_callback, which XLA cannot split")
        raise RuntimeError(
            f"jaxbridge: the {target.what} of foreign function {target.name!r} is compiled into "
            f"a computation partitioned over {devices} devices, but it {how}, so XLA would "
            f"gather its inputs onto every device. Declare jb.foreign(..., batch_dims=k) for a "
            f"function that is independent along its k leading dimensions (it then runs once "
            f"per shard), call it inside jax.shard_map, or pass on_mesh='replicate' to accept "
            f"the gather.")
    if backend == "native" and not use_native:
        raise RuntimeError(
            f"jaxbridge: foreign function {target.name!r} asked for backend='native', but the "
            f"native host call is not available on platform {platform!r} "
            f"(native extension: {NATIVE_IMPORT_ERROR or 'loaded'}; native platforms: "
            f"{sorted(native_platforms())}). Use backend='auto' to fall back to "
            f"jax.pure_callback.")
    if use_native:
        _compat.add_keepalive(ctx, target)
        if not num_batch_dims:
            return jax.ffi.ffi_lowering(TARGET_NAME)(ctx, *args, callback_id=np.int64(target.id))
        results = jax.ffi.ffi_lowering(BATCHED_TARGET_NAME)(
            ctx, *args, callback_id=np.int64(target.id))
        _compat.set_num_batch_dims(results, num_batch_dims)
        return results

    out_shapes = tuple(jax.ShapeDtypeStruct(a.shape, a.dtype) for a in target.out_avals)

    def via_pure_callback(*xs):
        return jax.pure_callback(target.call_pure, out_shapes, *xs, vmap_method="sequential")

    return mlir.lower_fun(via_pure_callback, multiple_results=True)(ctx, *args)


def num_registered() -> int:
    """How many host callables are alive in the native registry (for leak checks)."""
    return 0 if _native is None else int(_native.num_registered())
