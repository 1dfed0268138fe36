"""What one `check_rules` run will do, decided once before any check runs: `Plan`.

* which derivatives the function has (`jaxbridge._core.capabilities.Derivatives`):
  asked of the function (``f.derivatives()``) where it answers, found by trying each
  mode otherwise (``jax.custom_vjp`` / ``custom_jvp`` functions, anything built on
  jaxbridge functions);
* the precision of the finite-difference checks (float64 where the function accepts
  it), their steps and every tolerance.

A plan is frozen: the checks read it and never change it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .._core.capabilities import Derivatives, derivatives_of
from . import _diagnose
from ._fd import ULPS, element_scales
from ._flat import FlatCall, is_complex
from ._report import CheckOptions

#: The first (largest) finite-difference step, relative to each element (CheckOptions.eps).
FIRST_STEP = 0.1


def _upcast_dtype(dtype: Any) -> np.dtype:
    return np.dtype(np.complex128 if is_complex(dtype) else np.float64)


def _defaults(eps_mach: float) -> dict[str, float]:
    """Tolerances for the precision whose machine epsilon is `eps_mach`."""
    if eps_mach <= 1e-15:
        return {"rtol": 1e-6, "exact_rtol": 1e-10}
    if eps_mach <= 1e-6:
        return {"rtol": 5e-3, "exact_rtol": 1e-4}
    return {"rtol": 5e-2, "exact_rtol": 1e-2}


@dataclasses.dataclass(frozen=True, eq=False)
class Plan:
    """The decisions of one run; see the module docstring.

    Attributes:
      call: the flat view of the call, with the outputs of the eager call.
      opts: the options.
      derivatives: which modes the function has, and what computes them.
      asked: True when the function answered ``derivatives()`` (False: probed).
      fwd_reason, rev_reason: why forward / reverse mode is absent ("" when present).
      auto_second: run the Hessian check unless the options say otherwise.
      foreign: the function is a ``jb.foreign`` function (calls back into Python).
      work: the dynamic leaves at the precision of the finite-difference checks.
      precision: that precision in words, e.g. "float64 (upcast from float32)".
      eps_mach: its machine epsilon.
      rtol, atol: tolerances of the finite-difference checks.
      xrtol, xatol: of the checks without finite differences, at `work`'s precision.
      xrtol0, xatol0: the same at the original dtypes (jit, vmap, export).
      nondet: how much repeated calls may differ.
      h0: the first relative finite-difference step; hc: the complex step.
      escale: per inexact input leaf, the magnitude each element's steps are relative to.
    """

    call: FlatCall
    opts: CheckOptions
    derivatives: Derivatives
    asked: bool
    fwd_reason: str
    rev_reason: str
    auto_second: bool
    foreign: bool
    work: list
    precision: str
    eps_mach: float
    rtol: float
    atol: float
    xrtol: float
    xatol: float
    xrtol0: float
    xatol0: float
    nondet: float
    h0: float
    hc: float
    escale: tuple

    @property
    def fwd(self) -> bool:
        """The function has forward mode."""
        return self.derivatives.forward is not None

    @property
    def rev(self) -> bool:
        """The function has reverse mode."""
        return self.derivatives.reverse is not None

    def fd_tol(self, ref: np.ndarray, err: np.ndarray | float) -> np.ndarray:
        """Tolerance of a rule's value against finite-difference reference `ref` whose
        error bound is `err`: `rtol` relative to each element (so small elements are
        checked as strictly as large ones), plus `err` and `atol`."""
        return self.atol + self.rtol * np.abs(np.asarray(ref)) + err + self.nondet

    def jac_tol(self, ref: np.ndarray, err: np.ndarray) -> np.ndarray:
        """`fd_tol` for a Jacobian [out, in], plus the rounding of a correct rule: an
        entry that is small by cancellation (a DCT's cos(pi/2)) is computed to a few ulps
        of the largest entry in its row (a VJP) or column (a JVP), not of itself."""
        a = np.abs(np.asarray(ref))
        if a.size == 0:
            return self.fd_tol(ref, err)
        rows = a.max(axis=1, keepdims=True, initial=0.0)
        cols = a.max(axis=0, keepdims=True, initial=0.0)
        return self.fd_tol(ref, err) + ULPS * self.eps_mach * np.maximum(rows, cols)


def make_plan(call: FlatCall, opts: CheckOptions, foreign: bool) -> Plan:
    """Decide the modes, the precision and the tolerances of a run on `call`."""
    asked = derivatives_of(call.f)
    if asked is not None:
        d = asked
        says = f"{call.name}.derivatives() says so" + (f": {d.missing}" if d.missing else "")
        fwd_reason = "" if d.forward else f"no forward rule ({says})"
        rev_reason = "" if d.reverse else f"no reverse rule ({says})"
    else:
        d, fwd_reason, rev_reason = _probe(call)
    return Plan(call=call, opts=opts, derivatives=d, asked=asked is not None,
                fwd_reason=fwd_reason, rev_reason=rev_reason,
                auto_second=asked is not None and d.second_order, foreign=foreign,
                **_precision(call, opts, rev=d.reverse is not None))


def _probe(call: FlatCall) -> tuple[Derivatives, str, str]:
    """Try forward and reverse mode on the function; what raises "no such rule"
    (or, in forward mode, runs a ``jax.custom_vjp``) is absent."""
    fwd_reason = rev_reason = ""
    if call.diff and call.dout:
        tans = [jnp.zeros_like(call.dyn[i]) for i in call.diff]
        try:
            call.jitted["jvp_all"](call.dyn, tans)
        except Exception as exc:  # noqa: BLE001
            if _diagnose.is_missing_rule(exc):
                fwd_reason = f"no forward rule ({_diagnose.note(exc)})"
            elif _diagnose.has_custom_vjp(call.diffout, call.dyn):
                fwd_reason = ("no forward rule (the function uses jax.custom_vjp, which JAX "
                              "cannot differentiate in forward mode)")
        cts = [jnp.zeros_like(call.outs[o]) for o in call.dout]
        try:
            call.jitted["vjp_all"](call.dyn, cts)
        except Exception as exc:  # noqa: BLE001 - anything else: the checks report it
            if _diagnose.is_missing_rule(exc):
                rev_reason = f"no reverse rule ({_diagnose.note(exc)})"
    found = Derivatives(forward=None if fwd_reason else "found by trying jax.jvp",
                        reverse=None if rev_reason else "found by trying jax.vjp")
    return found, fwd_reason, rev_reason


def _precision(call: FlatCall, opts: CheckOptions, rev: bool) -> dict[str, Any]:
    """The dtype of the finite-difference checks, their steps and tolerances."""
    dyn, diff = call.dyn, call.diff
    work = list(dyn)
    low = [i for i in diff if np.dtype(dyn[i].dtype).itemsize * (
        0.5 if is_complex(dyn[i].dtype) else 1) < 8]
    note = ""
    if low and opts.upcast and bool(jax.config.read("jax_enable_x64")):
        up = list(dyn)
        for i in diff:
            up[i] = dyn[i].astype(_upcast_dtype(dyn[i].dtype))
        try:
            outs = call.jitted["diffout"](up)
            if all(_upcast_dtype(o.dtype) == o.dtype for o in outs):
                if rev:
                    call.jitted["vjp_all"](up, [jnp.zeros_like(o) for o in outs])
                work = up
                note = " (upcast from " + ", ".join(sorted(
                    {np.dtype(dyn[i].dtype).name for i in low})) + ")"
            else:
                note = " (native: the function does not return float64 for float64 inputs)"
        except Exception:  # noqa: BLE001 - the function only supports its own dtype
            note = " (native: the function does not accept float64 inputs)"
    dtypes = [np.dtype(work[i].dtype) for i in diff]
    try:
        dtypes += [np.dtype(o.dtype) for o in call.jitted["diffout"](work)]
    except Exception:  # noqa: BLE001 - reported by the checks themselves
        dtypes += [np.dtype(call.outs[o].dtype) for o in call.dout]
    eps_mach = max([float(jnp.finfo(d).eps) for d in dtypes] or [np.finfo(np.float64).eps])
    d = _defaults(eps_mach)
    xrtol = opts.exact_rtol if opts.exact_rtol is not None else d["exact_rtol"]
    worst = max(dtypes, key=lambda t: float(jnp.finfo(t).eps)) if dtypes else "float64"
    # Exact tolerances of checks run at the original dtypes (jit, vmap).
    orig = [np.dtype(dyn[i].dtype) for i in diff] + [np.dtype(call.outs[o].dtype)
                                                       for o in call.dout]
    d0 = _defaults(max([float(jnp.finfo(t).eps) for t in orig] or [1e-16]))
    xrtol0 = opts.exact_rtol if opts.exact_rtol is not None else d0["exact_rtol"]
    return {
        "work": work,
        "precision": np.dtype(worst).name + note,
        "eps_mach": eps_mach,
        "rtol": opts.rtol if opts.rtol is not None else d["rtol"],
        "atol": opts.atol if opts.atol is not None else 0.0,
        "xrtol": xrtol,
        "xatol": opts.exact_atol if opts.exact_atol is not None else xrtol * 1e-3,
        "xrtol0": xrtol0,
        "xatol0": opts.exact_atol if opts.exact_atol is not None else xrtol0 * 1e-3,
        "nondet": float(opts.nondet_tol),
        "h0": opts.eps if opts.eps is not None else FIRST_STEP,
        # A complex step has no cancellation: any tiny step will do.
        "hc": 1e-20 if eps_mach < 1e-10 else 1e-10,
        # Finite-difference steps are relative to each element (see _fd.element_scales).
        "escale": tuple(element_scales(np.asarray(work[i])) for i in diff),
    }
