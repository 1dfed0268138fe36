"""What root, minimize and least_squares share: checks, closures lifted out, the implicit solve."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import scipy.optimize

from .._common import (
    as_float_array,
    as_float_operand,
    check_policy,
    const,
    program,
    static_options,
)
from .._trace import HostFun, check_args, convert
from . import _constrained, _fields, _implicit
from ._options import LINEAR_SOLVERS, SolveOptions


@dataclasses.dataclass(frozen=True, eq=False)
class Request:
    """One call of root, minimize or least_squares as its front end received it.

    `kind` is the function's name; the rest are SciPy's arguments of that name, not
    yet checked (`bounds` may hold traced arrays, `options` is SciPy's dict), except
    minimize's `constraints`: None or a `_constraints.ConstraintSet`.
    """

    kind: str
    method: str
    jac: Any = None
    bounds: Any = None
    tol: Any = None
    options: dict | None = None
    callback: Any = None
    linear_solver: str = "auto"
    on_failure: str = "raise"
    hess: Any = None
    hessp: Any = None
    constraints: Any = None


@dataclasses.dataclass(frozen=True)
class Solution:
    """The implicit solve's outputs, and the user's function `fun` (converted, on this
    call's operands `ops`) for the result's fields: `user_fun(x)`, its value at x (in
    JAX), `user_grad(x)`, the gradient of its sum (minimize's `jac`; `fun` may return
    shape (1,)), and any other `program` of it."""

    x: jax.Array
    active: jax.Array
    stats: tuple           # SciPy's status, nfev, njev, nit, message number (scalars)
    success: jax.Array
    fun: HostFun           # with `with_jac`, it returns (f, J)
    with_jac: bool
    ops: tuple
    extras: dict = dataclasses.field(default_factory=dict)  # the method's own fields

    def program(self, key: Hashable, body: Callable[..., Any]) -> Callable[..., Any]:
        """`body(fun, *operands)`, `fun(x)` the user's function, as one compiled program
        per `key` and converted function (`_common.program`: a repeat eager call pays
        one dispatch, not one per operation). `body` must be built from `key` alone
        (a module function, or a partial of one with the key's static values)."""
        value = functools.partial(_value, self.fun, self.with_jac)

        def run(ops: tuple, *operands: Any) -> Any:
            return body(functools.partial(value, ops), *operands)

        compiled = program((key, self.fun, self.with_jac), const(run))
        return functools.partial(compiled, self.ops)

    def user_fun(self, x: jax.Array) -> Any:
        return self.program("optimize fun", _at)(x)

    def user_grad(self, x: jax.Array) -> Any:
        return self.program("optimize grad", _grad_of_sum)(x)

    @property
    def message(self) -> str | None:
        """SciPy's message (None under `jit`: a string is not traced)."""
        return _fields.message_text(self.stats[4])


ROOT_METHODS = ("hybr", "lm", "broyden1", "broyden2", "anderson", "linearmixing",
                "diagbroyden", "excitingmixing", "krylov", "df-sane")
MIN_METHODS = ("Nelder-Mead", "Powell", "CG", "BFGS", "Newton-CG", "L-BFGS-B", "TNC", "COBYLA",
               "COBYQA", "SLSQP", "trust-constr", "dogleg", "trust-ncg", "trust-exact",
               "trust-krylov")


def canonical_method(method: Any, kind: str) -> Any:
    """SciPy's spelling of a root or minimize `method`: SciPy compares names lower-cased
    ('l-bfgs-b', 'HYBR'), so do we, in this one place; the checks and results downstream
    see one name. Names SciPy does not know (and callables) pass on to SciPy's own error.

    >>> canonical_method("l-bfgs-b", "minimize"), canonical_method("HYBR", "root")
    ('L-BFGS-B', 'hybr')
    """
    if not isinstance(method, str):
        return method
    names = ROOT_METHODS if kind == "root" else MIN_METHODS
    return {m.lower(): m for m in names}.get(method.lower(), method)


def starting_point(x0: Any, kind: str, operand: bool = False) -> Any:
    """`x0` as a float array as SciPy takes it: a scalar is shape (1,) (so is `x`), and
    minimize and least_squares refuse more than one dimension (SciPy's ValueError).
    `operand`: a NumPy `x0` stays NumPy (`as_float_operand`), for a jitted program to
    take as it is (moving it to the device first costs a repeat call ~100 us)."""
    convert_x0 = as_float_operand if operand else as_float_array
    x0 = convert_x0(x0, f"optimize.{kind}", "x0")
    if x0.ndim > 1 and kind != "root":
        raise ValueError(f"jaxbridge.scipy.optimize.{kind}: x0 must have at most one "
                         f"dimension, as in SciPy; got shape {x0.shape}")
    return x0.reshape(1) if x0.ndim == 0 else x0


def check_linear_solver(linear_solver: str, qualname: str) -> None:
    """A ValueError naming the function unless `linear_solver` is one of LINEAR_SOLVERS."""
    if linear_solver not in LINEAR_SOLVERS:
        raise ValueError(f"jaxbridge.scipy.{qualname}: linear_solver must be one of "
                         f"{LINEAR_SOLVERS}, got {linear_solver!r}")


def bounds(given: Any, x0: jax.Array, name: str) -> tuple[Any, Any]:
    """(lb, ub) shaped like x0 from SciPy's forms: Bounds, (lb, ub), or [(lo, hi), ...]."""
    if given is None:  # (NumPy: no eager dispatch; the solve's program takes them)
        inf = np.full(x0.shape, np.inf, x0.dtype)
        return -inf, inf
    if isinstance(given, scipy.optimize.Bounds):
        lo, hi = given.lb, given.ub
    elif name != "least_squares" and isinstance(given, (list, tuple)) and given and \
            all(isinstance(b, (list, tuple)) and len(b) == 2 for b in given):
        lo = [(-np.inf if b[0] is None else b[0]) for b in given]
        hi = [(np.inf if b[1] is None else b[1]) for b in given]
    elif isinstance(given, (list, tuple)) and len(given) == 2:
        lo, hi = given
    else:
        raise _bounds_error(name)(f"jaxbridge.scipy.optimize.{name}: bounds must be a "
                        f"scipy.optimize.Bounds, (lb, ub) or a sequence of (min, max) pairs, "
                        f"got {type(given).__name__}")

    def full(v: Any, which: str) -> jax.Array:
        if isinstance(v, (list, tuple)):  # entries may be traced (differentiable bounds)
            v = jnp.stack([jnp.asarray(e, x0.dtype).reshape(()) for e in v])
        v = jnp.asarray(v, x0.dtype)
        if v.size not in (1, x0.size):
            raise ValueError(f"jaxbridge.scipy.optimize.{name}: the {which} bounds must be a "
                             f"scalar or have x0's {x0.size} entries, got shape {v.shape}")
        return jnp.broadcast_to(v.reshape(-1), (x0.size,)).reshape(x0.shape)
    return full(lo, "lower"), full(hi, "upper")


def _bounds_error(name: str) -> type[Exception]:
    """SciPy's exception type for bounds of the wrong form: least_squares says ValueError
    ("`bounds` must contain 2 elements"), minimize a TypeError (not a sequence of pairs)."""
    return ValueError if name == "least_squares" else TypeError


def _host_functions(request: Request, x_aval: Any, args: tuple, qual: str
                    ) -> tuple[tuple, tuple]:
    """(jac, hess, hessp) as SolveOptions holds them (a user's JAX function converted to a
    `HostFun`; None, True, False or a string as given) and their operands, in that order,
    without gradients (they only steer SciPy's forward solve)."""
    calls = {"jac": ((x_aval,), "jac(x, *args)"), "hess": ((x_aval,), "hess(x, *args)"),
             "hessp": ((x_aval, x_aval), "hessp(x, p, *args)")}
    funs: list[Any] = []
    ops: list[Any] = []
    for what, given in (("jac", request.jac), ("hess", request.hess),
                        ("hessp", request.hessp)):
        if callable(given) and not isinstance(given, scipy.optimize.HessianUpdateStrategy):
            example, call = calls[what]
            given, lifted = convert(given, qual, what, example, args, call)
            ops += [jax.lax.stop_gradient(o) for o in lifted]
        elif what == "jac" and given not in (None, True, False):
            given = None  # a finite-difference string: JAX's exact gradient
        funs.append(given)
    return tuple(funs), tuple(ops)


def solve(fun: Callable, x0: Any, args: Any, request: Request) -> Solution:
    """Check `request`, lift `fun`'s (and a `jac` function's) closures and `args` out as
    inputs, and run the implicit solve: x* differentiable in them and in the bounds."""
    kind = request.kind
    qual = f"optimize.{kind}"
    check_policy(request.on_failure, qual)
    check_linear_solver(request.linear_solver, qual)
    if request.callback is not None:
        try:
            hash(request.callback)
        except TypeError:
            raise TypeError(f"jaxbridge.scipy.{qual}: callback must be hashable (it is "
                            f"static); got {type(request.callback).__name__}") from None
    call = "fun(x, *args)"
    args = check_args(args, qual, call, "unpack" if kind == "least_squares" else "wrap")
    x0 = starting_point(x0, kind, operand=True)
    x_aval = jax.ShapeDtypeStruct(x0.shape, x0.dtype)
    hf, ops = convert(fun, qual, "fun", (x_aval,), args, call)
    params, fixed = hf.split(ops)
    jac = request.jac
    host_funs, host_ops = _host_functions(request, x_aval, args, qual)
    constraints = None
    if request.constraints is not None:
        cset = request.constraints
        cons_hf, cons_ops = convert(cset.values, qual, "constraints", (x_aval,), cset.args,
                                    "fun(x, *args) of each constraint")
        cons_params, cons_fixed = cons_hf.split(cons_ops)
        params, fixed = (*params, *cons_params), (*fixed, *cons_fixed)
        constraints = (cons_hf, cset.keep_feasible)
    lb, ub = bounds(request.bounds, x0, kind)
    opts = SolveOptions(kind=kind, fun=hf, method=request.method, jac=host_funs[0],
                        tol=None if request.tol is None else float(request.tol),
                        options=static_options(request.options, qual),
                        callback=request.callback, linear_solver=request.linear_solver,
                        on_failure=request.on_failure, hess=host_funs[1],
                        hessp=host_funs[2], constraints=constraints)
    # One compiled program per configuration each (a repeat eager call: two dispatches);
    # `fun` is evaluated through its trace `hf`, on this call's operands.
    solve = _implicit.solve if constraints is None else _constrained.solve
    run = program(("optimize", opts), const(functools.partial(_solve_program, solve, opts)))
    x, active, stats, success, extras = run(x0, lb, ub, params, fixed, host_ops)
    return Solution(x, active, stats, success, hf, jac is True, tuple(ops), extras)


def _solve_program(solve: Callable[..., Any], opts: SolveOptions, x0: Any, lb: Any,
                   ub: Any, params: tuple, fixed: tuple, jac_ops: tuple) -> tuple:
    """The implicit (or KKT) solve, its stats as a tuple of scalars (status, nfev, njev,
    nit, message number)."""
    x, active, stats, success, extras = solve(x0, lb, ub, params, fixed, jac_ops,
                                              opts=opts)
    return x, active, tuple(stats[i] for i in range(stats.shape[0])), success, extras


def _value(hf: HostFun, with_jac: bool, ops: Sequence[Any], x: jax.Array) -> Any:
    """The user's function at `x` (its value alone where it returns `(f, J)`)."""
    y = hf(ops, x)
    return y[0] if with_jac and isinstance(y, tuple) else y


def _at(fun: Callable[[jax.Array], Any], x: jax.Array) -> Any:
    return fun(x)


def _grad_of_sum(fun: Callable[[jax.Array], Any], x: jax.Array) -> Any:
    return jax.grad(lambda x: jnp.sum(fun(x)))(x)
