"""`jaxbridge.info()` and ``python -m jaxbridge``: what this installation can do."""

from __future__ import annotations

import platform
import sys

import jax
import numpy as np

from ._core import extensions, jaxapi
from ._foreign import hostcall

__version__ = "0.1.0"


def info() -> dict[str, object]:
    """Versions and capabilities of this installation.

    `python -m jaxbridge` prints it with a one-line verdict.

    Returns:
      A dict: ``jaxbridge``, ``jax``, ``jaxlib``, ``numpy``, ``python`` and
      ``platform`` (versions); ``location`` (where the package was imported from);
      ``native`` (the host-call trampoline loaded) with ``native_error`` (why not) and
      ``native_platforms``; ``cuda_built``; ``kernels`` (the built-in kernels loaded)
      with ``kernels_error``; ``jax_backend``; ``host_call_default`` (the backend
      ``jb.foreign(backend="auto")`` uses).

    Example:
        >>> import jaxbridge
        >>> jaxbridge.info()["native"]
        True
    """
    native = extensions.load("_hostcall")
    return {
        "jaxbridge": __version__,
        "location": str(extensions.PACKAGE_DIR),
        "jax": jax.__version__,
        "jaxlib": jaxapi.jaxlib_version(),
        "numpy": np.__version__,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "native": native is not None,
        "native_error": extensions.missing_reason("_hostcall"),
        "native_platforms": sorted(hostcall.native_platforms()),
        "cuda_built": bool(native is not None and native.with_cuda),
        "kernels": extensions.load("_builtin") is not None,
        "kernels_error": extensions.missing_reason("_builtin"),
        "jax_backend": jax.default_backend(),
        "host_call_default": hostcall.default_backend(),
    }


def verdict(report: dict[str, object]) -> tuple[bool, str]:
    """(ok, one line) summing up `info()`."""
    if not report["native"] or not report["kernels"]:
        missing = [n for n in ("native", "kernels") if not report[n]]
        reason = report["native_error"] or report["kernels_error"]
        return False, (f"NOT OK: compiled extension(s) missing ({', '.join(missing)}): "
                       f"{reason}")
    gpu = " and CUDA" if report["cuda_built"] else ""
    return True, (f"OK: jaxbridge {report['jaxbridge']} with native host calls and built-in "
                  f"kernels for CPU{gpu} (JAX {report['jax']}, backend {report['jax_backend']})")


def main() -> int:
    """Print :func:`info` and a one-line verdict (``python -m jaxbridge``)."""
    report = info()
    for key, value in report.items():
        if value is not None:
            print(f"{key:>18}: {value}")
    ok, line = verdict(report)
    print(line)
    return 0 if ok else 1
