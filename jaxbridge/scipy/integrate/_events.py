"""Events of `solve_ivp`: SciPy's event-function attributes, and the event times'
derivatives by the implicit function theorem.

SciPy locates the events (`_trajectory`); here, with `g(t*, y(t*), θ) = 0`,
`dt* = -(g_y dy(t*) + g_θ dθ) / (g_t + g_y f)`, written as
`t* + (g - stop_gradient(g)) / -stop_gradient(dg/dt)` so the value is SciPy's and the
derivative flows through `g` (the user's event function, evaluated in JAX, so its own
closed-over parameters are differentiated too); the event states add `f dt*`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ._linear import linear_with_transpose

__all__ = ["event_spec", "event_slot"]

sg = jax.lax.stop_gradient


def event_spec(events: Any, name: str) -> tuple[list, tuple, tuple]:
    """(the event functions, SciPy's `terminal` per event as an int, `direction` per
    event), checked as SciPy checks them."""
    evs = [events] if callable(events) else list(events)
    terminal, direction = [], []
    for i, ev in enumerate(evs):
        if not callable(ev):
            raise TypeError(f"jaxbridge.scipy.{name}: events[{i}] must be callable, got "
                            f"{type(ev).__name__}")
        term = getattr(ev, "terminal", None)
        if term is None or term is False or term == 0:
            term = 0
        elif term is True:
            term = 1
        elif isinstance(term, (int, np.integer)) and term > 0:
            term = int(term)
        else:
            raise ValueError(f"jaxbridge.scipy.{name}: the `terminal` attribute of events[{i}] "
                             f"must be a boolean or positive integer, got {term!r}")
        terminal.append(term)
        direction.append(float(getattr(ev, "direction", 0)))
    return evs, tuple(terminal), tuple(direction)


def event_slot(event: Callable, fun: Callable, args: tuple, t_c: Any, y_c: Any, valid: Any,
               t_safe: Any, y_safe: Any) -> tuple[Any, Any]:
    """The slots of one event function, (t*, y(t*)) per slot with the implicit-function
    derivative (values unchanged); `t_c`, `y_c`, `valid` have one row per slot.

    The event function and `fun` are mapped over the slots with `jax.vmap`; the time
    shift is elementwise and runs on all slots at once, outside the map (its linear map
    with a transpose, batched inside `vmap` and then linearized under `jit`, gave its
    tangent the wrong rank: `jax.grad(jax.jit(loss))` failed).
    """
    def parts(t_c: Any, y_c: Any, valid: Any) -> tuple[Any, ...]:
        t = jnp.where(valid, sg(t_c), t_safe)
        y = jnp.where(valid, y_c, y_safe)
        g = event(t, y, *args)
        f = sg(fun(sg(t), sg(y)))
        _, g_dot = jax.jvp(lambda t, y: event(t, y, *args), (sg(t), sg(y)),
                           (jnp.ones_like(t), f))
        return y, g, f, jnp.where(valid, sg(g_dot), 1.0)

    y, g, f, g_dot = jax.vmap(parts)(t_c, y_c, valid)
    dt = _time_shift(g - sg(g), g_dot)
    nan = jnp.asarray(jnp.nan, t_c.dtype)
    per_slot = (slice(None),) + (None,) * (jnp.ndim(y) - 1)  # dt, valid against y's rows
    # (components that do not move at t* follow y(t*) alone, even where dt* has none)
    return (jnp.where(valid, sg(t_c) + dt, nan),
            jnp.where(valid[per_slot], y + jnp.where(f == 0, 0.0, f * dt[per_slot]), nan))


@jax.custom_jvp
def _time_shift(delta: Any, g_dot: Any) -> Any:
    """The event time's implicit-function shift `-delta / g_dot`, valued exactly 0.

    `delta = g - stop_gradient(g)` is zero, only its derivative `dg` is not, so this is
    `dt* = -dg / (dg/dt)` as a derivative, and adds nothing to SciPy's t*. Where
    `dg/dt = 0` (the event function touches zero without crossing it, e.g. an event
    at t0 with a zero time derivative) t* has no derivative: its tangent is NaN, and
    so is a cotangent through it -- but a zero cotangent (the slot is not used) stays
    zero, so that the gradients of the other outputs (other event slots, y at
    t_eval) stay exact. A plain division would be 0/0 there and make the value itself
    NaN (issue #38).
    """
    return jnp.zeros_like(delta)


@_time_shift.defjvp
def _time_shift_jvp(primals: tuple, tangents: tuple) -> tuple[Any, Any]:
    delta, g_dot = primals
    g_dot = jnp.reshape(g_dot, (-1,))  # one entry per slot: a diagonal map
    flat = g_dot == 0
    scale = jnp.where(flat, jnp.nan, -1.0 / jnp.where(flat, 1.0, g_dot))

    def tangent(v: Any) -> Any:
        return v * scale

    def cotangent(c: Any) -> Any:  # (a diagonal map is its own transpose)
        return jnp.where(flat & (c == 0), 0.0, c * scale)

    d = jnp.reshape(tangents[0], (-1,))
    return jnp.zeros_like(delta), linear_with_transpose(tangent, cotangent, d, d).reshape(
        jnp.shape(delta))

