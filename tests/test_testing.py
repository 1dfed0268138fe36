"""jaxbridge.testing.check_rules: correct rules pass, broken rules are caught and named."""

import os
import pickle
import re
import shutil
import subprocess
import sys
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg
import scipy.special

import jaxbridge as jb
import jaxbridge.errors
from jaxbridge._testing import _diagnose
from jaxbridge._testing._fd import complex_step, direction, element_scales, ridders
from jaxbridge.testing import (
    CHECKS,
    CheckOptions,
    CheckResult,
    RuleCheckError,
    RuleReport,
    assert_rules_correct,
    check_rules,
)

FAST = CheckOptions(n_directions=2)


def _x(rng, *shape, lo=0.3, hi=1.7):
    return rng.uniform(lo, hi, size=shape)


def _failed(err: RuleCheckError) -> dict[str, list[CheckResult]]:
    out: dict[str, list[CheckResult]] = {}
    for r in err.report.failures:
        out.setdefault(r.name, []).append(r)
    return out


# ------------------------------------------------------------------ correct rules
def _solve():
    @jb.foreign(lambda a, b: b)
    def solve(a, b):
        return scipy.linalg.solve(a, b)

    @solve.defvjp
    def _(primals, x, ct):
        a, _ = primals
        lam = scipy.linalg.solve(a.T, ct)
        return -np.outer(lam, x), lam

    @solve.defjvp
    def _(primals, x, tangents):
        (a, _), (da, db) = primals, tangents
        rhs = np.zeros_like(x) if db is None else np.array(db)
        if da is not None:
            rhs = rhs - da @ x
        return scipy.linalg.solve(a, rhs)

    return solve


@pytest.mark.slow
def test_scipy_solve_numpy_rules_pass(rng):
    a = rng.standard_normal((3, 3)) + 3 * np.eye(3)
    report = assert_rules_correct(_solve(), a, rng.standard_normal(3), check_options=FAST)
    summary = report.summary()
    for name in ("output_shapes", "cotangent_shapes", "tangent_shapes", "vjp_fd", "jvp_fd",
                 "vjp_jacobian", "jvp_jacobian", "jvp_vjp_consistency", "symbolic_zeros",
                 "jit", "vmap"):
        assert summary[name] == "pass", (name, str(report))
    assert summary["second_order"] == "skip"
    assert summary["integer_inputs"] == "skip"
    assert report.precision == "float64"
    # the consistency check is near machine precision, not finite-difference accurate
    assert all(r.abs_err < 1e-12 for r in report.by_name("jvp_vjp_consistency"))


def test_scipy_special_gammaln_vjp_only_passes(rng):
    @jb.foreign(lambda x: x)
    def gammaln(x):
        return scipy.special.gammaln(x)

    @gammaln.defvjp
    def _(primals, out, ct):
        return (scipy.special.digamma(primals[0]) * ct,)

    report = check_rules(gammaln, _x(rng, 5), check_options=FAST)
    for name in ("jvp_fd", "jvp_jacobian", "jvp_vjp_consistency", "tangent_shapes"):
        (row,) = report.by_name(name)
        assert row.status == "skip" and "no forward rule" in row.note
    assert report.summary()["vjp_fd"] == "pass"


def _host_sin(kind, vjp=True, jvp=True, vmap="loop"):
    lib = np if kind == "numpy" else jnp

    @jb.foreign(lambda x: x, vmap=vmap)
    def host_sin(x):
        return np.sin(x)

    if vjp:
        host_sin.defvjp(lambda p, out, ct: (lib.cos(p[0]) * ct,), kind=kind)
    if jvp:
        host_sin.defjvp(lambda p, out, t: lib.cos(p[0]) * t[0], kind=kind)
    return host_sin


@pytest.mark.parametrize("shape", [(3, 2), (2, 2, 3)])
def test_non_square_matrix_and_3d_inputs_pass(shape, rng):
    # Not square matrices, so no "transposed" diagnosis is prepared for them.
    report = check_rules(_host_sin("numpy"), _x(rng, *shape), check_options=FAST)
    for name in ("jvp_fd", "vjp_fd", "jvp_jacobian", "vjp_jacobian"):
        assert report.summary()[name] == "pass", str(report)


def test_swapped_arguments_are_named_in_the_hint(rng):
    @jb.foreign(lambda a, b: a)
    def f(a, b):
        return a * b ** 2

    f.defvjp(lambda p, out, ct: (2 * p[0] * p[1] * ct, p[1] ** 2 * ct))  # swapped
    with pytest.raises(RuleCheckError) as info:
        check_rules(f, _x(rng, 3), _x(rng, 3), check_options=FAST)
    hints = {(r.arg, r.hint) for r in _failed(info.value)["vjp_jacobian"]}
    assert ("a", "looks like the derivative with respect to b (arguments swapped?)") in hints
    assert ("b", "looks like the derivative with respect to a (arguments swapped?)") in hints

    # Arguments of other shapes are not candidates: a wrong rule is a plain failure.
    @jb.foreign(lambda a, b: a)
    def g(a, b):
        return a * np.sum(b ** 2)

    g.defvjp(lambda p, out, ct: (-np.sum(p[1] ** 2) * ct, 2 * p[1] * np.sum(p[0] * ct)))
    with pytest.raises(RuleCheckError) as info:
        check_rules(g, _x(rng, 3), _x(rng, 2), check_options=FAST)
    (row,) = _failed(info.value)["vjp_jacobian"]
    assert (row.arg, row.status) == ("a", "fail") and "swapped" not in row.hint, row

    # Nor are arguments of the same size and another shape (a swapped cotangent of
    # another shape fails the shape checks first): a rule off by a factor 2 whose values
    # happen to equal the derivative with respect to a (2, 2) argument is told as such.
    c = jnp.array([0.5, -1.0, 1.5, 2.0])

    @jax.custom_vjp
    def h(a, b):
        return jnp.sum(a * c) + jnp.sum(b * 2 * c.reshape(2, 2))

    h.defvjp(lambda a, b: (h(a, b), None), lambda _, ct: (2 * c * ct, 2 * c.reshape(2, 2) * ct))
    with pytest.raises(RuleCheckError) as info:
        check_rules(h, _x(rng, 4), _x(rng, 2, 2), check_options=FAST)
    (row,) = _failed(info.value)["vjp_jacobian"]
    assert (row.arg, row.hint) == ("a", "off by a constant factor ~2"), row


def test_a_factor_near_one_prints_with_the_digits_that_show_it(rng):
    """A rule 0.2% too large is reported as "~1.002", not as a factor "~1" (a hint that
    would contradict the failure it explains)."""
    @jax.custom_vjp
    def h(a):
        return jnp.sum(jnp.sin(a))

    h.defvjp(lambda a: (h(a), a), lambda a, ct: (1.002 * jnp.cos(a) * ct,))
    with pytest.raises(RuleCheckError) as info:
        check_rules(h, _x(rng, 3), check_options=FAST)
    assert {r.hint for r in _failed(info.value)["vjp_fd"]} == {"off by a constant factor ~1.002"}


def test_hint_guesses_from_the_numbers_alone():
    """guess() on its own: a rule of zeros is "returns zeros" even when another input's
    derivative is zero too (a zero derivative is no evidence of swapped arguments), and
    a constant factor is named when it explains the rule to within 10 tolerances."""
    from jaxbridge._testing._hints import HINTS, guess
    ref, tol = np.array([1.0, -2.0, 3.0]), np.full(3, 1e-6)
    zeros = np.zeros(3)
    assert guess(zeros, ref, tol, swapped=[("b", zeros, tol)]) == HINTS["zeros"]
    assert guess(-ref, ref, tol, swapped=[("b", -ref, tol)]) == HINTS["sign"]
    one = np.array([1.0, 0.0, 0.0])  # one entry off 2 ref, so the median ratio stays 2
    near, far = 2 * ref + one * 9.5 * 2 * tol, 2 * ref + one * 10.5 * 2 * tol  # (|k| tol)
    assert guess(near, ref, tol) == "off by a constant factor ~2"
    assert guess(far, ref, tol) == ""
    # below |k| = 1 the allowance is 10 tolerances, unscaled
    assert guess(0.5 * ref + one * 10.5 * tol, ref, tol) == ""
    # three significant digits, more only where they are needed to differ from 1
    assert guess(1.0312 * ref, ref, tol) == "off by a constant factor ~1.03"
    # the factor is the median ratio over the entries that matter (above 1e-3 of the
    # largest): tiny entries the rule zeroed do not drag it to 0
    small = np.array([1.0, 1e-5, 1e-5, 1e-5, 2.0])
    assert guess(np.array([2.0, 0, 0, 0, 4.0]), small, np.full(5, 1e-5)) == \
        "off by a constant factor ~2"
    # complex conjugation, compared inclusively (an exact conjugate at tolerance 0)
    c = np.array([1 + 2j, -1j, 3.0])
    assert guess(np.conj(c), c, np.zeros(3)) == "looks complex-conjugated"


