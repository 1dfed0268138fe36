"""Closure conversion: a user's JAX function -> a hashable static half + array operands.

SciPy calls the user's function (a right-hand side, a residual, an objective) many
times from inside one host call, where no JAX tracer may appear. Before the call,
on the JAX side, the function is traced once to a jaxpr (`jax.make_jaxpr`), and
*every* array it uses that is not an argument -- closed-over tracers (from `jit`,
`grad`, `vmap`), closed-over concrete arrays, array leaves of SciPy-style `args` --
is lifted out as an operand of the host call. The jaxpr, without those arrays, is
the static half (:class:`HostFun`); the operands are ordinary inputs of the foreign
function, so JAX differentiates and batches through them like through any input:
gradients with respect to closed-over values are the same as through `args`.

`HostFun` compares *structurally* (same primitives, wiring, parameters and abstract
values), not by the Python function's identity: a fresh lambda per call with the same
body reuses every compiled program and cache entry, and no user function is kept
alive (issue #13). Jaxpr parameters that are not plain values (functions, e.g. a
`custom_jvp` rule) compare by identity, so two functions never share a program
unless they compute the same thing.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .._core.jaxapi import (
    Jaxpr,
    ShapedArray,
    aval_of,
    cast_to_varying,
    eval_jaxpr,
    is_closed_jaxpr,
    is_jaxpr,
    is_tracer,
    jax_setting,
    literal_value,
    untyped_manual_axes,
    varying_axes,
)
from ..errors import UntraceableFunctionError
from ._trace_cache import cached_trace, store_trace, values_key

_SMALL_CONST = 4096  # bytes: constants inside nested jaxprs up to this size compare by value


class _Identity:
    """A key part that compares by object identity (and keeps the object alive)."""

    __slots__ = ("obj",)

    def __init__(self, obj: Any) -> None:
        self.obj = obj

    def __eq__(self, other: object) -> bool:
        return type(other) is _Identity and other.obj is self.obj

    def __hash__(self) -> int:
        return id(self.obj)


def _array_key(x: Any) -> Any:
    try:
        a = np.asarray(x)
    except Exception:  # noqa: BLE001 - a tracer: compare by identity
        return _Identity(x)
    if a.nbytes <= _SMALL_CONST and a.dtype != object:
        return ("array", a.dtype.str, a.shape, a.tobytes())
    return _Identity(x)


def _value_key(v: Any) -> Any:
    """A hashable key for a jaxpr parameter value: by value where that is safe."""
    if is_closed_jaxpr(v):
        return ("closed_jaxpr", jaxpr_key(v.jaxpr), tuple(_array_key(c) for c in v.consts))
    if is_jaxpr(v):
        return ("jaxpr", jaxpr_key(v))
    if isinstance(v, (tuple, list)):
        return (type(v).__name__, tuple(_value_key(x) for x in v))
    if isinstance(v, dict):
        return ("dict", tuple(sorted((k, _value_key(x)) for k, x in v.items())))
    if isinstance(v, (np.ndarray, jax.Array)):
        return _array_key(v)
    try:
        hash(v)
    except TypeError:
        return _Identity(v)
    return (type(v), v)


def jaxpr_key(jaxpr: Jaxpr) -> tuple:
    """The structure of `jaxpr` as a hashable tuple (variables numbered by first use)."""
    ids: dict[Any, int] = {}

    def var(v: Any) -> Any:
        is_literal, value = literal_value(v)
        if is_literal:
            return ("literal", v.aval, _array_key(value))
        n = ids.get(v)
        if n is None:
            n = ids[v] = len(ids)
        return n

    head = (tuple((var(v), v.aval) for v in jaxpr.constvars),
            tuple((var(v), v.aval) for v in jaxpr.invars))
    eqns = tuple(
        (e.primitive, tuple(var(v) for v in e.invars),
         tuple((var(v), v.aval) for v in e.outvars),
         tuple(sorted((k, _value_key(p)) for k, p in e.params.items())))
        for e in jaxpr.eqns)
    return head, eqns, tuple(var(v) for v in jaxpr.outvars)


class HostFun:
    """The static half of a traced user function; call it as `hf(ops, *xs)`.

    `ops` are the operands lifted out at conversion (SciPy `args` leaves first, then
    closed-over arrays), `xs` the function's own arguments (e.g. `t, y`). `diff` marks
    the floating-point operands (differentiable); the others (integer index arrays,
    ...) are carried as fixed inputs.

    Inside `jax.shard_map` (operands that vary over mesh axes), two traces are kept:
    `jaxpr`, without the mesh's types, for the host (where no mesh axis is bound), and
    `typed`, every input varying over `axes`, for calls inside the caller's program
    (the compiled solver loops), where JAX checks those types.
    """

    __slots__ = ("name", "jaxpr", "out_tree", "n_args_ops", "diff", "typed", "axes",
                 "_key", "_hash", "__weakref__")

    def __init__(self, name: str, jaxpr: Jaxpr, out_tree: Any, n_args_ops: int,
                 typed: Jaxpr | None = None, axes: frozenset = frozenset()) -> None:
        self.name = name
        self.jaxpr = jaxpr
        self.out_tree = out_tree
        self.n_args_ops = n_args_ops
        self.typed, self.axes = typed, axes
        avals = [v.aval for v in jaxpr.invars[:n_args_ops]] + \
            [v.aval for v in jaxpr.constvars]
        self.diff = tuple(bool(jnp.issubdtype(array_aval(a).dtype, jnp.inexact))
                          for a in avals)
        self._key = (out_tree, n_args_ops, jaxpr_key(jaxpr), axes)
        self._hash = hash(self._key)

    def __eq__(self, other: object) -> bool:
        return self is other or (type(other) is HostFun and self._hash == other._hash
                                 and self._key == other._key)

    def __hash__(self) -> int:
        return self._hash

    def __repr__(self) -> str:
        return f"<HostFun {self.name} ({len(self.jaxpr.eqns)} equations)>"

    def __call__(self, ops: Sequence[Any], *xs: Any) -> Any:
        n = self.n_args_ops
        consts = list(ops[n:])
        flat = list(ops[:n]) + jax.tree_util.tree_leaves(xs)
        jaxpr = self.jaxpr
        if self.typed is not None and _on_the_mesh(consts + flat):
            jaxpr = self.typed
            consts = [cast_to_varying(x, self.axes) for x in consts]
            flat = [cast_to_varying(x, self.axes) for x in flat]
        outs = eval_jaxpr(jaxpr, consts, flat)
        return jax.tree_util.tree_unflatten(self.out_tree, outs)

    def out_size(self) -> int:
        """How many values the function returns (the elements of all its outputs)."""
        return sum(int(np.prod(array_aval(v.aval).shape, dtype=int))
                   for v in self.jaxpr.outvars)

    def split(self, ops: Sequence[Any]) -> tuple[tuple, tuple]:
        """(differentiable operands, fixed operands)."""
        return (tuple(o for o, d in zip(ops, self.diff) if d),
                tuple(o for o, d in zip(ops, self.diff) if not d))

    def merge(self, diff: Sequence[Any], fixed: Sequence[Any]) -> list:
        """The inverse of :meth:`split`."""
        diff_it, fixed_it = iter(diff), iter(fixed)
        return [next(diff_it) if d else next(fixed_it) for d in self.diff]


def _on_the_mesh(values: Sequence[Any]) -> bool:
    """Whether a call is inside `shard_map` (some value varies over a mesh axis)."""
    return any(varying_axes(aval_of(v)) for v in values)


def array_aval(aval: object) -> ShapedArray:
    """`aval` as the array aval every operand of a traced function has."""
    if not isinstance(aval, ShapedArray):
        raise TypeError(f"jaxbridge.scipy: expected an array operand, got {aval}")
    return aval


def _is_dynamic(leaf: Any) -> bool:
    """SciPy `args` leaves that become traced operands: arrays and Python floats.

    Python ints and bools (sizes, counts, flags) and any other object stay static,
    as they are in SciPy: the function sees them unchanged.
    """
    if isinstance(leaf, (bool, int)) and not isinstance(leaf, np.generic):
        return False
    return isinstance(leaf, (float, complex, np.ndarray, np.generic, jax.Array))


# ---- functions that are not JAX (NumPy, `math`, Python control flow on values) ----
# What JAX raises when a function written for NumPy is traced: an array conversion
# (`np.sin(y)`, `np.asarray(y)`), a concrete value asked of a tracer (`float(y)`,
# `math.exp(y[0])`, `int(y)`, `if y[0] > 0:`, `y.tolist()`), a boolean mask
# (`y[y > 0]`). Subclasses included (TracerBoolConversionError,
# TracerIntegerConversionError are ConcretizationTypeErrors).
_TRACER_ERRORS: tuple[type[BaseException], ...] = (
    jax.errors.TracerArrayConversionError,
    jax.errors.ConcretizationTypeError,
    jax.errors.NonConcreteBooleanIndexError,
)
# In-place assignment (`dy = y.copy(); dy[0] = ...`): a plain TypeError, raised by JAX's
# own array code (never by the user's) with this message.
_IMMUTABLE = "JAX arrays are immutable"


def is_not_traceable(exc: BaseException) -> bool:
    """Whether `exc`, raised while JAX traced a user's function, says that the function
    is not JAX (see `_TRACER_ERRORS`). Any other exception -- the user's own ValueError,
    a TypeError of the user's code -- is the function's own and is never matched.

    >>> is_not_traceable(ValueError("mine")), is_not_traceable(TypeError("mine"))
    (False, False)
    """
    if isinstance(exc, _TRACER_ERRORS):
        return True
    return (type(exc) is TypeError and str(exc).startswith(_IMMUTABLE)
            and _raised_by_jax(exc))


def leaked_tracer(exc: BaseException) -> bool:
    """Whether `exc`, raised by a user's function called with NumPy values, comes from a
    traced value it closes over (inside `jit`/`grad`), not from the function itself."""
    return is_not_traceable(exc) or isinstance(exc, jax.errors.UnexpectedTracerError)


def _raised_by_jax(exc: BaseException) -> bool:
    tb = exc.__traceback__
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    return str(tb.tb_frame.f_globals.get("__name__", "")).startswith("jax.")


_drop_in_call: contextvars.ContextVar[object | None] = contextvars.ContextVar(
    "jaxbridge_scipy_drop_in_call", default=None)


def start_drop_in_call(token: object) -> contextvars.Token:
    """Marks the `UntraceableFunctionError`s `convert` raises from now on with `token`
    (until `end_drop_in_call`), so that a drop-in handles its own user's function only,
    not one of a drop-in called inside that function. (Two plain calls, not a context
    manager: this runs on every drop-in call.)"""
    return _drop_in_call.set(token)


def end_drop_in_call(started: contextvars.Token) -> None:
    _drop_in_call.reset(started)


def raised_for(err: UntraceableFunctionError, token: object) -> bool:
    """Whether `convert` raised `err` inside `drop_in_call(token)`."""
    return getattr(err, "_drop_in_call", None) is token


def raise_if_not_traceable(exc: Exception, name: str, what: str, call: str) -> None:
    """Raise the `UntraceableFunctionError` of this drop-in call if `exc`, raised while
    JAX traced the user's function `what`, says that the function is not JAX (or is a
    drop-in's own such error: a drop-in called inside it on a NumPy function)."""
    if is_not_traceable(exc) or isinstance(exc, UntraceableFunctionError):
        err = not_traceable(name, what, call, exc)
        err._drop_in_call = _drop_in_call.get()  # type: ignore[attr-defined]
        raise err from exc


