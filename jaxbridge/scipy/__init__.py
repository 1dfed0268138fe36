"""`jaxbridge.scipy`: SciPy solvers as differentiable JAX functions.

Submodules (names follow SciPy's):

* `jaxbridge.scipy.integrate`: `solve_ivp` (continuous adjoint / forward
  sensitivities), `quad` (integral of the derivative, Leibniz rule);
* `jaxbridge.scipy.optimize`: `root`, `minimize` (implicit function theorem);
* `jaxbridge.scipy.sparse.linalg`: `spsolve` (one `splu` factorization serves the
  forward and the adjoint solve);
* `jaxbridge.scipy.special`: `kv`, `iv`, `kve`, `ive`, `hyp1f1`, `ellipk`, `ellipe`.

Functions you pass in (right-hand sides, integrands, residuals, objectives) are
written in JAX; SciPy solves; derivatives come from the problem's structure, never
from differentiating SciPy's iterations. A SciPy failure is reported per the
`on_failure` argument: "raise" (default; `SolverError` naming the solver and SciPy's
message, under `jit` as JAX's runtime error carrying that text) or "nan".
"""

from ._common import SolverError as SolverError
from . import integrate as integrate  # noqa: E402
from . import optimize as optimize  # noqa: E402
from . import sparse as sparse  # noqa: E402
from . import special as special  # noqa: E402
