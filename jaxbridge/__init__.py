"""jaxbridge: make opaque NumPy/SciPy and C++/CUDA code differentiable JAX functions.

* `foreign` / `ForeignFunction` / `custom_gradient`: host (NumPy/SciPy) functions
  with user derivative rules.
* `kernel` / `Kernel` / `register_target` / `get_include`: XLA FFI (C++/CUDA) kernels
  with forward, VJP and JVP kernels; `cpp.load` compiles them at run time.
* `ops`: built-in kernels. `scipy`: differentiable SciPy solvers. `testing`: a checker
  for derivative rules. `errors`: every exception. `info()`: what this install can do.

Example:
    >>> import numpy as np, jaxbridge as jb
    >>> @jb.foreign(lambda x: x)
    ... def host_sin(x):
    ...     return np.sin(x)
"""

from . import cpp as cpp  # noqa: E402
from . import errors as errors
from . import ops as ops  # noqa: E402
from ._foreign import ForeignFunction as ForeignFunction
from ._foreign import custom_gradient as custom_gradient
from ._foreign import foreign as foreign
from ._info import __version__ as __version__
from ._info import info as info
from ._kernel import Kernel as Kernel
from ._kernel import get_include as get_include
from ._kernel import kernel as kernel
from ._kernel import register_target as register_target
from .errors import ForeignCallError as ForeignCallError
from .errors import KernelError as KernelError
from .errors import MissingRuleError as MissingRuleError
