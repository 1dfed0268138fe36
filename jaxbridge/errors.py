"""Every exception jaxbridge raises, under one base class.

`JaxbridgeError` is the base of all of them, so ``except jaxbridge.errors.JaxbridgeError``
catches anything jaxbridge itself reports (and nothing your own code raises: an
exception raised *by* a wrapped function or rule reaches you as itself, unchanged).
Each class also derives from the built-in exception a Python programmer would expect
(`TypeError` for a wrong type or a missing rule, `ValueError` for a bad value, ...),
so existing ``except`` clauses keep working.

The same condition raises the same class everywhere: a host function and a C++
kernel that would make XLA gather sharded inputs both raise `ShardingError`; a
result of the wrong shape from a function, a JVP rule or a VJP rule is a
`ResultMismatchError` whose attributes say what was declared and what came, so
tools (like `jaxbridge.testing`) need not parse messages.

Example:
    >>> import jax.numpy as jnp, numpy as np, jaxbridge as jb
    >>> from jaxbridge.errors import ResultMismatchError
    >>> f = jb.foreign(lambda x: x)(lambda x: np.ones(4, np.float32))
    >>> try:
    ...     f(jnp.ones(3, jnp.float32))
    ... except ResultMismatchError as err:
    ...     print(err.problem, err.declared, err.received)
    shape float32[3] float32[4]
"""

from __future__ import annotations

import collections
import itertools
import os
import re
import secrets
import threading
import traceback
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = [
    "JaxbridgeError",
    "ForeignCallError",
    "ResultMismatchError",
    "KeptViewError",
    "MissingRuleError",
    "UntraceableFunctionError",
    "KernelError",
    "AliasError",
    "ShardingError",
    "BackendError",
    "CompileError",
    "UnsafeCacheError",
    "SolverError",
    "RuleCheckError",
    "describe",
    "original_exception",
]


class JaxbridgeError(Exception):
    """Base class of every exception raised by jaxbridge itself."""


class ForeignCallError(JaxbridgeError, RuntimeError):
    """A host (NumPy/SciPy) function or rule was called, and what happened is wrong:
    it returned something that is not what was declared, or kept a buffer it was lent.

    Exceptions raised *inside* your function are not wrapped in this class: they
    reach the caller as themselves.
    """


class ResultMismatchError(ForeignCallError, TypeError):
    """A function, JVP rule or VJP rule returned a value whose structure,
    shape or dtype differs from what was declared. Nothing is ever silently cast.

    Attributes:
      function: the name of the foreign function.
      what: which value, e.g. ``"output"``, ``"output['a']"``, ``"cotangent 1"``.
      problem: ``"structure"``, ``"shape"``, ``"dtype"``, ``"none"`` (None where an
        array was required) or ``"count"`` (wrong number of cotangents).
      declared, received: short descriptions, e.g. ``"float32[3]"``.
    """

    def __init__(self, message: str, *, function: str = "", what: str = "",
                 problem: str = "", declared: str = "", received: str = ""):
        super().__init__(message)
        self.function, self.what, self.problem = function, what, problem
        self.declared, self.received = declared, received

    def __reduce__(self) -> Any:
        return (_rebuild_mismatch, (str(self), self.function, self.what, self.problem,
                                    self.declared, self.received))


def _rebuild_mismatch(message: str, function: str, what: str, problem: str, declared: str,
                      received: str) -> ResultMismatchError:
    return ResultMismatchError(message, function=function, what=what, problem=problem,
                               declared=declared, received=received)


class KeptViewError(ForeignCallError):
    """A host function kept (stored, or returned inside another object) one of the
    zero-copy views of XLA's buffers it was lent; those are valid only during the call.
    Copy what you keep (``np.array(x)``)."""


class MissingRuleError(JaxbridgeError, TypeError):
    """A transformation needs a derivative rule (or kernel) that was not given."""


class UntraceableFunctionError(MissingRuleError):
    """A function given to a `jaxbridge.scipy` drop-in (`fun`, `jac`, `events[i]`, ...)
    is not written in JAX (NumPy, `math`, `float(y)`, Python `if` on values), and the
    call needs to trace it: it is differentiated (`grad`, `jvp`), or its result shapes
    are not known before it runs under `jit`. Without those, such a function runs as in
    SciPy (SciPy's own routine, called with the function).

    The message names the drop-in and the argument; ``__cause__`` is JAX's own error.
    To differentiate, write the function with `jax.numpy`, or wrap its NumPy code with
    `jaxbridge.foreign` and give it derivative rules.

    Attributes:
      function: the drop-in, e.g. ``"optimize.root"``.
      argument: the argument holding the function, e.g. ``"fun"``.
    """

    def __init__(self, message: str, *, function: str = "", argument: str = ""):
        super().__init__(message)
        self.function, self.argument = function, argument

    def __reduce__(self) -> Any:
        return (_rebuild_untraceable, (str(self), self.function, self.argument))


