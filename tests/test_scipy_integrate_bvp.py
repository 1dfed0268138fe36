"""solve_bvp (issue 26): SciPy's values, IFT gradients vs closed forms and finite
differences of SciPy's own solve, failures."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.integrate
import scipy.optimize
from conftest import fd

from jaxbridge.scipy import SolverError
from jaxbridge.scipy.integrate import solve_bvp

X0 = jnp.linspace(0.0, 1.0, 11)


def wave(k, b=1.0, tol=1e-8):
    """y'' = -k^2 y, y(0) = 0, y(b) = 1: y = sin(k x) / sin(k b)."""
    return solve_bvp(lambda x, y: jnp.stack([y[1], -k ** 2 * y[0]]),
                     lambda ya, yb: jnp.stack([ya[0], yb[0] - 1.0]),
                     jnp.linspace(0.0, b, 11), jnp.zeros((2, 11)), tol=tol, max_nodes=300)


def test_values_match_scipy():
    res = wave(2.0)
    ref = scipy.integrate.solve_bvp(lambda x, y: np.stack([y[1], -4.0 * y[0]]),
                                    lambda ya, yb: np.array([ya[0], yb[0] - 1.0]),
                                    np.linspace(0.0, 1.0, 11), np.zeros((2, 11)), tol=1e-8,
                                    max_nodes=300)
    assert ref.success, ref.message
    m = int(res.n_nodes)
    assert m == ref.x.size and bool(res.success) and int(res.status) == 0
    assert res.message == ref.message and res.x.shape == (300,) and res.y.shape == (2, 300)
    np.testing.assert_allclose(res.x[:m], ref.x, rtol=1e-14)
    np.testing.assert_allclose(res.y[:, :m], ref.y, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(res.yp[:, :m], ref.yp, rtol=1e-9, atol=1e-12)
    assert np.all(np.isnan(res.y[:, m:])) and res.p is None
    xs = np.linspace(-0.1, 1.1, 25)  # extrapolates as SciPy's PPoly does
    np.testing.assert_allclose(res.sol(xs), ref.sol(xs), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(res.sol(0.3)[0], np.sin(0.6) / np.sin(2.0), rtol=1e-7)


def test_sol_derivatives_match_scipys_ppoly():
    """sol(x, nu): the nu-th derivative of the spline, as SciPy's PPoly gives it (inside
    the mesh and extrapolated), scalar and array x, under jit."""
    res = wave(2.0)
    ref = scipy.integrate.solve_bvp(lambda x, y: np.stack([y[1], -4.0 * y[0]]),
                                    lambda ya, yb: np.array([ya[0], yb[0] - 1.0]),
                                    np.linspace(0.0, 1.0, 11), np.zeros((2, 11)), tol=1e-8,
                                    max_nodes=300)
    xs = np.linspace(-0.1, 1.1, 25)
    for nu in (1, 2, 3, 4):
        want = ref.sol(xs, nu)
        scale = np.max(np.abs(want)) + 1.0
        np.testing.assert_allclose(res.sol(xs, nu), want, rtol=1e-8, atol=1e-10 * scale)
        np.testing.assert_allclose(res.sol(0.3, nu), ref.sol(0.3, nu), rtol=1e-8,
                                   atol=1e-10 * scale)
        np.testing.assert_allclose(jax.jit(lambda t, nu=nu: res.sol(t, nu))(xs), want,
                                   rtol=1e-8, atol=1e-10 * scale)
    # y' = 2 cos(2x) / sin(2): the spline's slope, to the solve's accuracy
    np.testing.assert_allclose(res.sol(0.3, 1)[0], 2 * np.cos(0.6) / np.sin(2.0), rtol=1e-6)


def test_sol_derivative_is_differentiable():
    """d/dk of sol(x, 1) through the solve, against the closed form
    y'(x) = k cos(k x) / sin(k) and central differences."""
    x = 0.3

    def slope(k):
        return wave(k).sol(x, 1)[0]
    k = 2.0
    closed = jax.grad(lambda k: k * jnp.cos(k * x) / jnp.sin(k))(k)
    np.testing.assert_allclose(jax.grad(slope)(k), closed, rtol=1e-5)
    np.testing.assert_allclose(jax.grad(slope)(k), fd(slope, k, 1e-5), rtol=1e-6)
    np.testing.assert_allclose(jax.jvp(slope, (k,), (1.0,))[1], closed, rtol=1e-5)
    # in x too: the second derivative of the spline is d/dx of its first
    np.testing.assert_allclose(jax.grad(lambda t: wave(k).sol(t, 1)[0])(x),
                               wave(k).sol(x, 2)[0], rtol=1e-10)


