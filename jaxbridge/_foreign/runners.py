"""Calling the user's code -- the function, its JVP, VJP or transpose rule --
and checking what it returns.

Host runners work on NumPy arrays and write into the output buffers they are given
(`filler`); traced runners (rules with ``kind="jax"``) work on JAX values (`run_rule`).
`loop_leading` runs a fill once per index of leading batch dimensions.
Every value a user returns is checked against what was declared -- structure, shape
and dtype -- and a mismatch raises `ResultMismatchError` naming the function, the value
and both types. Nothing is cast unless the function was declared with ``cast=True``,
except Python and NumPy scalars, which follow JAX's weak typing: one whose value
converts exactly takes the declared dtype (``42`` where int32 is declared), a lossy one
(``3.7`` where int32 is declared) is an error (see `jaxbridge._core.scalars`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .._core.arrays import PY_SCALARS, is_none, leaf_paths, local_structs
from .._core.checks import is_differentiable
from .._core.scalars import convert_scalar, is_scalar
from ..errors import ForeignCallError, ResultMismatchError, describe
from .definition import CallLayout, Rule

__all__ = ["filler", "run_rule"]

# The pair's roles (forward / jvp / vjp) in messages, with the registering method.
WHAT = {"forward": "forward call", "jvp": "JVP rule (defjvp)", "vjp": "VJP rule (defvjp)"}


def _what(sig: CallLayout, role: str) -> str:
    if sig.defn.linear:
        return {"forward": "forward call", "jvp": "forward call (on tangents)",
                "vjp": "transpose rule (deftranspose)"}[role]
    return WHAT[role]


# ---------------------------------------------------------------- checking values
def _zeros(aval: Any, host: bool) -> Any:
    return np.zeros(aval.shape, aval.dtype) if host else jnp.zeros(aval.shape, aval.dtype)


def _mismatch(sig: CallLayout, label: str, problem: str, aval: Any, shape: tuple = (),
              dtype: Any = None, detail: str = "") -> ResultMismatchError:
    declared = describe(aval)
    if problem == "none":
        received = "None"
        message = (f"jaxbridge: {label} of foreign function {sig.name!r} is None; declared "
                   f"{declared}")
    else:
        received = f"{np.dtype(dtype).name}[{', '.join(str(d) for d in shape)}]"
        message = (f"jaxbridge: {label} of foreign function {sig.name!r} has shape "
                   f"{list(shape)} and dtype {np.dtype(dtype).name}; declared {declared}{detail}")
    return ResultMismatchError(message, function=sig.name, what=label, problem=problem,
                               declared=declared, received=received)


def check_leaf(sig: CallLayout, leaf: Any, aval: Any, label: str, *, allow_none: bool,
               host: bool) -> Any:
    """`leaf` if it is exactly `aval` (None -> zeros where allowed); else raise."""
    if host and type(leaf) is np.ndarray and leaf.dtype == aval.dtype \
            and leaf.shape == aval.shape:
        return leaf  # fast path
    if leaf is None:
        if allow_none:
            return _zeros(aval, host)
        raise _mismatch(sig, label, "none", aval)
    want_shape, want_dtype = tuple(aval.shape), np.dtype(aval.dtype)
    if is_scalar(leaf) and not want_shape and not sig.defn.cast:
        # JAX's weak typing: a scalar that converts exactly takes the declared dtype.
        try:
            exact = convert_scalar(leaf, want_dtype)
        except ValueError as why:
            raise _mismatch(sig, label, "dtype", aval, (), np.asarray(leaf).dtype,
                            f": {why}. Return a value {want_dtype.name} holds, or declare "
                            f"jb.foreign(..., cast=True) to convert anyway") from None
        return exact if host else jnp.asarray(exact)
    if host or isinstance(leaf, PY_SCALARS):
        leaf = np.asarray(leaf)  # a Python or NumPy scalar is a 0-d array of its dtype
    shape, dtype = tuple(np.shape(leaf)), np.dtype(leaf.dtype)
    if shape == want_shape and dtype == want_dtype:
        return leaf
    weak = not host and getattr(getattr(leaf, "aval", None), "weak_type", False)
    if shape == want_shape and (weak or sig.defn.cast):
        return leaf.astype(want_dtype)
    if shape != want_shape:
        raise _mismatch(sig, label, "shape", aval, shape, dtype)
    hint = (f"; convert with .astype(np.{want_dtype.name}), declare {dtype.name}, or "
            f"declare jb.foreign(..., cast=True)")
    raise _mismatch(sig, label, "dtype", aval, shape, dtype, hint)


def flatten_checked(sig: CallLayout, value: Any, treedef: Any, avals: Sequence[Any],
                    what: str, *, allow_none: bool, host: bool) -> list[Any]:
    """Flatten `value` to `treedef`'s leaves, checking structure, shapes and dtypes.

    `None` (the whole value or a leaf) stands for zeros where `allow_none`.
    """
    if value is None and allow_none:
        return [_zeros(a, host) for a in avals]
    if treedef.num_nodes == 1 and treedef.num_leaves == 1 \
            and not isinstance(value, (tuple, list, dict)):  # fast path: one array
        return [check_leaf(sig, value, avals[0], what, allow_none=allow_none, host=host)]
    leaves, got = jax.tree_util.tree_flatten(value, is_leaf=is_none)
    if got != treedef:
        raise ResultMismatchError(
            f"jaxbridge: {what} of foreign function {sig.name!r} has the wrong structure: "
            f"declared {treedef}, got {got}", function=sig.name, what=what,
            problem="structure", declared=str(treedef), received=str(got))
    checked = []
    for i, (leaf, aval) in enumerate(zip(leaves, avals)):
        try:
            checked.append(check_leaf(sig, leaf, aval, what, allow_none=allow_none, host=host))
        except ResultMismatchError:  # say which leaf (paths are only computed here)
            check_leaf(sig, leaf, aval, f"{what}{leaf_paths(treedef)[i]}",
                       allow_none=allow_none, host=host)
            raise
    return checked


def cotangent_leaves(sig: CallLayout, value: Any, in_avals: Sequence[Any], nz: tuple,
                     host: bool, what: str) -> list[Any]:
    """Check a VJP (or transpose) rule's result -- one cotangent per positional
    argument -- and flatten it to the cotangents of the inputs marked in `nz`."""
    if not isinstance(value, (tuple, list)) or len(value) != sig.n_args:
        got = f"{type(value).__name__} of length {len(value)}" if isinstance(
            value, (tuple, list)) else type(value).__name__
        raise ResultMismatchError(
            f"jaxbridge: the {what} of foreign function {sig.name!r} must return a tuple "
            f"with one cotangent (or None) per positional argument ({sig.n_args}); got {got}",
            function=sig.name, what=what, problem="count",
            declared=f"tuple of {sig.n_args}", received=got)
    leaves: list[Any] = []
    dyn_avals = iter(in_avals)
    flat_index = 0
    for i, (child, ct_i) in enumerate(zip(sig.in_tree.children(), value)):
        child_dyn = [j for j in range(flat_index, flat_index + child.num_leaves)
                     if j not in sig.static_map]
        avals = [next(dyn_avals) for _ in child_dyn]
        if ct_i is None:
            leaves += [_zeros(a, host) for a in avals]
        elif child.num_leaves == 1 and _is_array_like(ct_i):
            # One-leaf custom node (e.g. nnx.Param): a bare array is its cotangent,
            # as with jax.custom_vjp.
            aval = avals[0] if avals else None
            if aval is not None and is_differentiable(aval.dtype):
                leaves.append(check_leaf(sig, ct_i, aval, f"cotangent {i}", allow_none=True,
                                         host=host))
            else:
                leaves += [None] * len(avals)
        else:
            try:
                child_leaves = child.flatten_up_to(ct_i)
            except (ValueError, TypeError) as exc:
                got = jax.tree_util.tree_structure(ct_i)
                raise ResultMismatchError(
                    f"jaxbridge: cotangent {i} from the {what} of foreign function "
                    f"{sig.name!r} has the wrong structure: expected {child}, got {got} "
                    f"({exc})", function=sig.name, what=f"cotangent {i}",
                    problem="structure", declared=str(child), received=str(got)) from None
            dyn_pos = 0
            for k, leaf in enumerate(child_leaves):
                if flat_index + k in sig.static_map:
                    continue
                aval = avals[dyn_pos]
                dyn_pos += 1
                if not is_differentiable(aval.dtype):
                    leaves.append(None)  # integer input: no cotangent
                    continue
                try:
                    leaves.append(check_leaf(sig, leaf, aval, f"cotangent {i}",
                                             allow_none=True, host=host))
                except ResultMismatchError:  # name the leaf (paths only computed here)
                    check_leaf(sig, leaf, aval, f"cotangent {i}{leaf_paths(child)[k]}",
                               allow_none=True, host=host)
                    raise
        flat_index += child.num_leaves
    return [c for c, z in zip(leaves, nz) if z]


def _is_array_like(x: Any) -> bool:
    return isinstance(x, (np.ndarray, np.generic, jax.Array, *PY_SCALARS))


# ---------------------------------------------------------------- running rules
def _call(sig: CallLayout, fun: Callable, args: tuple, res: Any, **extra: Any) -> Any:
    if sig.res_tree is None:
        return fun(*args, **extra, **sig.kwargs)
    return fun(*args, res, **extra, **sig.kwargs)


def _split(sig: CallLayout, ins: Sequence[Any]) -> tuple[tuple, Any, Any, Sequence[Any]]:
    """(primals, out, res, linear operands) of a non-linear rule's operands."""
    n_in, n_all = len(sig.in_avals), len(sig.out_avals)
    primals = sig.args(ins[:n_in])
    out, res = sig.outputs(ins[n_in:n_in + n_all])
    return primals, out, res, ins[n_in + n_all:]