def test_output_shapes_tells_the_declared_from_the_actual(rng):
    """A function whose shape changes between calls (it reads global state): the eager
    call gives [1], the later trace of its declared shapes [2]; the row says both."""
    calls = []

    def grows(x):
        calls.append(1)
        return jnp.sin(x[:1] if len(calls) == 1 else x[:2])

    with pytest.raises(RuleCheckError) as info:
        check_rules(grows, _x(rng, 3), check_options=CheckOptions(checks=("output_shapes",)))
    (row,) = info.value.report.failures
    assert (row.status, row.hint) == ("fail", "wrong shape"), row
    assert row.note == "declared float64[2], got float64[1]", row


def test_second_order_without_forward_mode_is_checked_reverse_over_reverse(rng):
    """A custom_vjp whose backward pass calls another custom_vjp (the derivative 3x^2,
    with its own rule) has no forward mode over reverse: its Hessian-vector products
    are taken reverse over reverse, and a wrong second derivative is caught there."""
    opts = CheckOptions(n_directions=2, checks=("second_order",), second_order=True)
    for k, status in ((6.0, "pass"), (4.0, "fail")):
        @jax.custom_vjp
        def d_cube(x):
            return 3 * x ** 2

        d_cube.defvjp(lambda x: (3 * x ** 2, x), lambda x, ct, k=k: (k * x * ct,))

        @jax.custom_vjp
        def cube(x):
            return x ** 3

        cube.defvjp(lambda x: (x ** 3, x), lambda x, ct: (d_cube(x) * ct,))
        try:
            report = check_rules(cube, _x(rng, 4), check_options=opts)
        except RuleCheckError as err:
            report = err.report
        (row,) = report.by_name("second_order")
        assert row.status == status and "reverse-over-reverse" in row.note, row


def test_full_jacobians_of_an_output_four_times_the_input_size_limit(rng):
    """100 outputs of 10 inputs: within jacobian_max_size (50) for the inputs and four
    times it for the outputs, so both full-Jacobian checks run."""
    def spread(x):
        return jnp.outer(jnp.sin(x), jnp.arange(1.0, 11.0))

    report = check_rules(spread, _x(rng, 10), check_options=CheckOptions(
        n_directions=2, checks=("vjp_jacobian", "jvp_jacobian")))
    assert report.summary()["vjp_jacobian"] == "pass", str(report)
    assert report.summary()["jvp_jacobian"] == "pass", str(report)


def test_a_small_relative_error_of_a_large_function_is_caught_along_directions(rng):
    """vjp_fd's tolerance is relative to the sum of the pairings it compares: a 0.001%
    error of a function of size 1000 is caught there (a tolerance relative to their
    product, about 500 times looser here, would pass it)."""
    @jax.custom_vjp
    def big_sin(x):
        return 1000.0 * jnp.sin(x)

    big_sin.defvjp(lambda x: (big_sin(x), x), lambda x, ct: (1000.01 * jnp.cos(x) * ct,))
    with pytest.raises(RuleCheckError) as info:
        check_rules(big_sin, _x(rng, 3), check_options=CheckOptions(
            n_directions=2, checks=("vjp_fd",)))
    assert [r.status for r in _failed(info.value)["vjp_fd"]] == ["fail"]


def test_relative_errors_stay_finite_where_the_reference_is_zero(rng):
    """A constant function whose tangent rule returns 1e-30 * t: caught, and its
    relative error is reported against a floor (1e-300), not as a division by 0."""
    @jax.custom_jvp
    def flat(x):
        return jnp.zeros_like(x)

    flat.defjvp(lambda p, t: (flat(p[0]), 1e-30 * t[0]))
    with pytest.raises(RuleCheckError) as info:
        check_rules(flat, _x(rng, 3), check_options=CheckOptions(
            n_directions=2, checks=("jvp_fd",)))
    (row,) = _failed(info.value)["jvp_fd"]
    assert row.hint == "rule is non-zero where the reference is zero", row
    assert 1e250 < row.rel_err < np.inf, row


def test_a_failing_eager_call_is_one_error_and_every_other_check_skipped(rng):
    @jb.foreign(lambda x: x)
    def f(x):
        raise ValueError("the function itself broke")

    with pytest.raises(RuleCheckError) as info:
        check_rules(f, _x(rng, 3), check_options=FAST)
    rows = info.value.report.results
    assert [r.name for r in rows] == [c for c in CHECKS if FAST.enabled(c)]
    assert rows[0].status == "error" and "the function itself broke" in rows[0].note
    assert all(r.status == "skip" and r.note == "the eager call failed" for r in rows[1:])


def test_full_jacobians_of_more_than_256_elements(rng):
    """A user may raise jacobian_max_size: sizes are compared by value (Python caches
    small ints only up to 256, so an identity test would fail a correct rule here)."""
    @jax.custom_vjp
    def f(x):
        return jnp.sin(x)

    f.defvjp(lambda x: (jnp.sin(x), x), lambda x, ct: (jnp.cos(x) * ct,))
    report = check_rules(f, _x(rng, 260), check_options=CheckOptions(
        n_directions=2, jacobian_max_size=260, checks=("vjp_jacobian", "jvp_jacobian")))
    assert report.summary()["vjp_jacobian"] == "pass", str(report)


def test_a_tangent_rule_that_is_not_zero_for_zero_tangents_is_caught(rng):
    @jb.foreign(lambda x: x)
    def f(x):
        return np.sin(x)

    f.defvjp(lambda p, out, ct: (np.cos(p[0]) * ct,))
    f.defjvp(lambda p, out, t: np.cos(p[0]) * t[0] + 0.5)  # an offset: wrong at t = 0
    with pytest.raises(RuleCheckError) as info:
        check_rules(f, _x(rng, 3), check_options=CheckOptions(checks=("symbolic_zeros",)))
    (row,) = _failed(info.value)["symbolic_zeros"]
    assert row.note == "jvp with all-zero tangents must be zero", row


def test_symbolic_zeros_says_which_side_has_no_floating_point_values(rng):
    rows = {}
    for what, f, arg in (("inputs", lambda n: n * 2, np.arange(3)),
                         ("outputs", lambda x: jnp.round(x).astype(jnp.int32), _x(rng, 3))):
        report = check_rules(f, arg, check_options=CheckOptions(checks=("symbolic_zeros",)))
        (rows[what],) = report.by_name("symbolic_zeros")
        assert rows[what].status == "skip", rows[what]
        assert rows[what].note == f"no floating-point {what}", rows[what]


@pytest.mark.parametrize("broken", ["jvp", "vjp"])
def test_a_rule_that_raises_is_reported_as_an_error_of_its_checks(broken, rng):
    """The error is reported where it happened: the tangent rule fails only for a
    tangent on `a` (the check of `b` still runs and passes), the cotangent rule for
    the output's cotangent."""
    @jb.foreign(lambda a, b: a)
    def f(a, b):
        return np.sin(a) * b

    def vjp(p, out, ct):
        if broken == "vjp":
            raise ValueError("the vjp rule broke")
        a, b = p
        return np.cos(a) * b * ct, np.sin(a) * ct

    def jvp(p, out, t):
        if broken == "jvp" and t[0] is not None:
            raise ValueError("the jvp rule broke")
        (a, b), (ta, tb) = p, t
        return (0.0 if ta is None else np.cos(a) * b * ta) + \
            (0.0 if tb is None else np.sin(a) * tb)

    f.defvjp(vjp)
    f.defjvp(jvp)
    with pytest.raises(RuleCheckError) as info:
        check_rules(f, _x(rng, 3), _x(rng, 3), check_options=FAST)
    report = info.value.report
    rows = {(r.arg, r.output): r for r in report.by_name(f"{broken}_fd")}
    if broken == "jvp":
        assert rows[("a", "*")].status == "error", rows
        assert "the jvp rule broke" in rows[("a", "*")].note
        assert rows[("b", "out")].status == "pass", rows
    else:
        assert rows[("*", "out")].status == "error", rows
        assert "the vjp rule broke" in rows[("*", "out")].note
    working = "vjp" if broken == "jvp" else "jvp"
    assert {r.status for r in report.by_name(f"{working}_fd")} == {"pass"}, str(report)


