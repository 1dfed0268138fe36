"""SciPy's DF-SANE root finder (`scipy.optimize._spectral`) as a JAX loop.

`root(method="df-sane", stepping="compiled")` runs this instead of SciPy's Python loop:
the same algorithm (spectral residual steps, La Cruz's nonmonotone line search with
SciPy's constants, SciPy's default `eta_k = ||F_0||^2 / (1 + k)^2` and stopping test
`||F_k|| < ftol ||F_0|| + fatol`), hence the same iterates, `nfev` and `nit` up to
rounding, inside the caller's program: no host round trip per residual evaluation
(each one costs tens of microseconds through the host, and a DEQ layer needs dozens).

Only the loop lives here; derivatives come from the implicit function theorem in
`optimize` (`jax.lax.custom_root`), never from differentiating these iterations.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp

# scipy.optimize._linesearch._nonmonotone_line_search_cruz's defaults
_GAMMA, _TAU_MIN, _TAU_MAX = 1e-4, 0.1, 0.5
# the options the compiled loop reproduces; anything else runs SciPy's own loop
OPTIONS = ("ftol", "fatol", "maxfev", "M", "sigma_eps", "sigma_0", "line_search", "disp")


def supported(options: dict) -> bool:
    """Whether the compiled loop reproduces SciPy for these `options`."""
    return (set(options) <= set(OPTIONS) and options.get("line_search", "cruz") == "cruz"
            and not options.get("disp", False)
            and isinstance(options.get("M", 10), int) and options.get("M", 10) >= 1)


class Stats(NamedTuple):
    nfev: jax.Array
    nit: jax.Array
    converged: jax.Array


class _Search(NamedTuple):
    alpha_p: jax.Array
    alpha_m: jax.Array
    alpha_tp: jax.Array
    minus: jax.Array      # the next trial is x - alpha_m d
    xp: jax.Array
    Fp: jax.Array
    fp: jax.Array
    nfev: jax.Array
    accepted: jax.Array
    exhausted: jax.Array  # SciPy's _NoConvergence: maxfev reached before a trial


class _Outer(NamedTuple):
    x: jax.Array
    F: jax.Array
    f: jax.Array          # ||F||^2, SciPy's merit
    sigma: jax.Array
    k: jax.Array
    nfev: jax.Array
    prev: jax.Array       # the last M merits (a ring; -inf where empty)
    converged: jax.Array
    stopped: jax.Array


def solve(F: Callable[[jax.Array], jax.Array], x0: jax.Array, ftol: float = 1e-8,
          fatol: float = 1e-300, maxfev: int = 1000, M: int = 10, sigma_eps: float = 1e-10,
          sigma_0: float = 1.0) -> tuple[jax.Array, Stats]:
    """SciPy's `_root_df_sane(F, x0, ...)` with line_search="cruz" on a flat `x0`.

    Returns the last iterate and (nfev, nit, converged), as SciPy's result reports them.
    """
    F0 = F(x0)
    f0 = jnp.vdot(F0, F0)
    F0_norm = jnp.sqrt(f0)
    prev = jnp.full((M,), -jnp.inf, f0.dtype).at[0].set(f0)
    i32 = jnp.int32

    def line_search(s: _Outer, d: jax.Array, eta: jax.Array) -> _Search:
        f_bar = jnp.max(s.prev)

        def body(ls: _Search) -> _Search:
            exhausted = ls.nfev >= maxfev
            alpha = jnp.where(ls.minus, -ls.alpha_m, ls.alpha_p)
            xp = s.x + alpha * d
            Fp = F(xp)
            fp = jnp.vdot(Fp, Fp)
            a = jnp.abs(alpha)
            ok = (fp <= f_bar + eta - _GAMMA * a ** 2 * s.f) & ~exhausted
            trial = a ** 2 * s.f / (fp + (2 * a - 1) * s.f)
            # after a failed x - alpha_m d: both step lengths shrink (SciPy's clip)
            shrink = ls.minus & ~ok
            alpha_p = jnp.where(shrink, jnp.clip(ls.alpha_tp, _TAU_MIN * ls.alpha_p,
                                                 _TAU_MAX * ls.alpha_p), ls.alpha_p)
            alpha_m = jnp.where(shrink, jnp.clip(trial, _TAU_MIN * ls.alpha_m,
                                                 _TAU_MAX * ls.alpha_m), ls.alpha_m)
            return _Search(alpha_p, alpha_m, jnp.where(ls.minus, ls.alpha_tp, trial),
                           ~ls.minus, jnp.where(ok, xp, ls.xp), jnp.where(ok, Fp, ls.Fp),
                           jnp.where(ok, fp, ls.fp), ls.nfev + jnp.where(exhausted, 0, 1),
                           ok, exhausted)

        one = jnp.ones((), s.f.dtype)
        start = _Search(one, one, one, jnp.zeros((), bool), s.x, s.F, s.f, s.nfev,
                        jnp.zeros((), bool), jnp.zeros((), bool))
        return jax.lax.while_loop(lambda ls: ~ls.accepted & ~ls.exhausted, body, start)

    def outer(s: _Outer) -> _Outer:
        converged = jnp.sqrt(s.f) < ftol * F0_norm + fatol
        # SciPy's control of the spectral parameter ([2] in its docstring)
        sigma = jnp.where(jnp.abs(s.sigma) > 1 / sigma_eps, jnp.sign(s.sigma) / sigma_eps,
                          jnp.where(jnp.abs(s.sigma) < sigma_eps, sigma_eps, s.sigma))
        d = -sigma * s.F
        eta = f0 / (1 + s.k.astype(f0.dtype)) ** 2
        ls = jax.lax.cond(converged, lambda: _Search(  # no search once converged
            sigma, sigma, sigma, jnp.zeros((), bool), s.x, s.F, s.f, s.nfev,
            jnp.zeros((), bool), jnp.zeros((), bool)), lambda: line_search(s, d, eta))
        step = ls.accepted & ~converged
        dx, dF = ls.xp - s.x, ls.Fp - s.F
        new_sigma = jnp.vdot(dx, dx) / jnp.vdot(dx, dF)
        return _Outer(
            jnp.where(step, ls.xp, s.x), jnp.where(step, ls.Fp, s.F),
            jnp.where(step, ls.fp, s.f), jnp.where(step, new_sigma, sigma),
            s.k + step.astype(i32), ls.nfev,
            jnp.where(step, s.prev.at[(s.k + 1) % M].set(ls.fp), s.prev),
            converged, converged | ls.exhausted)

    s0 = _Outer(x0, F0, f0, jnp.asarray(sigma_0, f0.dtype), jnp.zeros((), i32),
                jnp.ones((), i32), prev, jnp.zeros((), bool), jnp.zeros((), bool))
    s = jax.lax.while_loop(lambda s: ~s.stopped, outer, s0)
    return s.x, Stats(s.nfev, s.k, s.converged)