def _rebuild_untraceable(message: str, function: str, argument: str
                         ) -> UntraceableFunctionError:
    return UntraceableFunctionError(message, function=function, argument=argument)


class KernelError(JaxbridgeError, TypeError):
    """A C++/CUDA kernel cannot be built or called as asked: a bad target, argument,
    attribute or result specification."""


class AliasError(KernelError, ValueError):
    """``aliases=`` of a kernel (`jaxbridge.kernel`) or a host function
    (`jaxbridge.foreign`) is malformed, or pairs an operand and a result of different
    shapes or dtypes. The same checks and messages serve both. A `KernelError` (what
    kernels raised for bad aliases before) and a ValueError (what host functions raised),
    so either ``except`` clause catches it."""


class ShardingError(JaxbridgeError, ValueError):
    """A host function or kernel is compiled into a computation partitioned over
    several devices in a way that would make XLA gather its inputs onto every device."""


class BackendError(JaxbridgeError, RuntimeError):
    """The requested host-call backend (e.g. ``backend="native"``) is not available."""


class CompileError(JaxbridgeError, RuntimeError):
    """The compiler or the dynamic loader rejected a `jaxbridge.cpp.load` library; the
    message holds their own output."""


class UnsafeCacheError(JaxbridgeError, PermissionError):
    """The `jaxbridge.cpp` build cache (or an entry in it) is not private to the
    current user, so loading code from it could run someone else's code."""


class SolverError(JaxbridgeError, RuntimeError):
    """A SciPy solver reported failure and the call asked for ``on_failure="raise"``."""


class RuleCheckError(JaxbridgeError, AssertionError):
    """`jaxbridge.testing.check_rules` found a wrong derivative rule.

    Attributes:
      report: the full `jaxbridge.testing.RuleReport` (``str(err.report)`` is a table of
        every check), or None when raised without one.
    """

    def __init__(self, message: str = "", *, report: Any = None):
        super().__init__(message)
        self.report = report


def describe(aval: Any) -> str:
    """``dtype[shape]`` of anything with ``.shape``/``.dtype``, e.g. ``"float32[2, 3]"``.

    The form jaxbridge's messages and `ResultMismatchError`'s ``declared`` and
    ``received`` use.

    Args:
      aval: an array, a ``jax.ShapeDtypeStruct`` or anything with ``shape`` and
        ``dtype``.

    Returns:
      The description, e.g. ``"float32[2, 3]"`` (``"float64[]"`` for a scalar).

    Example:
        >>> import numpy as np
        >>> describe(np.zeros((2, 3), np.float32))
        'float32[2, 3]'
    """
    shape = ", ".join(str(int(d)) for d in aval.shape)
    return f"{np.dtype(aval.dtype).name}[{shape}]"


# ---- failures that crossed XLA as a status (see jaxbridge/_foreign/delivery.py) ----
# An exception raised where no Python caller waits on the thread (one of XLA's worker
# threads, a device's part of a program on several devices, the pure_callback backend)
# crosses XLA as an error whose message names a token. Where JAX raises its runtime error
# for that status on the launching thread, the runtime error becomes the kept exception
# itself (`carried_failure`, installed through `_core.jaxapi.raise_carried_exceptions`);
# `original_exception` hands it back from a runtime error that still carries it.
#
# Memory: a failure waits here until it is delivered (at most `_UNDELIVERED_KEPT` of
# them); a delivered one is the caller's, and only the last few are kept (to recognise
# JAX raising the same failed run again). When one failure is delivered, the frames'
# local variables of the others still waiting are released (the exceptions themselves
# are kept): the other shards of a failed run are never delivered, and their frames can
# hold whole arrays.
#
# A run on several devices fails once per device, and a device's failure may reach JAX
# after the first one was raised at the call site; JAX's next barrier would raise it as
# a second exception. Each failure of a per-device call knows its call's ordinal among
# its host function's calls (`started`): a failure whose call had started before a
# failure of the same function was delivered belongs to a run already reported, and a
# barrier does not raise it (`redelivered`). Calls started after that delivery (a retry)
# are new runs, raised as usual.
_UNDELIVERED_KEPT = 32
_DELIVERED_KEPT = 4
_undelivered: collections.OrderedDict[str, BaseException] = collections.OrderedDict()
# token -> [the exception, how many times it was raised, whether its run was reported]
_delivered: collections.OrderedDict[str, list] = collections.OrderedDict()
# token -> (host function key, the failed call's ordinal, the function's calls so far)
_origins: dict[str, tuple[Any, int, Callable[[], int]]] = {}
# host function key -> how many of its calls had started when a failure was delivered
_reported_upto: collections.OrderedDict[Any, int] = collections.OrderedDict()
_REPORTED_KEPT = 256
_failure_ids = itertools.count(1)
_failures_lock = threading.Lock()
#: Tokens name the process (its pid and a random nonce) so that a message that crossed to
#: another process (a log, a multi-process run) never names another process's failure.
_NONCE = secrets.token_hex(4)
_TOKEN = re.compile(r"\[jaxbridge failure #([0-9a-f]+-[0-9a-f]+-\d+)")


