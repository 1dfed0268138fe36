"""Differentiable `scipy.optimize`: `root`, `minimize`, `least_squares` (implicit function theorem).

SciPy finds `x*(p)`; its derivative comes from the optimality condition `G(x*, p) = 0`,
not from the iterations: `G = F` for `root`, `G = grad_x f` for `minimize`, and
`G = grad_x C` for `least_squares`, with `C(x) = 1/2 sum rho(f_i(x)^2)` SciPy's cost
(robust `loss` and `f_scale` included). Then `dx*/dp = -(dG/dx)^{-1} dG/dp`:

* reverse mode (grad): one linear solve with the transposed Jacobian,
  `(dG/dx)^T lam = x_bar`, then `p_bar = -(dG/dp)^T lam` (a JAX vector-Jacobian
  product);
* forward mode (jvp/jacfwd): one solve `(dG/dx) dx = -(dG/dp) dp`.

`p` is everything the function depends on: SciPy's `args` (called as
`fun(x, *args)`) and arrays it closes over, traced or not -- both get the same,
correct gradients. With `bounds`, coordinates at an active bound are held there:
the solve runs on the free coordinates, and the gradient flows to the bounds
themselves (`x*_i = lb_i`). A bound the solver stopped just inside of counts as
active when a Newton step from `x*` crosses it (`_active`).

The linear solves are dense (`scipy.linalg.solve` on the Jacobian JAX computes) for
`n <= 1000` (root: `n <= 64`) or `linear_solver="direct"`, and matrix-free
otherwise or with `linear_solver="gmres"` / `"cg"` (JAX's Krylov solvers on JAX's
exact matrix-free products, the whole solve one compiled host-side call; `cg`
needs a symmetric positive definite matrix, which a strict minimum's Hessian is).
The starting point `x0` gets a zero gradient: the
solution does not depend on it (it is correct, not a silent zero).

With `constraints` (SLSQP, trust-constr), the condition is the KKT system of the
active set at x* instead (`_kkt`): bounds and constraints are rows of
``lo <= g(x) <= hi``, the multipliers come from least squares on stationarity, and
one dense solve with ``[[H, -J_A^T], [J_A, 0]]`` (H JAX's exact Hessian of the
Lagrangian) gives the tangent or the adjoint.

The result's other fields (`fun`, `jac`, `cost`, `grad`) are recomputed in JAX at
`x*`, so they are differentiable by the chain rule.

`root(method="df-sane")` and `root(method="krylov")` run, where they apply
(`stepping="auto"`), not on the host but as SciPy's algorithms compiled into the
caller's program (`_compiled_root`, `_dfsane`, `_newton_krylov`): no host round trip
per residual evaluation, Newton-Krylov on exact Jacobian-vector products instead of
finite differences, gradients by `jax.lax.custom_root` with the same linear solvers
on JAX's exact products.

The package keeps SciPy's layout, one job a module: `_root`, `_minimize` and
`_least_squares` are the front ends; `_frontend` what they share (checks, closures
lifted out, bounds); `_implicit` the solve with its tangent and adjoint rules, all
taking one frozen `SolveOptions` (`_options`); `_problem` the optimality condition
and its linear solves; `_run_scipy` SciPy's calls; `_active` the bounds that hold;
`_constraints` minimize's constraints in SciPy's forms, `_constrained` and `_kkt`
their solve and derivative; `_loss` least_squares' robust losses; `_result`
OptimizeResult; `_compiled_root`,
`_dfsane` and `_newton_krylov` the compiled root loops.
"""

from ._least_squares import least_squares
from ._loss import LOSSES as LOSSES
from ._minimize import MIN_BOUNDS as MIN_BOUNDS
from ._minimize import minimize
from ._options import LINEAR_SOLVERS
from ._result import OptimizeResult
from ._root import STEPPINGS as STEPPINGS
from ._root import root
from ._run_scipy import MIN_GRAD_FREE as MIN_GRAD_FREE
from ._run_scipy import MIN_HESS as MIN_HESS
from ._run_scipy import ROOT_JAC_METHODS as ROOT_JAC_METHODS

__all__ = ["root", "minimize", "least_squares", "OptimizeResult", "LINEAR_SOLVERS"]

OptimizeResult.__module__ = __name__  # shown as jaxbridge.scipy.optimize.OptimizeResult
