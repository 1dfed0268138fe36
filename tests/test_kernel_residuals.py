"""Kernels with residuals (jaxbridge.kernel(..., residuals=, forward_with_residuals=)):
values and every derivative against a jnp twin, under jit, vmap, scan and export; the
residuals never reach the caller; a call nobody differentiates runs the plain forward
(checked in the compiled HLO); the operands' order of the convention; bad declarations.

The kernels: examples/rms_norm.cc (JAX's FFI tutorial kernel, float32 and float64) and
tests/native/kernel_checks.cc (ExpPair: int outputs and residuals, pass_outputs=True)."""

import os
import shutil
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxbridge as jb
from jaxbridge.errors import KernelError
from jaxbridge.testing import RuleCheckError, check_rules

ROOT = Path(__file__).resolve().parents[1]
RMS_NORM_CC = ROOT / "examples" / "rms_norm.cc"
CHECKS_CC = ROOT / "tests" / "native" / "kernel_checks.cc"

# Compiled for the CPU: on JAX's CPU device even where a GPU is JAX's default.
pytestmark = [pytest.mark.skipif(shutil.which(os.environ.get("CXX", "c++")) is None,
                                 reason="no C++ compiler"), pytest.mark.cpu]


@pytest.fixture(scope="module")
def libs(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("JAXBRIDGE_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
        yield (jb.cpp.load("rms_norm", sources=[RMS_NORM_CC]),
               jb.cpp.load("kernel_checks", sources=[CHECKS_CC]))


def row_struct(x, **_):
    return jax.ShapeDtypeStruct(x.shape[:-1], x.dtype)


def rms_kernel(lib, name, **options):
    """The guide's declaration: a separate forward with residuals (unless overridden)."""
    options = {"forward_with_residuals": "RmsNormWithResiduals", "vmap": "vectorized",
               **options}
    return lib.kernel("RmsNorm", vjp="RmsNormDerivative", jvp="RmsNormDerivative",
                      name=name, result=lambda x, **_: x, residuals=row_struct,
                      attrs={"eps": 1e-5}, pass_outputs=False, aliases={"vjp": {2: 0}},
                      **options)


@pytest.fixture(scope="module")
def rms_norm(libs):
    return rms_kernel(libs[0], "rms_norm")


def twin(x, eps=1e-5):
    """The same function in jnp (eps rounded to float32, as the C++ attribute is)."""
    eps = float(np.float32(eps))
    return x / jnp.sqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps)


TOL = {np.float32: 2e-5, np.float64: 1e-12}
DTYPES = [np.float32, np.float64]


def sample(dtype, shape=(3, 5), seed=0):
    return jnp.asarray(np.random.default_rng(seed).normal(size=shape), dtype)


def close(got, want, dtype):
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=TOL[dtype],
                               atol=TOL[dtype])


# ------------------------------------------------------------------ values and derivatives
HOWS = ["eager", "jit", "grad", "jit_grad", "jvp", "jacfwd_jacrev", "vmap", "vmap_grad",
        "grad_vmap"]
# The default run's share of the grid (each transformation once, each dtype); the rest
# runs in the slow stage (the default run's budget).
DEFAULT = {("jit_grad", np.float32), ("jvp", np.float64), ("jacfwd_jacrev", np.float32),
           ("vmap_grad", np.float64), ("grad_vmap", np.float32), ("eager", np.float64)}


@pytest.mark.parametrize("how, dtype", [
    pytest.param(h, d, marks=() if (h, d) in DEFAULT else pytest.mark.slow)
    for d in DTYPES for h in HOWS])