def remember_failure(exc: BaseException,
                     origin: tuple[Any, int, Callable[[], int]] | None = None) -> str:
    """Keep `exc` until it is delivered and return its token. `origin`: the host
    function's key, the failed call's ordinal among its calls, and a function that says
    how many of its calls have started by now (see `redelivered`)."""
    with _failures_lock:
        token = f"{os.getpid():x}-{_NONCE}-{next(_failure_ids)}"
        _undelivered[token] = exc
        if origin is not None and origin[1] >= 0:
            _origins[token] = origin
        while len(_undelivered) > _UNDELIVERED_KEPT:
            dropped, _ = _undelivered.popitem(last=False)
            _origins.pop(dropped, None)
    return token


def _reported_run(token: str) -> bool:
    """Whether the call that failed with `token` had started before a failure of the same
    host function was delivered; records this delivery for later ones. Lock held."""
    origin = _origins.pop(token, None)
    if origin is None:
        return False
    key, started, calls_started = origin
    reported = started < _reported_upto.get(key, 0)
    try:
        now = calls_started()
    except Exception:  # noqa: BLE001 - the function is gone: nothing more to compare
        now = -1
    if now > _reported_upto.get(key, 0):
        _reported_upto[key] = now
        _reported_upto.move_to_end(key)
        while len(_reported_upto) > _REPORTED_KEPT:
            _reported_upto.popitem(last=False)
    return reported


def _deliver(token: str) -> BaseException | None:
    """The failure `token` names, now delivered (None: no longer kept)."""
    with _failures_lock:
        exc = _undelivered.pop(token, None)
        if exc is None:
            entry = _delivered.get(token)
            if entry is None:
                return None
            entry[1] += 1
            return entry[0]
        _delivered[token] = [exc, 1, _reported_run(token)]
        while len(_delivered) > _DELIVERED_KEPT:
            _delivered.popitem(last=False)
        waiting = [e for e in _undelivered.values() if e.__traceback__ is not None]
    for other in waiting:  # outside the lock: clearing frames runs finalizers
        traceback.clear_frames(other.__traceback__)
    return exc


def carried_failure(args: tuple) -> BaseException | None:
    """The kept host-function exception that a JAX runtime error is being built from:
    its message's token, or the exception object itself (what Python passes when it
    normalizes an error set as that object). Marks it delivered."""
    for arg in args:
        if isinstance(arg, str):
            match = _TOKEN.search(arg)
            if match:
                return _deliver(match.group(1))
        elif isinstance(arg, BaseException):
            with _failures_lock:
                kept = (*(entry[0] for entry in _delivered.values()),
                        *_undelivered.values())
                if any(arg is e for e in kept):
                    return arg
    return None


def redelivered(exc: BaseException) -> bool:
    """Whether `exc` belongs to a failed run that was already reported: raised again
    after it was delivered (JAX raising the same failed run again, at a later
    `jax.effects_barrier()` or at exit), or another device's failure of a run whose
    failure was delivered (see `remember_failure`)."""
    with _failures_lock:
        return any(exc is e and (count > 1 or reported)
                   for e, count, reported in _delivered.values())


def original_exception(err: BaseException) -> BaseException | None:
    """The exception a host function raised, from the JAX runtime error that carried it.

    Exceptions raised by host functions reach you as themselves, wherever XLA ran the
    call: on the thread that called JAX, on one of XLA's worker threads (a call per
    shard of a sharded input, a call XLA scheduled in parallel), or through the
    `pure_callback` backend. A JAX runtime error carries one only where JAX's error
    class cannot be adapted (a JAX release that made it immutable) or for
    KeyboardInterrupt / SystemExit; this returns the original object (or None if `err`
    carries none, or it is no longer kept), and `err` itself when it is one.

    Args:
      err: the exception JAX raised (its ``__cause__`` and ``__context__`` chain is
        searched too).

    Returns:
      The host function's exception object, or None. Failures are kept until they are
      delivered (the last 32 of them), and the last 4 delivered ones.

    Example:
        >>> original_exception(ValueError("unrelated")) is None
        True
    """
    if carried_failure((err,)) is not None:
        return err
    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        match = _TOKEN.search(_text(err))
        if match:
            return _deliver(match.group(1))
        err = err.__cause__ or err.__context__  # type: ignore[assignment]
    return None


def _text(exc: BaseException) -> str:
    """``str(exc)``, or "" for an exception whose ``__str__`` itself raises."""
    try:
        return str(exc)
    except Exception:  # noqa: BLE001 - a broken __str__ is the exception's own bug
        return ""
