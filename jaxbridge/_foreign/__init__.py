"""Host (NumPy/SciPy) functions as differentiable JAX functions: `jaxbridge.foreign`.

api.py (ForeignFunction, foreign, custom_gradient) -> signature.py (call signatures:
what the derivative pair runs) -> runners.py (calling user code, checking what it
returns) -> definition.py (frozen definitions, the layout of one call) -> hostcall.py
(the native trampoline or jax.pure_callback).
"""

from .api import ForeignFunction, custom_gradient, foreign

__all__ = ["ForeignFunction", "custom_gradient", "foreign"]
