"""SciPy's Newton-Krylov root finder (`scipy.optimize._nonlin.nonlin_solve` with
`KrylovJacobian`) as a JAX loop, on exact Jacobian-vector products.

`root(method="krylov", stepping="compiled")` runs this instead of SciPy's Python loop.
What is SciPy's: the termination test (`TerminationCondition`: `f_tol` default
`eps**(1/3)`, `f_rtol`, `x_tol`, `x_rtol` in the max-norm, `nit`, `maxiter`), the
forcing terms of the inexact Newton steps (`eta` from 1e-3, gamma 0.9, eta_max 0.9999,
inner tolerance `min(eta, eta ||F||)`, here floored at sqrt(eps), the accuracy of
SciPy's own finite-difference products), and the line search (`scalar_search_armijo` on
`phi(s) = ||F(x + s dx)||^2`, `amin = 1e-2`, the full step when it finds none; or
none). What differs, on purpose: SciPy approximates each product `J v` by a finite
difference (one residual evaluation each, relative step `rdiff`) and solves with LGMRES;
here `jax.linearize` gives `J` exactly once per Newton step, and the inner solve is
one cycle of GMRES (`_gmres.cycle`; as many Arnoldi steps at most as SciPy's inner
solver builds) on those exact products. So the iterates differ from SciPy's in the last digits (or
more on hard problems), while the test that accepts a root is SciPy's.

`nfev` counts the residual's evaluations: the start, the line-search trials, the full
step after a failed search, and one per Newton step for the linearization (SciPy also
counts one per finite-difference product; there are none here). `nit` is SciPy's
(`TerminationCondition.iteration`: the number of termination tests).

Only the loop lives here; derivatives come from the implicit function theorem in
`_compiled_root` (`jax.lax.custom_root`), never from differentiating these iterations.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from .. import _loops as loops
from ..sparse.linalg import _gmres

# nonlin_solve's constants
_GAMMA, _ETA_MAX, _ETA_THRESHOLD, _ETA0 = 0.9, 0.9999, 0.1, 1e-3
_INNER_RTOL_MIN = float(np.sqrt(np.finfo(np.float64).eps))
# _nonlin_line_search's scalar_search_armijo(..., amin=smin) and its c1
_C1, _AMIN = 1e-4, 1e-2
# the options (of SciPy's root(method="krylov")) and jac_options the loop reproduces
OPTIONS = ("nit", "disp", "maxiter", "ftol", "fatol", "xtol", "xatol", "tol_norm",
           "line_search", "jac_options")
JAC_OPTIONS = ("method", "inner_maxiter", "inner_inner_m", "inner_rtol", "inner_atol")
_INNER = ("lgmres", "gmres")

# status, as nonlin_solve reports it, and ours for a Newton step that is zero or not finite
CONVERGED, MAXITER, BAD_STEP = 1, 2, 3


def unsupported(options: dict) -> str | None:
    """Why the compiled loop cannot reproduce SciPy for these `options` (None: it can)."""
    for key in options:
        if key not in OPTIONS:
            return f"option {key!r} (supported: {OPTIONS})"
    if options.get("disp"):
        return "option disp=True (the loop runs compiled: nothing to print)"
    if options.get("tol_norm") is not None:
        return "option tol_norm (only None, SciPy's max-norm)"
    ls = options.get("line_search", "armijo")
    if ls not in ("armijo", None, True, False):
        return (f"option line_search={ls!r} (supported: 'armijo', None, True, False; "
                f"'wolfe' needs finite-difference slopes)")
    for key in ("nit", "maxiter"):
        value = options.get(key)
        if value is not None and not (isinstance(value, (int, np.integer))
                                      and not isinstance(value, bool)):
            return f"option {key}={value!r} (an int or None)"
    for key in ("ftol", "fatol", "xtol", "xatol"):
        value = options.get(key)
        if value is not None and not isinstance(value, (int, float, np.floating, np.integer)):
            return f"option {key}={value!r} (a float or None)"
    jac = options.get("jac_options") or {}
    if not isinstance(jac, dict):
        return f"option jac_options={jac!r} (a dict)"
    for key in jac:
        if key not in JAC_OPTIONS:
            return (f"jac_options key {key!r} (supported: {JAC_OPTIONS}; the Jacobian-vector "
                    f"products are exact, so there is no finite-difference step 'rdiff', and "
                    f"the inner solver is GMRES: no LGMRES 'outer_k', no preconditioner)")
    if jac.get("method", "lgmres") not in _INNER:
        return f"jac_options method={jac['method']!r} (supported: {_INNER})"
    for key in ("inner_maxiter", "inner_inner_m"):
        value = jac.get(key)
        if value is not None and not (isinstance(value, (int, np.integer))
                                      and not isinstance(value, bool) and value >= 1):
            return f"jac_options {key}={value!r} (a positive int)"
    if "inner_inner_m" in jac and jac.get("method", "lgmres") != "lgmres":
        return "jac_options inner_inner_m (an option of method 'lgmres')"
    return None


def with_tol(options: dict, tol: float | None) -> dict:
    """SciPy's root(tol=...) for the nonlin_solve methods: a relative step test only."""
    options = dict(options)
    if tol is not None:
        options.setdefault("xtol", tol)
        options.setdefault("xatol", np.inf)
        options.setdefault("ftol", np.inf)
        options.setdefault("fatol", np.inf)
    return options


