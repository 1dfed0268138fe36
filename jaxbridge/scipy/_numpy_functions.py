"""User functions written in NumPy: the drop-ins run them as SciPy does.

A drop-in traces the user's function (`_trace.convert`) to lift its closures out and
differentiate it. A function written for NumPy (`np.sin(y)`, `math.exp(y[0])`,
`float(y)`, `if y[0] > 0:`) cannot be traced: `convert` raises
`UntraceableFunctionError` (JAX's error as its cause). `runs_as_scipy` wraps a drop-in
so that it then runs SciPy's own routine with the user's function instead:

* every argument concrete (an eager call): SciPy's routine on the arguments as given
  (it IS SciPy: the same values, counts and messages), its result as the drop-in's
  result type with JAX arrays;
* traced arguments (`jit`, `vmap`) and result shapes known before the call (a
  `Fallback.shapes`): the same SciPy run as a host call (`jaxbridge.foreign`, one call
  per batch element under `vmap`); unknown shapes raise `UntraceableFunctionError`
  saying which argument would make them known;
* differentiated (`grad`, `jvp`, ...): `UntraceableFunctionError` (a `custom_jvp`
  whose rule raises it), naming the drop-in and the argument.

The user's functions are called by SciPy through `guarded`, which turns a traced value
the function closes over (it only shows when the function runs) into the same error;
every other exception -- the function's own, SciPy's -- surfaces as itself.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from .. import _foreign
from .._core.jaxapi import is_tracer
from ..errors import UntraceableFunctionError
from ._common import failure
from ._trace import (
    end_drop_in_call,
    leaked_tracer,
    not_traceable,
    raised_for,
    start_drop_in_call,
)


@dataclasses.dataclass(frozen=True)
class Fallback:
    """How one drop-in runs SciPy for a user function written in NumPy.

    run: the drop-in's bound arguments (defaults applied) -> the result's fields as
      NumPy values, by SciPy's own routine (raising SciPy's errors, and `SolverError`
      for a failure with on_failure="raise").
    build: (fields as JAX arrays, the bound arguments) -> the drop-in's result (None:
      the `result_type` given to `runs_as_scipy`, called with the fields).
    shapes: the bound arguments -> the fields' `jax.ShapeDtypeStruct`s, for a run under
      `jit`; or a string saying why they are not known before the run (None: never).
    """

    name: str
    run: Callable[[dict], dict]
    build: Callable[[dict, dict], Any] | None
    shapes: Callable[[dict], dict | str] | None = None


def runs_as_scipy(fallback: Fallback, result_type: Callable[..., Any] | None = None
                  ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Wrap a drop-in: a user function it cannot trace runs as SciPy runs it."""
    if fallback.build is None:
        if result_type is None:
            raise TypeError(f"runs_as_scipy: {fallback.name} needs a result_type")
        fallback = dataclasses.replace(fallback, build=lambda fields, _: result_type(**fields))

    def wrap(front: Callable[..., Any]) -> Callable[..., Any]:
        signature = inspect.signature(front)

        @functools.wraps(front)
        def call(*args: Any, **kwargs: Any) -> Any:
            token = object()
            started = start_drop_in_call(token)
            try:
                return front(*args, **kwargs)
            except UntraceableFunctionError as err:
                if not raised_for(err, token):
                    raise  # a drop-in called inside the user's function: its own error
                untraceable = err
            finally:
                end_drop_in_call(started)
            # (outside the except clause: SciPy's and the user's exceptions do not show
            # this one as their context)
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            return _run(fallback, dict(bound.arguments), untraceable)
        return call
    return wrap


