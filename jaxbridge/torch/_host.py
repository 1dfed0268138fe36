"""Running a torch function inside a host call: tensors in, results into XLA's buffers.

One call: the NumPy views the host-call runtime lends become torch tensors (no copy),
torch's intra-op threads follow the call's thread budget, as BLAS's do (calls running at
once, one per shard, share the cores; see jaxbridge/_foreign/threads.py), the function
runs (once under `torch.vmap`, or once per element, when JAX batches the call), and
its results are copied into XLA's output buffers after a shape check -- or, for a
function of ``wrap(..., out=True)``, for a torch operator whose ``out=`` is known to be
exact, and (opt-in, ``redirect=True``) for the operation that makes a large result,
written there by torch itself. On the CUDA device path (`_device.py`) the leaves and
`out` are tensors of XLA's device buffers instead of NumPy views.

A function that draws random numbers gets `rng_state` (XLA's residual buffer): the
generators' state before the call (before each element's call, under `vmap`) is
written there, for the derivative calls to replay (`_rng`).
"""

from __future__ import annotations

import itertools
import sys
import types
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
import torch

from .._foreign import threads
from ..errors import ForeignCallError, KeptViewError, ResultMismatchError
from . import _graphs, _redirect, _rng
from ._convert import SAME_MEMORY_DTYPES, numpy_dtype, to_torch
from ._torchapi import memory_of, memory_users, move_to_private_memory

__all__ = ["BatchingState", "run_host", "run_keeping_graph", "run_one", "run_into_out",
           "write_results"]


def is_torch_op(fn: Any) -> bool:
    """Whether `fn` is one of torch's own operators (`torch.sin`, `torch.add`,
    `torch.matmul`, ...): those take ``out=`` and can write into XLA's buffer."""
    return isinstance(fn, types.BuiltinFunctionType) and \
        getattr(fn, "__module__", None) == "torch"


class BatchingState:
    """Per wrapped function, learned on first use: whether `torch.vmap` works for it,
    whether it keeps its input tensors (it then gets private copies), and, for a torch
    operator, the input and output dtypes for which its ``out=`` variant writes the
    result straight into XLA's output buffer (`direct`: no result tensor of torch's
    own, no copy; learned from one ordinary call that returned exactly the declared
    dtype and shape, so ``out=`` never casts or resizes); for any other function with
    one large result, per signature, which of its operations can write the result into
    XLA's buffer (`redirect`, see `_redirect`; None: none can), where the function
    was wrapped with ``redirect=True`` (`may_redirect`)."""

    __slots__ = ("vmap_fails", "copy_inputs", "op", "direct", "redirect", "may_redirect")

    def __init__(self, fn: Any = None, may_redirect: bool = False) -> None:
        self.vmap_fails = False
        self.copy_inputs = False
        self.op = is_torch_op(fn)
        self.direct: dict[tuple, bool] = {}
        self.redirect: dict[tuple, _redirect.Plan | None] = {}
        self.may_redirect = may_redirect


def _direct_key(tensors: Sequence[Any], out: Any) -> tuple | None:
    """The key of `BatchingState.direct` for one call (None: not a one-output call)."""
    if not isinstance(out, (np.ndarray, torch.Tensor)):
        return None
    return (*(t.dtype if isinstance(t, torch.Tensor) else type(t) for t in tensors),
            out.dtype)


def _run_op(fn: Any, tensors: Sequence[Any], out: Any, state: BatchingState) -> bool:
    """Run torch operator `fn` writing into `out` (XLA's buffer) if that is known to
    give exactly what an ordinary call would; False if the caller must run it."""
    key = _direct_key(tensors, out)
    if key is None or not state.direct.get(key, False):
        return False
    target = out if isinstance(out, torch.Tensor) else to_torch(out)
    try:
        fn(*tensors, out=target)
    except TypeError:  # no out= overload for these arguments (torch.sum(x)): run it plainly
        state.direct[key] = False
        return False
    return True


def _learn_op(tensors: Sequence[Any], value: Any, out: Any, state: BatchingState) -> None:
    """After an ordinary call of a torch operator: may the next call write into `out`?"""
    key = _direct_key(tensors, out)
    if key is None or key in state.direct:
        return
    want = out.dtype if isinstance(out, torch.Tensor) else SAME_MEMORY_DTYPES.get(out.dtype)
    state.direct[key] = type(value) is torch.Tensor and value.dtype is want and \
        tuple(value.shape) == tuple(out.shape) and not value.requires_grad