class Stats(NamedTuple):
    nfev: jax.Array
    nit: jax.Array
    status: jax.Array
    converged: jax.Array


class _State(NamedTuple):
    x: jax.Array
    F: jax.Array
    F_norm: jax.Array     # ||F||_2, for the forcing terms
    dx: jax.Array         # the last Newton direction (inf before the first)
    eta: jax.Array
    checks: jax.Array     # TerminationCondition.iteration
    nfev: jax.Array
    status: jax.Array     # 0 while running


class _Search(NamedTuple):
    k: jax.Array          # trials made
    a0: jax.Array         # scalar_search_armijo's alpha0, alpha1, phi_a0, phi_a1
    a1: jax.Array
    p0: jax.Array
    p1: jax.Array
    s: jax.Array          # the next trial's step ...
    s_last: jax.Array     # ... and the last one's, with its residual
    F_last: jax.Array
    found: jax.Array
    done: jax.Array


class _Settings(NamedTuple):
    """solve's options, resolved as nonlin_solve resolves them."""
    f_tol: float
    f_rtol: float
    x_tol: float
    x_rtol: float
    nit: int | None
    maxiter: int
    line_search: str | None
    restart: int            # the Arnoldi steps of the one inner GMRES cycle
    inner_rtol: Any
    inner_atol: float


