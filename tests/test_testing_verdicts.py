"""check_rules verdicts that mutation testing of `jaxbridge/_testing` found unguarded
(tests/MUTATION.md): each test is a rule with a planted bug the checker must fail, or a
correct one it must pass, written as a user would."""

import jax
import numpy as np
import pytest

import jaxbridge as jb
from jaxbridge.testing import CheckOptions, RuleCheckError, check_rules

FAST = CheckOptions(n_directions=2)


def _host_sin():
    """A fresh host function sin(x), without rules: each test gives it its own."""
    @jb.foreign(lambda x: x)
    def host_sin(x):
        return np.sin(x)

    return host_sin


def _failed(err: RuleCheckError) -> dict:
    out: dict = {}
    for r in err.report.failures:
        out.setdefault(r.name, []).append(r)
    return out


def test_a_vmap_that_returns_the_first_batch_element_everywhere_is_caught():
    # vmap="vectorized" promises the function maps over a leading batch axis; this one
    # computes the first batch element and copies it into every row.
    @jb.foreign(lambda x: x, vmap="vectorized")
    def first_only(x):
        x = np.asarray(x)
        rows = x.reshape(-1, x.shape[-1])
        return np.broadcast_to(np.sin(rows[0]), x.shape).copy()

    first_only.defvjp(lambda p, out, ct: (np.cos(p[0]) * ct,))
    with pytest.raises(RuleCheckError) as info:
        check_rules(first_only, np.array([0.5, 1.0, 1.5]), check_options=FAST)
    failed = _failed(info.value)
    assert set(failed) == {"vmap"}
    assert any("values: vmap over x" in r.note for r in failed["vmap"])


def test_forcing_export_of_a_host_function_reports_why_it_cannot_be_exported():
    host_sin = _host_sin()

    host_sin.defvjp(lambda p, out, ct: (np.cos(p[0]) * ct,))
    x = np.array([0.5, 1.0, 1.5])
    # not forced: skipped with the reason
    report = check_rules(host_sin, x, check_options=CheckOptions(checks=("export",)))
    assert report.summary() == {"export": "skip"}
    # forced: run, and its failure reported (never silently skipped)
    with pytest.raises(RuleCheckError) as info:
        check_rules(host_sin, x, check_options=CheckOptions(checks=("export",), export=True))
    (row,) = info.value.report.failures
    assert row.name == "export" and row.status == "error"
    assert "cannot be exported" in row.note


def test_a_rule_wrong_under_vmap_of_its_cotangents_is_reported_against_its_input():
    # The VJP assumes x is 1-D: right for one cotangent, wrong for a batch of them (as
    # jax.jacrev and jax.vmap(jax.grad(...)) call it).
    @jb.foreign(lambda x: x, vmap="vectorized")
    def normalize(x):
        return x / np.sum(x, axis=-1, keepdims=True)

    @normalize.defvjp
    def _(primals, out, ct):
        (x,) = primals
        return ((ct - np.sum(ct * out)) / np.sum(x),)

    with pytest.raises(RuleCheckError) as info:
        check_rules(normalize, np.array([0.4, 0.9, 1.3, 0.7]), check_options=FAST)
    failed = _failed(info.value)
    assert set(failed) == {"vmap", "batched_grad"}
    # each row says which input's cotangent was wrong (and no output: it is an input's)
    assert [(r.arg, r.output) for r in failed["batched_grad"]] == [("x", None)]
    assert {r.arg for r in failed["vmap"]} == {"x"}


def test_a_correct_rule_defined_for_positive_inputs_only_passes_under_vmap():
    # The vmap checks batch perturbed copies of the input: they must stay in the
    # function's domain (within a few percent of each element), or a correct rule fails.
    @jb.foreign(lambda x: x, vmap="vectorized")
    def host_log(x):
        return np.log(x)

    host_log.defvjp(lambda p, out, ct: (ct / p[0],))
    host_log.defjvp(lambda p, out, t: t[0] / p[0])
    report = check_rules(host_log, np.array([0.05, 1.0, 20.0]),
                         check_options=CheckOptions(checks=("vmap", "batched_grad")))
    assert report.passed, str(report)
    assert {r.status for r in report.by_name("vmap")} == {"pass"}