def test_sol_bad_nu():
    res = wave(2.0)
    with pytest.raises(NotImplementedError, match=r"solve_bvp: sol\(x, nu\) with nu < 0"):
        res.sol(0.3, -1)
    with pytest.raises(TypeError, match=r"solve_bvp: sol\(x, nu\): nu must be an int"):
        res.sol(0.3, 1.5)


@pytest.mark.slow
def test_gradients_closed_form_every_transform():
    k, x = 1.3, 0.5

    def mid(k, b=1.0):
        return wave(k, b).sol(x)[0]

    exact = (x * np.cos(k * x) * np.sin(k) - np.sin(k * x) * np.cos(k)) / np.sin(k) ** 2
    np.testing.assert_allclose(jax.grad(mid)(k), exact, rtol=1e-6)
    np.testing.assert_allclose(jax.jit(jax.grad(mid))(k), exact, rtol=1e-6)
    np.testing.assert_allclose(jax.jvp(mid, (k,), (1.0,))[1], exact, rtol=1e-6)
    ks = jnp.array([1.0, 1.3])
    ex = [(x * np.cos(q * x) * np.sin(q) - np.sin(q * x) * np.cos(q)) / np.sin(q) ** 2
          for q in (1.0, 1.3)]
    np.testing.assert_allclose(jax.vmap(jax.grad(mid))(ks), ex, rtol=1e-6)
    # the interval's end: d/db sin(k x) / sin(k b) = -k sin(k x) cos(k b) / sin(k b)^2
    g_b = jax.grad(lambda b: mid(k, b))(1.0)
    np.testing.assert_allclose(g_b, -k * np.sin(k * x) * np.cos(k) / np.sin(k) ** 2, rtol=1e-6)
    # the derivative in x of the spline: y'(x)
    np.testing.assert_allclose(jax.grad(lambda t: wave(k).sol(t)[0])(x),
                               k * np.cos(k * x) / np.sin(k), rtol=1e-6)


@pytest.mark.slow  # 10-40 s; the default run keeps test_values_match_scipy
def test_unknown_parameter_eigenvalue():
    """y'' + p y = 0 on [0, b], y(0) = y(b) = 0, y'(0) = 1: p = (pi / b)^2."""
    def eig(b, c):
        x = jnp.linspace(0.0, b, 6)
        guess = jnp.stack([jnp.sin(jnp.pi * x / b), jnp.cos(jnp.pi * x / b)])
        res = solve_bvp(lambda x, y, p: jnp.stack([y[1], -p[0] * y[0]]),
                        lambda ya, yb, p: jnp.stack([ya[0], yb[0], ya[1] - c]),
                        x, guess, p=[8.0], tol=1e-8)
        return res.p[0], res.sol(0.25 * b)[0]

    p, y = eig(1.0, 2.0)
    np.testing.assert_allclose(p, np.pi ** 2, rtol=1e-7)
    np.testing.assert_allclose(y, 2.0 / np.pi * np.sin(np.pi / 4), rtol=1e-7)
    gb, gc = jax.grad(lambda b, c: eig(b, c)[0], argnums=(0, 1))(1.0, 2.0)
    np.testing.assert_allclose(gb, -2 * np.pi ** 2, rtol=1e-6)
    np.testing.assert_allclose(gc, 0.0, atol=1e-8)
    np.testing.assert_allclose(jax.grad(lambda c: eig(1.0, c)[1])(2.0),
                               np.sin(np.pi / 4) / np.pi, rtol=1e-7)


