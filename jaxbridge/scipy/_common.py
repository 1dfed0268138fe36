"""Shared plumbing of `jaxbridge.scipy`: host-side JAX, failure policy, results.

The solvers here call user functions written in JAX *from inside* a host call (SciPy
asks for `fun(t, y)` many times per solve). Each user function is first converted
(`_trace.convert`: a structural, hashable jaxpr plus array operands); the host-side
programs built from it (the function, its Jacobian, vector-Jacobian products, ...)
are compiled once per (converted function, role) with `jax.jit` and kept in a
bounded LRU cache (`HOST_CACHE_SIZE`), so neither memory nor user functions pile up
(issue #13). They run on the CPU device, whatever the default device is, so a GPU
program does not pay a device round trip per right-hand-side evaluation.
"""

from __future__ import annotations

import collections
import functools
import threading
from collections.abc import Callable, Hashable, Iterator, Mapping
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from .._core.jaxapi import is_eager, is_tracer, jax_setting
from ..errors import SolverError  # re-exported: jaxbridge.scipy.SolverError

__all__ = ["SolverError", "host_jit", "host_cache_info", "HOST_CACHE_SIZE", "program",
           "repeat_program",
           "program_cache_info", "PROGRAM_CACHE_SIZE", "Result"]

ON_FAILURE = ("raise", "nan")


def check_policy(on_failure: str, name: str) -> None:
    if on_failure not in ON_FAILURE:
        raise ValueError(f"jaxbridge.scipy.{name}: on_failure must be one of {ON_FAILURE}, "
                         f"got {on_failure!r}")


def failure(name: str, message: str) -> SolverError:
    return SolverError(f"jaxbridge.scipy.{name}: SciPy reported failure: {message}")


def unsupported(name: str, arg: str, why: str) -> NotImplementedError:
    return NotImplementedError(f"jaxbridge.scipy.{name}: `{arg}` is not supported: {why}")


# ------------------------------------------------------------------ host-side JAX
HOST_CACHE_SIZE = 256


class LruCache:
    """A thread-safe LRU map whose bound is read at each insertion (`maxsize()`), with
    hit/miss counts: the host-compiled functions here, the sparse factors in
    `sparse.linalg`."""

    def __init__(self, maxsize: Callable[[], int]) -> None:
        self._maxsize = maxsize
        self._lock = threading.Lock()
        self._items: collections.OrderedDict[Hashable, Any] = collections.OrderedDict()
        self._stats = {"hits": 0, "misses": 0}

    def get(self, key: Hashable) -> Any:
        """The value for `key` (now most recent), or None (counted as a miss). A bound
        lowered since the last insertion applies here too (a repeat call may insert
        nothing)."""
        with self._lock:
            self._trim()
            value = self._items.get(key)
            if value is None:
                self._stats["misses"] += 1
                return None
            self._items.move_to_end(key)
            self._stats["hits"] += 1
            return value

    def put(self, key: Hashable, value: Any, replace: bool = False) -> Any:
        """Store `value` unless another thread stored one first (or, with `replace`,
        in any case); return the stored one."""
        with self._lock:
            if replace:
                self._items[key] = value
                self._items.move_to_end(key)
            else:
                value = self._items.setdefault(key, value)
            self._trim()
            return value

    def _trim(self) -> None:
        while len(self._items) > max(self._maxsize(), 0):
            self._items.popitem(last=False)

    def pop(self, key: Hashable) -> None:
        """Forget `key` (nothing if it is not stored)."""
        with self._lock:
            self._items.pop(key, None)

    def info(self) -> dict:
        with self._lock:
            return {**self._stats, "size": len(self._items), "maxsize": self._maxsize()}


_compiled = LruCache(lambda: max(HOST_CACHE_SIZE, 1))


def host_jit(key: Hashable, make: Callable[[], Callable[..., Any]]) -> Callable[..., Any]:
    """`jax.jit(make())`, built once per `key` and kept in a bounded LRU cache.

    Keys hold converted functions (`_trace.HostFun`, compared structurally), never
    the user's Python function, so a dropped function is collectable.
    """
    fn = _compiled.get(key)
    return fn if fn is not None else _compiled.put(key, jax.jit(make()))