def test_a_nan_that_every_call_repeats_is_deterministic():
    # sqrt of a negative element is NaN on every call: not nondeterminism.
    report = check_rules(jax.numpy.sqrt, np.array([-1.0, 4.0]),
                         check_options=CheckOptions(checks=("deterministic",)))
    assert report.summary() == {"deterministic": "pass"}, str(report)


def test_a_wrong_rule_of_a_non_square_jacobian_is_failed_with_its_hint():
    # f: R^3 -> R^2, with a VJP off by a factor of 2: the full-Jacobian check must fail
    # it with that hint (no transposition to try: the Jacobian is not square).
    @jb.foreign(lambda x: jax.ShapeDtypeStruct((2,), x.dtype))
    def pairs(x):
        return np.array([x[0] * x[1], x[1] * x[2]])

    @pairs.defvjp
    def _(primals, out, ct):
        (x,) = primals
        return (2.0 * np.array([ct[0] * x[1], ct[0] * x[0] + ct[1] * x[2], ct[1] * x[1]]),)

    with pytest.raises(RuleCheckError) as info:
        check_rules(pairs, np.array([0.5, 1.5, -0.8]),
                    check_options=CheckOptions(checks=("vjp_jacobian",)))
    (row,) = info.value.report.failures
    assert row.status == "fail" and row.hint == "off by a constant factor ~2", row


def test_the_complex_step_makes_a_float32_reference_accurate_to_float32_rounding():
    # A function that only runs in float32 (no upcast): plain finite differences are
    # good to ~1e-6 there; the complex step (on by default) refines the reference to
    # float32 rounding, so a rule can be held to tolerances near float32's precision.
    @jax.custom_vjp
    def sin32(x):
        return jax.numpy.sin(x)

    sin32.defvjp(lambda x: (jax.numpy.sin(x), x), lambda x, ct: (jax.numpy.cos(x) * ct,))
    report = check_rules(sin32, np.array([0.3, 1.1, 2.0], np.float32),
                         check_options=CheckOptions(checks=("vjp_jacobian",), upcast=False))
    (row,) = report.results
    assert report.precision == "float32" and row.status == "pass"
    assert row.abs_err < 2e-7, row


def test_a_transposed_cotangent_is_named_where_the_jacobian_has_exact_zeros():
    # out[0] depends on a[0, 1] alone and out[1] is identically zero (a padded output):
    # most of the Jacobian with respect to `a` is exactly zero, with a zero tolerance.
    # The rule's cotangent of `a` is transposed; transposed back it matches the
    # reference exactly, zeros included, and the hint must say so.
    @jb.foreign(lambda a, b: jax.ShapeDtypeStruct((2,), b.dtype))
    def padded(a, b):
        return np.array([a[0, 1] * b, 0.0])

    @padded.defvjp
    def _(primals, out, ct):
        a, b = primals
        ct_a = np.zeros_like(a)
        ct_a[1, 0] = ct[0] * b  # bug: belongs in [0, 1]
        return ct_a, ct[0] * a[0, 1]

    with pytest.raises(RuleCheckError) as info:
        check_rules(padded, np.array([[0.5, -1.5], [2.0, 0.7]]), np.array(1.3),
                    check_options=CheckOptions(checks=("vjp_jacobian",)))
    (row,) = info.value.report.failures
    assert row.arg == "a" and row.hint == "cotangent looks transposed", row


def _sin_vjp_failure(factor: float) -> object:
    """The failing row of the checker for sin with a VJP `factor` times the derivative
    and its first element off by a further 3e-6 (relative)."""
    host_sin = _host_sin()

    def vjp(primals, out, ct):
        g = factor * np.cos(primals[0]) * ct
        g[0] *= 1 + 3e-6
        return (g,)

    host_sin.defvjp(vjp)
    with pytest.raises(RuleCheckError) as info:
        check_rules(host_sin, np.array([0.3, 1.1, 2.0]),
                    check_options=CheckOptions(checks=("vjp_jacobian",)))
    (row,) = info.value.report.failures
    return row


def test_a_small_error_in_one_entry_is_not_called_a_constant_factor():
    # The VJP is wrong by 3e-6 (relative) in its first element only: the median ratio
    # of rule to reference is exactly 1, and "off by a constant factor ~1" would be
    # nonsense. The hint must say which entries are wrong.
    row = _sin_vjp_failure(1.0)
    assert row.hint == "wrong in 1 of 9 entries, right in the others (a dropped term?)", row


