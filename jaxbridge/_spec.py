"""One concrete call signature of a foreign function, and the runners of its rules.

A `CallSpec` fixes everything static about a call: the positional arguments' tree
structure and abstract values, non-array leaves, keyword (static) arguments, the
declared results and residuals, and (for vectorized `vmap`) the batch shape. It is
the parameter of jaxbridge's primitives, so it is hashable and cached: equal calls
share one spec, and JAX's own caches hit.

The runners here translate between flat leaves (what primitives see) and the
user's pytrees (what rules see), and check every value a user function returns.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np

from ._hostcall import ForeignCallError, HostCallable

if TYPE_CHECKING:
    from ._foreign import ForeignFunction

_PY_SCALARS = (bool, int, float, complex)


def _is_array_like(x: Any) -> bool:
    return isinstance(x, (np.ndarray, np.generic, jax.Array, *_PY_SCALARS))


def _is_none(x: Any) -> bool:
    return x is None


def _local(avals: Sequence[Any], shapes: Sequence[tuple]) -> tuple:
    """Declared avals with the shapes of one shard of a batch-partitioned call."""
    return tuple(a if tuple(a.shape) == tuple(sh) else jax.ShapeDtypeStruct(tuple(sh), a.dtype)
                 for a, sh in zip(avals, shapes))


def _describe(aval: Any) -> str:
    return f"{np.dtype(aval.dtype).name}{list(aval.shape)}"


def _paths(treedef: Any) -> list[str]:
    """Readable names of a treedef's leaves, e.g. "['a']" or "[1]"; "" for a lone leaf."""
    dummy = jax.tree_util.tree_unflatten(treedef, list(range(treedef.num_leaves)))
    with_path, _ = jax.tree_util.tree_flatten_with_path(dummy)
    return [jax.tree_util.keystr(path) for path, _ in with_path]


