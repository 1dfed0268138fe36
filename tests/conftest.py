"""Shared test settings: strict JAX, float64 available, deterministic seeds."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

jax.config.update("jax_enable_x64", True)
jax.config.update("jax_numpy_rank_promotion", "raise")

#: SciPy's own test files against jaxbridge's drop-ins (`pytest -m scipy_suite -n 2`).
pytest_plugins = ["scipy_suite.plugin"]

#: Set to 1 to run the suite without the compiled extensions (the tests that need them
#: are then skipped, each with the reason); without it a missing extension stops the run.
WITHOUT_EXTENSIONS = "JAXBRIDGE_TESTS_WITHOUT_EXTENSIONS"


def pytest_configure(config):
    """Fail loudly, before collecting anything, when the compiled extensions are missing.

    The usual cause is a source tree without a build (or Python importing the source
    tree instead of the installed package): the host-call tests would then silently
    test the pure_callback fallback and the kernel tests would be skipped.
    """
    from jaxbridge._core import extensions

    missing = {name: extensions.missing_reason(name) for name in ("_hostcall", "_builtin")}
    missing = {k: v for k, v in missing.items() if v is not None}
    if missing and os.environ.get(WITHOUT_EXTENSIONS) != "1":
        lines = "\n".join(f"  jaxbridge.{k}: {v}" for k, v in missing.items())
        raise pytest.UsageError(
            f"jaxbridge's compiled extensions are missing, so the tests cannot run:\n{lines}\n"
            f"Fix: build them with `pip install --no-deps -e .` in the repository root (or "
            f"run pytest where the installed package is imported). To run only what works "
            f"without them, set {WITHOUT_EXTENSIONS}=1 (the tests that need them are skipped, "
            f"with the reason).")


#: Tests over the default run's time budget: marked `budget` and `slow` (see the file's
#: header); CI runs them in a stage of their own (`pytest -m budget -n 2`).
with open(os.path.join(os.path.dirname(__file__), "slow_by_budget.txt")) as _listed:
    SLOW_BY_BUDGET = frozenset(line.strip() for line in _listed
                               if line.strip() and not line.startswith("#"))


@pytest.hookimpl(tryfirst=True)  # before `-m "not slow"` deselects by mark
def pytest_collection_modifyitems(config, items):
    """Mark the tests of `SLOW_BY_BUDGET` budget and slow (the default run deselects
    slow tests)."""
    for item in items:
        node = item.nodeid.split("tests/", 1)[-1]
        if node in SLOW_BY_BUDGET:
            item.add_marker(pytest.mark.budget)
            item.add_marker(pytest.mark.slow)


def extension_missing(name: str) -> str | None:
    """Why `jaxbridge.<name>` did not load (None if it did): for the opt-out's skips."""
    from jaxbridge._core import extensions
    return extensions.missing_reason(name)


@pytest.fixture
def rng():
    return np.random.default_rng(0)


def tol(dtype) -> float:
    """Comparison tolerance for values computed in `dtype`."""
    return {np.dtype("float32"): 2e-5, np.dtype("complex64"): 2e-5}.get(np.dtype(dtype), 1e-12)


def deq_layer(batch, width, seed=0):
    """(W, U, x) of the implicit layer z = tanh(W z + U x) on a batch: W scaled to
    norm ~0.5, so the fixed point exists and is unique (the issue's DEQ benchmark)."""
    k1, k2, k3 = jax.random.split(jax.random.PRNGKey(seed), 3)
    W = jax.random.normal(k1, (width, width)) * 0.5 / np.sqrt(width)
    U = jax.random.normal(k2, (width, width)) / np.sqrt(width)
    x = jax.random.normal(k3, (batch, width))
    return W, U, x


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


def _pinned_to_the_cpu(node) -> bool:
    # Where the CPU is JAX's default already, pinning would only change jit's cache keys
    # (the default device is one of them) and recompile what other tests compiled.
    return (jax.default_backend() != "cpu" and node.get_closest_marker("cpu") is not None
            and node.get_closest_marker("gpu") is None)


def _on_the_cpu(node):
    """JAX's CPU as the default device while `node` runs, if it is marked `cpu`."""
    if not _pinned_to_the_cpu(node):
        yield
        return
    with jax.default_device(jax.devices("cpu")[0]):
        yield


@pytest.fixture(autouse=True, scope="module")
def _cpu_module_on_the_cpu(request):
    """A module marked `cpu` (pytestmark) runs on JAX's CPU device, its module-scoped
    fixtures included, even where a GPU is JAX's default (benchmarks/gpu_session.sh's
    `tests` phase). Such a module must hold no `gpu` test: mark those functions instead."""
    yield from _on_the_cpu(request.node)


@pytest.fixture(autouse=True)
def _cpu_test_on_the_cpu(request):
    """A test marked `cpu` runs on JAX's CPU device: it uses kernels compiled for the CPU
    only, XLA:CPU's own threads, or SciPy's arithmetic reproduced operation for operation
    (XLA:GPU contracts multiply-adds into FMAs)."""
    yield from _on_the_cpu(request.node)


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