def test_jax_rules_pass_with_second_order_auto(rng):
    report = check_rules(_host_sin("jax"), _x(rng, 2, 3), check_options=FAST)
    assert report.summary()["second_order"] == "pass", str(report)
    # JAX rules have forward mode over reverse: the cheaper Hessian-vector product.
    assert "forward-over-reverse" in report.by_name("second_order")[0].note
    assert report.summary()["jvp_vjp_consistency"] == "pass"


def test_jvp_only_rules(rng):
    # JAX rule: reverse mode by transposition, second order auto-detected.
    report = check_rules(_host_sin("jax", vjp=False), _x(rng, 4), check_options=FAST)
    assert report.summary()["vjp_fd"] == "pass"
    assert report.summary()["second_order"] == "pass"
    # NumPy rule: no reverse mode; the reverse checks are skipped, not failed.
    report = check_rules(_host_sin("numpy", vjp=False), _x(rng, 4), check_options=FAST)
    (row,) = report.by_name("vjp_fd")
    assert row.status == "skip" and "no reverse rule" in row.note
    assert report.summary()["jvp_fd"] == "pass"
    (row,) = report.by_name("jvp_vjp_consistency")  # it needs both modes, and says why
    assert row.status == "skip" and "no reverse rule" in row.note, row


def test_vectorized_vmap_passes(rng):
    check_rules(_host_sin("numpy", vmap="vectorized"), _x(rng, 3), check_options=FAST)


def test_pytree_args_outputs_and_integer_input(rng):
    def result(p, n):
        return {"prod": p["a"], "sum": jax.ShapeDtypeStruct((), p["a"].dtype), "n": n}

    @jb.foreign(result)
    def model(p, n):
        a, (b,) = p["a"], p["bs"]
        return {"prod": a * b ** n, "sum": np.sum(a + b), "n": n}

    @model.defvjp
    def _(primals, out, ct):
        p, n = primals
        a, (b,) = p["a"], p["bs"]
        assert ct["n"] is None  # integer output: no cotangent
        da = ct["prod"] * b ** n + ct["sum"]
        db = ct["prod"] * a * n * b ** (n - 1) + ct["sum"]
        return {"a": da, "bs": (db,)}, None

    @model.defjvp
    def _(primals, out, tangents):
        p, n = primals
        a, (b,) = p["a"], p["bs"]
        tp, tn = tangents
        assert tn is None
        da = np.zeros_like(a) if tp["a"] is None else tp["a"]
        db = np.zeros_like(b) if tp["bs"][0] is None else tp["bs"][0]
        return {"prod": da * b ** n + a * n * b ** (n - 1) * db,
                "sum": np.sum(da + db), "n": None}

    p = {"a": _x(rng, 3), "bs": (_x(rng, 3),)}
    report = check_rules(model, p, np.int32(3), check_options=FAST)
    args = {r.arg for r in report.by_name("vjp_fd")}
    outs = {r.output for r in report.by_name("vjp_fd")}
    assert args == {"p['a']", "p['bs'][0]"}
    assert outs == {"out['prod']", "out['sum']"}
    rows = [r for r in report.by_name("integer_inputs") if r.arg == "n"]
    assert rows and all(r.status == "pass" and "float0" in r.note for r in rows)


def test_complex_holomorphic_rules_pass(rng):
    @jb.foreign(lambda z: z)
    def square(z):
        return z * z

    square.defvjp(lambda p, out, ct: (2 * p[0] * ct,))
    square.defjvp(lambda p, out, t: 2 * p[0] * t[0])
    z = rng.standard_normal(3) + 1j * rng.standard_normal(3)
    report = check_rules(square, z, check_options=FAST)
    assert report.summary()["vjp_fd"] == "pass"
    for name in ("vjp_jacobian", "jvp_jacobian"):  # skipped, and not run after all
        (row,) = report.by_name(name)
        assert row.status == "skip" and row.note.startswith("complex values"), row


def test_plain_custom_vjp_and_custom_jvp_pass(rng):
    @jax.custom_vjp
    def softplus(x):
        return jnp.logaddexp(x, 0.0)

    softplus.defvjp(lambda x: (softplus(x), x), lambda x, ct: (ct * jax.nn.sigmoid(x),))
    report = check_rules(softplus, rng.standard_normal(4), check_options=FAST)
    assert "no forward rule" in report.by_name("jvp_fd")[0].note
    # also where the custom_vjp is inside a jitted function (a sub-program)
    report = check_rules(lambda x: 2 * jax.jit(softplus)(x), rng.standard_normal(4),
                         check_options=FAST)
    (row,) = report.by_name("jvp_fd")
    assert row.status == "skip" and "uses jax.custom_vjp" in row.note, row
    assert report.summary()["vjp_fd"] == "pass"

    @jax.custom_jvp
    def logsumexp(x, y):
        return jnp.log(jnp.exp(x) + jnp.exp(y))

    @logsumexp.defjvp
    def _(primals, tangents):
        (x, y), (dx, dy) = primals, tangents
        out = logsumexp(x, y)
        return out, jnp.exp(x - out) * dx + jnp.exp(y - out) * dy

    report = check_rules(logsumexp, rng.standard_normal(3), rng.standard_normal(3),
                         check_options=FAST)
    assert report.summary()["jvp_vjp_consistency"] == "pass"


def test_float32_upcast_and_native(rng):
    x = _x(rng, 4).astype(np.float32)
    report = check_rules(_host_sin("numpy"), x, check_options=FAST)
    assert report.precision == "float64 (upcast from float32)"

    @jb.foreign(jax.ShapeDtypeStruct((4,), np.float32))
    def sin32(x):
        return np.sin(x).astype(np.float32)

    sin32.defvjp(lambda p, out, ct: (np.cos(p[0]) * ct,))
    sin32.defjvp(lambda p, out, t: np.cos(p[0]) * t[0])
    report = check_rules(sin32, x, check_options=FAST)
    assert report.precision.startswith("float32 (native")


def test_static_kwargs_pass_through(rng):
    @jb.foreign(lambda x, power: x)
    def pw(x, *, power):
        return x ** power

    pw.defvjp(lambda p, out, ct, power: (power * p[0] ** (power - 1) * ct,))
    check_rules(pw, _x(rng, 3), power=3, check_options=FAST)


# ------------------------------------------------------------------ broken rules
def test_wrong_sign_is_caught():
    @jax.custom_vjp
    def cube(x):
        return x ** 3

    cube.defvjp(lambda x: (x ** 3, x), lambda x, ct: (-3 * x ** 2 * ct,))
    with pytest.raises(RuleCheckError) as info:
        check_rules(cube, jnp.arange(1.0, 4.0), check_options=FAST)
    failed = _failed(info.value)
    assert "vjp_fd" in failed and "vjp_jacobian" in failed
    assert "sign flipped" in failed["vjp_fd"][0].hint
    assert "vjp_fd [arg x, output out]" in str(info.value)
    assert isinstance(info.value, AssertionError)


def test_transposed_cotangent_is_caught(rng):
    @jb.foreign(lambda a, v: v)
    def matvec(a, v):
        return a @ v

    @matvec.defvjp
    def _(primals, out, ct):
        a, v = primals
        return np.outer(ct, v).T, a.T @ ct  # bug: the matrix cotangent is transposed

    with pytest.raises(RuleCheckError) as info:
        check_rules(matvec, rng.standard_normal((3, 3)), rng.standard_normal(3),
                    check_options=FAST)
    failed = _failed(info.value)
    assert {r.arg for r in failed["vjp_fd"]} == {"a"}
    assert failed["vjp_fd"][0].hint == "cotangent looks transposed"
    assert failed["vjp_jacobian"][0].hint == "cotangent looks transposed"


def test_missing_factor_is_caught(rng):
    @jb.foreign(lambda x: x)
    def square(x):
        return x ** 2

    square.defvjp(lambda p, out, ct: (p[0] * ct,))  # bug: d(x^2) = 2x
    with pytest.raises(RuleCheckError) as info:
        check_rules(square, _x(rng, 5), check_options=FAST)
    failed = _failed(info.value)
    assert "off by a constant factor ~0.5" in failed["vjp_fd"][0].hint
    assert "off by a constant factor ~0.5" in failed["vjp_jacobian"][0].hint