def host_cache_info() -> dict:
    """Hits, misses, current size and bound of the host-side compiled-function cache."""
    return _compiled.info()


# ------------------------------------------------------------------ whole-call programs
PROGRAM_CACHE_SIZE = 64
_programs = LruCache(lambda: max(PROGRAM_CACHE_SIZE, 1))
_seen = LruCache(lambda: 4 * max(PROGRAM_CACHE_SIZE, 1))  # keys met once


def program(key: Hashable, make: Callable[[], Callable[..., Any]]) -> Callable[..., Any]:
    """`jax.jit(make())` once per `key`, kept in a bounded LRU cache (`PROGRAM_CACHE_SIZE`).

    The front ends run everything after their argument checks as one such program,
    keyed on their static configuration (converted functions compare structurally):
    a repeat eager call is then one dispatch of a compiled program, not one dispatch
    per operation, and under `jit`, `grad` or `vmap` the program is inlined as any
    jitted function is. A key met for the first time runs `make()` as it is (eagerly,
    op by op, where the caller is eager), and is compiled when it comes again: a loop
    whose every call has a new key (a closed-over Python float is part of a trace)
    compiles nothing, as before. `make()` must build the program from the key's parts only --
    never from the user's Python functions, whose closed-over values a compiled
    program would keep (the converted functions take them as operands). Dropping the
    least recently used program frees JAX's caches of it, so a loop over problems of
    ever new structure does not grow memory without bound.

    >>> double = program(("doc", 2), lambda: lambda x: 2 * x)  # first: as written
    >>> double = program(("doc", 2), lambda: lambda x: 2 * x)  # again: compiled
    >>> int(double(jnp.int32(3)))
    6
    """
    fn = _programs.get(key)
    if fn is not None:
        return fn
    if _seen.get(key) is None:  # first sight: run as written, compile if it comes again
        _seen.put(key, True)
        return make()
    return _programs.put(key, jax.jit(make()))


def repeat_program(key: Hashable, make: Callable[[], Callable[..., Any]]
                   ) -> Callable[..., Any] | None:
    """:func:`program`'s compiled program for a `key` met before (compiled at its second
    sight), None at its first sight: for a path only a repeat call should take, whose
    values follow how XLA compiles it (a step loop whose step-size control amplifies
    rounding: run op by op, a first call would give other values than the next), and
    which a loop whose every call has a new key should not compile each time (a
    program too costly to run op by op: the caller then takes a path that compiles
    nothing).

    >>> repeat_program(("doc repeat", 1), lambda: lambda x: x) is None  # first sight
    True
    >>> int(repeat_program(("doc repeat", 1), lambda: lambda x: x + 1)(jnp.int32(1)))
    2
    """
    fn = _programs.get(key)
    if fn is not None:
        return fn
    if _seen.get(key) is None:
        _seen.put(key, True)
        return None
    return _programs.put(key, jax.jit(make()))


class FallbackBackoff:
    """Which repeat calls try a fast path that can give up after running (its compiled
    program then says it is not sure of SciPy's result, and SciPy's loop runs): a key
    that gave up `n` times in a row skips the next `2 ** (n - 1) - 1` tries (at most
    `MAX_SKIPPED`), so a configuration that always gives up (a solve that fails, a root
    SciPy would drop) pays the program on few of its calls, and one that gave up on one
    call's data tries again on the next.

    >>> backoff = FallbackBackoff()
    >>> tried = []
    >>> for call in range(12):
    ...     if backoff.should_try("key"):
    ...         tried.append(call)
    ...         backoff.record("key", succeeded=False)
    >>> tried
    [0, 1, 3, 7]
    """

    MAX_SKIPPED = 63

    def __init__(self) -> None:
        self._state = LruCache(lambda: 4 * max(PROGRAM_CACHE_SIZE, 1))  # [gave up, to skip]

    def should_try(self, key: Hashable) -> bool:
        state = self._state.get(key)
        if state is None or state[1] == 0:
            return True
        state[1] -= 1
        return False

    def record(self, key: Hashable, succeeded: bool) -> None:
        if succeeded:
            self._state.pop(key)
            return
        state = self._state.get(key) or self._state.put(key, [0, 0])
        state[0] += 1
        state[1] = min(2 ** (state[0] - 1) - 1, self.MAX_SKIPPED)


