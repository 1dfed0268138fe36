"""root(method="krylov", stepping="compiled"): SciPy's Newton-Krylov loop in JAX on exact
Jacobian-vector products, against SciPy, a jnp twin, the implicit function theorem
computed densely, and central differences in float64."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.optimize
from conftest import deq_layer, fd

from jaxbridge.scipy import SolverError
from jaxbridge.scipy.optimize import _newton_krylov, root
from jaxbridge.scipy.sparse.linalg import _gmres

# the lean GMRES (the compiled root's inner and tangent solver), jitted once: the
# matvec and the cycle length are static
_cycle = jax.jit(_gmres.cycle, static_argnums=(0, 4))
_solve = jax.jit(_gmres.solve, static_argnums=(0, 3, 4))


def _deq_residual(x):
    def F(z, W, U):
        return z - jnp.tanh(z @ W.T + x @ U.T)
    return F


def _scipy(F, shape, *args, **kw):
    """scipy.optimize.root on the same residual, in NumPy, from zeros."""
    def F_np(z):
        return np.asarray(F(jnp.asarray(z).reshape(shape), *args)).ravel()
    ref = scipy.optimize.root(F_np, np.zeros(int(np.prod(shape))), method="krylov", **kw)
    assert ref.success, ref.message  # the reference's own success (DESIGN.md)
    return ref


@pytest.mark.parametrize("kw", [{}, pytest.param({"tol": 1e-10}, marks=pytest.mark.slow)])
def test_deq_16x32_matches_scipy(kw):
    """The DEQ of issue 22 (512 unknowns): the root SciPy's own loop accepts, by SciPy's
    termination test (the default |F|_max <= eps^(1/3); with tol, SciPy's relative step
    test), and the same number of Newton steps, with ~1/10 of SciPy's evaluations
    (SciPy's count includes one per finite-difference product)."""
    W, U, x = deq_layer(16, 32)
    F = _deq_residual(x)
    ref = _scipy(F, (16, 32), W, U, **kw)
    sol = root(F, jnp.zeros((16, 32)), (W, U), method="krylov", stepping="compiled", **kw)
    assert bool(sol.success) and int(sol.status) == 1 == ref.status
    assert int(sol.nit) == ref.nit
    assert 0 < int(sol.nfev) < ref.nfev / 3
    atol = 1e-7 if not kw else 1e-13  # default f_tol = 6e-6: both stop near the root
    np.testing.assert_allclose(np.ravel(sol.x), ref.x, atol=atol)
    if not kw:
        assert np.abs(sol.fun).max() <= np.finfo(float).eps ** (1 / 3)
    np.testing.assert_allclose(sol.fun, np.ravel(F(sol.x, W, U)), rtol=1e-12, atol=1e-15)


@pytest.mark.slow  # one compile per option set
@pytest.mark.parametrize("options", [
    {"line_search": None}, {"line_search": "armijo", "fatol": 1e-12, "maxiter": 50},
    {"jac_options": {"method": "gmres", "inner_maxiter": 5}},
    {"jac_options": {"inner_inner_m": 4, "inner_rtol": 1e-6}, "xtol": 1e-9},
])
def test_bratu_matches_scipy_with_options(options):
    """A 1-D Bratu problem (u'' + 2 exp(u) = 0 on 40 points, nonlinear, not a
    contraction) with SciPy's options: the same root and termination status."""
    n = 40
    h = 1.0 / (n + 1)

    def F(u, lam):
        up = jnp.concatenate([u[1:], jnp.zeros(1)])
        um = jnp.concatenate([jnp.zeros(1), u[:-1]])
        return (up - 2 * u + um) / h ** 2 + lam * jnp.exp(u)

    ref = _scipy(F, (n,), 2.0, options=options)
    sol = root(F, jnp.zeros(n), (2.0,), method="krylov", stepping="compiled",
               options=options)
    assert bool(sol.success) and int(sol.status) == ref.status == 1
    fatol = options.get("fatol", np.finfo(float).eps ** (1 / 3))
    assert np.abs(sol.fun).max() <= fatol
    np.testing.assert_allclose(sol.x, ref.x, rtol=1e-5, atol=1e-6)


def test_no_finite_differences():
    """Every residual evaluation is counted on the host: there are exactly `nfev` of
    them (the start, one linearization per Newton step, the line-search trials) however
    many Jacobian-vector products GMRES makes, i.e. the products come from JAX, not
    from evaluating the residual at x + h v. SciPy's loop needs far more evaluations,
    and its root is as exact only to its finite differences' accuracy."""
    calls = []
    b = jnp.linspace(-1.0, 2.0, 30)

    def F(x, a):
        jax.debug.callback(lambda: calls.append(1))
        return x ** 3 + a * x - b + 0.5 * jnp.roll(x, 1) - 0.3 * jnp.sin(jnp.roll(x, -2))

    sol = root(F, jnp.zeros(30), (1.5,), method="krylov", stepping="compiled", tol=1e-12)
    jax.effects_barrier()
    evaluations = len(calls) - 1  # the last: sol.fun, recomputed in JAX at x*
    assert bool(sol.success) and evaluations == int(sol.nfev)
    ref = _scipy(F, (30,), 1.5, tol=1e-12)
    assert ref.nfev > 3 * evaluations
    # Newton on exact products: quadratic convergence to rounding
    np.testing.assert_allclose(F(sol.x, 1.5), 0.0, atol=1e-14)
    np.testing.assert_allclose(sol.x, ref.x, rtol=1e-9, atol=1e-12)


def _dense_ift(F, z, W, U):
    """dz*/dW by the implicit function theorem, densely: -(dF/dz)^-1 dF/dW."""
    n = z.size
    Jz = jax.jacfwd(F)(z, W, U).reshape(n, n)
    JW = jax.jacfwd(F, argnums=1)(z, W, U).reshape(n, W.size)
    return -jnp.linalg.solve(Jz, JW).reshape(z.shape + W.shape)


@pytest.mark.slow  # 20 s on the loaded 2-core machine (compiles); by default, the closed
# form below and the derivative matrix's krylov row cover the derivatives
@pytest.mark.parametrize("batch,width", [(2, 4), (6, 16)])  # 8 unknowns: dense; 96: GMRES
def test_deq_derivatives(batch, width):
    """grad, jvp, jacfwd, vmap (every element), jit and closures through the compiled
    Newton-Krylov, against JAX autodiff of a fixed-point iteration, the dense implicit
    function theorem, and central differences in float64."""
    W, U, x = deq_layer(batch, width, seed=1)
    F = _deq_residual(x)
    dW = jax.random.normal(jax.random.PRNGKey(5), W.shape)
    z0 = jnp.zeros((batch, width))

    def ours(W, U):
        return root(F, z0, (W, U), method="krylov", tol=1e-13).x

    def closure(W, U):
        return root(lambda z: F(z, W, U), z0, method="krylov", tol=1e-13).x

    def twin(W, U):
        return jax.lax.fori_loop(0, 200, lambda i, z: jnp.tanh(z @ W.T + x @ U.T), z0)

    def loss(layer, W, U):
        return jnp.sum(jnp.sin(layer(W, U)))

    @functools.partial(jax.jit, static_argnums=0)
    def derivatives(layer, W, U):  # one program per layer: one compile
        Ws = jnp.stack([W, 0.5 * W, -0.8 * W])
        return (jax.grad(functools.partial(loss, layer), argnums=(0, 1))(W, U),
                jax.jvp(layer, (W, U), (dW, jnp.zeros_like(U)))[1],
                jax.jacfwd(layer)(W, U),
                jax.vmap(lambda W: layer(W, U))(Ws),
                jax.vmap(jax.grad(lambda W: loss(layer, W, U)))(Ws))
    g, t, jac, batched, batched_g = derivatives(ours, W, U)
    g_twin, t_twin, _, batched_twin, batched_g_twin = derivatives(twin, W, U)
    for a, b in zip(g, g_twin):
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-11)
    np.testing.assert_allclose(t, t_twin, rtol=1e-9, atol=1e-11)
    np.testing.assert_allclose(jac, _dense_ift(F, ours(W, U), W, U), rtol=1e-9, atol=1e-11)
    for i in range(3):  # every batch element, against its own solve
        np.testing.assert_allclose(batched[i], batched_twin[i], rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(batched_g[i], batched_g_twin[i], rtol=1e-9, atol=1e-11)
    g_closure = jax.jit(jax.grad(functools.partial(loss, closure)))(W, U)
    np.testing.assert_allclose(g_closure, g[0], rtol=1e-10, atol=1e-12)
    diff = fd(lambda e: loss(ours, W + e * dW, U), 0.0)
    np.testing.assert_allclose(jnp.vdot(g[0], dW), diff, rtol=1e-6)


def test_closed_form_gradient_under_jit():
    """x^3 + a x = b elementwise: dx/db = 1/(3x^2 + a), dx/da = -x/(3x^2 + a)."""
    b = jnp.array([1.0, 2.0, 3.0])

    @jax.jit
    def solve(a, b):
        return root(lambda x: x ** 3 + a * x - b, jnp.ones(3), method="krylov",
                    tol=1e-13).x
    x = solve(2.0, b)
    np.testing.assert_allclose(x ** 3 + 2.0 * x, b, rtol=1e-14)
    d = 3 * x ** 2 + 2.0
    ga, gb = jax.grad(lambda a, b: jnp.sum(solve(a, b)), argnums=(0, 1))(2.0, b)
    np.testing.assert_allclose(gb, 1 / d, rtol=1e-12)
    np.testing.assert_allclose(ga, jnp.sum(-x / d), rtol=1e-12)


def test_bad_input():
    """Options the compiled loop cannot honour are named (and run SciPy's loop under
    "auto"); a residual of the wrong size is named."""
    F = lambda x, p: x - jnp.cos(p * x)  # noqa: E731
    for options, what in (
            ({"line_search": "wolfe"}, "line_search='wolfe'"),
            ({"tol_norm": np.linalg.norm}, "option tol_norm"),
            ({"disp": True}, "disp=True"),
            ({"maxiter": 2.5}, "maxiter=2.5"),
            ({"jac_options": {"rdiff": 1e-6}}, "jac_options key 'rdiff'"),
            ({"jac_options": {"outer_k": 3}}, "jac_options key 'outer_k'"),
            ({"jac_options": {"method": "bicgstab"}}, "method='bicgstab'"),
            ({"jac_options": {"inner_maxiter": 0}}, "inner_maxiter=0"),
            ({"foo": 1}, "option 'foo'")):
        with pytest.raises(ValueError, match="stepping='compiled'.*" + what.replace(
                "(", r"\(").replace(".", r"\.")):
            root(F, jnp.ones(3), (2.0,), method="krylov", stepping="compiled",
                 options=options)
    with pytest.raises(ValueError, match=r"root: fun\(x, \*args\) must return 3 values"):
        root(lambda x: x[:2], jnp.ones(3), method="krylov")
    sol = root(F, jnp.ones(3), (2.0,), method="krylov", options={"line_search": "wolfe"})
    np.testing.assert_allclose(sol.fun, 0.0, atol=1e-5)  # SciPy's own loop


@pytest.mark.slow  # several programs compiled
def test_failures():
    """SciPy's failure (maxiter reached, or `nit` iterations: SciPy then reports
    status 2 and no success) as a SolverError, or NaN values and gradients."""
    F = lambda x, p: x - jnp.cos(p * x)  # noqa: E731
    opts = {"maxiter": 1}
    with pytest.raises(SolverError, match=r"root\(method='krylov'\): The maximum number"):
        jax.block_until_ready(root(F, jnp.ones(3), (2.0,), method="krylov", options=opts).x)
    sol = root(F, jnp.ones(3), (2.0,), method="krylov", options=opts, on_failure="nan")
    ref = scipy.optimize.root(lambda x: np.asarray(F(jnp.asarray(x), 2.0)), np.ones(3),
                              method="krylov", options=opts)
    assert not ref.success and ref.status == 2 and ref.nit == 1
    assert not bool(sol.success) and int(sol.status) == 2 and int(sol.nit) == 1
    assert np.isnan(sol.x).all()
    g = jax.grad(lambda p: root(F, jnp.ones(3), (p,), method="krylov", options=opts,
                                on_failure="nan").x.sum())(2.0)
    assert np.isnan(g)
    opts = {"nit": 3}
    sol = root(F, jnp.ones(3), (2.0,), method="krylov", options=opts, on_failure="nan")
    ref = scipy.optimize.root(lambda x: np.asarray(F(jnp.asarray(x), 2.0)), np.ones(3),
                              method="krylov", options=opts)
    assert not ref.success and not bool(sol.success)
    assert (int(sol.status), int(sol.nit)) == (ref.status, ref.nit) == (2, 4)


@pytest.mark.slow  # ~15 s of compiles per size on the loaded machine; by default every
# compiled krylov test runs _gmres (Newton steps and tangent solves)
@pytest.mark.parametrize("n", [40, 5000])  # full-basis Gram-Schmidt; row by row (MGS)
def test_lean_gmres_is_gmres_by_its_definition(n):
    """_gmres (the compiled root's inner and tangent solver), one cycle, is GMRES by its
    definition (`_gmres_reference`), with either Gram-Schmidt, and restarted it meets
    its tolerance."""
    d = 1 + jax.random.uniform(jax.random.PRNGKey(0), (n,))

    def A(v):
        return d * v + 0.3 * jnp.roll(v, 1) - 0.2 * jnp.roll(v, -3)

    def A_np(v):
        return np.asarray(d) * v + 0.3 * np.roll(v, 1) - 0.2 * np.roll(v, -3)
    b = jax.random.normal(jax.random.PRNGKey(1), (n,))
    for tol, m in ((1e-3, 30), (1e-12, 5)):
        x = _cycle(A, b, tol, 0.0, m)
        ref = _gmres_reference(A_np, np.asarray(b), tol, m)
        np.testing.assert_allclose(x, ref, rtol=1e-10, atol=1e-13)
    x = _solve(A, b, 1e-12, 10, 100)
    assert jnp.linalg.norm(A(x) - b) <= 1e-12 * jnp.linalg.norm(b)


@pytest.mark.parametrize("scale", [1.0, 1e9])
def test_lean_gmres_reorthogonalizes_where_gram_schmidt_cancels(scale):
    """A non-normal system with condition number 1e8: classical Gram-Schmidt cancels
    and its basis loses orthogonality, so one pass alone leaves a residual of 1e-2 to
    4e-1. DGKS's second pass (taken when the norm drops below 1/sqrt(2) of itself, a
    test that is scale-free: hence the same system times 1e9) keeps full GMRES at 1e-9."""
    rng = np.random.default_rng(0)
    n = 20
    Q1, _ = np.linalg.qr(rng.standard_normal((n, n)))
    Q2, _ = np.linalg.qr(rng.standard_normal((n, n)))
    A = scale * (Q1 @ np.diag(np.logspace(0, -8, n)) @ Q2.T)
    b = rng.standard_normal(n)
    x = _cycle(lambda v: jnp.asarray(A) @ v, jnp.asarray(b), 0.0, 0.0, n)
    assert np.linalg.norm(b - A @ np.asarray(x)) <= 1e-7 * np.linalg.norm(b)


def test_lean_gmres_of_a_zero_right_hand_side_is_zero():
    """b = 0 (a zero tangent or cotangent reaches the compiled root's linear solves):
    GMRES returns 0, not the 0 / 0 of normalizing b."""
    A = jnp.eye(4) * 2.0
    x = _cycle(lambda v: A @ v, jnp.zeros(4), 0.0, 0.0, 4)
    np.testing.assert_array_equal(x, np.zeros(4))


def test_lean_gmres_takes_no_step_where_zero_already_meets_the_target():
    """An absolute tolerance above ||b||: x = 0 already meets it, so a cycle returns 0
    (as JAX's GMRES does), not b."""
    rng = np.random.default_rng(0)
    A = jnp.asarray(np.eye(5) * 3 + rng.standard_normal((5, 5)) * 0.3)
    b = jnp.asarray(rng.standard_normal(5))

    def mv(v):
        return A @ v
    x = _cycle(mv, b, 0.0, 10.0, 5)
    ref = jax.scipy.sparse.linalg.gmres(mv, b, atol=10.0, restart=5, maxiter=1,
                                        solve_method="incremental")[0]
    np.testing.assert_array_equal(x, np.zeros(5))
    np.testing.assert_array_equal(ref, np.zeros(5))


def test_compiled_krylov_fails_where_the_inner_solve_returns_zero():
    """jac_options inner_atol above ||F||: the inner GMRES returns a zero Newton step,
    where SciPy raises "Jacobian inversion yielded zero vector". The compiled loop stops
    with its bad-step status: a SolverError saying so, NaN under on_failure="nan"."""
    def F(x):
        return jnp.arctan(x) + 0.1 * x - 0.3

    opts = {"jac_options": {"inner_atol": 10.0}}
    with pytest.raises(ValueError, match="Jacobian inversion yielded zero vector"):
        scipy.optimize.root(lambda x: np.arctan(x) + 0.1 * x - 0.3, np.array([3.0, 1.0]),
                            method="krylov", options=opts)
    with pytest.raises(SolverError, match="zero or non-finite Newton step"):
        root(F, jnp.array([3.0, 1.0]), method="krylov", options=opts)
    sol = root(F, jnp.array([3.0, 1.0]), method="krylov", options=opts, on_failure="nan")
    assert not bool(sol.success) and int(sol.status) == 3
    assert np.isnan(np.asarray(sol.x)).all()


def test_lean_gmres_restarts_at_most_maxiter_times():
    """Restarted GMRES stops after `maxiter` cycles even when the tolerance is not met:
    with cycles of 2 steps on a 6-unknown system, one, two and three cycles are each
    the previous result plus one cycle on its residual, and none has converged yet.
    Otherwise it stops at the first cycle that meets tol ||b||."""
    rng = np.random.default_rng(3)
    A = jnp.asarray(np.eye(6) * 3 + rng.standard_normal((6, 6)))
    b = jnp.asarray(rng.standard_normal(6))

    def matvec(v):
        return A @ v
    x = jnp.zeros(6)
    for maxiter in (1, 2, 3):
        x = x + _cycle(matvec, b - A @ x, 0.0, 0.0, 2)
        got = _solve(matvec, b, 1e-12, 2, maxiter)
        np.testing.assert_allclose(got, x, rtol=1e-12, atol=1e-14)
        assert jnp.linalg.norm(b - A @ got) > 1e-6 * jnp.linalg.norm(b)
    # the tolerance is relative to ||b||: with b 1e4 times larger, 1e-2 stops at the first
    # cycle whose residual is below 1e-2 ||b|| = ~2e2, not below 1e-2
    big, x, cycles = 1e4 * b, jnp.zeros(6), 0
    while jnp.linalg.norm(big - A @ x) > 1e-2 * jnp.linalg.norm(big):
        x, cycles = x + _cycle(matvec, big - A @ x, 0.0, 0.0, 2), cycles + 1
    assert jnp.linalg.norm(big - A @ x) > 1e-2
    np.testing.assert_allclose(_solve(matvec, big, 1e-2, 2, 100), x, rtol=1e-12)


def test_armijo_backtracking_as_scipy():
    """arctan(x) + 0.1 x from |x0| >= 2.5: the full Newton step overshoots, so SciPy's
    Armijo search must backtrack (its quadratic and cubic trials) to converge, in
    SciPy's number of iterations; without a line search both loops run to maxiter =
    100 (n + 1) and fail."""
    def F(x):
        return jnp.arctan(x) + 0.1 * x
    x0 = np.array([3.0, -2.5, 4.0])
    for ls in ("armijo", None):
        ref = scipy.optimize.root(lambda x: np.arctan(x) + 0.1 * x, x0,  # F in NumPy
                                  method="krylov", options={"line_search": ls})
        sol = root(F, jnp.asarray(x0), method="krylov", options={"line_search": ls},
                   on_failure="nan")
        assert (bool(sol.success), int(sol.status), int(sol.nit)) == \
            (ref.success, ref.status, ref.nit), ls
        if ls:
            np.testing.assert_allclose(sol.x, 0.0, atol=1e-14)
        else:
            assert ref.nit == 400 and np.isnan(sol.x).all()


def test_armijo_trial_steps_are_scipys():
    """The step lengths the compiled Armijo search tries along the first Newton step
    are those of SciPy's scalar_search_armijo on the same phi(s) = ||F(x0 + s dx)||^2
    (arctan from 10: the full step, the quadratic trial, then two cubic ones, the
    second after SciPy's safeguard halves the step). One unknown: GMRES's one step is
    the exact Newton direction dx = -F(x0) / F'(x0)."""
    from scipy.optimize._linesearch import scalar_search_armijo
    points = []

    def F(x):
        jax.debug.callback(lambda x: points.append(float(x[0])), x, ordered=True)
        return jnp.arctan(x)
    x0 = 10.0
    sol = root(F, jnp.array([x0]), method="krylov", tol=1e-12)
    jax.effects_barrier()
    assert bool(sol.success)
    np.testing.assert_allclose(sol.x, 0.0, atol=1e-12)
    dx = -np.arctan(x0) * (1 + x0 ** 2)
    trials = []

    def phi(s):
        trials.append(s)
        return np.arctan(x0 + s * dx) ** 2
    scalar_search_armijo(phi, np.arctan(x0) ** 2, -np.arctan(x0) ** 2, amin=1e-2)
    assert len(trials) == 4  # 1, quadratic, cubic, cubic
    # points: x0 (the start), x0 (the linearization), then the trials
    assert points[:2] == [x0, x0]
    steps = (np.array(points[2:2 + len(trials)]) - x0) / dx
    np.testing.assert_allclose(steps, trials, rtol=1e-10)


@pytest.mark.slow  # ~7 s (two compiled Newton-Krylov loops)
def test_newton_step_is_one_gmres_cycle_of_scipys_default_size():
    """One Newton step on a linear residual A x - b (60 unknowns, condition 100) is one
    GMRES cycle from 0 of SciPy's default inner subspace: 30 Arnoldi steps for LGMRES
    (its inner_m; SciPy's first cycle has no outer vectors yet), 20 for GMRES (its
    restart, jac_options' inner_maxiter). Neither cycle converges here, so the step is
    exactly the cycle's iterate: JAX's incremental GMRES with that restart, one cycle."""
    n = 60
    A = jnp.diag(jnp.linspace(1.0, 100.0, n)) + 0.1 * jax.random.normal(
        jax.random.PRNGKey(0), (n, n)) / np.sqrt(n)
    b = jax.random.normal(jax.random.PRNGKey(1), (n,))
    for method, m in (("lgmres", 30), ("gmres", 20)):
        x, st = _newton_krylov.solve(lambda x: A @ x - b, jnp.zeros(n), maxiter=1,
                                     jac_options={"method": method, "inner_rtol": 1e-14})
        ref = jax.scipy.sparse.linalg.gmres(lambda v: A @ v, b, tol=1e-14, atol=0.0,
                                            restart=m, maxiter=1,
                                            solve_method="incremental")[0]
        assert int(st.status) == 2 and int(st.nit) == 1
        assert jnp.linalg.norm(A @ x - b) > 1e-6 * jnp.linalg.norm(b)  # not converged
        np.testing.assert_allclose(x, ref, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("line_search", [None, "armijo"])
def test_compiled_krylov_nfev_counts_every_residual_evaluation(line_search):
    """`nfev` of the compiled Newton-Krylov is the number of times the loop ran F:
    counted here by a callback inside F, with and without the line search (whose
    trials and reuse of the last trial's F change the count). One more call computes
    the result's `fun` at x*."""
    calls = []

    def F(x):
        jax.debug.callback(lambda: calls.append(1), ordered=True)
        return jnp.arctan(x) + 0.1 * x - 0.3

    sol = root(F, jnp.array([3.0, 1.0, -2.5]), method="krylov",
               options={"line_search": line_search})
    jax.effects_barrier()
    assert bool(sol.success)
    assert int(sol.nfev) + 1 == len(calls) > 4, (int(sol.nfev), len(calls))


# ---- an independent reference for the whole loop: SciPy's own nonlin_solve, its
# Jacobian object solving with exact products and a NumPy GMRES ----

def _gmres_reference(A, b: np.ndarray, tol: float, m: int) -> np.ndarray:
    """GMRES from 0 by its definition: the minimizer of ||b - A x|| over the Krylov
    space of the first dimension k <= m whose minimum is at most tol ||b|| (dense
    least squares, Arnoldi with two Gram-Schmidt passes). `A` is a matrix or a
    function computing A v."""
    matvec = A if callable(A) else A.__matmul__
    b_norm = np.linalg.norm(b)
    if b_norm <= tol * b_norm:  # x = 0 already meets it (b = 0, or tol >= 1)
        return np.zeros_like(b)
    V, H = np.zeros((m + 1, b.size)), np.zeros((m + 1, m))
    V[0] = b / b_norm
    for k in range(m):
        w = matvec(V[k])
        for _ in range(2):
            h = V[:k + 1] @ w
            w, H[:k + 1, k] = w - h @ V[:k + 1], H[:k + 1, k] + h
        H[k + 1, k] = np.linalg.norm(w)
        V[k + 1] = w / H[k + 1, k] if H[k + 1, k] > 0 else 0.0
        e = np.zeros(k + 2)
        e[0] = b_norm
        y = np.linalg.lstsq(H[:k + 2, :k + 1], e, rcond=None)[0]
        if np.linalg.norm(e - H[:k + 2, :k + 1] @ y) <= tol * b_norm:
            break
    return y @ V[:k + 1]


def _nonlin_solve_exact(F, jacobian, x0, nit, line_search, m=30):
    """SciPy's `nonlin_solve` loop itself (forcing terms, Armijo search, termination
    test) for `nit` iterations, with a Jacobian object whose solves use the exact
    Jacobian and `_gmres_reference` (the inner tolerance floored at sqrt(eps), as the
    compiled loop documents). Returns the iterate and the inner tolerances used."""
    from scipy.optimize import _nonlin

    tols = []

    class Exact(_nonlin.Jacobian):
        def setup(self, x, Fx, func):
            self.x = x

        def update(self, x, Fx):
            self.x = x

        def solve(self, rhs, tol=0):
            tols.append(max(tol, _newton_krylov._INNER_RTOL_MIN))
            return _gmres_reference(jacobian(self.x), rhs, tols[-1], m)

    x = _nonlin.nonlin_solve(F, x0, Exact(), iter=nit, line_search=line_search,
                             f_tol=1e-300, raise_exception=False)
    return x, tols


def _tanh_cubed_system(n=40, seed=0, c=1.0):
    """A x + c tanh(x)^3 - b, A = I + a non-normal perturbation: GMRES meets a tolerance
    of 1e-3 in a few steps and 1e-8 in a dozen, so the inner tolerances decide the
    iterates."""
    rng = np.random.default_rng(seed)
    A = np.eye(n) * 2 + rng.standard_normal((n, n)) * 0.3 / np.sqrt(n)
    b = rng.standard_normal(n)

    def F_np(x, scale):
        return scale * (A @ x + c * np.tanh(x) ** 3 - b)

    def jac_np(x, scale):
        t = np.tanh(x)
        return scale * (A + np.diag(3 * c * t ** 2 * (1 - t ** 2)))

    def F(x, scale):
        return scale * (jnp.asarray(A) @ x + c * jnp.tanh(x) ** 3 - jnp.asarray(b))
    return F_np, jac_np, F


@functools.partial(jax.jit, static_argnums=3)
def _dense_cycle(A, b, tol, m):
    return _gmres.cycle(lambda v: A @ v, b, tol, 0.0, m)


def test_lean_gmres_cycle_is_gmres_by_its_definition_at_any_scale():
    """One cycle stops at the first Krylov dimension whose least-squares residual meets
    tol ||b||, and returns that minimizer, whatever the scale of A. (It once added the
    residual's own component g_k v_k, in b's units: harmless where ||A|| ~ 1, a step
    off by the whole residual times ||A|| elsewhere. JAX's incremental GMRES with
    maxiter=1 still does, so it is no reference here.)"""
    _, jac_np, _ = _tanh_cubed_system()
    A0 = jac_np(np.zeros(40), 1.0)
    b = np.random.default_rng(1).standard_normal(40)
    for scale in (1.0, 1e3, 1e-3):
        A = scale * A0
        for tol, m in ((1e-3, 30), (1e-8, 30), (1e-12, 5)):
            x = _dense_cycle(jnp.asarray(A), jnp.asarray(b), tol, m)
            np.testing.assert_allclose(x, _gmres_reference(A, b, tol, m), rtol=1e-10,
                                       atol=1e-12 / scale)
            if m == 30:
                assert np.linalg.norm(A @ np.asarray(x) - b) <= tol * np.linalg.norm(b)


def test_compiled_krylov_converges_as_scipy_on_a_scaled_residual():
    """A residual in large units (times 1e2, 1e4) has a large Jacobian: SciPy converges
    in the same 5 iterations at any scale, and so must the compiled loop (it took 329
    iterations at 1e2, and failed at 1e4, while GMRES added its residual to the step)."""
    F_np, _, F = _tanh_cubed_system()
    for scale in (1.0, 1e2, 1e4):
        ref = scipy.optimize.root(F_np, np.zeros(40), (scale,), method="krylov")
        assert ref.success, ref.message
        sol = root(F, jnp.zeros(40), (scale,), method="krylov", on_failure="nan")
        assert (bool(sol.success), int(sol.nit)) == (True, ref.nit), scale
        np.testing.assert_allclose(sol.x, ref.x, atol=1e-9)


def _wiggly(a, b, g, np_or_jnp):
    """arctan(x) + a x + b sin(g x) / g: phi(s) = F(x + s dx)^2 oscillates along the
    step, so Armijo's cubic trials land anywhere, and may all fail."""
    def F(x):
        return np_or_jnp.arctan(x) + a * x + b * np_or_jnp.sin(g * x) / g
    return F


# (residual in NumPy, its Jacobian, in JAX, x0, iterations compared, line searches)
_F3, _J3, _F3_jax = _tanh_cubed_system()
_L, _JL, _L_jax = _tanh_cubed_system(c=0.0)
_W = (0.43141985850216014, 1.4277572068955775, 3.402210535031755)
_LOOPS = {
    # residual in large units (times 1e3): the inner tolerance is eta itself, not
    # eta ||F||, and it decides where GMRES stops
    "tanh^3 x 1e3": (lambda x: _F3(x, 1e3), lambda x: _J3(x, 1e3),
                     lambda x: _F3_jax(x, 1e3), np.full(40, 0.5), 5, (None, "armijo")),
    # linear: each step reduces ||F|| by more than eta, so from the second step the
    # forcing term is SciPy's safeguard gamma eta^2, not gamma (||F_k|| / ||F_k-1||)^2
    "linear x 1e3": (lambda x: _L(x, 1e3), lambda x: _JL(x, 1e3),
                     lambda x: _L_jax(x, 1e3), np.full(40, 0.5), 3, (None,)),
    # the first step's cubic trial 0.0225 lies in the upper half of the step 0.042 it
    # follows, and fails: SciPy's safeguard halves that step before the next cubic
    "wiggly": (_wiggly(*_W, np), lambda x: np.diag(1 / (1 + x ** 2) + _W[0] + _W[1] * np.cos(
        _W[2] * x)), _wiggly(*_W, jnp), np.array([-23.38484093181956]), 3, ("armijo",)),
    # from 1e3 no trial of at least amin = 1e-2 decreases ||F||: the full step is taken
    # and F evaluated there (not reused from the last trial)
    "arctan from 1e3": (np.arctan, lambda x: np.diag(1 / (1 + x ** 2)), jnp.arctan,
                        np.array([1e3]), 2, ("armijo",)),
}


@functools.partial(jax.jit, static_argnums=(0, 3))
def _compiled_krylov(F, x0, nit, line_search):
    # nit is traced: the loop's only use of it is a comparison (one compile for all)
    return _newton_krylov.solve(F, x0, nit=nit, fatol=1e-300, line_search=line_search)[0]


@pytest.mark.parametrize("problem", list(_LOOPS))
def test_compiled_krylov_iterates_are_scipys_loop_with_exact_products(problem):
    """After each of the first iterations, the compiled loop's iterate equals that of
    SciPy's own nonlin_solve given the exact Jacobian and GMRES by its definition: the
    same forcing terms (the inner tolerances), the same line-search trials and steps,
    to rounding."""
    F_np, jac_np, F, x0, iterations, searches = _LOOPS[problem]
    for line_search in searches:
        for nit in range(1, iterations + 1):
            ref, tols = _nonlin_solve_exact(F_np, jac_np, x0, nit, line_search)
            x = _compiled_krylov(F, jnp.asarray(x0), nit, line_search)
            np.testing.assert_allclose(x, ref, rtol=1e-12, atol=1e-14,
                                       err_msg=f"{line_search} {nit}")
    if problem == "tanh^3 x 1e3":  # four different forcing terms, two at the floor
        assert len(set(np.round(np.log10(tols), 3))) >= 4, tols