def _pick(avals: Sequence[Any], mask: Sequence[bool], shapes: Sequence[tuple] | None) -> tuple:
    """`avals`, with the entries selected by `mask` given `shapes` (one shard's) if any."""
    if shapes is None:
        return tuple(avals)
    each = iter(shapes)
    return tuple(local_structs([a], [next(each)])[0] if m else a
                 for a, m in zip(avals, mask))


def run_jvp(sig: CallLayout, rule: Rule, ins: Sequence[Any], nz: tuple, host: bool,
                out_shapes: Sequence[tuple] | None = None) -> list[Any]:
    """Operands -> tangents of the differentiable outputs (the jvp role)."""
    avals = _pick(sig.primary_avals, sig.diff_out, out_shapes)
    if sig.defn.linear:  # the function itself, on the tangents
        value = rule.fun(*sig.args(ins), **sig.kwargs)
        leaves = flatten_checked(sig, value, sig.out_tree, avals, "tangent output",
                                 allow_none=False, host=host)
    else:
        primals, out, res, tans = _split(sig, ins)
        value = _call(sig, rule.fun, (primals, out, _input_trees(sig, tans, nz)), res)
        leaves = flatten_checked(sig, value, sig.out_tree, avals, "tangent output",
                                 allow_none=True, host=host)
    return [t for t, d in zip(leaves, sig.diff_out) if d]


