"""Mutation testing of jaxbridge's derivative-bearing modules (cosmic-ray), on what a
change touched, within a time budget. A developer tool: not part of the default test
run or of CI's; results go in tests/MUTATION.md.

    pip install -e ".[mutation]"            # cosmic-ray (a dev tool, not a test dependency)
    python tools/mutation.py                 # modules changed since main, 20 min budget
    python tools/mutation.py --base HEAD~3 --budget-s 3600
    python tools/mutation.py --modules jaxbridge/scipy/special.py --sample 40 --all-functions

For each module: `cosmic-ray init` lists every mutant; mutants outside the module's
derivative rule functions (`RULES`, unless --all-functions) are marked skipped, a random
--sample of the rest is kept (seeded), and `cosmic-ray exec` runs the module's tests
(`TESTS`, stopping at the first failure) once per mutant, for at most the module's share
of the budget. cosmic-ray edits the source file in place and restores it, so the
editable install and its compiled extensions are used as they are: do not edit the
tree, run tests, or run a second copy while it runs (they would import the mutants).
Stopped at the budget, the module is restored from git. Sessions are kept in .mutation/
(git-ignored) for `cr-report` and `cr-html`; the summary printed at the end lists every
survivor with its diff: each is either equivalent (say why in tests/MUTATION.md) or a
missing test.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SESSIONS = ROOT / ".mutation"

_PYTEST = "python -m pytest -x -q -p no:cacheprovider -p no:randomly"

_M = "tests/test_derivative_matrix.py"

#: The derivative-bearing modules and the tests that should kill their mutants:
#: (pytest paths, a `-k` expression or None). Kept tight, because every mutant pays one
#: pytest start (about 10 s of wall time on the shared 2-core machine, most of it
#: importing JAX) plus these tests: the tests that exercise the module's rules, the
#: fastest and most sensitive first (`-x` stops a killed mutant at its first failure).
#: Matrix cells are selected with `test_cell and <function>`.
TESTS: dict[str, tuple[str, str | None]] = {
    "jaxbridge/scipy/special.py": (f"tests/test_scipy_special.py {_M}",
                                   "not test_cell or special"),
    "jaxbridge/scipy/signal.py": (f"tests/test_scipy_signal.py {_M}", "not test_cell or lfilter"),
    # The matrix's optimize cells of the default run (40 s here at load 1): every wrapper,
    # argument, bound regime and mode; then test_scipy_optimize.py's default tests of the
    # Krylov solves (gmres, cg, their failure policy), the failure policy, the bounds
    # (minimize's box; least_squares where trf stops just inside), the singular system's
    # error, least_squares' cost against SciPy's for every loss (since 2026-11-26; before
    # it dogbox-cauchy's, now in the slow stage), robust losses with an outlier, and
    # the tests of bounds held by _active alone and of root's "auto" switch
    # (107 s wall at load 4, beside a second test run; 67 s at load 3 before the cauchy
    # and arctan outlier cases). The rest of the file (2 min), the matrix's slow cells and
    # the float32 bound test are left to the suite.
    # The same tests for each module of the optimize package that carries derivatives.
    **dict.fromkeys(
        [f"jaxbridge/scipy/optimize/{m}.py" for m in ("_implicit", "_problem", "_active",
                                                      "_loss")],
        (f"{_M} tests/test_scipy_optimize.py",
         "(test_cell and optimize) or failure_policies or singular_optimality "
         "or held_just_inside or matrix_free_cg or (closed_form_and_fd and gmres) "
         "or active_coordinate_and_bound or each_bound or krylov_solves "
         "or robust_loss "
         "or inactive_positive_bounds or cost_of_every_loss or scipy_root_auto")),
    # integrate.py's own derivative code runs on SciPy's loop (stepping="scipy", the
    # implicit methods with forward sensitivities), in the recording host call of the
    # implicit methods' compiled derivatives, and in quad; the compiled RK loop (the
    # explicit methods' default under x64) is _rk's. Values and gradients of the implicit
    # methods first, then quad, the SciPy loop's closed-form test, the recording's error
    # and status paths, the matrix's quad and implicit float64 cells. 98 s here at load 6.
    "jaxbridge/scipy/integrate/_scipy_loop.py": (
        f"tests/test_scipy_integrate.py tests/test_scipy_integrate_stiff.py {_M} -m 'not docs'",
        "scipy_loop or test_quad or (gradients_vs_finite and not RK45) "
        "or (robertson and BDF-forward) or (values_match_scipy and not RK45 and not DOP853) "
        "or (test_scipy_integrate_stiff and (too_small or status_and_counts or failed_solve "
        "or (linear_stiff and Radau))) "
        "or (test_cell and integrate and float64 and (quad or implicit))",
    ),
    # quad's Leibniz-rule derivatives and failure policy.
    "jaxbridge/scipy/integrate/_quad.py": (
        f"tests/test_scipy_integrate.py {_M} -m 'not docs'",
        "test_quad or (test_cell and integrate and float64 and quad)",
    ),
    # The event times' implicit-function-theorem derivatives.
    "jaxbridge/scipy/integrate/_events.py": (
        "tests/test_scipy_integrate_events.py -m 'not docs'",
        "(decay_event_gradients and not RK23) or closed_over_event or nan_derivatives "
        "or event_without_derivative or both_modes_and_directions",
    ),
    # _common's tangent/cotangent plumbing (fill_zeros, np_ravel/np_unravel, jnp_ravel,
    # tangent_like, nan_like, f64, host_jit): the SciPy loop's derivatives in both modes
    # against closed forms, quad's gradients and failure policy, closures against args
    # under jit(grad) for quad, root, minimize and least_squares (their parameter
    # pytrees), mixed and float32 dtypes (the float32 test is slow-stage: it alone kills
    # as_float_array's `not`), the bvp's forward-mode cell (its fill_zeros). 112 s at
    # load 14 without the float32 test (150 s at load 12 with the solve_ivp closures too).
    "jaxbridge/scipy/_common.py": (
        f"tests/test_scipy_integrate.py tests/test_scipy_closures.py {_M} -m 'not docs'",
        "scipy_loop_derivatives_match or scipy_loop_gradients_with_one "
        "or scipy_loop_derivatives_of_a_function_without or quad_value_and "
        "or quad_failure_policy or quad_gradient_that_does_not "
        "or (closure_gradient_equals_args and lambda and not solve_ivp) or mixed_dtypes "
        "or float32_inputs_keep "
        "or (test_cell and solve_bvp and jacfwd and not vmap)",
    ),
    # ode_functions (right-hand side, Jacobian, forward-sensitivity system and its
    # Jacobian): the SciPy loop's forward sensitivities against the closed form (RK45,
    # and Radau with `jac` and `sens_jac`), SciPy's values of the implicit methods (their
    # `jac`), Robertson's forward sensitivities (BDF, LSODA), a user `jac` closing over a
    # traced value (slow stage). 45 s here at load 4-6.
    "jaxbridge/scipy/integrate/_ode.py": (
        "tests/test_scipy_integrate.py tests/test_scipy_closures.py -m 'not docs'",
        "scipy_loop_derivatives_match or (values_match_scipy and (Radau or BDF)) "
        "or (stiff_robertson and forward) or user_jacobians_may_close",
    ),
    # solve_bvp: the matrix's float64 cells in jacrev, jacfwd and their vmaps (the IFT
    # solve both ways), then the whole file with its slow closed-form test (sol(x) in x,
    # vmap, the interval's end in reverse mode). 45 s at load 6 before its 2026-11-26
    # three tests (about 4 s of CPU each).
    "jaxbridge/scipy/integrate/_bvp.py": (
        f"{_M} tests/test_scipy_integrate_bvp.py -m 'not docs'",
        "(test_cell and solve_bvp and not vjp and not jvp) or test_scipy_bvp",
    ),
    # The compiled RK loop (RK45 here) in both modes: the matrix's jvp cells (JAX's
    # tangent of the loop) and vjp cells (the discrete adjoint, and reverse mode by
    # forward sensitivities), then SciPy's values and the two-level checkpointing (slow
    # stage: the only test with more than one segment; it must ask for the discrete
    # adjoint). 58 s here at load 5-6 before this session's four tests were added.
    "jaxbridge/scipy/integrate/_rk.py": (
        f"{_M} tests/test_scipy_integrate.py -m 'not docs'",
        "(test_cell and solve_ivp and float64 and not implicit and ((adjoint and vjp) "
        "or (RK45 and jvp) or (t_span and vjp) or (evaluation and jvp))) "
        "or (values_match_scipy and RK45) or compiled_path_bad_input or odd_state "
        "or longer_than_one or compiled_failed or two_level or more_than_twice",
    ),
    # The Radau IIA adjoint/tangent over SciPy's recorded steps (BDF, Radau, LSODA under
    # x64): the matrix's implicit rows in jvp/vjp, test_scipy_integrate_stiff.py's default tests and
    # its exactness test for Radau's discrete solution (slow stage), the finite-difference
    # gradients of test_scipy_integrate.py. 70 s here without the slow test, load 9.
    "jaxbridge/scipy/integrate/_stiff.py": (
        f"{_M} tests/test_scipy_integrate_stiff.py tests/test_scipy_integrate.py -m 'not docs'",
        "(test_cell and solve_ivp and float64 and implicit and (jvp or vjp)) "
        "or (test_scipy_integrate_stiff and not vmap_of and not van_der_pol and not "
        "forward_and_reverse and not closed_over) "
        "or (gradients_vs_finite and (Radau-adjoint or LSODA-adjoint)) "
        "or (robertson and BDF-adjoint)",
    ),
    # solve_ivp with events / dense output / t_eval=None: the gradient tests (event times
    # by the implicit function theorem, dense output, steps) of the fast methods first,
    # then the terminal, count, max_steps and failure paths, and the tests written for
    # its mutation survivors (2026-11-26). 93 s here at load 7 before those (+11 s).
    "jaxbridge/scipy/integrate/_trajectory.py": (
        "tests/test_scipy_integrate_events.py -m 'not docs'",
        "(decay_event_gradients and not RK23) or (cannonball and not RK45) "
        "or closed_over_event or (dense_output_gradients_closed_form and not RK23) "
        "or steps_match or terminal_event_stops or terminal_count or more_events "
        "or failure_raises or bad_input_errors or (dense_output_matches_scipy and RK45) "
        "or nan_derivatives or both_modes_and_directions or one_step",
    ),
    # The compiled root (root(method="df-sane"/"krylov"), SciPy's loops in JAX, with
    # derivatives by the implicit function theorem through custom_root). The tests are
    # selected in file order (-x stops at the first failure), slow-stage ones named:
    # _compiled_root: SciPy's values and status (both methods), the bad-input paths, the
    # DEQ gradients against a jnp twin and FD (dense and GMRES tangent solves; slow
    # stage), the failure policies (NaN/raise, the cg breakdown; slow stage), the
    # closed-form gradient under jit, Armijo's status and nit, the matrix's two default
    # cells (vmap of jacfwd/jacrev), and the DEQ of 512 unknowns (a residual size
    # above CPython's small-int cache: the size check compares values, not objects).
    # 155 s here at load 13-16 on the unmutated code (before the DEQ and this session's
    # five new compiled_root tests were added).
    "jaxbridge/scipy/optimize/_compiled_root.py": (
        f"tests/test_scipy_optimize.py tests/test_scipy_optimize_root_krylov.py {_M} -m 'not docs'",
        "(test_root_value_matches_scipy and (krylov or df-sane)) or compiled_root "
        "or closed_form_gradient_under_jit or (test_scipy_optimize_root_krylov and test_bad_input) "
        "or (deq_16x32 and not kw1) "
        "or armijo_backtracking or (test_cell and root and float64 and "
        "((krylov and vmap.jacrev) or (df-sane and vmap.jacfwd)))",
    ),
    # _dfsane: the value against the exact root, SciPy's own x, nfev and nit with default
    # and non-default options (slow stage), maxfev's exhaustion (slow stage), the
    # matrix's df-sane cell. 88 s here at load 14 (before the two new compiled_dfsane
    # tests of survivors: SciPy's default tolerance, long line searches).
    "jaxbridge/scipy/optimize/_dfsane.py": (
        f"tests/test_scipy_optimize.py {_M} -m 'not docs'",
        "(matches_scipy and df-sane) or compiled_dfsane or compiled_root_bad_input "
        "or compiled_root_failures "
        "or (test_cell and root and df-sane and float64 and vmap.jacfwd)",
    ),
    # _newton_krylov: SciPy's root, status and nit (the DEQ of 512, the Bratu problem with
    # SciPy's options, slow stage), the evaluation count, the closed form, Armijo's
    # backtracking, maxiter and nit failures (slow stage). Not the slow DEQ derivatives
    # (the implicit function theorem's, _compiled_root's). 136 s here at load 15 (before
    # the two new tests of survivors: Armijo's trial steps, the inner cycle's size).
    "jaxbridge/scipy/optimize/_newton_krylov.py": (
        "tests/test_scipy_optimize.py tests/test_scipy_optimize_root_krylov.py -m 'not docs'",
        "(test_root_value_matches_scipy and krylov) "
        "or (test_scipy_optimize_root_krylov and not deq_derivatives "
        "and not lean_gmres and not kw1)",
    ),
    # _gmres: Newton's inner cycle (the DEQ of 512, the evaluation count, Armijo, the
    # iterates of SciPy's own loop with exact products, a residual in large units), the
    # cycle against GMRES by its definition at any scale and for both Gram-Schmidt
    # variants, the restarted solve (slow stage), the GMRES tangent solve of the
    # 96-unknown DEQ (slow stage). 160 s here at load 16.
    "jaxbridge/scipy/sparse/linalg/_gmres.py": (
        "tests/test_scipy_optimize.py tests/test_scipy_optimize_root_krylov.py -m 'not docs'",
        "(compiled_root_deq_gradients and 6-16) or (deq_16x32 and not kw1) "
        "or no_finite_differences or armijo_backtracking or lean_gmres "
        "or exact_products or scaled_residual",
    ),
    # spsolve's and eigsh's rules: the matrix's sparse cells (every mode and dtype,
    # against the jnp twins) first, then the whole default file (values, gradients vs
    # dense JAX and finite differences, vmap, the singular and degenerate policies).
    # 41 s here at load 2-5.
    **dict.fromkeys(["jaxbridge/scipy/sparse/linalg/_spsolve.py",
                     "jaxbridge/scipy/sparse/linalg/_eigsh.py"],
                    (f"{_M} tests/test_scipy_sparse_linalg.py",
                     "(test_cell and sparse) or test_scipy_sparse")),
    # Dense output (OdeSolution): the closed-form gradients in w and t (the Hermite
    # correction and the interpolant's own t-derivative, DOP853/Radau/BDF/LSODA) first,
    # then the one-step solve's values and gradient, then SciPy's values for every
    # method in both directions (each kind's branch of _segment, extrapolation), then
    # the zero-length span (dt == 0). Node ids, so that pytest runs them in this order.
    # 50 s here at load 5 (file order, before the zero-length test).
    "jaxbridge/scipy/integrate/_dense.py": (
        "tests/test_scipy_integrate_events.py::test_dense_output_gradients_closed_form "
        "tests/test_scipy_integrate_events.py::test_dense_output_of_a_one_step_solve_matches_scipy "
        "tests/test_scipy_integrate_events.py::test_dense_output_matches_scipy "
        "tests/test_scipy_integrate_events.py::"
        "test_dense_output_of_a_zero_length_span_is_scipys_constant "
        "-m 'not docs and not slow'",
        None,
    ),
    # Closure conversion: every wrapper but solve_ivp (the slowest to compile; it
    # converts its function through the same `convert`) differentiated with parameters
    # closed over and through `args`, concrete arrays and Python floats, integer
    # operands beside float ones. Not the cache tests (they test the structural keys,
    # outside RULES).
    "jaxbridge/scipy/_trace.py": (
        "tests/test_scipy_closures.py -m 'not docs and not slow'",
        "not solve_ivp and not memory_stays and not host_cache",
    ),
    # pair: host functions and kernels share it, but only a kernel's eager call takes
    # its compiled path (host functions run directly): one eager ops call for that.
    "jaxbridge/_core/pair.py": (
        "tests/test_inplace_and_linear.py tests/test_foreign.py tests/test_ops.py",
        "dropped or in_place_function_and or under_vmap or jointly or jacobians_equal "
        "or (grid and float64) or second_order or transposed_by_jax or vectorized_vmap "
        "or grad_inside_vmap or jvp_only or vjp_only or inlined or scalar_length_scale",
    ),
    "jaxbridge/_foreign/runners.py": (
        "tests/test_inplace_and_linear.py tests/test_foreign.py tests/test_hostcall.py",
        "in_place or dropped or (grid and float64) or residuals or pytree or wrong or "
        "exception_in_a_rule or jvp_only or vjp_only or no_rules or complex_inputs "
        "or batch_dims or none_tangent",
    ),
    # ops: its own tests, then the 8-device subprocess scripts, where the kernels'
    # batch_dims decide what XLA splits (softplus along every axis, tridiagonal systems
    # never along n): ~10 s more.
    "jaxbridge/ops.py": (
        "tests/test_ops.py tests/test_sharding.py",
        "not property and not cpu_isa and not gpu and not export and not scan",
    ),
    "jaxbridge/_testing/_fd.py": (
        "tests/test_testing.py",
        "complex or (caught and not writes_into) or steps_are_relative or erfcx "
        "or trusts or correct_special or ridders_reaches",
    ),
    # The checks that compare rules with references: every check_rules test but the
    # strategies, kernel, export, finite-difference and options-only ones (65 s here, at
    # load 9; the whole default file takes 92 s).
    "jaxbridge/_testing/_derivative_checks.py": (
        "tests/test_testing.py",
        "not strategies and not writes_into and not round_trip and not compiles_on_every "
        "and not finite_difference_error and not complex_step_is_refused and not "
        "options_reject and not classified and not what_each_object and not "
        "steps_are_relative and not correct_special and not erfcx",
    ),
    # run_checks: the primal call, its failure, and the table walk (fast check_rules
    # tests that see the eager call fail, options select checks, both modes run).
    "jaxbridge/_testing/_checker.py": (
        "tests/test_testing.py",
        "declared_dtype or options_select or wrong_sign or jvp_only_rules "
        "or no_derivative_check_is_skipped or report_fields or gammaln_vjp_only",
    ),
    # The checks without finite differences (jit, vmap, batched_grad, deterministic,
    # no_retrace, export, inputs_unchanged): the tests whose broken rule only these catch
    # first, then correct rules of every shape that must pass them (pytrees, integer
    # inputs, complex, jvp-only, float32 at its own tolerances).
    "jaxbridge/_testing/_transforms.py": (
        "tests/test_testing.py tests/test_testing_verdicts.py",
        "hardcoding_breaks_vmap or does_not_broadcast or nondeterministic "
        "or batched_gradients or compiles_on_every or writes_into or round_trip "
        "or vectorized_vmap or non_square or jvp_only_rules or complex_holomorphic "
        "or float32_upcast or pytree_args or first_batch_element or forcing_export "
        "or vmap_of_its_cotangents or positive_inputs or nan_that or vmap_of_grad "
        "or only_under_jit or only_integer or jit_rounding or strict_domain "
        "or compile_counts_nest or first_cotangent_row",
    ),
    # The run's comparisons, finite differences and skips: the check_rules tests that
    # catch a planted bug by its value (sign, factor, transpose, 3% errors, a small error
    # of a large function, zero references, raising rules), then correct rules that must
    # pass (non-square and 3-D, complex, float32, full Jacobians). 103 s at load 12
    # before trimming to these.
    "jaxbridge/_testing/_run.py": (
        "tests/test_testing.py tests/test_testing_verdicts.py",
        "wrong_sign or missing_factor or transposed_cotangent or jvp_wrong_is_caught "
        "or small_relative_error or relative_errors_stay_finite or raises_is_reported "
        "or symbolic_zeros_says or jvp_disagreeing or (3_percent and float64) "
        "or non_square or complex_holomorphic or float32_upcast or full_jacobians "
        "or complex_step_makes or worst_entry or without_derivative_rules or vmap_of_grad "
        "or jvp_only_rules or exact_zero_derivatives or empty_arguments or imaginary_part",
    ),
    # Which modes a function has (asked or probed) and every tolerance: correct rules
    # that must pass in float64 and float32 over wide ranges, the 3% errors that must
    # fail in both, the small error of a large function, the probing tests, what each
    # kind of function says it has. 126 s at load 12 before trimming to these.
    "jaxbridge/_testing/_plan.py": (
        "tests/test_testing.py tests/test_testing_verdicts.py",
        "3_percent or correct_special or float32_upcast or gammaln_vjp_only "
        "or plain_function_over or no_derivative_check_is_skipped or missing_factor "
        "or small_relative_error or complex_holomorphic or report_fields "
        "or small_by_cancellation or nondeterministic_rules or jit_rounding "
        "or precision_of_the_finite or float64_reference or float16_functions "
        "or tiny_error_only",
    ),
    # The flat call (leaves, dynamic/inexact/integer split, outputs, the flat rules):
    # pytrees with integer inputs and static kwargs first, then single-array rules
    # (62 s at load 12 before dropping four slower tests of the same paths).
    "jaxbridge/_testing/_flat.py": (
        "tests/test_testing.py",
        "pytree_args or static_kwargs or non_square or wrong_sign or jvp_only_rules "
        "or writes_into",
    ),
    # The hints read from the numbers: the mutant table (each planted bug must be named
    # by its hint; not the kernel kinds, which compile C++ on every run, nor the score
    # test, which runs them), then the check_rules tests that assert a hint.
    "jaxbridge/_testing/_hints.py": (
        "tests/test_testing_mutants.py tests/test_testing.py tests/test_testing_verdicts.py",
        "(test_testing_mutants and every_mutant and not kernel) or (test_testing and "
        "(wrong_sign or transposed_cotangent or missing_factor or swapped_arguments "
        "or relative_errors_stay_finite or output_shapes or declared_dtype "
        "or longer_cotangent or jvp_disagreeing or factor_near_one or hint_guesses)) "
        "or (test_testing_verdicts and "
        "(non_square_jacobian or exact_zeros or not_called_a_constant or slightly_inexact))",
    ),
    # Options (which checks run, validation), a result's ok, the report's verdict and
    # summary, the failure message.
    "jaxbridge/_testing/_report.py": (
        "tests/test_testing.py tests/test_testing_verdicts.py",
        "options_select or options_reject or report_fields or rule_check_error_is "
        "or failing_eager_call or no_derivative_check_is_skipped or wrong_sign "
        "or raises_is_reported or nondeterministic or pickle or first_step or later_row "
        "or spelled_out or common_wording or default_options or built_by_hand",
    ),
    "jaxbridge/_testing/strategies.py": (
        "tests/test_testing_strategies.py tests/test_testing.py -m 'not docs'", "strategies",
    ),
    # How a raised error becomes a row's hint and note: the classification test first,
    # then the check_rules tests whose rules raise or return the wrong shape or dtype.
    "jaxbridge/_testing/_diagnose.py": (
        "tests/test_testing.py",
        "classified or raises_is_reported or declared_dtype or second_order_of_numpy "
        "or cotangent_dtype or failing_eager_call or jvp_only_rules or gammaln_vjp_only "
        "or plain_function_over_a_jvp_only or plain_custom_vjp or cannot_trace",
    ),
    "jaxbridge/torch/_wrap.py": (
        "tests/test_torch.py",
        "derivatives or hessian or check_rules or scan or one_torch_vmap or static_leaves "
        "or loop_for_data or dtypes_pass or integer_only or bfloat16 or module_gradients",
    ),
    # torch's host side and conversions: every call (primal and derivative) goes
    # through them, and the whole default file takes 13 s here (load 1-2). The device
    # protocol's tests (10 s) drive _host's device-tensor branches on CPU capsules.
    "jaxbridge/torch/_host.py": ("tests/test_torch.py tests/test_torch_device.py", None),
    "jaxbridge/torch/_convert.py": ("tests/test_torch.py", None),
    # The device protocol on CPU: fake (host-memory) DLPack capsules drive device_fill,
    # stream_context's no-stream branch, device_filler and zeros_device (monkeypatched
    # torch_has_cuda); the whole file (about 10 s here; its one GPU test skips on CPU).
    "jaxbridge/torch/_device.py": ("tests/test_torch_device.py", None),
    "jaxbridge/torch/_module.py": ("tests/test_torch.py", "module or optax"),
    # A large result written into XLA's buffer: its own file (values against torch, the
    # fallbacks, counted copies; about 8 s here), then test_torch.py's default tests.
    "jaxbridge/torch/_redirect.py": ("tests/test_torch_redirect.py tests/test_torch.py", None),
}


def command_for(module: str) -> str:
    files, k = TESTS[module]
    return f"{_PYTEST} {files}" + (f" -k '{k}'" if k else "")


#: The functions that carry derivatives (a regular expression on the qualified name of
#: the function a mutant is in); --all-functions mutates whole modules.
RULES = {
    "jaxbridge/scipy/special.py": r"_jvp$|^_no_order_derivative|^_sum$|^_times$|^_tail$",
    "jaxbridge/scipy/signal.py": r"_jvp$|_vjp$|^_causal_conv|^_lag_products|^_pad_state"
    r"|^_reversed_solve",
    # optimize: the implicit solve's rules, the linear solves they make, the active bounds
    # and the robust losses
    "jaxbridge/scipy/optimize/_implicit.py": r"_jvp$|_vjp$|^_free_and_x$|^solve$",
    "jaxbridge/scipy/optimize/_problem.py": r"solve$",
    "jaxbridge/scipy/optimize/_active.py": r"^active$",
    "jaxbridge/scipy/optimize/_loss.py": r"^rho$",
    # integrate: the SciPy loop's rules (_ivp_vjp with its nested rhs/adj_jac, _ivp_jvp,
    # the cotangents), the host-side ODE they solve (_Ode: __init__, adj, adj_jac, jac_kw,
    # solve, sensitivities), the recording of SciPy's steps for _stiff's compiled
    # derivatives (_ivp_recorded, _recorded_result), quad's rules and integrand
    # (_Integrand's __init__, df_dp, jvp_p, _f_at, _quad_run). Not the forward glue
    # (_ivp, _compiled_ivp, _stiff_ivp), the argument checks, nor _sensitivity_choice
    # (which of two correct gradients is computed). Mutants carry their innermost name
    # only: `__init__` is _Ode's and _Integrand's, `solve` also _StiffProblem's.
    "jaxbridge/scipy/integrate/_scipy_loop.py": r"^(__init__|adj|adj_jac|jac_kw|solve|sensitivities"
    r"|_ivp_vjp|rhs|_ivp_cotangents|_ivp_vjp_nan|_ivp_jvp|_recorded_result|recorded_solve"
    r"|_continuous_adjoint|_adjoint_jacobian)$",
    # quad's rules and integrand (moved out of integrate.py with the package split).
    "jaxbridge/scipy/integrate/_quad.py": r"^(__init__|_quad_run|_f_at|_quad_vjp|_quad_jvp"
    r"|_gradient_integral|df_dp|jvp_p)$",
    # _trajectory: the host side of the derivatives (_Host's __init__ and sensitivities,
    # the output points and their sensitivities, the JVP and VJP rules), the padding that
    # keeps padded entries finite (_pad_rows). Not the forward solve (trajectory: values,
    # checked against SciPy).
    "jaxbridge/scipy/integrate/_trajectory.py": r"^(__init__|sensitivities|_pad_rows|_points"
    r"|_sens_at|_trajectory_jvp|_trajectory_vjp)$",
    # _events: the implicit-function-theorem slot of an event time and its shift.
    "jaxbridge/scipy/integrate/_events.py": r"^(event_slot|_time_shift|_time_shift_jvp"
    r"|tangent|cotangent)$",
    # The compiled root: the custom_root around the loop and its tangent solves
    # (_root, F, solve, _tangent_solve with checked/krylov/direct/tangent_solve, root);
    # not unsupported() (which loop runs: argument dispatch) nor the failure messages
    # (_check_root, _check_linear: what an error says, not a value).
    "jaxbridge/scipy/optimize/_compiled_root.py": r"^(root|_root|F|solve|_tangent_solve|checked"
    r"|krylov|direct|tangent_solve)$",
    # The loops (their values are the roots the derivatives are taken at) and the
    # tolerance they are given; not supported()/unsupported() (which loop runs).
    "jaxbridge/scipy/optimize/_dfsane.py": r"^(with_tol|solve|direction|body)$",
    "jaxbridge/scipy/optimize/_newton_krylov.py": r"^(with_tol|solve|_merit|_maxnorm|_check"
    r"|_armijo|cubic|body|_step)$",
    # Every function: Newton's inner solve and the GMRES tangent solve of the IFT.
    "jaxbridge/scipy/sparse/linalg/_gmres.py": r".",
    # sparse.linalg: spsolve's and eigsh's JVP and VJP rules and what only they call
    # (the symmetrized products, the bordered solve for eigenvector derivatives, the
    # degeneracy tests that decide between a derivative and an error). Not the forward
    # solves (_spsolve, _eigsh: values, checked against SciPy), the factor cache
    # (_factor, _digest: shared with the forward), nor the input conversion (_coo.as_coo).
    "jaxbridge/scipy/sparse/linalg/_spsolve.py": r"_jvp$|_vjp$",
    "jaxbridge/scipy/sparse/linalg/_eigsh.py": r"_jvp$|_vjp$|^_eigenspace_problem|^_pinv_solve"
    r"|^_degenerate|^_sym_",
    # _dense: what carries OdeSolution's derivatives: the quintic Hermite correction
    # (_hermite, `zero`, _single: the derivative in parameters, y0 and t0) and the
    # interpolant that JAX differentiates in t (_segment). Not the host-side coefficient
    # extraction (`coefficients`), the segment choice (_index), nor the properties and
    # __call__'s shape handling: values, checked against SciPy.
    "jaxbridge/scipy/integrate/_dense.py": r"^(_hermite|zero|_single|_segment)$",
    # _trace: what makes closed-over values and `args` differentiable operands: convert
    # (and its nested `traced`), _is_dynamic (which `args` leaves become operands),
    # HostFun's __init__ (which operands are differentiable), __call__, split, merge,
    # array_aval. Not the structural cache keys (_array_key, _value_key, jaxpr_key,
    # __eq__: which compiled program is reused), nor the `args` conventions and their
    # messages (check_args, _describe_args).
    "jaxbridge/scipy/_trace.py": r"^(convert|traced|_is_dynamic|__init__|__call__|split"
    r"|merge|array_aval)$",
    # _rk: the discrete adjoint (_sweep and its nested rerun/step_vjp/segment/back), the
    # custom JVP and its transpose, the recording loop and tape; not the forward
    # stepping (_Rk: values, checked by every solve) nor checkpoint_sizes (memory).
    # Mutants carry their innermost function's name only: `body` and `solve` also match
    # the forward loop's, a few forward mutants in the population.
    "jaxbridge/scipy/integrate/_rk.py": r"^(_sweep|rerun|body|step_vjp|phi|with_output|plain|output"
    r"|segment|back|_bind_fixed|_linear_with_transpose|solve|transpose_solve|_plain"
    r"|differentiable_solve|_differentiable_solve_jvp|flat|split|core|forward|transpose"
    r"|_forward_recording|_record|_tape0|_core)$",
    # _stiff: the whole module is derivative code (SciPy runs the solve), but for
    # max_states (how many steps the recording may hold: memory).
    "jaxbridge/scipy/integrate/_stiff.py": r"^(?!max_states$).",
    # _bvp: the derivative side (the tangent and adjoint of the collocation system, its
    # sparse Jacobian, the final mesh's motion with the interval's ends) and what JAX
    # differentiates on the device (BvpSolution's spline: _single, __call__; `__call__`
    # is only BvpSolution's here). Not the forward glue (_bvp, _padded, fun, bc, fun_jac,
    # bc_jac: what SciPy's Newton runs; values checked against SciPy), the argument
    # checks in solve_bvp, nor BvpConfig/_result (the cache key, result shapes).
    "jaxbridge/scipy/integrate/_bvp.py": r"^(_single|__call__|col|residual|blocks|tangent|adjoint"
    r"|jacobian|_x_tangent|_bvp_jvp|_bvp_vjp|_none)$",
    # _common: the tangent and cotangent plumbing every scipy wrapper's rules use, and
    # the host-side compile cache they run through; not the LRU bookkeeping, the Result
    # mapping and its messages, the policy/error texts, nor static_options.
    "jaxbridge/scipy/_common.py": r"^(fill_zeros|np_ravel|np_unravel|jnp_ravel|tangent_like"
    r"|nan_like|f64|host_jit|as_float_array)$",
    # _ivp_common: ode_functions and its nested f, jac_y, sens (with column), sens_jac;
    # not OdeResult (field names and messages).
    "jaxbridge/scipy/integrate/_ode.py": r"^(ode_functions|f|jac_y|sens|column|sens_jac)$",
    "jaxbridge/_core/pair.py": r".",
    "jaxbridge/_foreign/runners.py": r"^run_|^filler",
    "jaxbridge/ops.py": r".",
    "jaxbridge/_testing/_fd.py": r".",
    "jaxbridge/_testing/_derivative_checks.py": r".",
    "jaxbridge/_testing/_checker.py": r".",
    "jaxbridge/_testing/_diagnose.py": r".",
    # The checks, the run (comparisons, finite differences, skips) and the plan (modes,
    # precision, tolerances): every function decides a verdict.
    "jaxbridge/_testing/_transforms.py": r".",
    "jaxbridge/_testing/_run.py": r".",
    "jaxbridge/_testing/_plan.py": r".",
    # The flat call, but for the argument names (labels in the report, not verdicts).
    "jaxbridge/_testing/_flat.py": r"^(?!_arg_names$|function_name$).",
    # guess names the bug in a failed row; it never turns a fail into a pass (the status
    # is decided by _run.compare), but its hint is what the user is told to fix.
    "jaxbridge/_testing/_hints.py": r"^guess$",
    # What decides a verdict or what is reported: the options (defaults, validation,
    # which checks run), a result's ok, the report's passed/failures/summary/by_name,
    # the failure message. Not the table's and a row's text (__str__, describe, _num).
    "jaxbridge/_testing/_report.py": r"^(CheckOptions|__post_init__|enabled|coerce|ok"
    r"|passed|failures|skipped|by_name|summary|failure_message)$",
    # The input strategies (ranges, shapes, dtypes, conditioning), whole.
    "jaxbridge/_testing/strategies.py": r".",
    "jaxbridge/torch/_wrap.py": r"_rule$|^_autograd_vjp|^_torch_vjp|^_torch_jvp|^_restricted"
    r"|^_conj",
    # What a derivative's host call runs (the derived torch functions go through
    # run_host with two or more arguments; run_one, run_in_place and the torch-operator
    # `out=` path serve primal calls only).
    "jaxbridge/torch/_host.py": r"^run_host$|^_tensors$|^_cap_threads$|^_restore_threads$"
    r"|^_run_batched$|^_run_loop$|^write_results$|^_write_one$|^_check_after_call$",
    # Every conversion, module level included (`.*` also matches its empty name).
    "jaxbridge/torch/_convert.py": r".*",
    # The whole device path (the CUDA stream branch of stream_context cannot run on CPU).
    "jaxbridge/torch/_device.py": r".*",
    # The function `jax.grad` differentiates with torch autograd, its entry, and the
    # parameters' and buffers' conversion.
    "jaxbridge/torch/_module.py": r"^_functional$|^_call_|^__call__$|^_to_jax$",
    # Every function: each decides whether torch's result is XLA's buffer, and a wrong
    # decision is a wrong value.
    "jaxbridge/torch/_redirect.py": r".*",
}


def changed_modules(base: str) -> list[str]:
    """The configured modules that differ from `base` (committed or not)."""
    out = subprocess.run(
        ["git", "diff", "--name-only", base, "--"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    return [m for m in TESTS if m in out]


def _cr(*args: str, timeout: float | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["cosmic-ray", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )


def annotation_spans(module: str) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """(start, end) positions of the annotations in `module`, if it never evaluates them.

    Under `from __future__ import annotations` an annotation is a string nobody reads at
    run time (jaxbridge has no runtime type checking), so a mutant inside one
    (`str | None` -> `str + None`) is equivalent by construction: it is not run.
    """
    tree = ast.parse((ROOT / module).read_text())
    lazy = any(
        isinstance(n, ast.ImportFrom) and n.module == "__future__"
        and any(a.name == "annotations" for a in n.names)
        for n in tree.body
    )
    if not lazy:
        return []
    spans = []
    for node in ast.walk(tree):
        ann: list[ast.expr | None] = []
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            a = node.args
            ann = [node.returns] + [x.annotation for x in (*a.posonlyargs, *a.args,
                                                          *a.kwonlyargs, a.vararg, a.kwarg)
                                    if x is not None]
        elif isinstance(node, ast.AnnAssign):
            ann = [node.annotation]
        for e in ann:
            if e is not None:
                spans.append(((e.lineno, e.col_offset),
                              (e.end_lineno or e.lineno, e.end_col_offset or 0)))
    return spans


def _in_annotation(start: tuple[int, int], spans: list) -> bool:
    return any(lo <= tuple(start) < hi for lo, hi in spans)


def prepare(
    module: str, sample: int | None, all_functions: bool, per_mutant_s: float, seed: int,
    extend: int = 0,
) -> tuple[Path, Path, int]:
    """Config and session for `module`; returns (config, session, mutants to run).

    `extend`: the mutants of an earlier run's `--sample extend --seed seed` are left out
    and `sample` more are drawn from the rest (seed + 1): together a uniform random
    sample of `extend + sample`, grown without rerunning the first part.
    """
    from cosmic_ray.work_db import WorkDB, use_db
    from cosmic_ray.work_item import WorkerOutcome, WorkResult

    SESSIONS.mkdir(exist_ok=True)
    (SESSIONS / ".gitignore").write_text("*\n")
    stem = module.replace("/", "_").removesuffix(".py")
    config, session = SESSIONS / f"{stem}.toml", SESSIONS / f"{stem}.sqlite"
    config.write_text(
        "[cosmic-ray]\n"
        f"module-path = {json.dumps(module)}\n"
        f"timeout = {per_mutant_s}\n"
        "excluded-modules = []\n"
        f"test-command = {json.dumps(command_for(module))}\n"
        '[cosmic-ray.distributor]\nname = "local"\n'
    )
    session.unlink(missing_ok=True)
    res = _cr("init", str(config), str(session))
    if res.returncode:
        sys.exit(f"cosmic-ray init failed for {module}:\n{res.stderr}")
    pattern = re.compile(".") if all_functions else re.compile(RULES.get(module, "."))
    with use_db(str(session), WorkDB.Mode.open) as db:
        items = list(db.work_items)
        spans = annotation_spans(module)
        keep = [
            w for w in items
            if any(pattern.search(m.definition_name or "") for m in w.mutations)
            and not all(_in_annotation(m.start_pos, spans) for m in w.mutations)
        ]
        if extend > len(keep):
            sys.exit(f"--extend {extend}: {module} has only {len(keep)} mutants to sample")
        if extend:
            done = {w.job_id for w in random.Random(seed).sample(keep, extend)}
            keep = [w for w in keep if w.job_id not in done]
            seed += 1
        if sample is not None and len(keep) > sample:
            keep = random.Random(seed).sample(keep, sample)
        kept = {w.job_id for w in keep}
        skip = [w.job_id for w in items if w.job_id not in kept]
        if skip:
            db.set_multiple_results(skip, WorkResult(worker_outcome=WorkerOutcome.SKIPPED))
    return config, session, len(kept)


def run(module: str, config: Path, session: Path, budget_s: float) -> bool:
    """`cosmic-ray exec` until done or out of budget; True if it finished."""
    proc = subprocess.Popen(["cosmic-ray", "exec", str(config), str(session)], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        proc.wait(timeout=budget_s)
        return True
    except subprocess.TimeoutExpired:
        # cosmic-ray does not restore the mutated file when stopped: stop its whole
        # process group (it and its pytest), then restore the file from git (it was
        # clean when we started: checked in main).
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(60)
        subprocess.run(["git", "checkout", "--", module], cwd=ROOT, check=True)
        return False


def summary(module: str, session: Path) -> dict:
    from cosmic_ray.work_db import WorkDB, use_db
    from cosmic_ray.work_item import TestOutcome, WorkerOutcome

    killed, survivors, pending, skipped = 0, [], 0, 0
    with use_db(str(session), WorkDB.Mode.open) as db:
        results = dict(db.results)
        for item in db.work_items:
            r = results.get(item.job_id)
            if r is None:
                pending += 1
            elif r.worker_outcome == WorkerOutcome.SKIPPED:
                skipped += 1
            elif r.test_outcome == TestOutcome.SURVIVED:
                m = item.mutations[0]
                survivors.append(
                    {
                        "job": item.job_id,
                        "function": m.definition_name,
                        "line": m.start_pos[0],
                        "operator": m.operator_name,
                        "diff": r.diff,
                    }
                )
            else:
                killed += 1  # killed, or incompetent (the mutant does not even import)
    run_ = killed + len(survivors)
    return {
        "module": module,
        "killed": killed,
        "survived": len(survivors),
        "not_run": pending,
        "outside_rules_or_sample": skipped,
        "score": round(100.0 * killed / run_, 1) if run_ else None,
        "survivors": survivors,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", default="main", help="git revision the change is diffed against")
    ap.add_argument("--modules", nargs="*", help="modules to mutate (default: changed ones)")
    ap.add_argument("--budget-s", type=float, default=1200.0, help="total time budget")
    ap.add_argument("--per-mutant-s", type=float, default=300.0, help="test-run timeout")
    ap.add_argument("--sample", type=int, default=None, help="mutants per module (random)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--extend", type=int, default=0, metavar="K",
                    help="grow an earlier --sample K --seed S run: leave its mutants out "
                         "and draw --sample more from the rest")
    ap.add_argument(
        "--all-functions",
        action="store_true",
        help="mutate whole modules, not only their derivative rule functions",
    )
    ap.add_argument("--json", type=Path, help="write the summaries here")
    args = ap.parse_args()
    modules = args.modules if args.modules else changed_modules(args.base)
    unknown = [m for m in modules if m not in TESTS]
    if unknown:
        sys.exit(f"no tests configured for {unknown}: add them to TESTS in {__file__}")
    if not modules:
        print(f"no derivative-bearing module changed since {args.base}")
        return
    status = subprocess.run(
        ["git", "status", "--porcelain", "--", *modules], cwd=ROOT, capture_output=True, text=True
    ).stdout
    if status.strip():
        sys.exit(
            f"commit or stash your changes to {modules} first (cosmic-ray edits and "
            f"restores the files in place)"
        )
    deadline = time.monotonic() + args.budget_s
    summaries = []
    for i, module in enumerate(modules):
        config, session, n = prepare(
            module, args.sample, args.all_functions, args.per_mutant_s, args.seed, args.extend
        )
        share = (deadline - time.monotonic()) / (len(modules) - i)
        print(f"{module}: {n} mutants, budget {share:.0f} s", flush=True)
        finished = run(module, config, session, max(share, 0.0))
        s = summary(module, session)
        s["finished"] = finished
        summaries.append(s)
        print(
            f"  killed {s['killed']}, survived {s['survived']}, not run {s['not_run']} "
            f"-> {s['score']}% of those run",
            flush=True,
        )
        for v in s["survivors"]:
            print(f"  SURVIVOR {v['function']} line {v['line']} ({v['operator']})\n{v['diff']}")
    if args.json:
        args.json.write_text(json.dumps(summaries, indent=1))


if __name__ == "__main__":
    main()
