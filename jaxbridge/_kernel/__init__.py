"""C++/CUDA XLA FFI kernels as differentiable JAX functions: `jaxbridge.kernel`.

api.py (Kernel, kernel, the call signature of the derivative pair) and registry.py
(target names and their registration with XLA).
"""

from .api import Kernel, get_include, kernel, kernel_pair
from .registry import register_target

__all__ = ["Kernel", "get_include", "kernel", "kernel_pair", "register_target"]
