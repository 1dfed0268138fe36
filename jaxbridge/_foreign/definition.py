"""What a host function is, and the structure of one call of it.

* `Rule`: a user derivative rule and how it runs.
* `Definition`: an immutable snapshot of a foreign function -- the user's function,
  its rules and options. Setting a rule makes a new snapshot; calls traced before keep
  theirs. It holds no reference to the mutable `ForeignFunction`, so a dropped function
  (and everything JAX cached for it) can be freed.
* `CallLayout`: one call of a definition -- argument structure, abstract values, static
  leaves and keyword arguments, declared results -- and the moves between flat leaves
  and the user's pytrees. What `runners` needs to call user code, and the base of
  `signature.CallSignature` (which adds how the derivative pair runs the call).
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, Self, TypeVar

import jax

from .._core.checks import is_differentiable
from ..errors import MissingRuleError, describe
from .hostcall import CopyPolicy

__all__ = ["Rule", "Definition", "CallInputs", "CallOutputs", "CallLayout"]

# Call signatures kept per function: distinct shapes, static leaves and keyword values.
SIGNATURES_KEPT = 256
L = TypeVar("L", bound="CallLayout")


@dataclasses.dataclass(frozen=True)
class Rule:
    """A user derivative rule: `kind="numpy"` runs on the host, `"jax"` is traced.
    `out` (the public ``out=True``): the rule writes its results into arrays passed as
    ``out=`` instead of returning them. `wanted` (a VJP rule's ``wanted=True``): the
    rule is told which cotangents are used (``wanted=``, see `runners.wanted_trees`)."""

    fun: Callable[..., Any]
    kind: str
    out: bool = False
    wanted: bool = False


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
    out: bool            # jb.foreign(out=True): the function fills `out=` buffers
    linear: bool
    cast: bool
    aliases: tuple = ()  # forward call: ((operand, result), ...), see api._forward_aliases
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

    def signature(self, key: Any, make: Callable[[], L]) -> L:
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


class CallInputs(NamedTuple):
    """A call's arguments: their pytree, the static leaves ((leaf index, value), ...),
    the dynamic leaves' abstract values and the sorted keyword items."""
    in_tree: Any
    static_leaves: tuple
    avals: tuple
    statics: tuple


class CallOutputs(NamedTuple):
    """A call's results: the declared results' pytree and abstract values, then the
    residuals' (None and () without residuals)."""
    out_tree: Any
    avals: tuple
    res_tree: Any
    res_avals: tuple


class CallLayout:
    """One concrete call of a `Definition`: its arguments, results and rules (the
    `CallSignature` adds how the derivative pair runs it)."""

    def __init__(self, defn: Definition, inputs: CallInputs, outputs: CallOutputs,
                 batch_shape: tuple = (), base: CallLayout | None = None):
        in_tree, static_leaves, in_avals, statics = inputs
        out_tree, primary_avals, res_tree, res_avals = outputs
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
        self.diff_in = tuple(is_differentiable(a.dtype) for a in in_avals)
        self.diff_out = tuple(is_differentiable(a.dtype) for a in primary_avals)
        self.tangent_outs = self.diff_out + (False,) * len(res_avals)
        self.prune_zero_tangents = not defn.linear
        # A batch_dims function is independent along leading dims, so vmap is one call
        # with one more (XLA may split it; on an explicit mesh lax.map would gather):
        # with vmap="loop" the host loops over the new dims (runners.loop_leading).
        self.vectorized = defn.vmap == "vectorized" or bool(defn.batch_dims)
        self._batched: dict[int, Self] = {}
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
    def batched(self, size: int) -> Self:
        """This call with every operand and result given a leading axis of `size`."""
        sig = self._batched.get(size)
        if sig is None:
            def add(avals):
                return tuple(jax.ShapeDtypeStruct((size, *a.shape), a.dtype) for a in avals)
            inputs = CallInputs(self.in_tree, self.static_leaves, add(self.in_avals),
                                self.statics)
            outputs = CallOutputs(self.out_tree, add(self.primary_avals), self.res_tree,
                                  add(self.res_avals))
            sig = type(self)(self.defn, inputs, outputs, (size, *self.batch_shape), self.base)
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

    def per_argument(self, dyn_leaves: Sequence[Any], static: Any = None,
                     collapse: bool = True) -> tuple:
        """Per positional argument, its pytree with `dyn_leaves` at its dynamic leaves
        and `static` at its static ones; with `collapse`, None for an argument whose
        leaves are all None (tangents, `out=`, a rule's input cotangents)."""
        dyn = iter(dyn_leaves)
        flat_index = 0
        result = []
        for child in self.in_tree.children():
            leaves = []
            for _ in range(child.num_leaves):
                leaves.append(static if flat_index in self.static_map else next(dyn))
                flat_index += 1
            result.append(None if collapse and all(v is None for v in leaves)
                          else jax.tree_util.tree_unflatten(child, leaves))
        return tuple(result)

    def outputs(self, out_leaves: Sequence[Any]) -> tuple[Any, Any]:
        """(out, res) pytrees from the flat results (res is None without residuals)."""
        out = jax.tree_util.tree_unflatten(self.out_tree, list(out_leaves[:self.n_out]))
        if self.res_tree is None:
            return out, None
        return out, jax.tree_util.tree_unflatten(self.res_tree, list(out_leaves[self.n_out:]))

    def _rule_of(self, role: str) -> Rule | None:
        defn = self.defn
        if role == "jvp":
            return Rule(defn.fun, "numpy", defn.out) if defn.linear else defn.jvp
        return defn.transpose if defn.linear else defn.vjp

    def missing(self, role: str) -> MissingRuleError:
        name = self.name
        if role == "jvp":
            return MissingRuleError(
                f"jaxbridge: forward-mode differentiation (jvp, jacfwd, hessian) of foreign "
                f"function {name!r} needs a JVP rule, and none is defined. Define "
                f"one with @{name}.defjvp.")
        if role == "vjp":
            fix = (f"@{name}.deftranspose" if self.defn.linear else f"@{name}.defvjp")
            return MissingRuleError(
                f"jaxbridge: reverse-mode differentiation (grad, vjp, jacrev) of foreign "
                f"function {name!r} needs a {'transpose' if self.defn.linear else 'VJP'}"
                f" rule, and none is defined. Define one with {fix}.")
        return MissingRuleError(
            f"jaxbridge: differentiation of foreign function {name!r} needs a JVP or VJP "
            f"rule, and none is defined. Define one with @{name}.defvjp and/or "
            f"@{name}.defjvp (or declare jb.foreign(..., linear=True) for a linear function).")
