"""MINPACK's `hybrj` (SciPy's `root(method="hybr")` with a Jacobian) as one JAX program.

A `lax.while_loop` evaluates the user's residual and Jacobian in JAX and hands each
value to MINPACK's own arithmetic, compiled in C++ (csrc/math/minpack_hybrj.h: SciPy's
C translation of hybrj, split at its calls of the function -- reverse communication).
So the iterates are SciPy's to the bit, and a solve costs one dispatch instead of one
host round trip per evaluation. Powell's dogleg, the Broyden rank-one updates of the
QR factors (r1updt, r1mpyq), the Jacobian recomputation after two poor steps and the
slow-progress tests are all MINPACK's.

Written in JAX only, the same loop was tried first: its programs took 4-20 s to
compile (n = 2-10; XLA compiles each of the hundreds of small sequential operations
separately) and each step cost several times the C++ one; the C++ steps keep the
program a handful of operations whatever n is.

The steps are CPU handlers in the compiled extension (`jaxbridge._builtin`);
`available()` says whether they are there.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ..._core import extensions

# the int32 state's slots and requests (csrc/math/minpack_hybrj.h: IntSlot, Request)
INT_SLOTS = 12
_NFEV, _NJEV, _INFO, _REQUEST, _MAXFEV, _MODE = 6, 7, 8, 9, 10, 11
_DONE, _WANT_FUN, _WANT_JAC = 0, 1, 2
_AFTER_FUN, _AFTER_JAC = "jaxbridge_hybrj_after_fun", "jaxbridge_hybrj_after_jac"

_lock = threading.Lock()
_registered: list[bool] = []


def available() -> bool:
    """Whether the compiled hybrj steps are here (registered with XLA on first use)."""
    with _lock:
        if not _registered:
            ext = extensions.load("_builtin")
            handlers = getattr(ext, "minpack", None)  # (an extension built before it: None)
            for name, capsule in (handlers() if handlers is not None else {}).items():
                jax.ffi.register_ffi_target(name, capsule, platform="cpu")
            _registered.append(handlers is not None)
        return _registered[0]


class Settings(NamedTuple):
    """hybrj's inputs besides the functions, as SciPy passes them: `diag` None is
    MINPACK's mode 1 (scaling from the Jacobian's column norms), else mode 2."""

    xtol: float
    maxfev: int
    factor: float
    diag: tuple | None


class Layout(NamedTuple):
    """Where hybrj's arrays sit in the float64 state (csrc's HybrjLayout)."""

    n: int

    @property
    def fjac(self) -> int:
        return 6 * self.n

    @property
    def r(self) -> int:
        return 6 * self.n + self.n * self.n

    @property
    def size(self) -> int:
        return self.r + self.n * (self.n + 1) // 2 + 6


class Outcome(NamedTuple):
    """hybrj's results as SciPy's `_hybrj` returns them: `fjac` as SciPy's array
    (MINPACK's column-major Q read row by row), `r` packed row by row, `info` SciPy's
    `status`; `nfev` counts MINPACK's evaluations (SciPy's `root` adds its checks')."""

    x: jax.Array
    fvec: jax.Array
    fjac: jax.Array
    r: jax.Array
    qtf: jax.Array
    info: jax.Array
    nfev: jax.Array
    njev: jax.Array


def solve(fun: Callable[[jax.Array], jax.Array], jac: Callable[[jax.Array], jax.Array],
          x0: jax.Array, settings: Settings) -> Outcome:
    """hybrj from the float64 vector `x0` on `fun` (its n residuals, float64) and `jac`
    (their n x n Jacobian, row i the residual i's gradient), inside the caller's
    program (CPU, jax_enable_x64 on; RuntimeError without the compiled steps).

    >>> import jax, jax.numpy as jnp
    >>> fun = lambda x: x ** 2 - 2.0
    >>> out = solve(fun, jax.jacfwd(fun), jnp.ones(1), Settings(1.49012e-08, 200, 100.0, None))
    >>> print(f"{float(out.x[0]):.10f}", int(out.info))
    1.4142135624 1
    """
    if not available():
        raise RuntimeError("jaxbridge.scipy.optimize.root: MINPACK's compiled hybrj steps "
                           "need the extension jaxbridge._builtin, which is not built")
    n = x0.shape[0]
    lay = Layout(n)
    f64 = jnp.float64
    diag = jnp.zeros(n, f64) if settings.diag is None else jnp.asarray(settings.diag, f64)
    zeros = jnp.zeros
    state = jnp.concatenate([x0, zeros(n, f64), x0, zeros(2 * n, f64), diag,
                             zeros(lay.size - 6 * n - 2, f64),
                             jnp.array([settings.xtol, settings.factor], f64)])
    start = np.zeros(INT_SLOTS, np.int32)
    start[[_REQUEST, _MAXFEV, _MODE]] = (_WANT_FUN, settings.maxfev,
                                         1 if settings.diag is None else 2)
    shapes = (jax.ShapeDtypeStruct((lay.size,), f64), jax.ShapeDtypeStruct((INT_SLOTS,),
                                                                          jnp.int32))

    def step(target: str, value: jax.Array, state: jax.Array, ints: jax.Array) -> tuple:
        call = jax.ffi.ffi_call(target, shapes, input_output_aliases={0: 0, 1: 1})
        return tuple(call(state, ints, value))

    def after_fun(state: jax.Array, ints: jax.Array) -> tuple:  # fun at the trial point
        return step(_AFTER_FUN, fun(state[2 * n:3 * n]), state, ints)

    def after_jac(state: jax.Array, ints: jax.Array) -> tuple:  # the Jacobian at x
        return step(_AFTER_JAC, jac(state[:n]), state, ints)

    def body(carry: tuple) -> tuple:
        state, ints = carry
        return jax.lax.cond(ints[_REQUEST] == _WANT_JAC, after_jac, after_fun, state, ints)

    state, ints = jax.lax.while_loop(lambda c: c[1][_REQUEST] != _DONE, body,
                                     (state, jnp.asarray(start)))
    return Outcome(x=state[:n], fvec=state[n:2 * n],
                   fjac=state[lay.fjac:lay.r].reshape(n, n),
                   r=state[lay.r:lay.r + n * (n + 1) // 2], qtf=state[4 * n:5 * n],
                   info=ints[_INFO], nfev=ints[_NFEV], njev=ints[_NJEV])


def checked_settings(n: int, options: dict, tol: float | None) -> Settings | None:
    """SciPy's hybr options for `n` unknowns as hybrj takes them (SciPy's defaults:
    xtol 1.49012e-08, maxfev 100 (n + 1), factor 100, no diag; `tol` sets xtol where
    options do not), or None where this loop does not reproduce SciPy: other options,
    hybrj's improper input (SciPy reports it as status 0), a diag that is not n
    positive numbers.

    >>> checked_settings(2, {"xtol": 1e-10}, None)
    Settings(xtol=1e-10, maxfev=300, factor=100.0, diag=None)
    >>> checked_settings(2, {"band": (1, 1)}, None) is None
    True
    """
    if set(options) - {"xtol", "maxfev", "factor", "diag", "col_deriv"} or \
            options.get("col_deriv", False) not in (False, 0):
        return None
    if tol is not None:
        options = {"xtol": tol, **options}
    try:
        xtol = float(options.get("xtol", 1.49012e-08))
        maxfev = int(options.get("maxfev", 0))
        factor = float(options.get("factor", 100))
        diag = options.get("diag")
        diag = None if diag is None else tuple(float(d) for d in np.ravel(diag))
    except (TypeError, ValueError):
        return None  # SciPy's own error
    maxfev = 100 * (n + 1) if maxfev == 0 else maxfev
    if not (xtol >= 0.0 and maxfev > 0 and factor > 0.0) or \
            (diag is not None and (len(diag) != n or min(diag) <= 0.0)):
        return None
    return Settings(xtol, maxfev, factor, diag)
