"""`jaxbridge.torch.wrap`: a PyTorch function becomes a differentiable JAX function.

A wrapped function is a `jb.foreign` host function whose forward call runs the torch
function on zero-copy tensors and writes into XLA's output buffers (`out=True`). Its
derivative rules are JAX rules (``kind="jax"``) that call two more wrapped torch
functions, made on first use for each call signature:

* the VJP rule: ``(primals, cotangents) -> input cotangents`` by `torch.func.vjp`;
* the JVP rule: ``(primals, tangents) -> output tangents`` by `torch.func.jvp`.

Both are `TorchFunction`s again, with rules of their own, so every derivative is
itself differentiable: `hessian` (forward over reverse) runs `torch.func.jvp` of
`torch.func.vjp`, a third derivative one more level down, and so on -- torch's
transforms compose, and JAX's `jit`, `vmap` and sharding apply at every level.

A function that draws random numbers (found when it is first traced, `_shapes`) is
called through a `jb.foreign` function whose forward call also returns torch's
generator state from before the call, as a residual: its derived functions take that
state as a first argument and replay it (`_rng`), so they see the forward's draws.
A call that JAX differentiates in reverse mode goes through one whose forward keeps its
autograd graph for the VJP call (`_graphs`): a training step runs the forward once, as
eager torch does, not twice.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np
import torch

from .._core.arrays import is_array_leaf
from .._core.capabilities import Derivatives
from .._core.jaxapi import is_linearize_tracer
from .._core.pair import VMAP_CHOICES  # the words of jb.foreign and jb.kernel too
from .._foreign.api import ForeignFunction, callable_name
from . import _graphs, _rng, _shapes
from ._convert import numpy_dtype, torch_dtype
from ._device import device_filler
from ._host import BatchingState, run_host, run_into_out, run_keeping_graph, run_one
from ._torchapi import is_batched

__all__ = ["TorchFunction", "wrap"]

# The static keyword carrying the ranks of the unbatched array arguments: how the host
# side tells a batched call (under jax.vmap) from a plain one.
RANKS = "_jaxbridge_ranks"
# Call signatures whose shape-inference runs are kept per function.
INFERRED_KEPT = 256


def _inexact(x: Any) -> bool:
    return is_array_leaf(x) and bool(jnp.issubdtype(jnp.result_type(x), jnp.inexact))


def _avals_key(leaves: Sequence[Any]) -> tuple:
    return tuple((np.shape(x), np.dtype(jnp.result_type(x))) if is_array_leaf(x)
                 else ("static", x) for x in leaves)


class TorchFunction:
    """A torch function callable from JAX, made by :func:`wrap` (see there).

    `fn` is the torch function; calling the object calls it from JAX. Built on
    `jaxbridge.foreign` (a host function with ``out=True`` and JAX-written derivative
    rules), so everything said there about host calls holds. `stochastic`: whether
    `fn` draws random numbers (None: found at its first trace; the derivative
    functions made here pass False, as they replay a generator state they are given).

    Example:
        >>> import jax.numpy as jnp, torch
        >>> from jaxbridge.torch import TorchFunction, wrap
        >>> f = wrap(torch.cos)
        >>> isinstance(f, TorchFunction), f.fn is torch.cos
        (True, True)
        >>> f(jnp.zeros(2, jnp.float32)).tolist()
        [1.0, 1.0]
    """

    def __init__(self, fn: Callable[..., Any], result: Any = None, *,
                 vmap: str = "vectorized", batch_dims: int = 0, on_mesh: str = "error",
                 backend: str = "auto", name: str | None = None,
                 composable: Callable[..., Any] | None = None, out: bool = False,
                 redirect: bool = False, stochastic: bool | None = None):
        where = "jaxbridge.torch.wrap"
        if not callable(fn):
            raise TypeError(f"{where}: expected a torch function to wrap, got {fn!r}")
        if vmap not in VMAP_CHOICES:
            raise ValueError(f"{where}: vmap must be one of {VMAP_CHOICES}, got {vmap!r}")
        for flag, value in (("out", out), ("redirect", redirect)):
            if value is not True and value is not False:
                raise TypeError(f"{where}: {flag} must be True or False, got {value!r}")
        if out and result is None:
            raise TypeError(
                f"{where}: out=True needs result= (the shapes and dtypes of the buffers "
                f"{callable_name(fn)!r} writes into: a pytree of jax.ShapeDtypeStruct, or a "
                f"function of the arguments as ShapeDtypeStructs)")
        self.fn = fn
        self.out = out  # fn writes into out= buffers (the public out=True)
        if out:  # derivatives and torch.vmap need it as a function that returns results
            composable = composable or _out_functional(fn, result, callable_name(fn))
        # What the derivative rules differentiate with torch.func: `fn` itself, or for a
        # derived function whose host call uses plain autograd (faster), its
        # torch.func twin (autograd.grad does not compose with torch.func transforms).
        self._composable = composable or fn
        self.result = result
        self.__name__ = name or callable_name(fn)
        self.__doc__ = getattr(fn, "__doc__", None)
        self._options: dict[str, Any] = dict(vmap=vmap, batch_dims=batch_dims, on_mesh=on_mesh,
                             backend=backend)
        self._batching = BatchingState(None if out else fn, redirect)
        self._derived: dict[Any, TorchFunction] = {}
        # Whether `fn` draws random numbers: None until its first trace finds out;
        # False for derived functions (they replay a state they are given).
        self._stochastic = stochastic
        self._inferred: dict[Any, _shapes.Inferred] = {}
        # Whether calls differentiated in reverse mode keep their graph (`_graphs`): not
        # where results are written into XLA's memory (out=, redirect) or per shard.
        self._may_keep_graph = not out and not redirect and not batch_dims
        self._foreigns: dict[tuple[bool, bool], ForeignFunction] = {}
        self._foreign = self._foreign_of(stochastic=False, keep_graph=False)

    def _foreign_of(self, stochastic: bool, keep_graph: bool) -> ForeignFunction:
        """The `jb.foreign` function that runs the calls, made once: its forward also
        returns the generators' state for a function that draws random numbers
        (residual "rng"), and a kept graph's token where it keeps one ("graph")."""
        foreign = self._foreigns.get((stochastic, keep_graph))
        if foreign is None:
            residuals = None
            if stochastic or keep_graph:
                residuals = functools.partial(self._residuals, stochastic, keep_graph)
            foreign = ForeignFunction(self._host_forward(stochastic, keep_graph),
                                      self._declare, out=True, residuals=residuals,
                                      **self._options)
            foreign.defvjp(self._vjp_rule, kind="jax", wanted=True)
            foreign.defjvp(self._jvp_rule, kind="jax")
            self._foreigns[stochastic, keep_graph] = foreign
        return foreign

    def __repr__(self) -> str:
        return f"<jaxbridge.torch function {self.__name__!r}>"

    def derivatives(self) -> Derivatives:
        """Every derivative, of every order: torch's autograd (reverse mode) and
        ``torch.func.jvp`` (forward mode), each itself a wrapped torch call. Asked by
        `jaxbridge.testing.check_rules`, which plans its checks from the answer."""
        return Derivatives(forward="torch.func.jvp (a wrapped torch call)",
                           reverse="torch autograd (a wrapped torch call)", second_order=True)

    def __call__(self, *args: Any, **static: Any) -> Any:
        leaves = jax.tree_util.tree_leaves(args)
        ranks = tuple(np.ndim(x) for x in leaves if is_array_leaf(x))
        keep_graph = self._may_keep_graph and any(is_linearize_tracer(x) for x in leaves)
        if self._stochastic is False and not keep_graph:
            foreign = self._foreign
        else:
            foreign = self._foreign_of(self._draws_random_numbers(args, static), keep_graph)
        return foreign(*args, **{RANKS: ranks}, **static)

    def _draws_random_numbers(self, args: tuple, static: dict) -> bool:
        """Whether the function draws random numbers: its first trace finds out (its
        runs on meta tensors or fillings)."""
        if self._stochastic is None:
            leaves, tree = jax.tree_util.tree_flatten(args)
            structs = [jax.ShapeDtypeStruct(np.shape(x), jnp.result_type(x))
                       if is_array_leaf(x) else x for x in leaves]
            self._stochastic = self._infer(structs, tree, static).random
        return self._stochastic

    # ---- shapes: meta tensors, else fillings (_shapes), else result=
    def _declare(self, *args: Any, **static: Any) -> Any:
        static.pop(RANKS)
        if self.result is not None:
            if callable(self.result) and not hasattr(self.result, "shape"):
                return self.result(*args, **static)
            return self.result
        leaves, tree = jax.tree_util.tree_flatten(args)
        return self._infer(leaves, tree, static).structs

    def _infer(self, leaves: list, tree: Any, static: dict) -> _shapes.Inferred:
        """What runs without data find for one call signature (`_shapes.infer`), once:
        the result shapes (unless declared) and whether the function draws random
        numbers."""
        key = (tree, tuple((x.shape, x.dtype) if isinstance(x, jax.ShapeDtypeStruct)
                           else ("static", x) for x in leaves), tuple(sorted(static.items())))
        found = self._inferred.get(key)
        if found is None:
            fn = self._composable if self.out else self.fn
            found = _shapes.infer(fn, leaves, tree, static, self.__name__,
                                  shapes=self.result is None)
            if len(self._inferred) >= INFERRED_KEPT:
                self._inferred.clear()
            self._inferred[key] = found
        return found

    def _residuals(self, stochastic: bool, keep_graph: bool, *args: Any, **static: Any
                   ) -> dict[str, jax.ShapeDtypeStruct]:
        """The residual outputs: "rng", the generators' state (one per call, or per row
        of the leading `batch_dims`: one call per shard, each shard's rows share its
        state); "graph", a kept graph's token (`_graphs`)."""
        res = {}
        if keep_graph:
            res["graph"] = _graphs.token_struct()
        if stochastic:
            res["rng"] = state = _rng.state_struct()
            batch = self._options["batch_dims"]
            if batch:
                first = next(x for x in jax.tree_util.tree_leaves(args)
                             if isinstance(x, jax.ShapeDtypeStruct))
                res["rng"] = jax.ShapeDtypeStruct((*first.shape[:batch], *state.shape),
                                                  state.dtype)
        return res

    # ---- the host side of one call
    def _host_forward(self, stochastic: bool, keep_graph: bool) -> Callable[..., None]:
        """The forward host call: `fn` on zero-copy tensors, results into `out` (and,
        `stochastic`, the generators' state before the call into residual "rng";
        `keep_graph`, the token of its kept graph into residual "graph")."""
        fn, name, state = self.fn, self.__name__, self._batching
        vectorized = self._options["vmap"] == "vectorized"
        fills_out, functional = self.out, self._composable

        def forward(*args: Any, out: Any, _jaxbridge_ranks: tuple, **static: Any) -> None:
            if not (stochastic or keep_graph):
                run(args, out, _jaxbridge_ranks, static, None, None)
                return
            outputs, res = out
            if stochastic:  # the generators' state travels in the residual (`_rng`)
                with _rng.holding():
                    run(args, outputs, _jaxbridge_ranks, static, res["rng"], res.get("graph"))
            else:
                run(args, outputs, _jaxbridge_ranks, static, None, res["graph"])

        def run(args: tuple, out: Any, _jaxbridge_ranks: tuple, static: dict,
                rng_state: Any, token: Any) -> None:
            if rng_state is None and token is None and not fills_out and not static \
                    and len(args) == 1 \
                    and type(args[0]) is np.ndarray \
                    and (not vectorized or args[0].ndim == _jaxbridge_ranks[0]):
                run_one(name, fn, args[0], out, state)  # the hot path: one array, unbatched
                return
            leaves, tree = jax.tree_util.tree_flatten(args)

            def call(tensors: list[Any]) -> Any:
                f = functional if fills_out else fn
                return f(*jax.tree_util.tree_unflatten(tree, tensors), **static)

            depth = 0
            if vectorized and _jaxbridge_ranks:  # under jax.vmap: leading axes on every leaf
                first = next(x for x in leaves if isinstance(x, (np.ndarray, torch.Tensor)))
                depth = first.ndim - _jaxbridge_ranks[0]
            if token is not None:
                if depth == 0:
                    run_keeping_graph(name, call, leaves, out, token, rng_state)
                    return
                token[...] = _graphs.NONE  # batched calls keep no graph
            if fills_out and depth == 0:
                if rng_state is not None:
                    _rng.capture_into(rng_state)
                run_into_out(name, fn, leaves, tree, static, out, state)
                return
            # A torch operator on its arguments as they are may write into `out`.
            op = fn if state.op and not static and len(leaves) == len(args) else None
            run_host(name, call, leaves, out, depth, state, op, rng_state)

        forward.__name__ = forward.__qualname__ = name  # named in errors
        forward.jaxbridge_adapt_fill = self._adapt_fill  # type: ignore[attr-defined]
        return forward

    def _adapt_fill(self, sig: Any, fill: Callable[[tuple, tuple], None]
                    ) -> tuple[Callable[[tuple, tuple], None], Callable[..., None] | None]:
        """The host call's fills for one call signature (asked by jaxbridge.foreign):
        for one unbatched array in and one out, a fill that goes straight to `run_one`
        (three Python frames fewer per call); and where torch has CUDA, the device fill
        that runs on XLA's device buffers and stream (jaxbridge/torch/_device.py)."""
        device_fill = device_filler(fill)
        one_in_one_out = not self.out and sig.plain_args and len(sig.in_avals) == 1 \
            and not sig.batch_shape and sig.res_tree is None and sig.out_tree.num_nodes == 1 \
            and sig.out_tree.num_leaves == 1 and set(sig.kwargs) == {RANKS}
        if not one_in_one_out:
            return fill, device_fill
        fn, name, state = self.fn, self.__name__, self._batching

        def fill_one(ins: tuple, outs: tuple) -> None:
            run_one(name, fn, ins[0], outs[0], state)

        fill_one.__name__ = fill_one.__qualname__ = name  # named in errors
        return fill_one, device_fill

    # ---- derivative rules (JAX side): each calls a derived torch function
    def _derive(self, key: Any, make: Callable[[], TorchFunction]) -> TorchFunction:
        derived = self._derived.get(key)
        if derived is None:
            derived = self._derived[key] = make()
            derived._may_keep_graph = False  # its own derivatives use torch.func
        return derived

    def _with_state(self, primals: tuple, res: dict | None
                    ) -> tuple[Callable[..., Any], tuple]:
        """What the derived functions differentiate, and its primals. A call that
        carries the generators' state (residual "rng", see `_rng`) differentiates `fn`
        replaying it, the state a first primal (an integer array: no derivative)."""
        if not res or "rng" not in res:
            return self._composable, primals
        return _rng.replayed(self._composable), (res["rng"], *primals)

    def _vjp_rule(self, primals: tuple, y: Any, ct: Any, res: dict | None = None, *,
                  wanted: tuple, **static: Any) -> tuple:
        static.pop(RANKS)
        fn, with_state = self._with_state(primals, res)
        skip = len(with_state) - len(primals)  # the generators' state, if it is there
        p_leaves, in_tree = jax.tree_util.tree_flatten(with_state)
        y_leaves, out_tree = jax.tree_util.tree_flatten(y)
        # Only the cotangents JAX uses: grad with respect to a model's parameters asks
        # nothing of its data, and torch then skips the data's gradient (a first
        # layer's input gradient is a matmul as large as its weight gradient).
        used = [False] * skip + jax.tree_util.tree_leaves(wanted)
        diff_in = tuple(i for i, x in enumerate(p_leaves) if _inexact(x) and used[i])
        diff_out = tuple(j for j, v in enumerate(y_leaves) if _inexact(v))
        ct_leaves = jax.tree_util.tree_leaves(ct)  # None (integer outputs) drops out
        if not diff_in or not diff_out:
            return tuple(None for _ in primals)
        token = () if res is None or "graph" not in res else (res["graph"],)
        key = ("vjp", in_tree, _avals_key(p_leaves), out_tree, diff_in, diff_out,
               tuple(sorted(static.items())), bool(token))
        vjp = self._derive(key, lambda: TorchFunction(
            _autograd_vjp(fn, in_tree, diff_in, diff_out, static),
            lambda p, cts, *token: [p[i] for i in diff_in], name=f"VJP of {self.__name__}",
            composable=_torch_vjp(fn, in_tree, diff_in, diff_out, static), stochastic=False,
            **self._options))
        cts = iter(vjp(p_leaves, ct_leaves, *token))
        leaves = [next(cts) if i in diff_in else None for i in range(len(p_leaves))]
        return tuple(jax.tree_util.tree_unflatten(in_tree, leaves))[skip:]

    def _jvp_rule(self, primals: tuple, y: Any, tangents: tuple, res: dict | None = None,
                  **static: Any) -> Any:
        static.pop(RANKS)
        fn, with_state = self._with_state(primals, res)
        tangents = (None,) * (len(with_state) - len(primals)) + tuple(tangents)
        primals = with_state
        p_leaves, in_tree = jax.tree_util.tree_flatten(primals)
        t_leaves: list[Any] = []
        for arg, t in zip(primals, tangents):
            n = len(jax.tree_util.tree_leaves(arg))
            t_leaves += [None] * n if t is None else \
                jax.tree_util.tree_flatten(t, is_leaf=lambda v: v is None)[0]
        y_leaves, out_tree = jax.tree_util.tree_flatten(y)
        live = tuple(i for i, (x, t) in enumerate(zip(p_leaves, t_leaves))
                     if t is not None and _inexact(x))
        diff_out = tuple(j for j, v in enumerate(y_leaves) if _inexact(v))
        if not live or not diff_out:
            return None
        out_structs = [jax.ShapeDtypeStruct(np.shape(y_leaves[j]), jnp.result_type(y_leaves[j]))
                       for j in diff_out]
        key = ("jvp", in_tree, _avals_key(p_leaves), live, out_tree,
               _avals_key(out_structs), diff_out, tuple(sorted(static.items())))
        jvp = self._derive(key, lambda: TorchFunction(
            _torch_jvp(fn, in_tree, live, diff_out, static), out_structs,
            name=f"JVP of {self.__name__}", stochastic=False, **self._options))
        touts = iter(jvp(p_leaves, [t_leaves[i] for i in live]))
        leaves = [next(touts) if j in diff_out else None for j in range(len(y_leaves))]
        return jax.tree_util.tree_unflatten(out_tree, leaves)


