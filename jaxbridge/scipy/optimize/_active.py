"""Which bounds hold x* (least_squares, minimize): the coordinates the derivative keeps fixed.

A bound the solver stopped just inside of counts as active when a Newton step from
`x*` crosses it (`_weakly_held`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._problem import Problem

#: How far inside a bound (relative to 1 + |bound|) a solver may have stopped for the
#: bound still to be tested as held by `_weakly_held`.
_WEAK_WINDOW = 1e-2


def active(sol: Any, x: np.ndarray, lb: np.ndarray, ub: np.ndarray, pr: Problem,
           dtype: Any) -> np.ndarray:
    """-1/+1 where x* is held at its lower/upper bound, else 0."""
    if pr.kind == "root" or not (np.isfinite(lb).any() or np.isfinite(ub).any()):
        return np.zeros(x.size, np.int8)
    lsq = pr.kind == "least_squares"
    g = pr("G", x)  # at an active bound the gradient pushes outwards
    # least_squares: x* within a few ulps of the bound in the user's dtype. SciPy's
    # "trf" is an interior method that stops a little inside the bound (2e-10 here in
    # float32), and its `active_mask` (relative tolerance `xtol`) misses that for a
    # tight xtol; the derivative w.r.t. the bound would be a silent zero.
    rel = max(1e-10, 4 * float(np.finfo(dtype).eps)) if lsq else 1e-10
    at_lb = (x <= lb + rel * _scale(lb)) & (g > 0)
    at_ub = (x >= ub - rel * _scale(ub)) & (g < 0)
    ours = _weakly_held(at_ub.astype(np.int8) - at_lb.astype(np.int8), x, g, lb, ub, pr)
    if lsq:  # SciPy's mask too, as before: it also holds bounds where g ~ 0
        scipy_mask = np.asarray(sol.active_mask, np.int8)
        return np.where(scipy_mask != 0, scipy_mask, ours).astype(np.int8)
    return ours


def _scale(bound: np.ndarray) -> np.ndarray:
    """1 + |bound|, the scale of the distances to a bound (1 where it is infinite: the
    distance to an infinite bound is infinite, so no tolerance reaches it)."""
    return 1 + np.abs(np.where(np.isfinite(bound), bound, 0))


def _weakly_held(active: np.ndarray, x: np.ndarray, g: np.ndarray, lb: np.ndarray,
                 ub: np.ndarray, pr: Problem) -> np.ndarray:
    """`active` (-1/0/+1) with the bounds that hold although x* stopped inside them.

    Interior and derivative-free methods (least_squares' "trf", minimize's
    "trust-constr" and "Powell") stop short of a bound that holds only weakly, the
    unconstrained optimum just beyond it: 4e-10 to 8e-4 inside at SciPy's default
    tolerances, where a fixed tolerance cannot tell a held bound from a free
    coordinate, and the derivative with respect to the bound would be a silent zero.
    A bound near x* holds if the gradient pushes outwards and the Newton step on the
    coordinates not held (where G = 0 to first order) crosses it; each bound found is
    held in the next step, until no step crosses a new one (an active-set search: one
    linear solve per round, none when no bound is near).
    """
    near_lb = (g > 0) & (x - lb <= _WEAK_WINDOW * _scale(lb))
    near_ub = (g < 0) & (ub - x <= _WEAK_WINDOW * _scale(ub))
    candidate = (near_lb | near_ub) & (active == 0)
    active = active.copy()
    while candidate.any():
        step = pr.solve(x, g, False, active == 0, "auto", "nan")
        if not np.all(np.isfinite(step)):  # no Newton step (singular): keep what is known
            break
        newton = x - step
        cross_lb = candidate & near_lb & (newton <= lb)
        cross_ub = candidate & near_ub & (newton >= ub)
        if not (cross_lb.any() or cross_ub.any()):
            break
        active[cross_lb], active[cross_ub] = -1, 1
        candidate &= ~(cross_lb | cross_ub)
    return active
