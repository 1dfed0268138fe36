"""One `check_rules` run in progress: `Run`.

A run holds what changes while the checks execute -- the random generator, the
random directions and cotangents drawn once and shared by every check, the finite
differences computed once (along those directions, and full Jacobians), and the
results -- next to the frozen `Plan` it follows. Each check is a function of the run
(`_derivative_checks`, `_transforms`); `_checker` holds their table.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from . import _diagnose
from ._fd import Derivative, complex_step, direction, ridders
from ._flat import FlatCall, is_complex
from ._hints import guess
from ._plan import Plan
from ._report import CheckResult, RuleReport


def wide(v: Any) -> np.ndarray:
    """`v` as a NumPy array of at least float64 precision."""
    v = np.asarray(v)
    return v.astype(np.result_type(v.dtype, np.float64))


class Run:
    """The mutable half of one run; see the module docstring."""

    def __init__(self, plan: Plan):
        self.plan = plan
        self.call: FlatCall = plan.call
        self.rng = np.random.default_rng(plan.opts.seed)
        self.results: list[CheckResult] = []
        self._dirs: list[list[np.ndarray]] | None = None
        self._cts: list[list[np.ndarray]] | None = None
        self._complex_ok: dict[int, bool] = {}

    def report(self) -> RuleReport:
        return RuleReport(self.call.name, self.plan.precision, self.results, self.plan.opts)

    # ------------------------------------------------------------ results
    def add(self, name: str, status: str, arg: str | None = None, output: str | None = None,
            **kw: Any) -> None:
        self.results.append(CheckResult(name, status, arg, output, **kw))  # type: ignore[arg-type]

    def compare(self, name: str, arg: str | None, output: str | None, rule: Any, ref: Any,
                tol: Any, scale: Any, note: str = "", transposed: Any = None,
                swapped: Sequence[tuple[str, np.ndarray, np.ndarray]] = (),
                entries: bool = False) -> None:
        """Record pass/fail of |rule - ref| <= tol (elementwise; tol broadcasts). A
        reference or tolerance that is not finite fails: nothing was verified there."""
        rule, ref = np.asarray(rule), np.asarray(ref)
        if rule.shape != ref.shape:
            self.add(name, "fail", arg, output, hint=guess(rule, ref, tol), note=note)
            return
        if rule.dtype == jax.dtypes.float0 or ref.dtype == jax.dtypes.float0:
            return
        rule, ref = wide(rule), wide(ref)
        tol = np.broadcast_to(np.asarray(tol, dtype=np.float64), ref.shape)
        scale = np.broadcast_to(np.asarray(scale, dtype=np.float64), ref.shape)
        diff = np.abs(rule - ref)
        diff = np.where(np.isnan(diff), np.inf, diff)
        if diff.size == 0:
            self.add(name, "pass", arg, output, abs_err=0.0, rel_err=0.0, tol=0.0, note=note)
            return
        worst = int(np.argmax(np.where(np.isfinite(tol), diff - tol, np.inf).ravel()))
        with np.errstate(divide="ignore", invalid="ignore"):
            rel = np.where(diff == 0, 0.0, diff / scale)
        ok = bool(np.all((diff <= tol) & np.isfinite(tol) & np.isfinite(ref)))
        self.add(name, "pass" if ok else "fail", arg, output, abs_err=float(diff.max()),
                 rel_err=float(np.max(rel)), tol=float(tol.ravel()[worst]),
                 hint="" if ok else guess(rule, ref, tol, transposed, swapped, entries),
                 note=note)

    def guarded(self, name: str, fun: Callable[[], None], arg: str | None = None,
                output: str | None = None, note: str = "", record_pass: bool = False) -> bool:
        """Run `fun`; an exception becomes an "error" result of check `name`."""
        try:
            fun()
        except Exception as exc:  # noqa: BLE001 - every failure is reported
            self.add(name, "error", arg, output, hint=_diagnose.hint(exc),
                     note=(note + ": " if note else "") + _diagnose.note(exc))
            return False
        if record_pass:
            self.add(name, "pass", arg, output, note=note)
        return True

    def skip(self, name: str, reason: str) -> None:
        self.add(name, "skip", note=reason)

    def need_diff(self, name: str, mode: str | None = None) -> bool:
        """Whether check `name` can run: floating-point inputs and outputs, and the
        function's `mode` ("fwd", "rev", "both", "any"); records a skip if not."""
        if not self.call.diff:
            self.skip(name, "no floating-point inputs")
            return False
        if not self.call.dout:
            self.skip(name, "no floating-point outputs")
            return False
        if mode == "fwd" and not self.plan.fwd:
            self.skip(name, self.plan.fwd_reason)
            return False
        if mode == "rev" and not self.plan.rev:
            self.skip(name, self.plan.rev_reason)
            return False
        if mode == "both" and not (self.plan.fwd and self.plan.rev):
            self.skip(name, self.plan.fwd_reason or self.plan.rev_reason)
            return False
        if mode == "any" and not (self.plan.fwd or self.plan.rev):
            self.skip(name, self.plan.fwd_reason)
            return False
        return True

    # ------------------------------------------------------------ random draws, references
    def randn(self, like: Any, scale: float = 1.0) -> np.ndarray:
        shape, dtype = np.shape(like), np.dtype(like.dtype)
        if is_complex(dtype):
            z = (self.rng.standard_normal(shape) + 1j * self.rng.standard_normal(shape))
            z = z / np.sqrt(2)
        else:
            z = self.rng.standard_normal(shape)
        return np.asarray(z * scale).astype(dtype)

    def directions(self) -> list[list[np.ndarray]]:
        """`n_directions` sets of (one tangent per inexact input leaf), each element
        scaled to its input element's magnitude."""
        if self._dirs is None:
            self._dirs = [[direction(self.rng, s, self.plan.work[i].dtype)
                           for i, s in zip(self.call.diff, self.plan.escale)]
                          for _ in range(self.plan.opts.n_directions)]
            self._cts = [[self.randn(self.outs_work[o]) for o in range(len(self.call.dout))]
                         for _ in range(self.plan.opts.n_directions)]
        return self._dirs

    def cotangents(self) -> list[list[np.ndarray]]:
        """`n_directions` sets of (one random cotangent per inexact output leaf)."""
        self.directions()
        assert self._cts is not None
        return self._cts

    @functools.cached_property
    def outs_work(self) -> list[Any]:
        """The inexact outputs at the precision of the finite-difference checks."""
        return list(self.call.jitted["diffout"](self.plan.work))

    def fd(self, j: int, t: np.ndarray) -> Derivative:
        """Every inexact output's derivative along tangent `t` of input leaf `j`, by
        Richardson extrapolation, refined by a complex step where possible."""
        F, i = self.call.jitted["diffout"], self.call.diff[j]
        x = np.asarray(self.plan.work[i])

        def at(h: float) -> list[Any]:
            dyn = list(self.plan.work)
            dyn[i] = (x + h * t).astype(x.dtype)
            return F(dyn)

        est = ridders(at, self.plan.h0, self.plan.eps_mach, self.plan.nondet)
        return complex_step(self.complex_at(j, x, t), self.outs_work, est, self.plan.hc,
                            self.plan.eps_mach)

    def complex_at(self, j: int, x: np.ndarray, t: np.ndarray
                    ) -> Callable[[complex], list[Any]] | None:
        """``z -> f(x + z t)`` with complex inputs, or None where that is known to fail."""
        if not self.plan.opts.complex_step or is_complex(x.dtype) or \
                self._complex_ok.get(j) is False:
            return None
        F, i = self.call.jitted["diffout"], self.call.diff[j]
        cdtype = np.result_type(x.dtype, np.complex64)

        def at(z: complex) -> list[Any]:
            dyn = list(self.plan.work)
            dyn[i] = (x + z * t).astype(cdtype)
            try:
                return F(dyn)
            except Exception:
                self._complex_ok[j] = False  # don't try again for other directions
                raise

        return at

    @functools.cached_property
    def fd_dirs(self) -> list[list[Derivative]]:
        """fd_dirs[k][j]: finite differences along direction k of input leaf j."""
        return [[self.fd(j, t) for j, t in enumerate(ts)] for ts in self.directions()]

    @functools.cached_property
    def fd_jacobian(self) -> list[tuple[list[np.ndarray], list[np.ndarray]]]:
        """Per input leaf j: per output o, the matrix [out_size, in_size] and its
        elementwise error bound. Column e perturbs element e alone, by a step relative
        to its own magnitude."""
        jac = []
        for j, i in enumerate(self.call.diff):
            x = self.plan.work[i]
            scales = self.plan.escale[j].ravel()
            cols = []
            for e in range(int(np.size(x))):
                t = np.zeros(np.size(x), x.dtype)
                t[e] = scales[e]
                d = self.fd(j, t.reshape(np.shape(x)))
                cols.append([(v.ravel() / scales[e], r.ravel() / scales[e])
                             for v, r in zip(d.value, d.error)])
            mats, errs = [], []
            for o in range(len(self.call.dout)):
                size = int(np.size(self.outs_work[o]))
                mats.append(np.stack([c[o][0] for c in cols], axis=1) if cols
                            else np.zeros((size, 0)))
                errs.append(np.stack([c[o][1] for c in cols], axis=1) if cols
                            else np.zeros((size, 0)))
            jac.append((mats, errs))
        return jac
