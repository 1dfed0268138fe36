"""The one module that touches torch's private API (checked against torch 2.13).

* `TorchDispatchMode` (``torch.utils._python_dispatch``): runs Python at every aten
  call; `_redirect`'s modes and `RandomDraws` build on it.
* `memory_of`, `memory_users`, `move_to_private_memory`: how many tensors share a
  tensor's memory (the StorageImpl's use count: views, ``detach()``, slices, and the
  tensor behind a ``.numpy()`` array all count), and a swap of that memory for a
  private copy that every one of those tensors sees at once (the StorageImpl's data
  pointer is exchanged with a clone's; ``Tensor.set_`` would move one tensor only). A
  NumPy array or DLPack capsule made from such a tensor keeps the old address: no swap
  reaches it.
* `outside_transforms`, `is_batched`: inside torch.func transforms (vjp, jvp,
  functionalize, vmap) every tensor an operation makes is wrapped for the transform, and
  a wrapper has no memory that ``torch.set_rng_state`` could read; `_rng` handles
  generator states without them, and refuses a state batched by ``torch.vmap``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["TorchDispatchMode", "RandomDraws", "memory_of", "memory_users",
           "move_to_private_memory", "outside_transforms", "is_batched"]


def memory_of(t: torch.Tensor) -> int:
    """A handle on `t`'s memory (the address of its StorageImpl), for `memory_users`:
    valid while `t` lives."""
    return t.untyped_storage()._cdata


def memory_users(memory: int) -> int:
    """How many hold the memory of handle `memory`: the tensors (TensorImpls) sharing
    it, and torch's own references. Compare counts, taken the same way, before and after."""
    return torch._C._storage_Use_Count(memory)


def move_to_private_memory(t: torch.Tensor) -> None:
    """Give `t`'s memory, as every tensor sharing it sees it, a private copy: afterwards
    they all read and write memory of torch's own, holding what `t`'s held."""
    storage = t.untyped_storage()
    private = storage.clone()
    storage._swap_data_ptr_(private)  # type: ignore[attr-defined,unused-ignore]  # `private` drops the old


def outside_transforms() -> Any:
    """A context in which torch operations on plain tensors make plain tensors, even
    inside torch.func transforms."""
    return torch._C._DisableFuncTorch()


def is_batched(t: torch.Tensor) -> bool:
    """Whether `t` is a tensor batched by ``torch.vmap`` (one value per element)."""
    return bool(torch._C._functorch.is_batchedtensor(t))


class RandomDraws(TorchDispatchMode):
    """Notes whether code run under it draws from torch's random generators: an aten
    operation tagged ``nondeterministic_seeded`` (bernoulli, dropout's mask, randn,
    rand_like, normal_, ...). Works on meta tensors, which draw nothing."""

    def __init__(self) -> None:
        super().__init__()
        self.seen = False

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None):
        if not self.seen and torch.Tag.nondeterministic_seeded in func.tags:
            self.seen = True
        return func(*args, **(kwargs or {}))