def _out_functional(fn: Callable[..., Any], result: Any, name: str) -> Callable[..., Any]:
    """A function of ``wrap(..., out=True)`` (it writes into ``out=``) as one that
    returns its results, for its derivatives and for `torch.vmap`: buffers of the
    declared shapes are allocated, `fn` fills them, and `torch.func.functionalize` turns
    the writes into functional operations, so that autograd and every torch.func
    transform see through them."""
    where = f"jaxbridge.torch: function {name!r}"

    def as_struct(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            return jax.ShapeDtypeStruct(tuple(x.shape), numpy_dtype(x.dtype, where))
        return x

    def returning(*args: Any, **static: Any) -> Any:
        structs = result
        if callable(result) and not hasattr(result, "shape"):
            structs = result(*jax.tree_util.tree_map(as_struct, args), **static)
        tensors = [x for x in jax.tree_util.tree_leaves(args) if isinstance(x, torch.Tensor)]
        device = tensors[0].device if tensors else None
        outs = jax.tree_util.tree_map(
            lambda s: torch.empty(tuple(s.shape), dtype=torch_dtype(s.dtype, where),
                                  device=device), structs)
        fn(*args, out=outs, **static)
        return outs

    return torch.func.functionalize(returning)


def _restricted(fn: Callable[..., Any], in_tree: Any, p_leaves: Sequence[Any],
                moving: tuple, outs: tuple, static: dict) -> Callable[..., tuple]:
    """`fn` as a function of the leaves at `moving` alone (the others held at their
    values), returning the tuple of its output leaves at `outs`."""
    def restricted(*xs: Any) -> tuple:
        leaves = list(p_leaves)
        for i, x in zip(moving, xs):
            leaves[i] = x
        value = fn(*jax.tree_util.tree_unflatten(in_tree, leaves), **static)
        out_leaves = jax.tree_util.tree_leaves(value)
        return tuple(out_leaves[j] for j in outs)

    return restricted


def _conj(ts: Any) -> list:
    """Complex conjugates (torch.conj is a lazy view; real tensors pass unchanged).
    JAX's VJP is the transpose of the tangent map, torch's the adjoint under
    Re<a, b>: for complex values they differ by a conjugation on either side,
    ``jax_vjp(ct) = conj(torch_vjp(conj(ct)))``."""
    return [t.conj() if t.is_complex() else t for t in ts]


def _autograd_vjp(fn: Callable[..., Any], in_tree: Any, diff_in: tuple, diff_out: tuple,
                  static: dict) -> Callable[..., list]:
    """The VJP by plain autograd: what eager torch's `loss.backward()` costs, less
    than `torch.func.vjp`'s per-op dispatch (used for the call itself; its own
    derivatives differentiate the `torch.func.vjp` twin). With a `token`, on the graph
    the forward call kept (`_graphs`) when it is still there, without running `fn`."""
    def vjp(p_leaves: list, cts: list, token: Any = None) -> list:
        if token is not None and not is_batched(token):
            kept = _kept_graph_vjp(int(token), len(p_leaves), diff_in, diff_out, cts)
            if kept is not None:
                return kept
        with torch.enable_grad():
            xs = [p_leaves[i].detach().requires_grad_() for i in diff_in]
            outs = _restricted(fn, in_tree, p_leaves, diff_in, diff_out, static)(*xs)
            return _pull_back(outs, xs, cts)

    return vjp


def _pull_back(outs: Sequence[Any], xs: list, cts: list) -> list:
    """torch's VJP of `outs` (those that require grad) with respect to `xs`, as JAX's
    (see `_conj`); zeros where an input does not reach an output."""
    live = [(o, c) for o, c in zip(outs, cts)
            if isinstance(o, torch.Tensor) and o.requires_grad]
    with torch.enable_grad():
        grads = torch.autograd.grad([o for o, _ in live], xs, _conj([c for _, c in live]),
                                    allow_unused=True) if live else [None] * len(xs)
    return _conj([torch.zeros_like(x) if g is None else g for g, x in zip(grads, xs)])


def _kept_graph_vjp(token: int, n_leaves: int, diff_in: tuple, diff_out: tuple,
                    cts: list) -> list | None:
    """`_autograd_vjp` on the graph kept under `token`, or None where it is gone or does
    not fit this call (then the function runs again)."""
    kept = _graphs.take(token)
    if kept is None:
        return None
    inputs, outputs = kept
    skip = n_leaves - len(inputs)  # the generators' state leads the primals, if there
    xs: list[torch.Tensor] = [inputs[i - skip] for i in diff_in if i >= skip
                              and isinstance(inputs[i - skip], torch.Tensor)]
    if len(xs) < len(diff_in) or len(outputs) <= max(diff_out):
        return None
    try:
        return _pull_back([outputs[j] for j in diff_out], xs, cts)
    except RuntimeError:  # e.g. a tensor it saved was modified in place since
        return None


def _torch_vjp(fn: Callable[..., Any], in_tree: Any, diff_in: tuple, diff_out: tuple,
               static: dict) -> Callable[..., list]:
    def vjp(p_leaves: list, cts: list, *token: Any) -> list:
        f = _restricted(fn, in_tree, p_leaves, diff_in, diff_out, static)
        pull = torch.func.vjp(f, *[p_leaves[i] for i in diff_in])[1]
        return _conj(pull(tuple(_conj(cts))))

    return vjp


def _torch_jvp(fn: Callable[..., Any], in_tree: Any, live: tuple, diff_out: tuple,
               static: dict) -> Callable[[list, list], list]:
    def jvp(p_leaves: list, ts: list) -> list:
        f = _restricted(fn, in_tree, p_leaves, live, diff_out, static)
        touts = torch.func.jvp(f, tuple(p_leaves[i] for i in live), tuple(ts))[1]
        return list(touts)

    return jvp


def wrap(fn: Callable[..., Any] | None = None, result: Any = None, *,
         vmap: Literal["vectorized", "loop"] = "vectorized", batch_dims: int = 0,
         on_mesh: Literal["error", "replicate"] = "error",
         backend: Literal["auto", "native", "pure_callback"] = "auto",
         out: bool = False, redirect: bool = False) -> Any:
    """Make a PyTorch function a JAX function, with its derivatives from torch.

    `fn` takes torch tensors (pytrees of them, as positional arguments; keyword
    arguments are static and must be hashable) and returns tensors (any pytree). The
    result works under `jit`, `grad`, `vjp`, `jvp`, `jacfwd`, `jacrev`, `hessian`
    (derivatives of any order: each derivative is again a wrapped torch call, by
    `torch.func.vjp` and `torch.func.jvp`), `vmap` and `lax.scan`.

    Args:
      fn: the torch function (or use ``@wrap`` / ``@wrap(result=...)`` as a decorator).
      result: the results' shapes and dtypes (a pytree of `jax.ShapeDtypeStruct`, or a
        function of the arguments as ShapeDtypeStructs). Usually not needed: at trace
        time `fn` runs on meta tensors (shapes only, no data); if that fails (say,
        control flow on values), it runs on zero-filled tensors, ones and a spread of
        values, once per input signature, and a result shape that differs between
        them (or is empty on all of them) is a `ResultMismatchError` asking for
        `result`. Tracing never runs `fn` on your data; an exception `fn` raises
        there reaches you as itself, with a note.
      vmap: ``"vectorized"`` (default): under `jax.vmap` one call runs `fn` under
        `torch.vmap`; a function torch.vmap cannot batch (``.item()``, control flow on
        values) falls back to one call per element, learned on first use.
        ``"loop"``: always one call per element.
      batch_dims, on_mesh, backend: as in :func:`jaxbridge.foreign` (sharded inputs:
        with `batch_dims`, one torch call per shard).
      out: ``True``: `fn` writes its results into XLA's output buffers itself, passed
        as ``out=`` (tensors in the structure of `result`, which is then required),
        and returns None: no result tensor of torch's own and no copy (the fastest
        path for large arrays: ``torch.add(x, 1, out=out)``). It must write every
        element. Its derivatives and `vmap` run it through
        `torch.func.functionalize`, which turns the writes into functional operations.
      redirect: ``True``: from the second call on, the torch operation that makes a
        large result (1 MiB and up, one result, unbatched, on the CPU path) writes it
        straight into XLA's output buffer (no allocation, no copy: up to about 2x
        faster for ``x + 1`` on 1M elements). Off by default, because the result is
        then XLA's memory: a tensor `fn` keeps that shares it (``y.detach()``,
        ``y.view(...)``, in a list, a dict, an attribute) is found and moved to
        private memory, and stays valid, but a NumPy array (``y.numpy()``) or a
        DLPack capsule made from it and kept would point into freed memory.

    A function that draws random numbers (dropout, ``torch.bernoulli``, ``torch.randn``;
    found when it is first traced) carries torch's generator state from its forward
    call to its derivative calls, which run it again with the same draws and leave the
    generators where the forward left them: its gradient is the one of the forward
    that ran, as in eager torch.

    `fn` gets zero-copy views of XLA's buffers (valid during the call only: keeping one
    raises `KeptViewError`; writing into one is an error) and its results are copied
    into XLA's output buffers. torch's intra-op threads follow the call's thread budget,
    as BLAS's do (``JAXBRIDGE_HOST_BLAS_THREADS``, default ``auto``: calls running at
    once share the cores, and a call running alone gets torch's own count or one
    thread, whichever it has been measured to run faster with). An exception it raises reaches
    the caller as itself, under `jit` too.

    Example:
        >>> import jax, jax.numpy as jnp, torch
        >>> from jaxbridge.torch import wrap
        >>> f = wrap(lambda x: torch.sin(x) * x)
        >>> x = jnp.float32(1.0)
        >>> bool(jnp.allclose(jax.grad(f)(x), jnp.cos(x) * x + jnp.sin(x)))
        True
        >>> bool(jnp.allclose(jax.hessian(f)(x), 2 * jnp.cos(x) - x * jnp.sin(x)))
        True
        >>> @wrap(result=jax.ShapeDtypeStruct((3,), jnp.float32), out=True)
        ... def g(x, out):
        ...     torch.mul(torch.sin(x), x, out=out)  # straight into XLA's buffer
        >>> v = jnp.ones(3, jnp.float32)
        >>> bool(jnp.allclose(jax.jit(jax.grad(lambda v: g(v).sum()))(v),
        ...                   jnp.cos(v) * v + jnp.sin(v)))
        True
    """
    def make(f: Callable[..., Any]) -> TorchFunction:
        return TorchFunction(f, result, vmap=vmap, batch_dims=batch_dims, on_mesh=on_mesh,
                             backend=backend, out=out, redirect=redirect)

    return make if fn is None else make(fn)
