"""`jaxbridge.scipy`: SciPy solvers as differentiable JAX functions, with SciPy's signatures.

Submodules (names, signatures, defaults and result fields follow SciPy's):

* `jaxbridge.scipy.integrate`: `solve_ivp` (continuous adjoint / forward
  sensitivities; SciPy's `events`, `dense_output` and `t_eval=None`, with event times
  differentiable by the implicit function theorem), `solve_bvp` (implicit function
  theorem on the converged collocation system), `quad` (integral of the derivative,
  Leibniz rule);
* `jaxbridge.scipy.optimize`: `root`, `minimize`, `least_squares` (implicit
  function theorem);
* `jaxbridge.scipy.sparse.linalg`: `spsolve` (one `splu` factorization serves the
  forward and the adjoint solve), `eigsh` (eigenvalue and eigenvector adjoints);
* `jaxbridge.scipy.signal`: `lfilter` (the adjoint is the time-reversed filter);
* `jaxbridge.scipy.special`: `kv`, `iv`, `kve`, `ive`, `hyp1f1`, `ellipk`, `ellipe`,
  `erfcx`, `erfi`, `dawsn`.

Functions you pass in (right-hand sides, integrands, residuals, objectives) are
written in JAX and called as SciPy calls them (`fun(t, y, *args)`, `fun(x, *args)`).
They may close over arrays and traced values: those are lifted out as inputs of the
host call, so their gradients are exactly those through `args`. SciPy solves;
derivatives come from the problem's structure, never from differentiating SciPy's
iterations. A SciPy failure is reported per the `on_failure` argument: "raise"
(default; :class:`SolverError` naming the solver and SciPy's message) or "nan".
"""

from . import integrate as integrate  # noqa: E402
from . import optimize as optimize  # noqa: E402
from . import signal as signal  # noqa: E402
from . import sparse as sparse  # noqa: E402
from . import special as special  # noqa: E402
from ._common import SolverError as SolverError
