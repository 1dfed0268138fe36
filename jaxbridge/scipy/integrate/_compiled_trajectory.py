"""`_trajectory`'s results (events, dense output, step times) from SciPy's RK loop
compiled: what a repeat eager call of RK23 or RK45 runs.

`_trajectory` runs SciPy's own loop on the host, one JAX call per evaluation of the
user's function (~20 us each): a repeat eager call of RK45 with `dense_output` or
`events` stayed at 2-4x the goal of issue #44 item 8 (2x SciPy's own time + 100 us;
benchmarks/results/scipy-eager-2026-11-29). Here the step loop is `_rk`'s (SciPy's
tableaus, step control and first step: the same steps and `nfev`), and after each
accepted step it does what SciPy's `solve_ivp` does after `solver.step()`:

* builds the step's interpolant (`RkDenseOutput`, `Dop853DenseOutput`, laid out as
  `_dense.coefficients` lays them out) and keeps it for `dense_output`;
* evaluates the event functions at the step's end, finds the active ones as
  `find_active_events` does (sign change, `direction`), locates each by SciPy's
  `brentq` on the interpolant (`_brentq`, xtol = rtol = 4 EPS) and applies
  `handle_events`' terminal rule (a count per event, the earliest root first);
* fills the outputs at the `t_eval` points the step covers, or the step's end.

It returns `trajectory`'s dict, so the rest of the program is the same, and `sure`:
False where the loop cannot vouch for SciPy's result -- a failed step, a state that is
not finite, a bracket brentq refuses or a root it does not converge to (SciPy raises
there), a terminal root at the start of a later step with `t_eval=None` and dense
output (SciPy drops that segment), more steps than `max_steps` -- and the caller then runs
`_trajectory` instead, which gives SciPy's own result or error.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from .. import _loops as loops
from . import _dense, _rk
from ._brentq import brentq
from ._options import IvpConfig

__all__ = ["compiled_trajectory", "applies"]

EPS = float(np.finfo(float).eps)
# The step sizes follow the rounding of the error estimate, a sum of the stages that
# cancels to ~EPS/rtol relative (XLA contracts multiply-adds into FMAs, NumPy's BLAS
# sums in its own order), and step times are outputs here. RK23/RK45's step times
# agreed with SciPy's to ~1e-9 relative (3e-7 at worst, at rtol=1e-8); DOP853's, whose
# estimate sums 13 stages twice, by 5e-6 to 2e-5 at rtol=1e-8 to 1e-10 (2026-11-29):
# DOP853 keeps SciPy's loop.
METHODS = ("RK23", "RK45")
ROOT_TOL = 4 * EPS  # SciPy's solve_event_equation: brentq(xtol=4 * EPS, rtol=4 * EPS)


def applies(cfg: IvpConfig, t0: Any, t1: Any, n: int) -> bool:
    """Whether the compiled loop gives SciPy's result for this call (concrete `t0`, `t1`):
    RK23 or RK45 with the loop's options and x64 (`_rk.supported`, recorded as
    `cfg.stepping == "compiled"`), a state and a span that are not empty, a
    `first_step` within the span (SciPy raises otherwise) and no `rtol` SciPy would
    raise to 100 EPS (with a warning)."""
    if cfg.stepping != "compiled" or cfg.method not in METHODS or n == 0 or \
            float(t0) == float(t1):
        return False
    first = dict(cfg.options).get("first_step")
    if first is not None and float(first) > abs(float(t1) - float(t0)):
        return False
    return bool(np.min(cfg.rtol) >= 100 * EPS)


class _Carry(NamedTuple):
    """The loop's state: `_rk`'s, the event values and slots."""

    state: _rk.LoopState
    g: Any        # (E,) the event functions at state.t
    n_ev: Any     # (E,) events recorded per function (also those past max_events)
    t_ev: Any     # (E, M)
    y_ev: Any     # (E, M, n)
    stop: Any     # a terminal event ended the solve
    term: Any     # which one (-1: none)
    sure: Any     # every root located as SciPy locates it


class _Records(NamedTuple):
    """Per accepted step, what `dense_output` and the step outputs keep: written outside
    the loop body's `cond`, whose operands and results then never include arrays of
    `max_steps` rows."""

    nodes_t: Any  # (S + 1,) step ends (empty unless cfg.nodes)
    nodes_y: Any  # (S + 1, n)
    seg: Any      # (S, 2) per step: t_old, h (empty unless cfg.dense)
    y_old: Any    # (S, n)
    C: Any        # (S, rows, n)


class _Problem(NamedTuple):
    """One call's loop: its configuration, stepper and event functions."""

    cfg: IvpConfig
    rk: Any
    events: tuple  # event(t, y (n,)) -> float64 scalar, per event function
    max_count: Any  # (E,) SciPy's max_events: `terminal`, inf where not terminal