def test_a_factor_of_2_is_named_even_when_the_rule_is_slightly_inexact():
    # The VJP is twice the derivative, and (as from an iterative solve) not exact: its
    # first element is off by a further 3e-6. The dominant bug is still the factor.
    row = _sin_vjp_failure(2.0)
    assert row.hint == "off by a constant factor ~2", row


def test_a_rule_that_breaks_under_vmap_of_grad_is_caught():
    # jax.vmap(jax.grad(f)) batches the input but not the cotangent. This VJP runs on
    # the host with vmap_method="expand_dims" (an unbatched operand gets a batch axis of
    # 1) and returns its result in the cotangent's shape: right for one call and for a
    # batch of cotangents, wrong when only the input is batched.
    def host_vjp(x, ct):
        return (np.asarray(ct) * np.cos(x)).reshape(np.shape(ct))

    @jax.custom_vjp
    def sin(x):
        return jax.numpy.sin(x)

    def bwd(x, ct):
        return (jax.pure_callback(host_vjp, jax.ShapeDtypeStruct(x.shape, x.dtype), x, ct,
                                  vmap_method="expand_dims"),)

    sin.defvjp(lambda x: (jax.numpy.sin(x), x), bwd)
    x = np.array([0.3, 1.1, 2.0])
    g = jax.grad(lambda x: sin(x).sum())
    np.testing.assert_allclose(g(x), np.cos(x), rtol=1e-15)  # right for one call
    with pytest.raises(RuleCheckError) as info:
        check_rules(sin, x, check_options=CheckOptions(checks=("vmap",)))
    (row,) = info.value.report.failures
    assert row.name == "vmap" and row.arg == "x" and "vjp" in row.note, row


def test_a_report_sent_through_pickle_keeps_its_verdicts_and_skips():
    # pytest-xdist and multiprocessing move a RuleCheckError between processes by pickle:
    # the report that comes back must say what the original says.
    import pickle

    host_sin = _host_sin()

    host_sin.defvjp(lambda p, out, ct: (-np.cos(p[0]) * ct,))  # wrong sign
    with pytest.raises(RuleCheckError) as info:
        check_rules(host_sin, np.array([0.3, 1.1, 2.0]),
                    check_options=CheckOptions(checks=("vjp_fd", "jvp_fd", "export")))
    report = info.value.report
    again = pickle.loads(pickle.dumps(info.value)).report
    assert [r.name for r in again.skipped] == [r.name for r in report.skipped] \
        == ["jvp_fd", "export"]
    assert [r.name for r in again.failures] == ["vjp_fd"] and not again.passed
    assert again.summary() == report.summary() == {"vjp_fd": "fail", "jvp_fd": "skip",
                                                   "export": "skip"}
    assert again.by_name("vjp_fd") == report.by_name("vjp_fd")


def test_a_failing_row_reports_the_tolerance_of_its_worst_entry():
    # Two wrong entries: out[0] = 1000 sin(x0) off by 1e-4 (a large error, a large
    # tolerance) and out[1] = sin(x1) off by 1e-3 (a small error, a tiny tolerance). The
    # row's tol is that of the entry exceeding its tolerance the most, the one with the
    # largest error: abs err and tol describe the same entry.
    scale = np.array([1000.0, 1.0])

    @jb.foreign(lambda x: x)
    def f(x):
        return scale * np.sin(x)

    f.defvjp(lambda p, out, ct: (scale * np.cos(p[0]) * ct * np.array([1 + 1e-4, 1 + 1e-3]),))
    x = np.array([0.4, 0.9])
    with pytest.raises(RuleCheckError) as info:
        check_rules(f, x, check_options=CheckOptions(checks=("vjp_jacobian",)))
    (row,) = info.value.report.failures
    big = 1000.0 * np.cos(x[0])
    assert row.abs_err == pytest.approx(1e-4 * big, rel=1e-3)
    assert row.tol == pytest.approx(1e-6 * big, rel=0.05), row


@pytest.mark.parametrize("eps", [0, 0.0, -0.1, 1.0, 1.5])
def test_a_first_step_outside_0_1_is_refused(eps):
    with pytest.raises(ValueError, match="eps"):
        CheckOptions(eps=eps)
    assert CheckOptions(eps=0.05).eps == 0.05


