"""`run_checks`, behind `jaxbridge.testing.check_rules`: the table of checks, and the
run that goes through it.

A run has three parts, each in its own module:

* `_flat.FlatCall` -- the call as functions of its array leaves (the eager call made);
* `_plan.Plan` -- frozen decisions, made once: which derivatives the function has
  (asked of it, ``f.derivatives()``, or found by trying), the precision and the
  tolerances of the finite-difference checks;
* `_run.Run` -- what changes while the checks execute: random draws, finite
  differences computed once and shared, and the results.

Each check is a function of the run (`_derivative_checks`, `_transforms`); `CHECK_TABLE`
below lists them in the order they run (`CHECKS`). Each compares what JAX computes
with the user's rules against an independent reference (finite differences, the other
rule, an eager loop) and records one `CheckResult` per (argument leaf, output leaf).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from typing import Any

from .._foreign import ForeignFunction
from .._kernel.guard import guarding
from . import _derivative_checks as derivs
from . import _diagnose, _transforms
from ._flat import FlatCall
from ._plan import make_plan
from ._report import CHECKS, CheckOptions, CheckResult, RuleReport
from ._run import Run

#: Every check, by name, in the order it runs.
CHECK_TABLE: dict[str, Callable[[Run], None]] = {
    "output_shapes": derivs.check_output_shapes,
    "cotangent_shapes": derivs.check_cotangent_shapes,
    "tangent_shapes": derivs.check_tangent_shapes,
    "integer_inputs": derivs.check_integer_inputs,
    "vjp_fd": derivs.check_vjp_fd,
    "jvp_fd": derivs.check_jvp_fd,
    "vjp_jacobian": derivs.check_vjp_jacobian,
    "jvp_jacobian": derivs.check_jvp_jacobian,
    "jvp_vjp_consistency": derivs.check_consistency,
    "symbolic_zeros": derivs.check_symbolic_zeros,
    "jit": _transforms.check_jit,
    "primal_values": _transforms.check_primal_values,
    "vmap": _transforms.check_vmap,
    "batched_grad": _transforms.check_batched_grad,
    "deterministic": _transforms.check_deterministic,
    "no_retrace": _transforms.check_no_retrace,
    "export": _transforms.check_export,
    "second_order": derivs.check_second_order,
    "inputs_unchanged": _transforms.check_inputs_unchanged,
    "derivatives_checked": derivs.check_derivatives_checked,
}
assert tuple(CHECK_TABLE) == CHECKS, "CHECKS (the public list) and the table disagree"


def run_checks(f: Callable[..., Any], args: tuple, static: dict,
               opts: CheckOptions) -> RuleReport:
    """Run every enabled check on `f(*args, **static)` and return the report; the
    kernels traced meanwhile guard their outputs (unless ``opts.guard_outputs`` is off)."""
    with guarding() if opts.guard_outputs else contextlib.nullcontext():
        return _run_checks(f, args, static, opts)


def _run_checks(f: Callable[..., Any], args: tuple, static: dict,
                opts: CheckOptions) -> RuleReport:
    call = FlatCall.inputs(f, args, static)
    try:  # the primal call: everything else depends on it
        call = call.called()
    except Exception as exc:  # noqa: BLE001
        results = [CheckResult("output_shapes", "error", hint=_diagnose.hint(exc),
                               note="the eager call " + _diagnose.note(exc))]
        results += [CheckResult(name, "skip", note="the eager call failed")
                    for name in CHECKS[1:] if opts.enabled(name)]
        return RuleReport(call.name, "(not evaluated: the eager call failed)", results, opts)
    run = Run(make_plan(call, opts, foreign=isinstance(f, ForeignFunction)))
    for name, check in CHECK_TABLE.items():
        if opts.enabled(name):
            run.guarded(name, functools.partial(check, run))
    return run.report()