def _tensors(leaves: Sequence[Any], copy: bool) -> list[Any]:
    """The leaves as tensors of their own (NumPy views become tensors sharing their
    memory; tensors of XLA's device buffers, on the device path, become aliases: the
    checks after the call count references to exactly these objects)."""
    if copy:  # NumPy's copy: torch's clone runs on its intra-op threads, which cost
        # 10-50x a memcpy when another process holds a core (their barrier spins)
        return [to_torch(np.array(x)) if isinstance(x, np.ndarray)
                else x.clone() if isinstance(x, torch.Tensor) else x for x in leaves]
    return [to_torch(x) if type(x) is np.ndarray
            else x.detach() if isinstance(x, torch.Tensor) else x for x in leaves]


def _check_after_call(name: str, tensors: list[Any], state: BatchingState) -> None:
    """What the function did with its inputs. Torch counts in-place writes per tensor:
    one that wrote into an input wrote into XLA's (read-only) buffer. A tensor it kept
    (in a global, a closure, an attribute) would outlive the XLA buffer it views."""
    for i in range(len(tensors)):
        t = tensors[i]
        if type(t) is torch.Tensor and (t._version or sys.getrefcount(t) > 3):
            if t._version:
                raise ForeignCallError(
                    f"jaxbridge.torch: function {name!r} modified input leaf {i} in place; "
                    f"its inputs are zero-copy views of XLA's buffers and must not be "
                    f"written (XLA's input buffer now holds the modified values). Clone "
                    f"first (x = x.clone()) or use the out-of-place op (x.add(1), not "
                    f"x.add_(1)).")
            if not state.copy_inputs:
                del t
                _release_kept(name, tensors, state)


def _release_kept(name: str, tensors: list[Any], state: BatchingState) -> None:
    """Move kept tensors, and every tensor sharing their memory, to a private copy of
    their data (so they stay valid), switch the function to copies, and say so once.
    (A kept *view* of an input alone, such as ``x[0]``, is not seen here: the host-call
    runtime catches it as a kept input instead, and that view must not be used.)"""
    kept = [i for i in range(len(tensors))
            if type(tensors[i]) is torch.Tensor and sys.getrefcount(tensors[i]) > 2]
    if not kept:
        return
    for i in kept:
        move_to_private_memory(tensors[i])
    state.copy_inputs = True
    raise KeptViewError(
        f"jaxbridge.torch: function {name!r} kept input tensor(s) {kept} after returning. "
        f"Its inputs are zero-copy views of XLA's buffers, valid only during the call; "
        f"jaxbridge moved the kept tensors, and the views of them, to a private copy of "
        f"their data, so they stay valid, and from now on this function gets copies of "
        f"its inputs (slower). Clone what you keep (x.clone()).")


def write_results(name: str, value: Any, out: Any) -> None:
    """Copy torch's results into XLA's output buffers (`out`, the declared structure:
    NumPy views, or tensors of XLA's device buffers on the device path)."""
    if type(out) is np.ndarray:  # fast path: one result
        _write_one(name, "output", value, out)
        return
    if type(out) is list and type(value) is list and len(value) == len(out) and \
            all(type(o) is np.ndarray for o in out):  # a list of results (VJP calls):
        for i, (v, o) in enumerate(zip(value, out)):  # the same structure, unflattened
            _write_one(name, f"output leaf {i}", v, o)
        return
    outs, out_tree = jax.tree_util.tree_flatten(out)
    values, tree = jax.tree_util.tree_flatten(value)
    declared: Any = out_tree
    if tree != declared:
        raise ResultMismatchError(
            f"jaxbridge.torch: function {name!r} returned a pytree of structure {tree}, but "
            f"{out_tree} was declared (or found when tracing it)", function=name,
            what="output", problem="structure", declared=str(out_tree), received=str(tree))
    for i, (v, o) in enumerate(zip(values, outs)):
        _write_one(name, f"output leaf {i}", v, o)


