"""`solve_ivp`'s one argument preparation (every path: compiled RK, stiff, SciPy's loop,
events, dense output, step times) and the argument checks `quad` shares.

`prepare` checks what the user passed, converts the user's functions to `HostFun`s and
resolves every static choice into one frozen `IvpConfig`; the paths differ only in
what they do with the `PreparedIvp` it returns.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import scipy.integrate
import scipy.sparse

from .._common import as_float_operand, check_policy, static_options, unsupported
from .._trace import HostFun, array_aval, check_args, convert
from . import _rk
from ._events import event_spec
from ._ode import IMPLICIT_METHODS, METHODS
from ._options import (
    MAX_EVENTS,
    MAX_STEPS,
    SENSITIVITIES,
    STEPPINGS,
    IvpConfig,
    StaticMatrix,
    sensitivity_choice,
    stepping_choice,
)

__all__ = ["IvpRequest", "PreparedIvp", "prepare", "check_returns"]

NAME = "integrate.solve_ivp"
CALL = "fun(t, y, *args)"


@dataclasses.dataclass(frozen=True, eq=False)
class IvpRequest:
    """The arguments of one `solve_ivp` call, as the user passed them."""

    fun: Callable[..., Any]
    t_span: Any
    y0: Any
    method: Any
    t_eval: Any
    dense_output: bool
    events: Any
    vectorized: bool
    args: Any
    rtol: Any
    atol: Any
    jac: Any
    adjoint_rtol: float | None
    adjoint_atol: float | None
    sensitivity: str
    stepping: str
    checkpoints: int | None
    on_failure: str
    options: dict


@dataclasses.dataclass(frozen=True, eq=False)
class PreparedIvp:
    """One checked `solve_ivp` call: its static configuration and its operands."""

    cfg: IvpConfig
    fun: Callable[..., Any]    # the user's right-hand side (evaluated again in JAX)
    t0: jax.Array
    t1: jax.Array
    y0: jax.Array
    t_eval: jax.Array          # (0,) for t_eval=None (SciPy's step times are the outputs)
    params: tuple              # the differentiable operands of `fun`
    fixed: tuple               # its other operands
    jac_ops: tuple             # the operands of a user `jac` (not differentiated)
    ev_ops: tuple              # per event function, its operands (the host call's are
                               # not differentiated; the event times' derivative is)
    events: tuple | None       # the user's event functions (None: no `events=`)
    args: tuple                # SciPy's `args`, checked


def check_method(method: Any, name: str) -> str:
    """`method`'s name: one of SciPy's names or SciPy's own solver classes
    (`scipy.integrate.RK45`, ...); an array here is a misplaced `t_eval`."""
    if isinstance(method, str) and method in METHODS:
        return method
    if isinstance(method, type) and issubclass(method, scipy.integrate.OdeSolver):
        cls_name: str = method.__name__
        if cls_name in METHODS and getattr(scipy.integrate, cls_name) is method:
            return cls_name
        raise ValueError(
            f"jaxbridge.scipy.{name}: method={method.__module__}.{method.__qualname__}: only "
            f"SciPy's own methods are supported ({METHODS}, or SciPy's classes of those "
            f"names), since their steps are differentiated as SciPy takes them")
    if not isinstance(method, str) and (hasattr(method, "shape") or
                                        isinstance(method, (list, tuple))):
        raise TypeError(
            f"jaxbridge.scipy.{name}: the 4th positional argument is `method`, as in SciPy's "
            f"solve_ivp(fun, t_span, y0, method='RK45', t_eval=None, ...); got an array. "
            f"Pass the evaluation times as t_eval=...")
    raise ValueError(f"jaxbridge.scipy.{name}: method must be one of {METHODS} or SciPy's "
                     f"solver class of that name, got {method!r}")


def single_call(fun: Callable[..., Any], vectorized: bool, y0: jax.Array) -> Callable:
    """`fun` as called for one state: SciPy's `vectorized=True` means `fun(t, y)` takes
    `y` of shape (n, k), and SciPy calls it with (n, 1) for one state, ravelled."""
    if not vectorized:
        return fun
    if y0.ndim != 1:
        raise ValueError(f"jaxbridge.scipy.{NAME}: vectorized=True calls fun(t, y) with y of "
                         f"shape (n, k), as SciPy does, so y0 must be 1-D; got shape "
                         f"{y0.shape}")

    def one_state(t: Any, y: Any, *args: Any) -> Any:
        out = fun(t, y[:, None], *args)
        return jnp.ravel(out) if jnp.size(out) == y.shape[0] else out
    return one_state


def constant_jacobian(jac: Any, n: int, method: str) -> tuple[Any, StaticMatrix | None]:
    """SciPy's constant `jac` (an (n, n) array or `scipy.sparse` matrix): (a function of
    (t, y, *args) returning it densified, for JAX's derivatives; the matrix as SciPy
    gets it); other `jac` values: (`jac`, None)."""
    if jac is None or isinstance(jac, bool) or callable(jac):
        return jac, None
    J = static_matrix(
        jac, f"jaxbridge.scipy.{NAME}: `jac` must be a function jac(t, y, *args), a constant "
             f"(n, n) array or sparse matrix, None or False; got {jac!r}",
        f"jaxbridge.scipy.{NAME}: a constant `jac` is static (SciPy's Newton iteration "
        f"only); got a traced array")
    if method == "LSODA":
        raise ValueError(f"jaxbridge.scipy.{NAME}: method='LSODA' takes `jac` as a function "
                         f"jac(t, y, *args) only (as SciPy's LSODA); got a constant array")
    if J.shape != (n, n):
        raise ValueError(f"jaxbridge.scipy.{NAME}: `jac` is expected to have shape {(n, n)} "
                         f"(as in SciPy), but actually has {J.shape}")
    const = jnp.asarray(J.dense())
    return (lambda t, y, *args: const), J


def jac_sparsity(options: dict, n: int, method: str) -> StaticMatrix | None:
    """SciPy's `jac_sparsity` option, taken out of `options`: an (n, n) pattern (array or
    sparse matrix) for Radau and BDF; the other methods ignore it with SciPy's warning."""
    pattern = options.pop("jac_sparsity", None)
    if pattern is None:
        return None
    if method not in ("Radau", "BDF"):
        warnings.warn("The following arguments have no effect for a chosen solver: "
                      "`jac_sparsity`.", UserWarning, stacklevel=4)
        return None
    S = static_matrix(
        pattern, f"jaxbridge.scipy.{NAME}: `jac_sparsity` must be an (n, n) array or sparse "
                 f"matrix (the Jacobian's nonzero pattern); got {pattern!r}",
        f"jaxbridge.scipy.{NAME}: `jac_sparsity` is static (the Jacobian's pattern); got a "
        f"traced array")
    if S.shape != (n, n):
        raise ValueError(f"jaxbridge.scipy.{NAME}: `jac_sparsity` is expected to have shape "
                         f"{(n, n)} (as in SciPy), but actually has {S.shape}")
    return S


