"""Finite differences that do not cry wolf: per-element steps, Richardson extrapolation
(Ridders' method) with an error estimate per output element, and a complex step
where the function allows it.

Why per element: one step for a whole array (say, scaled by its RMS value) is far too
large for its small elements and needlessly small for its large ones. On inputs
spanning [-2, 20], a step fit for 20 puts ``erfcx`` near -2, where it changes by a
factor e^4 per unit, deep into its nonlinearity; a step fit for -2 drowns 20 in
round-off. So a direction perturbs each element in proportion to its own magnitude
(:func:`element_scales`), and :func:`ridders` shrinks the step geometrically,
extrapolating the central differences to zero step (a Neville tableau, as in
Numerical Recipes' ``dfridr``) and keeping, *for each output element*, the entry
whose estimated error is smallest. Near a singularity or a domain boundary the
first (largest) steps give non-finite or wild values; those entries carry an
infinite error and are never chosen.

The error bound that comes with each estimate (Ridders' own estimate times a safety
factor, plus the round-off and nondeterminism of the function values and the rounding
of the perturbed inputs, divided by the step, plus a floor of a few dozen ulps for the
library's own smooth inaccuracy) is added to the tolerance of every comparison,
elementwise: a correct rule is never failed because the reference was inaccurate; a
wrong rule is still caught wherever the reference is accurate enough to show it.
(For the SciPy functions of the tests in float32, the actual error, measured against
their float64 derivatives, stays below half of this bound.)

A complex step, ``Im f(x + i h t) / h`` (no subtractive cancellation, so accurate to
machine precision), refines the estimate where the function accepts complex inputs,
keeps their real part, and agrees with Ridders' estimate within its error bound:
the refined bound is their observed disagreement, so it is never a guess.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

#: Step ratio between the levels of the Richardson tableau and the maximal number
#: of levels: steps go from `h0` down to ``h0 / 2**(LEVELS - 1)`` (1/2048 of h0).
RATIO, LEVELS = 2.0, 12
#: Stop refining an element once a new diagonal entry is this much worse than its best
#: and its error estimate is below CONVERGED relative (or zero).
SAFE, CONVERGED = 2.0, 1e-2
#: Ridders' error estimate is multiplied by this before it widens a tolerance.
SAFETY = 10.0
#: A library function is accurate to a few ulps, with an error that varies smoothly with
#: x (which no step size can detect), so no derivative of it is trusted to better than
#: this many machine epsilons relative.
ULPS = 64

Outputs = list[np.ndarray]


@dataclasses.dataclass
class Derivative:
    """A finite-difference directional derivative, one array per output.

    Attributes:
      value: the estimates (float64 or complex128).
      error: an elementwise bound on their error (float64, >= 0; inf where nothing
        could be estimated).
    """

    value: Outputs
    error: Outputs

    def column(self, o: int) -> tuple[np.ndarray, np.ndarray]:
        """(value, error) of output `o`, flattened."""
        return self.value[o].ravel(), self.error[o].ravel()


def element_scales(x: np.ndarray) -> np.ndarray:
    """The size of each element of `x` that its finite-difference steps are relative to.

    ``|x_i|`` (floating point is relative, so even a tiny element can take a relative
    step), except for elements that are zero (or subnormal), where a relative step is
    no step: they get the smallest normal magnitude in the array (1 if there is none).

    Example:
        >>> element_scales(np.array([-2.0, 0.0, 1e-3, 20.0])).tolist()
        [2.0, 0.001, 0.001, 20.0]
    """
    a = np.abs(np.asarray(x)).astype(np.float64)
    if a.size == 0:
        return a
    ok = np.isfinite(a) & (a >= np.finfo(np.float32).tiny)
    floor = float(np.min(a[ok])) if ok.any() else 1.0
    return np.where(ok, a, floor)


def direction(rng: np.random.Generator, scales: np.ndarray, dtype: Any) -> np.ndarray:
    """A random direction whose element i has magnitude in [scales_i / 2, scales_i]
    (bounded, so a relative step never flips the sign of an element; never small, so
    every element is exercised)."""
    shape = np.shape(scales)
    mag = rng.uniform(0.5, 1.0, shape) * scales
    if np.issubdtype(np.dtype(dtype), np.complexfloating):
        phase = np.exp(2j * np.pi * rng.uniform(0.0, 1.0, shape))
        return (mag * phase).astype(dtype)
    return (mag * rng.choice([-1.0, 1.0], shape)).astype(dtype)


def _wide(v: Any) -> np.ndarray:
    v = np.asarray(v)
    return v.astype(np.result_type(v.dtype, np.float64))


def _err(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    d = np.abs(a - b)
    return np.where(np.isfinite(d), d, np.inf)


def ridders(at: Callable[[float], Sequence[Any]], h0: float, eps_mach: float,
            nondet_tol: float = 0.0) -> Derivative:
    """The derivative at 0 of ``h -> at(h)`` (a list of arrays) by Richardson
    extrapolation of central differences with steps ``h0, h0/2, h0/4, ...``.

    Per output element the tableau entry with the smallest estimated error is kept;
    an element stops refining once a new diagonal entry is worse than ``SAFE`` times
    its best error (the step has become too small for round-off), and evaluation stops
    when every element has stopped or after ``LEVELS`` levels.

    Example:
        >>> d = ridders(lambda h: [np.exp(np.array([1.0, 2.0]) + h)], 0.5, 2.2e-16)
        >>> np.allclose(d.value[0], np.exp([1.0, 2.0]), rtol=1e-12), bool(d.error[0].max() < 1e-9)
        (True, True)
    """
    h = float(h0)
    prev: list[Outputs] = []
    best: Outputs | None = None
    err: Outputs = []
    noise: Outputs = []
    active: list[np.ndarray] = []
    for level in range(LEVELS):
        plus, minus = [_wide(v) for v in at(h)], [_wide(v) for v in at(-h)]
        central = [(p - m) / (2 * h) for p, m in zip(plus, minus)]
        # Round-off over the step: of the function values, of their nondeterminism, and
        # of the perturbed inputs themselves (``x + h t`` is rounded to about eps |x|,
        # which the function amplifies by |f'| x; with directions scaled to |x| that is
        # about eps times the derivative estimate).
        rnd = [(eps_mach * (np.abs(p) + np.abs(m)) + 2 * nondet_tol) / (2 * h)
               + 2 * eps_mach * np.abs(c) / h for p, m, c in zip(plus, minus, central)]
        row = [central]
        if best is None:
            best = [c.copy() for c in central]
            err = [np.full(c.shape, np.inf) for c in central]
            noise = [np.where(np.isfinite(r), r, np.inf) for r in rnd]
            active = [np.ones(c.shape, bool) for c in central]
        fac = RATIO ** 2
        for j in range(1, level + 1):
            row.append([(a * fac - b) / (fac - 1) for a, b in zip(row[j - 1], prev[j - 1])])
            fac *= RATIO ** 2
            for o in range(len(central)):
                errt = np.maximum(_err(row[j][o], row[j - 1][o]), _err(row[j][o], prev[j - 1][o]))
                take = active[o] & (errt <= err[o])
                best[o] = np.where(take, row[j][o], best[o])
                err[o] = np.where(take, errt, err[o])
                noise[o] = np.where(take, rnd[o], noise[o])
        if level > 0:
            for o in range(len(central)):
                worse = _err(row[level][o], prev[level - 1][o]) >= SAFE * err[o]
                # Only in the asymptotic regime does "worse" mean "round-off took over";
                # before it (steps still too coarse for the function) keep shrinking.
                settled = err[o] <= CONVERGED * np.abs(best[o])
                active[o] &= ~(settled & worse)
            if not any(a.any() for a in active):
                break
        prev = row
        h /= RATIO
    assert best is not None
    return Derivative(best, [SAFETY * e + n + ULPS * eps_mach * np.abs(b)
                             for e, n, b in zip(err, noise, best)])


def complex_step(at: Callable[[complex], Sequence[Any]] | None, reals: Sequence[Any],
                 fd: Derivative, h: float, eps_mach: float) -> Derivative:
    """Refine `fd` with ``Im at(i h) / h`` where that is an honest derivative.

    `at(z)` evaluates the function with the perturbed input shifted by ``z`` times the
    direction (None: no complex evaluation possible); `reals` are the outputs at the
    unperturbed input. The complex step is used for an element only when ``at``
    returns complex outputs of the right shapes whose real part equals `reals` and
    its value lies within `fd`'s error bound; the new bound is the observed
    disagreement (plus round-off), so it never claims more than was seen.
    """
    if at is None:
        return fd
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # e.g. a ComplexWarning when it casts to real
            outs = [np.asarray(v) for v in at(1j * h)]
    except Exception:  # noqa: BLE001 - the function does not take complex inputs
        return fd
    if len(outs) != len(reals) or any(
            not np.iscomplexobj(v) or v.shape != np.shape(r) for v, r in zip(outs, reals)):
        return fd
    value, error = [], []
    for v, r, est, bound in zip(outs, reals, fd.value, fd.error):
        v, r = v.astype(np.complex128), _wide(r)
        if np.iscomplexobj(r):
            value.append(est)
            error.append(bound)
            continue
        step = v.imag / h
        same_real = np.abs(v.real - r) <= 64 * eps_mach * np.abs(r) + np.finfo(np.float64).tiny
        seen = np.abs(step - est)
        ok = same_real & np.isfinite(step) & (seen <= bound)
        value.append(np.where(ok, step, est))
        error.append(np.where(ok, seen + ULPS * eps_mach * np.abs(step), bound))
    return Derivative(value, error)
