"""What a compiled call of a host function depends on, frozen.

* `Definition`: an immutable snapshot of a foreign function -- the user's function,
  its rules and options. Setting a rule makes a new snapshot; calls traced before keep
  theirs. It holds no reference to the mutable `ForeignFunction`, so a dropped function
  (and everything JAX cached for it) can be freed.
* `CallSignature`: one call of a definition -- argument structure, abstract values,
  static leaves and keyword arguments, declared results -- and the parameter of the
  derivative-pair primitives (`jaxbridge._core.pair.Signature`). Equal calls share one
  signature object (cached on the definition), so JAX's own caches hit.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from .._core.jaxapi import hold_weakly_in_jax_caches
from ..errors import MissingRuleError, describe
from . import runners
from .hostcall import CopyPolicy, HostCallable, loop_leading, lower_host_call

__all__ = ["Rule", "Definition", "CallSignature"]

# Call signatures kept per function: distinct shapes, static leaves and keyword values.
SIGNATURES_KEPT = 256


@dataclasses.dataclass(frozen=True)
class Rule:
    """A user derivative rule: `kind="numpy"` runs on the host, `"jax"` is traced.
    `out=True`: the rule writes its results into arrays passed as ``out=``."""

    fun: Callable[..., Any]
    kind: str
    out: bool = False


@dataclasses.dataclass(frozen=True, eq=False)
class Definition:
    """A foreign function's code and options, as one immutable value."""

    fun: Callable[..., Any]
    name: str
    result: Any
    residuals: Any
    vmap: str
    backend: str
    batch_dims: int
    on_mesh: str
    out: bool
    linear: bool
    cast: bool
    aliases: tuple = ()  # forward call: ((operand, result), ...), see hostcall.check_aliases_arg
    vjp: Rule | None = None
    jvp: Rule | None = None
    transpose: Rule | None = None
    # Shared by every snapshot of one function: whether it keeps the views it is lent.
    copy_policies: dict = dataclasses.field(default_factory=dict, repr=False)
    # Per snapshot: the call signatures traced with it (the most recent ones).
    signatures: collections.OrderedDict = dataclasses.field(
        default_factory=collections.OrderedDict, init=False, repr=False)

    def copy_policy(self, role: str) -> CopyPolicy:
        return self.copy_policies.setdefault(role, CopyPolicy())

    def signature(self, key: Any, make: Callable[[], CallSignature]) -> CallSignature:
        """The call signature for `key`, made once; the cache keeps the most recent
        SIGNATURES_KEPT (a dropped one is made again, and recompiled, if needed)."""
        sig = self.signatures.get(key)
        if sig is None:
            sig = make()
            self.signatures[key] = sig
            while len(self.signatures) > SIGNATURES_KEPT:
                self.signatures.popitem(last=False)
        else:
            self.signatures.move_to_end(key)
        return sig


def _inexact(dtype: Any) -> bool:
    return bool(jnp.issubdtype(dtype, jnp.inexact))


