"""`jaxbridge.scipy.sparse`: see :mod:`jaxbridge.scipy.sparse.linalg`."""

from . import linalg as linalg  # noqa: F401
