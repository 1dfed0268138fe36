"""`jaxbridge.info()`: what this installation can do."""

from __future__ import annotations

import platform
import sys

import jax
import jaxlib
import numpy as np

from . import _hostcall

__version__ = "0.1.0"


def info() -> dict[str, object]:
    """Versions and capabilities of this installation.

    Example:
        >>> import jaxbridge
        >>> jaxbridge.info()["native"]
        True
    """
    native = _hostcall._native
    return {
        "jaxbridge": __version__,
        "jax": jax.__version__,
        "jaxlib": jaxlib.__version__,
        "numpy": np.__version__,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "native": native is not None,
        "native_error": _hostcall.NATIVE_IMPORT_ERROR,
        "native_platforms": sorted(_hostcall.native_platforms()),
        "cuda_built": bool(native is not None and native.with_cuda),
        "kernels": _kernels_available(),
        "jax_backend": jax.default_backend(),
        "host_call_default": _hostcall.default_backend(),
    }


def _kernels_available() -> bool:
    from . import ops  # late import: ops imports the kernel extension

    return bool(ops.available())


def main() -> None:
    """Print :func:`info` (``python -m jaxbridge``)."""
    for key, value in info().items():
        print(f"{key:>18}: {value}")