def test_a_check_fails_in_the_summary_when_a_later_row_fails():
    # The rule of `a` is right and that of `b` wrong: vjp_fd has a passing row first
    # and a failing one after; the check's summary is its worst row.
    @jb.foreign(lambda a, b: a)
    def f(a, b):
        return a * np.sin(b)

    f.defvjp(lambda p, out, ct: (np.sin(p[1]) * ct, -p[0] * np.cos(p[1]) * ct))
    with pytest.raises(RuleCheckError) as info:
        check_rules(f, np.array([0.5, 1.5]), np.array([0.3, 1.1]),
                    check_options=CheckOptions(checks=("vjp_fd",)))
    report = info.value.report
    assert [(r.arg, r.status) for r in report.results] == [("a", "pass"), ("b", "fail")]
    assert report.summary() == {"vjp_fd": "fail"}


def test_the_same_exception_in_several_checks_is_spelled_out_once():
    host_sin = _host_sin()

    def vjp(primals, out, ct):
        raise ValueError("the adjoint solver diverged")

    host_sin.defvjp(vjp)
    with pytest.raises(RuleCheckError) as info:
        check_rules(host_sin, np.array([0.3, 1.1]),
                    check_options=CheckOptions(checks=("vjp_fd", "vjp_jacobian")))
    message = str(info.value)
    assert message.count("the adjoint solver diverged") == 1, message
    assert "vjp_jacobian" in message and "the same error as vjp_fd" in message


def test_a_function_without_derivative_rules_has_its_rule_checks_skipped():
    host_sin = _host_sin()

    report = check_rules(host_sin, np.array([0.3, 1.1]),
                         check_options=CheckOptions(checks=("vjp_fd", "batched_grad")))
    assert report.summary() == {"vjp_fd": "skip", "batched_grad": "skip"}, str(report)
    assert all("no forward rule" in r.note or "no reverse rule" in r.note
               for r in report.results), str(report)


def test_different_exceptions_with_a_common_wording_are_each_spelled_out():
    host_sin = _host_sin()

    def vjp(primals, out, ct):
        raise ValueError("the adjoint solve raised an overflow")

    def jvp(primals, out, tangents):
        raise TypeError("the tangent callback raised an overflow")

    host_sin.defvjp(vjp)
    host_sin.defjvp(jvp)
    with pytest.raises(RuleCheckError) as info:
        check_rules(host_sin, np.array([0.3, 1.1]),
                    check_options=CheckOptions(checks=("vjp_fd", "jvp_fd")))
    message = str(info.value)
    assert "the adjoint solve raised an overflow" in message, message
    assert "the tangent callback raised an overflow" in message, message
    assert "the same error as" not in message, message


def test_the_default_options_check_three_directions_and_batches_of_three():
    opts = CheckOptions()
    assert (opts.n_directions, opts.batch_size, opts.jacobian_max_size) == (3, 3, 50)
    assert opts.complex_step and opts.upcast and opts.seed == 0


def test_a_correct_rule_passes_where_a_jacobian_row_is_small_by_cancellation():
    # M = A @ B, whose second row is ~1e-13 by cancellation. The forward applies M
    # rounded once (from extended precision); the rules apply A and B in turn, as an
    # adjoint or tangent code would, with rounding errors of a few ulps of the columns'
    # largest entries: far more than the small row's own ulps, and still correct.
    A = np.array([[1.0, 0.0], [1 / 3, -1 / 3]])
    B = np.array([[1.1, 2.3], [1.1 + 3e-13, 2.3 - 5e-13]])
    M = (A.astype(np.longdouble) @ B.astype(np.longdouble)).astype(np.float64)

    @jb.foreign(lambda x: x)
    def f(x):
        return M @ x

    f.defjvp(lambda p, out, t: A @ (B @ t[0]))
    f.defvjp(lambda p, out, ct: (B.T @ (A.T @ ct),))
    report = check_rules(f, np.array([0.7, 1.3]),
                         check_options=CheckOptions(checks=("jvp_jacobian", "vjp_jacobian")))
    assert report.passed, str(report)


