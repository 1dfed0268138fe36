"""jaxbridge.scipy.sparse.linalg.spsolve: values, gradients w.r.t. b and A's nonzeros."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.sparse
import scipy.sparse.linalg
from jax.experimental import sparse as jsparse

from jaxbridge.scipy.sparse import linalg as sl
from jaxbridge.scipy.sparse.linalg import spsolve

N = 12


@pytest.fixture
def system():
    A = (scipy.sparse.random(N, N, density=0.3, random_state=1) + 4 * scipy.sparse.eye(N)).tocoo()
    b = np.random.default_rng(2).normal(size=N)
    return A, jnp.asarray(A.data), jnp.asarray(A.row), jnp.asarray(A.col), jnp.asarray(b)


def dense(data, row, col):
    return jnp.zeros((N, N), data.dtype).at[row, col].add(data)


def test_values_all_input_forms(system):
    A, data, row, col, b = system
    ref = scipy.sparse.linalg.spsolve(A.tocsc(), np.asarray(b))
    np.testing.assert_allclose(spsolve((data, (row, col)), b), ref, rtol=1e-12)
    csr = A.tocsr()
    np.testing.assert_allclose(
        spsolve((jnp.asarray(csr.data), jnp.asarray(csr.indices), jnp.asarray(csr.indptr)), b),
        ref, rtol=1e-12)
    bcoo = jsparse.BCOO((data, jnp.stack([row, col], 1)), shape=(N, N))
    np.testing.assert_allclose(spsolve(bcoo, b), ref, rtol=1e-12)
    np.testing.assert_allclose(spsolve(jsparse.BCSR.fromdense(dense(data, row, col)), b), ref,
                               rtol=1e-12)
    B = jnp.stack([b, -2 * b], 1)
    np.testing.assert_allclose(spsolve((data, (row, col)), B), np.stack([ref, -2 * ref], 1),
                               rtol=1e-12)


def test_gradients_vs_dense_jax(system):
    _, data, row, col, b = system

    def L(d, b):
        return jnp.sum(jnp.sin(spsolve((d, (row, col)), b)))

    def Lref(d, b):
        return jnp.sum(jnp.sin(jnp.linalg.solve(dense(d, row, col), b)))

    ours = jax.jit(jax.grad(L, (0, 1)))(data, b)
    ref = jax.grad(Lref, (0, 1))(data, b)
    np.testing.assert_allclose(ours[0], ref[0], rtol=1e-10, atol=1e-13)
    np.testing.assert_allclose(ours[1], ref[1], rtol=1e-10, atol=1e-13)
    fwd = jax.jacfwd(lambda d: spsolve((d, (row, col)), b))(data)
    np.testing.assert_allclose(fwd, jax.jacfwd(lambda d: jnp.linalg.solve(dense(d, row, col),
                                                                          b))(data),
                               rtol=1e-10, atol=1e-13)
    # a matrix right-hand side, and BCOO input with gradient to its data
    B = jnp.stack([b, b ** 2], 1)
    g = jax.grad(lambda d: spsolve(jsparse.BCOO((d, jnp.stack([row, col], 1)), shape=(N, N)),
                                   B).sum())(data)
    np.testing.assert_allclose(g, jax.grad(lambda d: jnp.linalg.solve(dense(d, row, col),
                                                                      B).sum())(data),
                               rtol=1e-10, atol=1e-13)


def test_finite_differences_and_csr_gradient(system):
    A, data, row, col, b = system
    csr = A.tocsr()
    indices, indptr = jnp.asarray(csr.indices), jnp.asarray(csr.indptr)
    d0 = jnp.asarray(csr.data)

    def L(d):
        return jnp.sum(spsolve((d, indices, indptr), b) ** 2)

    g = jax.grad(L)(d0)
    eps = 1e-6
    for k in (0, 5, len(d0) - 1):
        e = jnp.zeros_like(d0).at[k].set(eps)
        np.testing.assert_allclose(g[k], (L(d0 + e) - L(d0 - e)) / (2 * eps), rtol=1e-6)


def test_vmap_jit_and_factor_reuse(system):
    _, data, row, col, b = system
    scales = jnp.array([1.0, 2.0, 3.0])
    f = jax.jit(jax.vmap(jax.grad(lambda s: jnp.sum(spsolve((data * s, (row, col)), b)))))
    out = f(scales)
    for i, s in enumerate(scales):
        ref = jax.grad(lambda s: jnp.sum(jnp.linalg.solve(dense(data * s, row, col), b)))(s)
        np.testing.assert_allclose(out[i], ref, rtol=1e-10)
    before = sl.factor_cache_info()
    jax.grad(lambda d: spsolve((d, (row, col)), b).sum())(data * 7.0)
    after = sl.factor_cache_info()
    assert after["misses"] - before["misses"] == 1  # forward factors; backward reuses
    assert after["hits"] > before["hits"]


def test_jitted_training_loop(system):
    _, data, row, col, b = system
    target = spsolve((data, (row, col)), b)

    @jax.jit
    def train(d):
        def step(_, d):
            return d - 5.0 * jax.grad(lambda d: jnp.sum((spsolve((d, (row, col)), b)
                                                         - target) ** 2))(d)
        return jax.lax.fori_loop(0, 20, step, d)

    d0 = data * 1.1
    loss = lambda d: float(jnp.sum((spsolve((d, (row, col)), b) - target) ** 2))  # noqa
    assert loss(train(d0)) < 0.1 * loss(d0)


def test_singular_failure_policy():
    d, r, c = jnp.array([1.0, 1.0, 1.0]), jnp.array([0, 1, 2]), jnp.array([0, 1, 1])
    with pytest.raises(Exception, match="spsolve.*singular"):
        jax.block_until_ready(spsolve((d, (r, c)), jnp.ones(3)))
    assert np.isnan(spsolve((d, (r, c)), jnp.ones(3), on_failure="nan")).all()
    with pytest.raises(TypeError, match="BCOO"):
        spsolve(jnp.eye(3), jnp.ones(3))
