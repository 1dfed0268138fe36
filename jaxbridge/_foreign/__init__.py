"""Host (NumPy/SciPy) functions as differentiable JAX functions: `jaxbridge.foreign`.

api.py (ForeignFunction, foreign, custom_gradient) -> signature.py (frozen definitions
and call signatures) -> runners.py (calling user code, checking what it returns) and
hostcall.py (the native trampoline or jax.pure_callback).
"""

from .api import ForeignFunction, custom_gradient, foreign

__all__ = ["ForeignFunction", "custom_gradient", "foreign"]