def _find_active(g: Any, g_new: Any, direction: Any) -> Any:
    """SciPy's `find_active_events`, as a mask."""
    up = (g <= 0) & (g_new >= 0)
    down = (g >= 0) & (g_new <= 0)
    return up & (direction > 0) | down & (direction < 0) | (up | down) & (direction == 0)


def _handle_events(pb: _Problem, c: _Carry, active: Any, roots: Any, forward: Any
                   ) -> tuple[Any, Any, Any]:
    """SciPy's `handle_events` after the roots: (which events are recorded, whether
    the solve terminates, which event terminates it). Terminating: the active events
    in the order of their roots (stable, as NumPy's sort of a few values), up to the
    first whose count reaches its `terminal`."""
    key = jnp.where(forward, roots, -roots)
    E = roots.shape[0]
    idx = jnp.arange(E)
    before = (key[None, :] < key[:, None]) | ((key[None, :] == key[:, None])
                                              & (idx[None, :] < idx[:, None]))
    rank = jnp.sum(active[None, :] & before, axis=1)
    hit = active & (c.n_ev + 1 >= pb.max_count)
    terminate = jnp.any(hit)
    first = jnp.min(jnp.where(hit, rank, E))
    recorded = active & (~terminate | (rank <= first))
    term = jnp.argmax(hit & (rank == first))
    return recorded, terminate, term


def _events_step(pb: _Problem, c: _Carry, new: _rk.LoopState, value: Any, t_old: Any
                 ) -> tuple[_Carry, Any, Any, Any]:
    """The event handling of one accepted step: (carry, active any, t_end, y_end)."""
    g_new = jnp.stack([ev(new.t, new.y) for ev in pb.events])
    active = _find_active(c.g, g_new, jnp.asarray(pb.cfg.direction))

    def locate(i: int) -> Any:
        ev = pb.events[i]
        return loops.cond(active[i], lambda: brentq(lambda t: ev(t, value(t)), t_old, new.t,
                                                    ROOT_TOL, ROOT_TOL),
                          lambda: (new.t, jnp.asarray(True)))
    found = [locate(i) for i in range(len(pb.events))]
    roots = jnp.stack([r for r, _ in found])
    sure = c.sure & jnp.all(jnp.stack([ok | ~active[i] for i, (_, ok) in enumerate(found)]))
    recorded, terminate, term = _handle_events(pb, c, active, roots, new.t > t_old)
    M = c.t_ev.shape[1]
    slot = recorded[:, None] & (jnp.arange(M)[None, :] == c.n_ev[:, None])
    y_roots = jax.vmap(value)(roots)
    t_end = jnp.where(terminate, roots[term], new.t)
    c = c._replace(
        g=g_new, n_ev=c.n_ev + recorded.astype(jnp.int32),
        t_ev=jnp.where(slot, roots[:, None], c.t_ev),
        y_ev=jnp.where(slot[..., None], y_roots[:, None, :], c.y_ev),
        stop=terminate, term=jnp.where(terminate, term, -1).astype(jnp.int32), sure=sure)
    return c, jnp.any(active), t_end, jnp.where(terminate, value(t_end), new.y)


