"""C++/CUDA XLA FFI kernels as differentiable JAX functions: `jaxbridge.kernel`.

api.py (Kernel, kernel) -> signature.py (KernelSpec: what kernel() was given, frozen;
CallAvals: one call's inputs, outputs and residuals; KernelSignature: one call, the
parameter of the derivative pair) -> attributes.py (FFI attribute types), bindings.py
(the attributes a handler binds, read from its C++), guard.py (guarded outputs) and
registry.py (target names and their registration with XLA).
"""

from .api import Kernel, get_include, kernel, kernel_pair
from .registry import register_target

__all__ = ["Kernel", "get_include", "kernel", "kernel_pair", "register_target"]