def not_traceable(name: str, what: str, call: str, cause: BaseException,
                  why: str = "", doing: str = "tracing it") -> UntraceableFunctionError:
    """The error for a user's function that is not JAX where the call needs JAX."""
    how = f" as {call}" if call else ""
    err = UntraceableFunctionError(
        f"jaxbridge.scipy.{name}: `{what}` is not a JAX function: {doing}{how} raised "
        f"{type(cause).__name__}. "
        f"{why or 'A function written in NumPy runs as in SciPy only where nothing traces it.'}"
        f" To differentiate through it, write `{what}` with jax.numpy, or wrap its NumPy "
        f"code with jaxbridge.foreign and give it its own vjp/jvp rules",
        function=name, argument=what)
    err.__cause__ = cause
    return err


def convert(fun: Callable[..., Any], name: str, what: str, example: Sequence[Any],
            args: tuple = (), call: str = "", vary_like: Sequence[Any] = ()
            ) -> tuple[HostFun, list]:
    """Trace `fun(*example, *args)`; return its static half and its operands.

    Args:
      fun: the user's function (any callable: function, lambda, partial, module).
      name: the public function, for messages (e.g. "integrate.solve_ivp").
      what: the argument's name (e.g. "fun", "jac").
      example: `jax.ShapeDtypeStruct`s (or arrays) of the function's own arguments.
      args: SciPy's `args` tuple, passed after them as `fun(*xs, *args)`.
      call: how SciPy calls it, e.g. "fun(t, y, *args)", for error notes.
      vary_like: arrays the function's own arguments will vary like inside
        `jax.shard_map` (e.g. `y0` for `fun(t, y)` in a compiled loop).
    """
    if not callable(fun):
        raise TypeError(f"jaxbridge.scipy.{name}: `{what}` must be callable, got "
                        f"{type(fun).__name__}")
    leaves, tree = jax.tree_util.tree_flatten(args)
    dyn_at = [i for i, leaf in enumerate(leaves) if _is_dynamic(leaf)]
    dyn = [jnp.asarray(leaves[i]) for i in dyn_at]
    key = _trace_key(name, what, example, tree, leaves, dyn_at, dyn)
    kept, state = cached_trace(fun, key) if key is not None else (None, None)
    if kept is not None:  # a repeat call: the same function, reading the same values
        hf, consts = kept
        return hf, dyn + list(consts)

    def traced(dyn_values: list, *xs: Any) -> Any:
        full = list(leaves)
        for i, v in zip(dyn_at, dyn_values):
            full[i] = v
        try:
            return fun(*xs, *jax.tree_util.tree_unflatten(tree, full))
        except Exception as exc:
            raise_if_not_traceable(exc, name, what, call)
            raise

    try:
        # (inside shard_map: no casts to the mesh axes, which the host does not have)
        with untyped_manual_axes():
            closed, shape = jax.make_jaxpr(traced, return_shape=True)(dyn, *example)
    except Exception as exc:
        if isinstance(exc, (IndexError, TypeError)) and call and \
                not isinstance(exc, UntraceableFunctionError):
            exc.add_note(
                f"(raised while jaxbridge.scipy.{name} traced `{what}` as {call}, as SciPy "
                f"calls it, with args={_describe_args(args)})")
        raise
    _check_real_results(shape, name, what, call)
    consts = [c if isinstance(c, jax.Array) else jnp.asarray(c) for c in closed.consts]
    axes = frozenset().union(*(varying_axes(aval_of(v)) for v in
                               [*dyn, *consts, *vary_like]))
    typed = None
    if axes:  # inside shard_map: the trace for calls in the caller's program
        typed_example = [_varying_like(e, axes) for e in example]
        typed_dyn = [cast_to_varying(d, axes) for d in dyn]
        closed_typed = jax.make_jaxpr(traced)(typed_dyn, *typed_example)
        if [id(c) for c in closed_typed.consts] != [id(c) for c in closed.consts]:
            raise NotImplementedError(
                f"jaxbridge.scipy.{name}: `{what}` closes over different values when "
                f"traced again inside jax.shard_map; pass them through `args`")
        typed = closed_typed.jaxpr
    hf = HostFun(f"{name}:{what}", closed.jaxpr, jax.tree_util.tree_structure(shape),
                 len(dyn), typed, axes)
    if state is not None and not axes and not any(is_tracer(c) for c in consts):
        store_trace(fun, key, state, (hf, tuple(consts)))
    return hf, dyn + consts