def _write_one(name: str, what: str, value: Any, out: Any) -> None:
    """`value` into `out`: a NumPy view of XLA's buffer, or on the device path a tensor
    viewing XLA's device buffer (the copy then runs on XLA's stream)."""
    if not isinstance(value, torch.Tensor):
        _bad_result(name, value, out)
    if value.shape != out.shape:
        _mismatch(name, what, value, out)
    if isinstance(out, torch.Tensor):
        if value.dtype != out.dtype:
            _check_cast(name, what, value, out)
        out.copy_(value)
        return
    if value.dtype is SAME_MEMORY_DTYPES.get(out.dtype):
        try:  # NumPy's copy is cheaper than wrapping `out` for torch's (~0.5 us a call);
            out[...] = value.numpy()  # the same dtype (checked), so nothing is cast
            return
        except (RuntimeError, TypeError):  # requires grad, conjugate bit, ...
            pass
    target = to_torch(out)
    if value.dtype != target.dtype:
        _check_cast(name, what, value, out)
    target.copy_(value)


def _declared(out: Any) -> np.dtype:
    """The NumPy dtype of an output buffer (a NumPy view or a device tensor)."""
    return numpy_dtype(out.dtype, "jaxbridge.torch") if isinstance(out, torch.Tensor) \
        else out.dtype


def _bad_result(name: str, value: Any, out: Any) -> None:
    declared = _declared(out)
    raise ResultMismatchError(
        f"jaxbridge.torch: function {name!r} must return torch tensors; got "
        f"{type(value).__name__} where {declared.name}{list(out.shape)} was expected",
        function=name, what="output", problem="type", declared=str(declared),
        received=type(value).__name__)


def _check_cast(name: str, what: str, value: torch.Tensor, out: Any) -> None:
    """Only JAX's own canonicalization is applied silently (int64 -> int32 and
    float64 -> float32 without jax_enable_x64); any other dtype difference is an error."""
    declared = _declared(out)
    if numpy_dtype(value.dtype, f"jaxbridge.torch: {what} of {name!r}") == declared:
        return
    raise ResultMismatchError(
        f"jaxbridge.torch: {what} of function {name!r} has dtype {value.dtype}, but "
        f"{declared.name} was declared; nothing is cast silently: return that dtype "
        f"(value.to(...)) or declare the one it has", function=name, what=what,
        problem="dtype", declared=declared.name, received=str(value.dtype))


def _mismatch(name: str, what: str, value: torch.Tensor, out: Any) -> None:
    raise ResultMismatchError(
        f"jaxbridge.torch: {what} of function {name!r} has shape {list(value.shape)}, but "
        f"{list(out.shape)} was declared (or found when tracing it on meta tensors). Pass "
        f"result= if its shape depends on the data.", function=name, what=what,
        problem="shape", declared=str(list(out.shape)), received=str(list(value.shape)))


def _cap_threads() -> int:
    """Torch's intra-op threads follow the host call's thread budget, as BLAS's do
    (`jaxbridge._foreign.threads`) for one call; returns the count to restore afterwards,
    0 where nothing was changed."""
    cap = threads.budget()
    before = torch.get_num_threads() if cap else 0
    if before > cap:
        torch.set_num_threads(cap)
        return before
    return 0


def _restore_threads(before: int) -> None:
    if before:
        torch.set_num_threads(before)


def run_host(name: str, call: Callable[[list[Any]], Any], leaves: Sequence[Any], out: Any,
             batch_depth: int, batching: BatchingState, op: Any = None,
             rng_state: Any = None) -> None:
    """Run `call` (the wrapped function, on the list of its argument leaves, as tensors)
    on `leaves` (NumPy views, and static leaves) and write its results into `out`.

    With `batch_depth > 0` every leaf carries that many leading batch axes (JAX's vmap):
    the function runs once under nested `torch.vmap`, or, for one that torch.vmap cannot
    batch (data-dependent control flow, `.item()`, in-place updates), once per element.

    `op`: the torch operator that `call` applies to the leaves as they are (no static
    arguments), run with ``out=`` where that is known to be exact.

    `rng_state`: for a function that draws random numbers, XLA's buffer for the
    generators' state before the call (per element when batched: the elements run one
    by one, as torch.vmap refuses random operations).
    """
    tensors = _tensors(leaves, batching.copy_inputs)
    before = _cap_threads()
    # Grad mode is left as it is (switching it costs ~2 us a call): the tensors lent to
    # `call` do not require grad, so torch records no graph of them.
    try:
        if rng_state is not None and batch_depth == 0:
            _rng.capture_into(rng_state)
        if rng_state is not None and batch_depth > 0:
            _run_loop(name, call, tensors, out, batch_depth, rng_state)
        elif batch_depth == 0 and op is None and batching.may_redirect and \
                _redirect.worth_trying(out):
            _run_large(name, lambda: call(tensors), tensors, out, batching)
        elif batch_depth == 0:
            if not (op is not None and _run_op(op, tensors, out, batching)):
                value = call(tensors)
                if op is not None:
                    _learn_op(tensors, value, out, batching)
                write_results(name, value, out)
                del value
        else:
            _run_batched(name, call, tensors, out, batch_depth, batching)
        _check_after_call(name, tensors, batching)
    finally:
        _restore_threads(before)