@pytest.mark.slow
def test_wrong_cotangent_shape_is_caught(rng):
    @jb.foreign(lambda x: x)
    def f(x):
        return np.sin(x)

    f.defvjp(lambda p, out, ct: ((np.cos(p[0]) * ct)[:2],))
    with pytest.raises(RuleCheckError) as info:
        check_rules(f, _x(rng, 3), check_options=FAST)
    failed = _failed(info.value)
    assert failed["cotangent_shapes"][0].hint == "wrong shape"
    assert "wrong shape" in str(info.value)

    @jax.custom_vjp
    def g(x):
        return jnp.sin(x)

    g.defvjp(lambda x: (g(x), x), lambda x, ct: ((ct * jnp.cos(x))[:2],))
    with pytest.raises(RuleCheckError) as info:
        check_rules(g, _x(rng, 3), check_options=FAST)
    assert _failed(info.value)["cotangent_shapes"][0].hint == "wrong shape"


def test_a_longer_cotangent_is_a_wrong_shape_where_jax_does_not_check_it(rng):
    # With JAX's own checks of custom_vjp results turned off (`jax_disable_bwd_checks`,
    # a user setting), a wrong-shaped cotangent reaches the checker itself: one of 4
    # elements for an input of 3 is a wrong shape, not a wrong dtype.
    @jax.custom_vjp
    def g(x):
        return jnp.sin(x)

    g.defvjp(lambda x: (g(x), x),
             lambda x, ct: (jnp.concatenate([ct * jnp.cos(x), jnp.zeros(1)]),))
    was = jax.config.jax_disable_bwd_checks
    jax.config.update("jax_disable_bwd_checks", True)
    try:
        with pytest.raises(RuleCheckError) as info:
            check_rules(g, _x(rng, 3), check_options=CheckOptions(checks=("cotangent_shapes",)))
    finally:
        jax.config.update("jax_disable_bwd_checks", was)
    (row,) = _failed(info.value)["cotangent_shapes"]
    assert row.hint == "wrong shape", row
    assert row.note == "cotangent: expected float64[3], got float64[4]", row


def test_wrong_cotangent_dtype_is_caught(rng):
    @jax.custom_vjp
    def g(x):
        return jnp.sin(x)

    g.defvjp(lambda x: (g(x), x), lambda x, ct: ((ct * jnp.cos(x)).astype(jnp.float32),))
    with pytest.raises(RuleCheckError) as info:
        check_rules(g, _x(rng, 3), check_options=CheckOptions(checks=("cotangent_shapes",)))
    (row,) = _failed(info.value)["cotangent_shapes"]
    assert row.hint == "wrong dtype" and "float32" in row.note

    # A foreign function's rule: the core's ResultMismatchError says what came, under jit too.
    f = _host_sin("numpy", jvp=False)
    f.defvjp(lambda p, out, ct: ((np.cos(p[0]) * ct).astype(np.float32),))
    with pytest.raises(RuleCheckError) as info:
        check_rules(f, _x(rng, 3), check_options=CheckOptions(checks=("cotangent_shapes", "jit")))
    for row in info.value.report.failures:
        assert row.hint == "wrong dtype"
        assert "declared float64[3], received float32[3]" in row.note


def test_jvp_disagreeing_with_vjp_is_caught(rng):
    @jb.foreign(lambda x: x)
    def f(x):
        return np.sin(x)

    f.defvjp(lambda p, out, ct: (np.cos(p[0]) * ct,))
    # A subtle bug (relative error 1e-7): below finite-difference resolution, but the
    # dot-product test between the two rules sees it.
    f.defjvp(lambda p, out, t: np.cos(p[0]) * t[0] * (1 + 1e-7))
    with pytest.raises(RuleCheckError) as info:
        check_rules(f, _x(rng, 4), check_options=FAST)
    assert set(_failed(info.value)) == {"jvp_vjp_consistency"}


def test_jvp_wrong_is_caught_by_fd(rng):
    @jb.foreign(lambda x: x)
    def f(x):
        return np.sin(x)

    f.defvjp(lambda p, out, ct: (np.cos(p[0]) * ct,))
    f.defjvp(lambda p, out, t: -np.cos(p[0]) * t[0])
    with pytest.raises(RuleCheckError) as info:
        check_rules(f, _x(rng, 4), check_options=FAST)
    failed = _failed(info.value)
    assert "jvp_fd" in failed and "jvp_vjp_consistency" in failed and "vjp_fd" not in failed
    assert "sign flipped" in failed["jvp_fd"][0].hint


def test_function_that_does_not_broadcast_breaks_vectorized_vmap(rng):
    @jb.foreign(lambda x: x, vmap="vectorized")
    def normalize(x):
        return x / np.sum(x)  # bug under vmap="vectorized": sums over the batch too

    @normalize.defvjp
    def _(primals, out, ct):
        (x,) = primals
        return ((ct - np.sum(ct * out, axis=-1, keepdims=True))
                / np.sum(x, axis=-1, keepdims=True),)

    with pytest.raises(RuleCheckError) as info:
        check_rules(normalize, _x(rng, 4), check_options=FAST)
    failed = _failed(info.value)
    assert set(failed) == {"vmap"}
    assert any("values" in r.note for r in failed["vmap"])


def test_rule_with_shape_hardcoding_breaks_vmap(rng):
    @jb.foreign(lambda x: x, vmap="vectorized")
    def normalize(x):
        return x / np.sum(x, axis=-1, keepdims=True)

    @normalize.defvjp
    def _(primals, out, ct):
        (x,) = primals
        n = x.shape[0]  # bug: assumes x is 1-D
        return ((ct - np.sum(ct * out) / n * n) / np.sum(x),)

    with pytest.raises(RuleCheckError) as info:
        check_rules(normalize, _x(rng, 4), check_options=FAST)
    failed = _failed(info.value)
    # vmap of the whole call, and a batch of cotangents alone (as jax.jacrev uses it)
    assert set(failed) == {"vmap", "batched_grad"}
    assert all("vjp" in r.note for r in failed["vmap"] + failed["batched_grad"])


def test_declared_dtype_and_shape_mismatch_is_caught(rng):
    @jb.foreign(lambda x: jax.ShapeDtypeStruct(x.shape, np.float32))
    def f(x):
        return np.sin(x)  # float64, declared float32

    with pytest.raises(RuleCheckError) as info:
        check_rules(f, _x(rng, 3))
    (row,) = info.value.report.failures
    assert row.name == "output_shapes" and row.hint == "wrong dtype"
    assert info.value.report.summary()["vjp_fd"] == "skip"

    @jb.foreign(lambda x: jax.ShapeDtypeStruct((2,), x.dtype))
    def g(x):
        return np.sin(x)

    with pytest.raises(RuleCheckError) as info:
        check_rules(g, _x(rng, 3))
    assert info.value.report.failures[0].hint == "wrong shape"


def test_second_order_of_numpy_rules_is_reported_when_forced(rng):
    with pytest.raises(RuleCheckError) as info:
        check_rules(_host_sin("numpy"), _x(rng, 3),
                    check_options=CheckOptions(checks=("second_order",), second_order=True))
    (row,) = info.value.report.failures
    assert row.status == "error" and "MissingRuleError" in row.note


def test_wrong_second_order_is_caught(rng):
    # The VJP is right at first order but written so that its own derivative is wrong.
    @jb.foreign(lambda x: x)
    def f(x):
        return np.sin(x)

    f.defvjp(lambda p, out, ct: (jnp.cos(jax.lax.stop_gradient(p[0])) * ct,), kind="jax")
    with pytest.raises(RuleCheckError) as info:
        check_rules(f, _x(rng, 3), check_options=FAST)
    assert set(_failed(info.value)) == {"second_order"}


# ------------------------------------------------------------------ report and options
def test_report_fields_and_table(rng):
    report = check_rules(_host_sin("numpy"), _x(rng, 3), check_options=FAST)
    assert isinstance(report, RuleReport) and report.passed
    assert report.function == "host_sin" and report.failures == []
    assert {r.name for r in report.results} == set(CHECKS)
    assert {r.name for r in report.skipped} == {"integer_inputs", "second_order", "export"}
    assert "calls back into Python" in report.by_name("export")[0].note
    row = report.by_name("jvp_fd")[0]
    assert (row.status, row.arg, row.output) == ("pass", "x", "out")
    assert row.abs_err <= row.tol and row.rel_err is not None
    text = str(report)
    assert text.startswith("check_rules(host_sin) in float64: all checks passed")
    header = text.splitlines()[1]
    for col in ("check", "status", "arg", "output", "abs err", "rel err", "tol"):
        assert col in header
    assert "jvp_vjp_consistency" in text