def _accepted(pb: _Problem, c: _Carry, new: _rk.LoopState, h: Any, K: Any
              ) -> tuple[_Carry, tuple]:
    """What SciPy's `solve_ivp` does after one accepted step (see the module docstring):
    the carry, and the step's records (t_end, y_end, its interpolant's coefficients)."""
    cfg, rk, old = pb.cfg, pb.rk, c.state
    coef, extra = rk.coefficients(old.t, old.y, new.y, new.f, K, h)
    value = functools.partial(_dense.segment, cfg.method, old.t, h, old.y, coef)
    t_end, y_end, active = new.t, new.y, jnp.asarray(False)
    if pb.events:
        c, active, t_end, y_end = _events_step(pb, c, new, value, old.t)
        # (SciPy's `donot_append`: a terminal root at the start of a later step)
        dropped = c.stop & (t_end == old.t) & (old.n_accepted > 0)
        c = c._replace(sure=c.sure & ~(dropped & cfg.steps & cfg.dense))
    covers = ~new.done_eval & (rk.direction * (rk.t_eval - t_end) <= 0)
    ys = loops.cond(jnp.any(covers), lambda ys: jnp.where(
        covers[:, None], jax.vmap(value)(rk.t_eval), ys), lambda ys: ys, new.ys)
    # SciPy builds the interpolant (DOP853: 3 more evaluations) once, where it needs it
    needed = jnp.asarray(cfg.dense) | active | jnp.any(covers)
    new = new._replace(ys=ys, done_eval=new.done_eval | covers,
                       nfev=new.nfev + jnp.where(needed, extra, 0).astype(jnp.int32))
    return c._replace(state=new), (t_end, y_end, coef)


def _record(cfg: IvpConfig, rec: _Records, old: _rk.LoopState, h: Any, row: tuple
            ) -> _Records:
    """The step's records at row `old.n_accepted` (a rejected attempt writes there too:
    the next accepted step overwrites it, and rows past the last step are padding)."""
    k = old.n_accepted
    t_end, y_end, coef = row
    if cfg.nodes:
        rec = rec._replace(nodes_t=rec.nodes_t.at[k + 1].set(t_end),
                           nodes_y=rec.nodes_y.at[k + 1].set(y_end))
    if cfg.dense:
        rec = rec._replace(seg=rec.seg.at[k].set(jnp.stack([old.t, h])),
                           y_old=rec.y_old.at[k].set(old.y), C=rec.C.at[k].set(coef))
    return rec


def _run(pb: _Problem, t0: Any, y0: Any, ev0: Any) -> tuple[_Carry, _Records]:
    """The step loop: attempts until t_bound, a terminal event, a failure or (with
    nodes) `max_steps` accepted steps."""
    cfg, rk = pb.cfg, pb.rk
    n, E, M, S = y0.shape[0], len(pb.events), cfg.max_events, cfg.max_steps
    nodes, segs = (S + 1 if cfg.nodes else 0), (S if cfg.dense else 0)
    rows = _dense.n_coefficients(cfg.method)
    start = rk.start(t0, y0, dict(cfg.options).get("first_step"))
    # (`start` ends a solve without t_eval points at once: here the steps are outputs;
    # t0 == t_bound does not come here, `applies`)
    start = start._replace(status=jnp.ones_like(start.status))
    c = _Carry(state=start, g=ev0, n_ev=jnp.zeros(E, jnp.int32),
               t_ev=jnp.full((E, M), jnp.nan), y_ev=jnp.full((E, M, n), jnp.nan),
               stop=jnp.asarray(False), term=jnp.asarray(-1, jnp.int32),
               sure=jnp.asarray(True))
    rec = _Records(nodes_t=jnp.full(nodes, t0), nodes_y=jnp.broadcast_to(y0, (nodes, n)),
                   seg=jnp.zeros((segs, 2)), y_old=jnp.zeros((segs, n)),
                   C=jnp.zeros((segs, rows, n)))

    def running(carry: tuple) -> Any:
        c = carry[0]
        room = c.state.n_accepted < S if cfg.nodes else True
        return (c.state.status == 1) & ~c.stop & room

    def body(carry: tuple) -> tuple:
        c, rec = carry
        new, accepted, h, K = rk.attempt_stages(c.state, outputs=False)
        blank = (new.t, new.y, jnp.zeros((rows, n)))
        c_new, row = loops.cond(accepted, lambda c: _accepted(pb, c, new, h, K),
                                lambda c: (c._replace(state=new), blank), c)
        return c_new, _record(cfg, rec, c.state, h, row)
    return loops.while_loop(running, body, (c, rec))


