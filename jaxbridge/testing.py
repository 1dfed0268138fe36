"""`jaxbridge.testing`: prove custom derivative rules right.

:func:`check_rules` takes any JAX-callable with custom derivative rules — a
``jb.foreign`` function, a ``jb.kernel``, a ``jax.custom_vjp`` / ``jax.custom_jvp``
function, or any function built on them — and example arguments, and checks its rules
against finite differences, against each other, and under JAX's transformations:

========================  ==============================================================
``output_shapes``         ``jax.eval_shape`` (declared) vs an eager call (actual)
``cotangent_shapes``      ``jax.vjp`` cotangents vs the inputs (structure, shapes, dtypes)
``tangent_shapes``        ``jax.jvp`` output tangents vs the outputs
``integer_inputs``        integer/bool inputs: float0 (or zero) cotangents, no crash
``vjp_fd``                VJP vs finite differences along random directions
``jvp_fd``                JVP vs finite differences along random directions
``vjp_jacobian``          full Jacobian from the VJP vs finite differences (small inputs)
``jvp_jacobian``          full Jacobian from the JVP vs finite differences (small inputs)
``jvp_vjp_consistency``   ``<ct, J t> == <J^T ct, t>`` between the two rules, no FD
``symbolic_zeros``        rules with unperturbed inputs / zero output cotangents
``jit``                   eager vs ``jax.jit``: values, VJP, JVP
``primal_values``         ``jax.vjp`` / ``jax.jvp`` outputs vs the plain call (a kernel's
                          forward with residuals, a ``custom_vjp``'s fwd)
``vmap``                  ``jax.vmap`` over each argument and all at once vs a loop
``batched_grad``          the rules vmapped over cotangents / tangents alone vs a loop
``deterministic``         the same call twice agrees (to ``nondet_tol``)
``no_retrace``            a second eager call with equal shapes compiles nothing
``export``                ``jax.export`` round trip (values, VJP) of FFI-kernel programs
``second_order``          Hessian-vector products vs finite differences of the gradient
``inputs_unchanged``      no call wrote into an input's buffer
``derivatives_checked``   each mode the function has (forward, reverse) was checked
========================  ==============================================================

The checker asks the function which derivatives it has (``f.derivatives()``, a
:class:`Derivatives`: jaxbridge's host functions, linear functions, ``custom_gradient``
and kernels answer) and plans from the answer; for other callables (``jax.custom_vjp``,
``jax.custom_jvp``, functions built on jaxbridge functions) it tries each mode.
``derivatives_checked`` fails when a mode the function has was not checked by any
enabled derivative check, so a rule cannot pass unseen. Every ``jb.kernel`` traced
during a run guards its outputs (``jaxbridge.kernel(..., guard_outputs=True)``): a
handler that writes outside an output fails the check that ran it instead of
corrupting memory.

Finite differences step each input element relative to its own magnitude, extrapolate
(Richardson; refined by a complex step where the function takes complex inputs) and
carry an error bound per output element, which is added to the tolerance: a correct
rule is not failed because the reference was inaccurate, whatever the inputs' range.
They are evaluated in float64 when the function accepts float64 inputs (else in its
own dtype). Integer and boolean inputs are held fixed. Forward-mode checks are skipped
("no forward mode") for functions without one, e.g. ``jax.custom_vjp``.

Example:
    >>> import jax, numpy as np, jaxbridge as jb
    >>> from jaxbridge.testing import check_rules
    >>> @jb.foreign(lambda x: x)
    ... def host_sin(x):
    ...     return np.sin(x)
    >>> @host_sin.defvjp
    ... def _(primals, out, ct):
    ...     return (np.cos(primals[0]) * ct,)
    >>> report = check_rules(host_sin, np.linspace(0.0, 1.0, 4))
    >>> report.passed
    True
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from ._core.capabilities import Derivatives
from ._testing._checker import run_checks
from ._testing._report import CHECKS, CheckOptions, CheckResult, RuleReport, failure_message
from .errors import RuleCheckError

if TYPE_CHECKING:
    from ._testing import strategies as strategies

for _cls in (CheckOptions, CheckResult, RuleReport, Derivatives):
    _cls.__module__ = __name__  # shown as jaxbridge.testing.X in reprs and tracebacks
del _cls

__all__ = [
    "CHECKS",
    "CheckOptions",
    "CheckResult",
    "Derivatives",
    "RuleCheckError",
    "RuleReport",
    "assert_rules_correct",
    "check_rules",
    "strategies",
]


def check_rules(f: Callable[..., Any], *args: Any,
                check_options: CheckOptions | Mapping[str, Any] | None = None,
                **static: Any) -> RuleReport:
    """Check the derivative rules of `f` at `args`; raise `RuleCheckError` if any is wrong.

    Args:
      f: a ``jb.foreign`` function, a ``jb.kernel``, a ``jax.custom_vjp`` /
        ``jax.custom_jvp`` function, or any JAX-callable.
      *args: the positional arguments: pytrees of arrays (inexact leaves are
        differentiated; integer and boolean leaves are held fixed; other leaves are
        passed through unchanged).
      check_options: a :class:`CheckOptions` (or a dict of its fields): which checks,
        tolerances (``nondet_tol`` for nondeterministic rules), seed, number of
        directions, finite-difference step, second order, export.
      **static: keyword arguments, passed through to `f` unchanged.

    Returns:
      A :class:`RuleReport`; ``print(report)`` shows a table of every check.

    Raises:
      RuleCheckError: (``jaxbridge.errors.RuleCheckError``, an ``AssertionError``) when a
        check fails or raises. Its message lists each failure: check name, argument
        path, output, max abs/rel error, tolerance and a hint ("sign flipped",
        "cotangent looks transposed", "off by a constant factor ~k", "wrong shape",
        ...); ``err.report`` is the full report.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> @jax.custom_vjp
        ... def cube(x):
        ...     return x ** 3
        >>> cube.defvjp(lambda x: (x ** 3, x), lambda x, ct: (-3 * x ** 2 * ct,))  # bug
        >>> check_rules(cube, jnp.arange(1.0, 4.0))  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        jaxbridge.errors.RuleCheckError: check_rules(cube): ... failed ...
        ... vjp_fd [arg x, output out] -- ... -- hint: sign flipped (rule ~ -reference) ...
    """
    opts = CheckOptions.coerce(check_options)
    report = run_checks(f, args, static, opts)
    if not report.passed:
        raise RuleCheckError(failure_message(report), report=report)
    return report


def assert_rules_correct(f: Callable[..., Any], *args: Any,
                         check_options: CheckOptions | Mapping[str, Any] | None = None,
                         **static: Any) -> RuleReport:
    """:func:`check_rules` for use in tests: the traceback stops at the caller.

    Args:
      f: as in :func:`check_rules`.
      *args: as in :func:`check_rules`.
      check_options: as in :func:`check_rules`.
      **static: as in :func:`check_rules`.

    Returns:
      The `RuleReport` when every check passed.

    Raises:
      RuleCheckError: a rule is wrong; the message lists the failed checks.

    Example (in a pytest test):
        >>> def test_host_sin():
        ...     assert_rules_correct(host_sin, np.linspace(0.0, 1.0, 4))
    """
    __tracebackhide__ = True  # pytest: show the failure at the call site
    return check_rules(f, *args, check_options=check_options, **static)


def __getattr__(name: str) -> Any:
    # `jaxbridge.testing.strategies` imports Hypothesis, so only on first use.
    if name == "strategies":
        from ._testing import strategies
        return strategies
    raise AttributeError(f"module 'jaxbridge.testing' has no attribute {name!r}")