class CallSignature:
    """One concrete call of a `Definition`; see the module docstring."""

    def __init__(self, defn: Definition, in_tree: Any, static_leaves: tuple, in_avals: tuple,
                 statics: tuple, out_tree: Any, primary_avals: tuple, res_tree: Any,
                 res_avals: tuple, batch_shape: tuple = (), base: CallSignature | None = None):
        self.defn = defn
        self.name = defn.name
        self.in_tree = in_tree
        self.static_leaves = static_leaves          # ((leaf index, value), ...)
        self.in_avals = in_avals                    # dynamic leaves only
        self.statics = statics                      # sorted keyword items
        self.out_tree, self.res_tree = out_tree, res_tree
        self.n_out = len(primary_avals)
        self.out_avals = primary_avals + res_avals  # every forward result
        self.batch_shape = batch_shape
        self.base = base or self
        self.num_batch_dims = defn.batch_dims + (len(batch_shape) if defn.batch_dims else 0)
        self.diff_in = tuple(_inexact(a.dtype) for a in in_avals)
        self.diff_out = tuple(_inexact(a.dtype) for a in primary_avals)
        self.tangent_outs = self.diff_out + (False,) * len(res_avals)
        self.prune_zero_tangents = not defn.linear
        # A batch_dims function is independent along leading dims, so vmap is one call
        # with one more (XLA may split it; on an explicit mesh lax.map would gather):
        # with vmap="loop" the host loops over the new dims (hostcall.loop_leading).
        self.vectorized = defn.vmap == "vectorized" or bool(defn.batch_dims)
        self._callables: dict[Any, HostCallable] = {}
        self._batched: dict[int, CallSignature] = {}
        self.kwargs = dict(statics)
        self.static_map = dict(static_leaves)
        self.n_args = len(in_tree.children())
        # Which positional argument each dynamic leaf belongs to.
        arg_of_leaf = []
        for i, child in enumerate(in_tree.children()):
            arg_of_leaf += [i] * child.num_leaves
        self.arg_of_dyn = tuple(a for j, a in enumerate(arg_of_leaf) if j not in self.static_map)
        # Hot path: plain array arguments need no unflattening.
        self.plain_args = not static_leaves and all(
            jax.tree_util.treedef_is_leaf(c) and c.num_leaves == 1
            for c in in_tree.children())  # an empty argument, e.g. (), is not a leaf

    # identity: one object per distinct call (see ForeignFunction._signature)
    __hash__ = object.__hash__

    def __eq__(self, other: object) -> bool:
        return self is other

    def __repr__(self) -> str:
        ins = ",".join(describe(a) for a in self.in_avals)
        outs = ",".join(describe(a) for a in self.primary_avals)
        batch = f" batch={list(self.batch_shape)}" if self.batch_shape else ""
        return f"{self.name}[({ins})->({outs}){batch}]"

    @property
    def primary_avals(self) -> tuple:
        return self.out_avals[:self.n_out]

    @property
    def res_avals(self) -> tuple:
        return self.out_avals[self.n_out:]

    # ---- vectorized vmap: the same function on a leading batch axis
    def batched(self, size: int) -> CallSignature:
        """This call with every operand and result given a leading axis of `size`."""
        sig = self._batched.get(size)
        if sig is None:
            def add(avals):
                return tuple(jax.ShapeDtypeStruct((size, *a.shape), a.dtype) for a in avals)
            sig = CallSignature(self.defn, self.in_tree, self.static_leaves,
                                add(self.in_avals), self.statics, self.out_tree,
                                add(self.primary_avals), self.res_tree, add(self.res_avals),
                                (size, *self.batch_shape), self.base)
            self._batched[size] = sig
        return sig

    # ---- leaves <-> the user's pytrees
    def args(self, dyn_leaves: Sequence[Any]) -> tuple:
        """The positional arguments, rebuilt from dynamic leaves and static leaves."""
        if self.plain_args:
            return tuple(dyn_leaves)
        leaves: list[Any] = []
        dyn = iter(dyn_leaves)
        for j in range(self.in_tree.num_leaves):
            leaves.append(self.static_map[j] if j in self.static_map else next(dyn))
        return tuple(jax.tree_util.tree_unflatten(self.in_tree, leaves))

    def per_argument(self, dyn_leaves: Sequence[Any | None]) -> tuple:
        """Per positional argument: None if all its dynamic leaves are None, else its
        pytree with None at those leaves and at static leaves (tangents, `out=`)."""
        dyn = iter(dyn_leaves)
        flat_index = 0
        result = []
        for child in self.in_tree.children():
            leaves = []
            for _ in range(child.num_leaves):
                leaves.append(None if flat_index in self.static_map else next(dyn))
                flat_index += 1
            result.append(None if all(v is None for v in leaves)
                          else jax.tree_util.tree_unflatten(child, leaves))
        return tuple(result)

    def outputs(self, out_leaves: Sequence[Any]) -> tuple[Any, Any]:
        """(out, res) pytrees from the flat results (res is None without residuals)."""
        out = jax.tree_util.tree_unflatten(self.out_tree, list(out_leaves[:self.n_out]))
        if self.res_tree is None:
            return out, None
        return out, jax.tree_util.tree_unflatten(self.res_tree, list(out_leaves[self.n_out:]))

    # ---- the derivative pair (jaxbridge._core.pair.Signature)
    def eager(self, role: str, args: Sequence[Any], nz: tuple) -> list | None:
        """Eager calls run the host code directly on the host (no XLA program: faster,
        and nothing for JAX to cache); arrays sharded over several devices take the
        compiled path, which splits or refuses the call as under `jit`."""
        devices = set()
        for a in args:
            if isinstance(a, jax.Array):
                devices |= a.devices()
        if len(devices) > 1:
            return None
        target = self.host_callable(role, nz)
        outs = target.run_eagerly(args)
        device = next(iter(devices), None)
        return [jax.device_put(o, device) for o in outs]

    def fixed(self, primals: Sequence[Any], outs: Sequence[Any]) -> list:
        return [] if self.defn.linear else [*primals, *outs]

    def _rule_of(self, role: str) -> Rule | None:
        defn = self.defn
        if role == "tangent":
            return Rule(defn.fun, "numpy", defn.out) if defn.linear else defn.jvp
        return defn.transpose if defn.linear else defn.vjp

    def rule(self, role: str) -> str | None:
        rule = self._rule_of(role)
        if rule is None:
            return None
        return "traced" if rule.kind == "jax" else "native"

    def traced(self, role: str, nz: tuple) -> Callable[..., list]:
        """The user's JAX-written rule as a function of flat operands (vmapped over any
        batch axes of a vectorized call)."""
        base = self.base
        rule = self._rule_of(role)
        if rule is None:
            raise self.missing(role)

        def run(*ops: Any) -> list:
            return runners.run_rule(base, role, rule, ops, nz, host=False)

        for _ in self.batch_shape:
            run = jax.vmap(run)
        return run

    def missing(self, role: str) -> MissingRuleError:
        name = self.name
        if role == "tangent":
            return MissingRuleError(
                f"jaxbridge: forward-mode differentiation (jvp, jacfwd, hessian) of foreign "
                f"function {name!r} needs a tangent (JVP) rule, and none is defined. Define "
                f"one with @{name}.defjvp.")
        if role == "adjoint":
            fix = (f"@{name}.deftranspose" if self.defn.linear else f"@{name}.defvjp")
            return MissingRuleError(
                f"jaxbridge: reverse-mode differentiation (grad, vjp, jacrev) of foreign "
                f"function {name!r} needs an adjoint ({'transpose' if self.defn.linear else 'VJP'}"
                f") rule, and none is defined. Define one with {fix}.")
        return MissingRuleError(
            f"jaxbridge: differentiation of foreign function {name!r} needs a JVP or VJP "
            f"rule, and none is defined. Define one with @{name}.defvjp and/or "
            f"@{name}.defjvp (or declare jb.foreign(..., linear=True) for a linear function).")

    def second_order_error(self, role: str) -> MissingRuleError:
        kind = "JVP" if role == "tangent" else "VJP"
        method = "defjvp" if role == "tangent" else "defvjp"
        return MissingRuleError(
            f"jaxbridge: a second-order derivative of foreign function {self.name!r} "
            f"differentiates its {kind} rule with respect to the primal inputs, but that rule "
            f"runs on the host and cannot be differentiated. Write it in JAX and register it "
            f"with {self.name}.{method}(rule, kind='jax'), or declare a linear function with "
            f"jb.foreign(..., linear=True) and a transpose rule.")

    def lower(self, role: str, ctx: Any, *args: Any, nz: tuple, platform: str | None
              ) -> Sequence[Any]:
        defn = self.defn
        return lower_host_call(ctx, self.host_callable(role, nz), *args, backend=defn.backend,
                               platform=platform, num_batch_dims=self.num_batch_dims,
                               on_mesh=defn.on_mesh,
                               aliases=defn.aliases if role == "forward" else ())

    def host_callable(self, role: str, nz: tuple = ()) -> HostCallable:
        """The host computation of `role` (one per role and `nz`, cached)."""
        key = (role, nz)
        target = self._callables.get(key)
        if target is None:
            fill, avals, what = runners.filler(self, role, self._rule_of(role), nz)
            if self.batch_shape and self.defn.vmap != "vectorized":
                fill = loop_leading(runners.filler(self.base, role, self._rule_of(role), nz)[0],
                                    len(self.batch_shape))
            target = HostCallable(fill, avals, self.name, what, self.defn.copy_policy(role))
            self._callables[key] = target
        return target


hold_weakly_in_jax_caches(CallSignature)
