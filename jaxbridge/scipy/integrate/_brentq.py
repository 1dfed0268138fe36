"""SciPy's `brentq` as a `lax.while_loop`: the root finder `solve_ivp` locates events with.

The iteration is SciPy's C code (`scipy/optimize/Zeros/brentq.c`, SciPy 1.17) step for
step: the same bracket updates, inverse quadratic / linear steps, bisection fallbacks
and stopping rule `|x_blk - x_cur| / 2 < (xtol + rtol |x_cur|) / 2`, so the same iterates
and the same root to rounding. Where SciPy's Python wrapper raises -- a value that is
NaN, no sign change between the ends, no convergence within `maxiter` -- `ok` is False
and the caller must not use the root (the event path then runs SciPy itself, which
raises as it does).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax.numpy as jnp

from .. import _loops as loops

__all__ = ["brentq"]


class _State(NamedTuple):
    i: Any
    xpre: Any
    xcur: Any
    xblk: Any
    fpre: Any
    fcur: Any
    fblk: Any
    spre: Any
    scur: Any
    done: Any       # converged (or refused at the start)
    nan: Any        # a function value was NaN


def _step(f: Callable[[Any], Any], xtol: float, rtol: float, s: _State) -> _State:
    """One pass of brentq.c's loop body (its `return xcur` sets `done`)."""
    xpre, xcur, xblk, fpre, fcur, fblk, spre, scur = s[1:9]
    crossed = (fpre != 0) & (fcur != 0) & (jnp.signbit(fpre) != jnp.signbit(fcur))
    xblk, fblk = jnp.where(crossed, xpre, xblk), jnp.where(crossed, fpre, fblk)
    spre, scur = (jnp.where(crossed, xcur - xpre, v) for v in (spre, scur))
    swap = jnp.abs(fblk) < jnp.abs(fcur)
    xpre, xcur, xblk = (jnp.where(swap, a, b) for a, b in ((xcur, xpre), (xblk, xcur),
                                                            (xcur, xblk)))
    fpre, fcur, fblk = (jnp.where(swap, a, b) for a, b in ((fcur, fpre), (fblk, fcur),
                                                            (fcur, fblk)))
    delta = (xtol + rtol * jnp.abs(xcur)) / 2
    sbis = (xblk - xcur) / 2
    converged = (fcur == 0) | (jnp.abs(sbis) < delta)
    stry_interpolate = -fcur * (xcur - xpre) / (fcur - fpre)
    dpre = (fpre - fcur) / (xpre - xcur)
    dblk = (fblk - fcur) / (xblk - xcur)
    stry_extrapolate = -fcur * (fblk * dblk - fpre * dpre) / (dblk * dpre * (fblk - fpre))
    stry = jnp.where(xpre == xblk, stry_interpolate, stry_extrapolate)
    tried = (jnp.abs(spre) > delta) & (jnp.abs(fcur) < jnp.abs(fpre))
    good = tried & (2 * jnp.abs(stry) < jnp.minimum(jnp.abs(spre), 3 * jnp.abs(sbis) - delta))
    spre, scur = jnp.where(good, scur, sbis), jnp.where(good, stry, sbis)
    x_next = xcur + jnp.where(jnp.abs(scur) > delta, scur, jnp.where(sbis > 0, delta, -delta))
    f_next = f(x_next)
    # Converged: SciPy returns this pass's (swapped) xcur; the evaluation is discarded.
    return _State(
        i=s.i + 1, xpre=jnp.where(converged, xpre, xcur), xcur=jnp.where(converged, xcur, x_next),
        xblk=xblk, fpre=jnp.where(converged, fpre, fcur), fcur=jnp.where(converged, fcur, f_next),
        fblk=fblk, spre=spre, scur=scur, done=converged,
        nan=s.nan | (~converged & jnp.isnan(f_next)))


def brentq(f: Callable[[Any], Any], xa: Any, xb: Any, xtol: float, rtol: float,
           maxiter: int = 100) -> tuple[Any, Any]:
    """`scipy.optimize.brentq(f, xa, xb, xtol=xtol, rtol=rtol, maxiter=maxiter)`:
    `(root, ok)`, `ok` False where SciPy would raise (see the module docstring).

    >>> import jax.numpy as jnp
    >>> root, ok = brentq(lambda x: x * x - 2.0, jnp.float32(0.0), jnp.float32(2.0),
    ...                   xtol=1e-6, rtol=1e-6)
    >>> round(float(root), 5), bool(ok)
    (1.41421, True)
    """
    fa, fb = f(xa), f(xb)
    nan = jnp.isnan(fa) | jnp.isnan(fb)
    at_a, at_b = fa == 0, fb == 0
    same_sign = ~at_a & ~at_b & (jnp.signbit(fa) == jnp.signbit(fb))
    zero = jnp.zeros_like(xa)
    start = _State(i=jnp.asarray(0, jnp.int32), xpre=xa, xcur=xb, xblk=zero, fpre=fa,
                   fcur=fb, fblk=jnp.zeros_like(fa), spre=zero, scur=zero,
                   done=at_a | at_b | same_sign | nan, nan=nan)
    end = loops.while_loop(lambda s: ~s.done & ~s.nan & (s.i < maxiter),
                           lambda s: _step(f, xtol, rtol, s), start)
    root = jnp.where(at_a, xa, jnp.where(at_b, xb, end.xcur))
    ok = ~end.nan & ~same_sign & (at_a | at_b | end.done)
    return root, ok
