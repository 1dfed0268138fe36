"""The frozen options of one implicit-function solve (SciPy's run and its derivative rules)."""

from __future__ import annotations

import dataclasses
from typing import Any

#: The choices of `linear_solver`, the implicit-function-theorem solve.
LINEAR_SOLVERS = ("auto", "direct", "gmres", "cg")


@dataclasses.dataclass(frozen=True)
class SolveOptions:
    """Everything static about one call of root, minimize or least_squares (hashable).

    `kind` is the public function's name ("root", "minimize", "least_squares"), so
    messages name it as it is; `fun` (a `HostFun`) and `jac` (None, True, False or a
    `HostFun`) are the user's functions with their closures lifted out; `options` is a
    sorted tuple of SciPy's keyword arguments (`static_options`). minimize's `hess` and
    `hessp` are None, a `HostFun` (the user's JAX function, for SciPy's forward solve
    only) or what SciPy takes as is (a finite-difference string, a
    `HessianUpdateStrategy`); its `constraints` are None or `(values, keep_feasible)`:
    the `HostFun` of `_constraints.ConstraintSet.values` and SciPy's flags.
    """

    kind: str
    fun: Any
    method: str
    jac: Any = None
    tol: float | None = None
    options: tuple = ()
    callback: Any = None
    linear_solver: str = "auto"
    on_failure: str = "raise"
    hess: Any = None
    hessp: Any = None
    constraints: Any = None

    @property
    def qualname(self) -> str:
        """The name errors give: "optimize.root", "optimize.minimize", ..."""
        return f"optimize.{self.kind}"

    @property
    def loss(self) -> str:
        """least_squares' robust loss ("linear" for the others)."""
        return str(dict(self.options).get("loss", "linear"))

    @property
    def f_scale(self) -> float:
        """least_squares' `f_scale` (1 for the others)."""
        return float(dict(self.options).get("f_scale", 1.0))