def solve(F: Callable[[jax.Array], jax.Array], x0: jax.Array, nit: int | None = None,
          maxiter: int | None = None, ftol: float | None = None, fatol: float | None = None,
          xtol: float | None = None, xatol: float | None = None, tol_norm: Any = None,
          line_search: Any = "armijo", jac_options: dict | None = None,
          disp: bool = False) -> tuple[jax.Array, Stats]:
    """SciPy's `_root_nonlin_solve(F, x0, _method="krylov", **options)` on a flat `x0`,
    with exact products (see the module's docstring). Returns the last iterate and
    (nfev, nit, status, converged) as SciPy's result reports them (status 1: converged,
    2: maxiter or nit reached, 3: a zero or non-finite Newton step)."""
    del tol_norm, disp  # checked by unsupported(): None and False only
    eps = float(np.finfo(np.float64).eps)
    if maxiter is None:
        maxiter = nit + 1 if nit is not None else 100 * (x0.size + 1)
    if line_search is True:
        line_search = "armijo"
    elif line_search is False:
        line_search = None
    jac = dict(jac_options or {})
    inner = jac.get("method", "lgmres")
    # the Krylov subspace SciPy's inner solver builds in its one outer cycle
    # (KrylovJacobian: maxiter=1; LGMRES's inner_m, jac_options' "inner_inner_m";
    # GMRES's restart = inner_maxiter)
    m = int(jac.get("inner_inner_m", 30) if inner == "lgmres" else jac.get("inner_maxiter", 20))
    cfg = _Settings(
        f_tol=eps ** (1.0 / 3) if fatol is None else float(fatol),  # SciPy: fatol -> f_tol
        f_rtol=np.inf if ftol is None else float(ftol),
        x_tol=np.inf if xatol is None else float(xatol),
        x_rtol=np.inf if xtol is None else float(xtol),
        nit=nit, maxiter=maxiter, line_search=line_search,
        restart=max(1, min(m, x0.size)), inner_rtol=jac.get("inner_rtol"),
        inner_atol=float(jac.get("inner_atol", 0.0)))
    F0 = F(x0)
    f0_norm = _maxnorm(F0)
    s0 = _State(x0, F0, jnp.linalg.norm(F0), jnp.full_like(x0, jnp.inf),
                jnp.asarray(_ETA0, x0.dtype), jnp.zeros((), jnp.int32), jnp.ones((), jnp.int32),
                jnp.zeros((), jnp.int32))
    # the termination test is the loop's condition (no cond around the step); the test
    # that stopped it is made once more after the loop, to report it and count it
    s = loops.while_loop(lambda s: (s.status == 0) & (_check(s, cfg, f0_norm) == 0),
                         lambda s: _step(F, s, cfg), s0)
    tested = s.status == 0
    status = jnp.where(tested, _check(s, cfg, f0_norm), s.status)
    checks = s.checks + tested.astype(jnp.int32)
    return s.x, Stats(s.nfev, checks, status, status == CONVERGED)


def _merit(v: jax.Array) -> jax.Array:  # _safe_norm(v)**2
    return jnp.where(jnp.all(jnp.isfinite(v)), jnp.vdot(v, v), jnp.inf)


def _maxnorm(v: jax.Array) -> jax.Array:
    return jnp.max(jnp.abs(v))


def _check(s: _State, cfg: _Settings, f0_norm: jax.Array) -> jax.Array:
    """TerminationCondition.check: 1 converged, 2 nit reached, 0 go on."""
    f_norm, x_norm, dx_norm = _maxnorm(s.F), _maxnorm(s.x), _maxnorm(s.dx)
    # inf / inf is NaN and fails the test, as in SciPy (dx is inf before a step)
    ok = ((f_norm <= cfg.f_tol) & (f_norm / cfg.f_rtol <= f0_norm)
          & (dx_norm <= cfg.x_tol) & (dx_norm / cfg.x_rtol <= x_norm))
    status = ok.astype(jnp.int32)
    if cfg.nit is not None:  # SciPy's backwards-compatible fixed iteration count
        status = 2 * (s.checks + 1 > cfg.nit).astype(jnp.int32)
    return jnp.where(f_norm == 0, 1, status)