def test_options_select_checks_and_validate(rng):
    report = check_rules(_host_sin("numpy"), _x(rng, 3),
                         check_options={"checks": ("vjp_fd", "jit"), "n_directions": 1})
    assert {r.name for r in report.results} == {"vjp_fd", "jit"}
    report = check_rules(_host_sin("numpy"), _x(rng, 3),
                         check_options=CheckOptions(skip=("vmap", "jit")))
    assert not report.by_name("vmap") and report.by_name("vjp_fd")
    with pytest.raises(ValueError, match="unknown check"):
        CheckOptions(checks=("vjp_fdd",))
    # A very loose tolerance lets a (deliberately) wrong rule through.
    f = _host_sin("numpy", jvp=False)
    f.defvjp(lambda p, out, ct: (1.001 * np.cos(p[0]) * ct,))
    with pytest.raises(RuleCheckError):
        check_rules(f, _x(rng, 3), check_options=CheckOptions(checks=("vjp_fd",)))
    check_rules(f, _x(rng, 3), check_options=CheckOptions(checks=("vjp_fd",), rtol=1e-2))


def test_strategies_generate_inputs_for_check_rules():
    hypothesis = pytest.importorskip("hypothesis")
    from jaxbridge.testing import strategies as jst

    f = _host_sin("numpy")

    @hypothesis.settings(max_examples=4, deadline=None, derandomize=True,
                         database=None)
    @hypothesis.given(jst.arrays(shape=jst.shapes(min_dims=1, max_dims=2, max_side=3)),
                      jst.well_conditioned_matrices(3))
    def run(x, a):
        assert np.all(np.isfinite(x)) and np.all(np.abs(x) <= 2)
        assert np.all(np.abs(np.linalg.eigvals(a)) > 0.5)
        assert_rules_correct(f, x, check_options=CheckOptions(
            checks=("vjp_fd", "jvp_fd", "jvp_vjp_consistency"), n_directions=1))

    run()


def test_strategies_are_imported_lazily():
    code = ("import sys, jaxbridge.testing; assert 'hypothesis' not in sys.modules; "
            "jaxbridge.testing.strategies; assert 'hypothesis' in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


# ------------------------------------------------------------------ issue 16: no false alarms
# A zoo of SciPy special functions over wide ranges, each with its derivative rule
# written in NumPy/SciPy: a correct rule must pass in float64 and in float32 (itself,
# not upcast), and the same rule 3% off must fail.
SQRT_2PI = 2.5066282746310002
TWO_OVER_SQRT_PI = 1.1283791670955126  # Python floats keep float32 rules in float32
sc = scipy.special
ZOO = {  # name: (function, derivative, inputs)
    "erfcx": (sc.erfcx, lambda x: 2 * x * sc.erfcx(x) - TWO_OVER_SQRT_PI,
              np.linspace(-2.0, 20.0, 12)),
    "kv": (lambda x: sc.kv(1.5, x), lambda x: -0.5 * (sc.kv(0.5, x) + sc.kv(2.5, x)),
           np.geomspace(0.02, 60.0, 12)),
    "iv": (lambda x: sc.iv(2.0, x), lambda x: 0.5 * (sc.iv(1.0, x) + sc.iv(3.0, x)),
           np.linspace(-30.0, 30.0, 12)),
    "gammaln": (sc.gammaln, sc.digamma, np.geomspace(1e-3, 1e3, 12)),
    "expit": (sc.expit, lambda x: sc.expit(x) * sc.expit(-x), np.linspace(-40.0, 40.0, 12)),
    "log_ndtr": (sc.log_ndtr, lambda x: np.exp(-0.5 * x * x - sc.log_ndtr(x)) / SQRT_2PI,
                 np.linspace(-30.0, 8.0, 12)),
}
FD_CHECKS = ("vjp_fd", "jvp_fd", "vjp_jacobian", "jvp_jacobian", "jvp_vjp_consistency")
NATIVE = CheckOptions(checks=FD_CHECKS, upcast=False)  # float32 checked in float32


def _zoo(name, error=lambda x: 1.0):
    """ZOO[name] as a foreign function with NumPy rules; `error(x)` scales the derivative."""
    fun, slope, _ = ZOO[name]

    def deriv(x):
        return (slope(x) * error(x)).astype(x.dtype)

    @jb.foreign(lambda x: x)
    def f(x):
        return fun(x).astype(x.dtype)

    f.defvjp(lambda p, out, ct: (deriv(p[0]) * ct,))
    f.defjvp(lambda p, out, t: deriv(p[0]) * t[0])
    return f


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_issue_16_erfcx_rule_on_minus_2_to_20_is_not_flagged(dtype):
    # The report: a correct erfcx rule failed ("off by a constant factor ~1.04") because
    # one finite-difference step, scaled by the inputs' RMS value, served all of them.
    x = np.linspace(-2.0, 20.0, 12).astype(dtype)
    report = check_rules(_zoo("erfcx"), x)  # every check, default options
    assert report.passed, str(report)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("name", sorted(ZOO))
def test_correct_special_function_rules_pass_over_wide_ranges(name, dtype):
    report = check_rules(_zoo(name), ZOO[name][2].astype(dtype), check_options=NATIVE)
    assert report.precision == np.dtype(dtype).name
    assert [r.status for r in report.results] == ["pass"] * len(report.results), str(report)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("name", sorted(ZOO))
def test_a_3_percent_error_is_caught_on_the_same_ranges(name, dtype):
    with pytest.raises(RuleCheckError) as info:
        check_rules(_zoo(name, lambda x: 1.03), ZOO[name][2].astype(dtype),
                    check_options=NATIVE)
    failed = _failed(info.value)
    assert {"jvp_fd", "vjp_jacobian", "jvp_jacobian"} <= set(failed)
    assert "jvp_vjp_consistency" not in failed  # both rules are off by the same factor
    assert {r.hint for r in failed["vjp_jacobian"] + failed["jvp_jacobian"]} == \
        {"off by a constant factor ~1.03"}


@pytest.mark.parametrize("name, where", [
    ("erfcx", lambda x: x > 10), ("kv", lambda x: x > 20), ("iv", lambda x: abs(x) < 3),
    ("gammaln", lambda x: x > 100), ("expit", lambda x: x > 20),
    ("log_ndtr", lambda x: x > 2)])
def test_a_3_percent_error_where_the_derivative_is_tiny_is_caught(name, where):
    # Tolerances are relative to each element: an error confined to the elements whose
    # derivative is 1e-4 .. 1e-27 of the largest is not hidden by the large ones.
    bad = _zoo(name, lambda x: np.where(where(x), 1.03, 1.0))
    with pytest.raises(RuleCheckError) as info:
        check_rules(bad, ZOO[name][2], check_options=NATIVE)
    assert {"vjp_jacobian", "jvp_jacobian"} <= set(_failed(info.value))


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(1, 9))
def test_zoo_over_many_seeds_and_every_check(seed):
    for name in sorted(ZOO):
        for dtype in (np.float64, np.float32):
            x = ZOO[name][2].astype(dtype)
            for upcast in (True, False):
                opts = CheckOptions(seed=seed, upcast=upcast,
                                    checks=None if seed == 1 else FD_CHECKS)
                report = check_rules(_zoo(name), x, check_options=opts)
                assert report.passed, str(report)
            with pytest.raises(RuleCheckError):
                check_rules(_zoo(name, lambda x: 1.03), x,
                            check_options=CheckOptions(seed=seed, checks=FD_CHECKS, upcast=False))


# ------------------------------------------------------------------ the finite differences
def _wave(x):
    return np.exp(-x * x / 50) * np.sin(3 * x)