def run_vjp(sig: CallLayout, rule: Rule, ins: Sequence[Any], nz: tuple, host: bool,
                out_shapes: Sequence[tuple] | None = None) -> list[Any]:
    """Operands -> cotangents of the inputs marked in `nz` (the vjp role)."""
    what = _what(sig, "vjp")
    in_avals = _pick(sig.in_avals, nz, out_shapes)
    if sig.defn.linear:
        ct = _output_tree(sig, ins)
        value = rule.fun(ct, **sig.kwargs)
    else:
        primals, out, res, cts = _split(sig, ins)
        ct = _output_tree(sig, cts)  # integer outputs have no cotangent: None there
        extra = {"wanted": wanted_trees(sig, nz)} if rule.wanted else {}
        if extra and "wanted" in sig.kwargs:
            raise TypeError(f"jaxbridge: foreign function {sig.name!r} has a keyword "
                            f"argument 'wanted', which its VJP rule (wanted=True) is given "
                            f"by jaxbridge; rename the argument")
        value = _call(sig, rule.fun, (primals, out, ct), res, **extra)
    return cotangent_leaves(sig, value, in_avals, nz, host, what)


def wanted_trees(sig: CallLayout, nz: tuple) -> tuple:
    """Per positional argument, its pytree of bools: True at the inputs whose cotangent
    is used (marked in `nz`), False at the others and at static leaves (a VJP rule's
    ``wanted=``; None in the rule's result is enough there)."""
    return sig.per_argument([bool(z) for z in nz], static=False, collapse=False)


