"""The one module that touches torch's private API (checked against torch 2.13).

* `TorchDispatchMode` (``torch.utils._python_dispatch``): runs Python at every aten
  call; `_redirect`'s modes build on it.
* `memory_of`, `memory_users`, `move_to_private_memory`: how many tensors share a
  tensor's memory (the StorageImpl's use count: views, ``detach()``, slices, and the
  tensor behind a ``.numpy()`` array all count), and a swap of that memory for a
  private copy that every one of those tensors sees at once (the StorageImpl's data
  pointer is exchanged with a clone's; ``Tensor.set_`` would move one tensor only). A
  NumPy array or DLPack capsule made from such a tensor keeps the old address: no swap
  reaches it.
"""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["TorchDispatchMode", "memory_of", "memory_users", "move_to_private_memory"]


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
    storage._swap_data_ptr_(private)  # type: ignore[attr-defined]  # `private` drops the old
