"""C++/CUDA XLA FFI kernels as differentiable JAX functions: `jaxbridge.kernel`.

api.py (Kernel, kernel) -> signature.py (KernelSpec: what kernel() was given, frozen;
KernelSignature: one call, the parameter of the derivative pair) -> attributes.py (FFI
attribute types) and registry.py (target names and their registration with XLA).
"""

from .api import Kernel, get_include, kernel, kernel_pair
from .registry import register_target

__all__ = ["Kernel", "get_include", "kernel", "kernel_pair", "register_target"]
