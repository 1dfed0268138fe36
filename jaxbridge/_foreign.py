"""`jaxbridge.foreign`: a NumPy/SciPy function becomes a differentiable JAX function."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Hashable
from typing import Any, Literal, TypeVar, overload

import jax
import numpy as np

from ._compat import aval_of
from ._hostcall import BACKENDS, ON_MESH
from ._primitives import join_varying
from ._rules import foreign_call_p
from ._spec import CallSpec

VMAP_CHOICES = ("loop", "vectorized")
RULE_KINDS = ("numpy", "jax")
F = TypeVar("F", bound=Callable[..., Any])


@dataclasses.dataclass(frozen=True)
class Rule:
    """A user derivative rule: `kind="numpy"` runs on the host, `"jax"` is traced."""

    fun: Callable[..., Any]
    kind: str


def _is_array_leaf(x: Any) -> bool:
    return isinstance(x, (jax.Array, np.ndarray, np.generic, bool, int, float, complex)) or \
        hasattr(x, "__jax_array__")


def _as_struct(x: Any, what: str, name: str) -> jax.ShapeDtypeStruct:
    shape, dtype = getattr(x, "shape", None), getattr(x, "dtype", None)
    if shape is None or dtype is None:
        raise TypeError(
            f"jaxbridge.foreign: the declared {what} of {name!r} must be a pytree of "
            f"jax.ShapeDtypeStruct (or arrays), got a leaf of type {type(x).__name__}: {x!r}")
    return jax.ShapeDtypeStruct(tuple(shape), jax.dtypes.canonicalize_dtype(dtype))


class ForeignFunction:
    """A host (NumPy/SciPy) function callable from JAX; see :func:`foreign`."""

    def __init__(self, fun: Callable[..., Any], result: Any, *, residuals: Any = None,
                 vmap: str = "loop", backend: str = "auto", batch_dims: int = 0,
                 on_mesh: str = "error"):
        if not callable(fun):
            raise TypeError(f"jaxbridge.foreign: expected a function to wrap, got {fun!r}")
        if vmap not in VMAP_CHOICES:
            raise ValueError(f"jaxbridge.foreign: vmap must be one of {VMAP_CHOICES}, "
                             f"got {vmap!r}")
        if backend not in BACKENDS:
            raise ValueError(f"jaxbridge.foreign: backend must be one of {BACKENDS}, "
                             f"got {backend!r}")
        if not isinstance(batch_dims, int) or batch_dims < 0:
            raise ValueError(f"jaxbridge.foreign: batch_dims must be an int >= 0, "
                             f"got {batch_dims!r}")
        if on_mesh not in ON_MESH:
            raise ValueError(f"jaxbridge.foreign: on_mesh must be one of {ON_MESH}, "
                             f"got {on_mesh!r}")
        functools.update_wrapper(self, fun)
        self.batch_dims = batch_dims
        self.on_mesh = on_mesh
        self.fun = fun
        self.result = result
        self.residuals = residuals
        self.vmap = vmap
        self.backend = backend
        self.vjp_rule: Rule | None = None
        self.jvp_rule: Rule | None = None
        self._specs: dict[Hashable, CallSpec] = {}

    def __repr__(self) -> str:
        def show(rule: Rule | None) -> str:
            return "-" if rule is None else rule.kind
        return (f"<jaxbridge.foreign {self.__name__!r}: vjp={show(self.vjp_rule)}, "
                f"jvp={show(self.jvp_rule)}, vmap={self.vmap}>")

    # ---- rules ----
    def _set_rule(self, which: str, rule: Callable | None, kind: str) -> Any:
        if kind not in RULE_KINDS:
            raise ValueError(f"jaxbridge: {self.__name__}.def{which}: kind must be one of "
                             f"{RULE_KINDS}, got {kind!r}")

        def register(fun: F) -> F:
            if not callable(fun):
                raise TypeError(f"jaxbridge: {self.__name__}.def{which} expects a function, "
                                f"got {fun!r}")
            setattr(self, f"{which}_rule", Rule(fun, kind))
            self._specs.clear()  # calls traced before this used the old rules
            return fun

        return register if rule is None else register(rule)

    @overload
    def defvjp(self, rule: F, *, kind: str = "numpy") -> F: ...
    @overload
    def defvjp(self, rule: None = None, *, kind: str = "numpy") -> Callable[[F], F]: ...

    def defvjp(self, rule=None, *, kind="numpy"):
        """Register the adjoint: `rule(primals, out, ct, [res,] **static) -> cts`.

        `primals` is the tuple of positional arguments, `out` the function's output,
        `ct` the output cotangent (zeros where unused; None for integer outputs). Return
        one cotangent per positional argument, in its structure; None means zero.
        `kind="numpy"` (default) runs the rule on the host with NumPy arrays;
        `kind="jax"` traces it, so it can be differentiated again.

        Example:
            >>> import jax, jax.numpy as jnp, numpy as np, jaxbridge as jb
            >>> f = jb.foreign(lambda x: x)(np.sin)
            >>> @f.defvjp
            ... def f_vjp(primals, out, ct):
            ...     (x,) = primals
            ...     return (np.cos(x) * ct,)
            >>> print(f"{float(jax.grad(f)(jnp.float32(0.0))):.3f}")
            1.000
        """
        return self._set_rule("vjp", rule, kind)

    @overload
    def defjvp(self, rule: F, *, kind: str = "numpy") -> F: ...
    @overload
    def defjvp(self, rule: None = None, *, kind: str = "numpy") -> Callable[[F], F]: ...

    def defjvp(self, rule=None, *, kind="numpy"):
        """Register the tangent rule: `rule(primals, out, tangents, [res,] **static)`.

        `tangents` has one entry per positional argument; an entry (or a leaf inside
        it) is None where the tangent is a symbolic zero. Return the output tangent
        in the output's structure (None means zero). The rule must be linear in the
        tangents. `kind` as in :meth:`defvjp`.

        Example:
            >>> import jax, jax.numpy as jnp, numpy as np, jaxbridge as jb
            >>> f = jb.foreign(lambda x: x)(np.sin)
            >>> @f.defjvp
            ... def f_jvp(primals, out, tangents):
            ...     (x,), (dx,) = primals, tangents
            ...     return np.cos(x) * dx
            >>> _, dy = jax.jvp(f, (jnp.float32(0.0),), (jnp.float32(2.0),))
            >>> print(f"{float(dy):.3f}")
            2.000
        """
        return self._set_rule("jvp", rule, kind)

    # ---- calling ----
    def __call__(self, *args: Any, **static: Any) -> Any:
        spec, dyn = self._spec(args, static)
        outs = foreign_call_p.bind(*join_varying(dyn), spec=spec)
        return jax.tree_util.tree_unflatten(spec.out_tree, list(outs[:spec.n_out]))

    def _spec(self, args: tuple, static: dict) -> tuple[CallSpec, list]:
        name = self.__name__
        for key, value in static.items():
            try:
                hash(value)
            except TypeError:
                raise TypeError(
                    f"jaxbridge: foreign function {name!r}: keyword argument {key!r} is static "
                    f"(keyword arguments select a compiled version), so it must be hashable; "
                    f"got {type(value).__name__}. Pass arrays as positional arguments.") from None
        leaves, in_tree = jax.tree_util.tree_flatten(args)
        dyn, avals, static_leaves = [], [], []
        for i, leaf in enumerate(leaves):
            if _is_array_leaf(leaf):
                x = leaf if isinstance(leaf, jax.Array) else jax.numpy.asarray(leaf)
                aval = aval_of(x)
                dyn.append(x)
                avals.append((tuple(aval.shape), np.dtype(aval.dtype)))
            else:
                try:
                    hash(leaf)
                except TypeError:
                    raise TypeError(
                        f"jaxbridge: foreign function {name!r}: positional arguments may "
                        f"contain arrays and hashable (static) leaves; leaf {i} is an "
                        f"unhashable {type(leaf).__name__}") from None
                static_leaves.append((i, leaf))
        key = (in_tree, tuple(static_leaves), tuple(avals), tuple(sorted(static.items())))
        spec = self._specs.get(key)
        if spec is None:
            spec = self._make_spec(in_tree, tuple(static_leaves), tuple(avals),
                                   tuple(sorted(static.items())))
            self._specs[key] = spec
        return spec, dyn

    def _make_spec(self, in_tree, static_leaves, avals, statics) -> CallSpec:
        in_structs = tuple(jax.ShapeDtypeStruct(s, d) for s, d in avals)

        def declared(decl: Any, what: str) -> tuple[Any, tuple]:
            if callable(decl) and not hasattr(decl, "shape"):
                structs = iter(in_structs)
                leaves = dict(static_leaves)
                sds_leaves = [leaves[j] if j in leaves else next(structs)
                              for j in range(in_tree.num_leaves)]
                decl = decl(*jax.tree_util.tree_unflatten(in_tree, sds_leaves), **dict(statics))
            flat, tree = jax.tree_util.tree_flatten(decl)
            return tree, tuple(_as_struct(x, what, self.__name__) for x in flat)

        out_tree, out_avals = declared(self.result, "result")
        res_tree, res_avals = (None, ())
        if self.residuals is not None:
            res_tree, res_avals = declared(self.residuals, "residuals")
        if self.batch_dims:
            self._check_batch_dims(in_structs + out_avals + res_avals)
        return CallSpec(self, in_tree, static_leaves, in_structs, statics, out_tree, out_avals,
                        res_tree, res_avals)

    def _check_batch_dims(self, structs: tuple) -> None:
        k = self.batch_dims
        leading = {tuple(s.shape[:k]) for s in structs if len(s.shape) >= k}
        if any(len(s.shape) < k for s in structs) or len(leading) != 1:
            shapes = [list(s.shape) for s in structs]
            raise ValueError(
                f"jaxbridge: foreign function {self.__name__!r} declares batch_dims={k}, so every "
                f"array argument, result and residual must share the same {k} leading "
                f"dimension(s); got shapes {shapes}. Broadcast unbatched arguments, or call "
                f"the function inside jax.shard_map instead.")


def foreign(result: Any, *, residuals: Any = None,
            vmap: Literal["loop", "vectorized"] = "loop",
            backend: Literal["auto", "native", "pure_callback"] = "auto",
            batch_dims: int = 0, on_mesh: Literal["error", "replicate"] = "error",
            ) -> Callable[[Callable[..., Any]], ForeignFunction]:
    """Make a NumPy/SciPy function callable (and differentiable) from JAX.

    Args:
      result: the output's shapes and dtypes: a pytree of `jax.ShapeDtypeStruct`, or a
        callable that takes the positional arguments as ShapeDtypeStructs (plus the
        keyword arguments) and returns that pytree.
      residuals: optional, declared like `result`. The function then returns
        `(output, residuals)`, and the derivative rules get `res` as a fourth
        positional argument (to avoid recomputing, say, a factorization).
      vmap: how `jax.vmap` runs the function (and its rules): `"loop"` calls it once
        per batch element (always correct); `"vectorized"` calls it once with a
        leading batch axis on every argument (unbatched ones are broadcast), for
        functions written to broadcast over leading axes.
      backend: `"auto"` (native host call where available, else `jax.pure_callback`),
        `"native"` (error if unavailable) or `"pure_callback"`.
      batch_dims: the number of leading dimensions, shared by every array argument
        and result, along which the function is independent (it must accept any
        size there). Under `jit` on inputs sharded along them, XLA runs the call
        (and its rules) once per shard on the shard's own device, with no gather.
      on_mesh: what to do when a call that cannot be split (no `batch_dims`, or the
        `pure_callback` backend) is compiled for several devices: `"error"`
        (default; never a silent gather) or `"replicate"` (accept that XLA gathers
        the inputs and runs the call on every device).

    Positional arguments are pytrees whose array leaves are traced (float, complex,
    integer and bool; only inexact ones are differentiable); other leaves and all
    keyword arguments are static and must be hashable. The wrapped function gets
    NumPy arrays and must return exactly the declared shapes and dtypes.

    Example:
        >>> import jax, jax.numpy as jnp, numpy as np, scipy.linalg
        >>> import jaxbridge as jb
        >>> @jb.foreign(lambda a, b: b)
        ... def solve(a, b):
        ...     return scipy.linalg.solve(a, b)
        >>> @solve.defvjp
        ... def solve_vjp(primals, x, ct):
        ...     a, _ = primals
        ...     lam = scipy.linalg.solve(a.T, ct)
        ...     return (-np.outer(lam, x), lam)
        >>> a, b = jnp.eye(2, dtype=jnp.float32) * 2.0, jnp.ones(2, dtype=jnp.float32)
        >>> jax.grad(lambda b: solve(a, b).sum())(b)
        Array([0.5, 0.5], dtype=float32)
    """
    def wrap(fun: Callable[..., Any]) -> ForeignFunction:
        return ForeignFunction(fun, result, residuals=residuals, vmap=vmap, backend=backend,
                               batch_dims=batch_dims, on_mesh=on_mesh)

    return wrap


def custom_gradient(result: Any, **options: Any) -> Callable[[Callable[..., Any]],
                                                              ForeignFunction]:
    """The one-function form: `fun(*args) -> (value, grad_fn)`, in NumPy.

    `grad_fn(ct)` returns one cotangent per positional argument (a tuple), or the
    cotangent itself for a one-argument function. The forward is run again inside
    the backward pass to obtain `grad_fn` (host state cannot cross XLA), so the
    backward costs one extra forward call. Options as in :func:`foreign`.

    Example:
        >>> import jax, jax.numpy as jnp, numpy as np, jaxbridge as jb
        >>> @jb.custom_gradient(lambda x: x)
        ... def clipped_log(x):
        ...     return np.log(x), lambda ct: np.clip(ct / x, -10, 10)
        >>> print(float(jax.grad(clipped_log)(jnp.float32(0.01))))
        10.0
    """
    def wrap(fun: Callable[..., Any]) -> ForeignFunction:
        @functools.wraps(fun)
        def forward(*args, **static):
            return fun(*args, **static)[0]

        wrapped = ForeignFunction(forward, result, **options)

        @wrapped.defvjp
        def _vjp(primals, out, ct, **static):
            cts = fun(*primals, **static)[1](ct)
            if len(primals) == 1 and not (isinstance(cts, (tuple, list)) and len(cts) == 1):
                cts = (cts,)
            return tuple(cts)

        return wrapped

    return wrap
