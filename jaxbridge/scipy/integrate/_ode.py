"""One ODE for SciPy's host loop: the method names, what `solve_ivp` returns and the
JAX functions of the problem (right-hand side, Jacobian, forward-sensitivity system)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree

from .._common import Result
from .._trace import HostFun

METHODS = ("RK23", "RK45", "DOP853", "Radau", "BDF", "LSODA")
IMPLICIT_METHODS = ("Radau", "BDF", "LSODA")


class OdeResult(Result):
    """What :func:`solve_ivp` returns: SciPy's `OdeResult` fields.

    `t` (T,), `y` (y0.shape + (T,)), `status` (0: reached the end; -1: a step failed,
    only with `on_failure="nan"`), `success`, and SciPy's counters `nfev`, `njev`,
    `nlu` (of the forward solve). `sol` (with ``dense_output=True``), `t_events` and
    `y_events` (with ``events=``) are set by the events path (`_trajectory`), else None.
    """

    _fields = ("t", "y", "sol", "t_events", "y_events", "nfev", "njev", "nlu", "status",
               "success")
    _messages: ClassVar[dict[int, str]] = {
        0: "The solver successfully reached the end of the integration interval.",
        -1: "Integration step failed."}


class OdeEventResult(OdeResult):
    """:class:`OdeResult` of a solve with events, dense output or `t_eval=None`.

    SciPy's fields, with static shapes: `t` (= t_eval, or SciPy's step times padded
    with `inf` to `max_steps + 1`), `y` (`y0.shape + (len(t),)`; NaN at t_eval times
    after a terminal event, `inf` past the last step), `t_events` (a list, one array
    of length `max_events` per event function, NaN past the last stored event),
    `y_events` (likewise, `(max_events,) + y0.shape`), `sol` (an
    :class:`OdeSolution`, a JAX function, with dense_output=True), `status` (0, 1: a
    terminal event, -1), plus the counts `n_events` (int array, one per event
    function: all events SciPy found, which may exceed `max_events`) and `n_points`
    (valid entries of `t`, SciPy's `len(sol.t)`).
    """

    # (OdeResult's _fields is inferred as a fixed-length tuple; this one is longer)
    _fields = OdeResult._fields + ("n_events", "n_points")  # type: ignore[assignment]
    _messages: ClassVar[dict[int, str]] = {
        **OdeResult._messages, 1: "A termination event occurred."}



def ode_functions(fun: HostFun, jac: HostFun | bool | None, shape: tuple, ydtype: Any,
                  tdtype: Any) -> dict[str, Callable[..., Any]]:
    """The JAX functions SciPy's host loop calls for `y' = fun(t, y)`, on flat float64
    states; each takes the fixed (non-differentiable) operands `fx` first.

    * `f(fx, t, y, p)`: the right-hand side, (n,);
    * `jac(fx, jo, t, y, p)`: df/dy (n, n): the user's `jac` (operands `jo`) if given,
      else JAX's;
    * `sens(fx, t, z, p, dp)`: the forward-sensitivity system of `z = [y, vec(S)]`,
      `S' = f_y S + f_p dp` with S (n, K) and the parameter directions dp (P, K);
    * `sens_jac(fx, t, z, p, dp)`: its Jacobian in z (for the implicit methods).
    """
    shape = tuple(shape)
    n = 1
    for d in shape:
        n *= int(d)

    def f(fx: Any, t: Any, y: Any, p: Any) -> Any:
        out = fun(fun.merge(p, fx), t.astype(tdtype), y.reshape(shape).astype(ydtype))
        return jnp.ravel(out).astype(y.dtype)

    def jac_y(fx: Any, jo: Any, t: Any, y: Any, p: Any) -> Any:
        if isinstance(jac, HostFun):
            out = jac(jo, t.astype(tdtype), y.reshape(shape).astype(ydtype))
            return jnp.reshape(out, (n, n)).astype(y.dtype)
        return jax.jacfwd(f, argnums=2)(fx, t, y, p)

    def sens(fx: Any, t: Any, z: Any, p: Any, dp: Any) -> Any:
        y, S = z[:n], z[n:].reshape(n, -1)
        flat, unravel = ravel_pytree(p)

        def column(s: Any, d: Any) -> Any:
            return jax.jvp(lambda y, q: f(fx, t, y, unravel(q)), (y, flat), (s, d))[1]
        dS = jax.vmap(column, in_axes=1, out_axes=1)(S, dp.astype(flat.dtype))
        return jnp.concatenate([f(fx, t, y, p), jnp.ravel(dS)])

    def sens_jac(fx: Any, t: Any, z: Any, p: Any, dp: Any) -> Any:
        return jax.jacfwd(sens, argnums=2)(fx, t, z, p, dp)

    return {"f": f, "jac": jac_y, "sens": sens, "sens_jac": sens_jac}
