"""`jaxbridge.torch`: PyTorch functions and modules as differentiable JAX functions.

* :func:`wrap` -- a torch function of tensors becomes a JAX function that works under
  `jit`, `grad`, `jvp`, `vmap`, `hessian`, ... with its derivatives from torch
  (``out=True``: the function writes into XLA's output buffers itself). On a GPU
  shared with torch, calls run on XLA's device buffers and CUDA stream (DLPack).
* :func:`wrap_module` -- an `nn.Module` becomes ``apply(params, *args)`` and a dict of
  JAX arrays keyed by torch's parameter names, for training with optax.

Needs PyTorch: ``pip install -e ".[torch]"`` in a clone of the repository (pins the
CPU build, torch==2.13.0, on Python 3.11). ``import jaxbridge`` never imports torch;
this module does.
"""

from __future__ import annotations

try:
    import torch as _torch  # noqa: F401 - fail here, with the fix, if torch is missing
except ImportError as _error:
    raise ImportError(
        "jaxbridge.torch needs PyTorch, which is not installed. Install it with "
        "`pip install -e \".[torch]\"` in a clone of the repository (on Python 3.11 this pins "
        "torch==2.13.0, the CPU build; an unpinned `pip install torch` may download a CUDA "
        "build of several GB)."
    ) from _error

from ._module import wrap_module
from ._wrap import TorchFunction, wrap

__all__ = ["TorchFunction", "wrap", "wrap_module"]
