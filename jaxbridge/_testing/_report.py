"""Options, per-check results, the report and the failure message of
`jaxbridge.testing.check_rules` (its exception is `jaxbridge.errors.RuleCheckError`)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Collection, Mapping
from typing import Any, Literal

#: Every check `check_rules` knows, in the order it runs them.
CHECKS: tuple[str, ...] = (
    "output_shapes",        # jax.eval_shape (declared) vs an eager call (actual)
    "cotangent_shapes",     # jax.vjp cotangents vs the inputs' structure/shapes/dtypes
    "tangent_shapes",       # jax.jvp output tangents vs the outputs
    "integer_inputs",       # int/bool inputs get float0 (or zero) cotangents, no crash
    "vjp_fd",               # VJP vs finite differences along random directions
    "jvp_fd",               # JVP vs finite differences along random directions
    "vjp_jacobian",         # full Jacobian from the VJP vs finite differences (small inputs)
    "jvp_jacobian",         # full Jacobian from the JVP vs finite differences (small inputs)
    "jvp_vjp_consistency",  # <ct, J t> == <J^T ct, t>, to near machine precision
    "symbolic_zeros",       # rules with unperturbed inputs / zero output cotangents
    "jit",                  # eager vs jax.jit: values and gradients
    "primal_values",        # jax.vjp / jax.jvp outputs vs the plain call (residual forwards)
    "vmap",                 # jax.vmap vs a loop: values, vjp (and jvp)
    "batched_grad",         # vmap of the rules over cotangents/tangents alone vs a loop
    "deterministic",        # the same call twice gives the same values and derivatives
    "no_retrace",           # a second eager call with equal shapes compiles nothing
    "export",               # jax.export round trip of programs calling FFI kernels
    "second_order",         # Hessian-vector products vs finite differences of the gradient
    "inputs_unchanged",     # no call wrote into its inputs' buffers
    "derivatives_checked",  # every derivative the function has was checked by a check above
)

#: The checks that compare derivative values with a reference, by mode.
REVERSE_CHECKS = ("vjp_fd", "vjp_jacobian", "jvp_vjp_consistency")
FORWARD_CHECKS = ("jvp_fd", "jvp_jacobian", "jvp_vjp_consistency")

Status = Literal["pass", "fail", "error", "skip"]


@dataclasses.dataclass(frozen=True)
class CheckOptions:
    """Settings of :func:`jaxbridge.testing.check_rules` (pass as ``check_options=``).

    Attributes:
      checks: run only these checks (names from ``jaxbridge.testing.CHECKS``); None = all.
      skip: checks not to run.
      rtol, atol: tolerances of the finite-difference checks (``*_fd``, ``*_jacobian``,
        ``second_order``): an element passes when ``|rule - fd| <= atol + rtol * |fd| +
        bound``, where ``bound`` is the finite differences' own error bound, estimated
        per element (so small elements are checked as strictly as large ones, and a
        reference that could not be computed accurately never fails a rule). Default:
        rtol 1e-6 when evaluating in float64, 5e-3 in float32, 5e-2 in 16-bit; atol 0.
        The ``vjp_fd`` check compares sums ``<vjp(ct), t>``: there rtol is relative to
        the sum of the magnitudes of their terms.
      exact_rtol, exact_atol: tolerances of the checks that involve no finite differences
        (``jvp_vjp_consistency``, ``jit``, ``vmap``, ``batched_grad``, ``export``, zero
        results). Default: rtol 1e-10 in float64, 1e-4 in float32, 1e-2 in 16-bit;
        atol = exact_rtol * 1e-3.
      nondet_tol: how much repeated calls with identical inputs may differ (absolute),
        for rules that are nondeterministic on purpose (atomics, randomized solvers).
        Default 0: they must agree exactly. It widens every other tolerance by as much.
      seed: seed of the random directions, cotangents and batch perturbations.
      n_directions: random directions per (argument, output) pair.
      eps: the first (largest) finite-difference step, relative to each input element's
        magnitude (see below); Richardson extrapolation halves it up to 11 times and
        keeps the most accurate estimate per output element. Default 0.1.
      complex_step: refine the finite differences with a complex step where the
        function accepts complex inputs and agrees with them (default True).
      second_order: True/False forces the Hessian check on/off; None (default) runs it
        for functions that say they have second derivatives (``f.derivatives()``:
        foreign functions whose rules all have ``kind="jax"``, linear functions and
        kernels with a transpose).
      export: True/False forces the ``jax.export`` round trip on/off; None (default)
        runs it when the program calls FFI kernels and no host (Python) function.
      jacobian_max_size: the full-Jacobian checks run when the differentiable inputs have
        at most this many elements in total (and the outputs at most 4x as many).
      batch_size: number of perturbed copies stacked for the vmap checks.
      upcast: evaluate the finite-difference checks in float64 when the function accepts
        float64 inputs (default True; needs ``jax_enable_x64``).
      guard_outputs: every ``jb.kernel`` traced during the run guards its outputs
        (``jaxbridge.kernel(..., guard_outputs=True)``): a handler that writes outside an
        output or residual fails the check that ran it, with the kernel, target and
        output named, instead of corrupting memory (default True; functions jitted
        before the run are traced again for it, and its guarded programs are not
        reused after it).

    Finite-difference steps are per element: element i of an input moves by at most
    ``eps * |x_i|`` (elements that are zero, or negligible next to the largest, move
    relative to the smallest non-negligible magnitude instead), so inputs that span
    orders of magnitude are differentiated accurately everywhere.

    Example:
        >>> CheckOptions(n_directions=5, seed=1, skip=("export",)).enabled("export")
        False
    """

    checks: Collection[str] | None = None
    skip: Collection[str] = ()
    rtol: float | None = None
    atol: float | None = None
    exact_rtol: float | None = None
    exact_atol: float | None = None
    seed: int = 0
    n_directions: int = 3
    nondet_tol: float = 0.0
    eps: float | None = None
    complex_step: bool = True
    second_order: bool | None = None
    export: bool | None = None
    jacobian_max_size: int = 50
    batch_size: int = 3
    upcast: bool = True
    guard_outputs: bool = True

    def __post_init__(self) -> None:
        unknown = set(self.checks or ()) | set(self.skip)
        unknown -= set(CHECKS)
        if unknown:
            raise ValueError(f"jaxbridge.testing: unknown check name(s) {sorted(unknown)}; "
                             f"known: {', '.join(CHECKS)}")
        if self.n_directions < 1 or self.batch_size < 1:
            raise ValueError("jaxbridge.testing: n_directions and batch_size must be >= 1")
        if not self.nondet_tol >= 0:
            raise ValueError(f"jaxbridge.testing: nondet_tol must be >= 0, got {self.nondet_tol}")
        if self.eps is not None and not 0 < self.eps < 1:
            raise ValueError(f"jaxbridge.testing: eps (the first relative step) must be in "
                             f"(0, 1), got {self.eps}")

    def enabled(self, name: str) -> bool:
        """Whether check `name` is selected by `checks` and `skip`."""
        return (self.checks is None or name in self.checks) and name not in self.skip

    @classmethod
    def coerce(cls, value: CheckOptions | Mapping[str, Any] | None) -> CheckOptions:
        """Accept a CheckOptions, a dict of its fields, or None (defaults)."""
        if value is None:
            return cls()
        if isinstance(value, cls):
            return value
        if isinstance(value, Mapping):
            return cls(**value)
        raise TypeError(f"jaxbridge.testing: check_options must be a CheckOptions or a dict, "
                        f"got {type(value).__name__}")


@dataclasses.dataclass(frozen=True)
class CheckResult:
    """The outcome of one check on one (argument, output) pair.

    Attributes:
      name: the check (one of ``CHECKS``).
      status: "pass", "fail" (measured error above tolerance), "error" (something
        raised), or "skip".
      arg: the input it concerns, as a path such as ``"b"`` or ``"params['w']"``
        (``"*"`` for all of them; None when not applicable).
      output: the output it concerns, e.g. ``"out"`` or ``"out[1]"``.
      abs_err, rel_err: the largest absolute / relative error measured (None if none).
      tol: the absolute tolerance the worst error was compared with.
      hint: a guess at the bug ("sign flipped", "cotangent looks transposed", "off by a
        constant factor ~2", "wrong shape", ...), or "".
      note: what exactly was compared, why it was skipped, or the exception raised.
    """

    name: str
    status: Status
    arg: str | None = None
    output: str | None = None
    abs_err: float | None = None
    rel_err: float | None = None
    tol: float | None = None
    hint: str = ""
    note: str = ""

    @property
    def ok(self) -> bool:
        """True unless the check failed or raised."""
        return self.status in ("pass", "skip")

    def describe(self) -> str:
        """One line: name, where, errors, tolerance, hint and note."""
        where = ", ".join(p for p in (
            None if self.arg is None else f"arg {self.arg}",
            None if self.output is None else f"output {self.output}") if p)
        parts = [f"{self.status.upper():5s} {self.name}" + (f" [{where}]" if where else "")]
        if self.abs_err is not None:
            parts.append(f"max abs err {_num(self.abs_err)}, max rel err {_num(self.rel_err)}, "
                         f"tol {_num(self.tol)}")
        if self.hint:
            parts.append(f"hint: {self.hint}")
        if self.note:
            parts.append(self.note)
        return " -- ".join(parts)


def _num(x: float | None) -> str:
    if x is None:
        return "-"
    if isinstance(x, float) and math.isnan(x):
        return "nan"
    return f"{x:.1e}"


@dataclasses.dataclass
class RuleReport:
    """What :func:`jaxbridge.testing.check_rules` found; ``str(report)`` is a table.

    Attributes:
      function: the checked function's name.
      precision: the dtype the finite-difference checks were evaluated in, e.g.
        ``"float64"`` or ``"float64 (upcast from float32)"``.
      results: one :class:`CheckResult` per check and (argument, output) pair.
      options: the options used.
    """

    function: str
    precision: str
    results: list[CheckResult]
    options: CheckOptions

    @property
    def passed(self) -> bool:
        """True when nothing failed or raised."""
        return all(r.ok for r in self.results)

    @property
    def failures(self) -> list[CheckResult]:
        """The results with status "fail" or "error"."""
        return [r for r in self.results if not r.ok]

    @property
    def skipped(self) -> list[CheckResult]:
        """The results with status "skip"."""
        return [r for r in self.results if r.status == "skip"]

    def by_name(self, name: str) -> list[CheckResult]:
        """The results of check `name`."""
        return [r for r in self.results if r.name == name]

    def summary(self) -> dict[str, str]:
        """Per check name: "pass", "fail", "error" or "skip" (the worst of its rows)."""
        order = {"error": 3, "fail": 2, "pass": 1, "skip": 0}
        out: dict[str, str] = {}
        for r in self.results:
            if r.name not in out or order[r.status] > order[out[r.name]]:
                out[r.name] = r.status
        return out

    def __str__(self) -> str:
        head = ("check", "status", "arg", "output", "abs err", "rel err", "tol", "hint / note")
        rows = [head]
        for r in self.results:
            extra = "; ".join(s for s in (r.hint, r.note) if s)
            rows.append((r.name, r.status, r.arg or "", r.output or "",
                         "" if r.abs_err is None else _num(r.abs_err),
                         "" if r.rel_err is None else _num(r.rel_err),
                         "" if r.tol is None else _num(r.tol),
                         extra if len(extra) <= 90 else extra[:87] + "..."))
        widths = [max(len(row[i]) for row in rows) for i in range(len(head) - 1)]
        lines = []
        for k, row in enumerate(rows):
            cells = [c.ljust(w) for c, w in zip(row[:-1], widths)] + [row[-1]]
            lines.append("  ".join(cells).rstrip())
            if k == 0:
                lines.append("  ".join("-" * w for w in widths) + "  " + "-" * 11)
        n_fail = len(self.failures)
        verdict = "all checks passed" if not n_fail else f"{n_fail} FAILED"
        counts = {s: sum(r.status == s for r in self.results)
                  for s in ("pass", "fail", "error", "skip")}
        title = (f"check_rules({self.function}) in {self.precision}: {verdict} "
                 f"({counts['pass']} passed, {counts['fail']} failed, {counts['error']} "
                 f"errors, {counts['skip']} skipped)")
        return "\n".join([title, *lines])


def failure_message(report: RuleReport) -> str:
    """The message of the `RuleCheckError` for `report`: one line per failure (an
    exception seen again is named once)."""
    failures = report.failures
    lines = [f"check_rules({report.function}): {len(failures)} of {len(report.results)} "
             f"checks failed (evaluated in {report.precision}):"]
    seen: dict[str, str] = {}
    for r in failures:
        if r.status == "error" and r.note:
            key = r.note.split("raised ", 1)[-1]
            if key in seen:  # the same exception again: name it once
                where = r.describe().split(" -- ")[0]
                lines.append(f"  {where} -- the same error as {seen[key]}")
                continue
            seen[key] = r.name
        lines.append(f"  {r.describe()}")
    lines.append("(the full table is str(err.report))")
    return "\n".join(lines)