def program_cache_info() -> dict:
    """Hits, misses, current size and bound of the whole-call program cache."""
    return _programs.info()


def cpu_device() -> Any:
    return jax.devices("cpu")[0]


class on_cpu:
    """Context: JAX calls made on the host inside it run on the CPU device.

    Where they would anyway (no default device set, the default backend the CPU) it
    sets nothing: inside `jax.default_device` every jitted call takes JAX's slower
    dispatch path (measured 4x per call, JAX 0.10.2), and SciPy's loops make one such
    call per function evaluation.
    """

    def __enter__(self) -> Any:
        if jax_setting("jax_default_device") is None and \
                jax.default_backend() == "cpu":
            self._ctx = None
            return None
        self._ctx = jax.default_device(cpu_device())
        return self._ctx.__enter__()

    def __exit__(self, *exc: Any) -> Any:
        return None if self._ctx is None else self._ctx.__exit__(*exc)


_identity = jax.jit(lambda *xs: xs)


def to_device(*arrays: np.ndarray, device: Any = None) -> tuple[jax.Array, ...]:
    """NumPy arrays as JAX arrays on `device` (None: the default device). Without a
    device, through a jitted identity: `jax.device_put` of a NumPy array takes JAX's
    Python path, measured at 127 us against 23 us for the jitted call (CPU, JAX 0.10.2).

    >>> y, err = to_device(np.float64(0.5), np.float64(1e-9))
    >>> float(y), err.dtype == jnp.result_type(float)
    (0.5, True)
    """
    if device is not None:
        return tuple(jax.device_put(arrays, device))
    return _identity(*arrays)


class NotEager(Exception):
    """Raised by `eager_device` where a call must take its traced path."""


def eager_device(operands: Any) -> Any:
    """The device an eager call's results go to (None: the default device), where the
    call may run its host computation directly: JAX is evaluating eagerly (no jit,
    grad, vmap or loop is tracing -- not even one of constants), no operand is a
    tracer, and the operands are on one device at most. Otherwise `NotEager`: the
    traced path, whose primitive derivatives and programs can see.

    >>> eager_device((np.ones(2), 1.0)) is None
    True
    """
    if not is_eager():
        raise NotEager
    leaves = jax.tree_util.tree_leaves(operands)
    if any(is_tracer(x) for x in leaves):  # (a tracer leaked out of its trace)
        raise NotEager
    devices = {d for x in leaves if isinstance(x, jax.Array) for d in x.devices()}
    if len(devices) > 1:
        raise NotEager
    return next(iter(devices), None)


def computes_on_cpu(device: Any) -> bool:
    """Whether results on `device` (an `eager_device` answer; None: the default device)
    are computed on the CPU, where the compiled eager paths' CPU handlers and loops run.

    >>> computes_on_cpu(jax.devices("cpu")[0])
    True
    """
    if device is None:
        device = jax_setting("jax_default_device")  # a Device, a platform name or None
    if device is None:
        return jax.default_backend() == "cpu"
    return (device if isinstance(device, str) else device.platform) == "cpu"


def host_copies(tree: Any) -> Any:
    """Private NumPy copies of a host call's input arrays, for host code that hands them
    to JAX: JAX may hold an input array after the call returns (a host call on one of
    XLA's worker threads, inside `shard_map`), and the host call's inputs are views of
    XLA's buffers, valid only during the call."""
    return jax.tree_util.tree_map(np.array, tree)


def host_float(x: Any) -> float:
    """`x` (a JAX or NumPy scalar) as a Python float, by way of NumPy: `float()` of a
    JAX array takes JAX's scalar-conversion path, which costs about 2.5x NumPy's
    conversion (measured 38 against 14 us per call with the dispatch, JAX 0.10.2), and
    SciPy's loops convert once per evaluation of the user's function.

    >>> host_float(jnp.float32(0.5))
    0.5
    """
    return float(np.asarray(x))


def f64(x: Any) -> np.ndarray:
    """A writable float64 NumPy copy (JAX results and host-call inputs are read-only)."""
    return np.array(x, dtype=np.float64)