def check_step_options(options: dict, name: str) -> None:
    """SciPy's checks of `first_step` and `max_step` (positive; the compiled loop would
    otherwise never end)."""
    for what in ("first_step", "max_step"):
        v = options.get(what)
        if v is None:
            continue
        try:
            ok = float(v) > 0
        except (TypeError, ValueError):
            ok = False
        if not ok:
            raise ValueError(f"jaxbridge.scipy.{name}: `{what}` must be positive (as in "
                             f"SciPy), got {v!r}")


def check_checkpoints(checkpoints: Any, name: str) -> int | None:
    """`checkpoints` as None or an int >= 2."""
    if checkpoints is None:
        return None
    if isinstance(checkpoints, bool) or not isinstance(checkpoints, (int, np.integer)) \
            or checkpoints < 2:
        raise ValueError(f"jaxbridge.scipy.{name}: checkpoints must be None or an int >= 2 "
                         f"(how many states the discrete adjoint may store), got "
                         f"{checkpoints!r}")
    return int(checkpoints)


def check_t_eval(t0: Any, t1: Any, t_eval: Any, name: str) -> None:
    """SciPy's check that t_eval lies in t_span (when the values are concrete)."""
    try:
        a, b, te = float(t0), float(t1), np.asarray(t_eval)
    except (jax.errors.ConcretizationTypeError, jax.errors.TracerArrayConversionError):
        return
    lo, hi = min(a, b), max(a, b)
    if te.size and (te.min() < lo or te.max() > hi):
        raise ValueError(f"jaxbridge.scipy.{name}: values in t_eval are not within t_span "
                         f"({a}, {b})")
    steps = np.diff(te) * (1.0 if b >= a else -1.0)
    if np.any(steps < 0):
        raise ValueError(f"jaxbridge.scipy.{name}: values in t_eval are not properly sorted "
                         f"(in the direction of t_span ({a}, {b})), as SciPy requires")


