"""`root(method="hybr")` called eagerly, a function seen before: MINPACK's loop compiled
with the residual and its Jacobian (`_hybrj`), one dispatch per solve.

SciPy's own loop (the general path) evaluates the user's JAX function once per
MINPACK request, one JAX dispatch each (~20 us, 14 of them for a 2-unknown problem).
Where nothing traces the call (no jit, grad or vmap: no derivative rule or program can
see it), the whole solve runs instead as one program whose results are SciPy's to the
bit: the same x, fun, status, message, nfev, njev, fjac, r and qtf. A key met for the
first time (a new function structure, shape or options) takes the general path, which
compiles nothing; the program is compiled (about half a second) when the key comes
again. Anything this path does not reproduce -- a callback, `jac=True` or False,
options other than xtol, maxfev, factor, diag, x64 off, operands off the CPU, a
residual of the wrong size -- takes the general path too.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import scipy.optimize

from ..._core.jaxapi import is_eager, jax_setting
from .._common import (
    NotEager,
    check_policy,
    computes_on_cpu,
    const,
    eager_device,
    failure,
    repeat_program,
)
from .._trace import HostFun, check_args, convert
from . import _frontend, _hybrj
from ._result import OptimizeResult

QUAL = "optimize.root"


def root(fun: Callable, x0: Any, args: Any, request: _frontend.Request) -> OptimizeResult | None:
    """SciPy's `root(fun, x0, args, method="hybr", ...)` from the compiled loop, or None
    where the general path must run (see the module's docstring)."""
    check_policy(request.on_failure, QUAL)
    _frontend.check_linear_solver(request.linear_solver, QUAL)
    if request.callback is not None or not (request.jac is None or callable(request.jac)) \
            or not jax_setting("jax_enable_x64") or not _hybrj.available():
        return None
    if not is_eager():  # (traced: the general path; the operands are checked below)
        return None
    args = check_args(args, QUAL, "fun(x, *args)", "wrap")
    x0 = _frontend.starting_point(x0, "root", operand=True)
    n = int(x0.size)
    settings = _hybrj.checked_settings(n, dict(request.options or {}), request.tol)
    if settings is None:
        return None
    x_aval = jax.ShapeDtypeStruct(x0.shape, x0.dtype)
    hf, ops = convert(fun, QUAL, "fun", (x_aval,), args, "fun(x, *args)")
    jac_hf: HostFun | None = None
    jac_ops: list = []
    if callable(request.jac):
        jac_hf, jac_ops = convert(request.jac, QUAL, "jac", (x_aval,), args, "jac(x, *args)")
    if _out_size(hf) != n or (jac_hf is not None and _out_size(jac_hf) != n * n) or \
            not _on_cpu((x0, ops, jac_ops)):
        return None  # (SciPy's own shape errors; the steps run on the CPU)
    extra = _scipy_extra_calls()
    key = ("optimize hybrj", hf, jac_hf, x0.shape, np.dtype(x0.dtype), settings, extra)
    run = repeat_program(key, const(functools.partial(_program, hf, jac_hf, settings, extra)))
    if run is None:
        return None
    x, value, ok, stats, fields = run(x0, ops, jac_ops)
    status = int(np.asarray(stats[0]))
    message = _message(status, settings)
    if request.on_failure == "raise" and not bool(np.asarray(ok)):
        raise failure(QUAL, f"root(method='hybr'): {message}")
    return OptimizeResult(x=x, fun=value, success=ok, status=stats[0], nfev=stats[1],
                          njev=stats[2], nit=stats[3], method="hybr", message=message,
                          **fields)


def _on_cpu(operands: Any) -> bool:
    """Whether the operands are on the CPU (or on no device, with the CPU the default):
    the hybrj steps are CPU handlers."""
    try:
        return computes_on_cpu(eager_device(operands))
    except NotEager:
        return False


def _program(hf: HostFun, jac_hf: HostFun | None, settings: _hybrj.Settings, extra: int,
             x0: Any, ops: list, jac_ops: list) -> tuple:
    """The solve: (x, fun(x), success, (status, nfev, njev, nit), SciPy's fjac, r, qtf);
    x NaN (and so fun) where it failed, as the general path's "nan" policy."""
    shape, dtype = x0.shape, x0.dtype
    n = int(np.prod(shape, dtype=int))
    f64 = jnp.float64

    def fun(z: jax.Array) -> jax.Array:
        return jnp.ravel(hf(ops, z.reshape(shape).astype(dtype))).astype(f64)

    def user_jac(z: jax.Array) -> jax.Array:
        assert jac_hf is not None
        return jnp.reshape(jac_hf(jac_ops, z.reshape(shape).astype(dtype)), (n, n)).astype(f64)

    out = _hybrj.solve(fun, jax.jacfwd(fun) if jac_hf is None else user_jac,
                       jnp.ravel(jnp.asarray(x0)).astype(f64), settings)
    ok = (out.info == 1) & jnp.all(jnp.isfinite(out.x))
    x = jnp.where(ok, out.x, jnp.nan).reshape(shape).astype(dtype)
    stats = (out.info, out.nfev + extra, out.njev, jnp.full((), -1, jnp.int32))
    return (x, jnp.ravel(hf(ops, x)), ok, stats,
            {"fjac": out.fjac, "r": out.r, "qtf": out.qtf})


@functools.lru_cache(maxsize=256)
def _out_size(hf: HostFun) -> int:
    return hf.out_size()  # (HostFun compares structurally: one entry per structure)


@functools.cache
def _scipy_extra_calls() -> int:
    """How many more calls of `fun` SciPy's `root` reports in `nfev` than MINPACK
    counts (SciPy 1.17: 2, its shape check and its first call for the output array;
    SciPy's wrapper counts every call). Measured once on x = 0 from x0 = 1, which
    hybrj solves in 2 evaluations."""
    sol = scipy.optimize.root(lambda x: x, np.ones(1), jac=lambda x: np.ones((1, 1)),
                              method="hybr")
    return int(sol.nfev) - 2


def _message(status: int, settings: _hybrj.Settings) -> str:
    """SciPy's message for hybr's `status` (scipy.optimize._minpack_py._root_hybr)."""
    if status == 1:
        return "The solution converged."
    if status == 2:
        return f"The number of calls to function has reached maxfev = {settings.maxfev}."
    if status == 3:
        return (f"xtol={settings.xtol:f} is too small, no further improvement in the "
                "approximate\n solution is possible.")
    return _MESSAGES.get(status, "An error occurred.")


_MESSAGES = {
    0: "Improper input parameters were entered.",
    4: "The iteration is not making good progress, as measured by the \n improvement "
       "from the last five Jacobian evaluations.",
    5: "The iteration is not making good progress, as measured by the \n improvement "
       "from the last ten iterations."}