def test_values_and_derivatives_match_the_jnp_twin(rms_norm, dtype, how):
    x = sample(dtype)
    w = sample(dtype, seed=1)

    def loss(f):
        return lambda x: jnp.sum(f(x) * w)

    cases = {
        "eager": lambda f: f(x),
        "jit": lambda f: jax.jit(f)(x),
        "grad": lambda f: jax.grad(loss(f))(x),
        "jit_grad": lambda f: jax.jit(jax.value_and_grad(loss(f)))(x),
        "jvp": lambda f: jax.jvp(f, (x,), (w,)),
        "jacfwd_jacrev": lambda f: (jax.jacfwd(f)(x[0]), jax.jacrev(f)(x[0])),
        "vmap": lambda f: jax.vmap(f)(jnp.stack([x, 2 * x])),
        "vmap_grad": lambda f: jax.vmap(jax.grad(loss(f)))(jnp.stack([x, -x])),
        "grad_vmap": lambda f: jax.grad(lambda xs: jnp.sum(jax.vmap(f)(xs) * w[None]))(
            jnp.stack([x, -x])),
    }
    got, want = cases[how](rms_norm), cases[how](twin)
    for g, r in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        assert g.dtype == r.dtype and g.shape == r.shape
        close(g, r, dtype)


@pytest.mark.slow  # the grid's jacfwd_jacrev case compares both with the twin
def test_jacfwd_equals_jacrev(rms_norm):
    x = sample(np.float64)[0]
    np.testing.assert_allclose(jax.jacfwd(rms_norm)(x), jax.jacrev(rms_norm)(x), rtol=1e-13)


def test_grad_in_a_jitted_training_loop(rms_norm):
    """A scan of gradient steps through the kernel, as a training loop is written."""
    target = sample(np.float64, seed=2)

    def run(f):
        def step(p, _):
            loss, g = jax.value_and_grad(lambda p: jnp.sum((f(p) - target) ** 2))(p)
            return p - 0.1 * g, loss
        return jax.jit(lambda p: jax.lax.scan(step, p, None, length=5))(sample(np.float64))

    (p, losses), (p_ref, losses_ref) = run(rms_norm), run(twin)
    close(p, p_ref, np.float64)
    close(losses, losses_ref, np.float64)
    assert losses[-1] < losses[0]


def test_a_closure_over_the_attribute(rms_norm):
    x = sample(np.float64)
    for eps in (1e-5, 0.5):
        f = jax.jit(jax.grad(lambda x: jnp.sum(rms_norm(x, eps=eps) ** 3)))
        close(f(x), jax.grad(lambda x: jnp.sum(twin(x, eps) ** 3))(x), np.float64)


# ------------------------------------------------------------------ what the caller sees
def test_the_caller_never_sees_residuals(rms_norm):
    x = sample(np.float64)
    assert isinstance(rms_norm(x), jax.Array)
    assert jax.eval_shape(rms_norm, x).shape == x.shape
    out, pull = jax.vjp(rms_norm, x)
    assert isinstance(out, jax.Array) and out.shape == x.shape
    (ct,) = pull(jnp.ones_like(out))
    assert ct.shape == x.shape
    y, ty = jax.jvp(rms_norm, (x,), (x,))
    assert y.shape == ty.shape == x.shape


# ------------------------------------------------------------------ who pays for residuals
def _custom_calls(f, *args):
    """The custom-call targets in the compiled (optimized) HLO, and its text."""
    text = jax.jit(f).lower(*args).compile().as_text()
    lines = [line for line in text.splitlines() if "custom-call(" in line]
    return [line.split('custom_call_target="')[1].split('"')[0] for line in lines], text


def test_a_call_nobody_differentiates_runs_the_plain_forward(rms_norm):
    """The compiled program of a plain call has the forward target alone: no residual
    result is computed (not even to be thrown away)."""
    x = sample(np.float32, (16, 8))
    targets, text = _custom_calls(rms_norm, x)
    assert targets == [rms_norm.target("forward", "cpu")]
    assert "f32[16]" not in text  # the residual's shape appears nowhere
    # and inside a larger jitted function, where only the value is used
    targets, _ = _custom_calls(lambda x: jnp.tanh(rms_norm(x)).sum(), x)
    assert targets == [rms_norm.target("forward", "cpu")]


