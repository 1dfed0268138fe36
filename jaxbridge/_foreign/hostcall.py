"""The host-call path: run a Python function on NumPy arrays from compiled JAX code.

Two mechanisms, one interface (`HostCallable` + `lower_host_call`):

* native: the XLA FFI handler `jaxbridge_host_call` (csrc/hostcall/invoke.cc) calls
  `HostCallable.fill(inputs, outputs)` with zero-copy NumPy views of XLA's buffers
  (about 50x cheaper per call than `jax.pure_callback`; see benchmarks/RESULTS.md);
* fallback: `jax.pure_callback`, used where the native extension or a platform handler
  is unavailable, or when asked for with `backend="pure_callback"`.

Why single-device programs with host calls run synchronously. A host function may call
JAX itself (every `jaxbridge.scipy` solver does). With CPU async dispatch, a training
loop that does not wait for each step queues up to 32 steps; a host call running inside
one of them that dispatches JAX work then waits for a slot that only the queued steps
can free: a deadlock. PjRt avoids this for JAX's own callbacks by executing any program
compiled with host callbacks synchronously on the calling thread ("When using host
callbacks on CPU, we need to use synchronous dispatch to avoid deadlocks with reentrant
callbacks", xla/python/pjrt_ifrt/pjrt_executable.cc). Lowering registers each
`HostCallable` as the module's host callback (`jaxapi.mark_host_callback`), so our
programs get exactly the same treatment. It also makes the executable own the callable.

Programs on several devices are different: each device runs its part on a thread of its
own, one part at a time, so JAX work a host call starts there would queue behind the
part that waits for it. There the call runs inside XLA's buffer callback
(`jaxapi.lower_buffer_callback`), whose handler makes such work run inline.

Where the call runs on the calling thread, an exception keeps its identity because the
trampoline re-raises it on that thread when the JAX call returns; elsewhere (XLA's
worker threads, a device's part of a program, `pure_callback`) it crosses XLA as an
error whose text carries a token, and JAX's runtime error for it is built as the
exception itself (`delivery.py`, which also hands the runtime its hooks; `threads.py`
sets the BLAS thread budget of each call, `shutdown.py` waits for calls at exit).
XLA CPU's thunk executor runs independent parts of a program in parallel, so even a
single-device program may run a host call on a worker (the status check after a
compiled solve's forward loop in `jit(grad(...))`, about one call in three on 2 cores).
"""

from __future__ import annotations

import functools
import itertools
import os
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from .._core import extensions, jaxapi
from .._core.checks import refuse_gather
from .._core.jaxapi import mlir
from ..errors import BackendError, ForeignCallError, KeptViewError
from . import delivery, shutdown, threads

_native = extensions.load("_hostcall")

__all__ = ["HostCallable", "lower_host_call", "native_platforms", "default_backend",
           "ForeignCallError"]

TARGET_NAME = "jaxbridge_host_call"
# The same handler under a second name that XLA may split along leading batch
# dimensions (one call per shard); only calls that declare batch dims use it.
BATCHED_TARGET_NAME = "jaxbridge_host_call_batched"
ON_MESH = ("error", "replicate")
BACKENDS = ("auto", "native", "pure_callback")
_ids = itertools.count(1)
_registered_platforms: set[str] = set()
_register_lock = threading.Lock()


delivery.install()
if _native is not None:
    delivery.install_native_hooks(_native)
    shutdown.wait_at_exit(_native)


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


class CopyPolicy:
    """Whether a host function gets copies of XLA's buffers instead of zero-copy views:
    one per function (or rule), shared by its `HostCallable`s for every signature. It
    becomes True when the function is seen keeping views past a call."""

    __slots__ = ("copy",)

    def __init__(self) -> None:
        self.copy = False