@pytest.mark.slow  # 10-30 s; the derivative matrix's default cells cover solve_bvp
def test_gradient_vs_finite_differences_of_scipy():
    """A nonlinear problem (Bratu, y'' + a e^y = 0, y(0) = y(1) = 0), parameters in
    fun (closed over) and in bc (args of a closure), against central differences of
    SciPy's own solve."""
    def ours(a, c):
        res = solve_bvp(lambda x, y: jnp.stack([y[1], -a * jnp.exp(y[0])]),
                        lambda ya, yb: jnp.stack([ya[0], yb[0] - c]), X0,
                        jnp.zeros((2, 11)), tol=1e-9)
        return jnp.sum(res.sol(jnp.array([0.2, 0.5, 0.9]))[0])

    def scipy_solve(a, c):
        ref = scipy.integrate.solve_bvp(lambda x, y: np.stack([y[1], -a * np.exp(y[0])]),
                                        lambda ya, yb: np.array([ya[0], yb[0] - c]),
                                        np.asarray(X0), np.zeros((2, 11)), tol=1e-9)
        assert ref.success, ref.message
        return np.sum(ref.sol(np.array([0.2, 0.5, 0.9]))[0])

    ga, gc = jax.grad(ours, argnums=(0, 1))(1.0, 0.3)
    np.testing.assert_allclose(ga, fd(lambda a: scipy_solve(float(a), 0.3), 1.0, 1e-5),
                               rtol=1e-5)
    np.testing.assert_allclose(gc, fd(lambda c: scipy_solve(1.0, float(c)), 0.3, 1e-5),
                               rtol=1e-5)


def test_failure_raises_with_scipys_message_and_bad_input():
    def fun(x, y):  # needs many nodes at a tiny tolerance
        return jnp.stack([y[1], 1e4 * y[0]])

    def bc(ya, yb):
        return jnp.stack([ya[0] - 1.0, yb[0]])

    with pytest.raises(SolverError, match=r"solve_bvp.*maximum number of mesh nodes"):
        jax.block_until_ready(solve_bvp(fun, bc, X0, jnp.zeros((2, 11)), tol=1e-10,
                                        max_nodes=20).y)
    res = solve_bvp(fun, bc, X0, jnp.zeros((2, 11)), tol=1e-10, max_nodes=20,
                    on_failure="nan")
    assert int(res.status) == 1 and not bool(res.success) and np.all(np.isnan(res.y))
    with pytest.raises(ValueError, match=r"`bc` must return one array of shape \(2,\)"):
        solve_bvp(fun, lambda ya, yb: ya[0], X0, jnp.zeros((2, 11)))
    with pytest.raises(ValueError, match=r"x must be 1-D \(m,\) and y \(n, m\)"):
        solve_bvp(fun, bc, X0, jnp.zeros((2, 5)))
    with pytest.raises(NotImplementedError, match="`S`"):
        solve_bvp(fun, bc, X0, jnp.zeros((2, 11)), S=jnp.zeros((2, 2)))


def test_forward_mode_in_the_interval_end_moves_the_mesh():
    """jvp/jacfwd w.r.t. x[-1] (the final mesh scales with the interval: x_i = b xi_i),
    against the closed form d/db sin(k x) / sin(k b) and the mesh's own motion."""
    k, x = 1.3, 0.5

    def mid(b):
        return wave(k, b).sol(x)[0]

    want = -k * np.sin(k * x) * np.cos(k * 1.2) / np.sin(k * 1.2) ** 2
    np.testing.assert_allclose(jax.jacfwd(mid)(1.2), want, rtol=1e-6)
    res, dres = jax.jvp(lambda b: wave(k, b), (1.2,), (1.0,))
    m = int(res.n_nodes)
    np.testing.assert_allclose(dres.x[:m], res.x[:m] / 1.2, rtol=1e-12, atol=1e-15)


def test_failed_solve_has_nan_derivatives_in_both_modes_with_the_nan_policy():
    """on_failure="nan": a solve SciPy gives up on (too many nodes) has NaN derivatives
    w.r.t. everything `fun` and `bc` close over and the interval's end, in forward and
    reverse mode, and raises nothing."""
    def mid(a, b, c):
        res = solve_bvp(lambda x, y: jnp.stack([y[1], a * y[0]]),
                        lambda ya, yb: jnp.stack([ya[0] - 1.0, yb[0] - c]),
                        jnp.linspace(0.0, b, 11), jnp.zeros((2, 11)), tol=1e-10,
                        max_nodes=20, on_failure="nan")
        return res.sol(0.5)[0]

    for mode in (jax.jacfwd, jax.jacrev):
        grads = mode(mid, argnums=(0, 1, 2))(1e4, 1.0, 0.0)
        assert np.all(np.isnan(grads)), (mode.__name__, grads)


