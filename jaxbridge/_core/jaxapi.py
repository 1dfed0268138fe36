"""The only module that knows JAX's versions and extension points.

jaxbridge defines its own primitives (with JVP, transpose, batching and lowering
rules) through the public extension points `jax.extend.core.Primitive` and
`jax.interpreters.{ad,batching,mlir}`; the few names that moved between JAX releases
(and the lowering context's hooks) are resolved here, once. Supported: JAX 0.10 and
newer (tested on 0.10 and 0.12).
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import jaxlib
from jax.core import ShapedArray, Tracer
from jax.extend.core import ClosedJaxpr, Jaxpr, Literal, Primitive, jaxpr_as_fun
from jax.interpreters import ad, batching, mlir

__all__ = [
    "is_eager",
    "Primitive",
    "ShapedArray",
    "Jaxpr",
    "is_tracer",
    "is_linearize_tracer",
    "jaxlib_version",
    "is_jaxpr",
    "is_closed_jaxpr",
    "literal_value",
    "inner_jaxprs",
    "eval_jaxpr",
    "ad",
    "batching",
    "mlir",
    "aval_of",
    "zero_tangent",
    "is_zero",
    "mark_host_callback",
    "is_exporting",
    "hold_weakly_in_jax_caches",
    "ffi_lowering_aliased",
    "auto_partitioned_devices",
    "unsplittable_batch_dims",
    "set_num_batch_dims",
    "varying_axes",
    "cast_to_varying",
    "result_avals",
    "raise_carried_exceptions",
    "let_barriers_forget",
    "program_devices",
    "lower_buffer_callback",
    "make_batch_partitionable",
    "deferred_release",
    "trace_flag",
    "untyped_manual_axes",
]


def is_tracer(x: Any) -> bool:
    """True for a traced value (inside jit, grad, vmap or a loop), not a concrete array."""
    return isinstance(x, Tracer)


# Whether JAX evaluates operations at once (no jit, grad, vmap or loop being traced,
# not even one whose operands are all constants). Without JAX's tracing context (another
# JAX version) nothing is eager here, and callers take their general path.
try:
    from jax._src.core import trace_ctx as _TRACE_CTX
except ImportError:  # pragma: no cover - a JAX without it
    _TRACE_CTX = None  # type: ignore[assignment]


def is_eager() -> bool:
    """True where JAX runs operations as they come (outside jit, grad, vmap and loops,
    or inside `jax.ensure_compile_time_eval`), so a host computation's result can be
    handed back as it is."""
    try:
        return _TRACE_CTX is not None and bool(_TRACE_CTX.is_top_level())
    except AttributeError:  # pragma: no cover - a JAX whose context lacks it
        return False


# Reverse mode (grad, vjp, linearize) traces with LinearizeTracer, forward mode (jvp)
# with JVPTracer (JAX 0.10-0.12). Without the class nothing is reverse mode here, and
# callers take their general path.
try:
    from jax._src.interpreters.ad import LinearizeTracer as _LINEARIZE_TRACER
except ImportError:  # pragma: no cover - a JAX without it
    _LINEARIZE_TRACER = None  # type: ignore[assignment,misc]


def is_linearize_tracer(x: Any) -> bool:
    """True for a value JAX is linearizing: the input of a function being differentiated
    in reverse mode (`grad`, `vjp`, `jacrev`, `linearize`), not forward mode (`jvp`)."""
    return _LINEARIZE_TRACER is not None and isinstance(x, _LINEARIZE_TRACER)
def jax_setting(name: str) -> Any:
    """The value of JAX's setting `name` now (a `with jax.default_device(...)` or other
    setting context on this thread included; `jax.config.read` refuses those)."""
    return getattr(jax.config, name)


def jaxlib_version() -> str:
    """The installed jaxlib's version (jax's own is `jax.__version__`)."""
    return str(jaxlib.__version__)


# ---- reading jaxprs: program structure for hashing (scipy/_trace.py) and diagnosis
def is_jaxpr(v: Any) -> bool:
    """True for an open `Jaxpr` (a program without its constants)."""
    return isinstance(v, Jaxpr)


def is_closed_jaxpr(v: Any) -> bool:
    """True for a `ClosedJaxpr` (`.jaxpr` and `.consts`)."""
    return isinstance(v, ClosedJaxpr)


def literal_value(v: Any) -> tuple[bool, Any]:
    """(True, its value) for a jaxpr variable that is a literal, (False, None) otherwise."""
    return (True, v.val) if isinstance(v, Literal) else (False, None)


def inner_jaxprs(eqn: Any) -> Iterator[Any]:
    """The jaxprs nested in an equation's parameters (a loop's body, a call's program):
    open jaxprs as they are, closed ones by their `.jaxpr`."""
    for value in eqn.params.values():
        for sub in value if isinstance(value, (tuple, list)) else (value,):
            inner = sub.jaxpr if isinstance(sub, ClosedJaxpr) else sub
            if isinstance(inner, Jaxpr):
                yield inner


def eval_jaxpr(jaxpr: Any, consts: Sequence[Any], args: Sequence[Any]) -> list[Any]:
    """Run the open `jaxpr` on its constants `consts` and inputs `args` (traceable)."""
    return list(jaxpr_as_fun(ClosedJaxpr(jaxpr, list(consts)))(*args))


def aval_of(x: Any) -> Any:
    """The abstract value (shape, dtype, weak type) of an array or tracer."""
    return jax.typeof(x)


def zero_tangent(primal_aval: Any) -> Any:
    """A symbolic-zero tangent for a value of `primal_aval` (float0 for ints)."""
    return ad.Zero(primal_aval.to_tangent_aval())


def is_zero(t: Any) -> bool:
    """True for a symbolic zero tangent/cotangent (`ad.Zero`)."""
    return type(t) is ad.Zero


def mark_host_callback(ctx: Any, callback: Any) -> None:
    """Register `callback` as a host callback of the module being lowered.

    PjRt then runs the compiled program synchronously on the calling thread, as it does
    for `jax.pure_callback` (a host call that dispatches JAX work cannot deadlock on a
    queue of unsynchronized steps), and the executable owns `callback`. This is the
    extension point `jax.experimental.buffer_callback` uses too.
    """
    add = getattr(ctx.module_context, "add_host_callback", None)
    if add is None:  # pragma: no cover - a JAX without it: keep the callable alive at least
        ctx.module_context.add_keepalive(callback)
        return
    add(callback)
    ctx.module_context.add_keepalive(callback)


_carried_hook: Callable[[tuple], BaseException | None] | None = None
_carried_lock = threading.Lock()


def raise_carried_exceptions(carried: Callable[[tuple], BaseException | None]) -> bool:
    """Make JAX's runtime error, raised where a compiled program failed, be the
    exception `carried(args)` finds in its constructor arguments (None: stay itself).

    A host call where no Python caller waits on the thread fails through XLA: the
    launching thread is blocked in XLA (no Python frame of ours is there to re-raise
    anything), and jaxlib raises `jax.errors.JaxRuntimeError(message, ...)` there. Python
    builds an exception by calling its class, and a class whose `__new__` returns an
    exception of another type raises that one (type_call skips `__init__`;
    `PyErr_SetObject` normalizes to it): so the user's own exception object is raised, on
    the launching thread, at the call site. Checked on JAX 0.10 (Python 3.11) and 0.12
    (3.12), on the C++ fast path and the first call's Python path. Installed once, under a
    lock (later calls just return True); False where the class is missing or immutable,
    and the runtime error stays as it is.
    """
    global _carried_hook
    with _carried_lock:
        if _carried_hook is not None:
            return True
        cls = getattr(jax.errors, "JaxRuntimeError", None)
        if not isinstance(cls, type):  # pragma: no cover - depends on the JAX release
            return False
        base_new = cls.__new__

        def __new__(kind: type, *args: Any, **kwargs: Any) -> Any:
            if kind is cls:
                found = carried(args)
                if found is not None:
                    return found
            return base_new(kind, *args, **kwargs)

        try:
            cls.__new__ = staticmethod(__new__)  # type: ignore[method-assign,assignment]
        except (TypeError, AttributeError):  # pragma: no cover - an immutable type
            return False
        _carried_hook = carried
        return True


_barrier_patched = False


def let_barriers_forget(redelivered: Callable[[BaseException], bool]) -> bool:
    """Make `jax.effects_barrier()` (and JAX's exit hooks) forget a failed run once its
    error was raised: where `redelivered(err)`, the barrier returns instead of raising it.

    JAX keeps the runtime token of the last program run on each device and waits on
    those tokens at every barrier; a token of a failed run raises its error, and
    `RuntimeTokenSet.block_until_ready` raises before it clears the tokens, so every
    later barrier -- and both of JAX's exit hooks -- raise the same failure again, though
    the caller caught and handled it. False (nothing changed) where the private set is
    not there.
    """
    global _barrier_patched
    with _carried_lock:
        if _barrier_patched:
            return True
        try:
            from jax._src import dispatch
            tokens_cls = type(dispatch.runtime_tokens)
            wait = tokens_cls.block_until_ready
        except (ImportError, AttributeError):  # pragma: no cover - depends on the release
            return False

        def block_until_ready(self: Any) -> None:
            try:
                wait(self)
            except BaseException as err:
                self.clear()  # what JAX does after waiting, skipped when a wait raises
                if not redelivered(err):
                    raise

        tokens_cls.block_until_ready = block_until_ready  # type: ignore[method-assign]
        _barrier_patched = True
        return True


def is_exporting(ctx: Any) -> bool:
    """True while `jax.export` lowers a function (the module outlives this process)."""
    params = getattr(ctx.module_context, "lowering_parameters", None)
    return bool(getattr(params, "for_export", False))


def hold_weakly_in_jax_caches(cls: type) -> None:
    """Let JAX's tracing caches hold instances of `cls` (primitive parameters) weakly.

    JAX caches abstract evaluation on (primitive, avals, params), keeping params that
    are not registered weak-key types alive for the cache's 2048 entries -- for our
    signatures, the user's function, its closure and its registered host callable,
    long after the function was dropped. JAX registers its own jaxpr parameters this
    way; where the registry does not exist (a JAX that changed it), the cache is
    merely bounded.
    """
    try:
        from jax._src import util as _jax_util
        _jax_util.weakref_cache_key_types.add(cls)
    except (ImportError, AttributeError):  # pragma: no cover - depends on the JAX release
        pass


def ffi_lowering_aliased(target: str, aliases: Sequence[tuple[int, int]],
                         has_side_effect: bool = False) -> Any:
    """`jax.ffi.ffi_lowering` with results written into operand buffers.

    `ffi_lowering` forwards extra keywords to the custom-call builder, whose keyword
    for aliasing is `operand_output_aliases` (what `jax.ffi.ffi_call` passes for its
    `input_output_aliases`). `has_side_effect` keeps XLA from replacing a call whose
    results are all empty by constants (it would never run).
    """
    extra: dict[str, Any] = {"has_side_effect": True} if has_side_effect else {}
    if aliases:
        extra["operand_output_aliases"] = dict(aliases)
    return jax.ffi.ffi_lowering(target, **extra)


def program_devices(ctx: Any) -> int:
    """How many devices the program being lowered runs on: each runs its own part of it
    (under `jit` with shardings, `shard_map` or `pmap`), 1 for a single-device program."""
    axis_context = ctx.module_context.axis_context
    if isinstance(axis_context, mlir.SPMDAxisContext):
        return int(axis_context.mesh.size)
    if isinstance(axis_context, mlir.ShardingContext):
        return int(axis_context.num_devices)
    replicas = getattr(axis_context, "axis_env", None)
    if replicas is not None:  # pmap: ReplicaAxisContext
        return max(1, int(getattr(replicas, "nreps", 1)))
    return 1


def lower_buffer_callback(ctx: Any, callback: Callable[..., Any], args: Sequence[Any],
                          aliases: Sequence[tuple[int, int]] = (),
                          has_side_effect: bool = False) -> Sequence[Any]:
    """Emit `jax.experimental.buffer_callback` calling `callback(exec_ctx, outputs,
    *inputs)` on XLA's buffers (objects with `__array__`), for results `ctx.avals_out`.

    XLA's handler for it marks its thread as running a host callback, so that JAX work
    the callback starts runs inline on that thread (JAX's own callbacks rely on the same):
    in a program that spans several devices, each device runs its part on one thread,
    and a computation queued behind the part that waits for it would never start.
    """
    from jax.experimental.buffer_callback import buffer_callback

    structs = tuple(jax.ShapeDtypeStruct(a.shape, a.dtype) for a in ctx.avals_out)
    call = buffer_callback(callback, structs, has_side_effect=has_side_effect,
                           input_output_aliases=dict(aliases) or None)
    return mlir.lower_fun(lambda *xs: call(*xs), multiple_results=True)(ctx, *args)


_batch_partitionable: set[str] = set()


def make_batch_partitionable(results: Sequence[Any]) -> None:
    """Register the custom call that produced `results` with XLA's batch partitioner
    (by its target name, once), so that a `num_batch_dims` attribute splits it."""
    op = custom_call_of(results)
    name = mlir.ir.StringAttr(op.attributes["call_target_name"]).value
    if name not in _batch_partitionable:
        jax.ffi.register_ffi_target_as_batch_partitionable(name)
        _batch_partitionable.add(name)


def custom_call_of(results: Any) -> Any:
    """The custom-call operation whose results `results` are (through any tuple-element
    extraction the lowering added)."""
    value = results[0] if isinstance(results, (list, tuple)) else results
    op = value.owner
    while op.name == "stablehlo.get_tuple_element":
        op = op.operands[0].owner
    return op


def deferred_release() -> Callable[[], Any] | None:
    """The function that drops the Python references JAX defers until it next holds the
    GIL (a NumPy array a computation was reading, say), or None where there is none."""
    try:
        from jax._src.lib import _jax
    except ImportError:  # pragma: no cover - depends on the JAX release
        return None
    release = getattr(_jax, "collect_garbage", None)
    return release if callable(release) else None


def auto_partitioned_devices(ctx: Any) -> int:
    """How many devices XLA's partitioner splits the op being lowered over (1 when the
    computation runs on one device, or inside a fully manual `shard_map` region)."""
    axis_context = ctx.module_context.axis_context
    if isinstance(axis_context, mlir.SPMDAxisContext):
        manual = set(axis_context.manual_axes or ())
        sizes = dict(axis_context.mesh.shape)
        n = 1
        for name, size in sizes.items():
            if name not in manual:
                n *= size
        return n
    if isinstance(axis_context, mlir.ShardingContext):
        return int(axis_context.num_devices)
    return 1


def unsplittable_batch_dims(ctx: Any, num_batch_dims: int) -> list[int]:
    """Ranks of the operands/results that XLA cannot split along `num_batch_dims` leading
    dimensions: its batch partitioner splits only when each has one more dimension."""
    avals = [*ctx.avals_in, *ctx.avals_out]
    return [len(a.shape) for a in avals if len(a.shape) <= num_batch_dims]


def set_num_batch_dims(results: Any, num_batch_dims: int) -> None:
    """Mark an FFI custom call as splittable along `num_batch_dims` leading dims.

    This is the frontend attribute read by XLA for targets registered with
    `jax.ffi.register_ffi_target_as_batch_partitionable`.
    """
    op = custom_call_of(results)
    op.attributes["mhlo.frontend_attributes"] = mlir.ir.DictAttr.get(
        {"num_batch_dims": mlir.ir.StringAttr.get(str(num_batch_dims))})
    if getattr(jax.config, "jax_use_shardy_partitioner", False):
        # Shardy does not read num_batch_dims: tell it that the leading dims of every
        # operand and result are one shared factor each (so results stay sharded).
        op.attributes["sdy.sharding_rule"] = _batch_sharding_rule(op, num_batch_dims)


def _batch_sharding_rule(op: Any, num_batch_dims: int) -> Any:
    """`#sdy.op_sharding_rule` sharing the leading `num_batch_dims` factors."""
    sizes: dict[str, int] = {}
    counter = iter(range(num_batch_dims, 1 << 30))

    def factor(n: int) -> str:  # Shardy's factor symbols: i ... z, then z_1, z_2, ...
        return chr(ord("i") + n) if n < 18 else f"z_{n - 17}"

    def mapping(shape: Sequence[int]) -> str:
        names = []
        for d, size in enumerate(shape):
            name = factor(d if d < num_batch_dims else next(counter))
            sizes[name] = int(size)
            names.append(name)
        return "[" + ", ".join(names) + "]"

    ins = ", ".join(mapping(mlir.ir.RankedTensorType(v.type).shape) for v in op.operands)
    outs = ", ".join(mapping(mlir.ir.RankedTensorType(r.type).shape) for r in op.results)
    factors = ", ".join(f"{k}={v}" for k, v in sizes.items())
    return mlir.ir.Attribute.parse(f"#sdy.op_sharding_rule<({ins})->({outs}) {{{factors}}}>")


# ---- shard_map: varying manual axes ("vma") ----
def varying_axes(aval: Any) -> frozenset:
    """The manual mesh axes (inside `shard_map`) along which a value varies."""
    mat = getattr(aval, "mat", None)  # JAX >= 0.9
    if mat is not None:
        return frozenset(getattr(mat, "varying", ()))
    return frozenset(getattr(aval, "vma", ()))  # JAX 0.6 - 0.8


def cast_to_varying(x: Any, axes: frozenset) -> Any:
    """Mark `x` as varying over `axes` (its transpose is a `psum`: the gradient of a
    replicated input sums the shards' contributions)."""
    missing = tuple(sorted(axes - varying_axes(aval_of(x))))
    if not missing:
        return x
    return jax.lax.pcast(x, missing, to="varying")


def result_avals(in_avals: Any, structs: Any, name: str, num_batch_dims: int = 0) -> list:
    """Abstract values for results of `structs` (shape/dtype) computed from inputs
    `in_avals`: they vary over the same manual axes as the inputs, and on a mesh with
    explicit axes they are typed sharded like the inputs' `num_batch_dims` leading
    dimensions (XLA splits the call along them; an unsharded type would make the next
    operation gather the result)."""
    vmas = {varying_axes(a) for a in in_avals}
    if len(vmas) > 1:
        raise ValueError(
            f"jaxbridge: {name}: inside jax.shard_map, the inputs vary over different mesh "
            f"axes {sorted(map(sorted, vmas))}; call the foreign function directly (jaxbridge "
            f"casts its arguments) rather than binding its primitive.")
    manual: frozenset = next(iter(vmas), frozenset())
    if manual:
        template = next(iter(in_avals))
        return [template.update(shape=tuple(s.shape), dtype=s.dtype, weak_type=False)
                for s in structs]
    batch = _explicit_batch_sharding(in_avals, num_batch_dims)
    if batch is None:
        return [ShapedArray(s.shape, s.dtype) for s in structs]
    sharding, lead = batch
    return [ShapedArray(s.shape, s.dtype, sharding=sharding.update(
        spec=jax.sharding.PartitionSpec(*lead, *[None] * (len(s.shape) - len(lead)))))
        for s in structs]


def _explicit_batch_sharding(in_avals: Any, num_batch_dims: int) -> Any:
    """(an input's sharding, the mesh axes of its leading `num_batch_dims` dimensions)
    for the first input typed sharded along them on explicit mesh axes, else None."""
    if not num_batch_dims:
        return None
    for a in in_avals:
        sharding = getattr(a, "sharding", None)
        spec = getattr(sharding, "spec", None)
        if spec is None or len(a.shape) < num_batch_dims:
            continue
        lead = tuple(spec[:num_batch_dims]) + (None,) * max(0, num_batch_dims - len(spec))
        if any(axis is not None for axis in lead):
            return sharding, lead
    return None


# ---- options that JAX's tracing caches are keyed on ----
def trace_flag(name: str, help: str) -> tuple[Callable[[bool], Any], Callable[[], bool]]:
    """A boolean option read at trace time, as (context manager factory, getter).

    It is a JAX configuration state included in JAX's trace context, so a function
    traced with the option on and off gets a trace for each: a `jax.jit` function
    compiled before the option was turned on is traced again inside the block, and the
    program traced inside it is not reused after. Like JAX's own options it can also
    be set with ``jax.config.update(name, True)`` or the environment variable
    ``NAME`` (upper case) before import. Where JAX has no such states, a context
    variable (one trace shared by both values: a function jitted before keeps its
    program).
    """
    try:
        from jax._src import config as _config
        state = _config.bool_state(name, False, help, include_in_trace_context=True)
        return state, lambda: bool(state.value)
    except (ImportError, AttributeError, TypeError):  # pragma: no cover - JAX-dependent
        var: contextvars.ContextVar[bool] = contextvars.ContextVar(name, default=False)

        @contextlib.contextmanager
        def set_to(value: bool) -> Iterator[None]:
            token = var.set(bool(value))
            try:
                yield
            finally:
                var.reset(token)

        return set_to, var.get


@contextlib.contextmanager
def untyped_manual_axes() -> Iterator[None]:
    """Trace without `shard_map`'s varying-manual-axes types ("vma").

    Inside a `shard_map` body, a value closed over from the body varies over the mesh
    axes, and tracing mixes it with replicated values through `pvary` casts, which
    need the axis bound. A function traced there to run later outside the mesh (a
    host call's JAX code: "Found an unbound axis name") must not carry them; JAX's
    own `shard_map(check_vma=False)` traces its body this way.
    """
    try:
        from jax._src import config as jax_config
        state = jax_config._check_vma
    except (ImportError, AttributeError):  # pragma: no cover - depends on the JAX release
        yield
        return
    with state(False):
        yield