def _input_trees(sig: CallLayout, leaves: Sequence[Any], nz: tuple) -> tuple:
    """Per positional argument, its pytree with `leaves` at the inputs marked in `nz`
    (None elsewhere, and None for an argument with none marked)."""
    each = iter(leaves)
    return sig.per_argument([next(each) if z else None for z in nz])


def _output_tree(sig: CallLayout, leaves: Sequence[Any]) -> Any:
    """The output's pytree with `leaves` at its differentiable leaves, None elsewhere."""
    each = iter(leaves)
    return jax.tree_util.tree_unflatten(
        sig.out_tree, [next(each) if d else None for d in sig.diff_out])


def run_rule(sig: CallLayout, role: str, rule: Rule, ops: Sequence[Any], nz: tuple,
             host: bool) -> list[Any]:
    """A JVP or VJP rule on flat operands (traced rules call this with JAX values)."""
    run = run_jvp if role == "jvp" else run_vjp
    return run(sig, rule, ops, nz, host)


def check_forward(sig: CallLayout, value: Any, avals: Sequence[Any]) -> list[Any]:
    """The forward call's result (a pair with residuals) as checked leaves."""
    primary, residual = avals[:sig.n_out], avals[sig.n_out:]
    if sig.res_tree is not None:
        if not (isinstance(value, tuple) and len(value) == 2):
            raise ResultMismatchError(
                f"jaxbridge: foreign function {sig.name!r} declares residuals, so it must "
                f"return a pair (output, residuals); got {type(value).__name__}",
                function=sig.name, what="output", problem="structure",
                declared="(output, residuals)", received=type(value).__name__)
        value, residuals = value
        return (flatten_checked(sig, value, sig.out_tree, primary, "output",
                                allow_none=False, host=True)
                + flatten_checked(sig, residuals, sig.res_tree, residual, "residual",
                                  allow_none=False, host=True))
    return flatten_checked(sig, value, sig.out_tree, primary, "output", allow_none=False,
                           host=True)


def _returned_none(sig: CallLayout, value: Any, what: str) -> None:
    if value is not None:
        raise ForeignCallError(
            f"jaxbridge: the {what} of foreign function {sig.name!r} writes its results "
            f"into `out=` (declared with out=True), so it must return None; it returned "
            f"{type(value).__name__}")


# ---------------------------------------------------------------- host fillers
def filler(sig: CallLayout, role: str, rule: Rule | None, nz: tuple
           ) -> tuple[Callable[[tuple, tuple], None], tuple, str]:
    """(fill(inputs, outputs), output avals, description) of the host computation of
    `role`: the native trampoline's protocol (see jaxbridge/_foreign/hostcall.py)."""
    what = _what(sig, role)
    if role == "forward":
        return _forward_filler(sig), sig.out_avals, what
    if rule is None:
        raise sig.missing(role)
    if role == "jvp":
        avals = tuple(a for a, d in zip(sig.primary_avals, sig.diff_out) if d)
        if rule.out:
            return _out_jvp_filler(sig, rule, nz), avals, what
        run = run_jvp
    else:
        avals = tuple(a for a, z in zip(sig.in_avals, nz) if z)
        if rule.out:
            return _out_vjp_filler(sig, rule, nz), avals, what
        if not sig.defn.linear:
            return _vjp_filler(sig, rule, nz), avals, what
        run = run_vjp

    def fill(ins: tuple, outs: tuple) -> None:
        shapes = [o.shape for o in outs] if sig.num_batch_dims else None
        for o, v in zip(outs, run(sig, rule, ins, nz, True, shapes)):
            o[...] = v

    return fill, avals, what


