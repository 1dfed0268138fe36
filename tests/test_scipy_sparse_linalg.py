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
    # forward mode with the matrix right-hand side (N, 2), w.r.t. A's data and B
    ours_B = jax.jacfwd(lambda d, B: spsolve((d, (row, col)), B), (0, 1))(data, B)
    ref_B = jax.jacfwd(lambda d, B: jnp.linalg.solve(dense(d, row, col), B), (0, 1))(data, B)
    for o, r in zip(ours_B, ref_B):
        np.testing.assert_allclose(o, r, rtol=1e-10, atol=1e-13)


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


def test_factor_cache_size_is_set_on_the_public_module(system, monkeypatch):
    """`jaxbridge.scipy.sparse.linalg.FACTOR_CACHE_SIZE`, set by a user, bounds the
    cache at its next insertion (the cache lives in a private module of the package)."""
    _, data, row, col, b = system
    monkeypatch.setattr(sl, "FACTOR_CACHE_SIZE", 1)
    for scale in (11.0, 13.0):  # two new matrices: two misses, one factor kept
        np.testing.assert_allclose(spsolve((data * scale, (row, col)), b),
                                   np.linalg.solve(dense(data * scale, row, col), b),
                                   rtol=1e-10)
    info = sl.factor_cache_info()
    assert (info["maxsize"], info["size"]) == (1, 1)
    monkeypatch.setattr(sl, "FACTOR_CACHE_SIZE", 3)
    spsolve((data * 17.0, (row, col)), b)
    assert (sl.factor_cache_info()["maxsize"], sl.factor_cache_info()["size"]) == (3, 2)


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
    from jaxbridge.scipy import SolverError
    with pytest.raises(SolverError, match="spsolve.*singular"):
        jax.block_until_ready(spsolve((d, (r, c)), jnp.ones(3)))
    with pytest.raises(SolverError, match="spsolve.*singular"):
        jax.block_until_ready(jax.jit(lambda b: spsolve((d, (r, c)), b))(jnp.ones(3)))
    assert np.isnan(spsolve((d, (r, c)), jnp.ones(3), on_failure="nan")).all()


def test_dense_a_as_scipy_with_its_warning_and_gradient_to_every_entry():
    """SciPy's spsolve takes a dense A (converting it, with a SparseEfficiencyWarning);
    ours the same, the gradient reaching every entry (against jnp.linalg.solve)."""
    import scipy.sparse
    import scipy.sparse.linalg
    A = jnp.array([[4.0, 1.0, 0.0], [1.0, 3.0, 0.5], [0.0, 0.5, 2.0]])
    b = jnp.array([1.0, 2.0, 3.0])
    with pytest.warns(scipy.sparse.SparseEfficiencyWarning):
        ref = scipy.sparse.linalg.spsolve(np.asarray(A), np.asarray(b))
    with pytest.warns(scipy.sparse.SparseEfficiencyWarning, match="spsolve: A is dense"):
        ours = spsolve(A, b)
    np.testing.assert_allclose(ours, ref, rtol=1e-13)
    with pytest.warns(scipy.sparse.SparseEfficiencyWarning):
        g = jax.grad(lambda A: spsolve(A, b)[1])(A)
    np.testing.assert_allclose(g, jax.grad(lambda A: jnp.linalg.solve(A, b)[1])(A),
                               rtol=1e-12, atol=1e-15)
    with pytest.raises(ValueError, match=r"spsolve: A of shape \(3, 3\) does not match "
                                         r"b's 2 rows"):
        spsolve(A, jnp.ones(2))


# ------------------------------------------------------------------ eigsh
from jaxbridge.scipy import SolverError  # noqa: E402
from jaxbridge.scipy.sparse.linalg import eigsh  # noqa: E402
from jaxbridge.testing import check_rules  # noqa: E402

M = 10


def laplacian_like(theta):
    """A symmetric tridiagonal matrix with well-separated eigenvalues, as BCOO (both
    triangles stored; each off-diagonal parameter feeds both entries)."""
    diag = jnp.arange(1.0, M + 1.0) * theta[0]
    off = theta[1] * jnp.linspace(0.5, 1.0, M - 1)
    i = jnp.arange(M)
    rows = jnp.concatenate([i, i[:-1], i[1:]])
    cols = jnp.concatenate([i, i[1:], i[:-1]])
    return jsparse.BCOO((jnp.concatenate([diag, off, off]), jnp.stack([rows, cols], 1)),
                        shape=(M, M))


