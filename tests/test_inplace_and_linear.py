"""Results written in place (`out=True`, issue 12) and linear operators of any order
(`linear=True` + transpose, issue 16), for host functions and C++ kernels."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.fft

import jaxbridge as jb
from jaxbridge.errors import ForeignCallError, KeptViewError, MissingRuleError
from jaxbridge.testing import RuleCheckError, check_rules


# ----------------------------------------------------------------- in place
def make_sin_in_place():
    @jb.foreign(lambda x: x, out=True)
    def sin_into(x, *, out):
        np.sin(x, out=out)

    @sin_into.defvjp(out=True)
    def _(primals, y, ct, *, out):
        np.multiply(np.cos(primals[0]), ct, out=out[0])

    @sin_into.defjvp(out=True)
    def _(primals, y, tangents, *, out):
        np.multiply(np.cos(primals[0]), tangents[0], out=out)

    return sin_into


@pytest.mark.parametrize("mode", ["eager", "jit", "vmap", "pure_callback"])
def test_in_place_function_and_rules_match_jax(mode):
    f = make_sin_in_place()
    x = jnp.linspace(-2.0, 2.0, 7)
    if mode == "pure_callback":
        f = jb.foreign(lambda x: x, out=True, backend="pure_callback")(f.fun)
        f.defvjp(make_sin_in_place().vjp_rule.fun, out=True)
        f.defjvp(make_sin_in_place().jvp_rule.fun, out=True)
    call = {"eager": f, "jit": jax.jit(f), "vmap": jax.vmap(f),
            "pure_callback": jax.jit(f)}[mode]
    xs = x.reshape(7, 1) if mode == "vmap" else x
    np.testing.assert_allclose(call(xs), np.sin(xs), rtol=1e-14)
    g = jax.jit(jax.grad(lambda x: f(x).sum()))(x)
    np.testing.assert_allclose(g, np.cos(x), rtol=1e-14)
    _, t = jax.jvp(f, (x,), (2 * x,))
    np.testing.assert_allclose(t, np.cos(x) * 2 * x, rtol=1e-14)


def test_in_place_rules_pass_the_checker():
    assert check_rules(make_sin_in_place(), jnp.linspace(-1.0, 1.0, 5)).passed


def test_in_place_pytree_results_and_residuals():
    @jb.foreign(lambda x: {"s": x, "c": x}, residuals=lambda x: x, out=True)
    def sincos(x, *, out):
        (outs, res) = out
        np.sin(x, out=outs["s"])
        np.cos(x, out=outs["c"])
        res[...] = x * 2

    @sincos.defvjp
    def _(primals, y, ct, res):
        return (np.cos(res / 2) * ct["s"] - np.sin(res / 2) * ct["c"],)

    x = jnp.linspace(0.0, 1.0, 4)
    y = jax.jit(sincos)(x)
    np.testing.assert_allclose(y["s"], np.sin(x))
    np.testing.assert_allclose(y["c"], np.cos(x))
    g = jax.grad(lambda x: jnp.sum(sincos(x)["s"] + sincos(x)["c"]))(x)
    np.testing.assert_allclose(g, np.cos(x) - np.sin(x), rtol=1e-14)


def test_transposed_tangent_and_adjoint_with_dropped_and_kept_cotangents():
    # Reverse mode over a foreign tangent or adjoint transposes it. A custom_vjp that
    # returns None for an input leaves it only symbolic-zero cotangents (JAX still calls
    # the transpose, which must give zeros, not fail); a used one gives J^T w or J w.
    @jax.custom_vjp
    def keep_second(a, b):
        return b

    keep_second.defvjp(lambda a, b: (b, None), lambda _, ct: (None, ct))
    x, w = jnp.linspace(-1.0, 1.0, 5), jnp.arange(1.0, 6.0)
    for f in (make_sin_in_place(), jnp.sin):  # ours, then the jnp twin
        _, f_vjp = jax.vjp(f, x)

        def dropped_tangent(t, f=f):
            return jnp.sum(keep_second(jax.jvp(f, (x,), (t,))[1], t) ** 2)

        def dropped_adjoint(c, f_vjp=f_vjp):
            return jnp.sum(keep_second(f_vjp(c)[0], c) ** 2)

        for g in (dropped_tangent, dropped_adjoint):
            np.testing.assert_allclose(jax.grad(g)(x), 2 * x, atol=1e-15)
            np.testing.assert_allclose(jax.jit(jax.grad(g))(x), 2 * x, atol=1e-15)

        def kept_tangent(t, f=f):
            return jnp.sum(jax.jvp(f, (x,), (t,))[1] * w)

        def kept_adjoint(c, f_vjp=f_vjp):
            return jnp.sum(f_vjp(c)[0] * w)

        for g in (kept_tangent, kept_adjoint):
            np.testing.assert_allclose(jax.grad(g)(x), jnp.cos(x) * w, rtol=1e-15)
            np.testing.assert_allclose(jax.jit(jax.grad(g))(x), jnp.cos(x) * w, rtol=1e-15)


def test_in_place_function_must_return_none():
    f = jb.foreign(lambda x: x, out=True)(lambda x, *, out: np.sin(x))
    with pytest.raises(ForeignCallError, match="must return None"):
        jax.jit(f)(jnp.ones(2))


def test_in_place_outputs_kept_past_the_call_are_an_error():
    kept = []

    @jb.foreign(lambda x: x, out=True)
    def keeps_out(x, *, out):
        out[...] = x
        kept.append(out)

    with pytest.raises(KeptViewError, match="output 0"):
        jax.jit(keeps_out)(jnp.ones(3))


def test_traced_rule_cannot_be_in_place():
    f = jb.foreign(lambda x: x)(np.sin)
    with pytest.raises(ValueError, match="out=True.*host rules"):
        f.defvjp(lambda p, y, ct: (ct,), kind="jax", out=True)


# ----------------------------------------------------------------- linear operators
def make_dct():
    """The orthonormal DCT-II: linear, and its transpose is its inverse (DCT-III)."""
    @jb.foreign(lambda x: x, linear=True)
    def dct(x):
        return scipy.fft.dct(x, type=2, norm="ortho", axis=-1)

    @dct.deftranspose
    def _(ct):
        return (scipy.fft.idct(ct, type=2, norm="ortho", axis=-1),)

    return dct


N = 6
DCT_MATRIX = scipy.fft.dct(np.eye(N), type=2, norm="ortho", axis=0)


def dct_twin(x):
    return DCT_MATRIX @ x


def test_linear_function_jacobians_equal_its_matrix():
    dct = make_dct()
    x = jnp.linspace(-1.0, 2.0, N)
    for jac in (jax.jacfwd, jax.jacrev):
        np.testing.assert_allclose(jac(dct)(x), DCT_MATRIX, atol=1e-13)
        np.testing.assert_allclose(jax.jit(jac(dct))(x), DCT_MATRIX, atol=1e-13)


@pytest.mark.parametrize("order", [2, pytest.param(3, marks=pytest.mark.slow)])
def test_linear_function_derivatives_of_every_order(order):
    dct = make_dct()
    x = jnp.linspace(-1.0, 2.0, N)

    def loss(f):
        return lambda x: jnp.sum(jnp.sin(f(x)) * f(x) ** 2)

    ours, twin = loss(dct), loss(dct_twin)
    if order == 2:
        np.testing.assert_allclose(jax.hessian(ours)(x), jax.hessian(twin)(x), atol=1e-11)
        np.testing.assert_allclose(jax.jit(jax.jacfwd(jax.grad(ours)))(x),
                                   jax.hessian(twin)(x), atol=1e-11)
    else:
        third = jax.jacfwd(jax.jacrev(jax.grad(ours)))(x)
        np.testing.assert_allclose(third, jax.jacfwd(jax.jacrev(jax.grad(twin)))(x),
                                   atol=1e-10)


def test_linear_function_under_vmap_of_gradients():
    dct = make_dct()
    xs = jnp.linspace(-1.0, 1.0, 3 * N).reshape(3, N)
    g = jax.vmap(jax.grad(lambda x: jnp.sum(dct(x) ** 3)))(xs)
    ref = jax.vmap(jax.grad(lambda x: jnp.sum(dct_twin(x) ** 3)))(xs)
    np.testing.assert_allclose(g, ref, atol=1e-12)


def test_linear_function_of_several_arguments_jointly():
    a, b = np.array([[1.0, 2.0], [3.0, 4.0]]), np.array([[0.5], [-1.0]])

    @jb.foreign(lambda x, y: x, linear=True)
    def mix(x, y):  # linear in (x, y) jointly
        return a @ x + b @ y

    @mix.deftranspose
    def _(ct):
        return (a.T @ ct, b.T @ ct)

    x, y = jnp.array([1.0, -1.0]), jnp.array([2.0])
    jx, jy = jax.jacrev(mix, argnums=(0, 1))(x, y)
    np.testing.assert_allclose(jx, a)
    np.testing.assert_allclose(jy, b)
    _, t = jax.jvp(mix, (x, y), (x, jnp.zeros(1)))  # a zero tangent is a zero input
    np.testing.assert_allclose(t, a @ x)
    assert check_rules(mix, x, y).passed


def test_linear_function_passes_the_checker():
    report = check_rules(make_dct(), jnp.linspace(-1.0, 2.0, N))
    ran = {r.name for r in report.results if r.status == "pass"}
    # the transpose is the reverse mode, the function itself the forward mode: both checked
    assert {"vjp_fd", "jvp_fd", "vjp_jacobian", "jvp_jacobian", "jvp_vjp_consistency",
            "second_order"} <= ran
    assert [r.status for r in report.by_name("derivatives_checked")] == ["pass", "pass"]


A3 = np.array([[2.0, -1.0, 0.5], [0.3, 1.0, -2.0], [1.5, 0.2, 0.7]])
B3 = np.array([[0.4, 1.1, -0.6], [-1.3, 0.8, 0.9], [0.1, -0.7, 2.2]])


@pytest.mark.parametrize("transpose, hint", [
    (lambda ct: (1.5 * (A3.T @ ct),), "constant factor ~1.5"),
    (lambda ct: (A3 @ ct,), "Jacobian looks transposed"),
    (lambda ct: (B3.T @ ct,), "another operator"),
    (lambda ct: (-(A3.T @ ct),), "sign flipped"),
])
def test_a_wrong_transpose_fails_the_checker_with_a_hint(transpose, hint):
    matvec = jb.foreign(lambda x: x, linear=True)(lambda x: A3 @ x)
    matvec.deftranspose(transpose)
    with pytest.raises(RuleCheckError) as info:
        check_rules(matvec, np.array([1.0, -2.0, 0.5]))
    hints = {r.hint for r in info.value.report.failures}
    assert any(hint in h for h in hints), hints


def test_linear_declaration_errors():
    lin = jb.foreign(lambda x: x, linear=True)(lambda x: x)
    with pytest.raises(TypeError, match="deftranspose"):
        lin.defvjp(lambda p, y, ct: (ct,))
    plain = jb.foreign(lambda x: x)(lambda x: x)
    with pytest.raises(TypeError, match="linear=True"):
        plain.deftranspose(lambda ct: (ct,))
    with pytest.raises(MissingRuleError, match="transpose"):
        jax.grad(lambda x: lin(x).sum())(jnp.ones(2))
    ints = jb.foreign(lambda x: x, linear=True)(lambda x: x)
    with pytest.raises(TypeError, match="floating or complex"):
        ints(jnp.arange(3))
    with pytest.raises(ValueError, match="no residuals"):
        jb.foreign(lambda x: x, linear=True, residuals=lambda x: x)(lambda x: x)


SCALE_KERNEL = r"""
#include <cstdint>
#include "xla/ffi/api/ffi.h"
namespace ffi = xla::ffi;