class HostCallable:
    """A host computation that compiled code can call.

    `fill(inputs, outputs)` takes a tuple of NumPy arrays and fills a tuple of
    writable arrays of exactly `out_avals`' shapes and dtypes (shard-local shapes under
    `batch_dims`), or raises. It must keep nothing it was given: on the native path the
    arrays are views of XLA's buffers, valid only during the call.

    `device_fill(inputs, outputs, stream, device)`, if given, replaces `fill` on the CUDA
    platform: DLPack capsules of XLA's device buffers and XLA's stream, no staging
    through host memory (csrc/hostcall/device_call.cc; jaxbridge.torch uses it).
    """

    def __init__(self, fill: Callable[[tuple, tuple], Any], out_avals: Sequence[Any],
                 name: str, what: str, copy_policy: CopyPolicy | None = None,
                 device_fill: Callable[[tuple, tuple, int, int], Any] | None = None):
        self.fill = fill
        self.device_fill = device_fill
        self.out_avals = tuple(out_avals)
        self.name = name
        self.what = what
        self.copy_policy = copy_policy if copy_policy is not None else CopyPolicy()
        self.id = next(_ids)
        threads.refresh()
        if _native is not None:
            # The trampoline may call the user's function itself (runners._direct);
            # this object keeps what it is given alive.
            self.direct = getattr(fill, "direct", None)
            _native.register_callback(self.id, fill, self, self.direct)
            if self.copy_policy.copy:
                _native.set_copies_inputs(self.id, True)
            if device_fill is not None:
                _native.set_device_fill(self.id, device_fill)
            # Not at exit: a daemon thread may be inside a call of it then.
            weakref.finalize(self, _native.unregister_callback, self.id).atexit = False

    def __repr__(self) -> str:
        return f"<HostCallable #{self.id} {self.what} of {self.name!r}>"

    def __call__(self, *args: Any) -> Any:
        # Registered as the module's host callback only so that PjRt runs the program
        # synchronously and the executable owns this object; XLA calls it by id instead.
        raise RuntimeError(f"{self!r} is called by the jaxbridge trampoline, not directly")

    @property
    def copies_inputs(self) -> bool:
        """True once this callable kept a view: it then gets copies of XLA's buffers."""
        return _native is not None and bool(_native.copies_inputs(self.id))

    # -- slow paths called by the native trampoline
    def annotate(self, exc: BaseException) -> None:
        """Before `exc` is delivered: note which foreign function raised it (once)."""
        delivery.annotate(exc, self.what, self.name)

    def failure_message(self, exc: BaseException, started: int = -1) -> str:
        """The XLA error text for a failure that crosses XLA as an error (see
        `delivery.failure_message`): JAX's runtime error for it becomes `exc` itself.
        `started`: the failed call's ordinal among this callable's calls (-1: unknown);
        the failures of one run's devices are reported once."""
        origin = None
        if started >= 0 and _native is not None:
            origin = (self.id, started, functools.partial(_native.calls_started, self.id))
        return delivery.failure_message(exc, self.what, self.name, origin)

    def started_copying(self) -> None:
        """The trampoline switched this callable to copies: so do its siblings (the same
        function or rule compiled for other shapes) from now on."""
        self.copy_policy.copy = True

    def kept_view_error(self, inputs: list[int], outputs: list[int],
                        derived: int) -> KeptViewError:
        """The error for a function that kept views of XLA's buffers past the call."""
        kept = [f"input {i}" for i in inputs] + [f"output {i}" for i in outputs]
        parts = []
        if kept:
            parts.append(f"{', '.join(kept)} (jaxbridge gave the kept arrays a private copy "
                         "of their data, so they stay valid)")
        if derived:
            parts.append(f"{derived} view(s) derived from them (slices, reshapes, "
                         "transposes; these cannot be repaired and must not be used)")
        return KeptViewError(
            f"jaxbridge: the {self.what} of foreign function {self.name!r} kept "
            f"{' and '.join(parts)} after returning. Its arguments are zero-copy views of "
            f"XLA's buffers, valid only during the call: copy what you keep "
            f"(np.array(x)). From now on this function gets copies of its inputs (slower).")

    # -- eager calls: arrays in, arrays out, on the calling thread
    def run_eagerly(self, arrays: Sequence[Any]) -> tuple[np.ndarray, ...]:
        """Run the host computation directly (exceptions propagate as themselves)."""
        outs = tuple(np.empty(a.shape, a.dtype) for a in self.out_avals)
        try:
            self.fill(tuple(np.asarray(a) for a in arrays), outs)
        except BaseException as exc:
            self.annotate(exc)
            raise
        return outs

    # -- jax.pure_callback protocol
    def call_pure(self, *arrays: Any) -> tuple[np.ndarray, ...]:
        """`jax.pure_callback` turns any exception into a runtime error string, so the
        error says what happened and carries a token: JAX's runtime error for it is
        raised as `exc` itself (see the module docstring)."""
        outs = tuple(np.empty(a.shape, a.dtype) for a in self.out_avals)
        try:
            self.fill(tuple(np.asarray(a) for a in arrays), outs)
        except BaseException as exc:  # noqa: BLE001 - re-raised, described
            self.annotate(exc)
            raise ForeignCallError(self.failure_message(exc)) from exc
        return outs


