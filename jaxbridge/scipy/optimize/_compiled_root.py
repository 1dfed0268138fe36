"""`root(..., stepping="compiled")`: SciPy's root loop inside the caller's JAX program.

The residual is JAX code, so the solver loop itself can be compiled with it: no host
round trip per residual evaluation (`_dfsane` reproduces SciPy's DF-SANE,
`_newton_krylov` SciPy's Newton-Krylov on exact Jacobian-vector products). Derivatives
come from the implicit function theorem through `jax.lax.custom_root`: the tangent
solve is matrix-free (JAX's GMRES on exact JVPs of the residual; its transpose,
used by `grad`, runs on exact VJPs) or dense for small systems. Both forward and
reverse mode, `vmap` and closures over traced values work as for any JAX code.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ... import _foreign
from .. import _loops as loops
from .._common import failure
from .._trace import HostFun
from ..sparse.linalg import _gmres
from . import _dfsane, _newton_krylov

# each loop's module: with_tol(options, tol) -> its keyword arguments, and
# solve(F, z0, **those) -> (z, Stats with nfev, nit, status, converged)
_SOLVERS = {"df-sane": _dfsane, "krylov": _newton_krylov}
METHODS = tuple(_SOLVERS)
_DENSE_MAX = 64          # as the host path: dense IFT solves only for small systems
_LINEAR_RTOL = 1e-12     # the Krylov tangent solve's relative tolerance
_LINEAR_ACCEPT = 1e-6    # ... and the relative residual above which it has failed


def unsupported(method: str, options: dict, callback: Any) -> str | None:
    """Why the compiled loop cannot run SciPy's `root` for these arguments (None: it can)."""
    method = method.lower()
    if method not in METHODS:
        return f"method={method!r} (supported: {METHODS})"
    if callback is not None:
        return f"callback={callback!r} (the loop runs compiled: pass None)"
    if jnp.result_type(float) != jnp.float64:  # SciPy's loop runs in float64
        return "jax_enable_x64 off (SciPy's loop runs in float64)"
    if method == "krylov":
        return _newton_krylov.unsupported(options)
    if not _dfsane.supported(options):
        return (f"options {sorted(options)} (supported: {_dfsane.OPTIONS}, "
                f"line_search='cruz', disp=False, an int M >= 1)")
    return None


@functools.partial(jax.jit, static_argnames=("fun", "method", "tol", "options",
                                             "linear_solver", "on_failure"))
def root(x0: jax.Array, ops: list, *, fun: HostFun, method: str, tol: Any, options: tuple,
         linear_solver: str, on_failure: str) -> tuple[jax.Array, jax.Array]:
    """Solve `fun(ops, x) = 0` from x0; returns x* (shaped like x0, NaN on failure
    with on_failure="nan") and (status, nfev, njev, nit, success) as int32.

    Jitted on the residual's structure (`HostFun` compares structurally), so an eager
    call with a function seen before (even a fresh closure) reuses the compiled loop."""
    x0, ops = loops.join((x0, ops))
    return _root(lambda x: fun(ops, x), x0, method, tol, dict(options), linear_solver,
                 on_failure)


def _root(fun: Callable[..., Any], x0: jax.Array, method: str, tol: Any, options: dict,
          linear_solver: str, on_failure: str) -> tuple[jax.Array, jax.Array]:
    shape, dtype = x0.shape, x0.dtype
    real = jnp.result_type(float)  # float64: unsupported() requires jax_enable_x64
    method = method.lower()
    solver = _SOLVERS[method]
    opts = solver.with_tol(dict(options), tol)
    if isinstance(opts.get("jac_options"), tuple):  # krylov's, made hashable by root()
        opts["jac_options"] = dict(opts["jac_options"])

    def F(z: jax.Array) -> jax.Array:
        out = jnp.asarray(fun(z.reshape(shape).astype(dtype)))
        if out.size != z.size:
            raise ValueError(f"jaxbridge.scipy.optimize.root: fun(x, *args) must return "
                             f"{z.size} values (x0 has shape {shape}), got shape {out.shape}")
        return jnp.ravel(out).astype(real)

    def solve(F: Callable, z0: jax.Array) -> tuple[jax.Array, jax.Array]:
        z, st = solver.solve(F, z0, **opts)
        # custom_root gives aux outputs tangents like their primals': floats, not ints
        return z, jnp.stack([jnp.asarray(v).astype(real)
                             for v in (st.nfev, st.nit, st.converged, st.status)])

    n = int(np.prod(shape, dtype=int))
    x, aux = jax.lax.custom_root(F, jnp.ravel(x0).astype(real), solve,
                                 _tangent_solve(linear_solver, n, on_failure), has_aux=True)
    nfev, nit, converged, status = jax.lax.stop_gradient(aux).astype(jnp.int32)
    finite = jnp.all(jnp.isfinite(x))
    ok = (converged == 1) & finite
    if on_failure == "raise":  # the host call (it raises) runs only on failure
        ok = loops.cond(ok, lambda: ok, lambda: _check_root(
            status, finite, method=method) == 1)
    # a failed solve poisons the gradients too (NaN, never a silent zero)
    x = (x * jnp.where(ok, 1.0, jnp.nan)).reshape(shape).astype(dtype)
    i32 = jnp.int32
    # SciPy's status: nonlin_solve's for krylov (1 converged, 2 maxiter; ours: 3 a bad
    # step); DF-SANE's result has none (0, as the host path reports it)
    reported = status if method == "krylov" else jnp.zeros((), i32)
    return x, jnp.stack([reported, nfev, jnp.full((), -1, i32), nit, ok.astype(i32)])


