"""Derivative wiring: three primitives that make a host function a full JAX citizen.

* `foreign_call`  primals -> outputs (+ residuals). Its JVP emits `foreign_jvp`.
* `foreign_jvp`   (primals, outputs, tangents) -> output tangents; linear in the
                  tangents. Evaluated, it runs the user's JVP rule; transposed (for
                  `grad`), it becomes the user's VJP rule. This is how `jacfwd` and
                  `jacrev` both work on one function (the design `jax.custom_vjp`
                  uses internally, opened up to forward mode).
* `foreign_vjp`   (primals, outputs, cotangents) -> input cotangents; linear in the
                  cotangents; its transpose is `foreign_jvp` again.

Rules written in JAX (`kind="jax"`) are traced instead of called back, so JAX can
differentiate them again (higher-order derivatives). Every primitive batches by the
function's declared `vmap` choice: a loop of calls (`lax.map`) or one vectorized
call with a leading batch axis.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp

from ._compat import (Primitive, ad, aval_of, batching, is_zero, mlir, result_avals,
                      zero_tangent)
from ._hostcall import lower_host_call
from ._primitives import apply_via_jit, batch_rule
from ._spec import CallSpec

foreign_call_p = Primitive("foreign_call")
foreign_jvp_p = Primitive("foreign_jvp")
foreign_vjp_p = Primitive("foreign_vjp")
for _p in (foreign_call_p, foreign_jvp_p, foreign_vjp_p):
    _p.multiple_results = True


from .errors import MissingRuleError  # noqa: E402


def _missing(spec: CallSpec, mode: str, rule: str, fix: str) -> MissingRuleError:
    return MissingRuleError(
        f"jaxbridge: {mode} of foreign function {spec.name!r} needs a {rule} rule, and "
        f"none is defined. {fix}")


def _no_jvp(spec: CallSpec) -> MissingRuleError:
    return _missing(spec, "forward-mode differentiation (jvp, jacfwd, hessian)", "JVP",
                    f"Define one with @{spec.name}.defjvp.")


def _no_vjp(spec: CallSpec) -> MissingRuleError:
    return _missing(spec, "reverse-mode differentiation (grad, vjp, jacrev)", "VJP",
                    f"Define one with @{spec.name}.defvjp.")


def _jvp_out_avals(spec: CallSpec) -> list:
    return [a for a, d in zip(spec.out_avals, spec.diff_out) if d]


def _vjp_out_avals(spec: CallSpec, nz: tuple) -> list:
    return [a for a, z in zip(spec.in_avals, nz) if z]


# ---------------------------------------------------------------- abstract eval
foreign_call_p.def_abstract_eval(
    lambda *avals, spec: result_avals(avals, spec.all_out_avals, spec.name))
foreign_jvp_p.def_abstract_eval(
    lambda *avals, spec, nz: result_avals(avals, _jvp_out_avals(spec), spec.name))
foreign_vjp_p.def_abstract_eval(
    lambda *avals, spec, nz: result_avals(avals, _vjp_out_avals(spec, nz), spec.name))


# ---------------------------------------------------------------- eager: via jit
for _p in (foreign_call_p, foreign_jvp_p, foreign_vjp_p):
    _p.def_impl(functools.partial(apply_via_jit, _p))


# ---------------------------------------------------------------- lowering
def _host_options(spec: CallSpec, platform: str | None) -> dict:
    return dict(backend=spec.fn.backend, platform=platform,
                num_batch_dims=spec.num_batch_dims, on_mesh=spec.fn.on_mesh)


def _lower_call(ctx, *args, spec, platform):
    return lower_host_call(ctx, spec.host_callable("forward"), *args,
                           **_host_options(spec, platform))


def _lower_rule(kind: str, ctx, *args, spec, nz, platform):
    rule = spec.fn.jvp_rule if kind == "jvp" else spec.fn.vjp_rule
    if rule is None:
        raise _no_jvp(spec) if kind == "jvp" else _no_vjp(spec)
    if rule.kind == "jax":
        return mlir.lower_fun(spec.traced(kind, nz), multiple_results=True)(ctx, *args)
    return lower_host_call(ctx, spec.host_callable(kind, nz), *args,
                           **_host_options(spec, platform))


for _platform in ("cpu", "cuda", None):
    _kw = {} if _platform is None else {"platform": _platform}
    mlir.register_lowering(foreign_call_p, functools.partial(_lower_call, platform=_platform),
                           **_kw)
    mlir.register_lowering(foreign_jvp_p,
                           functools.partial(_lower_rule, "jvp", platform=_platform), **_kw)
    mlir.register_lowering(foreign_vjp_p,
                           functools.partial(_lower_rule, "vjp", platform=_platform), **_kw)


# ---------------------------------------------------------------- forward mode
def _instantiate(t: Any, primal: Any) -> Any:
    return jnp.zeros(jnp.shape(primal), t.aval.dtype) if is_zero(t) else t


def _foreign_call_jvp(primals, tangents, *, spec: CallSpec):
    outs = foreign_call_p.bind(*primals, spec=spec)
    nz = tuple(d and not is_zero(t) for d, t in zip(spec.diff_in, tangents))
    zeros = [zero_tangent(aval_of(o)) for o in outs]
    if not any(nz):
        return outs, zeros
    fn = spec.fn
    if fn.jvp_rule is None and fn.vjp_rule is None:
        raise _missing(spec, "differentiation", "JVP or VJP",
                       f"Define one with @{spec.name}.defvjp and/or @{spec.name}.defjvp.")
    live = [t for t, z in zip(tangents, nz) if z]
    if fn.vjp_rule is None and fn.jvp_rule.kind == "jax":
        # Let JAX differentiate and transpose the traced rule itself.
        out_tans = spec.traced("jvp", nz)(*primals, *outs, *live)
    else:
        out_tans = foreign_jvp_p.bind(*primals, *outs, *live, spec=spec, nz=nz)
    out_tans = iter(out_tans)
    return outs, [next(out_tans) if i < spec.n_out and spec.diff_out[i] else zeros[i]
                  for i in range(len(outs))]


ad.primitive_jvps[foreign_call_p] = _foreign_call_jvp


def _split(spec: CallSpec, operands: Sequence[Any]) -> tuple[list, list]:
    """(primals + outputs, linear operands)."""
    n = len(spec.in_avals) + len(spec.all_out_avals)
    return list(operands[:n]), list(operands[n:])


def _rule_jvp(prim: Primitive, kind: str):
    """JVP of a linear rule primitive w.r.t. all its operands (second order)."""

    def jvp(primals, tangents, *, spec: CallSpec, nz: tuple):
        out = prim.bind(*primals, spec=spec, nz=nz)
        fixed_t, linear_t = _split(spec, tangents)
        if all(is_zero(t) for t in fixed_t):
            # Only the linear operands move: the derivative is the map itself.
            fixed, linear = _split(spec, primals)
            linear_t = [_instantiate(t, p) for t, p in zip(linear_t, linear)]
            return out, prim.bind(*fixed, *linear_t, spec=spec, nz=nz)
        rule = spec.fn.jvp_rule if kind == "jvp" else spec.fn.vjp_rule
        if rule is None or rule.kind != "jax":
            raise MissingRuleError(
                f"jaxbridge: a second-order derivative of foreign function {spec.name!r} "
                f"differentiates its {kind.upper()} rule, which runs on the host and cannot be "
                f"differentiated. Write that rule in JAX and register it with "
                f"{spec.name}.def{kind}(rule, kind='jax').")
        tangents = [_instantiate(t, p) for t, p in zip(tangents, primals)]
        _, out_t = jax.jvp(spec.traced(kind, nz), tuple(primals), tuple(tangents))
        return out, list(out_t)

    return jvp


ad.primitive_jvps[foreign_jvp_p] = _rule_jvp(foreign_jvp_p, "jvp")
ad.primitive_jvps[foreign_vjp_p] = _rule_jvp(foreign_vjp_p, "vjp")


# ---------------------------------------------------------------- reverse mode
def _check_fixed(spec: CallSpec, fixed: Sequence[Any]) -> None:
    if any(ad.is_undefined_primal(x) for x in fixed):
        raise MissingRuleError(
            f"jaxbridge: foreign function {spec.name!r}: cannot transpose a derivative rule "
            f"with respect to its primal inputs (the rule is linear only in its tangents).")


def _foreign_jvp_transpose(cts, *operands, spec: CallSpec, nz: tuple):
    fixed, linear = _split(spec, operands)
    _check_fixed(spec, fixed)
    none = [None] * len(fixed)
    if all(is_zero(c) for c in cts):
        return none + [ad.Zero(t.aval) for t in linear]
    diff_avals = [a for a, d in zip(spec.out_avals, spec.diff_out) if d]
    cts = [jnp.zeros(a.shape, a.dtype) if is_zero(c) else c for c, a in zip(cts, diff_avals)]
    rule = spec.fn.vjp_rule
    if rule is None:
        raise _no_vjp(spec)
    if rule.kind == "jax":
        in_cts = spec.traced("vjp", nz)(*fixed, *cts)
    else:
        in_cts = foreign_vjp_p.bind(*fixed, *cts, spec=spec, nz=nz)
    return none + list(in_cts)


def _foreign_vjp_transpose(cts, *operands, spec: CallSpec, nz: tuple):
    fixed, linear = _split(spec, operands)
    _check_fixed(spec, fixed)
    none = [None] * len(fixed)
    if all(is_zero(c) for c in cts):
        return none + [ad.Zero(c.aval) for c in linear]
    in_avals = [a for a, z in zip(spec.in_avals, nz) if z]
    cts = [jnp.zeros(a.shape, a.dtype) if is_zero(c) else c for c, a in zip(cts, in_avals)]
    if spec.fn.jvp_rule is None:
        raise _no_jvp(spec)
    return none + list(foreign_jvp_p.bind(*fixed, *cts, spec=spec, nz=nz))


ad.primitive_transposes[foreign_jvp_p] = _foreign_jvp_transpose
ad.primitive_transposes[foreign_vjp_p] = _foreign_vjp_transpose


# ---------------------------------------------------------------- vmap
for _p in (foreign_call_p, foreign_jvp_p, foreign_vjp_p):
    batching.primitive_batchers[_p] = batch_rule(_p, lambda spec: spec.fn.vmap == "vectorized")