def _trace_key(name: str, what: str, example: Sequence[Any], tree: Any, leaves: list,
               dyn_at: list, dyn: list) -> Hashable | None:
    """What a trace of a user function depends on besides the function: the abstract
    values of its arguments, SciPy `args`' structure and static leaves, and the JAX
    settings that change a trace. None: a static leaf whose changes nothing can see."""
    static = [leaf for i, leaf in enumerate(leaves) if i not in set(dyn_at)]
    static_key = values_key(static)
    if static_key is None:
        return None
    # (dtypes as themselves: their str() costs a repeat call ~4 us apiece)
    avals = tuple((tuple(x.shape), np.dtype(x.dtype), bool(getattr(x, "weak_type", False)))
                  for x in (*example, *dyn))
    settings = tuple(jax_setting(s) for s in _TRACE_SETTINGS)
    return (name, what, tree, static_key, avals, settings)


# JAX settings a trace depends on: dtypes (x64), what raises (rank and dtype promotion),
# dot products' precision.
_TRACE_SETTINGS = ("jax_enable_x64", "jax_numpy_rank_promotion", "jax_numpy_dtype_promotion",
                   "jax_default_matmul_precision")


def _check_real_results(shape: Any, name: str, what: str, call: str) -> None:
    """The solvers are real: a complex result would lose its imaginary part."""
    dtypes = {str(s.dtype) for s in jax.tree_util.tree_leaves(shape)
              if jnp.issubdtype(s.dtype, jnp.complexfloating)}
    if dtypes:
        raise ValueError(
            f"jaxbridge.scipy.{name}: `{what}` must return real values"
            f"{' (as ' + call + ')' if call else ''}; it returned {', '.join(sorted(dtypes))}."
            f" Complex problems are not supported: write them as real ones over the real "
            f"and imaginary parts")


