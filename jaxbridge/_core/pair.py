"""The derivative pair: a forward computation with its JVP and VJP, wired into JAX as
three primitives. Host functions (`jaxbridge._foreign`) and C++/CUDA kernels
(`jaxbridge._kernel`) are both instances; everything JAX needs is here, once.

The three roles (`ROLES`, JAX's words; docs/layout.md's "Vocabulary" table):

* forward  ``primals -> outputs``; its JVP binds `jvp`.
* jvp      ``(*fixed, *tangents) -> output tangents``, linear in the tangents.
  Transposed (for `grad`) it becomes `vjp`.
* vjp      ``(*fixed, *cotangents) -> input cotangents``, linear in the cotangents;
  its transpose is `jvp` again.

`fixed` are the operands a derivative needs besides the (co)tangents: the primals and
(usually) the forward outputs and residuals; none for a linear function, whose JVP
is the function itself (and whose VJP is its transpose). A signature may bind a
different forward call when it is differentiated (`with_residuals`): one that also
returns residuals. So `grad`/`vjp`/`jacrev` need only the VJP rule, `jvp`/`jacfwd` only
the JVP rule, and nothing uses `jax.custom_vjp` (which would rule out forward mode).

Each primitive is parameterized by a *signature* (`sig`): a hashable description of one
call that says what the derivatives are and how to lower each role (see `Signature`).
How a rule is bound (`Signature.rule`) is "traced" (written in JAX, the public
``kind="jax"``: inlined, so JAX can differentiate it again) or "opaque" (a host call,
``kind="numpy"``, or an FFI kernel: bound as the jvp or vjp primitive).
The jvp and vjp primitives also take `nz`, the inputs whose (co)tangents are not
symbolic zeros.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import jax
import jax.numpy as jnp

from ..errors import original_exception
from .jaxapi import (
    Primitive,
    ad,
    aval_of,
    batching,
    cast_to_varying,
    is_zero,
    mlir,
    result_avals,
    varying_axes,
    zero_tangent,
)

__all__ = ["ROLES", "VMAP_CHOICES", "Signature", "Pair", "make_pair", "join_varying",
           "with_residuals"]

ROLES = ("forward", "jvp", "vjp")
# How vmap runs a pair (Signature.vectorized): one call per batch element, or one call
# with a leading batch axis. The words of jb.foreign(vmap=...) and jb.kernel(vmap=...).
VMAP_CHOICES = ("loop", "vectorized")
PLATFORMS = ("cpu", "cuda", "rocm")


class Signature(Protocol):
    """What a pair's primitives need to know about one call (see the module docstring).

    Implementations are hashable (JAX caches on primitive parameters) and immutable.
    """

    @property
    def name(self) -> str: ...                  # for error messages
    @property
    def in_avals(self) -> tuple: ...            # forward operands: ShapeDtypeStruct-like
    @property
    def out_avals(self) -> tuple: ...           # forward results
    @property
    def diff_in(self) -> tuple: ...             # per input: tangent / cotangent?
    @property
    def tangent_outs(self) -> tuple: ...        # per forward result: a tangent?
    @property
    def prune_zero_tangents(self) -> bool: ...  # the jvp rule gets only non-zero tangents
    @property
    def vectorized(self) -> bool: ...           # vmap: one call with a batch axis
    @property
    def num_batch_dims(self) -> int: ...        # leading dims XLA may split (sharding)

    def eager(self, role: str, args: Sequence[Any], nz: tuple) -> list | None: ...
    def fixed(self, primals: Sequence[Any], outs: Sequence[Any]) -> list: ...
    def rule(self, role: str) -> str | None: ...            # "opaque" | "traced" | None
    def traced(self, role: str, nz: tuple) -> Callable[..., list]: ...
    def missing(self, role: str) -> Exception: ...
    def second_order_error(self, role: str) -> Exception: ...
    def batched(self, size: int) -> Signature: ...
    def lower(self, role: str, ctx: Any, *args: Any, nz: tuple, platform: str | None
              ) -> Sequence[Any]: ...


def join_varying(arrays: list) -> list:
    """Inside `shard_map`, cast replicated operands to vary over the same mesh axes as
    the others (the gradient of a replicated input is then summed over shards)."""
    axes = frozenset().union(*(varying_axes(aval_of(x)) for x in arrays))
    return [cast_to_varying(x, axes) for x in arrays] if axes else arrays


def with_residuals(sig: Signature) -> Signature:
    """The signature of the call that derivatives need: `sig.with_residuals()` where a
    signature has it (a kernel whose forward for differentiation returns residuals
    after its outputs, from a target of its own, so that a call nobody differentiates
    does not compute them), else `sig` itself. Its results begin with `sig`'s."""
    more = getattr(sig, "with_residuals", None)
    return sig if more is None else more()


def _zeros(aval: Any) -> Any:
    return jnp.zeros(aval.shape, aval.dtype)