def run_keeping_graph(name: str, call: Callable[[list[Any]], Any], leaves: Sequence[Any],
                      out: Any, token: Any, rng_state: Any = None) -> None:
    """`run_host` for an unbatched forward call that JAX differentiates in reverse mode:
    `call` runs with autograd on, on private copies of the leaves (nothing the graph
    saves may point into XLA's buffers, which are reused after the call), its results
    are copied into `out`, and the graph is kept for the VJP call (`_graphs`), whose
    token goes into XLA's buffer `token`."""
    copies = _tensors(leaves, copy=True)
    inputs = [t.requires_grad_() if isinstance(t, torch.Tensor)
              and (t.is_floating_point() or t.is_complex()) else None for t in copies]
    before = _cap_threads()
    try:
        if rng_state is not None:
            _rng.capture_into(rng_state)
        with torch.enable_grad():
            value = call(copies)
        outputs = jax.tree_util.tree_leaves(value)
        write_results(name, value.detach() if type(value) is torch.Tensor else
                      jax.tree_util.tree_map(
                          lambda v: v.detach() if isinstance(v, torch.Tensor) else v, value),
                      out)
        kept = any(isinstance(o, torch.Tensor) and o.requires_grad for o in outputs)
        token[...] = _graphs.keep(inputs, outputs) if kept else _graphs.NONE
    finally:
        _restore_threads(before)


def run_one(name: str, fn: Callable[..., Any], a: np.ndarray, out: Any,
            state: BatchingState) -> None:
    """`run_host` for the commonest call, one array argument and one result, unbatched,
    with the per-call work pared down (a host call of a 1-element op costs a few us)."""
    if state.copy_inputs:
        run_host(name, lambda ts: fn(*ts), (a,), out, 0, state, fn if state.op else None)
        return
    x = to_torch(a)
    before = _cap_threads()
    try:
        if not state.op and state.may_redirect and _redirect.worth_trying(out):
            _run_large(name, lambda: fn(x), [x], out, state)
        elif not (state.op and _run_op(fn, (x,), out, state)):
            value = fn(x)
            if state.op:
                _learn_op((x,), value, out, state)
            if type(out) is np.ndarray:
                _write_one(name, "output", value, out)
            else:
                write_results(name, value, out)
            del value
        if x._version or sys.getrefcount(x) > 2:
            tensors = [x]
            del x
            _check_after_call(name, tensors, state)
    finally:
        _restore_threads(before)


def _run_large(name: str, call: Callable[[], Any], tensors: list[Any], out: np.ndarray,
               state: BatchingState) -> None:
    """One unbatched call with one large result: the first call per signature learns
    which operation makes the result; later ones have it write into `out` (`_redirect`),
    falling back to the copy for good at the first surprise."""
    key = _redirect.plan_key(tensors, out)
    if key not in state.redirect:
        value, state.redirect[key] = _redirect.learn(call, out)
        _write_one(name, "output", value, out)
        return
    plan = state.redirect[key]
    if plan is None or _redirect.overlaps_inputs(tensors, out):
        _write_one(name, "output", call(), out)
        return
    value, written, moved = _redirect.run_redirected(call, out, plan)
    if moved or not written:  # a surprise, or kept memory (moved, still valid): copy
        state.redirect[key] = None  # from now on
    if not written:
        _write_one(name, "output", value, out)


def _targets(out: Any) -> Any:
    """XLA's output buffers (NumPy views, or device tensors) as torch tensors."""
    if type(out) is np.ndarray:
        return to_torch(out)
    return jax.tree_util.tree_map(
        lambda o: to_torch(o) if isinstance(o, np.ndarray) else o, out)