def _padded(a: Any, m: Any) -> Any:
    """`a` with its rows from `m` on repeating row `m - 1` (`_trajectory._fill_rows`)."""
    if a.shape[0] == 0:
        return a
    k = jnp.arange(a.shape[0]).reshape(-1, *([1] * (a.ndim - 1)))
    return jnp.where(k < m, a, a[jnp.maximum(m - 1, 0)])


def _out(pb: _Problem, c: _Carry, rec: _Records, shape: tuple, tdtype: Any, ydtype: Any
         ) -> dict:
    """`trajectory`'s dict from the loop's end state."""
    cfg, s = pb.cfg, c.state
    m = s.n_accepted + 1
    stats = jnp.stack([jnp.where(c.stop, 1, 0), s.nfev, 0, 0,
                       m if cfg.steps else jnp.sum(s.done_eval), m if cfg.nodes else 0,
                       c.term]).astype(jnp.int32)
    seg, y_old, C = (_padded(a, s.n_accepted) for a in (rec.seg, rec.y_old, rec.C))
    nodes_t, nodes_y = _padded(rec.nodes_t, m), _padded(rec.nodes_y, m)
    if cfg.dense and not cfg.steps:  # SciPy's sol.sol(ts): the segment ending there
        sol = _dense.OdeSolution(cfg.method, (s.y.shape[0],), _dense.DenseArrays(
            nodes_t, m, seg[:, 0], seg[:, 1], y_old, C, None, None, None))
        nodes_y = jax.vmap(sol.value)(nodes_t)
    ys = jnp.where(s.done_eval[:, None], s.ys, jnp.nan)
    return {
        "ys": ys.reshape(ys.shape[0], *shape).astype(ydtype),
        "t_ev": c.t_ev.astype(tdtype),
        "y_ev": c.y_ev.reshape(*c.y_ev.shape[:2], *shape).astype(ydtype),
        "n_ev": c.n_ev, "nodes_t": nodes_t.astype(tdtype),
        "nodes_y": nodes_y.reshape(nodes_y.shape[0], *shape).astype(ydtype),
        "seg": seg.astype(tdtype), "y_old": y_old.astype(ydtype), "C": C.astype(ydtype),
        "stats": stats}


def compiled_trajectory(cfg: IvpConfig, t0: Any, t1: Any, y0: Any, t_eval: Any,
                        params: tuple, fixed: tuple, ev_ops: tuple) -> tuple[dict, Any]:
    """`_trajectory.trajectory`'s dict for this call, and whether it is sure to be
    SciPy's (else the caller runs `trajectory`). Traceable; not differentiable (an
    eager call differentiates nothing)."""
    shape, tdtype, ydtype = tuple(y0.shape), t_eval.dtype, y0.dtype
    f64_ = jnp.float64
    rhs = cfg.fun

    def fun(t: Any, y: Any) -> Any:
        out = rhs(rhs.merge(params, fixed), t.astype(tdtype), y.reshape(shape).astype(ydtype))
        return jnp.ravel(out).astype(f64_)

    def event(hf: Any, ops: tuple, t: Any, y: Any) -> Any:
        return jnp.asarray(hf(ops, t.astype(tdtype), y.reshape(shape).astype(ydtype)), f64_)
    events = tuple(functools.partial(event, hf, ops) for hf, ops in zip(cfg.events, ev_ops))
    t0, t1, y0f = t0.astype(f64_), t1.astype(f64_), jnp.ravel(y0).astype(f64_)
    n = y0f.shape[0]
    rk = _rk.stepper(cfg.method, fun, t0, y0f, t1, t_eval.astype(f64_), cfg.rtol,
                     jnp.asarray(cfg.state_atol(n), f64_),
                     dict(cfg.options).get("max_step", np.inf))
    max_count = jnp.asarray([float(k) if k else np.inf for k in cfg.terminal], f64_)
    pb = _Problem(cfg, rk, events, max_count)
    ev0 = jnp.stack([ev(t0, y0f) for ev in events]) if events else jnp.zeros(0, f64_)
    c, rec = _run(pb, t0, y0f, ev0)
    s = c.state
    sure = c.sure & ((s.status == 0) | c.stop) & jnp.all(jnp.isfinite(s.y))
    return _out(pb, c, rec, shape, tdtype, ydtype), sure