def _armijo(F: Callable[[jax.Array], jax.Array], x: jax.Array, dx: jax.Array,
            phi0: jax.Array) -> _Search:
    """scalar_search_armijo(phi, phi0, -phi0, amin=1e-2), one trial per iteration."""
    derphi0 = -phi0

    def cubic(a0: jax.Array, a1: jax.Array, p0: jax.Array, p1: jax.Array) -> jax.Array:
        factor = a0 ** 2 * a1 ** 2 * (a1 - a0)
        a = (a0 ** 2 * (p1 - phi0 - derphi0 * a1) - a1 ** 2 * (p0 - phi0 - derphi0 * a0))
        a = a / factor
        b = (-a0 ** 3 * (p1 - phi0 - derphi0 * a1) + a1 ** 3 * (p0 - phi0 - derphi0 * a0))
        b = b / factor
        return (-b + jnp.sqrt(jnp.abs(b ** 2 - 3 * a * derphi0))) / (3.0 * a)

    def body(q: _Search) -> _Search:
        Fs = F(x + q.s * dx)
        p = _merit(Fs)
        ok = p <= phi0 + _C1 * q.s * derphi0
        first, second = q.k == 0, q.k == 1
        # after the first trial (alpha0 = 1): the quadratic interpolant's minimizer
        quad = -derphi0 * q.a0 ** 2 / 2.0 / (p - phi0 - derphi0 * q.a0)
        # after a failed cubic trial alpha2: SciPy's safeguard, then shift
        a2 = jnp.where(((q.a1 - q.s) > q.a1 / 2.0) | ((1 - q.s / q.a1) < 0.96),
                       q.a1 / 2.0, q.s)
        a0 = jnp.where(first, q.a0, jnp.where(second, q.a0, q.a1))
        a1 = jnp.where(first, quad, jnp.where(second, q.a1, a2))
        p0 = jnp.where(first, p, jnp.where(second, q.p0, q.p1))
        p1 = jnp.where(first, q.p1, p)
        go_on = first | (a1 > _AMIN)  # the quadratic trial always runs
        nxt = jnp.where(first, quad, cubic(a0, a1, p0, p1))
        done = ok | ~go_on
        return _Search(q.k + 1, a0, a1, p0, p1, jnp.where(done, q.s, nxt), q.s, Fs, ok,
                       done)

    real = x.dtype
    one = jnp.ones((), real)
    q0 = _Search(jnp.zeros((), jnp.int32), one, one, phi0, phi0, one, jnp.zeros((), real),
                 jnp.zeros_like(x), jnp.zeros((), bool), jnp.zeros((), bool))
    return loops.while_loop(lambda q: ~q.done, body, q0)


def _step(F: Callable[[jax.Array], jax.Array], s: _State, cfg: _Settings) -> _State:
    """One iteration of nonlin_solve's loop after a failed termination test."""
    # one Newton step: exact products at x (linearize evaluates F there once)
    _, jvp = jax.linearize(F, s.x)
    tol = (jnp.minimum(s.eta, s.eta * s.F_norm) if cfg.inner_rtol is None
           else cfg.inner_rtol)
    # floored at sqrt(eps): SciPy's finite-difference products (rdiff = sqrt(eps))
    # are no more accurate than that, and below it GMRES only burns its whole
    # subspace (float64 rounding) in the last Newton steps, where F is ~1e-16
    tol = jnp.maximum(tol, _INNER_RTOL_MIN)
    # (JAX's own GMRES would treat an F of norm below eps as zero and stop Newton a
    # few ulps short; _gmres.cycle normalizes it without a threshold)
    dx = -_gmres.cycle(jvp, s.F, tol, cfg.inner_atol, cfg.restart)
    bad = ~jnp.all(jnp.isfinite(dx)) | (jnp.max(jnp.abs(dx)) == 0)
    nfev = s.nfev + 1
    if cfg.line_search == "armijo":
        q = _armijo(F, s.x, dx, s.F_norm ** 2)
        nfev = nfev + q.k
        sl = jnp.where(q.found, q.s_last, 1.0)  # no step found: the full Newton step
        x = s.x + sl * dx
        reuse = sl == q.s_last
        Fx = loops.cond(reuse, lambda: q.F_last, lambda: F(x))
        nfev = nfev + jnp.where(reuse, 0, 1)
    else:
        x = s.x + dx
        Fx = F(x)
        nfev = nfev + 1
    F_norm = jnp.linalg.norm(Fx)
    eta_a = _GAMMA * F_norm ** 2 / s.F_norm ** 2
    eta = jnp.where(_GAMMA * s.eta ** 2 < _ETA_THRESHOLD, jnp.minimum(_ETA_MAX, eta_a),
                    jnp.minimum(_ETA_MAX, jnp.maximum(eta_a, _GAMMA * s.eta ** 2)))
    checks = s.checks + 1
    status = jnp.where(bad, BAD_STEP, jnp.where(checks >= cfg.maxiter, MAXITER, 0))
    return _State(jnp.where(bad, s.x, x), jnp.where(bad, s.F, Fx),
                  jnp.where(bad, s.F_norm, F_norm), jnp.where(bad, s.dx, dx),
                  jnp.where(bad, s.eta, eta), checks, nfev, status.astype(jnp.int32))