def _wave_slope(x):
    return np.exp(-x * x / 50) * (3 * np.cos(3 * x) - x / 25 * np.sin(3 * x))


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_finite_difference_error_bounds_hold_and_the_complex_step_tightens_them(dtype):
    x = (np.geomspace(1e-3, 30.0, 25) * np.where(np.arange(25) % 2, 1, -1)).astype(dtype)
    eps = float(np.finfo(dtype).eps)
    cdtype = np.result_type(dtype, np.complex64)
    rng = np.random.default_rng(0)
    for _ in range(5):
        t = direction(rng, element_scales(x), dtype)
        assert np.all((np.abs(t) >= 0.5 * np.abs(x)) & (np.abs(t) <= np.abs(x)))
        d = ridders(lambda h: [_wave((x + h * t).astype(dtype))], 0.1, eps)
        truth = _wave_slope(x.astype(np.float64)) * t  # exact to float64 round-off
        assert np.all(np.abs(d.value[0] - truth) <= d.error[0])
        assert np.all(d.error[0] <= 1e-2 * np.abs(truth) + 1e-300) or dtype == np.float32
        c = complex_step(lambda z: [_wave((x + z * t).astype(cdtype))], [_wave(x)], d,
                         1e-20 if dtype == np.float64 else 1e-10, eps)
        assert np.all(np.abs(c.value[0] - truth) <= c.error[0])
        assert np.all(c.error[0] <= d.error[0])
        assert np.median(c.error[0] / d.error[0]) < 0.5


def test_ridders_reaches_near_full_precision_on_a_polynomial():
    """The tableau's error estimate compares each entry with the previous row's (Ridders'
    rule), which keeps the most accurate entry: 4e-14 relative on x^7 - 3 x^3 from steps
    of 0.1 (comparing with a row further back doubles or triples the error). A polynomial
    is evaluated with IEEE operations only, so this does not depend on the platform's libm."""
    x = np.linspace(-3.0, 3.0, 61)
    truth = 7 * x ** 6 - 9 * x ** 2
    d = ridders(lambda h: [(x + h) ** 7 - 3 * (x + h) ** 3], 0.1, 2.2e-16)
    big = np.abs(truth) > 1e-3
    assert np.max(np.abs(d.value[0] - truth)[big] / np.abs(truth[big])) < 7e-14
    assert np.all(np.abs(d.value[0] - truth) <= d.error[0])
    # central differences of a quadratic are exact: the tableau's differences are 0, no
    # worse than the error estimate 0, so every element settles after three levels (six
    # evaluations; each may be a solver run), not LEVELS
    steps, y = [], np.array([0.5, 1.0, -2.0])

    def quadratic(h):
        steps.append(h)
        return [(y + h) ** 2]
    d = ridders(quadratic, 0.1, 2.2e-16)
    np.testing.assert_allclose(d.value[0], 2 * y, rtol=1e-13)
    assert len(steps) == 6, steps


def test_complex_directions_have_the_elements_magnitude():
    """direction() for a complex input: a random phase, and a magnitude in [s/2, s]
    of each element's scale s, as for real inputs."""
    scales = np.array([1e-3, 0.5, 2.0, 300.0])
    t = direction(np.random.default_rng(0), scales, np.complex128)
    assert t.dtype == np.complex128
    assert np.all((np.abs(t) >= 0.5 * scales) & (np.abs(t) <= scales * (1 + 1e-15)))
    assert np.ptp(np.angle(t)) > 0.5  # not all one phase


def test_the_complex_step_is_refused_where_the_function_is_not_analytic():
    x = np.linspace(-2.0, 2.0, 9)
    t = np.ones_like(x)
    f = lambda x: x * np.abs(x)  # noqa: E731 - |x| of a complex number is real
    d = ridders(lambda h: [f(x + h * t)], 0.1, 2.2e-16)
    c = complex_step(lambda z: [f(x + z * t)], [f(x)], d, 1e-20, 2.2e-16)
    away = x != 0  # (at 0, where the derivative is 0, it happens to agree)
    np.testing.assert_array_equal(c.value[0][away], d.value[0][away])
    assert np.all(np.abs(c.value[0] - 2 * np.abs(x)) <= c.error[0])
    # a function that does not take complex inputs at all
    def real_only(z):
        raise TypeError("complex not supported")
    assert complex_step(real_only, [f(x)], d, 1e-20, 2.2e-16) is d
    # complex outputs whose real part is not the function's own (off by 1e-3) are not an
    # analytic continuation, even where their imaginary part agrees with the estimate
    e = ridders(lambda h: [np.exp(x + h * t)], 0.1, 2.2e-16)
    off = complex_step(lambda z: [np.exp(x + z * t) + 1e-3], [np.exp(x)], e, 1e-20, 2.2e-16)
    np.testing.assert_array_equal(off.value[0], e.value[0])
    np.testing.assert_array_equal(off.error[0], e.error[0])
    # an infinite complex step is refused quietly (no warning escapes the checker)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        inf = complex_step(lambda z: [np.exp(x) + 1j * np.inf], [np.exp(x)], e, 1e-20, 2.2e-16)
    np.testing.assert_array_equal(inf.value[0], e.value[0])


def test_steps_are_relative_to_each_element_and_zeros_borrow_a_scale():
    np.testing.assert_array_equal(element_scales(np.array([-2.0, 0.0, 1e-3, 20.0])),
                                  [2.0, 1e-3, 1e-3, 20.0])
    np.testing.assert_array_equal(element_scales(np.zeros(3)), np.ones(3))
    # near a pole (gammaln at 1e-3) and a domain edge (log at 1e-8) the steps stay inside
    report = check_rules(_zoo("gammaln"), np.array([1e-3, 0.5, 1e3]), check_options=NATIVE)
    assert report.passed

    @jb.foreign(lambda x: x)
    def log(x):
        return np.log(x)

    log.defvjp(lambda p, out, ct: (ct / p[0],))
    check_rules(log, np.array([1e-8, 1.0, 1e8]))


def test_options_reject_bad_steps_and_tolerances():
    with pytest.raises(ValueError, match="eps"):
        CheckOptions(eps=2.0)
    with pytest.raises(ValueError, match="nondet_tol"):
        CheckOptions(nondet_tol=-1.0)


# ------------------------------------------------------------------ what gradcheck also checks
def _noisy_sin(noise):
    """sin with a VJP rule that is right on average but nondeterministic."""
    noise_rng = np.random.default_rng(1)

    @jb.foreign(lambda x: x)
    def noisy_sin(x):
        return np.sin(x)

    noisy_sin.defvjp(lambda p, out, ct: (
        np.cos(p[0]) * ct * (1 + noise * noise_rng.standard_normal(p[0].shape)),))
    return noisy_sin


def test_nondeterministic_rules_are_reported_and_tolerated_with_nondet_tol(rng):
    x = _x(rng, 4)
    with pytest.raises(RuleCheckError) as info:
        check_rules(_noisy_sin(1e-8), x, check_options=FAST)
    failed = _failed(info.value)
    assert "deterministic" in failed
    assert failed["deterministic"][0].hint.startswith("nondeterministic")
    assert set(failed) <= {"deterministic", "jit", "vmap", "batched_grad"}  # not the FD checks
    report = check_rules(_noisy_sin(1e-8), x,
                         check_options=CheckOptions(n_directions=2, nondet_tol=1e-6))
    assert report.passed and report.summary()["deterministic"] == "pass"
    # but nondet_tol does not hide a wrong rule
    f = _noisy_sin(0.0)
    f.defvjp(lambda p, out, ct: (1.03 * np.cos(p[0]) * ct,))
    with pytest.raises(RuleCheckError) as info:
        check_rules(f, x, check_options=CheckOptions(n_directions=2, nondet_tol=1e-6))
    assert "vjp_fd" in _failed(info.value)


def test_batched_gradients_are_checked_against_a_loop(rng):
    report = check_rules(_solve(), rng.standard_normal((3, 3)) + 3 * np.eye(3),
                         rng.standard_normal(3), check_options=CheckOptions(
                             checks=("batched_grad",)))
    rows = report.by_name("batched_grad")
    assert {r.status for r in rows} == {"pass"}
    assert any("vmap over 3 cotangents" in r.note for r in rows)
    assert any("vmap over 3 tangents" in r.note for r in rows)


def test_a_function_that_compiles_on_every_call_is_caught(rng):
    def leaky(x):
        return jax.jit(lambda y: jnp.sin(y) * 2.0)(x)  # a new jit (and compile) per call

    with pytest.raises(RuleCheckError) as info:
        check_rules(leaky, _x(rng, 3), check_options=CheckOptions(checks=("no_retrace",)))
    (row,) = _failed(info.value)["no_retrace"]
    assert row.hint.startswith("recompiles on every call")
    assert re.search(r"call: 1 program(?!s)", row.note), row.note  # singular
    report = check_rules(_solve(), np.eye(3) * 2, np.ones(3),
                         check_options=CheckOptions(checks=("no_retrace",)))
    assert report.passed and "nothing compiled" in report.results[0].note