def _varying_like(example: Any, axes: frozenset) -> Any:
    """The abstract value of `example` (shape, dtype) varying over the mesh `axes`."""
    zero = cast_to_varying(jnp.zeros((), example.dtype), axes)
    return aval_of(zero).update(shape=tuple(example.shape), weak_type=False)


def _describe_args(args: tuple) -> str:
    if not args:
        return "()"
    return "(" + ", ".join(type(a).__name__ for a in args) + ("," if len(args) == 1 else "") \
        + ")"


ARGS_CONVENTIONS = ("wrap", "unpack", "unpack_checked")


def check_args(args: Any, name: str, call: str, convention: str) -> tuple:
    """SciPy's `args`, as the SciPy function `name` itself treats it (SciPy 1.17).

    convention:
      "wrap" (root, minimize, quad): a non-tuple `args` (a list, an array, None) is
        one argument, `args = (args,)`.
      "unpack" (least_squares): `fun(x, *args)`: any iterable is unpacked; anything
        else raises Python's TypeError, as the first call of `fun` does in SciPy.
      "unpack_checked" (solve_ivp): None means no arguments; an iterable is unpacked;
        anything else raises SciPy's TypeError ("Supplied 'args' cannot be unpacked").
    """
    if convention == "wrap":
        return args if isinstance(args, tuple) else (args,)
    if convention == "unpack_checked" and args is None:
        return ()
    try:
        return tuple(args)
    except TypeError as exc:
        if convention == "unpack_checked":
            raise TypeError(
                f"jaxbridge.scipy.{name}: Supplied 'args' cannot be unpacked. Please supply "
                f"`args` as a tuple (e.g. `args=({args},)`); the function is called as "
                f"{call}") from exc
        raise TypeError(
            f"jaxbridge.scipy.{name}: {call}: argument after * must be an iterable, not "
            f"{type(args).__name__} (SciPy unpacks `args`; pass a tuple, e.g. "
            f"args=(p,))") from exc
