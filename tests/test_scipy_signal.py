"""jaxbridge.scipy.signal.lfilter: values vs SciPy, derivatives vs a pure-JAX twin."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.signal
from conftest import fd

from jaxbridge.scipy.signal import lfilter
from jaxbridge.testing import check_rules

B = jnp.array([0.3, 0.2, -0.1])
A = jnp.array([1.2, -0.4, 0.1, 0.05])  # a0 != 1: SciPy normalizes by it
X = jnp.sin(jnp.arange(12.0)) + 0.1 * jnp.arange(12.0)
ZI = jnp.array([0.1, -0.2, 0.3])
W = jnp.cos(jnp.arange(12.0))
V = jnp.array([1.0, 2.0, -1.0])


def twin(b, a, x, zi):
    """SciPy's direct form II transposed, written as a lax.scan (differentiated by JAX)."""
    K = max(len(a), len(b)) - 1
    b = jnp.zeros(K + 1).at[:len(b)].set(b) / a[0]
    a = jnp.zeros(K + 1).at[:len(a)].set(a) / a[0]

    def step(z, xn):
        yn = b[0] * xn + z[0]
        return jnp.concatenate([z[1:], jnp.zeros(1)]) + b[1:] * xn - a[1:] * yn, yn
    zf, y = jax.lax.scan(step, zi, x)
    return y, zf


def L(b, a, x, zi):
    y, zf = lfilter(b, a, x, zi=zi)
    return jnp.sum(W * y) + jnp.sum(V * zf) + 0.1 * jnp.sum(y ** 2)


def L_twin(b, a, x, zi):
    y, zf = twin(b, a, x, zi)
    return jnp.sum(W * y) + jnp.sum(V * zf) + 0.1 * jnp.sum(y ** 2)