# How the native trampoline may call a host function without its `fill` wrapper
# (csrc/hostcall/direct_call.cc): fill.direct = (fun, kind, finish), plus
# (n_in, live) for the VJP kinds (kDirectAdjoint* there).
DIRECT_RETURNS = 1  # fun(*ins) returns the one result
DIRECT_OUT = 2      # fun(*ins, out=outs[0]) returns None
DIRECT_VJP = 3      # a VJP rule: fun(primals, out, ct) returns one cotangent per input
DIRECT_VJP_OUT = 4  # a VJP rule with out=True: fun(primals, out, ct, out=...) -> None


def _direct(fill: Callable[[tuple, tuple], None], fun: Callable, kind: int,
            finish: Callable[[Any, tuple], None], *vjp_layout: Any
            ) -> Callable[[tuple, tuple], None]:
    """`fill`, marked as callable directly: the trampoline calls `fun` on the inputs itself
    and hands any result it does not take to `finish(value, outputs)` (which checks and
    fills, or raises), exactly what `fill` would have done."""
    fill.direct = (fun, kind, finish, *vjp_layout)  # type: ignore[attr-defined]
    return fill


def _forward_filler(sig: CallLayout) -> Callable[[tuple, tuple], None]:
    """The forward call, with a fast path for one array result."""
    fun, kwargs, args = sig.defn.fun, sig.kwargs, sig.args
    single = sig.res_tree is None and sig.out_tree.num_nodes == 1 \
        and sig.out_tree.num_leaves == 1
    direct = single and sig.plain_args and not kwargs
    if sig.defn.out:
        def not_none(value: Any, outs: tuple) -> None:
            _returned_none(sig, value, "forward call")

        if direct:
            def fill_plain(ins: tuple, outs: tuple) -> None:  # the per-call floor
                value = fun(*ins, out=outs[0])
                if value is not None:
                    not_none(value, outs)

            return _direct(fill_plain, fun, DIRECT_OUT, not_none)

        def fill_out(ins: tuple, outs: tuple) -> None:
            if single:  # fast path: the lone output buffer is `out` itself
                target = outs[0]
            else:
                out, res = sig.outputs(outs)
                target = out if sig.res_tree is None else (out, res)
            value = fun(*args(ins), out=target, **kwargs)
            if value is not None:
                not_none(value, outs)

        return fill_out
    dtype = sig.out_avals[0].dtype if single else None

    def finish(value: Any, outs: tuple) -> None:
        if single and type(value) is np.ndarray and value.dtype == dtype \
                and value.shape == outs[0].shape:  # == the declared shape unless sharded
            outs[0][...] = value
            return
        avals = local_structs(sig.out_avals, [o.shape for o in outs])
        for out, checked in zip(outs, check_forward(sig, value, avals)):
            out[...] = checked

    def fill(ins: tuple, outs: tuple) -> None:
        finish(fun(*args(ins), **kwargs), outs)

    return _direct(fill, fun, DIRECT_RETURNS, finish) if direct else fill