def check_returns(hf: HostFun, want: tuple, name: str, what: str) -> None:
    """The converted user function `hf` returns one array of shape `want`."""
    outs = hf.jaxpr.outvars
    got = [tuple(array_aval(v.aval).shape) for v in outs]
    if len(outs) != 1 or got[0] != tuple(want):
        kind = "a scalar (shape ())" if want == () else f"one array of shape {tuple(want)}"
        raise ValueError(f"jaxbridge.scipy.{name}: `{what}` must return {kind}; it returned "
                         f"shapes {got}")


def tolerance(value: Any, n: int, what: str, name: str) -> float | tuple:
    """SciPy's `rtol` or `atol`: a float, or an array with one per state component (a
    tuple: the configuration is hashable); negative values raise as in SciPy."""
    arr = _static_float64(
        value, f"jaxbridge.scipy.{name}: `{what}` must be a float or an array of one per "
               f"state component, got {value!r}",
        f"jaxbridge.scipy.{name}: `{what}` is a static tolerance (it sets SciPy's step "
        f"control); got a traced value")
    if arr.ndim > 0 and arr.size != n:
        raise ValueError(f"jaxbridge.scipy.{name}: `{what}` has wrong shape: SciPy takes a "
                         f"float or one value per state component ({n}), got shape "
                         f"{arr.shape}")
    if np.any(arr < 0) or np.any(np.isnan(arr)):
        raise ValueError(f"jaxbridge.scipy.{name}: `{what}` must be positive, got {value!r}")
    return float(arr) if arr.ndim == 0 else tuple(float(v) for v in arr.ravel())


def _check_sizes(req: IvpRequest, options: dict) -> tuple[int, int]:
    """The events path's static sizes (`max_events`, `max_steps`, taken out of the
    options) and the choices it cannot honour."""
    given = [what for what, on in (("events", req.events is not None),
                                   ("dense_output=True", bool(req.dense_output)),
                                   ("t_eval=None", req.t_eval is None)) if on]
    why = " and ".join(given)
    if req.sensitivity == "adjoint":
        raise unsupported(NAME, "sensitivity='adjoint'", f"with {why} the gradient uses "
                          "forward sensitivities; pass sensitivity='auto' or 'forward'")
    if req.stepping == "compiled":
        reason = ("t_eval=None returns SciPy's own step times, which come from SciPy's "
                  "step loop" if given == ["t_eval=None"] else
                  f"{why}: SciPy's own step loop " + " and ".join(
                      {"events": "locates the events", "dense_output=True": "keeps the "
                       "dense output", "t_eval=None": "gives the step times"}[g]
                      for g in given))
        raise unsupported(NAME, "stepping='compiled'", f"{reason}; pass stepping='auto' or "
                          f"'scipy' (or t_eval=... for the compiled loop)")
    for what, choices, v in (("sensitivity", SENSITIVITIES, req.sensitivity),
                             ("stepping", STEPPINGS, req.stepping)):
        if v not in choices:
            raise ValueError(f"jaxbridge.scipy.{NAME}: {what} must be one of {choices}, got "
                             f"{v!r}")
    sizes = options.pop("max_events", MAX_EVENTS), options.pop("max_steps", MAX_STEPS)
    for what, v in zip(("max_events", "max_steps"), sizes):
        if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 1:
            raise ValueError(f"jaxbridge.scipy.{NAME}: {what} must be a positive int (a "
                             f"static size), got {v!r}")
    return int(sizes[0]), int(sizes[1])


