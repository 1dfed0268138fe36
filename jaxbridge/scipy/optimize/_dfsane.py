"""SciPy's DF-SANE root finder (`scipy.optimize._spectral`) as a JAX loop.

`root(method="df-sane", stepping="compiled")` runs this instead of SciPy's Python loop:
the same algorithm (spectral residual steps, La Cruz's nonmonotone line search with
SciPy's constants, SciPy's default `eta_k = ||F_0||^2 / (1 + k)^2` and stopping test
`||F_k|| < ftol ||F_0|| + fatol`), hence the same iterates, `nfev` and `nit` up to
rounding, inside the caller's program: no host round trip per residual evaluation
(each one costs tens of microseconds through the host, and a DEQ layer needs dozens).
"Up to rounding" is literal: where the line search's accept/reject decisions amplify
rounding (x^3 - 2x + 2 from (0, 1, -3)), SciPy itself takes 122 or 86 evaluations as
x0 moves by 1e-16, and this loop may take a third path to the same tolerance.

Only the loop lives here; derivatives come from the implicit function theorem in
`optimize` (`jax.lax.custom_root`), never from differentiating these iterations.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp

from .. import _loops as loops

# scipy.optimize._linesearch._nonmonotone_line_search_cruz's defaults
_GAMMA, _TAU_MIN, _TAU_MAX = 1e-4, 0.1, 0.5
# the options the compiled loop reproduces; anything else runs SciPy's own loop
OPTIONS = ("ftol", "fatol", "maxfev", "M", "sigma_eps", "sigma_0", "line_search", "disp")


def supported(options: dict) -> bool:
    """Whether the compiled loop reproduces SciPy for these `options`."""
    return (set(options) <= set(OPTIONS) and options.get("line_search", "cruz") == "cruz"
            and not options.get("disp", False)
            and isinstance(options.get("M", 10), int) and options.get("M", 10) >= 1)


def with_tol(options: dict, tol: float | None) -> dict:
    """The loop's keyword arguments: SciPy's root(tol=...) is DF-SANE's ftol, and the
    accepted line_search ("cruz") and disp (False) are SciPy's own behaviour here."""
    options = dict(options)
    if tol is not None:
        options.setdefault("ftol", float(tol))
    options.pop("line_search", None)
    options.pop("disp", None)
    return options


class Stats(NamedTuple):
    nfev: jax.Array
    nit: jax.Array
    status: jax.Array     # 1 converged, 2 stopped at maxfev (the codes of _newton_krylov)
    converged: jax.Array


class _State(NamedTuple):
    x: jax.Array
    F: jax.Array
    f: jax.Array          # ||F||^2, SciPy's merit
    k: jax.Array
    nfev: jax.Array
    prev: jax.Array       # the last M merits (a ring; -inf where empty)
    d: jax.Array          # the search direction -sigma_k F_k
    eta: jax.Array
    f_bar: jax.Array      # max(prev)
    alpha_p: jax.Array    # the line search's step lengths ...
    alpha_m: jax.Array
    alpha_tp: jax.Array
    minus: jax.Array      # ... and whether the next trial is x - alpha_m d
    converged: jax.Array
    stopped: jax.Array


def solve(F: Callable[[jax.Array], jax.Array], x0: jax.Array, ftol: float = 1e-8,
          fatol: float = 1e-300, maxfev: int = 1000, M: int = 10, sigma_eps: float = 1e-10,
          sigma_0: float = 1.0) -> tuple[jax.Array, Stats]:
    """SciPy's `_root_df_sane(F, x0, ...)` with line_search="cruz" on a flat `x0`.

    One loop iteration per residual evaluation (a line-search trial; an accepted one
    also takes the step and sets up the next search): SciPy's nested loops flattened,
    which halves the loop overhead that dominates small problems.
    Returns the last iterate and (nfev, nit, status, converged), as SciPy's result
    reports them (its status code aside: 1 converged, 2 maxfev reached).
    """
    F0 = F(x0)
    f0 = jnp.vdot(F0, F0)
    bar = ftol * jnp.sqrt(f0) + fatol  # SciPy: converged when ||F_k|| < ftol ||F_0|| + fatol
    one = jnp.ones((), f0.dtype)
    false = jnp.zeros((), bool)

    def direction(sigma: jax.Array, Fk: jax.Array) -> jax.Array:
        # SciPy's control of the spectral parameter ([2] in its docstring)
        sigma = jnp.where(jnp.abs(sigma) > 1 / sigma_eps, jnp.sign(sigma) / sigma_eps,
                          jnp.where(jnp.abs(sigma) < sigma_eps, sigma_eps, sigma))
        return -sigma * Fk

    def body(s: _State) -> _State:
        exhausted = s.nfev >= maxfev  # SciPy's _NoConvergence: checked before a trial
        alpha = jnp.where(s.minus, -s.alpha_m, s.alpha_p)
        xp = s.x + alpha * s.d
        Fp = F(xp)
        fp = jnp.vdot(Fp, Fp)
        a = jnp.abs(alpha)
        ok = (fp <= s.f_bar + s.eta - _GAMMA * a ** 2 * s.f) & ~exhausted
        trial = a ** 2 * s.f / (fp + (2 * a - 1) * s.f)
        # after a failed x - alpha_m d both step lengths shrink (SciPy's clip)
        shrink = s.minus & ~ok
        alpha_p = jnp.where(shrink, jnp.clip(s.alpha_tp, _TAU_MIN * s.alpha_p,
                                             _TAU_MAX * s.alpha_p), s.alpha_p)
        alpha_m = jnp.where(shrink, jnp.clip(trial, _TAU_MIN * s.alpha_m,
                                             _TAU_MAX * s.alpha_m), s.alpha_m)
        # an accepted trial: the step, the new spectral parameter, the next search
        dx, dF = xp - s.x, Fp - s.F
        k = s.k + ok.astype(s.k.dtype)
        prev = jnp.where(ok, s.prev.at[k % M].set(fp), s.prev)
        converged = ok & (jnp.sqrt(fp) < bar)
        return _State(
            jnp.where(ok, xp, s.x), jnp.where(ok, Fp, s.F), jnp.where(ok, fp, s.f), k,
            s.nfev + jnp.where(exhausted, 0, 1), prev,
            jnp.where(ok, direction(jnp.vdot(dx, dx) / jnp.vdot(dx, dF), Fp), s.d),
            jnp.where(ok, f0 / (1 + k.astype(f0.dtype)) ** 2, s.eta),
            jnp.where(ok, jnp.max(prev), s.f_bar),
            jnp.where(ok, one, alpha_p), jnp.where(ok, one, alpha_m),
            jnp.where(s.minus, s.alpha_tp, trial), ~s.minus & ~ok,
            converged, converged | exhausted)

    converged0 = jnp.sqrt(f0) < bar
    prev0 = jnp.full((M,), -jnp.inf, f0.dtype).at[0].set(f0)
    s0 = _State(x0, F0, f0, jnp.zeros((), jnp.int32), jnp.ones((), jnp.int32), prev0,
                direction(jnp.asarray(sigma_0, f0.dtype), F0), f0, f0, one, one, one, false,
                converged0, converged0)
    s = loops.while_loop(lambda s: ~s.stopped, body, s0)
    return s.x, Stats(s.nfev, s.k, jnp.where(s.converged, 1, 2), s.converged)
