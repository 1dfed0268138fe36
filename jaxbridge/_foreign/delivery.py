"""A host function's exception, delivered to the caller as the same object.

Where the call ran on the thread that called JAX, the host-call runtime re-raises the
exception there when the JAX call returns (csrc/hostcall/delivery.cc). Everywhere else --
one of XLA's worker threads, a device's part of a program on several devices, the
`pure_callback` backend -- it crosses XLA as an error whose text names a token, and JAX's
runtime error built from that text is the exception itself (`jaxbridge.errors`).

What this guarantees, each tested in tests/test_delivery.py:

* ``except MyError`` catches the host function's own object under `jit`, `grad`, `vmap`
  and sharding; `jaxbridge.errors.original_exception(err)` is the contract where an
  exception is carried in a JAX runtime error instead (the opt-out below, a JAX whose
  error class cannot be adapted). ``except jax.errors.JaxRuntimeError`` does not catch
  a host function's exception: it is raised as itself.
* One failure is raised once: JAX's later barriers (`jax.effects_barrier()`, its exit
  hooks) do not raise a failure that was already raised at its call site.
* An exception raised again and again (one instance kept and re-raised) gets one note
  of ours, its traceback does not grow with each delivery, and the cost of a delivery
  does not grow with their number.
* An exception whose ``__str__`` raises is still delivered as itself.

Set ``JAXBRIDGE_RAISE_ORIGINAL=0`` to keep JAX's runtime errors as they are (their text
then names the failure's token, and `original_exception(err)` returns the exception).
"""

from __future__ import annotations

import gc
import os
import sys
import threading
import traceback
import types
from typing import Any

from .._core import jaxapi
from ..errors import JaxbridgeError, carried_failure, redelivered, remember_failure

__all__ = ["install", "install_native_hooks", "PendingException", "annotate",
           "failure_message"]

#: The prefix of the note JAX adds to an exception at each jit boundary it crosses.
_JAX_NOTE = "--------------------\nFor simplicity, JAX has removed its internal frames"
_WHERE_NOTE = "Raised in a jaxbridge host function:\n"


def install() -> None:
    """At import: JAX's runtime errors carrying a failure become the failure itself, and
    JAX's barriers forget a failure already raised (unless JAXBRIDGE_RAISE_ORIGINAL=0)."""
    if os.environ.get("JAXBRIDGE_RAISE_ORIGINAL", "1").strip() in ("0", "false", "no"):
        return
    jaxapi.raise_carried_exceptions(carried_failure)
    jaxapi.let_barriers_forget(redelivered)


def install_native_hooks(native: Any) -> None:
    """Hand the host-call runtime (the `_hostcall` extension) the Python objects it
    delivers exceptions and releases views with: this module's `PendingException`,
    `gc.collect`, `traceback.clear_frames`, JAX's deferred release, the main thread."""
    PendingException.take_pending = native.take_pending
    native.install_hooks(PendingException, gc.collect, traceback.clear_frames,
                         jaxapi.deferred_release(), threading.main_thread().ident)


class PendingException(BaseException):
    """Raised in a thread by the host-call runtime (`PyThreadState_SetAsyncExc` takes a
    class): constructing it hands back the exception the thread's host call raised."""

    take_pending: Any = None  # the runtime's function, set when it is loaded

    def __new__(cls, *args: Any) -> Any:  # noqa: D102
        exc = cls.take_pending() if cls.take_pending is not None else None
        if exc is None:  # nothing pending: should not happen; say so rather than guess
            return RuntimeError("jaxbridge: a host-call exception was lost in delivery")
        if sys.version_info < (3, 12) and exc.__traceback__ is not None:
            # Python 3.11 replaces the traceback of an exception delivered this way
            # with the frames it unwinds next: keep where it was raised as a note.
            _replace_note(exc, _WHERE_NOTE, _WHERE_NOTE + "".join(
                traceback.format_tb(exc.__traceback__)).rstrip())
        return exc


def annotate(exc: BaseException, what: str, name: str) -> None:
    """Before `exc` is delivered: one note naming the host function that raised it, no
    copy of JAX's note from an earlier delivery (JAX adds it again as the exception
    leaves `jit`), and no frames of earlier deliveries of the same instance."""
    _cut_stale_frames(exc)
    if isinstance(exc, JaxbridgeError):
        return
    try:
        notes = getattr(exc, "__notes__", None)
        if isinstance(notes, list):
            notes[:] = [n for n in dict.fromkeys(notes)
                        if not (isinstance(n, str) and n.startswith(_JAX_NOTE))]
        _replace_note(exc, "(raised in the ",
                      f"(raised in the {what} of jaxbridge foreign function {name!r})")
    except (AttributeError, TypeError):  # an exception type that takes no notes
        pass


def failure_message(exc: BaseException, what: str, name: str,
                    origin: tuple[Any, int, Any] | None = None) -> str:
    """The XLA error text for a failure that crosses XLA as an error: the exception's type,
    message and origin, and a token (JAX's runtime error for it becomes `exc` itself).
    `origin`: see `jaxbridge.errors.remember_failure`."""
    token = remember_failure(exc, origin)
    kind = type(exc)
    qualified = kind.__qualname__ if kind.__module__ in ("builtins", "__main__") else \
        f"{kind.__module__}.{kind.__qualname__}"
    return (f"{qualified}: {_text(exc)}\n  in the {what} of jaxbridge foreign function "
            f"{name!r}{_where(exc)}\n  [jaxbridge failure #{token}: "
            f"jaxbridge.errors.original_exception(err) returns the exception object]")


def _text(exc: BaseException) -> str:
    try:
        return str(exc)
    except Exception:  # noqa: BLE001 - the exception's own __str__ is broken
        return f"<{type(exc).__name__} whose str() raised>"


def _where(exc: BaseException) -> str:
    """Where `exc` was raised: its traceback's last entry (walked, not formatted whole)."""
    tb = exc.__traceback__
    if tb is None:
        return ""
    while tb.tb_next is not None:
        tb = tb.tb_next
    code = tb.tb_frame.f_code
    return f"\n  (raised at {code.co_filename}:{tb.tb_lineno} in {code.co_name})"


def _replace_note(exc: BaseException, prefix: str, note: str) -> None:
    """Add `note`, replacing an earlier note of ours that starts with `prefix`."""
    notes = getattr(exc, "__notes__", None)
    if isinstance(notes, list):
        notes[:] = [n for n in notes if not (isinstance(n, str) and n.startswith(prefix))]
    exc.add_note(note)


def _cut_stale_frames(exc: BaseException) -> None:
    """Drop the frames an earlier delivery left on a re-raised instance.

    Raising an exception object again prepends the new frames to its old traceback. The
    frames of this call are finished; the old part begins with the frames of the earlier
    call site, which are still running (a loop that catches and calls again): the
    traceback is cut before the first frame any thread is still running.
    """
    tb = exc.__traceback__
    if tb is None or tb.tb_next is None:
        return
    running: set[int] = set()
    for frame in sys._current_frames().values():
        walk: types.FrameType | None = frame
        while walk is not None:
            running.add(id(walk))
            walk = walk.f_back
    previous = None
    while tb is not None:
        if id(tb.tb_frame) in running:
            if previous is not None:
                previous.tb_next = None
            return
        previous, tb = tb, tb.tb_next