def _tangent_solve(linear_solver: str, n: int, on_failure: str) -> Callable:
    """`tangent_solve(g, y)` for custom_root: solves `g(z) = y` with `g` the residual's
    linearization at x*; reverse mode transposes it (a solve with g's transpose)."""
    method = linear_solver
    if method == "auto":
        method = "direct" if n <= _DENSE_MAX else "gmres"

    def checked(mv: Callable, b: jax.Array, z: jax.Array) -> jax.Array:
        norm = jnp.linalg.norm(b)
        rel = jnp.linalg.norm(mv(z) - b) / jnp.where(norm > 0, norm, 1.0)
        good = jnp.all(jnp.isfinite(z)) & (rel <= _LINEAR_ACCEPT)
        if on_failure == "raise":  # the host call (it raises) runs only on failure
            good = loops.cond(good, lambda: good, lambda: _check_linear(
                good, rel, method=method) == 1)
        return jnp.where(good, z, jnp.nan)

    def krylov(mv: Callable, b: jax.Array) -> jax.Array:
        if method == "cg":
            z = jax.scipy.sparse.linalg.cg(mv, b, tol=_LINEAR_RTOL, maxiter=10 * n)[0]
        else:
            # restarts of 20; _gmres's lean loop, with early exit in a cycle: on the DEQs
            # of 512 and 16,384 unknowns faster than JAX's batched GMRES, which was the
            # fastest of JAX's (restarts of 10-50, incremental; benchmarks/RESULTS.md)
            z = _gmres.solve(mv, b, _LINEAR_RTOL, 20, 10 * n)
        return checked(mv, b, z)

    def direct(mv: Callable, b: jax.Array) -> jax.Array:
        J = jax.jacfwd(mv)(jnp.zeros_like(b))  # mv is linear: its Jacobian is the matrix
        return checked(mv, b, jnp.linalg.solve(J, b))

    inner = direct if method == "direct" else krylov

    def tangent_solve(g: Callable, y: jax.Array) -> jax.Array:
        return jax.lax.custom_linear_solve(g, y, inner, transpose_solve=inner)
    return tangent_solve


# SciPy's messages (df-sane stops unconverged only at maxfev)
_MESSAGES = {
    "df-sane": {1: "successful convergence", 2: "too many function evaluations required"},
    "krylov": {1: "A solution was found at the specified tolerance.",
               2: "The maximum number of iterations allowed has been reached.",
               3: "Jacobian inversion yielded a zero or non-finite Newton step."},
}


def message(method: str, stats: jax.Array) -> str | None:
    """SciPy's message for a compiled root's `stats` (from `root`), None while traced.

    >>> message("df-sane", np.array([0, 9, -1, 4, 1]))
    'successful convergence'
    """
    try:
        reported, ok = int(stats[0]), int(stats[4])
    except (TypeError, jax.errors.ConcretizationTypeError):
        return None
    if method == "krylov":
        return _MESSAGES[method].get(reported, _MESSAGES[method][1] if ok else None)
    return _MESSAGES[method][1 if ok else 2]


@_foreign.foreign(lambda status, finite, **_: jax.ShapeDtypeStruct((), jnp.int32))
def _check_root(status: Any, finite: Any, *, method: str) -> Any:
    """on_failure="raise": SciPy's message as a SolverError (eager and under jit)."""
    status = int(status)
    if status != 1:
        raise failure("optimize.root", f"root(method={method!r}): "
                      + _MESSAGES[method][status])
    if not bool(finite):
        raise failure("optimize.root", f"root(method={method!r}): the solution is not finite")
    return np.asarray(1, np.int32)


@_foreign.foreign(lambda good, rel, **_: jax.ShapeDtypeStruct((), jnp.int32))
def _check_linear(good: Any, rel: Any, *, method: str) -> Any:
    if not bool(good):
        raise failure("optimize.root", f"implicit differentiation: the {method} solve did "
                      f"not converge (relative residual {float(rel):.1e})")
    return np.asarray(1, np.int32)