def test_differentiated_calls_run_the_forward_with_residuals_once(rms_norm):
    x = sample(np.float32, (16, 8))
    fwd = rms_norm.target("forward", "cpu")
    with_res = rms_norm.target("forward_with_residuals", "cpu")
    vjp, jvp = rms_norm.target("vjp", "cpu"), rms_norm.target("jvp", "cpu")
    # value and gradient: the outputs come from the forward with residuals, once
    targets, text = _custom_calls(jax.value_and_grad(lambda x: jnp.sum(rms_norm(x) ** 2)), x)
    assert sorted(targets) == sorted([with_res, vjp]) and fwd not in targets
    assert "(f32[16,8]{1,0}, f32[16]{0}) custom-call" in text  # (y, r)
    targets, _ = _custom_calls(lambda x, t: jax.jvp(rms_norm, (x,), (t,)), x, x)
    assert sorted(targets) == sorted([with_res, jvp])


def test_without_a_separate_target_every_call_returns_the_residuals(libs):
    """forward_with_residuals omitted: the forward target itself returns (y, r), on every
    call; the caller still sees y alone."""
    k = libs[0].kernel("RmsNormWithResiduals", vjp="RmsNormDerivative",
                       jvp="RmsNormDerivative", name="rms_norm_one_forward",
                       result=lambda x, **_: x, residuals=row_struct, attrs={"eps": 1e-5},
                       vmap="vectorized", pass_outputs=False)
    x = sample(np.float64)
    close(k(x), twin(x), np.float64)
    close(jax.grad(lambda x: jnp.sum(k(x) ** 3))(x),
          jax.grad(lambda x: jnp.sum(twin(x) ** 3))(x), np.float64)
    targets, text = _custom_calls(k, x)
    assert targets == [k.target("forward", "cpu")]
    assert "(f64[3,5]{1,0}, f64[3]{0}) custom-call" in text
    assert k.forward_with_residuals == {}


@pytest.mark.parametrize("vmap", [pytest.param("loop", marks=pytest.mark.slow), "vectorized"])
def test_residuals_under_vmap(libs, vmap):
    k = rms_kernel(libs[0], f"rms_norm_{vmap}", vmap=vmap)
    xs = jnp.stack([sample(np.float64, seed=s) for s in range(3)])
    close(jax.vmap(k)(xs), jax.vmap(twin)(xs), np.float64)
    g = jax.vmap(jax.grad(lambda x: jnp.sum(k(x) ** 3)))(xs)
    close(g, jax.vmap(jax.grad(lambda x: jnp.sum(twin(x) ** 3)))(xs), np.float64)
    t = jax.vmap(lambda x: jax.jvp(k, (x,), (x * x,))[1])(xs)
    close(t, jax.vmap(lambda x: jax.jvp(twin, (x,), (x * x,))[1])(xs), np.float64)


def test_export_round_trip_of_the_gradient(rms_norm):
    x = sample(np.float32)
    f = jax.jit(jax.value_and_grad(lambda x: jnp.sum(rms_norm(x) ** 2)))
    exported = jax.export.export(f, platforms=["cpu"],
                                 disabled_checks=rms_norm.export_checks())(x)
    back = jax.export.deserialize(exported.serialize())
    for got, want in zip(back.call(x), f(x)):
        np.testing.assert_array_equal(got, want)
    assert rms_norm.target("forward_with_residuals", "cpu") in rms_norm.targets()


# ------------------------------------------------------------------ the convention's order
@pytest.fixture(scope="module")
def exp_pair(libs):
    lib = libs[1]
    return lib.kernel("ExpPairForward", vjp="ExpPairDerivative",
                      jvp="ExpPairDerivative", forward_with_residuals="ExpPairWithResiduals",
                      name="exp_pair", dtypes=["float64"],
                      result=lambda x: (x, jax.ShapeDtypeStruct((), jnp.int32)),
                      residuals=lambda x: (x, jax.ShapeDtypeStruct((), jnp.int64)))


