"""Differentiable `scipy.integrate`: `solve_ivp` (discrete or continuous adjoint) and `quad`.

The integrands and right-hand sides are written in JAX. Two ways to solve:

* **The explicit methods (RK23, RK45, DOP853), `stepping="compiled"`** (the default
  with jax_enable_x64): SciPy's algorithm (same tableaus, step control, dense output:
  the same steps and values, `_rk`) runs as a `lax.while_loop` inside the caller's
  own program -- no host call, on whatever device the program runs, batched by `vmap`
  (one loop for the batch). Forward mode is JAX's derivative of the loop with the
  step sizes held; reverse mode is the **discrete adjoint** of the accepted steps
  (stages recomputed from stored `(t, y, h)`, JAX's VJP of the vector field), with
  two-level checkpointing under the `checkpoints` budget. Both are the exact
  derivative of the discrete solution (to rounding), not within-tolerance
  approximations; the cost of a gradient is about two forward solves whatever the
  number of parameters.
* **The implicit methods (BDF, Radau, LSODA), `stepping="compiled"`** (the default
  with jax_enable_x64): SciPy solves on the host and records its accepted steps;
  reverse and forward mode are one compiled JAX loop over them, the derivative of
  Radau IIA on those steps (`_stiff`): exact for Radau's discrete solution, within
  tolerance for BDF and LSODA. Cost per step: a few Newton iterations on 3n unknowns
  and one VJP of the vector field, whatever the number of parameters.
* **SciPy's own loop, `stepping="scipy"`** (every method): SciPy solves on the host and
  the derivatives come from the
  problem's structure (the continuous adjoint or forward sensitivity equations, below;
  quad's Leibniz rule), never from differentiating SciPy's iterations. These are
  accurate to the solver's tolerance.

**Calling conventions** are SciPy's: `fun(t, y, *args)`, `func(x, *args)`, with
`args` a tuple (pytrees inside it are fine). Functions may also close over traced
values (`lambda t, y: -k * y` under `jax.grad` w.r.t. `k`): closed-over arrays are
lifted out as inputs of the host call (`_trace.convert`), so their gradients are the
same as through `args`.

**solve_ivp, reverse mode (the continuous adjoint).** For `y' = f(t, y, p)` and
outputs `y_i = y(t_i)`, the cotangent `a(t) = dL/dy(t)` solves `a' = -a^T df/dy`
backward in time, jumping by `dL/dy_i` at each evaluation time, and
`dL/dp = int a^T df/dp dt` is integrated alongside it. Both are solved by SciPy with
the same `method` (implicit methods get the exact adjoint Jacobian from JAX); the
vector-Jacobian products of `f` are computed by JAX, compiled once per function.

*Memory (checkpointing choice).* The backward pass needs `y(t)` between the
evaluation times. Re-integrating `y` backward is unstable for stiff and dissipative
problems, and storing the whole forward trajectory's dense output costs memory in
proportion to the number of steps. We therefore use the outputs `y(t_i)` themselves
as checkpoints: for each interval `[t_{i-1}, t_i]`, last first, `y` is re-solved
forward from the checkpoint with dense output and the adjoint is solved backward
against that interpolant. Memory is O(len(t_eval) + steps in one interval), and a
gradient costs about one extra forward solve plus one adjoint solve.

**solve_ivp, forward sensitivities.** The sensitivity equations
`S' = df/dy S + df/dp D`, `S(t0) = S0`, are solved together with `y` in one augmented
solve, for K directions at once (the columns of `S`, `n x K`). Forward mode
(jvp/jacfwd) uses them with K = 1. Reverse mode can use them too, with one column per
input (K = n + P: the whole Jacobian of the outputs), then contracts with the
cotangents: one smooth solve from t0 with no restarts, no interpolation and no
backward transients, which for small systems is several times cheaper than the
adjoint (SciML's `ForwardDiffSensitivity` rule of thumb), and costs
`O(n (n + P))` per right-hand side, so the adjoint wins for large systems.
`sensitivity="auto"` (the default) picks forward sensitivities when the augmented
system is small (`n (1 + n + P) <= 64`) and the adjoint otherwise (the same rule for
the compiled loop, where "forward" means JAX's forward mode over all n + P inputs).
"""

from ._bvp import solve_bvp
from ._dense import OdeSolution
from ._ivp import solve_ivp
from ._ode import IMPLICIT_METHODS, METHODS, OdeResult
from ._options import SENSITIVITIES
from ._quad import quad

__all__ = ["solve_ivp", "quad", "OdeResult", "METHODS", "IMPLICIT_METHODS", "SENSITIVITIES",
           "OdeSolution", "solve_bvp"]