def _vjp_filler(sig: CallLayout, rule: Rule, nz: tuple) -> Callable[[tuple, tuple], None]:
    """The VJP rule, with a fast path for the common case: plain array arguments, one
    array output, and a rule that returns NumPy arrays of the declared shapes and dtypes
    (anything else is checked). Without keyword arguments the trampoline calls the rule
    itself (DIRECT_VJP)."""
    fast = sig.plain_args and sig.res_tree is None and sig.n_out == 1 \
        and sig.out_tree.num_nodes == 1 and sig.diff_out[0] and not sig.num_batch_dims \
        and not rule.wanted
    fun, kwargs, n_in = rule.fun, sig.kwargs, len(sig.in_avals)
    live = tuple(i for i, z in enumerate(nz) if z)

    def finish(value: Any, outs: tuple) -> None:  # the fast path's result, checked
        if type(value) is tuple and len(value) == n_in:
            picked = [value[i] for i in live]
            if all(type(v) is np.ndarray and v.dtype == o.dtype and v.shape == o.shape
                   for v, o in zip(picked, outs)):
                for o, v in zip(outs, picked):
                    o[...] = v
                return
        leaves = cotangent_leaves(sig, value, sig.in_avals, nz, True, WHAT["vjp"])
        for o, v in zip(outs, leaves):
            o[...] = v

    def fill(ins: tuple, outs: tuple) -> None:
        if fast:
            finish(fun(tuple(ins[:n_in]), ins[n_in], ins[n_in + 1], **kwargs), outs)
            return
        shapes = [o.shape for o in outs] if sig.num_batch_dims else None
        for o, v in zip(outs, run_vjp(sig, rule, ins, nz, True, shapes)):
            o[...] = v

    return _direct(fill, fun, DIRECT_VJP, finish, n_in, live) if fast and not kwargs \
        else fill


def _out_jvp_filler(sig: CallLayout, rule: Rule, nz: tuple
                            ) -> Callable[[tuple, tuple], None]:
    def fill(ins: tuple, outs: tuple) -> None:
        target = _output_tree(sig, outs)
        if sig.defn.linear:
            value = rule.fun(*sig.args(ins), out=target, **sig.kwargs)
        else:
            primals, out, res, tans = _split(sig, ins)
            value = _call(sig, rule.fun, (primals, out, _input_trees(sig, tans, nz)), res,
                          out=target)
        _returned_none(sig, value, _what(sig, "jvp"))

    return fill


def _out_vjp_filler(sig: CallLayout, rule: Rule, nz: tuple
                            ) -> Callable[[tuple, tuple], None]:
    # Fast path (as in _vjp_filler): plain array arguments, one array output.
    fast = sig.plain_args and sig.res_tree is None and sig.n_out == 1 \
        and sig.out_tree.num_nodes == 1 and sig.diff_out[0] and not sig.defn.linear
    fun, kwargs, n_in = rule.fun, sig.kwargs, len(sig.in_avals)
    where = tuple(sum(nz[:i]) if z else -1 for i, z in enumerate(nz))  # -> index in outs

    def not_none(value: Any, outs: tuple) -> None:
        _returned_none(sig, value, _what(sig, "vjp"))

    def fill(ins: tuple, outs: tuple) -> None:
        if fast:
            target = tuple(outs[j] if j >= 0 else None for j in where)
            value = fun(ins[:n_in], ins[n_in], ins[n_in + 1], out=target, **kwargs)
            if value is not None:
                not_none(value, outs)
            return
        target = _input_trees(sig, outs, nz)
        if sig.defn.linear:
            value = rule.fun(_output_tree(sig, ins), out=target, **sig.kwargs)
        else:
            primals, out, res, cts = _split(sig, ins)
            value = _call(sig, rule.fun, (primals, out, _output_tree(sig, cts)), res,
                          out=target)
        _returned_none(sig, value, _what(sig, "vjp"))

    if fast and not kwargs:  # the trampoline calls the rule itself (DIRECT_VJP_OUT)
        live = tuple(i for i, j in enumerate(where) if j >= 0)
        return _direct(fill, fun, DIRECT_VJP_OUT, not_none, n_in, live)
    return fill


def loop_leading(fill: Callable[[tuple, tuple], Any], n: int) -> Callable[[tuple, tuple], None]:
    """`fill` run once per index of the `n` leading dimensions that every input and
    output has (a vmapped batch_dims function: one host call, the loop on the host)."""
    def looped(ins: tuple, outs: tuple) -> None:
        lead = (outs[0] if outs else ins[0]).shape[:n]  # this shard's share
        for idx in np.ndindex(*lead):
            fill(tuple(a[idx] for a in ins), tuple(o[idx] for o in outs))

    return looped
