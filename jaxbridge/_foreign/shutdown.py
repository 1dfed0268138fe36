"""Interpreter exit while host calls still run: wait for them, or say which and exit.

At exit (before JAX's own exit hooks, which wait for every program still running) the
host-call runtime (csrc/hostcall/shutdown.cc) waits up to JAXBRIDGE_SHUTDOWN_TIMEOUT
seconds for the calls in flight on other threads; if some never return, the process
says so on stderr and exits at once instead of hanging.
"""

from __future__ import annotations

import atexit
import os
import sys
from typing import Any

__all__ = ["SHUTDOWN_TIMEOUT_SECONDS", "wait_at_exit"]

# How long interpreter exit waits for host calls still running on other threads
# (JAXBRIDGE_SHUTDOWN_TIMEOUT, seconds).
SHUTDOWN_TIMEOUT_SECONDS = 10.0


def wait_at_exit(native: Any) -> None:
    """Make interpreter exit wait for the host calls of `native` (the `_hostcall`
    extension) still in flight."""
    atexit.register(_shut_down, native)


def _shut_down(native: Any) -> None:
    """atexit: wait for the host calls in flight; if some never return, say which and
    exit now."""
    try:
        timeout = float(os.environ.get("JAXBRIDGE_SHUTDOWN_TIMEOUT", SHUTDOWN_TIMEOUT_SECONDS))
    except ValueError:
        timeout = SHUTDOWN_TIMEOUT_SECONDS
    running = native.begin_shutdown(timeout)
    if not running:
        return
    last = getattr(sys, "last_value", None)  # the exception that is ending the program
    status = 130 if isinstance(last, KeyboardInterrupt) else 1
    sys.stderr.write(
        f"jaxbridge: {running} host function call(s) still running {timeout:g} s after the "
        f"interpreter began to exit; exiting without waiting for them (status {status}). "
        f"JAXBRIDGE_SHUTDOWN_TIMEOUT sets the wait.\n")
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(status)
