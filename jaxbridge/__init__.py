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