def test_operands_in_the_order_of_the_convention(exp_pair):
    """adjoint(x, y, k, r, n, ct_y) and tangent(x, y, k, r, n, tx): primals, outputs,
    residuals (each in pytree order), then (co)tangents (none for the int32 output k);
    the handler returns an error naming the first operand out of place."""
    x = jnp.linspace(-1.0, 2.0, 5)
    y, k = exp_pair(x)
    assert k.dtype == jnp.int32 and int(k) == 3
    np.testing.assert_allclose(y, np.exp(x), rtol=1e-15)
    g = jax.grad(lambda x: jnp.sum(exp_pair(x)[0] * x))(x)
    np.testing.assert_allclose(g, np.exp(x) * (1 + x) , rtol=1e-14)
    ty = jax.jvp(lambda x: exp_pair(x)[0], (x,), (jnp.ones_like(x),))[1]
    np.testing.assert_allclose(ty, np.exp(x), rtol=1e-14)


def test_integer_residuals_get_no_cotangent(exp_pair):
    x = jnp.linspace(-1.0, 2.0, 5)
    (ct,) = jax.vjp(lambda x: exp_pair(x)[0], x)[1](jnp.ones(5))
    np.testing.assert_allclose(ct, np.exp(x), rtol=1e-14)


# ------------------------------------------------------------------ the checker
def test_check_rules_passes_and_runs_every_check(rms_norm):
    report = check_rules(rms_norm, sample(np.float32))
    summary = report.summary()
    for name in ("vjp_fd", "jvp_fd", "jvp_vjp_consistency", "primal_values", "jit", "vmap",
                 "export", "inputs_unchanged"):
        assert summary[name] == "pass", (name, str(report))


@pytest.mark.slow  # a C++ build of its own (10-20 s); test_testing.py has a fast one
def test_check_rules_catches_a_forward_with_residuals_that_computes_other_outputs(
        tmp_path):
    """primal_values: jax.vjp's and jax.jvp's outputs (from the forward with residuals,
    here with 100x the plain forward's eps) differ from the plain call's."""
    source = RMS_NORM_CC.read_text()
    right = "return Forward(eps, x, y, &r);"
    assert right in source
    (tmp_path / "rms_norm_mutant.cc").write_text(source.replace(right,
                                                 "return Forward(eps * 100, x, y, &r);"))
    lib = jb.cpp.load("rms_norm_mutant", sources=[tmp_path / "rms_norm_mutant.cc"])
    wrong = rms_kernel(lib, "rms_norm_mutant")
    with pytest.raises(RuleCheckError, match=r"FAIL  primal_values") as info:
        check_rules(wrong, sample(np.float64) * 0.01)
    assert "jax.vjp's outputs vs the call" in str(info.value)
    assert "jax.jvp's outputs vs the call" in str(info.value)


# ------------------------------------------------------------------ bad declarations
def test_bad_residual_declarations(libs):
    lib = libs[0]
    with pytest.raises(KernelError, match=r"'rms_bad': forward_with_residuals= returns the "
                                          r"residuals, so declare them: residuals="):
        lib.kernel("RmsNorm", forward_with_residuals="RmsNormWithResiduals", name="rms_bad",
                   result=lambda x, **_: x)
    with pytest.raises(KernelError, match=r"a linear kernel has no residuals"):
        jb.kernel("jaxbridge_softplus_fwd", linear=True, transpose="jaxbridge_softplus_adj",
                  result=lambda x, **_: x, residuals=lambda x, **_: x, name="lin_res")
    k = lib.kernel("RmsNorm", vjp="RmsNormDerivative", name="rms_bad_leaf",
                   forward_with_residuals="RmsNormWithResiduals", result=lambda x, **_: x,
                   residuals=lambda x, **_: "r", attrs={"eps": 1e-5})
    with pytest.raises(KernelError, match=r"kernel 'rms_bad_leaf': the residuals spec must be "
                                          r"a pytree of jax.ShapeDtypeStruct; got a leaf 'r'"):
        k(sample(np.float64))
    k = lib.kernel("RmsNorm", vjp="RmsNormDerivative", name="rms_bad_batch",
                   forward_with_residuals="RmsNormWithResiduals", result=lambda x, **_: x,
                   residuals=lambda x, **_: jax.ShapeDtypeStruct((7,), x.dtype),
                   attrs={"eps": 1e-5}, batch_dims=1)
    with pytest.raises(KernelError, match=r"batch_dims=1, so every array argument and result "
                                          r"must share"):
        k(sample(np.float64))