def run_into_out(name: str, fn: Callable[..., Any], leaves: Sequence[Any], tree: Any,
                 static: dict, out: Any, state: BatchingState) -> None:
    """Run a function of ``wrap(..., out=True)``: it writes its results into `out`
    (XLA's output buffers, as tensors in the declared structure) and returns None.
    The output tensors are lent for the call: who holds them is counted before and
    after (`_holders`), and what the function kept is released (`_release_targets`)."""
    tensors = _tensors(leaves, state.copy_inputs)
    targets = _targets(out)
    lent = (targets,) if type(targets) is torch.Tensor else jax.tree_util.tree_leaves(targets)
    memory = [memory_of(t) for t in lent]
    held = _holders(lent, memory)
    before = _cap_threads()
    try:
        value = fn(*jax.tree_util.tree_unflatten(tree, tensors), out=targets, **static)
        if value is not None:
            raise ResultMismatchError(
                f"jaxbridge.torch: function {name!r} was wrapped with out=True, so it must "
                f"write its results into `out` and return None; it returned "
                f"{type(value).__name__}", function=name, what="output", problem="type",
                declared="None", received=type(value).__name__)
        if _holders(lent, memory) != held:
            _release_targets(name, lent, memory, held)
        _check_after_call(name, tensors, state)
    finally:
        _restore_threads(before)


def _holders(lent: Sequence[torch.Tensor], memory: list[int]) -> list[int]:
    """Who holds the tensors `lent`, whose memory has the handles `memory`: per tensor,
    the tensors sharing its memory, and the references to it. Counted the same way (no
    iterator holding a tensor) before and after a call, the counts compare."""
    counts: list[int] = []
    for i in range(len(lent)):
        counts += (memory_users(memory[i]), sys.getrefcount(lent[i]))
    return counts


def _release_targets(name: str, lent: Sequence[torch.Tensor], memory: list[int],
                     held: list[int]) -> None:
    """A function of ``out=True`` must not keep the output tensors it was lent, nor
    tensors sharing their memory: they are XLA's buffers. What was kept moves to
    private memory, so it stays valid, and the call fails."""
    now = _holders(lent, memory)
    kept = [i for i in range(len(lent)) if now[2 * i:2 * i + 2] != held[2 * i:2 * i + 2]]
    for i in kept:
        move_to_private_memory(lent[i])
    raise KeptViewError(
        f"jaxbridge.torch: function {name!r} (out=True) kept output tensor(s) {kept}, or "
        f"views of them, after returning. They are XLA's output buffers, valid only during "
        f"the call; jaxbridge moved what was kept to a private copy, so it stays valid. "
        f"Clone what you keep (out.clone()).")


def _run_batched(name: str, call: Callable[[list[Any]], Any], tensors: list[Any], out: Any,
                 depth: int, batching: BatchingState) -> None:
    if not batching.vmap_fails:
        batched = call
        # Static (non-tensor) leaves are not batched: torch.vmap must be told so.
        in_dims = ([0 if isinstance(t, torch.Tensor) else None for t in tensors],)
        for _ in range(depth):
            batched = torch.vmap(batched, in_dims=in_dims)
        try:
            value = batched(tensors)
        except Exception:  # noqa: BLE001 - not vmappable: loop (a real error recurs there)
            _run_loop(name, call, tensors, out, depth)
            batching.vmap_fails = True  # the loop worked where torch.vmap did not
            return
        write_results(name, value, out)
        return
    _run_loop(name, call, tensors, out, depth)


def _run_loop(name: str, call: Callable[[list[Any]], Any], tensors: list[Any], out: Any,
              depth: int, rng_state: Any = None) -> None:
    arrays = [t for t in tensors if isinstance(t, torch.Tensor)]
    if not arrays:
        return
    batch_shape = tuple(arrays[0].shape[:depth])
    outs, out_tree = jax.tree_util.tree_flatten(out)
    for index in itertools.product(*(range(n) for n in batch_shape)):
        at: tuple[Any, ...] = (*index, ...)  # `...` keeps 0-d elements views
        element = [t[at] if isinstance(t, torch.Tensor) else t for t in tensors]
        if rng_state is not None:
            _rng.capture_into(rng_state[at])
        write_results(name, call(element),
                      jax.tree_util.tree_unflatten(out_tree, [o[at] for o in outs]))
