"""jaxbridge.testing.check_rules: correct rules pass, broken rules are caught and named."""

import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg
import scipy.special

import jaxbridge as jb
from jaxbridge.testing import (CHECKS, CheckOptions, CheckResult, RuleCheckError, RuleReport,
                               assert_rules_correct, check_rules)

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


def test_jax_rules_pass_with_second_order_auto(rng):
    report = check_rules(_host_sin("jax"), _x(rng, 2, 3), check_options=FAST)
    assert report.summary()["second_order"] == "pass", str(report)
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
    assert report.by_name("vjp_jacobian")[0].status == "skip"


def test_plain_custom_vjp_and_custom_jvp_pass(rng):
    @jax.custom_vjp
    def softplus(x):
        return jnp.logaddexp(x, 0.0)

    softplus.defvjp(lambda x: (softplus(x), x), lambda x, ct: (ct * jax.nn.sigmoid(x),))
    report = check_rules(softplus, rng.standard_normal(4), check_options=FAST)
    assert "no forward rule" in report.by_name("jvp_fd")[0].note

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


def test_wrong_cotangent_dtype_is_caught(rng):
    @jax.custom_vjp
    def g(x):
        return jnp.sin(x)

    g.defvjp(lambda x: (g(x), x), lambda x, ct: ((ct * jnp.cos(x)).astype(jnp.float32),))
    with pytest.raises(RuleCheckError) as info:
        check_rules(g, _x(rng, 3), check_options=CheckOptions(checks=("cotangent_shapes",)))
    (row,) = _failed(info.value)["cotangent_shapes"]
    assert row.hint == "wrong dtype" and "float32" in row.note


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
    assert set(failed) == {"vmap"}
    assert all("vjp" in r.note for r in failed["vmap"])


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
    assert {r.name for r in report.skipped} == {"integer_inputs", "second_order"}
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