def _times(req: IvpRequest) -> tuple[Any, Any, Any]:
    """(t0, t1, t_eval) in one time dtype (t_eval's, at least float), checked; t_eval
    None gives an empty t_eval."""
    # (NumPy and Python values stay NumPy arrays: the program takes them as they are)
    t_eval = np.zeros((0,), jnp.result_type(float)) if req.t_eval is None else \
        _time_operand(req.t_eval)
    if t_eval.ndim != 1:
        raise ValueError(f"jaxbridge.scipy.{NAME}: t_eval must be 1-D, got shape "
                         f"{t_eval.shape}")
    if len(req.t_span) != 2:
        raise ValueError(f"jaxbridge.scipy.{NAME}: t_span must be (t0, tf), got "
                         f"{req.t_span!r}")
    tdtype = jnp.result_type(t_eval.dtype, float)
    t_eval = t_eval.astype(tdtype)
    t0, t1 = (_time_operand(t).astype(tdtype) for t in req.t_span)
    check_t_eval(t0, t1, t_eval, NAME)
    return t0, t1, t_eval


def _time_operand(t: Any) -> Any:
    """A time (or times) as a NumPy array in JAX's dtype for it, or as a JAX array where
    it is one (traced values)."""
    if isinstance(t, jax.Array):
        return t
    try:
        a = np.asarray(t)
    except Exception:  # noqa: BLE001 - a list holding tracers: JAX's conversion
        return jnp.asarray(t)
    if a.dtype == object:
        return jnp.asarray(t)
    return a.astype(jax.dtypes.canonicalize_dtype(a.dtype), copy=False)


def _convert_events(events: Any, example: tuple, args: tuple, max_events: int
                    ) -> tuple[tuple, tuple, tuple, tuple, tuple]:
    """(the user's event functions, their HostFuns, their operands, terminal,
    direction)."""
    evs, terminal, direction = event_spec(() if events is None else events, NAME)
    for i, term in enumerate(terminal):
        if term > max_events:
            raise ValueError(f"jaxbridge.scipy.{NAME}: events[{i}].terminal={term} needs "
                             f"max_events >= {term}, got max_events={max_events}")
    hfs, ops = [], []
    for i, ev in enumerate(evs):
        hf, o = convert(ev, NAME, f"events[{i}]", example, args, "event(t, y, *args)")
        check_returns(hf, (), NAME, f"events[{i}]")
        hfs.append(hf)
        ops.append(tuple(o))
    return tuple(evs), tuple(hfs), tuple(ops), terminal, direction


