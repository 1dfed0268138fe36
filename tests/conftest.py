"""Shared test settings: strict JAX, float64 available, deterministic seeds."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

jax.config.update("jax_enable_x64", True)
jax.config.update("jax_numpy_rank_promotion", "raise")


@pytest.fixture
def rng():
    return np.random.default_rng(0)


def tol(dtype) -> float:
    """Comparison tolerance for values computed in `dtype`."""
    return {np.dtype("float32"): 2e-5, np.dtype("complex64"): 2e-5}.get(np.dtype(dtype), 1e-12)


def fd(f, x, eps=1e-6):
    """Central differences of scalar f along every coordinate of array x (float64)."""
    x = np.asarray(x, np.float64)
    out = np.zeros(x.shape)
    for i in np.ndindex(x.shape):
        e = np.zeros(x.shape)
        e[i] = eps
        out[i] = (f(jnp.asarray(x + e)) - f(jnp.asarray(x - e))) / (2 * eps)
    return out


def gpu_devices() -> list:
    try:
        return jax.devices("gpu")
    except RuntimeError:
        return []


@pytest.fixture
def gpu():
    """The first GPU; tests that take it are skipped cleanly where there is none.

    JAXBRIDGE_GPU_TESTS_ON_CPU=1 hands them the CPU device instead: a self-check of
    the GPU tests' own logic on a machine without a GPU (it proves nothing about CUDA).
    """
    import os
    if os.environ.get("JAXBRIDGE_GPU_TESTS_ON_CPU") == "1":
        return jax.devices("cpu")[0]
    devices = gpu_devices()
    if not devices:
        pytest.skip("needs a CUDA GPU")
    return devices[0]
