"""jaxbridge: make opaque NumPy/SciPy and C++/CUDA code differentiable JAX functions.

Example:
    >>> import jaxbridge as jb
    >>> @jb.foreign(lambda x: x)
    ... def host_sin(x):
    ...     return np.sin(x)
"""

from ._foreign import ForeignFunction as ForeignFunction
from ._foreign import custom_gradient as custom_gradient
from ._foreign import foreign as foreign
from ._hostcall import ForeignCallError as ForeignCallError
from ._info import __version__ as __version__
from ._info import info as info
from ._rules import MissingRuleError as MissingRuleError
from ._kernel import Kernel as Kernel
from ._kernel import KernelError as KernelError
from ._kernel import get_include as get_include
from ._kernel import kernel as kernel
from ._kernel import register_target as register_target
from . import cpp as cpp  # noqa: E402
from . import ops as ops  # noqa: E402