class CallSpec:
    """Static description of one call; see the module docstring."""

    def __init__(self, fn: ForeignFunction, in_tree: Any, static_leaves: tuple,
                 in_avals: tuple, statics: tuple, out_tree: Any, out_avals: tuple,
                 res_tree: Any, res_avals: tuple, batch_shape: tuple = (),
                 base: CallSpec | None = None):
        self.fn = fn
        self.in_tree = in_tree
        self.static_leaves = static_leaves          # ((leaf index, value), ...)
        self.in_avals = in_avals                    # dynamic leaves only
        self.statics = statics                      # sorted keyword items
        self.out_tree, self.out_avals = out_tree, out_avals
        self.res_tree, self.res_avals = res_tree, res_avals
        self.batch_shape = batch_shape
        self.base = base or self
        self.num_batch_dims = fn.batch_dims + (len(batch_shape) if fn.batch_dims else 0)
        self.diff_in = tuple(jnp.issubdtype(a.dtype, jnp.inexact) for a in in_avals)
        self.diff_out = tuple(jnp.issubdtype(a.dtype, jnp.inexact) for a in out_avals)
        self._callables: dict[Any, HostCallable] = {}
        self._batched: dict[int, CallSpec] = {}
        # Which positional argument each dynamic leaf belongs to.
        arg_of_leaf = []
        for i, child in enumerate(in_tree.children()):
            arg_of_leaf += [i] * child.num_leaves
        static_idx = {i for i, _ in static_leaves}
        self.arg_of_dyn = tuple(a for j, a in enumerate(arg_of_leaf) if j not in static_idx)
        self.n_args = len(in_tree.children())
        # Hot-path precomputation (a host call should cost a few microseconds).
        self._kwargs = dict(statics)
        self._static_map = dict(static_leaves)
        self._plain_args = not static_leaves and all(
            jax.tree_util.treedef_is_leaf(c) and c.num_leaves == 1
            for c in in_tree.children())  # an empty argument, e.g. (), is not a leaf

    # ---- identity: one object per distinct call (see ForeignFunction._spec) ----
    __hash__ = object.__hash__

    def __eq__(self, other: object) -> bool:
        return self is other

    def __repr__(self) -> str:
        ins = ",".join(_describe(a) for a in self.in_avals)
        outs = ",".join(_describe(a) for a in self.out_avals)
        batch = f" batch={list(self.batch_shape)}" if self.batch_shape else ""
        return f"{self.fn.__name__}[({ins})->({outs}){batch}]"

    @property
    def name(self) -> str:
        return self.fn.__name__

    @property
    def kwargs(self) -> dict:
        return self._kwargs

    @property
    def n_out(self) -> int:
        return len(self.out_avals)

    @property
    def all_out_avals(self) -> tuple:
        return self.out_avals + self.res_avals

    # ---- vectorized vmap: the same function on a leading batch axis ----
    def batched(self, size: int) -> CallSpec:
        """This call with every operand and result given a leading axis of `size`."""
        spec = self._batched.get(size)
        if spec is None:
            def add(avals):
                return tuple(jax.ShapeDtypeStruct((size, *a.shape), a.dtype) for a in avals)
            spec = CallSpec(self.fn, self.in_tree, self.static_leaves, add(self.in_avals),
                            self.statics, self.out_tree, add(self.out_avals), self.res_tree,
                            add(self.res_avals), (size, *self.batch_shape), self.base)
            self._batched[size] = spec
        return spec

    # ---- leaves <-> user pytrees ----
    def args(self, dyn_leaves: Sequence[Any]) -> tuple:
        """The positional arguments, rebuilt from dynamic leaves and static leaves."""
        if self._plain_args:
            return tuple(dyn_leaves)
        leaves: list[Any] = []
        dyn = iter(dyn_leaves)
        statics = self._static_map
        for j in range(self.in_tree.num_leaves):
            leaves.append(statics[j] if j in statics else next(dyn))
        return tuple(jax.tree_util.tree_unflatten(self.in_tree, leaves))

    def tangent_args(self, tangent_leaves: Sequence[Any | None]) -> tuple:
        """Per positional argument: None if all its tangents are symbolic zeros, else
        its pytree with None at the zero (and non-array) leaves."""
        statics = dict(self.static_leaves)
        dyn = iter(tangent_leaves)
        flat_index = 0
        result = []
        for child in self.in_tree.children():
            leaves = []
            for _ in range(child.num_leaves):
                leaves.append(None if flat_index in statics else next(dyn))
                flat_index += 1
            result.append(None if all(v is None for v in leaves)
                          else jax.tree_util.tree_unflatten(child, leaves))
        return tuple(result)

    def outputs(self, out_leaves: Sequence[Any]) -> tuple[Any, Any]:
        """(out, res) pytrees from the flat outputs (res is None without residuals)."""
        out = jax.tree_util.tree_unflatten(self.out_tree, list(out_leaves[:self.n_out]))
        if self.res_tree is None:
            return out, None
        return out, jax.tree_util.tree_unflatten(self.res_tree, list(out_leaves[self.n_out:]))

    # ---- checking what user code returns ----
    def flatten_checked(self, value: Any, treedef: Any, avals: Sequence[Any], what: str,
                        *, allow_none: bool, host: bool) -> list[Any]:
        """Flatten `value` to `treedef`'s leaves, checking structure, shapes and dtypes.

        `None` (whole value or a leaf) stands for zeros where `allow_none`.
        """
        if value is None and allow_none:
            return [self._zeros(a, host) for a in avals]
        if treedef.num_nodes == 1 and treedef.num_leaves == 1 \
                and not isinstance(value, (tuple, list, dict)):  # fast path: one array
            return [self._checked_leaf(value, avals[0], what, allow_none, host)]
        leaves, got = jax.tree_util.tree_flatten(value, is_leaf=_is_none)
        if got != treedef:
            raise ForeignCallError(
                f"jaxbridge: {what} of foreign function {self.name!r} has the wrong structure: "
                f"declared {treedef}, got {got}")
        checked = []
        for i, (leaf, aval) in enumerate(zip(leaves, avals)):
            try:
                checked.append(self._checked_leaf(leaf, aval, what, allow_none, host))
            except ForeignCallError:  # say which leaf (paths are only computed here)
                self._checked_leaf(leaf, aval, f"{what}{_paths(treedef)[i]}", allow_none, host)
                raise
        return checked

    def _zeros(self, aval: Any, host: bool) -> Any:
        return np.zeros(aval.shape, aval.dtype) if host else jnp.zeros(aval.shape, aval.dtype)

    def _checked_leaf(self, leaf: Any, aval: Any, label: str, allow_none: bool,
                      host: bool) -> Any:
        if host and type(leaf) is np.ndarray and leaf.dtype == aval.dtype \
                and leaf.shape == aval.shape:
            return leaf  # fast path
        if leaf is None:
            if allow_none:
                return self._zeros(aval, host)
            raise ForeignCallError(
                f"jaxbridge: {label} of foreign function {self.name!r} is None; declared "
                f"{_describe(aval)}")
        if isinstance(leaf, _PY_SCALARS):  # weakly typed, like in JAX
            leaf = np.asarray(leaf, dtype=aval.dtype) if host else jnp.asarray(leaf, aval.dtype)
        elif host:
            leaf = np.asarray(leaf)
        shape, dtype = tuple(np.shape(leaf)), np.dtype(leaf.dtype)
        if shape != tuple(aval.shape) or dtype != np.dtype(aval.dtype):
            weak = not host and getattr(getattr(leaf, "aval", None), "weak_type", False)
            if shape == tuple(aval.shape) and weak:
                return leaf.astype(aval.dtype)
            hint = ""
            if shape == tuple(aval.shape):
                hint = (f"; convert with .astype(np.{np.dtype(aval.dtype).name}) or declare "
                        f"{dtype.name}")
            raise ForeignCallError(
                f"jaxbridge: {label} of foreign function {self.name!r} has shape "
                f"{list(shape)} and dtype {dtype.name}; declared {_describe(aval)}{hint}")
        return leaf

    # ---- host runners (NumPy in, NumPy out) ----
    def _split_rule_operands(self, ins: Sequence[Any]) -> tuple[tuple, Any, Any, Sequence[Any]]:
        n_in, n_all = len(self.in_avals), len(self.all_out_avals)
        primals = self.args(ins[:n_in])
        out, res = self.outputs(ins[n_in:n_in + n_all])
        return primals, out, res, ins[n_in + n_all:]

    def run_forward(self, ins: Sequence[Any], host: bool = True) -> list[Any]:
        return self.check_forward(self.fn.fun(*self.args(ins), **self._kwargs), host)

    def fill_forward(self) -> Callable[[Sequence[Any], Sequence[Any]], None]:
        """The native-protocol forward (write into `outs`), with a fast path for the
        common case of one array argument list and one array result."""
        fun, kwargs, args = self.fn.fun, self._kwargs, self.args
        single = self.res_tree is None and self.out_tree.num_nodes == 1 \
            and self.out_tree.num_leaves == 1
        dtype = self.out_avals[0].dtype if single else None

        def fill(ins, outs):
            value = fun(*args(ins), **kwargs)
            if single and type(value) is np.ndarray and value.dtype == dtype \
                    and value.shape == outs[0].shape:  # == `shape` unless partitioned
                outs[0][...] = value
                return
            for out, checked in zip(outs, self.check_forward(value, True,
                                                             [o.shape for o in outs])):
                out[...] = checked

        return fill

    def check_forward(self, value: Any, host: bool = True,
                      shapes: Sequence[tuple] | None = None) -> list[Any]:
        out_avals, res_avals = self.out_avals, self.res_avals
        if shapes is not None and self.num_batch_dims:  # one shard of a partitioned call
            local = _local(self.all_out_avals, shapes)
            out_avals, res_avals = local[:self.n_out], local[self.n_out:]
        if self.res_tree is not None:
            if not (isinstance(value, tuple) and len(value) == 2):
                raise ForeignCallError(
                    f"jaxbridge: foreign function {self.name!r} declares residuals, so it must "
                    f"return a pair (output, residuals); got {type(value).__name__}")
            value, residuals = value
            return (self.flatten_checked(value, self.out_tree, out_avals, "output",
                                         allow_none=False, host=host)
                    + self.flatten_checked(residuals, self.res_tree, res_avals,
                                           "residual", allow_none=False, host=host))
        return self.flatten_checked(value, self.out_tree, out_avals, "output",
                                    allow_none=False, host=host)

    def _rule_call(self, rule: Callable, primals: tuple, out: Any, third: Any, res: Any) -> Any:
        if self.res_tree is None:
            return rule(primals, out, third, **self.kwargs)
        return rule(primals, out, third, res, **self.kwargs)

    def run_tangent(self, ins: Sequence[Any], nz: tuple, host: bool = True) -> list[Any]:
        """The user's JVP rule: operands (primals, outs, non-zero tangents) -> tangents of
        the differentiable outputs."""
        primals, out, res, tans = self._split_rule_operands(ins)
        tans = iter(tans)
        tangent_leaves = [next(tans) if z else None for z in nz]
        tangents = self.tangent_args(tangent_leaves)
        value = self._rule_call(self.fn.jvp_rule.fun, primals, out, tangents, res)
        out_avals = self.out_avals
        if host and self.num_batch_dims:  # one shard: the primal outputs give its shapes
            n_in = len(self.in_avals)
            out_avals = _local(out_avals, [np.shape(o) for o in ins[n_in:n_in + self.n_out]])
        leaves = self.flatten_checked(value, self.out_tree, out_avals, "tangent output",
                                      allow_none=True, host=host)
        return [t for t, d in zip(leaves, self.diff_out) if d]

    def run_cotangent(self, ins: Sequence[Any], nz: tuple, host: bool = True) -> list[Any]:
        """The user's VJP rule: operands (primals, outs, cotangents of the differentiable
        outputs) -> cotangents of the inputs marked in `nz`."""
        primals, out, res, cts = self._split_rule_operands(ins)
        cts = iter(cts)
        # Integer outputs have no cotangent: the rule sees None there.
        ct_leaves = [next(cts) if d else None for d in self.diff_out]
        ct = jax.tree_util.tree_unflatten(self.out_tree, ct_leaves)
        value = self._rule_call(self.fn.vjp_rule.fun, primals, out, ct, res)
        return self._cotangent_leaves(value, ins, nz, host)

    def fill_cotangent(self, nz: tuple) -> Callable[[Sequence[Any], Sequence[Any]], None]:
        """The native-protocol VJP rule (write into `outs`), with a fast path for the
        common case: plain array arguments, one array output, and a rule that returns
        NumPy arrays of the declared shapes and dtypes (anything else is checked)."""
        fast = self._plain_args and self.res_tree is None and self.n_out == 1 \
            and self.out_tree.num_nodes == 1 and self.diff_out[0] and not self.num_batch_dims
        rule, kwargs, n_in = self.fn.vjp_rule.fun, self._kwargs, len(self.in_avals)
        live = tuple(i for i, z in enumerate(nz) if z)

        def fill(ins, outs):
            if not fast:
                leaves = self.run_cotangent(ins, nz)
            else:
                value = rule(tuple(ins[:n_in]), ins[n_in], ins[n_in + 1], **kwargs)
                if type(value) is tuple and len(value) == n_in:
                    picked = [value[i] for i in live]
                    if all(type(v) is np.ndarray and v.dtype == o.dtype and v.shape == o.shape
                           for v, o in zip(picked, outs)):
                        for o, v in zip(outs, picked):
                            o[...] = v
                        return
                leaves = self._cotangent_leaves(value, ins, nz, True)
            for o, v in zip(outs, leaves):
                o[...] = v

        return fill

    def _cotangent_leaves(self, value: Any, ins: Sequence[Any], nz: tuple,
                          host: bool) -> list[Any]:
        """Check a VJP rule's result; flatten it to the cotangents marked in `nz`."""
        if not isinstance(value, (tuple, list)) or len(value) != self.n_args:
            got = f"{type(value).__name__} of length {len(value)}" if isinstance(
                value, (tuple, list)) else type(value).__name__
            raise ForeignCallError(
                f"jaxbridge: the vjp rule of foreign function {self.name!r} must return a tuple "
                f"with one cotangent (or None) per positional argument ({self.n_args}); "
                f"got {got}")
        leaves: list[Any] = []
        in_avals = self.in_avals
        if host and self.num_batch_dims:  # one shard: the primal inputs give its shapes
            in_avals = _local(in_avals, [np.shape(x) for x in ins[:len(in_avals)]])
        dyn_avals = iter(in_avals)
        statics = dict(self.static_leaves)
        flat_index = 0
        for i, (child, ct_i) in enumerate(zip(self.in_tree.children(), value)):
            child_dyn = [j for j in range(flat_index, flat_index + child.num_leaves)
                         if j not in statics]
            avals = [next(dyn_avals) for _ in child_dyn]
            if ct_i is None:
                leaves += [self._zeros(a, host) for a in avals]
            elif child.num_leaves == 1 and _is_array_like(ct_i):
                # One-leaf custom node (e.g. nnx.Param): a bare array is its cotangent,
                # as with jax.custom_vjp.
                aval = avals[0] if avals else None
                if aval is not None and jnp.issubdtype(aval.dtype, jnp.inexact):
                    leaves.append(self._checked_leaf(ct_i, aval, f"cotangent {i}", True, host))
                else:
                    leaves += [None] * len(avals)
            else:
                try:
                    child_leaves = child.flatten_up_to(ct_i)
                except (ValueError, TypeError) as exc:
                    raise ForeignCallError(
                        f"jaxbridge: cotangent {i} from the vjp rule of foreign function "
                        f"{self.name!r} has the wrong structure: expected {child}, got "
                        f"{jax.tree_util.tree_structure(ct_i)} ({exc})") from None
                dyn_pos = 0
                for k, leaf in enumerate(child_leaves):
                    if flat_index + k in statics:
                        continue
                    aval = avals[dyn_pos]
                    dyn_pos += 1
                    if not jnp.issubdtype(aval.dtype, jnp.inexact):
                        leaves.append(None)  # integer input: no cotangent
                        continue
                    try:
                        leaves.append(self._checked_leaf(leaf, aval, f"cotangent {i}", True,
                                                         host))
                    except ForeignCallError:  # name the leaf (paths only computed here)
                        path = _paths(child)[k]
                        self._checked_leaf(leaf, aval, f"cotangent {i}{path}", True, host)
                        raise
            flat_index += child.num_leaves
        return [c for c, z in zip(leaves, nz) if z]

    # ---- host callables, one per (rule, nz) and cached ----
    def host_callable(self, kind: str, nz: tuple = ()) -> HostCallable:
        key = (kind, nz)
        target = self._callables.get(key)
        if target is None:
            fill = None
            if kind == "forward":
                run, avals, what = self.run_forward, self.all_out_avals, "forward call"
                fill = self.fill_forward()
            elif kind == "jvp":
                run = lambda ins: self.run_tangent(ins, nz)  # noqa: E731
                avals = tuple(a for a, d in zip(self.out_avals, self.diff_out) if d)
                what = "jvp rule"
            else:
                run = lambda ins: self.run_cotangent(ins, nz)  # noqa: E731
                avals = tuple(a for a, z in zip(self.in_avals, nz) if z)
                what = "vjp rule"
                fill = self.fill_cotangent(nz)
            target = HostCallable(run, avals, self.name, what, fill)
            self._callables[key] = target
        return target

    # ---- traced rules (JAX in, JAX out): vmapped over any batch axes ----
    def traced(self, kind: str, nz: tuple) -> Callable[..., list[Any]]:
        """The user's JAX-written rule as a function of flat operands."""
        base = self.base
        if kind == "jvp":
            def rule(*ops):
                return base.run_tangent(ops, nz, host=False)
        else:
            def rule(*ops):
                return base.run_cotangent(ops, nz, host=False)
        for _ in self.batch_shape:
            rule = jax.vmap(rule)
        return rule
