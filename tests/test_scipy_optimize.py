"""jaxbridge.scipy.optimize: root and minimize, differentiated by the implicit function theorem."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.optimize

from jaxbridge.scipy.optimize import minimize, root
from conftest import fd


def F(x, p):
    return x ** 3 + p["a"] * x - p["b"]


P = {"a": jnp.array(2.0), "b": jnp.array([1.0, 2.0, 3.0])}
X0 = jnp.zeros(3)


def objective(x, q):
    return jnp.sum(q["w"] * (x - q["c"]) ** 2) + 0.1 * jnp.sum(x ** 4) + 0.3 * x[0] * x[1]


Q = {"c": jnp.array([1.0, -2.0]), "w": jnp.array([1.0, 3.0])}



@pytest.mark.parametrize("method", ["hybr", "lm", "krylov"])
def test_root_value_matches_scipy(method):
    sol = root(F, X0, P, method=method, tol=1e-12)
    ref = scipy.optimize.root(lambda x: np.asarray(F(jnp.asarray(x), P)), np.zeros(3),
                              method=method, tol=1e-12)
    np.testing.assert_allclose(sol.x, ref.x, rtol=1e-8)
    assert bool(sol.success)
    np.testing.assert_allclose(sol.fun, 0.0, atol=1e-8)


@pytest.mark.parametrize("linear_solver", ["direct", "gmres"])
def test_root_gradient_vs_closed_form_and_fd(linear_solver):
    def L(p):
        return jnp.sum(jnp.sin(root(F, X0, p, linear_solver=linear_solver).x))

    g = jax.jit(jax.grad(L))(P)
    x = root(F, X0, P).x
    # by hand: dx/db = 1/(3x^2 + a), dx/da = -x/(3x^2 + a)
    d = 3 * x ** 2 + P["a"]
    np.testing.assert_allclose(g["b"], jnp.cos(x) / d, rtol=1e-9)
    np.testing.assert_allclose(g["a"], jnp.sum(-jnp.cos(x) * x / d), rtol=1e-9)
    np.testing.assert_allclose(g["b"], fd(lambda b: L({"a": P["a"], "b": b}), P["b"]),
                               rtol=1e-6)
    fwd = jax.jacfwd(lambda p: root(F, X0, p, linear_solver=linear_solver).x)(P)
    rev = jax.jacrev(lambda p: root(F, X0, p, linear_solver=linear_solver).x)(P)
    np.testing.assert_allclose(fwd["b"], jnp.diag(1 / d), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(fwd["a"], rev["a"], rtol=1e-9)


def test_root_vs_pure_jax_implicit_differentiation():
    """A 2-D coupled system; reference: hand-written IFT with jnp.linalg.solve."""
    def G(x, p):
        return jnp.stack([x[0] + p[0] * jnp.tanh(x[1]) - 1.0, x[1] - p[1] * x[0] ** 2])

    p = jnp.array([0.5, 0.3])
    x = root(G, jnp.zeros(2), p, tol=1e-13).x
    jx = jax.jacfwd(G, 0)(x, p)
    jp = jax.jacfwd(G, 1)(x, p)
    ref = -jnp.linalg.solve(jx, jp)
    np.testing.assert_allclose(jax.jacrev(lambda p: root(G, jnp.zeros(2), p, tol=1e-13).x)(p),
                               ref, rtol=1e-9)
    np.testing.assert_allclose(jax.jacfwd(lambda p: root(G, jnp.zeros(2), p, tol=1e-13).x)(p),
                               ref, rtol=1e-9)


@pytest.mark.parametrize("method", ["BFGS", "L-BFGS-B", "Newton-CG", "trust-ncg", "trust-exact",
                                    "Nelder-Mead"])
def test_minimize_gradients(method):
    tol = {"BFGS": None, "trust-exact": 1e-8}.get(method, 1e-10)
    opts = {"xatol": 1e-12, "fatol": 1e-14, "maxiter": 4000} if method == "Nelder-Mead" else None

    def sol(q):
        return minimize(objective, jnp.zeros(2), q, method=method, tol=tol, options=opts)

    ref = scipy.optimize.minimize(lambda x: float(objective(jnp.asarray(x), Q)), np.zeros(2),
                                  method="BFGS", tol=1e-12)
    np.testing.assert_allclose(sol(Q).x, ref.x, rtol=1e-5, atol=1e-6)

    def L(q):
        s = sol(q)
        return jnp.sum(s.x ** 2) + s.fun

    g = jax.grad(L)(Q)
    # reference: IFT on the exact optimum, all in JAX
    x = jnp.asarray(ref.x)
    H = jax.hessian(objective)(x, Q)
    lam = jnp.linalg.solve(H, 2 * x)
    cross = jax.grad(lambda q: -jnp.vdot(lam, jax.grad(objective)(x, q)) + objective(x, q))(Q)
    # BFGS stops at SciPy's default gtol=1e-5: its x* (so its gradient) is less accurate
    rtol = 1e-4 if method in ("Nelder-Mead", "BFGS") else 1e-6
    for k in ("c", "w"):
        np.testing.assert_allclose(g[k], cross[k], rtol=rtol, atol=1e-7)
    fwd = jax.jacfwd(L)(Q)
    np.testing.assert_allclose(fwd["c"], g["c"], rtol=1e-8, atol=1e-10)


def test_minimize_matrix_free_cg_and_vmap_and_jit():
    def L(q, ls):
        return jnp.sum(minimize(objective, jnp.zeros(2), q, method="L-BFGS-B", tol=1e-12,
                                linear_solver=ls).x)
    np.testing.assert_allclose(jax.grad(L)(Q, "cg")["c"], jax.grad(L)(Q, "direct")["c"],
                               rtol=1e-8)
    cs = jnp.array([[1.0, -2.0], [0.5, 0.5], [-1.0, 2.0]])
    batched = jax.jit(jax.vmap(jax.grad(lambda c: L({"c": c, "w": Q["w"]}, "auto"))))(cs)
    for i in range(3):
        np.testing.assert_allclose(batched[i], jax.grad(lambda c: L({"c": c, "w": Q["w"]},
                                                                   "auto"))(cs[i]), rtol=1e-10)


def test_jitted_training_loop_through_root():
    target = jnp.array([0.3, 0.6, 0.9])

    @jax.jit
    def train(b):
        def step(_, b):
            g = jax.grad(lambda b: jnp.sum((root(F, X0, {"a": P["a"], "b": b}).x
                                            - target) ** 2))(b)
            return b - 2.0 * g
        return jax.lax.fori_loop(0, 30, step, b)

    b = train(P["b"])
    np.testing.assert_allclose(root(F, X0, {"a": P["a"], "b": b}).x, target, atol=1e-3)


def test_failure_policies():
    def no_root(x):
        return x ** 2 + 1.0
    with pytest.raises(Exception, match=r"optimize\.root.*hybr"):
        jax.block_until_ready(root(no_root, jnp.ones(1)))
    sol = root(no_root, jnp.ones(1), on_failure="nan")
    assert not bool(sol.success) and np.isnan(sol.x).all()
    with pytest.raises(Exception, match=r"minimize.*BFGS.*(iterations|Maximum)"):
        jax.block_until_ready(minimize(objective, jnp.zeros(2), Q, options={"maxiter": 1}))
    g = jax.grad(lambda q: minimize(objective, jnp.zeros(2), q, options={"maxiter": 1},
                                    on_failure="nan").x.sum())(Q)
    assert np.isnan(g["c"]).all()
    with pytest.raises(ValueError, match="linear_solver"):
        root(F, X0, P, linear_solver="qr")