def test_nonlinear_boundary_condition_closing_over_a_parameter():
    """y'' = a, y(0) = 0, c y(1)^2 = 2: y = a x^2 / 2 + (sqrt(2 / c) - a / 2) x (SciPy's
    collocation and spline are exact for it), so y(1/2) = sqrt(2 / c) / 2 - a / 8. `bc`
    is nonlinear in y(1) and its derivative in c depends on y(1), so both must be taken
    at the last node; both modes and both parameters (a in `fun`, c in `bc`) against the
    closed form."""
    def mid(a, c):
        x = jnp.linspace(0.0, 1.0, 5)
        res = solve_bvp(lambda x, y: jnp.stack([y[1], a + 0.0 * y[0]]),
                        lambda ya, yb: jnp.stack([ya[0], c * yb[0] ** 2 - 2.0]),
                        x, jnp.stack([x, jnp.ones(5)]), tol=1e-8, max_nodes=50)
        return res.sol(0.5)[0]

    np.testing.assert_allclose(mid(0.8, 1.0), np.sqrt(2.0) / 2 - 0.1, rtol=1e-10)
    want = (-1 / 8, -np.sqrt(2.0) / 4)
    for mode in (jax.jacrev, jax.jacfwd):
        got = mode(mid, argnums=(0, 1))(0.8, 1.0)
        np.testing.assert_allclose(got, want, rtol=1e-9, err_msg=mode.__name__)


@pytest.mark.slow  # ~7.5 s; the unknown rate and the eigenvalue tests cover p in the default run
def test_two_unknown_parameters():
    """y' = p0 + p1 x, y(0) = 0, y(1) = a, p1 = c: y = p0 x + p1 x^2 / 2, so p0 = a - c/2
    and y(1/2) = p0 / 2 + c / 8. Two parameters put a block of two columns after the
    states in the collocation Jacobian (one parameter cannot tell its column offsets
    apart); both modes against the closed form."""
    def solve(a, c):
        x = jnp.linspace(0.0, 1.0, 5)
        res = solve_bvp(lambda x, y, p: jnp.broadcast_to(p[0] + p[1] * x, y.shape),
                        lambda ya, yb, p: jnp.stack([ya[0], yb[0] - a, p[1] - c]),
                        x, jnp.zeros((1, 5)), p=[0.0, 0.0], tol=1e-8)
        return jnp.stack([res.p[0], res.p[1], res.sol(0.5)[0]])

    a, c = 0.7, 0.4
    np.testing.assert_allclose(solve(a, c), [a - c / 2, c, (a - c / 2) / 2 + c / 8],
                               rtol=1e-10)
    want = np.array([[1.0, -0.5], [0.0, 1.0], [0.5, -0.25 + 0.125]])
    for mode in (jax.jacrev, jax.jacfwd):
        got = np.stack(mode(solve, (0, 1))(a, c), axis=-1)
        np.testing.assert_allclose(got, want, rtol=1e-8, atol=1e-12, err_msg=mode.__name__)


def test_first_order_problem_with_an_unknown_rate():
    """y' = -p y, y(0) = 1, y(1) = c p with the rate p unknown: e^-p = c p, and
    y(1/2) = e^(-p/2). One state and one parameter on an odd `max_nodes`, so the
    collocation Jacobian's size n M + k is odd, and `bc` depends on p; both modes
    against the implicit function theorem on e^-p = c p: dp/dc = -p / (c + e^-p)."""
    def solve(c):
        x = jnp.linspace(0.0, 1.0, 5)
        res = solve_bvp(lambda x, y, p: -p[0] * y, lambda ya, yb, p: jnp.stack(
            [ya[0] - 1.0, yb[0] - c * p[0]]), x, jnp.ones((1, 5)), p=[0.5], tol=1e-6,
            max_nodes=51)
        return jnp.stack([res.p[0], res.sol(0.5)[0]])

    c = 0.3
    p = scipy.optimize.brentq(lambda p: np.exp(-p) - c * p, 0.0, 5.0, xtol=1e-15)
    np.testing.assert_allclose(solve(c), [p, np.exp(-p / 2)], rtol=1e-6)
    dp = -p / (c + np.exp(-p))
    want = [dp, -0.5 * np.exp(-p / 2) * dp]
    for mode in (jax.jacrev, jax.jacfwd):
        np.testing.assert_allclose(mode(solve)(c), want, rtol=1e-6, err_msg=mode.__name__)