# ------------------------------------------------------------------ arrays and pytrees
def check_real(x: Any, name: str, what: str) -> None:
    """Raise a ValueError if `x` (an array or scalar) is complex: the solvers here are
    real, and casting would drop the imaginary part without a word."""
    dtype = getattr(x, "dtype", None)
    complex_ = dtype.kind == "c" if isinstance(dtype, np.dtype) else jnp.iscomplexobj(x)
    if complex_:  # (an array's own dtype read directly: JAX's test costs ~10 us)
        raise ValueError(
            f"jaxbridge.scipy.{name}: `{what}` must be real; got complex values (dtype "
            f"{jnp.asarray(x).dtype}). Complex problems are not supported: write them as "
            f"real ones over the real and imaginary parts")


def as_float_array(x: Any, name: str, what: str) -> jax.Array:
    """`x` as a JAX array, promoted to the default float dtype if it is not floating;
    complex `x` raises (see `check_real`).

    >>> as_float_array([1, 2], "f", "x").dtype == jnp.result_type(float)
    True
    """
    _refuse_extended_precision(getattr(x, "dtype", None), name, what)
    try:
        check_real(x, name, what)
        x = jnp.asarray(x)
    except TypeError as e:  # strings, objects: SciPy's ValueError (float() of them fails)
        raise ValueError(f"jaxbridge.scipy.{name}: `{what}` must be an array of numbers, as "
                         f"in SciPy; got {x!r}") from e
    return x if jnp.issubdtype(x.dtype, jnp.floating) else x.astype(jnp.result_type(float))


def _refuse_extended_precision(dtype: Any, name: str, what: str) -> None:
    """NumPy's float128/complex256 (long double) have no JAX dtype: say so, by name."""
    if isinstance(dtype, np.dtype) and dtype.kind in "fc" and \
            dtype.itemsize > (16 if dtype.kind == "c" else 8):
        raise ValueError(f"jaxbridge.scipy.{name}: `{what}` has dtype {dtype}, NumPy's "
                         f"extended precision, which JAX does not have; pass float64 "
                         f"(or complex128) values")


def as_float_operand(x: Any, name: str, what: str) -> Any:
    """`as_float_array`, but a NumPy array or a list of numbers stays a NumPy array (in
    JAX's dtype for it): a jitted program takes it as it is, without the eager device
    transfer and cast (two dispatches) that `as_float_array` costs a repeat call.

    >>> as_float_operand([1, 2], "f", "x").dtype == jnp.result_type(float)
    True
    """
    if isinstance(x, jax.Array) or not isinstance(x, (np.ndarray, list, tuple)):
        return as_float_array(x, name, what)
    try:
        a = np.asarray(x)
    except Exception:  # noqa: BLE001 - e.g. a list holding tracers: JAX's conversion
        return as_float_array(x, name, what)
    if a.dtype == object or not (np.issubdtype(a.dtype, np.number) or a.dtype == bool):
        return as_float_array(x, name, what)
    _refuse_extended_precision(a.dtype, name, what)
    check_real(a, name, what)
    return a.astype(_float_dtype(a.dtype, jax_setting("jax_enable_x64")), copy=False)


@functools.lru_cache(maxsize=64)
def _float_dtype(dtype: np.dtype, x64: bool) -> np.dtype:
    """JAX's float dtype for a NumPy operand of `dtype` (its own if floating, else the
    default float), under `x64`: JAX's canonicalization costs a repeat call ~20 us an
    operand (JAX 0.10.2)."""
    float_dtype = dtype if np.issubdtype(dtype, np.floating) else jnp.result_type(float)
    return np.dtype(jax.dtypes.canonicalize_dtype(float_dtype))


def np_ravel(tree: Any) -> np.ndarray:
    """Concatenate a pytree's leaves into one float64 vector."""
    leaves = jax.tree_util.tree_leaves(tree)
    if not leaves:
        return np.zeros(0)
    return np.concatenate([np.ravel(f64(x)) for x in leaves])


def np_unravel(flat: np.ndarray, like: Any) -> Any:
    """Split `flat` into a pytree shaped (and typed) like `like`."""
    leaves, tree = jax.tree_util.tree_flatten(like)
    out, i = [], 0
    for x in leaves:
        x = np.asarray(x)
        out.append(np.asarray(flat[i:i + x.size]).reshape(x.shape).astype(x.dtype))
        i += x.size
    return jax.tree_util.tree_unflatten(tree, out)