def lower_host_call(ctx: Any, target: HostCallable, *args: Any, backend: str = "auto",
                    platform: str | None = None, num_batch_dims: int = 0,
                    on_mesh: str = "error", aliases: Sequence[tuple[int, int]] = ()
                    ) -> Sequence[Any]:
    """Emit the call of `target` on `args` into the MLIR module being built.

    `aliases` ((operand, result) pairs) make XLA write those results into the operands'
    buffers (the FFI call's input_output_aliases; XLA copies an operand that is still
    needed afterwards). The pure_callback fallback ignores them.

    With `num_batch_dims > 0` on the native path, XLA may split the call along those
    leading dimensions, one call per shard on the shard's own device. A call that
    cannot be split, in a computation partitioned over several devices, would have
    its inputs gathered: that is an error unless `on_mesh="replicate"` allows it.
    """
    if jaxapi.is_exporting(ctx):
        raise BackendError(
            f"jaxbridge: the {target.what} of foreign function {target.name!r} cannot be "
            f"exported with jax.export: it calls Python in this process (the compiled "
            f"program refers to the function by an in-process id), and an exported artifact "
            f"must run elsewhere. Export the JAX parts around it, or write the computation "
            f"as a C++ kernel (jaxbridge.kernel / jaxbridge.cpp.load), which exports with "
            f"disabled_checks=kernel.export_checks().")
    if backend == "auto":
        backend = default_backend()
    use_native = backend != "pure_callback" and platform in native_platforms()
    refuse_gather(
        ctx, f"jaxbridge: the {target.what} of foreign function {target.name!r}",
        num_batch_dims,
        None if (use_native and num_batch_dims) or on_mesh == "replicate"
        else "declares no batch dimensions" if not num_batch_dims
        else "runs through jax.pure_callback, which XLA cannot split",
        fix="Declare jb.foreign(..., batch_dims=k) for a function that is independent "
            "along its k leading dimensions (it then runs once per shard), call it inside "
            "jax.shard_map, or pass on_mesh='replicate' to accept the gather.")
    if backend == "native" and not use_native:
        raise BackendError(
            f"jaxbridge: foreign function {target.name!r} asked for backend='native', but the "
            f"native host call is not available on platform {platform!r} "
            f"(native extension: {extensions.missing_reason('_native') or 'loaded'}; native "
            f"platforms: {sorted(native_platforms())}). Use backend='auto' to fall back to "
            f"jax.pure_callback.")
    if backend == "auto" and not use_native and platform in ("cpu", "cuda"):
        extensions.warn_once_if_missing(
            "_hostcall", "host calls run through jax.pure_callback (about 30x slower per call)")
    if use_native:
        return _lower_native(ctx, target, args, platform, num_batch_dims, aliases)

    out_shapes = tuple(jax.ShapeDtypeStruct(a.shape, a.dtype) for a in target.out_avals)

    def via_pure_callback(*xs):
        return jax.pure_callback(target.call_pure, out_shapes, *xs, vmap_method="sequential")

    return mlir.lower_fun(via_pure_callback, multiple_results=True)(ctx, *args)


def _lower_native(ctx: Any, target: HostCallable, args: Sequence[Any], platform: str | None,
                  num_batch_dims: int, aliases: Sequence[tuple[int, int]]) -> Sequence[Any]:
    """The native call: our FFI target, or in a program that spans several CPU devices,
    XLA's buffer callback running the same trampoline (see `jaxapi.lower_buffer_callback`:
    host functions there may call JAX). A call with an empty result is marked as having a
    side effect: XLA replaces an empty result by a constant, and would drop the call
    (never running the function, never checking what it returns) when nothing else of
    it is used, a residual such as torch's random state included."""
    assert _native is not None  # lower_host_call takes this path only when it loaded
    jaxapi.mark_host_callback(ctx, target)
    any_empty = any(np.prod(a.shape) == 0 for a in ctx.avals_out)
    devices = jaxapi.program_devices(ctx)
    _native.set_concurrency(target.id, devices)  # they share the cores (threads.py)
    if platform == "cpu" and devices > 1:
        results = jaxapi.lower_buffer_callback(ctx, _native.buffer_callback(target.id), args,
                                               aliases, has_side_effect=any_empty)
        if num_batch_dims:
            jaxapi.make_batch_partitionable(results)
    else:
        lowering = jaxapi.ffi_lowering_aliased(
            BATCHED_TARGET_NAME if num_batch_dims else TARGET_NAME, aliases, any_empty)
        results = lowering(ctx, *args, callback_id=np.int64(target.id))
    if num_batch_dims:
        jaxapi.set_num_batch_dims(results, num_batch_dims)
    return results


def num_registered() -> int:
    """How many host callables are alive in the native registry (for leak checks)."""
    return 0 if _native is None else int(_native.num_registered())