@pytest.mark.skipif(not jb.ops.available(), reason="built-in kernels not built")
def test_kernels_round_trip_through_jax_export(rng):
    report = check_rules(jb.ops.softplus, rng.standard_normal(5), beta=2.0,
                         check_options=CheckOptions(checks=("export",)))
    rows = report.by_name("export")
    assert {r.status for r in rows} == {"pass"}
    assert any("values" in r.note for r in rows) and any("vjp" in r.note for r in rows)
    # a host function cannot be exported: skipped, with the reason
    report = check_rules(_host_sin("numpy"), _x(rng, 3),
                         check_options=CheckOptions(checks=("export",)))
    assert "calls back into Python" in report.results[0].note


def test_primal_values_catches_a_fwd_that_computes_other_outputs(rng):
    """A custom_vjp whose fwd returns another value than the function: jax.vjp gives
    the fwd's (what training sees), a plain call the function's. A kernel's forward
    with residuals is checked the same way (test_kernel_residuals.py)."""
    @jax.custom_vjp
    def f(x):
        return jnp.sin(x)

    f.defvjp(lambda x: (jnp.sin(x) * 1.001, x), lambda x, ct: (jnp.cos(x) * ct,))
    with pytest.raises(RuleCheckError) as info:
        check_rules(f, _x(rng, 4), check_options=CheckOptions(checks=("primal_values",)))
    (row,) = _failed(info.value)["primal_values"]
    assert row.note == "values: jax.vjp's outputs vs the call"
    assert check_rules(jnp.sin, _x(rng, 4), check_options=CheckOptions(
        checks=("primal_values",))).passed


@pytest.mark.skipif(not jb.ops.available(), reason="built-in kernels not built")
def test_the_export_check_without_flatbuffers_is_skipped_not_run(rng, monkeypatch):
    """Right after `pip install .` (no extras) jax.export's serialization lacked
    flatbuffers: the check reported ERROR. flatbuffers is now a dependency; should it
    be missing anyway, the check says it did not run, and why."""
    monkeypatch.setitem(sys.modules, "flatbuffers", None)  # `import flatbuffers` fails
    monkeypatch.delitem(sys.modules, "jax._src.export.serialization", raising=False)
    report = check_rules(jb.ops.softplus, rng.standard_normal(5),
                         check_options=CheckOptions(checks=("export",)))
    (row,) = report.by_name("export")
    assert row.status == "skip" and "needs the flatbuffers package" in row.note
    assert report.passed


SCRIBBLE = """
#include "jaxbridge/ffi_helpers.h"
namespace ffi = xla::ffi;
// y = 2 x, and (the bug) x[0] = 0 afterwards: it writes into a buffer it was only lent.
ffi::Error Fwd(ffi::Buffer<ffi::F64> x, ffi::ResultBuffer<ffi::F64> y) {
  double* in = const_cast<double*>(x.typed_data());
  for (size_t i = 0; i < x.element_count(); ++i) y->typed_data()[i] = 2 * in[i];
  if (x.element_count() > 0) in[0] = 0.0;
  return ffi::Error::Success();
}
ffi::Error Deriv(ffi::Buffer<ffi::F64> x, ffi::Buffer<ffi::F64> v,
                 ffi::ResultBuffer<ffi::F64> out) {
  for (size_t i = 0; i < x.element_count(); ++i) out->typed_data()[i] = 2 * v.typed_data()[i];
  return ffi::Error::Success();
}
XLA_FFI_DEFINE_HANDLER_SYMBOL(ScribbleForward, Fwd, ffi::Ffi::Bind()
    .Arg<ffi::Buffer<ffi::F64>>().Ret<ffi::Buffer<ffi::F64>>());
XLA_FFI_DEFINE_HANDLER_SYMBOL(ScribbleDerivative, Deriv, ffi::Ffi::Bind()
    .Arg<ffi::Buffer<ffi::F64>>().Arg<ffi::Buffer<ffi::F64>>().Ret<ffi::Buffer<ffi::F64>>());
"""


@pytest.mark.skipif(shutil.which(os.environ.get("CXX", "c++")) is None, reason="no C++ compiler")
@pytest.mark.cpu  # a kernel compiled for the CPU only
def test_a_kernel_that_writes_into_its_input_is_caught(tmp_path, monkeypatch):
    monkeypatch.setenv("JAXBRIDGE_CACHE_DIR", str(tmp_path / "cache"))
    lib = jb.cpp.load("scribble", source=SCRIBBLE)
    scribble = lib.kernel(forward="ScribbleForward", vjp="ScribbleDerivative",
                          jvp="ScribbleDerivative", result=lambda x: x,
                          dtypes=["float64"], pass_outputs=False)
    with pytest.raises(RuleCheckError) as info:
        check_rules(scribble, np.array([1.0, 2.0, 3.0]), check_options=FAST)
    (row,) = _failed(info.value)["inputs_unchanged"]
    assert row.arg == "x" and row.hint.startswith("an input was overwritten")


# ------------------------------------------------------------------ errors
def test_rule_check_error_is_jaxbridge_errors_rule_check_error_with_its_report(rng):
    assert RuleCheckError is jaxbridge.errors.RuleCheckError
    assert issubclass(RuleCheckError, (jaxbridge.errors.JaxbridgeError, AssertionError))
    f = _host_sin("numpy", jvp=False)
    f.defvjp(lambda p, out, ct: (-np.cos(p[0]) * ct,))
    with pytest.raises(jaxbridge.errors.JaxbridgeError) as info:
        check_rules(f, _x(rng, 3), check_options=CheckOptions(checks=("vjp_fd",)))
    err = info.value
    assert isinstance(err.report, RuleReport) and not err.report.passed
    assert str(err).startswith("check_rules(host_sin): 1 of 1 checks failed")
    again = pickle.loads(pickle.dumps(err))
    assert str(again) == str(err) and again.report.failures[0].hint == err.report.failures[0].hint
    assert RuleCheckError("by hand").report is None


def test_failures_are_classified_by_exception_type_and_attributes():
    ResultMismatchError = jaxbridge.errors.ResultMismatchError
    for problem, hint in _diagnose.PROBLEM_HINTS.items():
        err = ResultMismatchError("text that says nothing", function="f", what="cotangent 0",
                                  problem=problem, declared="float32[3]", received="x")
        carrier = RuntimeError("INTERNAL: opaque")
        carrier.__cause__ = err  # e.g. raised under jit, re-raised by JAX
        assert _diagnose.hint(carrier) == hint
        assert _diagnose.note(carrier) == ("raised ResultMismatchError: cotangent 0 of 'f': "
                                           "declared float32[3], received x")
    assert _diagnose.is_missing_rule(jaxbridge.errors.MissingRuleError("no jvp"))
    assert not _diagnose.is_missing_rule(TypeError("forward-mode needs a custom_vjp defjvp"))
    assert _diagnose.note(ValueError("INTERNAL: boom\nsecond")) == "raised ValueError: boom second"
    # One line of at most three lines of the message, at most 400 characters.
    assert _diagnose.note(ValueError("a\n b\nc\nd")) == "raised ValueError: a b c"
    assert _diagnose.note(ValueError("x" * 500)) == "raised ValueError: " + "x" * 397 + "..."
    assert _diagnose.note(ValueError("y" * 400)) == "raised ValueError: " + "y" * 400
    assert _diagnose.note(ValueError("z" * 401)) == "raised ValueError: " + "z" * 397 + "..."


