"""`solve_ivp` as part of the caller's JAX program (`stepping="compiled"`).

* RK23, RK45, DOP853: SciPy's algorithm as a `lax.while_loop` (`_rk`), no host call;
  its derivatives are JAX's forward mode and the discrete adjoint.
* BDF, Radau, LSODA: SciPy's loop on the host (`_scipy_loop.recorded_solve`), the
  derivatives one compiled loop over its recorded steps (`_stiff`).

Both programs are jitted on the frozen `IvpConfig` (static), so repeated calls with the
same problem reuse the traced loop and its compiled derivatives.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ... import _foreign
from .. import _loops as loops
from . import _rk, _stiff
from ._options import IvpConfig
from ._scipy_loop import fail, recorded_solve, scipy_solve

__all__ = ["compiled_ivp_program", "stiff_ivp_program"]


def _compiled_ivp(cfg: IvpConfig, t0: Any, t1: Any, y0: Any, t_eval: Any, params: tuple,
                  fixed: tuple) -> tuple[jax.Array, jax.Array]:
    """SciPy's explicit RK loop in the caller's program (`_rk.differentiable_solve`):
    no host call, derivatives by JAX (forward) and the discrete adjoint (reverse);
    `vmap` batches the loop itself."""
    rhs, shape, ydtype, tdtype = cfg.fun, y0.shape, y0.dtype, t_eval.dtype
    t0, t1, y0, t_eval, params, fixed = loops.join((t0, t1, y0, t_eval, params, fixed))

    def fun(t: Any, y: Any, p: Any, fx: Any) -> Any:
        out = rhs(rhs.merge(p, fx), t.astype(tdtype), y.reshape(shape).astype(ydtype))
        return jnp.ravel(out).astype(y.dtype)

    opts = dict(cfg.options)
    n = int(np.prod(shape, dtype=int))
    if n == 0:  # SciPy's OdeSolver.step: an empty state ends in one step, after one f call
        # (the loop's error norm over no components is NaN: every step would be rejected)
        return (jnp.zeros((t_eval.shape[0], *shape), ydtype),
                jnp.array([0, 1, 0, 0, 1], jnp.int32))
    L, S = _rk.checkpoint_sizes(cfg.checkpoints, n)
    spec = _rk.Spec(cfg.method, fun, cfg.rtol, opts.get("max_step", np.inf),
                    opts.get("first_step"), L, S, cfg.sensitivity)
    f64_ = jnp.result_type(float)
    ys, status, nfev, steps = _rk.differentiable_solve(
        spec, t0.astype(f64_), jnp.ravel(y0).astype(f64_), t1.astype(f64_),
        t_eval.astype(f64_), jnp.asarray(cfg.state_atol(n), f64_), params, fixed)
    finite = jnp.all(jnp.isfinite(ys))
    if cfg.on_failure == "raise":
        status = _check_status(status, finite, steps, method=cfg.method, budget=L * S)
    status = jnp.where((status == 0) & ~finite, -1, status)
    ys = jnp.where(status == 0, ys, jnp.nan).reshape((t_eval.shape[0], *shape)).astype(ydtype)
    zero = jnp.zeros((), jnp.int32)
    return ys, jnp.stack([status, nfev, zero, zero, steps])


# One jitted program per *structural* configuration (IvpConfig compares its HostFun by
# the traced structure), not per call: eager `grad` through a fresh closure per call
# then reuses the traced loop and its compiled derivatives. Called without it, every
# eager call traced a new while-loop jaxpr (the body closes over a fresh function),
# and JAX compiled and cached it anew: +13 MiB and seconds per call.
compiled_ivp_program = jax.jit(_compiled_ivp, static_argnums=0)


@dataclasses.dataclass(frozen=True)
class _StiffProblem:
    """What `_stiff` needs of one BDF/Radau/LSODA problem (`_stiff.StiffSpec`): frozen
    and compared by value (IvpConfig compares the user's function structurally), so
    repeated solves of the same problem share JAX's caches."""

    cfg: IvpConfig
    shape: tuple
    ydtype: Any
    tdtype: Any

    @property
    def capacity(self) -> int:
        return self.cfg.capacity

    @property
    def eps(self) -> float:
        return float(np.finfo(self.ydtype).eps)

    @property
    def atol(self) -> float:
        return self.cfg.min_atol

    def fun(self, t: Any, y: Any, p: Any, fx: Any) -> Any:
        rhs = self.cfg.fun
        out = rhs(rhs.merge(p, fx), t.astype(self.tdtype),
                  y.reshape(self.shape).astype(self.ydtype))
        return jnp.ravel(out).astype(y.dtype)

    def _host(self, t0: Any, t1: Any, y0: Any, t_eval: Any) -> tuple:
        return t0.astype(self.tdtype), t1.astype(self.tdtype), \
            y0.reshape(self.shape).astype(self.ydtype), t_eval.astype(self.tdtype)

    def solve(self, t0: Any, t1: Any, y0: Any, t_eval: Any, params: Any, fixed: Any,
              jac_ops: Any) -> tuple:
        ys, stats = scipy_solve(*self._host(t0, t1, y0, t_eval), params, fixed, jac_ops,
                                cfg=self.cfg)
        return ys.reshape(t_eval.shape[0], -1).astype(y0.dtype), stats

    def record(self, t0: Any, t1: Any, y0: Any, t_eval: Any, params: Any, fixed: Any,
               jac_ops: Any) -> tuple:
        ys, stats, grid_t, grid_y = recorded_solve(
            *self._host(t0, t1, y0, t_eval), params, fixed, jac_ops, cfg=self.cfg)
        return ys.reshape(t_eval.shape[0], -1).astype(y0.dtype), stats, grid_t, grid_y


def _stiff_ivp(cfg: IvpConfig, t0: Any, t1: Any, y0: Any, t_eval: Any, params: tuple,
               fixed: tuple, jac_ops: tuple) -> tuple[jax.Array, jax.Array]:
    """BDF, Radau, LSODA: SciPy's loop forward (on the host), derivatives compiled from
    its recorded steps (`_stiff`: the Radau IIA discrete adjoint / tangent)."""
    t0, t1, y0, t_eval, params, fixed, jac_ops = loops.join(
        (t0, t1, y0, t_eval, params, fixed, jac_ops))
    f64_ = jnp.result_type(float)
    n = int(np.prod(y0.shape, dtype=int))
    if n == 0:  # SciPy's loop ends at once; nothing to differentiate (and to record)
        return scipy_solve(*jax.lax.stop_gradient((t0, t1, y0, t_eval, params, fixed,
                                                   jac_ops)), cfg=cfg)
    cfg = dataclasses.replace(cfg, capacity=_stiff.max_states(cfg.checkpoints, n))
    problem = _StiffProblem(cfg, tuple(y0.shape), np.dtype(y0.dtype), np.dtype(t_eval.dtype))
    ys, stats = _stiff.differentiable_solve(problem, t0.astype(f64_), t1.astype(f64_),
                                            jnp.ravel(y0).astype(f64_), t_eval.astype(f64_),
                                            params, fixed, jac_ops)
    return ys.reshape((t_eval.shape[0], *y0.shape)).astype(y0.dtype), stats


# Jitted on the structural configuration, as `compiled_ivp_program` (same reason).
stiff_ivp_program = jax.jit(_stiff_ivp, static_argnums=0)


@_foreign.foreign(lambda status, finite, steps, **_: jax.ShapeDtypeStruct((), jnp.int32))
def _check_status(status: Any, finite: Any, steps: Any, *, method: str, budget: int) -> Any:
    """on_failure="raise" for the compiled loop: SciPy's message as a SolverError."""
    code = int(status)
    if code == -2:
        raise ValueError(
            f"jaxbridge.scipy.integrate.solve_ivp: the checkpoint budget is too small: the "
            f"solve took {int(steps)} accepted steps, and the discrete adjoint covers "
            f"{budget} (checkpoints=k covers about (k/2)^2 steps). Pass a larger "
            f"`checkpoints`, or sensitivity='forward'.")
    if code == -1:
        fail("integrate.solve_ivp", method, "Required step size is less than spacing "
              "between numbers.", "raise")
    if not bool(finite):
        fail("integrate.solve_ivp", method, "the solution is not finite", "raise")
    return np.asarray(code, np.int32)