def _instantiate(values: Sequence[Any], avals: Sequence[Any]) -> list:
    return [_zeros(a) if is_zero(v) else v for v, a in zip(values, avals)]


def _jvp_avals(sig: Signature, nz: tuple) -> list:
    return [a for a, t in zip(sig.out_avals, sig.tangent_outs) if t]


def _vjp_avals(sig: Signature, nz: tuple) -> list:
    return [a for a, z in zip(sig.in_avals, nz) if z]


class Pair:
    """The three primitives of one kind of derivative pair (see the module docstring)."""

    def __init__(self, prefix: str):
        self.forward = Primitive(f"{prefix}")
        self.jvp = Primitive(f"{prefix}_jvp")
        self.vjp = Primitive(f"{prefix}_vjp")
        self.role = {self.forward: "forward", self.jvp: "jvp",
                     self.vjp: "vjp"}
        for prim in self.role:
            prim.multiple_results = True
            prim.def_impl(functools.partial(self._eager, prim))
            batching.primitive_batchers[prim] = functools.partial(self._batch, prim)
            mlir.register_lowering(prim, functools.partial(self._lower, prim, None))
            for platform in PLATFORMS:
                mlir.register_lowering(prim, functools.partial(self._lower, prim, platform),
                                       platform=platform)
        self.forward.def_abstract_eval(lambda *avals, sig: result_avals(
            avals, sig.out_avals, sig.name, sig.num_batch_dims))
        self.jvp.def_abstract_eval(lambda *avals, sig, nz: result_avals(
            avals, _jvp_avals(sig, nz), sig.name, sig.num_batch_dims))
        self.vjp.def_abstract_eval(lambda *avals, sig, nz: result_avals(
            avals, _vjp_avals(sig, nz), sig.name, sig.num_batch_dims))
        ad.primitive_jvps[self.forward] = self._forward_jvp
        ad.primitive_jvps[self.jvp] = functools.partial(self._linear_jvp, self.jvp)
        ad.primitive_jvps[self.vjp] = functools.partial(self._linear_jvp, self.vjp)
        ad.primitive_transposes[self.jvp] = self._jvp_transpose
        ad.primitive_transposes[self.vjp] = self._vjp_transpose

    def call(self, sig: Signature, *args: Any) -> list:
        """Bind the forward primitive (inside `shard_map`, on operands that all vary
        over the same mesh axes)."""
        return self.forward.bind(*join_varying(list(args)), sig=sig)

    # ---- eager evaluation
    def _eager(self, prim: Primitive, *args: Any, sig: Signature, nz: tuple | None = None
               ) -> Any:
        """Run the signature's own eager path if it has one (host functions run
        directly), else compile the primitive like JAX's own eager primitives -- under
        `jax.disable_jit()` too, or `jit` would call this `impl` again, for ever. A host
        function's exception that crossed XLA as a status is re-raised as itself."""
        direct = sig.eager(self.role[prim], args, nz or ())
        if direct is not None:
            return direct
        with jax.disable_jit(False):
            try:
                return _compiled(prim, sig, nz, *args)
            except Exception as err:  # noqa: BLE001 - re-raised unless it carries a failure
                original = original_exception(err)
                if original is None:
                    raise
        raise original

    # ---- lowering
    def _lower(self, prim: Primitive, platform: str | None, ctx: Any, *args: Any,
               sig: Signature, nz: tuple = ()) -> Sequence[Any]:
        role = self.role[prim]
        if role != "forward":
            how = sig.rule(role)
            if how is None:
                raise sig.missing(role)
            if how == "traced":
                return mlir.lower_fun(sig.traced(role, nz), multiple_results=True)(ctx, *args)
        return sig.lower(role, ctx, *args, nz=nz, platform=platform)

    # ---- forward mode
    def _forward_jvp(self, primals: Sequence[Any], tangents: Sequence[Any], *,
                     sig: Signature) -> tuple[list, list]:
        live = tuple(d and not is_zero(t) for d, t in zip(sig.diff_in, tangents))
        if not any(live):
            outs = self.forward.bind(*primals, sig=sig)
            return outs, [zero_tangent(aval_of(o)) for o in outs]
        if sig.rule("jvp") is None and sig.rule("vjp") is None:
            raise sig.missing("any")
        # The call the derivatives need: its forward may also return residuals (after
        # the outputs), which only the derivative rules receive.
        dsig = with_residuals(sig)
        full = self.forward.bind(*primals, sig=dsig)
        outs = full[:len(sig.out_avals)]
        zeros = [zero_tangent(aval_of(o)) for o in outs]
        nz = live if sig.prune_zero_tangents else tuple(sig.diff_in)
        tans = [t for t, z in zip(_instantiate(tangents, sig.in_avals), nz) if z]
        fixed = dsig.fixed(primals, full)
        if sig.rule("jvp") == "traced" and sig.rule("vjp") is None:
            out_t = sig.traced("jvp", nz)(*fixed, *tans)  # JAX transposes it itself
        else:
            out_t = self.jvp.bind(*join_varying([*fixed, *tans]), sig=dsig, nz=nz)
        each = iter(out_t)
        return outs, [next(each) if t else z for t, z in zip(sig.tangent_outs, zeros)]

    def _linear_jvp(self, prim: Primitive, primals: Sequence[Any], tangents: Sequence[Any],
                    *, sig: Signature, nz: tuple) -> tuple[Any, Any]:
        """JVP of a derivative with respect to all its operands (second order)."""
        out = prim.bind(*primals, sig=sig, nz=nz)
        n = len(primals) - self._n_linear(prim, sig, nz)
        if all(is_zero(t) for t in tangents[:n]):
            # Only the linear operands move: the derivative is the map itself.
            linear_t = _instantiate(tangents[n:], [aval_of(p) for p in primals[n:]])
            return out, prim.bind(*primals[:n], *linear_t, sig=sig, nz=nz)
        role = self.role[prim]
        if sig.rule(role) != "traced":
            raise sig.second_order_error(role)
        tangents = _instantiate(tangents, [aval_of(p) for p in primals])
        _, out_t = jax.jvp(sig.traced(role, nz), tuple(primals), tuple(tangents))
        return out, list(out_t)

    def _n_linear(self, prim: Primitive, sig: Signature, nz: tuple) -> int:
        return sum(nz) if prim is self.jvp else sum(sig.tangent_outs)

    # ---- reverse mode
    def _split_fixed(self, prim: Primitive, operands: Sequence[Any], sig: Signature,
                     nz: tuple) -> tuple[list, list]:
        n = len(operands) - self._n_linear(prim, sig, nz)
        fixed = list(operands[:n])
        if any(ad.is_undefined_primal(x) for x in fixed):
            raise sig.second_order_error(self.role[prim])
        return fixed, list(operands[n:])

    def _jvp_transpose(self, cts: Sequence[Any], *operands: Any, sig: Signature,
                           nz: tuple) -> list:
        fixed, linear = self._split_fixed(self.jvp, operands, sig, nz)
        if all(is_zero(c) for c in cts):
            return [None] * len(fixed) + [ad.Zero(t.aval) for t in linear]
        cts = _instantiate(cts, _jvp_avals(sig, nz))
        how = sig.rule("vjp")
        if how is None:
            raise sig.missing("vjp")
        if how == "traced":
            in_cts = sig.traced("vjp", nz)(*fixed, *cts)
        else:
            in_cts = self.vjp.bind(*join_varying([*fixed, *cts]), sig=sig, nz=nz)
        return [None] * len(fixed) + list(in_cts)

    def _vjp_transpose(self, cts: Sequence[Any], *operands: Any, sig: Signature,
                           nz: tuple) -> list:
        fixed, linear = self._split_fixed(self.vjp, operands, sig, nz)
        if all(is_zero(c) for c in cts):
            return [None] * len(fixed) + [ad.Zero(c.aval) for c in linear]
        cts = _instantiate(cts, _vjp_avals(sig, nz))
        if sig.rule("jvp") is None:
            raise sig.missing("jvp")
        return [None] * len(fixed) + list(self.jvp.bind(*join_varying([*fixed, *cts]),
                                                            sig=sig, nz=nz))

    # ---- vmap: one vectorized call, or a loop of calls
    def _batch(self, prim: Primitive, args: Sequence[Any], dims: Sequence[int | None], *,
               sig: Signature, **params: Any) -> tuple[list, list]:
        size = next(a.shape[d] for a, d in zip(args, dims) if d is not None)
        if sig.vectorized:
            moved = [jnp.broadcast_to(a, (size, *jnp.shape(a))) if d is None
                     else jnp.moveaxis(a, d, 0) for a, d in zip(args, dims)]
            outs = prim.bind(*moved, sig=sig.batched(size), **params)
        else:
            mapped = [d is not None for d in dims]
            batched = [jnp.moveaxis(a, d, 0) for a, d in zip(args, dims) if d is not None]

            def one(xs):
                xs = iter(xs)
                return prim.bind(*[next(xs) if m else a for a, m in zip(args, mapped)],
                                 sig=sig, **params)

            outs = jax.lax.map(one, batched)
        return list(outs), [0] * len(outs)


@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def _compiled(prim: Primitive, sig: Signature, nz: tuple | None, *args: Any) -> Any:
    # One jitted function for every eager call: JAX's cache (bounded, and emptied by
    # jax.clear_caches) holds the signature, which a per-signature jitted function
    # would keep alive for ever (its traced jaxpr refers back to it).
    return prim.bind(*args, sig=sig, **({} if nz is None else {"nz": nz}))


def make_pair(prefix: str) -> Pair:
    """The forward/jvp/vjp primitives named `prefix`, `prefix_jvp`, `prefix_vjp`."""
    return Pair(prefix)
