"""jaxbridge.scipy.special: values vs SciPy, derivatives vs finite differences and JAX."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.special as sp

from jaxbridge.scipy import special as js

X = jnp.linspace(0.3, 4.0, 7)
CASES = [  # (ours, scipy, extra leading args)
    (js.kv, sp.kv, (1.3,)),
    (js.kve, sp.kve, (0.4,)),
    (js.iv, sp.iv, (2.5,)),
    (js.ive, sp.ive, (1.0,)),
    (js.hyp1f1, sp.hyp1f1, (0.7, 1.9)),
    (lambda m: js.ellipk(m), sp.ellipk, ()),
    (lambda m: js.ellipe(m), sp.ellipe, ()),
]


def grid(scipy_fn):
    return X / 4.5 if scipy_fn in (sp.ellipk, sp.ellipe) else X


@pytest.mark.parametrize("ours,ref,args", CASES)
def test_values_and_derivatives(ours, ref, args):
    x = grid(ref)
    np.testing.assert_allclose(ours(*args, x), ref(*args, np.asarray(x)), rtol=1e-13)
    f = lambda x: ours(*args, x)  # noqa: E731
    eps = 1e-6
    fd = (ref(*args, np.asarray(x) + eps) - ref(*args, np.asarray(x) - eps)) / (2 * eps)
    np.testing.assert_allclose(jax.jit(jax.vmap(jax.grad(f)))(x), fd, rtol=1e-7)
    np.testing.assert_allclose(jax.jacfwd(f)(x), np.diag(fd), rtol=1e-7, atol=1e-12)
    # second order: the tangent rules are JAX, so Hessians work
    h = jax.vmap(jax.grad(jax.grad(f)))(x)
    fd2 = (ref(*args, np.asarray(x) + 1e-4) - 2 * ref(*args, np.asarray(x))
           + ref(*args, np.asarray(x) - 1e-4)) / 1e-8
    np.testing.assert_allclose(h, fd2, rtol=1e-4)


def test_against_jax_own_bessel():
    x = jnp.linspace(0.1, 5.0, 9)
    np.testing.assert_allclose(jax.vmap(jax.grad(lambda x: js.iv(0.0, x)))(x),
                               jax.vmap(jax.grad(jax.scipy.special.i0))(x), rtol=1e-12)
    np.testing.assert_allclose(jax.vmap(jax.grad(lambda x: js.ive(1.0, x)))(x),
                               jax.vmap(jax.grad(jax.scipy.special.i1e))(x), rtol=1e-10)


def test_broadcasting_vmap_and_order_derivative_is_nan():
    v = jnp.array([0.5, 1.5, 2.5])
    out = js.kv(v[:, None], X[None, :])
    assert out.shape == (3, 7)
    np.testing.assert_allclose(out, sp.kv(np.asarray(v)[:, None], np.asarray(X)[None, :]),
                               rtol=1e-13)
    np.testing.assert_allclose(jax.vmap(js.kv, (0, None))(v, X), out, rtol=1e-13)
    assert np.isnan(jax.grad(lambda v: js.kv(v, 2.0))(1.0))  # not provided, never silent 0
    assert np.isnan(jax.grad(lambda a: js.hyp1f1(a, 1.5, 2.0))(0.5))
    assert np.isfinite(jax.grad(lambda x: js.kv(1.0, x))(2.0))
    # tangents in the order and in x together: still NaN (the x term does not hide it)
    for f in (js.kv, js.kve, js.iv, js.ive):
        assert np.isnan(jax.jvp(f, (1.0, 2.0), (1.0, 1.0))[1]), f
    assert np.isnan(jax.jvp(js.hyp1f1, (0.5, 1.5, 2.0), (1.0, 0.0, 1.0))[1])
    np.testing.assert_allclose(jax.grad(js.ellipk)(0.0), np.pi / 8)
    np.testing.assert_allclose(jax.grad(js.ellipe)(0.0), -np.pi / 8)


def test_float32_and_check_rules_if_available():
    out = js.kv(jnp.float32(1.0), jnp.linspace(1.0, 2.0, 3, dtype=jnp.float32))
    assert out.dtype == jnp.float32
    testing = pytest.importorskip("jaxbridge.testing")
    report = testing.check_rules(lambda x: js.kv(1.3, x), np.linspace(0.5, 3.0, 5))
    assert report.passed, report


# ------------------------------------------------------------------ erfcx, erfi, dawsn
SMOOTH = [(js.erfcx, sp.erfcx), (js.erfi, sp.erfi), (js.dawsn, sp.dawsn)]


@pytest.mark.parametrize("ours,ref", [pytest.param(*SMOOTH[0], marks=pytest.mark.slow),
                                      *SMOOTH[1:]])  # erfcx: the first compile, in the slow run
def test_erf_family_values_and_derivatives(ours, ref):
    x = jnp.linspace(-3.0, 3.0, 13)
    np.testing.assert_allclose(ours(x), ref(np.asarray(x)), rtol=1e-14)
    eps = 1e-6
    fd_ = (ref(np.asarray(x) + eps) - ref(np.asarray(x) - eps)) / (2 * eps)
    np.testing.assert_allclose(jax.jit(jax.vmap(jax.grad(ours)))(x), fd_, rtol=1e-7, atol=1e-9)
    np.testing.assert_allclose(jax.jacfwd(ours)(x), np.diag(fd_), rtol=1e-7, atol=1e-9)
    # second order vs finite differences of SciPy's values
    fd2 = (ref(np.asarray(x) + 1e-4) - 2 * ref(np.asarray(x)) + ref(np.asarray(x) - 1e-4)) / 1e-8
    np.testing.assert_allclose(jax.vmap(jax.grad(jax.grad(ours)))(x), fd2, rtol=1e-4, atol=1e-5)
    report = check_rules_if(ours, np.linspace(-2.0, 2.0, 5))
    assert report is None or report.passed


def check_rules_if(f, x):
    testing = pytest.importorskip("jaxbridge.testing")
    return testing.check_rules(f, x)


def test_erfcx_and_dawsn_stable_where_the_jnp_formula_overflows():
    x = jnp.array([30.0, 100.0, 1e3, 1e6])
    naive = jnp.exp(x ** 2) * jax.scipy.special.erfc(x)
    assert not np.any(np.isfinite(naive))  # inf * 0: the formula users would write
    np.testing.assert_allclose(js.erfcx(x), sp.erfcx(np.asarray(x)), rtol=1e-14)
    # derivatives: central differences with a step relative to x (smooth, slowly varying
    # there), and the leading asymptotic term -1/(sqrt(pi) x^2)
    xs = np.array([20.0, 49.0, 51.0, 300.0, 1e4])
    h = 1e-3 * xs
    fd_ = (sp.erfcx(xs + h) - sp.erfcx(xs - h)) / (2 * h)
    got = jax.vmap(jax.grad(js.erfcx))(jnp.asarray(xs))
    np.testing.assert_allclose(got, fd_, rtol=2e-6)
    np.testing.assert_allclose(got[-1], -1 / (np.sqrt(np.pi) * 1e8) * (1 - 1.5e-8), rtol=1e-12)
    fd_d = (sp.dawsn(xs + h) - sp.dawsn(xs - h)) / (2 * h)
    np.testing.assert_allclose(jax.vmap(jax.grad(js.dawsn))(jnp.asarray(xs)), fd_d, rtol=2e-6)
    np.testing.assert_allclose(jax.grad(js.dawsn)(-1e4), -1 / (2e8) * (1 + 1.5e-8), rtol=1e-12)
    # the naive derivative formula cancels catastrophically at 1e6; ours does not
    g = float(jax.grad(js.erfcx)(1e6))
    assert g == pytest.approx(-1 / (np.sqrt(np.pi) * 1e12), rel=1e-10)