def eig_loss(theta, k=3, which="LA"):
    w, v = eigsh(laplacian_like(theta), k=k, which=which)
    return jnp.sum(w * jnp.arange(1.0, k + 1)) + jnp.sum(v[:, 0] ** 3) + jnp.sum(
        v[:, -1] * jnp.arange(M))


def eig_loss_dense(theta, k=3):
    w, v = jnp.linalg.eigh(laplacian_like(theta).todense())
    w, v = w[-k:], v[:, -k:]
    v = v * jnp.sign(v[jnp.argmax(jnp.abs(v), axis=0), jnp.arange(k)])[None, :]
    return jnp.sum(w * jnp.arange(1.0, k + 1)) + jnp.sum(v[:, 0] ** 3) + jnp.sum(
        v[:, -1] * jnp.arange(M))


TH_E = jnp.array([1.0, 0.3])


def test_eigsh_values_match_scipy_and_dense():
    A = laplacian_like(TH_E)
    w, v = eigsh(A, k=3, which="LA")
    ref_w = scipy.sparse.linalg.eigsh(scipy.sparse.csr_matrix(np.asarray(A.todense())), k=3,
                                      which="LA", return_eigenvectors=False)
    np.testing.assert_allclose(w, np.sort(ref_w), rtol=1e-10)
    np.testing.assert_allclose(w, np.linalg.eigvalsh(np.asarray(A.todense()))[-3:], rtol=1e-10)
    np.testing.assert_allclose(A.todense() @ v, v * w[None, :], atol=1e-9)
    # every input form: dense array, SciPy sparse (a constant)
    np.testing.assert_allclose(eigsh(A.todense(), k=3, which="LA")[0], w, rtol=1e-10)
    sp = scipy.sparse.csr_matrix(np.asarray(A.todense()))
    np.testing.assert_allclose(eigsh(sp, 3, which="LA", return_eigenvectors=False), w,
                               rtol=1e-10)


