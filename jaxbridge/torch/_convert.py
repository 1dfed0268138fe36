"""NumPy views of XLA's buffers <-> torch tensors, without copying.

The host-call runtime lends the wrapped function zero-copy NumPy views of XLA's
buffers; `torch.from_numpy` shares their memory, so torch reads XLA's inputs in place
and writes its results straight into XLA's output buffers. NumPy has no bfloat16 of its
own (ml_dtypes provides one, which torch does not know), so a bfloat16 buffer is viewed
as int16 and reinterpreted by torch as bfloat16: still the same memory.
"""

from __future__ import annotations

import warnings
from typing import Any

import jax
import ml_dtypes
import numpy as np
import torch

__all__ = ["SAME_MEMORY_DTYPES", "to_torch", "torch_dtype", "numpy_dtype", "struct_of"]

_BFLOAT16 = np.dtype(ml_dtypes.bfloat16)

_NUMPY_TO_TORCH = {
    np.dtype(np.bool_): torch.bool,
    np.dtype(np.int8): torch.int8, np.dtype(np.int16): torch.int16,
    np.dtype(np.int32): torch.int32, np.dtype(np.int64): torch.int64,
    np.dtype(np.uint8): torch.uint8, np.dtype(np.uint16): torch.uint16,
    np.dtype(np.uint32): torch.uint32, np.dtype(np.uint64): torch.uint64,
    np.dtype(np.float16): torch.float16, _BFLOAT16: torch.bfloat16,
    np.dtype(np.float32): torch.float32, np.dtype(np.float64): torch.float64,
    np.dtype(np.complex64): torch.complex64, np.dtype(np.complex128): torch.complex128,
}
_TORCH_TO_NUMPY = {t: n for n, t in _NUMPY_TO_TORCH.items()}
# dtypes whose tensors `Tensor.numpy()` shows as NumPy arrays (not bfloat16).
SAME_MEMORY_DTYPES = {n: t for n, t in _NUMPY_TO_TORCH.items() if n != _BFLOAT16}

# `torch.from_numpy` warns (once per process, from C++) that an input view is read-only:
# XLA's input buffers are lent read-only on purpose. Spend that one warning here, silently,
# so users never see it; a function that writes into its inputs is caught after the call
# instead (see _host.check_inputs_unchanged).
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    _readonly = np.zeros(1, np.float32)
    _readonly.flags.writeable = False
    torch.from_numpy(_readonly)
    del _readonly


def to_torch(a: np.ndarray) -> torch.Tensor:
    """A torch tensor sharing `a`'s memory (bfloat16 through an int16 view)."""
    if a.dtype == _BFLOAT16:
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


def torch_dtype(dtype: Any, where: str) -> torch.dtype:
    """The torch dtype of a NumPy/JAX dtype, or a TypeError naming `where`."""
    found = _NUMPY_TO_TORCH.get(np.dtype(dtype))
    if found is None:
        raise TypeError(f"{where}: torch has no dtype for {np.dtype(dtype).name}; supported: "
                        f"{sorted(d.name for d in _NUMPY_TO_TORCH)}")
    return found


def numpy_dtype(dtype: torch.dtype, where: str) -> np.dtype:
    """The NumPy dtype of a torch dtype, as JAX holds it (int64 becomes int32 unless
    jax_enable_x64 is on: torch's results are cast on the way into XLA's buffer)."""
    found = _TORCH_TO_NUMPY.get(dtype)
    if found is None:
        raise TypeError(f"{where}: torch dtype {dtype} has no JAX equivalent; return one of "
                        f"{sorted(str(t) for t in _TORCH_TO_NUMPY)}")
    return np.dtype(jax.dtypes.canonicalize_dtype(found))


def struct_of(t: Any, where: str) -> jax.ShapeDtypeStruct:
    """The JAX shape and dtype of a torch tensor returned by the wrapped function."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{where}: the wrapped function must return torch tensors (in any "
                        f"pytree); got {type(t).__name__}")
    return jax.ShapeDtypeStruct(tuple(t.shape), numpy_dtype(t.dtype, where))
