"""OptimizeResult, what root, minimize and least_squares return."""

from __future__ import annotations

from typing import ClassVar

from .._common import Result


class OptimizeResult(Result):
    """What :func:`root`, :func:`minimize` and :func:`least_squares` return.

    SciPy's field names: `x` (differentiable), `fun` (F(x*) for root, f(x*) for
    minimize, the residuals for least_squares; differentiable), `success`,
    `status`, `nfev`, `njev`, `nit` (SciPy's counters, -1 where the method does not
    report one), and for least_squares `cost`, `jac`, `grad`, `optimality`,
    `active_mask`. Fields SciPy computes on the host only (`hess_inv`, ...) are None.
    """

    _fields = ("x", "fun", "jac", "cost", "grad", "optimality", "active_mask", "success",
               "status", "nfev", "njev", "nit", "hess_inv")
    _messages: ClassVar[dict[int, str]] = {}