def test_a_report_built_by_hand_keeps_its_verdict_rules():
    """The report's own rules, on rows built by hand: a check's summary is its worst
    row (a pass outranks a skip in either order), the failure message names a repeated
    exception once (by what follows "raised "), and lists failed rows with notes in
    full. Options reject an unknown name even when it is both run and skipped."""
    from jaxbridge._testing._report import CheckResult, RuleReport, failure_message
    rows = [CheckResult("vjp_fd", "skip", note="no float inputs"),
            CheckResult("vjp_fd", "pass"),
            CheckResult("jvp_fd", "error", arg="x", note="tangent rule raised ValueError: bad"),
            CheckResult("jit", "error", arg="x", note="the jitted call raised ValueError: bad"),
            CheckResult("vmap", "fail", arg="x", note="compared raised ValueError: bad"),
            CheckResult("batched_grad", "fail", arg="x", note="compared raised ValueError: bad")]
    report = RuleReport("f", "float64", rows, CheckOptions())
    assert report.summary() == {"vjp_fd": "pass", "jvp_fd": "error", "jit": "error",
                                "vmap": "fail", "batched_grad": "fail"}
    message = failure_message(report)
    assert message.count("the same error as jvp_fd") == 1, message
    assert "the same error as vmap" not in message and message.count("compared raised") == 2
    with pytest.raises(ValueError, match=r"unknown check name\(s\) \['bogus'\]"):
        CheckOptions(checks=("bogus",), skip=("bogus",))
    assert CheckOptions(batch_size=1, n_directions=1).batch_size == 1  # the smallest valid
    for bad in ({"batch_size": 0}, {"n_directions": 0}):
        with pytest.raises(ValueError, match="n_directions and batch_size must be >= 1"):
            CheckOptions(**bad)


def test_a_rule_wrong_only_under_jit_is_caught():
    """A VJP rule that is right eagerly and doubles its result when traced (it branches
    on whether it is being traced) passes the eager checks; the jit check compares the
    jitted VJP with the eager one and fails it."""
    @jax.custom_vjp
    def f(x):
        return jax.numpy.sin(x)

    def bwd(x, ct):
        scale = 2.0 if isinstance(ct, jax.core.Tracer) else 1.0
        return (scale * jax.numpy.cos(x) * ct,)

    f.defvjp(lambda x: (f(x), x), bwd)
    with pytest.raises(RuleCheckError) as info:
        check_rules(f, np.array([0.3, 1.1, -0.7]), check_options=FAST)
    assert "jit" in _failed(info.value)


def test_functions_with_only_integer_outputs_or_only_integer_inputs_pass():
    """No differentiable output (a count), or no differentiable input (an index): the
    checks that need both skip their derivative halves; nothing fails or raises."""
    @jb.foreign(lambda x: jax.ShapeDtypeStruct(x.shape, np.int32))
    def signs(x):
        return (x > 0).astype(np.int32)

    report = check_rules(signs, np.array([0.5, -1.0, 2.0]), check_options=FAST)
    assert report.passed, report

    @jb.foreign(lambda n: jax.ShapeDtypeStruct(n.shape, np.float64))
    def halves(n):
        return n / 2.0

    report = check_rules(halves, np.array([1, 2, 3], np.int32), check_options=FAST)
    assert report.passed, report
    # a JAX function of an integer (JAX's own derivatives, exported too): no derivative
    # is checked under vmap where there is none to take
    report = check_rules(lambda n: n / 2.0, np.array([1, 2, 3], np.int32),
                         check_options=CheckOptions(n_directions=2, export=True))
    assert report.passed, report
    assert [r.note for r in report.by_name("vmap")] == ["values: vmap over n vs a loop"]
    # two integer inputs: the values are checked under vmap over each of them
    report = check_rules(lambda n, m: n / 2.0 + m, np.array([1, 2, 3], np.int32),
                         np.array([4, 5, 6], np.int32), check_options=FAST)
    assert report.passed, report
    notes = {r.note for r in report.by_name("vmap")}
    assert {"values: vmap over n vs a loop", "values: vmap over m vs a loop"} <= notes, notes