@pytest.mark.slow
def test_eigsh_gradients_vs_dense_jax_and_fd():
    ref = jax.grad(eig_loss_dense)(TH_E)
    np.testing.assert_allclose(jax.grad(eig_loss)(TH_E), ref, rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(jax.jit(jax.grad(eig_loss))(TH_E), ref, rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(jax.jacfwd(eig_loss)(TH_E), ref, rtol=1e-8, atol=1e-10)
    eps = 1e-6
    fd_ = [(eig_loss(TH_E + eps * e) - eig_loss(TH_E - eps * e)) / (2 * eps) for e in np.eye(2)]
    np.testing.assert_allclose(ref, fd_, rtol=1e-6)
    # shift-invert mode (sigma) gives the same pairs and gradients
    g_si = jax.grad(lambda th: jnp.sum(eigsh(laplacian_like(th), k=2, sigma=0.0)[0]))(TH_E)
    g_d = jax.grad(lambda th: jnp.sum(jnp.linalg.eigvalsh(laplacian_like(th).todense())[:2]))(
        TH_E)
    np.testing.assert_allclose(g_si, g_d, rtol=1e-8)


def test_eigsh_of_a_dense_matrix_differentiates_every_entry_under_every_transform():
    """A dense A runs ARPACK on the dense matrix itself (as SciPy does); its gradient is
    the whole matrix, symmetrized as jnp.linalg.eigh's, under grad, jit, jacfwd and vmap."""
    A = laplacian_like(TH_E).todense() + 0.05 * jnp.outer(jnp.arange(M), jnp.ones(M))
    A = 0.5 * (A + A.T)

    def loss(A, eig):
        w, v = eig(A)
        v = v * jnp.sign(v[jnp.argmax(jnp.abs(v), axis=0), jnp.arange(3)])[None, :]
        return jnp.sum(w * jnp.arange(1.0, 4.0)) + jnp.sum(v[:, 0] ** 3)

    ours = lambda A: eigsh(A, k=3, which="LA")  # noqa: E731
    ref = lambda A: tuple(x[..., -3:] for x in jnp.linalg.eigh(A))  # noqa: E731
    w, v = ours(A)
    np.testing.assert_allclose(w, scipy.sparse.linalg.eigsh(
        np.asarray(A), k=3, which="LA", return_eigenvectors=False), rtol=1e-12)
    np.testing.assert_allclose(np.asarray(A) @ v, v * w[None, :], atol=1e-10)
    g_ref = jax.grad(loss)(A, ref)
    np.testing.assert_allclose(jax.grad(loss)(A, ours), g_ref, atol=1e-9)
    np.testing.assert_allclose(jax.jit(jax.grad(loss), static_argnums=1)(A, ours), g_ref,
                               atol=1e-9)
    dA = jnp.asarray(np.random.default_rng(3).normal(size=(M, M)))
    t_ours = jax.jvp(lambda A: loss(A, ours), (A,), (dA,))[1]
    t_ref = jax.jvp(lambda A: loss(A, ref), (A,), (dA,))[1]
    np.testing.assert_allclose(t_ours, t_ref, rtol=1e-8)
    batch = jnp.stack([A, 2.0 * A + jnp.diag(jnp.arange(M) * 0.1)])
    np.testing.assert_allclose(jax.vmap(lambda A: ours(A)[0])(batch)[0], w, rtol=1e-12)
    np.testing.assert_allclose(jax.vmap(jax.grad(loss), in_axes=(0, None))(batch, ours),
                               jax.vmap(jax.grad(loss), in_axes=(0, None))(batch, ref),
                               atol=1e-9)
    w32 = eigsh(A.astype(jnp.float32), k=3, which="LA")[0]
    assert w32.dtype == jnp.float32
    np.testing.assert_allclose(w32, w, rtol=1e-5)


@pytest.mark.slow
def test_eigsh_vmap_and_check_rules():
    ths = jnp.stack([TH_E, TH_E * 1.2])
    g = jax.vmap(jax.grad(eig_loss))(ths)
    np.testing.assert_allclose(g[1], jax.grad(eig_loss_dense)(ths[1]), rtol=1e-8, atol=1e-10)
    # ARPACK's eigenvectors are accurate to ~1e-13: finite differences of them are too
    report = check_rules(lambda th: eigsh(laplacian_like(th), k=2, which="LA"), np.asarray(TH_E),
                         check_options={"atol": 1e-10})
    assert report.passed, report


def test_eigsh_degenerate_eigenvector_gradient_is_an_error():
    A = jnp.diag(jnp.array([1.0, 2.0, 3.0, 3.0, 5.0, 6.0]))
    # eigenvalues alone, both copies of 3 computed and weighted equally: fine
    g = jax.grad(lambda A: jnp.sum(eigsh(A, k=4, which="LA")[0]))(A)
    np.testing.assert_allclose(jnp.diag(g), [0, 0, 1, 1, 1, 1], atol=1e-12)
    # one copy of 3 computed (k=3), or the copies weighted differently: basis-dependent
    with pytest.raises(SolverError, match="not computed"):
        jax.grad(lambda A: jnp.sum(eigsh(A, k=3, which="LA")[0]))(A)
    with pytest.raises(SolverError, match="cotangents of its 2 copies differ"):
        jax.grad(lambda A: eigsh(A, k=4, which="LA")[0][0])(A)
    with pytest.raises(SolverError, match="eigsh: eigenvalue .* is degenerate"):
        jax.grad(lambda A: eigsh(A, k=4, which="LA")[1][:, 0].sum())(A)
    with pytest.raises(SolverError, match="degenerate"):
        jax.jit(jax.grad(lambda A: eigsh(A, k=4, which="LA")[1][:, 0].sum()))(A)
    # the eigenvector of a copy whose twin was not computed (k=3): here A - 3 I is exactly
    # singular on the complement of v (splu fails): an error, or NaN with on_failure="nan"
    with pytest.raises(SolverError, match="not computed .A - lambda I is singular"):
        jax.jacrev(lambda A: eigsh(A, k=3, which="LA")[1][:, 0])(A)
    J = jax.jacrev(lambda A: eigsh(A, k=3, which="LA", on_failure="nan")[1][:, 0])(A)
    assert J.shape == (6, 6, 6) and np.isnan(J).all()
    # forward mode computes every tangent, used or not: the eigenvector's is NaN there
    # under either policy, so that the eigenvalues' (below) stay available
    assert np.isnan(jax.jacfwd(lambda A: eigsh(A, k=3, which="LA")[1][:, 0])(A)).all()
    with pytest.raises(ValueError, match=r"eigsh: k must satisfy 0 < k < n = 6"):
        eigsh(A, k=6)
    with pytest.raises(NotImplementedError, match="`M` is not supported"):
        eigsh(A, k=2, M=jnp.eye(6))


def test_eigsh_forward_mode_of_degenerate_eigenvalues_alone():
    # jacfwd of the eigenvalues of a matrix with a double eigenvalue (both copies
    # computed) is exact, as in reverse mode: with return_eigenvectors=False, and with
    # the eigenvectors returned and not used. It raised SolverError ("differentiate only
    # the eigenvalues"), because forward mode's rule also computes the eigenvectors'
    # tangents, which do not exist there.
    A = jnp.diag(jnp.array([1.0, 2.0, 3.0, 3.0, 5.0, 6.0]))
    want = np.diag([0.0, 0.0, 1.0, 1.0, 1.0, 1.0])
    for f in (lambda A: jnp.sum(eigsh(A, k=4, which="LA", return_eigenvectors=False)),
              lambda A: jnp.sum(eigsh(A, k=4, which="LA")[0])):
        np.testing.assert_allclose(jax.jacfwd(f)(A), want, atol=1e-12)
        np.testing.assert_allclose(jax.jacrev(f)(A), want, atol=1e-12)
    _, (w_dot, v_dot) = jax.jvp(lambda A: eigsh(A, k=4, which="LA"), (A,), (jnp.eye(6),))
    np.testing.assert_allclose(w_dot, 1.0, rtol=1e-12)
    assert np.isnan(v_dot[:, :2]).all() and np.isfinite(v_dot[:, 2:]).all()


def test_eigsh_eigenvector_tangents_of_close_distinct_pairs_and_unused_parameters():
    # Eigenvalues 1.5e-9 apart (|lambda| < 1) are distinct: the degeneracy threshold is
    # 1e-9 max(1, |lambda|), so their eigenvectors have tangents (large: ~1/gap), equal
    # to JAX's dense eigh's. And a parameter the matrix does not depend on gets exactly
    # zero tangents (jacfwd pushes a zero dA through the rule: a zero right-hand side
    # is not a "degenerate" solve).
    d = jnp.array([0.1, 0.2, 0.3, 0.5, 0.5 + 1.5e-9, 0.9])
    dA = jnp.zeros((6, 6)).at[3, 4].set(1e-9).at[4, 3].set(1e-9).at[0, 1].set(1.0)
    dA = dA.at[1, 0].set(1.0)

    def top3(eig):
        def f(theta):  # theta[1] is not used
            w, v = eig(jnp.diag(d) + theta[0] * dA)
            v = v[:, -3:]
            return v * jnp.sign(v[jnp.argmax(jnp.abs(v), axis=0), jnp.arange(3)])[None, :]
        return f

    theta = jnp.zeros(2)
    J = jax.jacfwd(top3(lambda A: eigsh(A, k=3, which="LA")))(theta)
    np.testing.assert_allclose(J[..., 0], jax.jacfwd(top3(jnp.linalg.eigh))(theta)[..., 0],
                               atol=1e-6)
    assert abs(float(J[4, 0, 0])) > 0.5  # the close pair mixes: 1e-9 / 1.5e-9 ~ 0.67
    np.testing.assert_array_equal(J[..., 1], 0.0)


def test_eigsh_eigenvector_derivatives_are_linear_in_a_huge_cotangent():
    # The test for a singular A - lambda I is relative to the right-hand side: a loss
    # scaled by 1e14 (units, a penalty weight) has 1e14 times the gradient, not a
    # "degenerate" error because the solve's result is large. Reverse mode (cotangent
    # of v) and forward mode (tangent of A), against JAX's dense eigh.
    A = jnp.diag(jnp.arange(1.0, 7.0)) + 0.1 * jnp.ones((6, 6))
    S = jnp.array([[0.0, 1.0, 0, 0, 0, 2.0]]).T @ jnp.ones((1, 6))
    dA = S + S.T
    r = jnp.arange(1.0, 7.0)

    def loss(A, c, eig):
        v = eig(A)[1][:, -1]
        return c * (v @ r) ** 2  # the sign of v drops out

    ours = lambda A: eigsh(A, k=2, which="LA")  # noqa: E731
    dense = jnp.linalg.eigh
    for c in (1.0, 1e14):
        np.testing.assert_allclose(jax.grad(loss)(A, c, ours), jax.grad(loss)(A, c, dense),
                                   rtol=1e-8, atol=1e-10 * c)
    _, t = jax.jvp(lambda A: ours(A)[1][:, -1] * jnp.sign(ours(A)[1][-1, -1]), (A,),
                   (1e14 * dA,))
    _, t_dense = jax.jvp(lambda A: dense(A)[1][:, -1] * jnp.sign(dense(A)[1][-1, -1]), (A,),
                         (dA,))
    np.testing.assert_allclose(t, 1e14 * t_dense, rtol=1e-8, atol=1e4)


def test_eigsh_degeneracy_is_diagnosed_in_a_rotated_basis():
    """A double eigenvalue off the axes: in floating point A - lambda I is then nearly,
    not exactly, singular (the bordered solves return huge finite numbers, not an
    exact-singularity error). Each case still gets its own diagnosis, and a gap within
    round-off of the eigenvalues' scale (1e-11) is degenerate, not a huge derivative."""
    Q = np.linalg.qr(np.random.default_rng(0).normal(size=(6, 6)))[0]
    A = Q @ np.diag([1.0, 2.0, 3.0, 3.0, 5.0, 6.0]) @ Q.T
    A = jnp.asarray((A + A.T) / 2)
    # both copies computed, weighted equally: the jnp twin's gradient
    g = jax.grad(lambda A: jnp.sum(eigsh(A, k=4, which="LA")[0]))(A)
    twin = jax.grad(lambda A: jnp.sum(jnp.linalg.eigvalsh(A)[2:]))(A)
    np.testing.assert_allclose(g, twin, atol=1e-12)
    with pytest.raises(SolverError, match="degenerate with an eigenvalue that was not computed"):
        jax.grad(lambda A: jnp.sum(eigsh(A, k=3, which="LA")[0]))(A)
    with pytest.raises(SolverError, match=r"another computed eigenvalue is \S+ away"):
        jax.grad(lambda A: eigsh(A, k=4, which="LA")[1][:, 0].sum())(A)
    near = jnp.diag(jnp.array([1.0, 2.0, 3.0, 3.0 + 1e-11, 5.0, 6.0]))
    with pytest.raises(SolverError, match="another computed eigenvalue is 1e-11 away"):
        jax.jacrev(lambda A: eigsh(A, k=4, which="LA")[1][:, 0])(near)
    assert np.isnan(jax.jacfwd(lambda A: eigsh(A, k=4, which="LA")[1][:, 0])(near)).all()


def test_eigsh_arpack_failure_policies():
    A = laplacian_like(TH_E)
    with pytest.raises(SolverError, match="eigsh: SciPy reported failure: ARPACK"):
        jax.block_until_ready(eigsh(A, k=3, which="SA", maxiter=1, ncv=4))
    with pytest.raises(SolverError, match="ARPACK"):
        jax.block_until_ready(jax.jit(lambda th: eigsh(laplacian_like(th), k=3, which="SA",
                                                       maxiter=1, ncv=4)[0])(TH_E))
    w, v = eigsh(A, k=3, which="SA", maxiter=1, ncv=4, on_failure="nan")
    assert np.isnan(w).all() and np.isnan(v).all()


@pytest.mark.parametrize("shape", [(3, 4), (2, 2, 2)])
def test_eigsh_of_a_non_square_matrix_raises_scipys_value_error(shape):
    """sparse.linalg.eigsh: SciPy's ValueError for a matrix that is not square."""
    with pytest.raises(Exception) as scipy_exc:
        scipy.sparse.linalg.eigsh(np.ones(shape), k=1)
    with pytest.raises(type(scipy_exc.value), match="eigsh: A must be a square"):
        eigsh(jnp.ones(shape), k=1)