// y = factor * x: linear in x; its own transpose.
static ffi::Error Scale(ffi::Buffer<ffi::F64> x, ffi::ResultBuffer<ffi::F64> y, double factor) {
  if (x.element_count() != y->element_count())
    return ffi::Error::InvalidArgument("scale: shapes differ");
  for (size_t i = 0; i < x.element_count(); ++i) y->typed_data()[i] = factor * x.typed_data()[i];
  return ffi::Error::Success();
}
XLA_FFI_DEFINE_HANDLER_SYMBOL(ScaleHandler, Scale,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F64>>()     // x
                                  .Ret<ffi::Buffer<ffi::F64>>()     // y
                                  .Attr<double>("factor"));         // the scale
"""


@pytest.mark.cpu  # a kernel compiled for the CPU only
def test_linear_kernel_derivatives_of_every_order(tmp_path, monkeypatch):
    monkeypatch.setenv("JAXBRIDGE_CACHE_DIR", str(tmp_path / "cache"))
    lib = jb.cpp.load("linear_scale", source=SCALE_KERNEL)
    scale = lib.kernel("ScaleHandler", linear=True, transpose="ScaleHandler",
                       result=lambda x, **_: x, attrs={"factor": 1.0}, dtypes=("float64",))
    x = jnp.linspace(0.5, 1.5, 4)

    def loss(x):
        return jnp.sum(scale(x, factor=3.0) ** 3)

    np.testing.assert_allclose(jax.grad(loss)(x), 81.0 * x ** 2, rtol=1e-12)
    np.testing.assert_allclose(jax.hessian(loss)(x), np.diag(162.0 * x), rtol=1e-12)
    np.testing.assert_allclose(jax.jacfwd(scale)(x, factor=2.0), 2.0 * np.eye(4))
    np.testing.assert_allclose(jax.jit(jax.vmap(jax.grad(loss)))(x[None]), 81.0 * x[None] ** 2,
                               rtol=1e-12)
    with pytest.raises(jb.KernelError, match="transpose="):
        lib.kernel("ScaleHandler", vjp="ScaleHandler", linear=True,
                   result=lambda x, **_: x)
