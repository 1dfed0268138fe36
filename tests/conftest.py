"""Shared test settings: strict JAX, float64 available, deterministic seeds."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

jax.config.update("jax_enable_x64", True)
jax.config.update("jax_numpy_rank_promotion", "raise")

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

    missing = {name: extensions.missing_reason(name) for name in ("_native", "_kernels")}
    missing = {k: v for k, v in missing.items() if v is not None}
    if missing and os.environ.get(WITHOUT_EXTENSIONS) != "1":
        lines = "\n".join(f"  jaxbridge.{k}: {v}" for k, v in missing.items())
        raise pytest.UsageError(
            f"jaxbridge's compiled extensions are missing, so the tests cannot run:\n{lines}\n"
            f"Fix: build them with `pip install --no-deps -e .` in the repository root (or "
            f"run pytest where the installed package is imported). To run only what works "
            f"without them, set {WITHOUT_EXTENSIONS}=1 (the tests that need them are skipped, "
            f"with the reason).")


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


# The default run must stay under 8 minutes on 2 cores. These tests took 4-30 s each
# (measured with --durations on 2026-11-25, mostly compiling solver programs); they run
# in the slow stage (`pytest -m slow`, which CI runs) instead. A node id that no longer
# exists is harmless; a renamed test simply runs in the default run again.
MOVED_TO_SLOW = frozenset({
    "test_scipy_optimize.py::test_least_squares_value_and_gradient[dogbox-linear]",
    "test_scipy_integrate.py::test_compiled_stepping_is_scipys_algorithm[RK45]",
    "test_scipy_closures.py::test_float32_inputs_keep_their_dtype",
    "test_scipy_events.py::test_cannonball_gradients_vs_finite_differences_of_scipy[RK45]",
    "test_scipy_events.py::test_decay_event_gradients_closed_form[RK45]",
    "test_scipy_integrate.py::test_compiled_gradient_vmaps_as_one_batched_loop",
    "test_scipy_closures.py::test_closure_gradient_equals_args_gradient_under_jit[solve_ivp-partial]",
    "test_scipy_closures.py::test_user_jacobians_may_close_over_traced_values_too",
    "test_scipy_optimize.py::test_minimize_gradients[L-BFGS-B]",
    "test_scipy_integrate.py::test_failure_nan_policy",
    "test_scipy_events.py::test_dense_output_gradients_closed_form[RK45]",
    "test_scipy_events.py::test_cannonball_gradients_vs_finite_differences_of_scipy[Radau]",
    "test_distributed.py::test_two_processes_match_one",
    "test_distributed.py::test_launcher_kills_workers_when_one_crashes",
    "test_scipy_integrate.py::test_gradients_match_pure_jax_rk4[forward]",
    "test_scipy_events.py::test_event_times_and_states_match_scipy[RK45]",
    "test_examples.py::test_example_runs[torch_model.py]",
    "test_scipy_optimize.py::test_least_squares_value_and_gradient[trf-cauchy]",
    "test_scipy_optimize.py::test_deq_gradient_matrix_free_equals_dense",
    "test_scipy_optimize.py::test_least_squares_value_and_gradient[trf-soft_l1]",
    "test_hostcall_runtime.py::test_host_function_calling_jax_inside_scan_and_grad",
    "test_scipy_closures.py::test_fresh_closures_reuse_programs_and_are_collectable",
    "test_docs.py::test_code_blocks[docs/guides/ode-gradients.md]",
    "test_scipy_integrate.py::test_forward_mode_matches_reverse",
    "test_scipy_integrate.py::test_discrete_adjoint_is_exact_for_the_discrete_solution[RK45]",
    "test_scipy_integrate.py::test_gradients_vs_finite_differences[RK45-adjoint]",
    "test_scipy_integrate.py::test_gradients_vs_finite_differences[Radau-adjoint]",
    "test_scipy_integrate.py::test_gradients_vs_finite_differences[BDF-adjoint]",
    "test_testing.py::test_wrong_cotangent_shape_is_caught",
    "test_scipy_integrate.py::test_gradients_vs_finite_differences[RK45-forward]",
    "test_scipy_integrate.py::test_gradients_vs_finite_differences[LSODA-forward]",
    "test_docs.py::test_code_blocks[docs/guides/scipy.md]",
    "test_hostcall_runtime.py::test_exceptions_do_not_leak",
    "test_scipy_integrate.py::test_gradients_vs_finite_differences[LSODA-adjoint]",
    "test_docs.py::test_code_blocks[docs/guides/ode-events.md]",
    "test_scipy_integrate.py::test_gradients_vs_finite_differences[Radau-forward]",
    "test_scipy_integrate.py::test_gradients_vs_finite_differences[BDF-forward]",
    "test_scipy_closures.py::test_closure_gradients_every_transformation[solve_ivp]",
    "test_scipy_optimize.py::test_least_squares_value_and_gradient[trf-linear]",
    "test_examples.py::test_example_runs[neural_ode.py]",
    "test_scipy_integrate.py::test_compiled_stepping_is_scipys_algorithm[RK23]",
    "test_scipy_integrate.py::test_vmap_over_params_and_jitted_training_loop",
    "test_scipy_integrate.py::test_compiled_stepping_is_scipys_algorithm[DOP853]",
    "test_scipy_integrate.py::test_forward_sensitivity_vjp_of_multidim_state_and_pytree_params",
    "test_scipy_integrate.py::test_discrete_adjoint_vs_closed_form_and_finite_differences",
    "test_scipy_integrate.py::test_discrete_adjoint_matches_diffrax_on_a_neural_ode",
    "test_scipy_bvp.py::test_gradients_closed_form_every_transform",
    "test_scipy_special.py::test_erf_family_values_and_derivatives[erfcx-erfcx]",
    "test_examples.py::test_example_runs[projectile_events.py]",
    "test_scipy_optimize.py::test_least_squares_vmap_bounds_and_check_rules",
    "test_scipy_closures.py::test_closure_gradient_equals_args_gradient_under_jit[solve_ivp-lambda]",
    "test_scipy_events.py::test_oscillator_zero_crossings_closed_form_under_vmap",
    "test_hostcall.py::test_many_closures_traced_repeatedly_do_not_leak_callables",
    "test_scipy_sparse.py::test_eigsh_gradients_vs_dense_jax_and_fd",
    "test_scipy_signal.py::test_gradients_all_arguments_match_pure_jax_twin",
    "test_examples.py::test_training_loop_example",
    "test_scipy_integrate.py::test_gradients_match_pure_jax_rk4[adjoint]",
    "test_scipy_sparse.py::test_eigsh_vmap_and_check_rules",
    "test_testing.py::test_scipy_solve_numpy_rules_pass",
    "test_docs.py::test_docstring_examples[jaxbridge.scipy.integrate]",
    "test_torch.py::test_result_declared_and_error_messages",
    "test_scipy_integrate.py::test_failure_raises_solver_error_eager_and_under_jit",
    "test_scipy_integrate.py::test_two_level_checkpointing_gives_the_same_gradient",
    "test_scipy_optimize.py::test_minimize_gradients[BFGS]",
    "test_cpp.py::test_cuda_compile",
    "test_torch.py::test_check_rules_passes_on_a_wrapped_torch_function",
    "test_scipy_integrate.py::test_matches_diffrax_if_installed",
})


@pytest.hookimpl(tryfirst=True)  # before `-m "not slow"` deselects
def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.nodeid.removeprefix("tests/") in MOVED_TO_SLOW:
            item.add_marker(pytest.mark.slow)
