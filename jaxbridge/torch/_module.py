"""`jaxbridge.torch.wrap_module`: an `nn.Module` as a pure function of its parameters."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any, Literal

import jax
import jax.numpy as jnp
import torch

from ._convert import numpy_dtype
from ._wrap import TorchFunction

__all__ = ["wrap_module"]


def _to_jax(t: torch.Tensor, where: str) -> Any:
    value = t.detach().cpu()
    if value.dtype == torch.bfloat16:  # NumPy has no bfloat16: go through float32
        return jnp.asarray(value.float().numpy()).astype(jnp.bfloat16)
    return jnp.asarray(value.numpy().astype(numpy_dtype(value.dtype, where), copy=False))


def _state(buffers: dict) -> dict:
    """Private copies of the buffers, outside autograd: buffers are state, not parameters
    (torch gives them no gradient, and ops such as batch norm refuse to differentiate
    with respect to their running statistics, which the VJP rule would otherwise ask)."""
    return {k: v.detach().clone() for k, v in buffers.items()}


class _Slots:
    """Where each of a module's tensors lives, for swapping in a call's tensors and back
    (what `torch.func.functional_call` does, without finding the places again on every
    call: that search cost 0.2-0.3 ms a call on a five-layer MLP, 15% of a training
    step). A name given is swapped at every place holding the same tensor (tied weights,
    as functional_call's default). The places are found again whenever the module's
    modules or tensors are other objects than when they were found: every entry of every
    submodule's `_modules`, `_parameters` and `_buffers` table is checked to be the object
    it was, and every table to have as many entries (a few us; walking `modules()` for a
    fingerprint cost 20 us a call)."""

    def __init__(self, module: torch.nn.Module):
        self.module = module
        self.entries: list[tuple[dict, str, Any]] = []  # (table, key, what it held)
        self.sizes: list[tuple[dict, int]] = [({}, -1)]  # never valid before `_find`
        self.places: dict[str, list[tuple[dict, str]]] = {}

    def _unchanged(self) -> bool:
        return all(len(table) == n for table, n in self.sizes) and \
            all(table.get(key) is held for table, key, held in self.entries)

    def swap(self, tensors: Mapping[str, torch.Tensor]) -> list[tuple[dict, str, Any]]:
        """Put `tensors` in place; returns what `restore` needs."""
        if not self._unchanged():
            self.places = self._find()
        saved = []
        try:
            for name, tensor in tensors.items():
                for table, attr in self.places[name]:
                    saved.append((table, attr, table[attr]))
                    table[attr] = tensor
        except BaseException:
            self.restore(saved)
            raise
        return saved

    @staticmethod
    def restore(saved: list[tuple[dict, str, Any]]) -> None:
        for table, attr, tensor in reversed(saved):
            table[attr] = tensor

    def _find(self) -> dict[str, list[tuple[dict, str]]]:
        by_tensor: dict[int, list[tuple[dict, str]]] = {}
        names: dict[str, int] = {}
        tables = [table for owner in self.module.modules()  # each module once
                  for table in (owner._modules, owner._parameters, owner._buffers)]
        self.sizes = [(table, len(table)) for table in tables]
        self.entries = [(table, key, held) for table in tables for key, held in table.items()]
        for prefix, owner in self.module.named_modules(remove_duplicate=False):
            for table in (owner._parameters, owner._buffers):
                for attr, tensor in table.items():
                    if tensor is None:
                        continue
                    by_tensor.setdefault(id(tensor), []).append((table, attr))
                    names[f"{prefix}.{attr}" if prefix else attr] = id(tensor)
        return {name: by_tensor[key] for name, key in names.items()}


class ModuleApply:
    """``apply(params, *args, buffers=None)`` of a wrapped module; see :func:`wrap_module`."""

    def __init__(self, module: torch.nn.Module, vmap: str, redirect: bool):
        where = "jaxbridge.torch.wrap_module"
        self.module = module
        self.training = module.training
        self.param_names = tuple(n for n, _ in module.named_parameters())
        self.buffers = {n: _to_jax(b, where) for n, b in module.named_buffers()}
        self.__name__ = type(module).__name__
        # A call swaps the module's tensors for its own and back (`_Slots`): calls that
        # run at once (one per shard, on XLA's threads) would see each other's tensors,
        # and one would put the other's back for good. They take turns.
        self._turns = threading.RLock()
        self._slots = _Slots(module)
        self._stateless = TorchFunction(self._call_stateless, vmap=vmap, name=self.__name__,
                                        redirect=redirect)
        self._stateful = TorchFunction(self._call_with_buffers, vmap=vmap, name=self.__name__,
                                       redirect=redirect)

    def __repr__(self) -> str:
        mode = "train" if self.training else "eval"
        return f"<jaxbridge.torch module {self.__name__} ({mode} mode)>"

    # ---- torch side
    def _functional(self, params: dict, buffers: dict, args: tuple) -> Any:
        module = self.module
        with self._turns:
            switched = module.training != self.training
            if switched:  # the mode it had when wrapped (compiled programs keep it)
                module.train(self.training)
            saved = self._slots.swap({**params, **buffers})
            try:
                return module(*args)
            finally:
                self._slots.restore(saved)
                if switched:
                    module.train(not self.training)

    def _call_stateless(self, params: dict, buffers: dict, *args: Any) -> Any:
        # Buffers updated in training mode (running statistics) are private copies:
        # XLA's input buffers are never written, and the update is dropped.
        return self._functional(params, _state(buffers), args)

    def _call_with_buffers(self, params: dict, buffers: dict, *args: Any) -> Any:
        new = _state(buffers)
        return self._functional(params, new, args), new

    # ---- JAX side
    def __call__(self, params: Mapping[str, Any], *args: Any,
                 buffers: Mapping[str, Any] | None = None) -> Any:
        if not isinstance(params, Mapping) or set(params) != set(self.param_names):
            got = sorted(params) if isinstance(params, Mapping) else type(params).__name__
            raise ValueError(
                f"jaxbridge.torch: module {self.__name__}: params must be a dict with the "
                f"module's parameter names {sorted(self.param_names)}; got {got}")
        if buffers is None:
            return self._stateless(dict(params), self.buffers, *args)
        # no gradient flows into buffers, as in torch (see _state)
        if not isinstance(buffers, Mapping) or set(buffers) != set(self.buffers):
            got = sorted(buffers) if isinstance(buffers, Mapping) else type(buffers).__name__
            raise ValueError(
                f"jaxbridge.torch: module {self.__name__}: buffers must be a dict with the "
                f"module's buffer names {sorted(self.buffers)}; got {got}")
        return self._stateful(dict(params), jax.lax.stop_gradient(dict(buffers)), *args)


def wrap_module(module: torch.nn.Module, *,
                vmap: Literal["vectorized", "loop"] = "vectorized", redirect: bool = False
                ) -> tuple[Callable[..., Any], dict[str, Any]]:
    """An `nn.Module` as ``apply(params, *args)`` plus its parameters as JAX arrays.

    `params` is a dict keyed by torch's parameter names (``"0.weight"``); `apply` runs
    the module on them as `torch.func.functional_call` does (tied weights included), so
    `jax.grad` with respect to `params` is torch autograd's gradient, and optax can
    train them under `jit`.

    Buffers (BatchNorm's running statistics) travel as a second dict, ``apply.buffers``
    (their values when wrapped). ``apply(params, *args)`` uses those and returns the
    output; in training mode their updates are dropped. To carry the state, pass it:
    ``out, buffers = apply(params, *args, buffers=buffers)`` returns the updated
    buffers too (the values the module would hold after the call), as Flax's
    ``mutable=`` does. Buffers get no gradient (they are state, as in torch, where they
    are not parameters): a gradient with respect to them is zero. The module's
    train/eval mode is the one it had when wrapped; wrap again after
    ``module.train()`` / ``module.eval()``. The module itself is never
    modified (its parameters and buffers are replaced for the call only).
    In training mode, dropout's masks are the forward call's in the backward too (the
    generator state travels with the call), so ``jax.value_and_grad`` gives eager
    torch's loss and gradient on the same seed. `vmap` and `redirect` as in
    :func:`jaxbridge.torch.wrap` (a forward hook that keeps the output is a kept
    alias: leave `redirect` off for such modules).

    Example:
        >>> import jax, jax.numpy as jnp, torch
        >>> from jaxbridge.torch import wrap_module
        >>> net = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Tanh())
        >>> apply, params = wrap_module(net)
        >>> sorted(params)
        ['0.bias', '0.weight']
        >>> x = jnp.ones((4, 3), jnp.float32)
        >>> grads = jax.grad(lambda p: apply(p, x).sum())(params)
        >>> grads["0.weight"].shape
        (2, 3)
    """
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"jaxbridge.torch.wrap_module: expected a torch.nn.Module, got "
                        f"{type(module).__name__}")
    if redirect is not True and redirect is not False:
        raise TypeError(f"jaxbridge.torch.wrap_module: redirect must be True or False, got "
                        f"{redirect!r}")
    apply = ModuleApply(module, vmap, redirect)
    params = {n: _to_jax(p, "jaxbridge.torch.wrap_module")
              for n, p in module.named_parameters()}
    return apply, params