def test_jit_rounding_differences_of_a_correct_function_pass():
    """Under jit XLA contracts x * 3.1 + 1.7 into a fused multiply-add, one rounding
    fewer than eager's: results differ in the last bit. The jit check allows the
    dtype's rounding relative to the values, so this correct function passes."""
    x = np.random.default_rng(0).uniform(-3.0, 3.0, 64)
    # and to their dtype: float32's rounding, not float64's
    report = check_rules(lambda x: x * np.float32(3.1) + np.float32(1.7), x.astype(np.float32),
                         check_options=CheckOptions(n_directions=2, checks=("jit",)))
    assert report.passed, report
    for scale in (1.0, 1e6):  # the allowance is relative to the values' size
        def f(x, scale=scale):
            return x * (3.1 * scale) + 1.7 * scale

        # (on x86-64 with FMA the two differ for some of these x; elsewhere they may not)
        report = check_rules(f, x, check_options=CheckOptions(n_directions=2, checks=("jit",)))
        assert report.passed, report


def test_vmap_batch_copies_stay_in_a_strict_domain():
    """The vmap checks batch perturbed copies of the input, each element moved by at
    most 5% of itself, and the retrace check calls it again 1% away: a host function
    that refuses x outside (0, 4) outright (not a NaN that both sides would share)
    passes on 30 elements in [0.5, 3]."""
    @jb.foreign(lambda x: x, vmap="vectorized")
    def strict_log(x):
        if np.any((x <= 0) | (x >= 4)):
            raise ValueError(f"strict_log: x must be in (0, 4), got {x.min()}..{x.max()}")
        return np.log(x)

    strict_log.defvjp(lambda p, out, ct: (ct / p[0],))
    report = check_rules(strict_log, np.linspace(0.5, 3.0, 30), check_options=CheckOptions(
        checks=("vmap", "batched_grad", "no_retrace")))
    assert report.passed, str(report)


def test_compile_counts_nest():
    """count_compiles (behind the no_retrace check) inside another: the inner count is
    the inner block's compiles, and the outer one includes them."""
    from jaxbridge._testing._transforms import count_compiles
    with count_compiles() as outer:
        jax.jit(lambda x: x * 5.0 - 2.0)(np.arange(4.0))
        with count_compiles() as inner:
            jax.jit(lambda x: x * 7.0 - 3.0)(np.arange(5.0))
    assert inner[0] >= 1 and outer[0] >= inner[0] + 1, (outer, inner)


def test_exact_zero_derivatives_report_zero_relative_error():
    """A function whose derivative is exactly zero (x * 0): every comparison is exact,
    at a scale of 0, and reports a relative error of 0, not 0 / 0."""
    report = check_rules(lambda x: x * 0.0, np.array([0.5, -1.0, 2.0]),
                         check_options=CheckOptions(n_directions=2, checks=(
                             "vjp_fd", "jvp_fd", "jvp_vjp_consistency")))
    rows = [r for r in report.results if r.rel_err is not None]
    assert rows and all(r.rel_err == 0.0 for r in rows), report


def test_empty_arguments_and_outputs_pass_with_zero_error():
    """A zero-size argument and a zero-size output (an empty batch, say) have nothing to
    compare: their rows pass with zero error and zero tolerance, and the full Jacobians
    have zero columns or rows rather than failing on shapes."""
    def f(x, e):
        return jax.numpy.sin(x) + jax.numpy.sum(e), e * 2.0

    report = check_rules(f, np.array([0.5, -1.0]), np.zeros((0,)), check_options=FAST)
    assert report.passed, report
    empty = [r for r in report.results if r.name in ("vjp_jacobian", "jvp_jacobian")
             and (r.arg == "e" or r.output == "out[1]")]
    assert len(empty) == 6 and all(r.abs_err == r.tol == 0.0 for r in empty), empty


def test_a_vectorized_rule_that_uses_the_first_cotangent_row_is_caught():
    """vmap over every input at once also gives each batch element its own cotangent:
    a vectorized VJP rule that reads only the first cotangent row is right for a shared
    cotangent and wrong for per-element ones, and the vmap check over "*" fails it."""
    @jb.foreign(lambda x, y: x, vmap="vectorized")
    def prod(x, y):
        return np.sin(x) * y

    def vjp(p, out, ct):
        if ct.ndim == 2:  # batched: the bug reads row 0 for every row
            ct = np.broadcast_to(ct[:1], ct.shape)
        return np.cos(p[0]) * p[1] * ct, np.sin(p[0]) * ct

    prod.defvjp(vjp)
    with pytest.raises(RuleCheckError) as info:
        check_rules(prod, np.array([0.3, 1.2, -0.4]), np.array([1.5, -0.5, 2.0]),
                    check_options=CheckOptions(checks=("vmap",)))
    assert any(r.arg == "*" for r in _failed(info.value)["vmap"])