def fill_zeros(tangent: Any, like: Any) -> Any:
    """A tangent pytree with its None (symbolic zero) leaves replaced by zeros."""
    if tangent is None:
        return jax.tree_util.tree_map(lambda x: np.zeros(np.shape(x), np.float64), like)
    return jax.tree_util.tree_map(
        lambda t, x: np.zeros(np.shape(x), np.float64) if t is None else f64(t),
        tangent, like, is_leaf=lambda t: t is None)


def tangent_like(tangent: Any, primal: Any) -> Any:
    """`tangent` cast leaf by leaf to its primal's dtype: the host side computes in
    float64, and `jax.jvp` refuses a float64 tangent for float32 parameters."""
    return jax.tree_util.tree_map(
        lambda t, x: jnp.asarray(t).astype(jnp.result_type(x)), tangent, primal)


def nan_like(tree: Any) -> Any:
    """NaN arrays shaped and typed like `tree`'s leaves (the "nan" failure policy)."""
    return jax.tree_util.tree_map(
        lambda x: np.full(np.shape(x), np.nan, np.asarray(x).dtype), tree)


def jnp_ravel(tree: Any) -> jax.Array:
    leaves = jax.tree_util.tree_leaves(tree)
    if not leaves:
        return jnp.zeros(0, jnp.result_type(float))
    return jnp.concatenate([jnp.ravel(x).astype(jnp.result_type(float)) for x in leaves])


def static_options(options: dict | None, name: str = "") -> tuple:
    """A dict of solver options as a hashable (static) sorted tuple of items."""
    if options is None:
        return ()
    try:
        items = tuple(sorted(dict(options).items()))
        hash(items)
    except TypeError:
        raise TypeError(f"jaxbridge.scipy.{name}: solver options must have hashable values "
                        f"(they are static); got {dict(options)!r}") from None
    return items


# ------------------------------------------------------------------ results
class Result(Mapping):
    """A SciPy-style result: fields by attribute (`res.x`) or key (`res["x"]`).

    Like SciPy's `OptimizeResult`, but a JAX pytree (its array fields are leaves), so
    it can be returned from `jit` and `vmap`. Fields SciPy has and jaxbridge cannot
    provide as arrays are None. `message` is derived from `status` (SciPy's own
    message is in the `SolverError` raised with `on_failure="raise"`).
    """

    _fields: ClassVar[tuple[str, ...]] = ()
    _messages: ClassVar[dict[int, str]] = {}

    def __init__(self, **fields: Any) -> None:
        unknown = set(fields) - set(self._fields)
        if unknown:
            raise TypeError(f"{type(self).__name__}: unknown fields {sorted(unknown)}")
        for f in self._fields:
            object.__setattr__(self, f, fields.get(f))

    def __init_subclass__(cls, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        jax.tree_util.register_pytree_with_keys(
            cls,
            lambda r: ([(jax.tree_util.GetAttrKey(f), getattr(r, f)) for f in r._fields], None),
            lambda _, children: cls(**dict(zip(cls._fields, children))),
            lambda r: ([getattr(r, f) for f in r._fields], None))

    def __setattr__(self, key: str, value: Any) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable")

    def __getitem__(self, key: str) -> Any:
        if key not in self._fields:
            raise KeyError(key)
        return getattr(self, key)

    def __iter__(self) -> Iterator[str]:
        return iter(self._fields)

    def __len__(self) -> int:
        return len(self._fields)

    def __repr__(self) -> str:
        body = ", ".join(f"{f}={getattr(self, f)!r}" for f in self._fields
                         if getattr(self, f) is not None)
        return f"{type(self).__name__}({body})"

    @property
    def message(self) -> str:
        unknown = "(status is traced; see `status` and `success`)"
        status = getattr(self, "status", None)
        if status is None:  # (the answer int(None)'s TypeError gave)
            return unknown
        try:
            code = int(status)
        except (TypeError, jax.errors.ConcretizationTypeError):
            return unknown
        return self._messages.get(code, f"SciPy status {code}" + (
            "" if bool(getattr(self, "success", True)) else
            " (failure; on_failure='raise' reports SciPy's message)"))


def const(value: Any) -> Callable[[], Any]:
    """A function returning `value` (binds it now, not when called)."""
    return lambda: value
