"""The flat view of one call `f(*args, **static)` that every check works on.

The positional arguments are flattened to leaves; array leaves are "dynamic"
(inexact ones are differentiated, integer and boolean ones are held fixed), other
leaves are static. Outputs are flattened the same way. `FlatCall` holds both views
and `f` as functions of the dynamic leaves: the call itself, its inexact outputs,
and their VJP / JVP (whole, or per input leaf / output leaf), each also jitted once.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

_PY_NUMBERS = (bool, int, float, complex)


def is_array(x: Any) -> bool:
    return isinstance(x, (jax.Array, np.ndarray, np.generic, *_PY_NUMBERS)) or \
        hasattr(x, "__jax_array__")


def inexact(dtype: Any) -> bool:
    return bool(jnp.issubdtype(dtype, jnp.inexact))


def is_complex(dtype: Any) -> bool:
    return bool(jnp.issubdtype(dtype, jnp.complexfloating))


def function_name(f: Any) -> str:
    return getattr(f, "__name__", None) or type(f).__name__


def _arg_names(f: Any, n: int) -> list[str]:
    declared = getattr(f, "arg_names", None)  # e.g. a kernel's arg_names=
    if isinstance(declared, (tuple, list)) and len(declared) >= n and \
            all(isinstance(a, str) for a in declared):
        return list(declared[:n])
    try:
        params = list(inspect.signature(f).parameters.values())
    except (TypeError, ValueError):
        params = []
    names = []
    for i in range(n):
        if i < len(params) and params[i].kind in (inspect.Parameter.POSITIONAL_ONLY,
                                                  inspect.Parameter.POSITIONAL_OR_KEYWORD):
            names.append(params[i].name)
        elif n == 1:
            names.append("x")
        else:
            names.append(f"args[{i}]")
    return names


@dataclasses.dataclass(frozen=True, eq=False)
class FlatCall:
    """`f(*args, **static)` as functions of its dynamic leaves; see the module docstring.

    Attributes (indices: `dyn` into the dynamic leaves, `diff` and `ints` into `dyn`,
    `dout` into `outs`):
      leaves: every input leaf (arrays as jax arrays); dyn_pos: where the dynamic ones are.
      dyn: the dynamic leaves; labels / arg_of: each one's path and positional argument.
      diff / ints: the inexact / integer-or-boolean dynamic leaves.
      outs, out_labels, out_tree: the outputs of the eager call; dout: the inexact ones.
      snapshot: copies of `dyn` taken before any call (for ``inputs_unchanged``).
    """

    f: Callable[..., Any]
    static: dict
    name: str
    treedef: Any
    leaves: tuple
    dyn_pos: tuple[int, ...]
    labels: tuple[str, ...]
    arg_of: tuple[int, ...]
    arg_names: tuple[str, ...]
    n_args: int
    dyn: list
    diff: tuple[int, ...]
    ints: tuple[int, ...]
    snapshot: tuple
    outs: tuple = ()
    out_labels: tuple[str, ...] = ()
    out_tree: Any = None
    dout: tuple[int, ...] = ()

    @classmethod
    def inputs(cls, f: Callable[..., Any], args: tuple, static: dict) -> FlatCall:
        """The flat view of the inputs (no call made yet)."""
        path_leaves, treedef = jax.tree_util.tree_flatten_with_path(tuple(args))
        names = _arg_names(f, len(args))
        leaves, dyn_pos, labels, arg_of = [], [], [], []
        for k, (path, leaf) in enumerate(path_leaves):
            if is_array(leaf):
                leaf = jnp.asarray(leaf)
                dyn_pos.append(k)
                labels.append(names[path[0].idx] + jax.tree_util.keystr(path[1:]))
                arg_of.append(path[0].idx)
            leaves.append(leaf)
        dyn = [leaves[k] for k in dyn_pos]
        return cls(
            f=f, static=static, name=function_name(f), treedef=treedef, leaves=tuple(leaves),
            dyn_pos=tuple(dyn_pos), labels=tuple(labels), arg_of=tuple(arg_of),
            arg_names=tuple(names), n_args=len(args), dyn=dyn,
            diff=tuple(i for i, x in enumerate(dyn) if inexact(x.dtype)),
            ints=tuple(i for i, x in enumerate(dyn) if not inexact(x.dtype)),
            snapshot=tuple(np.array(x, copy=True) for x in dyn))

    def called(self) -> FlatCall:
        """This view with the outputs of one eager call (which may raise)."""
        out = self.f(*jax.tree_util.tree_unflatten(self.treedef, list(self.leaves)),
                     **self.static)
        paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(out)[0]]
        outs = tuple(jnp.asarray(o) for o in jax.tree_util.tree_leaves(out))
        return dataclasses.replace(
            self, outs=outs, out_labels=tuple("out" + p for p in paths),
            out_tree=jax.tree_util.tree_structure(out),
            dout=tuple(o for o, x in enumerate(outs) if inexact(x.dtype)))

    # ------------------------------------------------------------ labels
    def jlabel(self, j: int) -> str:
        """The label of inexact input leaf `j`."""
        return self.labels[self.diff[j]]

    def olabel(self, o: int) -> str:
        """The label of inexact output leaf `o`."""
        return self.out_labels[self.dout[o]]

    def jlabels(self) -> list[str]:
        return [self.jlabel(j) for j in range(len(self.diff))]

    def olabels(self) -> list[str]:
        return [self.olabel(o) for o in range(len(self.dout))]

    # ------------------------------------------------------------ flat functions
    def call_dyn(self, dyn: Sequence[Any]) -> list[Any]:
        """All output leaves of `f` at dynamic leaves `dyn`."""
        leaves = list(self.leaves)
        for k, x in zip(self.dyn_pos, dyn):
            leaves[k] = x
        args = jax.tree_util.tree_unflatten(self.treedef, leaves)
        return jax.tree_util.tree_leaves(self.f(*args, **self.static))

    def diffout(self, dyn: Sequence[Any]) -> list[Any]:
        """The inexact output leaves."""
        outs = self.call_dyn(dyn)
        return [outs[o] for o in self.dout]

    def merge(self, diff_leaves: Sequence[Any], dyn: Sequence[Any]) -> list[Any]:
        """`dyn` with its inexact leaves replaced by `diff_leaves`."""
        full = list(dyn)
        for i, x in zip(self.diff, diff_leaves):
            full[i] = x
        return full

    def vjp_all(self, dyn: Sequence[Any], cts: Sequence[Any]) -> list[Any]:
        """Cotangents of the inexact inputs for cotangents `cts` of the inexact outputs."""
        _, pull = jax.vjp(lambda d: self.diffout(self.merge(d, dyn)),
                          [dyn[i] for i in self.diff])
        return pull(list(cts))[0]

    def jvp_all(self, dyn: Sequence[Any], tans: Sequence[Any]) -> list[Any]:
        """Tangents of the inexact outputs for tangents `tans` of the inexact inputs."""
        return jax.jvp(lambda d: self.diffout(self.merge(d, dyn)),
                       ([dyn[i] for i in self.diff],), (list(tans),))[1]

    def jvp_leaf(self, j: int, dyn: Sequence[Any], t: Any) -> list[Any]:
        """JVP with a tangent on inexact input leaf `j` only (the others: symbolic zeros)."""
        def g(x):
            full = list(dyn)
            full[self.diff[j]] = x
            return self.diffout(full)
        return jax.jvp(g, (dyn[self.diff[j]],), (t,))[1]

    def vjp_out(self, o: int, dyn: Sequence[Any], ct: Any) -> list[Any]:
        """VJP of inexact output `o` alone (the others' cotangents: symbolic zeros)."""
        _, pull = jax.vjp(lambda d: self.diffout(self.merge(d, dyn))[o],
                          [dyn[i] for i in self.diff])
        return pull(ct)[0]

    @functools.cached_property
    def jitted(self) -> dict[str, Callable[..., Any]]:
        """The flat functions under ``jax.jit``, made once per call view."""
        return {
            "f": jax.jit(self.call_dyn),
            "diffout": jax.jit(self.diffout),
            "vjp_all": jax.jit(self.vjp_all),
            "jvp_all": jax.jit(self.jvp_all),
            "jvp_leaf": jax.jit(self.jvp_leaf, static_argnums=0),
            "vjp_out": jax.jit(self.vjp_out, static_argnums=0),
        }