def _run(fb: Fallback, arguments: dict, err: UntraceableFunctionError) -> Any:
    """SciPy's run: at once (eager), or as a host call (traced arguments)."""
    build = fb.build
    assert build is not None  # (set by runs_as_scipy)
    leaves, tree = jax.tree_util.tree_flatten(arguments)
    traced_at = [i for i, leaf in enumerate(leaves) if is_tracer(leaf)]
    cause = err.__cause__ if err.__cause__ is not None else err
    if not traced_at:
        try:
            fields = fb.run(arguments)
        except UntraceableFunctionError as leak:  # from `guarded`: name what is not JAX
            raise not_traceable(err.function, err.argument, "", cause,
                                why=_CLOSES_OVER) from leak
        return build(_as_jax(fields), arguments)
    shapes = fb.shapes(arguments) if fb.shapes is not None else \
        f"{fb.name} with a function written in NumPy runs only eagerly"
    if isinstance(shapes, str):
        raise not_traceable(err.function, err.argument, "", cause, why=(
            f"Its arguments are traced (inside jit, vmap or grad), where a function "
            f"written in NumPy runs only when the result's shapes are known before the "
            f"run: {shapes}.")) from cause

    def host(*values: np.ndarray) -> dict:
        full = list(leaves)
        for i, v in zip(traced_at, values):
            full[i] = v
        fields = fb.run(jax.tree_util.tree_unflatten(tree, full))
        return {k: np.asarray(fields[k], s.dtype).reshape(s.shape) for k, s in shapes.items()}

    host_call = _foreign.foreign(shapes)(host)

    @jax.custom_jvp
    def solve(*values: Any) -> Any:
        return host_call(*values)

    @solve.defjvp
    def _differentiated(primals: tuple, tangents: tuple) -> Any:
        raise not_traceable(err.function, err.argument, "", cause, why=(
            "It is being differentiated, which needs a JAX function.")) from cause

    return build(solve(*[leaves[i] for i in traced_at]), arguments)


def _as_jax(fields: dict) -> dict:
    """NumPy arrays and scalars as JAX arrays (same values, same dtypes under x64);
    everything else (strings, SciPy's interpolants, lists) as it is."""
    def one(v: Any) -> Any:
        if isinstance(v, (np.ndarray, np.generic, bool, int, float)):
            return jax.numpy.asarray(v)
        if isinstance(v, list):
            return [one(x) for x in v]
        return v
    return {k: one(v) for k, v in fields.items()}


def guarded(fun: Any, name: str, what: str) -> Any:
    """`fun` as SciPy should call it: a traced value it closes over (it runs on NumPy
    values, inside `jit` or `grad`) raises `UntraceableFunctionError`; anything else it
    raises surfaces as itself. Event attributes (`terminal`, `direction`) are kept."""
    if not callable(fun):
        return fun

    @functools.wraps(fun)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            out = fun(*args, **kwargs)
        except Exception as exc:
            if not leaked_tracer(exc):
                raise
            raise not_traceable(name, what, "", exc, why=_CLOSES_OVER,
                                doing="calling it with NumPy values") from exc
        if any(is_tracer(leaf) for leaf in jax.tree_util.tree_leaves(out)):
            # (a NumPy value minus a closed-over tracer is a tracer: SciPy would fail)
            raise not_traceable(name, what, "", _returned_tracer(name, what), why=_CLOSES_OVER,
                                doing="calling it with NumPy values")
        return out
    for attribute in ("terminal", "direction"):
        if hasattr(fun, attribute):
            setattr(call, attribute, getattr(fun, attribute))
    return call


_CLOSES_OVER = ("The call is differentiated or traced through a value a function closes "
                "over (a parameter inside jit or grad), which NumPy code cannot read; pass "
                "such values through `args` to run under jit.")


def _returned_tracer(name: str, what: str) -> TypeError:
    return TypeError(f"jaxbridge.scipy.{name}: `{what}` returned a traced value when "
                     f"called with NumPy values: it closes over a traced value")


def check_success(name: str, success: Any, message: str, on_failure: str) -> None:
    """The drop-ins' failure policy on SciPy's own run: "raise" raises `SolverError`
    with SciPy's message; "nan" returns SciPy's values with success False."""
    if on_failure == "raise" and not bool(success):
        raise failure(name, str(message))


def scipy_arguments(arguments: dict, name: str, ours: tuple, functions: tuple) -> dict:
    """The drop-in's bound `arguments` as SciPy's keyword arguments: jaxbridge's own
    keywords (`ours`) left out, the user's `functions` `guarded`."""
    out = {k: v for k, v in arguments.items() if k not in ours}
    for what in functions:
        out[what] = guarded(out[what], name, what)
    return out