def prepare(req: IvpRequest) -> PreparedIvp:
    """Check `req`, convert its functions, resolve its choices: the one preparation of
    every `solve_ivp` path."""
    check_policy(req.on_failure, NAME)
    method = check_method(req.method, NAME)
    budget = check_checkpoints(req.checkpoints, NAME)
    events_path = req.events is not None or req.dense_output or req.t_eval is None
    options = dict(req.options)
    check_step_options(options, NAME)
    sizes = _check_sizes(req, options) if events_path else (MAX_EVENTS, MAX_STEPS)
    args = check_args(req.args, NAME, CALL, "unpack_checked")
    y0 = as_float_operand(req.y0, NAME, "y0")
    fun = single_call(req.fun, bool(req.vectorized), y0)
    t0, t1, t_eval = _times(req)
    example = (jax.ShapeDtypeStruct((), t_eval.dtype), jax.ShapeDtypeStruct(y0.shape, y0.dtype))
    rhs, ops = convert(fun, NAME, "fun", example, args, CALL,
                       vary_like=(t0, t1, y0, t_eval))
    check_returns(rhs, y0.shape, NAME, "fun")
    params, fixed = rhs.split(ops)
    jac_hf, jac_matrix = constant_jacobian(req.jac, y0.size, method)
    pattern = jac_sparsity(options, y0.size, method)
    jac_ops: Sequence[Any] = ()
    if callable(jac_hf):
        jac_hf, jac_ops = convert(jac_hf, NAME, "jac", example, args, "jac(t, y, *args)")
        jac_ops = tuple(jax.lax.stop_gradient(o) for o in jac_ops)
    evs, ev_hfs, ev_ops, terminal, direction = _convert_events(req.events, example, args,
                                                               sizes[0])
    static = static_options(options, NAME)
    if events_path:  # SciPy's loop locates the events; gradients by forward sensitivities
        # ("compiled": a repeat eager call may run the loop compiled, `_compiled_trajectory`)
        compiled = req.stepping == "auto" and _rk.supported(method, static)
        stepping, sensitivity = ("compiled" if compiled else "scipy"), "forward"
    else:
        stepping = stepping_choice(req.stepping, method, static, NAME)
        sensitivity = sensitivity_choice(
            req.sensitivity, y0.size, sum(p.size for p in params),
            stepping == "compiled" and method in IMPLICIT_METHODS)
    rtol, atol = (tolerance(v, y0.size, w, NAME) for v, w in ((req.rtol, "rtol"),
                                                              (req.atol, "atol")))
    cfg = IvpConfig(
        fun=rhs, jac=jac_hf, method=method, rtol=rtol, atol=atol,
        adjoint_rtol=float(np.min(rtol) if req.adjoint_rtol is None else req.adjoint_rtol),
        adjoint_atol=float(np.min(atol) if req.adjoint_atol is None else req.adjoint_atol),
        sensitivity=sensitivity, on_failure=req.on_failure, options=static, stepping=stepping,
        checkpoints=budget, events=ev_hfs, terminal=terminal, direction=direction,
        max_events=sizes[0], max_steps=sizes[1], steps=req.t_eval is None,
        dense=bool(req.dense_output), events_path=events_path, jac_matrix=jac_matrix,
        jac_sparsity=pattern)
    return PreparedIvp(cfg, fun, t0, t1, y0, t_eval, params, fixed, tuple(jac_ops), ev_ops,
                       None if req.events is None else evs, args)


def _static_float64(value: Any, not_numeric: str, traced: str) -> np.ndarray:
    """`value` as a concrete float64 NumPy array (a static option SciPy reads), or a
    ValueError with `not_numeric` or `traced` as its message."""
    try:
        return np.asarray(jax.device_get(value), np.float64)
    except (TypeError, ValueError) as e:
        raise ValueError(not_numeric) from e
    except jax.errors.ConcretizationTypeError as e:
        raise ValueError(traced) from e


def static_matrix(value: Any, not_numeric: str, traced: str) -> StaticMatrix:
    """`value`, dense or `scipy.sparse`, as a `StaticMatrix` (a sparse matrix stays
    sparse for SciPy), or a ValueError with `not_numeric` or `traced` as its message."""
    if scipy.sparse.issparse(value):
        try:
            return StaticMatrix(value)
        except (TypeError, ValueError) as e:
            raise ValueError(not_numeric) from e
    return StaticMatrix(_static_float64(value, not_numeric, traced))