def test_errors_are_classified_through_their_whole_chain_and_known_wording_only():
    ResultMismatchError = jaxbridge.errors.ResultMismatchError
    # An error raised while handling another (its __context__, no __cause__) is still
    # found behind the error that ended the call.
    try:
        try:
            raise ResultMismatchError("x", problem="dtype", declared="float64[3]",
                                      received="float32[3]")
        except ResultMismatchError:
            raise RuntimeError("INTERNAL: opaque")  # noqa: B904 - the implicit chain
    except RuntimeError as err:
        implicit = err
    assert implicit.__cause__ is None
    assert _diagnose.hint(implicit) == "wrong dtype"
    # The direct cause comes before the context: `raise ... from` inside an except block.
    try:
        try:
            raise ResultMismatchError("x", problem="dtype", declared="a", received="b")
        except ResultMismatchError:
            raise RuntimeError("INTERNAL: opaque") from ResultMismatchError(
                "x", problem="shape", declared="float64[3]", received="float64[4]")
    except RuntimeError as err:
        both = err
    assert _diagnose.hint(both) == "wrong shape"
    assert _diagnose.note(both).endswith("declared float64[3], received float64[4]")

    # A failure that crossed XLA as a status (a worker thread's): JAX's error carries a
    # token for the kept original; note and hint are the original's.
    original = ValueError("assignment destination is read-only")
    token = jaxbridge.errors.remember_failure(original)
    carried = RuntimeError(f"INTERNAL: ValueError: {original}\n  in the vjp rule of "
                           f"jaxbridge foreign function 'f'\n  [jaxbridge failure #{token}: "
                           "jaxbridge.errors.original_exception(err) returns the exception "
                           "object]")
    assert _diagnose.note(carried) == "raised ValueError: assignment destination is read-only"
    assert _diagnose.hint(carried) == _diagnose.WROTE_INPUT

    # Only a ValueError that says "read-only" is a write into a lent input; JAX's and
    # XLA's wording gives shape and dtype hints; anything else gets no hint.
    assert _diagnose.hint(ValueError("assignment destination is read-only")) == \
        _diagnose.WROTE_INPUT
    for unrelated in (ValueError("math domain error"), OSError("read-only file system"),
                      TypeError("unsupported operand")):
        assert _diagnose.hint(unrelated) == "", unrelated
    for message, hint in [
        ("the bwd rule produced an output of type float64[2] corresponding to an input of "
         "type float64[3], so the shapes do not match", "wrong shape"),
        ("shape mismatch: value array of shape (2,) could not be broadcast", "wrong shape"),
        ("add got incompatible shapes for broadcasting: (3,), (4,)", "wrong shape"),
        ("the bwd rule produced float32 for float64, so the dtypes do not match",
         "wrong dtype"),
        ("INTERNAL: Wrong buffer dtype: expected F32 but got F64", "wrong dtype"),
    ]:
        assert _diagnose.hint(TypeError(message)) == hint, message


def test_custom_vjp_is_classified_from_the_program_structure(rng):
    @jax.custom_vjp
    def g(x):
        return jnp.sin(x)

    g.defvjp(lambda x: (g(x), x), lambda x, ct: (ct * jnp.cos(x),))
    x = _x(rng, 3)
    assert _diagnose.has_custom_vjp(lambda x: 2.0 * g(x), x)
    assert _diagnose.has_custom_vjp(jax.jit(lambda x: jnp.exp(g(x))), x)  # inside a jit
    assert not _diagnose.has_custom_vjp(lambda x: jnp.exp(jnp.sin(x)), x)
    assert not _diagnose.has_custom_vjp(jax.jit(lambda x: jnp.sum(x ** 2)), x)


def test_a_function_jax_cannot_trace_is_not_mistaken_for_a_custom_vjp(rng):
    def f(x):
        return jnp.sin(x) * float(x[0])  # runs eagerly; under jit, float() fails

    with pytest.raises(RuleCheckError) as info:
        check_rules(f, _x(rng, 3), check_options=FAST)
    (row,) = info.value.report.by_name("jvp_fd")
    assert row.status == "error" and "custom_vjp" not in row.note, row


# ------------------------------------------------------------------ the checker asks
DERIVATIVE_CHECKS = {"forward": ("jvp_fd", "jvp_jacobian"), "reverse": ("vjp_fd", "vjp_jacobian")}


def _linear_scale():
    f = jb.foreign(lambda x: x, linear=True)(lambda x: 2.0 * x)
    f.deftranspose(lambda ct: (2.0 * ct,))
    return f


def _custom_gradient_sin():
    @jb.custom_gradient(lambda x: x)
    def sin(x):
        return np.sin(x), lambda ct: np.cos(x) * ct
    return sin


CHECKABLE = {
    "foreign vjp": lambda: _host_sin("numpy", jvp=False),
    "foreign jvp": lambda: _host_sin("numpy", vjp=False),
    "foreign jvp kind=jax": lambda: _host_sin("jax", vjp=False),
    "foreign both": lambda: _host_sin("numpy"),
    "linear + deftranspose": _linear_scale,
    "custom_gradient": _custom_gradient_sin,
}
if jb.ops.available():
    CHECKABLE["kernel"] = lambda: jb.ops._softplus_kernel()


@pytest.mark.parametrize("what", sorted(CHECKABLE))
def test_no_derivative_check_is_skipped_for_a_derivative_the_function_has(what, rng):
    f = CHECKABLE[what]()
    says = f.derivatives()
    assert isinstance(says, jb.testing.Derivatives) and (says.forward or says.reverse)
    report = check_rules(f, _x(rng, 4), check_options=FAST)
    for mode, has in (("forward", says.forward), ("reverse", says.reverse)):
        for name in DERIVATIVE_CHECKS[mode]:
            (row,) = report.by_name(name)
            assert (row.status == "pass") == bool(has), (what, name, row)
    assert {r.status for r in report.by_name("derivatives_checked")} <= {"pass", "skip"}


def test_what_each_object_says_it_has():
    d = _linear_scale().derivatives()
    assert (d.forward, d.reverse, d.second_order) == (
        "the function itself (linear=True)", "deftranspose rule (numpy)", True)
    d = jb.foreign(lambda x: x, linear=True)(lambda x: x).derivatives()
    assert d.reverse is None and "deftranspose" in d.missing
    d = _custom_gradient_sin().derivatives()
    assert d.forward is None and d.reverse == "custom_gradient's grad_fn (numpy)"
    d = _host_sin("jax", vjp=False).derivatives()
    assert d.reverse.startswith("JAX transposes") and d.second_order
    d = _host_sin("numpy", vjp=False).derivatives()
    assert d.reverse is None and not d.second_order and "defvjp" in d.missing
    k = jb.kernel("k_fwd", jvp="k_tan", result=lambda x: x)
    assert (k.derivatives().forward, k.derivatives().reverse) == ("JVP kernel", None)
    assert "forward mode: JVP kernel" in k.derivatives().how


def test_a_function_with_rules_that_no_check_ran_on_does_not_pass(rng):
    # Only the full-Jacobian check selected, and the input too large for it: nothing
    # checked the reverse rule, so the report must not pass.
    opts = CheckOptions(checks=("vjp_jacobian", "derivatives_checked"), jacobian_max_size=2)
    with pytest.raises(RuleCheckError) as info:
        check_rules(_host_sin("numpy", jvp=False), _x(rng, 4), check_options=opts)
    (row,) = _failed(info.value)["derivatives_checked"]
    assert row.hint == "reverse mode never checked"
    assert "defvjp rule (numpy)" in row.note and "too large" in row.note


class _Wrapper:
    """A callable from outside jaxbridge that answers the capability query (as the
    PyTorch wrapper will)."""

    def __init__(self, forward):
        self.claims_forward = forward

        @jax.custom_vjp
        def f(x):
            return jnp.sin(x)

        f.defvjp(lambda x: (jnp.sin(x), x), lambda x, ct: (jnp.cos(x) * ct,))
        self.f = f

    def __call__(self, x):
        return self.f(x)

    def derivatives(self):
        return jb.testing.Derivatives(forward="claimed" if self.claims_forward else None,
                                      reverse="a custom_vjp", missing="no forward mode here")


def test_the_checker_trusts_the_answer_and_fails_loudly_when_it_is_wrong(rng):
    report = check_rules(_Wrapper(forward=False), _x(rng, 3), check_options=FAST)
    (row,) = report.by_name("jvp_fd")
    assert row.status == "skip" and "no forward mode here" in row.note
    with pytest.raises(RuleCheckError) as info:  # claims a forward mode it lacks
        check_rules(_Wrapper(forward=True), _x(rng, 3), check_options=FAST)
    assert "jvp_fd" in _failed(info.value)


def test_a_plain_function_over_a_jvp_only_host_function_is_probed_in_reverse_too(rng):
    inner = _host_sin("numpy", vjp=False)
    report = check_rules(lambda x: inner(x) * 2.0, _x(rng, 3), check_options=FAST)
    (row,) = report.by_name("vjp_fd")
    assert row.status == "skip" and "no reverse rule" in row.note
    assert report.summary()["jvp_fd"] == "pass"
