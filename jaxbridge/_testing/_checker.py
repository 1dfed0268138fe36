"""The checks behind `jaxbridge.testing.check_rules`.

Everything works on the *flat* view of a call: the positional arguments are flattened
to leaves; array leaves are "dynamic" (inexact ones are differentiated, integer and
boolean ones are held fixed), other leaves are static. Outputs are flattened the same
way. Each check compares what JAX computes with the user's rules against an
independent reference (finite differences, the other rule, an eager loop) and records
one `CheckResult` per (argument leaf, output leaf) pair.

This module holds the set-up and the derivative checks; `_transforms` holds the
checks of transformations (jit, vmap, export, ...), as functions of the `_Checker`;
`_fd` the finite differences.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .. import ForeignFunction
from .._core.capabilities import Derivatives, derivatives_of
from . import _diagnose, _transforms
from ._fd import ULPS, Derivative, complex_step, direction, element_scales, ridders
from ._report import (
    CHECKS,
    FORWARD_CHECKS,
    REVERSE_CHECKS,
    CheckOptions,
    CheckResult,
    RuleReport,
)

_PY_NUMBERS = (bool, int, float, complex)


def _is_array(x: Any) -> bool:
    return isinstance(x, (jax.Array, np.ndarray, np.generic, *_PY_NUMBERS)) or \
        hasattr(x, "__jax_array__")


def _inexact(dtype: Any) -> bool:
    return jnp.issubdtype(dtype, jnp.inexact)


def _complex(dtype: Any) -> bool:
    return jnp.issubdtype(dtype, jnp.complexfloating)


def _upcast_dtype(dtype: Any) -> np.dtype:
    return np.dtype(np.complex128 if _complex(dtype) else np.float64)


def _defaults(eps_mach: float) -> dict[str, float]:
    """Tolerances for the precision whose machine epsilon is `eps_mach`."""
    if eps_mach <= 1e-15:
        return {"rtol": 1e-6, "exact_rtol": 1e-10}
    if eps_mach <= 1e-6:
        return {"rtol": 5e-3, "exact_rtol": 1e-4}
    return {"rtol": 5e-2, "exact_rtol": 1e-2}


#: The first (largest) finite-difference step, relative to each element (CheckOptions.eps).
FIRST_STEP = 0.1


def _wide(v: Any) -> np.ndarray:
    v = np.asarray(v)
    return v.astype(np.result_type(v.dtype, np.float64))


def _pair(a: Any, b: Any) -> float:
    """JAX's (bilinear) pairing of tangents and cotangents: Re(sum(a * b))."""
    return float(np.real(np.sum(_wide(a) * _wide(b))))


def _abs_pair(a: Any, b: Any) -> float:
    return float(np.sum(np.abs(_wide(a)) * np.abs(_wide(b))))


def _dtype_name(dtype: Any) -> str:
    dtype = np.dtype(dtype)
    return "float0" if dtype == jax.dtypes.float0 else dtype.name


#: Hints of `_hint`, by the bug they name (the mutation tests look for these words).
HINTS = {
    "sign": "sign flipped (rule ~ -reference)",
    "transposed": "cotangent looks transposed",
    "jacobian_transposed": "Jacobian looks transposed (a matrix used where its transpose "
                           "belongs?)",
    "zeros": "rule returns zeros (does it ignore this input?)",
    "dropped": "wrong in {bad} of {n} entries, right in the others (a dropped term?)",
    "operator": "wrong in every entry, not by a sign, scale, transpose or swap (the "
                "derivative or transpose of another operator?)",
}


def _hint(rule: np.ndarray, ref: np.ndarray, tol: np.ndarray | float,
          transposed: np.ndarray | None = None,
          swapped: Sequence[tuple[str, np.ndarray, np.ndarray]] = (),
          entries: bool = False) -> str:
    """A cheap guess at what is wrong when `rule` (what the rule gave) != `ref`.

    `transposed`: what the rule's result would be if it were transposed; `swapped`:
    (label, reference, tolerance) of the other inputs of the same shape (a rule that
    swapped two arguments matches one of them); `entries`: `rule` and `ref` are the
    entries of a Jacobian, so a rule right in some entries and wrong in others is told
    apart from one wrong everywhere."""
    if rule.shape != ref.shape:
        return f"wrong shape: got {list(rule.shape)}, expected {list(ref.shape)}"
    if not np.all(np.isfinite(rule)):
        return "non-finite values"
    if not np.all(np.isfinite(ref)) or not np.all(np.isfinite(tol)):
        return ("no finite-difference estimate: the function is not finite (or not "
                "smooth) near these inputs")
    big = np.abs(ref) > 1e-3 * np.max(np.abs(ref), initial=0.0)
    if not big.any():
        return "rule is non-zero where the reference is zero"
    if np.all(np.abs(rule + ref) <= tol):
        return HINTS["sign"]
    if transposed is not None and np.all(np.abs(transposed - ref) <= tol):
        return HINTS["transposed"]
    if entries and ref.ndim == 2 and ref.shape[0] == ref.shape[1] > 1 and \
            np.all(np.abs(rule.T - ref) <= tol):
        return HINTS["jacobian_transposed"]
    for label, other, other_tol in swapped:
        if other.shape == rule.shape and np.any(other != 0) and \
                np.all(np.abs(rule - other) <= other_tol):
            return f"looks like the derivative with respect to {label} (arguments swapped?)"
    if np.all(rule == 0):
        return HINTS["zeros"]
    k = np.median((rule[big] / ref[big]).real)
    if np.isfinite(k) and abs(k - 1) > 1e-3 and k != 0 and \
            np.all(np.abs(rule - k * ref) <= np.asarray(tol) * max(1.0, abs(k)) * 10):
        return f"off by a constant factor ~{k:.3g}"
    if np.iscomplexobj(rule) and np.all(np.abs(rule - np.conj(ref)) <= tol):
        return "looks complex-conjugated"
    if entries:
        good = np.abs(rule - ref) <= np.broadcast_to(tol, ref.shape)
        if good[big].any():
            return HINTS["dropped"].format(bad=int(np.sum(~good)), n=good.size)
        return HINTS["operator"]
    return ""