def test_values_match_scipy():
    y = lfilter(B, A, X)
    np.testing.assert_allclose(y, scipy.signal.lfilter(B, A, X), rtol=1e-13, atol=1e-15)
    y, zf = lfilter(B, A, X, zi=ZI)
    yr, zfr = scipy.signal.lfilter(B, A, X, zi=ZI)
    np.testing.assert_allclose(y, yr, rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(zf, zfr, rtol=1e-12, atol=1e-15)
    # N-D input along an axis, and an FIR filter (a = [1])
    X2 = jnp.stack([X, 2 * X, -X], 1)
    np.testing.assert_allclose(lfilter(B, A, X2, axis=0), scipy.signal.lfilter(B, A, X2, axis=0),
                               rtol=1e-13, atol=1e-15)
    zi2 = jnp.ones((3, 3))
    got = lfilter(B, A, X2, axis=0, zi=zi2)
    ref = scipy.signal.lfilter(B, A, X2, axis=0, zi=zi2)
    for g, r in zip(got, ref):
        np.testing.assert_allclose(g, r, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(lfilter(B, jnp.ones(1), X), np.convolve(X, B)[:12], rtol=1e-13)


@pytest.mark.slow
def test_gradients_all_arguments_match_pure_jax_twin():
    args = (B, A, X, ZI)
    ref = jax.grad(L_twin, (0, 1, 2, 3))(*args)
    for got in (jax.grad(L, (0, 1, 2, 3))(*args), jax.jit(jax.grad(L, (0, 1, 2, 3)))(*args),
                jax.jacfwd(L, (0, 1, 2, 3))(*args)):
        for g, r in zip(got, ref):
            np.testing.assert_allclose(g, r, rtol=1e-11, atol=1e-13)
    # finite differences in float64
    np.testing.assert_allclose(ref[1], fd(lambda a: L(B, a, X, ZI), A), rtol=1e-7)


def test_short_signal_longer_state_and_no_zi():
    """N < K: the state outlives the signal; zf then carries part of zi."""
    b, a = jnp.array([0.5, 0.1, 0.2, 0.3]), jnp.array([1.0, 0.2])
    x, zi = jnp.array([1.0, -1.0]), jnp.array([0.3, 0.2, -0.4])
    got, ref = lfilter(b, a, x, zi=zi), scipy.signal.lfilter(b, a, x, zi=zi)
    for g, r in zip(got, ref):
        np.testing.assert_allclose(g, r, rtol=1e-13, atol=1e-15)
    f = lambda b, a, x, zi: jnp.sum(lfilter(b, a, x, zi=zi)[1] ** 2)  # noqa: E731
    g = lambda b, a, x, zi: jnp.sum(twin(b, a, x, zi)[1] ** 2)  # noqa: E731
    for p, q in zip(jax.grad(f, (0, 1, 2, 3))(b, a, x, zi), jax.grad(g, (0, 1, 2, 3))(b, a, x, zi)):
        np.testing.assert_allclose(p, q, rtol=1e-12, atol=1e-14)
    h = lambda x: jnp.sum(lfilter(b, a, x) ** 2)  # noqa: E731
    np.testing.assert_allclose(jax.grad(h)(x), fd(h, x), rtol=1e-8)


# N > K, and N < K (the state outlives the signal: the case that reaches every branch,
# ~5 s; the other is slow)
@pytest.mark.parametrize("N", [pytest.param(5, marks=pytest.mark.slow), 2])
def test_gradients_of_n_d_signals_with_a_state_per_row(N):
    """Two signals filtered along their last axis, with and without an initial state
    per row (zi of shape (2, K), K = 4: not the number of rows, so a rule that took
    one for the other would show; and K ^ N != K - N): the rules' padding and slicing
    of the state keep the rows apart. grad and jacfwd in all four arguments against the twin mapped
    over rows."""
    b, a = jnp.array([0.5, 0.1, 0.2, 0.3, -0.2]), jnp.array([1.1, 0.2, -0.1])
    x = jnp.sin(jnp.arange(2.0 * N)).reshape(2, N) + 1.0
    zi = jnp.array([[0.3, 0.2, -0.4, 0.1], [0.1, -0.5, 0.2, 0.3]])
    w = jnp.cos(jnp.arange(2.0 * N)).reshape(2, N)

    def loss(filt):
        def f(b, a, x, zi):
            y, zf = filt(b, a, x, zi)
            return jnp.sum(w * y) + jnp.sum(jnp.arange(1.0, 9.0).reshape(2, 4) * zf ** 2)
        return f
    rows = jax.vmap(twin, (None, None, 0, 0))
    cases = [(loss(lambda b, a, x, zi: lfilter(b, a, x, zi=zi)), loss(rows), zi),
             # without zi, the rules see the signal itself (N < K: zero state past it)
             (lambda b, a, x, zi: jnp.sum(w * lfilter(b, a, x) ** 2),
              lambda b, a, x, zi: jnp.sum(w * rows(b, a, x, zi)[0] ** 2), jnp.zeros((2, 4)))]
    for ours, twin_loss, z in cases:
        ref = jax.grad(twin_loss, (0, 1, 2))(b, a, x, z)
        for got in (jax.grad(ours, (0, 1, 2))(b, a, x, z),
                    jax.jacfwd(ours, (0, 1, 2))(b, a, x, z)):
            for g, r in zip(got, ref):
                np.testing.assert_allclose(g, r, rtol=1e-12, atol=1e-14)
    got = jax.grad(cases[0][0], 3)(b, a, x, zi)
    np.testing.assert_allclose(got, jax.grad(cases[0][1], 3)(b, a, x, zi), rtol=1e-12)


@pytest.mark.slow  # every check of check_rules on four arguments (~11 s)
def test_vmap_and_check_rules():
    xs = jnp.stack([X, X ** 2 / 10, -X])
    out = jax.vmap(lambda a, x: lfilter(B, a, x))(jnp.stack([A, A * 1.1, A]), xs)
    for i, a in enumerate((A, A * 1.1, A)):
        np.testing.assert_allclose(out[i], scipy.signal.lfilter(B, a, xs[i]), rtol=1e-13)
    g = jax.vmap(jax.grad(lambda a: jnp.sum(W * lfilter(B, a, X))))(jnp.stack([A, 1.1 * A]))
    g_twin = jax.grad(lambda a: jnp.sum(W * twin(B, a, X, jnp.zeros(3))[0]))(1.1 * A)
    np.testing.assert_allclose(g[1], g_twin, rtol=1e-11)
    report = check_rules(lambda b, a, x, zi: lfilter(b, a, x, zi=zi), np.asarray(B), np.asarray(A),
                         np.asarray(X), np.asarray(ZI))
    assert report.passed, report


def test_bad_input():
    with pytest.raises(ValueError, match=r"lfilter: a\[0\] must be nonzero"):
        lfilter(B, jnp.array([0.0, 1.0]), X)
    with pytest.raises(ValueError, match=r"lfilter: `zi` must have shape \(3,\)"):
        lfilter(B, A, X, zi=jnp.zeros(2))
    with pytest.raises(ValueError, match=r"lfilter: `b` must be a non-empty 1-D array"):
        lfilter(jnp.ones((2, 2)), A, X)


@pytest.mark.slow
def test_second_order_matches_pure_jax_twin():
    """The rules are written in JAX, so Hessians work (slow: compiles nested rules)."""
    args = (B, A, X, ZI)
    np.testing.assert_allclose(jax.hessian(L, 1)(*args), jax.hessian(L_twin, 1)(*args),
                               rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("b,a", [(0.5, [1.0, -0.3]), ([0.5, 0.25], 2.0), (3.0, 2.0)])
def test_lfilter_scalar_coefficients_as_scipy(b, a):
    x = np.array([1.0, 0.0, -2.0, 0.5, 3.0])
    np.testing.assert_allclose(lfilter(b, a, x), scipy.signal.lfilter(b, a, x), rtol=1e-12)
    g = jax.grad(lambda x: jnp.sum(lfilter(b, a, x) ** 2))(jnp.asarray(x))
    np.testing.assert_allclose(g, fd(lambda x: jnp.sum(lfilter(b, a, x) ** 2), x), rtol=1e-6)


def test_lfilter_broadcast_zi_as_scipy():
    rng = np.random.default_rng(3)
    b, a = np.array([0.5, 0.3, 0.1]), np.array([1.0, -0.4, 0.2])
    x = rng.normal(size=(3, 6))
    zi = np.array([[0.2, -0.1]])  # (1, 2): one state for all three rows
    y, zf = lfilter(b, a, x, axis=-1, zi=zi)
    y_ref, zf_ref = scipy.signal.lfilter(b, a, x, axis=-1, zi=zi)
    np.testing.assert_allclose(y, y_ref, rtol=1e-12)
    np.testing.assert_allclose(zf, zf_ref, rtol=1e-12)
    assert zf.shape == zf_ref.shape == (3, 2)

    def loss(z):
        y, zf = lfilter(b, a, x, axis=-1, zi=z)
        return jnp.sum(y ** 2) + jnp.sum(zf)
    np.testing.assert_allclose(jax.grad(loss)(jnp.asarray(zi)), fd(loss, zi), rtol=1e-6)
    y0, _ = lfilter(b, a, x.T, axis=0, zi=zi.T)  # along axis 0: zi (2, 1)
    np.testing.assert_allclose(y0, scipy.signal.lfilter(b, a, x.T, axis=0, zi=zi.T)[0],
                               rtol=1e-12)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_eager_call_is_scipys_own_and_equals_the_compiled_program(dtype):
    """An eager call without zi runs SciPy's lfilter directly: the same values as the
    compiled program under jit, a JAX array of JAX's dtype, and a NumPy signal changed in
    place between calls gives the new answer (nothing of it is kept)."""
    x = np.random.default_rng(0).normal(size=(3, 20000)).astype(dtype)  # the direct path
    b, a = np.asarray(B, dtype), np.asarray(A, dtype)
    y = lfilter(b, a, x, axis=1)
    assert isinstance(y, jax.Array) and y.dtype == jnp.result_type(dtype)
    np.testing.assert_array_equal(y, jax.jit(lambda x: lfilter(b, a, x, axis=1))(x))
    np.testing.assert_allclose(y, scipy.signal.lfilter(b, a, x, axis=1),
                               rtol=1e-5 if dtype == np.float32 else 1e-13, atol=1e-6)
    x[:, :10] = 7.0
    np.testing.assert_allclose(lfilter(b, a, x, axis=1), scipy.signal.lfilter(b, a, x, axis=1),
                               rtol=1e-5 if dtype == np.float32 else 1e-13, atol=1e-5)
    grad = jax.grad(lambda x: lfilter(b, a, x, axis=1).sum())(jnp.asarray(x))  # traced
    b64, a64 = jnp.asarray(b, jnp.float64), jnp.asarray(a, jnp.float64)
    want = jax.grad(lambda x: jax.vmap(lambda r: twin(b64, a64, r, jnp.zeros(3))[0])(x).sum())(
        jnp.asarray(x, jnp.float64))
    np.testing.assert_allclose(grad, want, rtol=1e-4, atol=1e-4)