def test_a_complex_rule_that_drops_the_cotangents_imaginary_part_is_caught():
    """A holomorphic f(z) = z^2 whose VJP rule uses only Re(ct): right for real
    cotangents, wrong for complex ones. The checker draws complex cotangents for
    complex outputs, so the rule fails."""
    @jax.custom_vjp
    def sq(z):
        return z * z

    sq.defvjp(lambda z: (sq(z), z), lambda z, ct: (2 * z * ct.real,))
    z = np.array([0.3 + 0.4j, -1.0 + 0.2j])
    with pytest.raises(RuleCheckError) as info:
        check_rules(sq, z, check_options=CheckOptions(n_directions=2, checks=("vjp_fd",)))
    assert "vjp_fd" in _failed(info.value)


def test_the_precision_of_the_finite_difference_checks_is_reported():
    """float32 inputs are upcast to float64 for the finite differences where the
    function allows it, also for a rule with no reverse mode (nothing to upcast there);
    complex128 is already the widest and is reported as it is."""
    @jb.foreign(lambda x: x)
    def sin32(x):
        return np.sin(x)

    sin32.defjvp(lambda p, out, t: np.cos(p[0]) * t[0])
    report = check_rules(sin32, np.array([0.3, 1.2], np.float32), check_options=FAST)
    assert report.passed and report.precision == "float64 (upcast from float32)", report
    report = check_rules(lambda z: z * z, np.array([0.3 + 0.4j, -1.0 + 0.2j]),
                         check_options=FAST)
    assert report.passed and report.precision == "complex128", report.precision


def test_the_complex_step_makes_a_float64_reference_exact_to_rounding():
    """In float64 the complex step (a step of 1e-20) gives the reference to rounding:
    a correct rule's Jacobian is within an ulp of it (a step of 1 would leave an error
    of 8e-15), and the tolerance is near float64's precision."""
    @jax.custom_vjp
    def sin64(x):
        return jax.numpy.sin(x)

    sin64.defvjp(lambda x: (jax.numpy.sin(x), x), lambda x, ct: (jax.numpy.cos(x) * ct,))
    report = check_rules(sin64, np.array([0.3, 1.1, 2.0]),
                         check_options=CheckOptions(checks=("vjp_jacobian",)))
    (row,) = report.results
    assert row.status == "pass" and row.abs_err < 1e-15 and row.tol < 1e-14, row


def test_float16_functions_are_held_to_float16_tolerances():
    """A function that only computes in float16 (it returns float16 whatever it gets,
    so nothing is upcast) is checked at float16's tolerances: 5% for a rule against
    finite differences, 1% between its own VJP and JVP. A VJP twice too large fails both."""
    @jb.foreign(lambda x: x)
    def sin16(x):
        return np.sin(x).astype(np.float16)

    sin16.defjvp(lambda p, out, t: (np.cos(p[0]) * t[0]).astype(np.float16))
    sin16.defvjp(lambda p, out, ct: ((2.0 * np.cos(p[0]) * ct).astype(np.float16),))
    with pytest.raises(RuleCheckError) as info:
        check_rules(sin16, np.array([0.3, 1.1, 2.0], np.float16), check_options=FAST)
    assert info.value.report.precision.startswith("float16"), info.value.report.precision
    assert {"vjp_fd", "jvp_vjp_consistency"} <= set(_failed(info.value))


def test_a_tiny_error_only_under_jit_is_caught_at_a_small_scale():
    """A VJP rule off by 1e-11 only when traced, on values of size 1e-3: the jit check's
    allowance is relative to the values plus a tiny absolute floor (1e-3 of the relative
    tolerance), so it fails."""
    @jax.custom_vjp
    def f(x):
        return 1e-3 * jax.numpy.sin(x)

    def bwd(x, ct):
        extra = 1e-11 if isinstance(ct, jax.core.Tracer) else 0.0
        return (1e-3 * jax.numpy.cos(x) * ct + extra,)

    f.defvjp(lambda x: (f(x), x), bwd)
    with pytest.raises(RuleCheckError) as info:
        check_rules(f, np.array([0.3, 1.1, -0.7]), check_options=CheckOptions(
            n_directions=2, checks=("jit",)))
    assert "jit" in _failed(info.value)