class _Checker:
    """One `check_rules` run: the flat view of the call plus every check."""

    def __init__(self, f: Callable[..., Any], args: tuple, static: dict, opts: CheckOptions):
        self.f, self.static, self.opts = f, static, opts
        self.name = getattr(f, "__name__", None) or type(f).__name__
        self.foreign = isinstance(f, ForeignFunction)
        self.rng = np.random.default_rng(opts.seed)
        self.results: list[CheckResult] = []
        self.x64 = bool(jax.config.read("jax_enable_x64"))

        # ---- inputs: flat leaves with readable paths ----
        leaves, self.treedef = jax.tree_util.tree_flatten_with_path(tuple(args))
        names = self._arg_names(len(args))
        self.leaves: list[Any] = []
        self.dyn_pos: list[int] = []       # index into self.leaves of each dynamic leaf
        self.labels: list[str] = []        # per dynamic leaf
        self.arg_of: list[int] = []        # positional argument of each dynamic leaf
        for k, (path, leaf) in enumerate(leaves):
            if _is_array(leaf):
                leaf = jnp.asarray(leaf)
                self.dyn_pos.append(k)
                self.labels.append(names[path[0].idx] + jax.tree_util.keystr(path[1:]))
                self.arg_of.append(path[0].idx)
            self.leaves.append(leaf)
        self.n_args = len(args)
        self.arg_names = names
        self.dyn = [self.leaves[k] for k in self.dyn_pos]
        self.diff = [i for i, x in enumerate(self.dyn) if _inexact(x.dtype)]   # dyn indices
        self.ints = [i for i, x in enumerate(self.dyn) if not _inexact(x.dtype)]
        # What the inputs held before any call (see check_inputs_unchanged).
        self.snapshot = [np.array(x, copy=True) for x in self.dyn]
        self._complex_ok: dict[int, bool] = {}

    def _arg_names(self, n: int) -> list[str]:
        declared = getattr(self.f, "arg_names", None)  # e.g. a kernel's arg_names=
        if isinstance(declared, (tuple, list)) and len(declared) >= n and \
                all(isinstance(a, str) for a in declared):
            return list(declared[:n])
        try:
            params = list(inspect.signature(self.f).parameters.values())
        except (TypeError, ValueError):
            params = []
        names = []
        for i in range(n):
            if i < len(params) and params[i].kind in (inspect.Parameter.POSITIONAL_ONLY,
                                                      inspect.Parameter.POSITIONAL_OR_KEYWORD):
                names.append(params[i].name)
            elif n == 1:
                names.append("x")
            else:
                names.append(f"args[{i}]")
        return names

    # ------------------------------------------------------------ flat functions
    def call_dyn(self, dyn: Sequence[Any]) -> list[Any]:
        """All output leaves of `f` at dynamic leaves `dyn`."""
        leaves = list(self.leaves)
        for k, x in zip(self.dyn_pos, dyn):
            leaves[k] = x
        args = jax.tree_util.tree_unflatten(self.treedef, leaves)
        return jax.tree_util.tree_leaves(self.f(*args, **self.static))

    def diffout(self, dyn: Sequence[Any]) -> list[Any]:
        """The inexact output leaves."""
        outs = self.call_dyn(dyn)
        return [outs[o] for o in self.dout]

    def _merge(self, diff_leaves: Sequence[Any], dyn: Sequence[Any]) -> list[Any]:
        full = list(dyn)
        for i, x in zip(self.diff, diff_leaves):
            full[i] = x
        return full

    def vjp_all(self, dyn: Sequence[Any], cts: Sequence[Any]) -> list[Any]:
        """Cotangents of the inexact inputs for cotangents `cts` of the inexact outputs."""
        _, pull = jax.vjp(lambda d: self.diffout(self._merge(d, dyn)),
                          [dyn[i] for i in self.diff])
        return pull(list(cts))[0]

    def jvp_all(self, dyn: Sequence[Any], tans: Sequence[Any]) -> list[Any]:
        """Tangents of the inexact outputs for tangents `tans` of the inexact inputs."""
        return jax.jvp(lambda d: self.diffout(self._merge(d, dyn)),
                       ([dyn[i] for i in self.diff],), (list(tans),))[1]

    def jvp_leaf(self, j: int, dyn: Sequence[Any], t: Any) -> list[Any]:
        """JVP with a tangent on inexact input leaf `j` only (the others: symbolic zeros)."""
        def g(x):
            full = list(dyn)
            full[self.diff[j]] = x
            return self.diffout(full)
        return jax.jvp(g, (dyn[self.diff[j]],), (t,))[1]

    def vjp_out(self, o: int, dyn: Sequence[Any], ct: Any) -> list[Any]:
        """VJP of inexact output `o` alone (the others' cotangents: symbolic zeros)."""
        _, pull = jax.vjp(lambda d: self.diffout(self._merge(d, dyn))[o],
                          [dyn[i] for i in self.diff])
        return pull(ct)[0]

    @functools.cached_property
    def jitted(self) -> dict[str, Callable[..., Any]]:
        return {
            "f": jax.jit(self.call_dyn),
            "diffout": jax.jit(self.diffout),
            "vjp_all": jax.jit(self.vjp_all),
            "jvp_all": jax.jit(self.jvp_all),
            "jvp_leaf": jax.jit(self.jvp_leaf, static_argnums=0),
            "vjp_out": jax.jit(self.vjp_out, static_argnums=0),
        }

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
            self.add(name, "fail", arg, output, hint=_hint(rule, ref, tol), note=note)
            return
        if rule.dtype == jax.dtypes.float0 or ref.dtype == jax.dtypes.float0:
            return
        rule, ref = _wide(rule), _wide(ref)
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
                 hint="" if ok else _hint(rule, ref, tol, transposed, swapped, entries),
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

    def want(self, name: str) -> bool:
        return self.opts.enabled(name)

    # ------------------------------------------------------------ the run
    def run(self) -> RuleReport:
        opts = self.opts
        # The primal call: everything else depends on it.
        try:
            out = self.f(*jax.tree_util.tree_unflatten(self.treedef, self.leaves), **self.static)
            self.out_paths = [jax.tree_util.keystr(p)
                              for p, _ in jax.tree_util.tree_flatten_with_path(out)[0]]
            self.outs = [jnp.asarray(o) for o in jax.tree_util.tree_leaves(out)]
            self.out_tree = jax.tree_util.tree_structure(out)
        except Exception as exc:  # noqa: BLE001
            self.add("output_shapes", "error", hint=_diagnose.hint(exc),
                     note="the eager call " + _diagnose.note(exc))
            for name in CHECKS[1:]:
                if self.want(name):
                    self.skip(name, "the eager call failed")
            return self.report("(not evaluated: the eager call failed)")
        self.out_labels = ["out" + p for p in self.out_paths]
        self.dout = [o for o, x in enumerate(self.outs) if _inexact(x.dtype)]
        self._modes()
        self._precision()

        steps: dict[str, Callable[[], None]] = {
            "output_shapes": self.check_output_shapes,
            "cotangent_shapes": self.check_cotangent_shapes,
            "tangent_shapes": self.check_tangent_shapes,
            "integer_inputs": self.check_integer_inputs,
            "vjp_fd": self.check_vjp_fd,
            "jvp_fd": self.check_jvp_fd,
            "vjp_jacobian": self.check_vjp_jacobian,
            "jvp_jacobian": self.check_jvp_jacobian,
            "jvp_vjp_consistency": self.check_consistency,
            "symbolic_zeros": self.check_symbolic_zeros,
            "jit": functools.partial(_transforms.check_jit, self),
            "vmap": functools.partial(_transforms.check_vmap, self),
            "batched_grad": functools.partial(_transforms.check_batched_grad, self),
            "deterministic": functools.partial(_transforms.check_deterministic, self),
            "no_retrace": functools.partial(_transforms.check_no_retrace, self),
            "export": functools.partial(_transforms.check_export, self),
            "second_order": self.check_second_order,
            "inputs_unchanged": functools.partial(_transforms.check_inputs_unchanged, self),
            "derivatives_checked": self.check_derivatives_checked,
        }
        assert tuple(steps) == CHECKS
        for name, step in steps.items():
            if opts.enabled(name):
                self.guarded(name, step)
        return self.report(self.precision)

    def report(self, precision: str) -> RuleReport:
        return RuleReport(self.name, precision, self.results, self.opts)

    # ------------------------------------------------------------ setup
    def _modes(self) -> None:
        """Which of forward / reverse mode the function supports: asked of the function
        (`derivatives()`, see `jaxbridge._core.capabilities`) where it can answer,
        found by trying otherwise (plain ``jax.custom_vjp`` / ``custom_jvp`` functions
        and anything built on jaxbridge functions)."""
        asked = derivatives_of(self.f)
        self.asked = asked is not None
        self.derivatives = asked if asked is not None else self._probe()
        d = self.derivatives
        if asked is not None:
            says = f"{self.name}.derivatives() says so" + (f": {d.missing}" if d.missing else "")
            self.fwd_reason = "" if d.forward else f"no forward rule ({says})"
            self.rev_reason = "" if d.reverse else f"no reverse rule ({says})"
        self.auto_second = self.asked and d.second_order
        self.fwd = d.forward is not None
        self.rev = d.reverse is not None

    def _probe(self) -> Derivatives:
        """Try forward and reverse mode on the function; what raises "no such rule"
        (or, in forward mode, runs a ``jax.custom_vjp``) is absent."""
        self.fwd_reason = self.rev_reason = ""
        if self.diff and self.dout:
            tans = [jnp.zeros_like(self.dyn[i]) for i in self.diff]
            try:
                self.jitted["jvp_all"](self.dyn, tans)
            except Exception as exc:  # noqa: BLE001
                if _diagnose.is_missing_rule(exc):
                    self.fwd_reason = f"no forward rule ({_diagnose.note(exc)})"
                elif _diagnose.has_custom_vjp(self.diffout, self.dyn):
                    self.fwd_reason = ("no forward rule (the function uses jax.custom_vjp, "
                                       "which JAX cannot differentiate in forward mode)")
            cts = [jnp.zeros_like(self.outs[o]) for o in self.dout]
            try:
                self.jitted["vjp_all"](self.dyn, cts)
            except Exception as exc:  # noqa: BLE001 - anything else: the checks report it
                if _diagnose.is_missing_rule(exc):
                    self.rev_reason = f"no reverse rule ({_diagnose.note(exc)})"
        return Derivatives(forward=None if self.fwd_reason else "found by trying jax.jvp",
                           reverse=None if self.rev_reason else "found by trying jax.vjp")

    def _precision(self) -> None:
        """Pick the dtype of the finite-difference checks, their steps and tolerances."""
        opts = self.opts
        self.work = list(self.dyn)
        low = [i for i in self.diff if np.dtype(self.dyn[i].dtype).itemsize * (
            0.5 if _complex(self.dyn[i].dtype) else 1) < 8]
        note = ""
        if low and opts.upcast and self.x64:
            up = list(self.dyn)
            for i in self.diff:
                up[i] = self.dyn[i].astype(_upcast_dtype(self.dyn[i].dtype))
            try:
                outs = self.jitted["diffout"](up)
                if all(_upcast_dtype(o.dtype) == o.dtype for o in outs):
                    if self.rev:
                        self.jitted["vjp_all"](up, [jnp.zeros_like(o) for o in outs])
                    self.work = up
                    note = " (upcast from " + ", ".join(sorted(
                        {np.dtype(self.dyn[i].dtype).name for i in low})) + ")"
                else:
                    note = " (native: the function does not return float64 for float64 inputs)"
            except Exception:  # noqa: BLE001 - the function only supports its own dtype
                note = " (native: the function does not accept float64 inputs)"
        dtypes = [np.dtype(self.work[i].dtype) for i in self.diff]
        try:
            dtypes += [np.dtype(o.dtype) for o in self.jitted["diffout"](self.work)]
        except Exception:  # noqa: BLE001 - reported by the checks themselves
            dtypes += [np.dtype(self.outs[o].dtype) for o in self.dout]
        eps_mach = max([float(jnp.finfo(d).eps) for d in dtypes] or [np.finfo(np.float64).eps])
        self.eps_mach = eps_mach
        d = _defaults(eps_mach)
        self.rtol = opts.rtol if opts.rtol is not None else d["rtol"]
        self.atol = opts.atol if opts.atol is not None else 0.0
        self.xrtol = opts.exact_rtol if opts.exact_rtol is not None else d["exact_rtol"]
        self.xatol = opts.exact_atol if opts.exact_atol is not None else self.xrtol * 1e-3
        self.nondet = float(opts.nondet_tol)
        self.h0 = opts.eps if opts.eps is not None else FIRST_STEP
        # A complex step has no cancellation: any tiny step will do.
        self.hc = 1e-20 if eps_mach < 1e-10 else 1e-10
        worst = max(dtypes, key=lambda t: float(jnp.finfo(t).eps)) if dtypes else "float64"
        self.precision = np.dtype(worst).name + note
        # Exact tolerances of checks run at the original dtypes (jit, vmap).
        orig = [np.dtype(self.dyn[i].dtype) for i in self.diff] + \
               [np.dtype(self.outs[o].dtype) for o in self.dout]
        d0 = _defaults(max([float(jnp.finfo(t).eps) for t in orig] or [1e-16]))
        self.xrtol0 = opts.exact_rtol if opts.exact_rtol is not None else d0["exact_rtol"]
        self.xatol0 = opts.exact_atol if opts.exact_atol is not None else self.xrtol0 * 1e-3
        # Finite-difference steps are relative to each element (see _fd.element_scales).
        self.escale = [element_scales(np.asarray(self.work[i])) for i in self.diff]

    def randn(self, like: Any, scale: float = 1.0) -> np.ndarray:
        shape, dtype = np.shape(like), np.dtype(like.dtype)
        if _complex(dtype):
            z = (self.rng.standard_normal(shape) + 1j * self.rng.standard_normal(shape))
            z = z / np.sqrt(2)
        else:
            z = self.rng.standard_normal(shape)
        return np.asarray(z * scale).astype(dtype)

    def directions(self) -> list[list[np.ndarray]]:
        """`n_directions` sets of (one tangent per inexact input leaf), each element
        scaled to its input element's magnitude."""
        if not hasattr(self, "_dirs"):
            self._dirs = [[direction(self.rng, s, self.work[i].dtype)
                           for i, s in zip(self.diff, self.escale)]
                          for _ in range(self.opts.n_directions)]
            self._cts = [[self.randn(self.outs_work[o]) for o in range(len(self.dout))]
                         for _ in range(self.opts.n_directions)]
        return self._dirs

    @functools.cached_property
    def outs_work(self) -> list[Any]:
        return list(self.jitted["diffout"](self.work))

    def cotangents(self) -> list[list[np.ndarray]]:
        self.directions()
        return self._cts

    def fd(self, j: int, t: np.ndarray) -> Derivative:
        """Every inexact output's derivative along tangent `t` of input leaf `j`, by
        Richardson extrapolation, refined by a complex step where possible."""
        F, i = self.jitted["diffout"], self.diff[j]
        x = np.asarray(self.work[i])

        def at(h: float) -> list[Any]:
            dyn = list(self.work)
            dyn[i] = (x + h * t).astype(x.dtype)
            return F(dyn)

        est = ridders(at, self.h0, self.eps_mach, self.nondet)
        return complex_step(self._complex_at(j, x, t), self.outs_work, est, self.hc,
                            self.eps_mach)

    def _complex_at(self, j: int, x: np.ndarray, t: np.ndarray
                    ) -> Callable[[complex], list[Any]] | None:
        """``z -> f(x + z t)`` with complex inputs, or None where that is known to fail."""
        if not self.opts.complex_step or _complex(x.dtype) or self._complex_ok.get(j) is False:
            return None
        F, i = self.jitted["diffout"], self.diff[j]
        cdtype = np.result_type(x.dtype, np.complex64)

        def at(z: complex) -> list[Any]:
            dyn = list(self.work)
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

    def _need_diff(self, name: str, mode: str | None = None) -> bool:
        if not self.diff:
            self.skip(name, "no floating-point inputs")
            return False
        if not self.dout:
            self.skip(name, "no floating-point outputs")
            return False
        if mode == "fwd" and not self.fwd:
            self.skip(name, self.fwd_reason)
            return False
        if mode == "rev" and not self.rev:
            self.skip(name, self.rev_reason)
            return False
        if mode == "both" and not (self.fwd and self.rev):
            self.skip(name, self.fwd_reason or self.rev_reason)
            return False
        if mode == "any" and not (self.fwd or self.rev):
            self.skip(name, self.fwd_reason)
            return False
        return True

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

    def _jlabel(self, j: int) -> str:
        return self.labels[self.diff[j]]

    def _olabel(self, o: int) -> str:
        return self.out_labels[self.dout[o]]

    def _jlabels(self) -> list[str]:
        return [self._jlabel(j) for j in range(len(self.diff))]

    def _olabels(self) -> list[str]:
        return [self._olabel(o) for o in range(len(self.dout))]

    def _transpose_of(self, j: int, c: np.ndarray) -> np.ndarray | None:
        return c.T if c.ndim == 2 and c.shape[0] == c.shape[1] and c.shape[0] > 1 else None

    # ------------------------------------------------------------ declared vs actual
    def check_output_shapes(self) -> None:
        args = jax.tree_util.tree_unflatten(self.treedef, self.leaves)
        declared = jax.eval_shape(lambda *a: self.f(*a, **self.static), *args)
        d_tree: Any  # a PyTreeDef, which mypy cannot resolve (jaxlib ships no stubs)
        d_leaves, d_tree = jax.tree_util.tree_flatten(declared)
        if d_tree != self.out_tree:
            self.add("output_shapes", "fail", hint="wrong structure",
                     note=f"declared {d_tree}, the eager call returned {self.out_tree}")
            return
        for d, a, label in zip(d_leaves, self.outs, self.out_labels):
            dd, ad = (tuple(d.shape), np.dtype(d.dtype)), (tuple(a.shape), np.dtype(a.dtype))
            if dd == ad:
                self.add("output_shapes", "pass", output=label, note=f"{ad[1].name}{list(ad[0])}")
            else:
                self.add("output_shapes", "fail", output=label,
                         hint="wrong shape" if dd[0] != ad[0] else "wrong dtype",
                         note=f"declared {dd[1].name}{list(dd[0])}, got {ad[1].name}{list(ad[0])}")

    def _expect(self, name: str, got: Any, like: Any, label: str, out: str | None = None,
                arg: str | None = None, integer_ok: bool = True) -> None:
        want_dtype = np.dtype(like.dtype) if _inexact(like.dtype) else np.dtype(jax.dtypes.float0)
        gd, gs = np.dtype(got.dtype), tuple(np.shape(got))
        ok_dtype = gd == want_dtype or (not _inexact(like.dtype) and integer_ok
                                        and not np.any(np.asarray(got)))
        if gs == tuple(like.shape) and ok_dtype:
            self.add(name, "pass", arg, out, note=f"{_dtype_name(gd)}{list(gs)}")
        else:
            self.add(name, "fail", arg, out,
                     hint="wrong shape" if gs != tuple(like.shape) else "wrong dtype",
                     note=f"{label}: expected {_dtype_name(want_dtype)}{list(like.shape)}, "
                          f"got {_dtype_name(gd)}{list(gs)}")

    def _all_cts(self) -> tuple[Any, Any]:
        """jax.vjp over every dynamic input (integers included) with random cotangents."""
        cts = [self.randn(o) if _inexact(o.dtype) else np.zeros(o.shape, jax.dtypes.float0)
               for o in self.outs]
        _, pull = jax.vjp(lambda *d: self.call_dyn(d), *self.dyn)
        return pull(cts)

    def check_cotangent_shapes(self) -> None:
        if not self.rev and self.diff:
            return self.skip("cotangent_shapes", self.rev_reason)
        if not self.diff:
            return self.skip("cotangent_shapes", "no floating-point inputs")
        got = self._all_cts()
        for g, x, label in zip(got, self.dyn, self.labels):
            self._expect("cotangent_shapes", g, x, "cotangent", arg=label)

    def check_tangent_shapes(self) -> None:
        if not self._need_diff("tangent_shapes", "fwd"):
            return
        tans = [self.randn(x) if _inexact(x.dtype) else np.zeros(x.shape, jax.dtypes.float0)
                for x in self.dyn]
        _, out_t = jax.jvp(lambda *d: self.call_dyn(d), tuple(self.dyn), tuple(tans))
        for g, o, label in zip(out_t, self.outs, self.out_labels):
            self._expect("tangent_shapes", g, o, "output tangent", out=label)

    def check_integer_inputs(self) -> None:
        if not self.ints:
            return self.skip("integer_inputs", "no integer or boolean inputs")
        if self.rev:
            got = self._all_cts()
            for i in self.ints:
                self._expect("integer_inputs", got[i], self.dyn[i], "cotangent",
                             arg=self.labels[i])
        if self.fwd and self.diff:
            tans = [self.randn(x) if _inexact(x.dtype) else np.zeros(x.shape, jax.dtypes.float0)
                    for x in self.dyn]
            jax.jvp(lambda *d: self.call_dyn(d), tuple(self.dyn), tuple(tans))
            self.add("integer_inputs", "pass", note="jvp with float0 integer tangents ran")

    # ------------------------------------------------------------ finite differences
    def check_vjp_fd(self) -> None:
        if not self._need_diff("vjp_fd", "rev"):
            return
        dirs, cts, fds = self.directions(), self.cotangents(), self.fd_dirs
        for o in range(len(self.dout)):
            rule_cts = []
            for k in range(len(dirs)):
                try:
                    rule_cts.append(self.jitted["vjp_out"](o, self.work, cts[k][o]))
                except Exception as exc:  # noqa: BLE001
                    self.add("vjp_fd", "error", "*", self._olabel(o), hint=_diagnose.hint(exc),
                             note=_diagnose.note(exc))
                    break
            else:
                for j in range(len(self.diff)):
                    rule, ref, tol, scale, trans = [], [], [], [], []
                    for k in range(len(dirs)):
                        c = np.asarray(rule_cts[k][j])
                        fd = fds[k][j]
                        if c.shape != dirs[k][j].shape:
                            self.add("vjp_fd", "fail", self._jlabel(j), self._olabel(o),
                                     hint="wrong shape", note=f"cotangent shape "
                                     f"{list(c.shape)}, input shape {list(dirs[k][j].shape)}")
                            break
                        ct = cts[k][o]
                        rule.append(_pair(c, dirs[k][j]))
                        ref.append(_pair(ct, fd.value[o]))
                        s = _abs_pair(ct, fd.value[o]) + _abs_pair(c, dirs[k][j])
                        scale.append(s)
                        tol.append(float(self.fd_tol(np.asarray(s), _abs_pair(ct, fd.error[o])))
                                   + self.nondet * float(np.sum(np.abs(dirs[k][j]))))
                        ct_t = self._transpose_of(j, c)
                        trans.append(None if ct_t is None else _pair(ct_t, dirs[k][j]))
                    else:
                        self.compare("vjp_fd", self._jlabel(j), self._olabel(o), rule, ref, tol,
                                     scale, note="<vjp(ct), t> vs <ct, fd(t)>",
                                     transposed=None if trans[0] is None else trans)

    def check_jvp_fd(self) -> None:
        if not self._need_diff("jvp_fd", "fwd"):
            return
        dirs, fds = self.directions(), self.fd_dirs
        for j in range(len(self.diff)):
            try:
                tans = [self.jitted["jvp_leaf"](j, self.work, dirs[k][j]) for k in range(len(dirs))]
            except Exception as exc:  # noqa: BLE001
                self.add("jvp_fd", "error", self._jlabel(j), "*", hint=_diagnose.hint(exc),
                         note=_diagnose.note(exc))
                continue
            for o in range(len(self.dout)):
                rule = np.stack([np.asarray(tans[k][o]) for k in range(len(dirs))])
                ref = np.stack([fds[k][j].value[o] for k in range(len(dirs))])
                if rule.shape != ref.shape:
                    self.add("jvp_fd", "fail", self._jlabel(j), self._olabel(o),
                             hint="wrong shape", note=f"tangent shape {list(rule.shape[1:])}, "
                             f"output shape {list(ref.shape[1:])}")
                    continue
                err = np.stack([fds[k][j].error[o] for k in range(len(dirs))])
                scale = max(float(np.max(np.abs(ref), initial=0.0)), 1e-300)
                self.compare("jvp_fd", self._jlabel(j), self._olabel(o), rule, ref,
                             self.fd_tol(ref, err), scale, note="jvp(t) vs fd(t)")

    def _small(self, name: str) -> bool:
        n_in = sum(int(np.size(self.work[i])) for i in self.diff)
        n_out = sum(int(np.size(o)) for o in self.outs_work)
        if n_in > self.opts.jacobian_max_size or n_out > 4 * self.opts.jacobian_max_size:
            self.skip(name, f"inputs too large for a full Jacobian ({n_in} elements > "
                            f"jacobian_max_size={self.opts.jacobian_max_size})")
            return False
        if any(_complex(self.work[i].dtype) for i in self.diff) or \
                any(_complex(o.dtype) for o in self.outs_work):
            self.skip(name, "complex values: checked along random directions only")
            return False
        return True

    @functools.cached_property
    def fd_jacobian(self) -> list[tuple[list[np.ndarray], list[np.ndarray]]]:
        """Per input leaf j: per output o, the matrix [out_size, in_size] and its
        elementwise error bound. Column e perturbs element e alone, by a step relative
        to its own magnitude."""
        jac = []
        for j, i in enumerate(self.diff):
            x = self.work[i]
            scales = self.escale[j].ravel()
            cols = []
            for e in range(int(np.size(x))):
                t = np.zeros(np.size(x), x.dtype)
                t[e] = scales[e]
                d = self.fd(j, t.reshape(np.shape(x)))
                cols.append([(v.ravel() / scales[e], r.ravel() / scales[e])
                             for v, r in zip(d.value, d.error)])
            mats, errs = [], []
            for o in range(len(self.dout)):
                size = int(np.size(self.outs_work[o]))
                mats.append(np.stack([c[o][0] for c in cols], axis=1) if cols
                            else np.zeros((size, 0)))
                errs.append(np.stack([c[o][1] for c in cols], axis=1) if cols
                            else np.zeros((size, 0)))
            jac.append((mats, errs))
        return jac

    def _compare_jac(self, name: str, j: int, o: int, rule: np.ndarray) -> None:
        ref, err = self.fd_jacobian[j][0][o], self.fd_jacobian[j][1][o]
        x = self.work[self.diff[j]]
        trans = None
        if np.ndim(x) == 2 and x.shape[0] == x.shape[1] and x.shape[0] > 1:
            n = x.shape[0]
            perm = np.arange(n * n).reshape(n, n).T.ravel()
            trans = rule[:, perm]
        scale = max(float(np.max(np.abs(ref), initial=0.0)), 1e-300)
        swapped = [(self._jlabel(k), self.fd_jacobian[k][0][o],
                    self.jac_tol(self.fd_jacobian[k][0][o], self.fd_jacobian[k][1][o]))
                   for k in range(len(self.diff))
                   if k != j and np.shape(self.work[self.diff[k]]) == np.shape(x)]
        self.compare(name, self._jlabel(j), self._olabel(o), rule, ref, self.jac_tol(ref, err),
                     scale, note=f"Jacobian {list(ref.shape)} vs finite differences",
                     transposed=trans, swapped=swapped, entries=True)

    def check_vjp_jacobian(self) -> None:
        if not self._need_diff("vjp_jacobian", "rev") or not self._small("vjp_jacobian"):
            return
        for o in range(len(self.dout)):
            out = self.outs_work[o]
            rows = []
            for e in range(int(np.size(out))):
                ct = np.zeros(np.size(out), out.dtype)
                ct[e] = 1
                rows.append([np.asarray(c) for c in self.jitted["vjp_out"](
                    o, self.work, ct.reshape(np.shape(out)))])
            for j in range(len(self.diff)):
                size = int(np.size(self.work[self.diff[j]]))
                if any(np.size(r[j]) != size for r in rows):
                    self.add("vjp_jacobian", "fail", self._jlabel(j), self._olabel(o),
                             hint="wrong shape")
                    continue
                rule = np.stack([r[j].ravel() for r in rows]) if rows else np.zeros((0, size))
                self._compare_jac("vjp_jacobian", j, o, rule)

    def check_jvp_jacobian(self) -> None:
        if not self._need_diff("jvp_jacobian", "fwd") or not self._small("jvp_jacobian"):
            return
        for j, i in enumerate(self.diff):
            x = self.work[i]
            cols = []
            for e in range(int(np.size(x))):
                t = np.zeros(np.size(x), x.dtype)
                t[e] = 1
                cols.append([np.asarray(v).ravel() for v in self.jitted["jvp_leaf"](
                    j, self.work, t.reshape(np.shape(x)))])
            for o in range(len(self.dout)):
                size = int(np.size(self.outs_work[o]))
                rule = np.stack([c[o] for c in cols], axis=1) if cols else np.zeros((size, 0))
                self._compare_jac("jvp_jacobian", j, o, rule)

    # ------------------------------------------------------------ consistency
    def check_consistency(self) -> None:
        if not self._need_diff("jvp_vjp_consistency", "both"):
            return
        dirs, cts = self.directions(), self.cotangents()
        vjps = [[self.jitted["vjp_out"](o, self.work, cts[k][o]) for o in range(len(self.dout))]
                for k in range(len(dirs))]
        jvps = [[self.jitted["jvp_leaf"](j, self.work, dirs[k][j]) for j in range(len(self.diff))]
                for k in range(len(dirs))]
        for j in range(len(self.diff)):
            for o in range(len(self.dout)):
                lhs, rhs, tol, scale = [], [], [], []
                for k in range(len(dirs)):
                    jt, vc, t, ct = jvps[k][j][o], vjps[k][o][j], dirs[k][j], cts[k][o]
                    lhs.append(_pair(vc, t))
                    rhs.append(_pair(ct, jt))
                    s = _abs_pair(vc, t) + _abs_pair(ct, jt)
                    scale.append(s)
                    tol.append(self.xatol + self.xrtol * s + self.nondet * float(
                        np.sum(np.abs(t)) + np.sum(np.abs(ct))))
                self.compare("jvp_vjp_consistency", self._jlabel(j), self._olabel(o), lhs, rhs,
                             tol, scale, note="<vjp(ct), t> vs <ct, jvp(t)>")

    # ------------------------------------------------------------ symbolic zeros
    def check_symbolic_zeros(self) -> None:
        name = "symbolic_zeros"
        if not self.diff or not self.dout:
            return self.skip(name, "no floating-point inputs" if not self.diff
                             else "no floating-point outputs")
        if not (self.fwd or self.rev):
            return self.skip(name, self.fwd_reason)
        J = self.jitted
        zero_tol = self.xatol + self.nondet
        if self.fwd:
            for j in range(len(self.diff)):
                t = self.directions()[0][j]
                self.guarded(name, functools.partial(J["jvp_leaf"], j, self.work, t),
                             self._jlabel(j), "*", note="jvp with a tangent on this input only",
                             record_pass=True)
            z = [np.zeros_like(np.asarray(self.work[i])) for i in self.diff]
            outs = J["jvp_all"](self.work, z)
            for o, v in enumerate(outs):
                self.compare(name, "*", self._olabel(o), v, np.zeros_like(np.asarray(v)),
                             zero_tol, 1.0, note="jvp with all-zero tangents must be zero")
        if self.rev:
            for o in range(len(self.dout)):
                ct = self.cotangents()[0][o]
                self.guarded(name, functools.partial(J["vjp_out"], o, self.work, ct), "*",
                             self._olabel(o), note="vjp with a cotangent on this output only",
                             record_pass=True)
            z = [np.zeros_like(np.asarray(v)) for v in self.outs_work]
            cts = J["vjp_all"](self.work, z)
            for j, c in enumerate(cts):
                self.compare(name, self._jlabel(j), "*", c, np.zeros_like(np.asarray(c)),
                             zero_tol, 1.0, note="vjp with all-zero cotangents must be zero")

    # ------------------------------------------------------------ second order
    def check_second_order(self) -> None:
        name = "second_order"
        enabled = self.opts.second_order
        if enabled is None:
            enabled = self.auto_second
        if not enabled:
            return self.skip(name, "not enabled (pass CheckOptions(second_order=True); "
                             "automatic for foreign functions whose rules all have kind='jax')")
        if not self._need_diff(name, "rev"):
            return
        if any(_complex(self.work[i].dtype) for i in self.diff) or \
                any(_complex(o.dtype) for o in self.outs_work):
            return self.skip(name, "complex values are not supported by the Hessian check")
        weights = [self.randn(o) for o in self.outs_work]

        def s(d: list) -> Any:
            outs = self.diffout(self._merge(d, self.work))
            return sum(jnp.sum(w * o) for w, o in zip(weights, outs))

        grad = jax.jit(jax.grad(s))
        x = [self.work[i] for i in self.diff]

        def fwd_over_rev(x, t):
            return jax.jvp(jax.grad(s), (x,), (t,))[1]

        def rev_over_rev(x, t):
            return jax.grad(lambda y: sum(jnp.sum(a * b) for a, b in zip(jax.grad(s)(y), t)))(x)

        how, hvp = "jax.jvp(jax.grad(...)) (forward-over-reverse)", jax.jit(fwd_over_rev)
        try:
            hvp(x, self.directions()[0])
        except Exception:  # noqa: BLE001 - try reverse-over-reverse instead
            how, hvp = "jax.grad(jax.grad(...)) (reverse-over-reverse)", jax.jit(rev_over_rev)
        gots, refs, errs = [], [], []
        for t in self.directions():
            gots.append([np.asarray(v) for v in hvp(x, t)])
            def grad_at(h: float, t: list = t) -> list:
                return grad([(xi + h * ti).astype(xi.dtype) for xi, ti in zip(x, t)])

            d = ridders(grad_at, self.h0, self.eps_mach, self.nondet)
            refs.append(d.value)
            errs.append(d.error)
        for j in range(len(self.diff)):
            got = np.stack([g[j] for g in gots])
            ref = np.stack([r[j] for r in refs])
            err = np.stack([e[j] for e in errs])
            scale = max(float(np.max(np.abs(ref), initial=0.0)), 1e-300)
            self.compare(name, self._jlabel(j), "sum(w*out)", got, ref, self.fd_tol(ref, err),
                         scale, note=f"Hessian-vector products via {how} vs fd of the gradient")


    # ------------------------------------------------------------ coverage
    def check_derivatives_checked(self) -> None:
        """Each mode the function has was checked against a reference by at least one
        enabled check: a rule that no check ran cannot pass."""
        name = "derivatives_checked"
        if not self.diff or not self.dout:
            return self.skip(name, "no floating-point inputs" if not self.diff
                             else "no floating-point outputs")
        ran = {r.name for r in self.results if r.status != "skip"}
        d = self.derivatives
        for mode, how, checks in (("forward", d.forward, FORWARD_CHECKS),
                                  ("reverse", d.reverse, REVERSE_CHECKS)):
            enabled = [c for c in checks if self.opts.enabled(c)]
            if how is None:
                self.add(name, "skip", note=f"{mode} mode: the function has none")
            elif not enabled:
                self.add(name, "skip", note=f"{mode} mode ({how}): no {mode}-mode check "
                                            f"selected")
            elif ran & set(enabled):
                self.add(name, "pass", note=f"{mode} mode ({how}) checked by "
                         + ", ".join(c for c in enabled if c in ran))
            else:
                why = "; ".join(f"{r.name}: {r.note}" for r in self.results
                                if r.name in enabled and r.status == "skip")
                self.add(name, "fail", hint=f"{mode} mode never checked",
                         note=f"the function has {mode} mode ({how}), but every {mode}-mode "
                              f"check was skipped ({why})")


def run_checks(f: Callable[..., Any], args: tuple, static: dict,
               opts: CheckOptions) -> RuleReport:
    """Run every enabled check on `f(*args, **static)` and return the report."""
    return _Checker(f, args, static, opts).run()
