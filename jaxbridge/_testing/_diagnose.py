"""What an exception raised during a check means: a note for the report, a hint, and
whether it only says that a derivative rule is missing (a skip, not a failure).

The classification reads exception *types and attributes*
(`jaxbridge.errors.ResultMismatchError`, `jaxbridge.errors.MissingRuleError`), never
jaxbridge's message text. Only JAX's own errors about ``jax.custom_vjp`` rules, which
have no attributes, are read by their wording (`_jax_hint`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import jax

from .. import errors
from .._core.jaxapi import inner_jaxprs
from ..errors import MissingRuleError, ResultMismatchError

E = TypeVar("E", bound=BaseException)

#: `ResultMismatchError.problem` -> the hint shown in the report.
PROBLEM_HINTS = {
    "shape": "wrong shape",
    "dtype": "wrong dtype",
    "structure": "wrong structure",
    "none": "None where an array was declared",
    "count": "wrong number of cotangents",
}


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """`exc`, then its causes and contexts, and the original exception a JAX runtime
    error carries from one of XLA's worker threads (each once)."""
    original = getattr(errors, "original_exception", None)
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        e = todo.pop(0)
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        todo += [e.__cause__, e.__context__, original(e) if original else None]


def find(exc: BaseException, cls: type[E]) -> E | None:
    """The first exception of class `cls` in `exc`'s chain of causes, or None."""
    return next((e for e in _chain(exc) if isinstance(e, cls)), None)


def note(exc: BaseException) -> str:
    """``"raised <Type>: <what happened>"``, one line, for the report."""
    mismatch = find(exc, ResultMismatchError)
    if mismatch is not None and mismatch.problem:
        where = f" of {mismatch.function!r}" if mismatch.function else ""
        return (f"raised ResultMismatchError: {mismatch.what or 'a value'}{where}: declared "
                f"{mismatch.declared}, received {mismatch.received}")
    original = getattr(errors, "original_exception", None)
    exc = (original(exc) if original else None) or exc
    lines = str(exc).strip().splitlines()
    first = " ".join(line.strip() for line in lines[:3])
    first = first.removeprefix("INTERNAL: ")  # XLA's status prefix on runtime errors
    if len(first) > 400:
        first = first[:397] + "..."
    return f"raised {type(exc).__name__}: {first}"


#: The hint for code that wrote into an input it was lent (a read-only view).
WROTE_INPUT = ("an input was overwritten (the function or a rule writes in place into an "
               "input it was lent, which is read-only)")


def hint(exc: BaseException) -> str:
    """A short guess at the bug: "wrong shape", "wrong dtype", ... or ""."""
    mismatch = find(exc, ResultMismatchError)
    if mismatch is not None and mismatch.problem in PROBLEM_HINTS:
        return PROBLEM_HINTS[mismatch.problem]
    # NumPy's error for a write into a read-only array (jaxbridge lends XLA's buffers
    # to host code as read-only views) has no attribute to read but its wording.
    if any(isinstance(e, ValueError) and "read-only" in str(e) for e in _chain(exc)):
        return WROTE_INPUT
    return _jax_hint(str(exc))


def _jax_hint(msg: str) -> str:
    # JAX's own errors about a jax.custom_vjp / custom_jvp rule's result ("... the bwd
    # rule produced an output of type float64[2] corresponding to an input of type
    # float64[3], so the shapes do not match") carry no attributes: their wording is all
    # there is. (jaxbridge's own errors are ResultMismatchError, classified above.)
    # XLA's FFI, for a handler bound to another buffer type: "Wrong buffer dtype:
    # expected F32 but got F64".
    for words, what in (("shapes do not match", "shape"), ("shape mismatch", "shape"),
                        ("incompatible shapes", "shape"), ("dtypes do not match", "dtype"),
                        ("Wrong buffer dtype", "dtype")):
        if words in msg:
            return f"wrong {what}"
    return ""


def is_missing_rule(exc: BaseException) -> bool:
    """True when `exc` says only that a derivative rule (or kernel) was not given."""
    return find(exc, MissingRuleError) is not None


def has_custom_vjp(fun: Callable[..., Any], *args: Any) -> bool:
    """True when `fun(*args)` runs a ``jax.custom_vjp`` function, which precludes forward
    mode (JAX raises a plain TypeError then; the program's structure says why)."""
    try:
        closed = jax.make_jaxpr(fun)(*args)
    except Exception:  # noqa: BLE001 - then nothing is known about its structure
        return False
    todo = [closed.jaxpr]
    while todo:
        jaxpr = todo.pop()
        for eqn in jaxpr.eqns:
            if eqn.primitive.name.startswith("custom_vjp"):
                return True
            todo.extend(inner_jaxprs(eqn))
    return False
