"""solve_ivp's compiled derivatives for the implicit methods (BDF, Radau, LSODA; `_stiff`).

Which claim each test checks:
* exact for the discrete solution: with Radau the gradient is the derivative of the
  converged Radau IIA solution on SciPy's steps -- checked against JAX autodiff of a
  jnp twin of that chain (a linear problem, where the step map does not depend on the
  state the derivative is taken at), to ~1e-12;
* within tolerance: with BDF and LSODA (Radau's derivative on their steps) and for the
  ODE itself -- checked against closed forms and float64 finite differences.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.integrate
from conftest import fd

from jaxbridge.scipy.integrate import _stiff, solve_ivp
from jaxbridge.scipy.integrate._stiff import A_RADAU, C_RADAU, P_RADAU

STIFF = ["BDF", "Radau", "LSODA"]


def linear(t, y, k):
    """A stiff linear system (eigenvalues -1000 k0 and -k2) with a closed form."""
    M = jnp.array([[-1000.0, 0.0], [0.0, 0.0]]) * k[0] + jnp.array([[0.0, 1.0], [0.0, 0.0]]) \
        * k[1] - jnp.array([[0.0, 0.0], [0.0, 1.0]]) * k[2]
    return M @ y


def linear_exact(y0, k, ts):
    M = jnp.array([[-1000.0, 0.0], [0.0, 0.0]]) * k[0] + jnp.array([[0.0, 1.0], [0.0, 0.0]]) \
        * k[1] - jnp.array([[0.0, 0.0], [0.0, 1.0]]) * k[2]
    return jnp.stack([jax.scipy.linalg.expm(M * t) @ y0 for t in ts])


K = jnp.array([1.0, 2.0, 0.5])
Y0 = jnp.array([1.0, 1.0])
TE = jnp.array([0.0, 0.001, 0.3, 1.0, 2.0])
W = jnp.arange(1.0, 11.0).reshape(5, 2)


def lin_loss(y0, k, method, rtol=1e-9, **kw):
    sol = solve_ivp(linear, (0.0, 2.0), y0, method, TE, args=(k,), rtol=rtol, atol=1e-12,
                    sensitivity="adjoint", **kw)
    return jnp.sum(jnp.sin(sol.y.T) * W)


def radau_twin(y0, k, ts, te):
    """Radau IIA on the steps `ts` in plain jnp (one Newton iteration, exact for a
    linear problem; differentiated by JAX), with Radau's dense output at `te`."""
    A, C, Pm = (jnp.asarray(x) for x in (A_RADAU, C_RADAU, P_RADAU))

    def step(carry, tt):
        y, out = carry
        t, t_next, first = tt
        h = t_next - t

        def G(v):
            z = v.reshape(3, 2)
            return (z - h * A @ jax.vmap(lambda c, u: linear(t + c * h, u, k))(C, y[None, :] + z)
                    ).ravel()
        v0 = jnp.zeros(6)
        z = (v0 - jnp.linalg.solve(jax.jacfwd(G)(v0), G(v0))).reshape(3, 2)
        covers = ((te > t) | first) & (te <= t_next)
        x = (te - t) / h
        dense = y[None, :] + (x[:, None] ** jnp.arange(1.0, 4.0)[None, :]) @ Pm.T @ z
        out = jnp.where(covers[:, None] & jnp.isnan(out), dense, out)
        return (y + z[-1], out), None

    first = jnp.arange(len(ts) - 1) == 0
    out0 = jnp.full((te.shape[0], 2), jnp.nan)
    return jax.lax.scan(step, (y0, out0), (ts[:-1], ts[1:], first))[0][1]


@pytest.mark.slow  # (several JAX compilations: 15-40 s on the shared 2 cores)
def test_radau_gradient_is_exact_for_its_discrete_solution():
    ref = scipy.integrate.solve_ivp(lambda t, y: np.asarray(linear(t, jnp.asarray(y), K)),
                                    (0.0, 2.0), np.asarray(Y0), "Radau", rtol=1e-5, atol=1e-12,
                                    jac=np.asarray(jax.jacfwd(linear, 1)(0.0, Y0, K)))
    assert ref.success
    ts = jnp.asarray(ref.t)

    def twin(y0, k):  # (a loss linear in y: its cotangents do not depend on the values)
        return jnp.sum(radau_twin(y0, k, ts, TE) * W)

    ours = jax.grad(lambda y0, k: jnp.sum(solve_ivp(
        linear, (0.0, 2.0), y0, "Radau", TE, args=(k,), rtol=1e-5, atol=1e-12,
        sensitivity="adjoint").y.T * W), argnums=(0, 1))(Y0, K)
    want = jax.jit(jax.grad(twin, argnums=(0, 1)))(Y0, K)
    np.testing.assert_allclose(ours[0], want[0], rtol=1e-12)
    np.testing.assert_allclose(ours[1], want[1], rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("method", [pytest.param("BDF", marks=pytest.mark.slow),
                                    pytest.param("Radau", marks=pytest.mark.slow), "LSODA"])
def test_linear_stiff_gradient_matches_the_closed_form(method):
    def exact(y0, k):
        return jnp.sum(jnp.sin(linear_exact(y0, k, TE)) * W)

    ours = jax.jit(jax.grad(lin_loss, argnums=(0, 1)), static_argnums=2)(Y0, K, method)
    want = jax.grad(exact, argnums=(0, 1))(Y0, K)
    np.testing.assert_allclose(ours[0], want[0], rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(ours[1], want[1], rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("method", STIFF)
def test_float32_state_gets_finite_derivatives_in_both_modes(method):
    # A float32 state computes its right-hand side in float32: the stages' Newton must
    # converge to float32's precision, not float64's (it once gave NaN in both modes).
    def ys(k, y0):
        sol = solve_ivp(lambda t, y, k: -k * y + 0.5, (0.0, 2.0), y0, method=method,
                        t_eval=jnp.array([0.5, 1.0, 2.0], y0.dtype), args=(k,), rtol=1e-6,
                        atol=1e-9)
        return sol.y

    def exact(k, y0):  # y' = -k y + c
        t = jnp.array([[0.5, 1.0, 2.0]])
        return (y0[:, None] - 0.5 / k[:, None]) * jnp.exp(-k[:, None] * t) + 0.5 / k[:, None]

    k, y0 = jnp.array([0.4, 2.0], jnp.float32), jnp.array([1.0, 2.0], jnp.float32)
    dk = jnp.ones(2, jnp.float32)
    tangent = jax.jvp(lambda k: ys(k, y0), (k,), (dk,))[1]
    want = jax.jvp(lambda k: exact(k, y0.astype(float)), (k.astype(float),),
                   (dk.astype(float),))[1]
    np.testing.assert_allclose(tangent, want, rtol=1e-4, atol=1e-5)
    grad = jax.grad(lambda k: jnp.sum(ys(k, y0) ** 2))(k)
    want = jax.grad(lambda k: jnp.sum(exact(k, y0.astype(float)) ** 2))(k.astype(float))
    np.testing.assert_allclose(grad, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("method", [pytest.param("BDF", marks=pytest.mark.slow), "Radau",
                                    pytest.param("LSODA", marks=pytest.mark.slow)])
def test_backward_in_time_derivatives_match_the_closed_form_in_both_modes(method):
    # From t = 2 back to 0: the outputs' dense weights run in the reverse direction
    # (t_eval decreasing, one output between steps, one at each end).
    te = jnp.array([2.0, 1.3, 0.45, 0.0])

    def ys(k, y0):
        return solve_ivp(lambda t, y, k: -k * y + 0.5, (2.0, 0.0), y0, method=method,
                         t_eval=te, args=(k,), rtol=1e-10, atol=1e-12).y

    def exact(k, y0):  # y' = -k y + c, y(2) = y0
        return (y0[:, None] - 0.5 / k[:, None]) * jnp.exp(-k[:, None] * (te[None, :] - 2.0)) \
            + 0.5 / k[:, None]

    k, y0, dk = jnp.array([0.4, 2.0]), jnp.array([1.0, 2.0]), jnp.array([1.0, -0.5])
    np.testing.assert_allclose(ys(k, y0), exact(k, y0), rtol=1e-7)
    tangent = jax.jvp(lambda k: ys(k, y0), (k,), (dk,))[1]
    np.testing.assert_allclose(tangent, jax.jvp(lambda k: exact(k, y0), (k,), (dk,))[1],
                               rtol=1e-6, atol=1e-9)
    w = jnp.arange(1.0, 9.0).reshape(2, 4)
    grad = jax.grad(lambda k, y0: jnp.sum(w * ys(k, y0) ** 2), argnums=(0, 1))(k, y0)
    want = jax.grad(lambda k, y0: jnp.sum(w * exact(k, y0) ** 2), argnums=(0, 1))(k, y0)
    np.testing.assert_allclose(grad[0], want[0], rtol=1e-6)
    np.testing.assert_allclose(grad[1], want[1], rtol=1e-6)


def test_time_dependent_jacobian_derivatives_match_the_closed_form_in_both_modes():
    # The stages sit at t + c h: only a right-hand side whose Jacobian depends on t tells
    # the stage times apart (the other default problems are autonomous, or t enters
    # additively). y' = -k (1 + t) y: y(t) = y0 exp(-k ((t + t^2/2) - (t0 + t0^2/2))).
    # Three states: an off-by-one in the tangent's layout can hide behind an even n.
    te = jnp.array([0.5, 1.0, 2.0])

    def ys(k, y0, t0):
        return solve_ivp(lambda t, y, k: -k * (1.0 + t) * y, (t0, 2.0), y0, "Radau", te,
                         args=(k,), rtol=1e-10, atol=1e-12).y

    def exact(k, y0, t0):
        s = te + te ** 2 / 2 - (t0 + t0 ** 2 / 2)
        return y0[:, None] * jnp.exp(-k[:, None] * s[None, :])

    primals = (jnp.array([0.4, 2.0, 1.0]), jnp.array([1.0, 2.0, -1.0]), jnp.array(0.1))
    tangents = (jnp.array([1.0, -0.5, 2.0]), jnp.array([0.3, 1.0, -2.0]), jnp.array(0.7))
    np.testing.assert_allclose(jax.jvp(ys, primals, tangents)[1],
                               jax.jvp(exact, primals, tangents)[1], rtol=1e-6, atol=1e-9)
    grads = jax.grad(lambda *a: jnp.sum(jnp.sin(ys(*a))), argnums=(0, 1, 2))(*primals)
    want = jax.grad(lambda *a: jnp.sum(jnp.sin(exact(*a))), argnums=(0, 1, 2))(*primals)
    for g, w in zip(grads, want):
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-9)


def test_small_nonlinear_state_gets_exact_derivatives_in_both_modes():
    # Newton's stopping rule on the stages scales with the state's size: a state of
    # size 1e-3 (a nonlinear one: Newton takes more than one iteration) must still get
    # converged stages, not NaN. y' = -k y^2: y(t) = y0 / (1 + k y0 t).
    te = jnp.array([0.5, 2.0])

    def ys(k, y0):
        return solve_ivp(lambda t, y, k: -k * y ** 2, (0.0, 2.0), y0, "Radau", te,
                         args=(k,), rtol=1e-8, atol=1e-15).y

    def exact(k, y0):
        return y0[:, None] / (1.0 + (k * y0)[:, None] * te[None, :])

    k, y0, dk = jnp.array([100.0, 300.0]), jnp.array([1e-3, 2e-3]), jnp.array([1.0, -2.0])
    np.testing.assert_allclose(jax.jvp(lambda k: ys(k, y0), (k,), (dk,))[1],
                               jax.jvp(lambda k: exact(k, y0), (k,), (dk,))[1],
                               rtol=1e-6, atol=1e-15)
    np.testing.assert_allclose(jax.grad(lambda y0: jnp.sum(ys(k, y0)))(y0),
                               jax.grad(lambda y0: jnp.sum(exact(k, y0)))(y0),
                               rtol=1e-6, atol=1e-12)


def test_newton_starts_from_the_recorded_state_on_a_saturating_field():
    # y' = -a tanh(b (y - sin t)): far from sin t the field is flat, and Newton on a step's
    # stages started from zero stages overshoots (it needs more than the 12 iterations
    # allowed on about half of these steps at rtol=1e-2); started from the recorded end
    # state it converges in a few. The reverse sweep must start there too: its Jacobian
    # is finite, equals forward mode's (the derivative of the same Radau chain) to
    # rounding, and a tight solve's central differences (along one direction) to the
    # solver's tolerance.
    te = jnp.array([1.0, 4.0, 10.0])

    def field(t, y, p):
        return -p[0] * jnp.tanh(p[1] * (y - jnp.sin(t)))

    def ys(p, rtol=1e-2, atol=1e-8):
        return solve_ivp(field, (0.0, 10.0), jnp.array([3.0, -2.0]), "Radau", te, args=(p,),
                         rtol=rtol, atol=atol).y

    p = jnp.array([20.0, 5.0])
    rev = jax.jacrev(ys)(p)
    np.testing.assert_allclose(rev, jax.jacfwd(ys)(p), rtol=1e-10, atol=1e-16)
    v, h = jnp.array([1.0, -0.4]), 1e-4
    ref = (ys(p + h * v, 1e-11, 1e-12) - ys(p - h * v, 1e-11, 1e-12)) / (2 * h)
    np.testing.assert_allclose(rev @ v, ref, rtol=1e-2)


@pytest.mark.parametrize("cap, n", [(1, 2), (2, 3)])  # the state size differs per cap:
def test_newton_on_the_stages_stops_at_its_cap_of_iterations(monkeypatch, cap, n):  # no
    # JAX cache shares a trace made under the other cap. Relaxation y' = k (c - y) is
    # affine, so Newton on a step's stage equations takes two iterations: the one that
    # solves them, and the one whose correction is at rounding and stops the loop. With
    # the cap at 1 every step is unconverged and both modes give NaN (never the
    # half-converged derivative); with 2 they give the closed form. This pins what the
    # cap counts: iterations from zero, at most NEWTON_MAX_ITER of them.
    monkeypatch.setattr(_stiff, "NEWTON_MAX_ITER", cap)
    te, c = jnp.array([0.5, 1.0]), jnp.linspace(-1.0, 1.0, n)
    y0 = jnp.full(n, 2.0)

    def ys(k):
        return solve_ivp(lambda t, y, k: k * (c - y), (0.0, 1.0), y0, "Radau", te,
                         args=(k,), rtol=1e-6, atol=1e-9).y

    k = jnp.linspace(1.0, 3.0, n)
    fwd, rev = jax.jacfwd(ys)(k), jax.jacrev(ys)(k)
    if cap == 1:
        assert np.isnan(fwd).all() and np.isnan(rev).all()
        return
    exact = jax.jacfwd(lambda k: c[:, None] + (y0 - c)[:, None]
                       * jnp.exp(-k[:, None] * te[None, :]))(k)
    np.testing.assert_allclose(fwd, exact, rtol=1e-5, atol=1e-9)
    np.testing.assert_allclose(rev, fwd, rtol=1e-10, atol=1e-15)


def test_an_output_at_a_step_time_is_counted_once():
    # first_step=2**-10 makes SciPy's first accepted step end exactly at the output time
    # 2**-10 (the step is accepted: its error estimate is far below rtol). That
    # output belongs to the step that ends there, not also to the one that starts there.
    # And outputs at t0 only (no step at all): y = y0, dy/dy0 = I, dy/dk = 0.
    def ys(k, y0, te):
        return solve_ivp(lambda t, y, k: -k * y, (0.0, 1.0), y0, "Radau", te, args=(k,),
                         rtol=1e-6, atol=1e-9, first_step=2.0 ** -10).y

    k, y0 = jnp.array([0.5, 2.0, 1.0]), jnp.array([1.0, -2.0, 0.5])
    te = jnp.array([2.0 ** -10, 1.0])
    exact = lambda k, y0: y0[:, None] * jnp.exp(-k[:, None] * te[None, :])  # noqa: E731
    w = jnp.array([[1.0, 2.0], [-1.0, 0.5], [3.0, 1.0]])
    grads = jax.grad(lambda k, y0: jnp.sum(ys(k, y0, te) * w), argnums=(0, 1))(k, y0)
    want = jax.grad(lambda k, y0: jnp.sum(exact(k, y0) * w), argnums=(0, 1))(k, y0)
    for g, ref in zip(grads, want):
        np.testing.assert_allclose(g, ref, rtol=1e-4, atol=1e-6)
    at_t0 = jnp.array([0.0, 0.0])
    g_k, g_y0 = jax.grad(lambda k, y0: jnp.sum(ys(k, y0, at_t0) * w), argnums=(0, 1))(k, y0)
    np.testing.assert_allclose(g_y0, jnp.sum(w, axis=1), rtol=1e-14)
    np.testing.assert_allclose(g_k, 0.0, atol=0)


def van_der_pol(t, y, mu):
    return jnp.stack([y[1], mu * ((1 - y[0] ** 2) * y[1]) - y[0]])


@pytest.mark.slow  # (several JAX compilations: 15-40 s on the shared 2 cores)
@pytest.mark.parametrize("method", STIFF)
def test_van_der_pol_mu_100_gradient_vs_finite_differences(method):
    te = jnp.linspace(10.0, 150.0, 5)

    def L(theta, method=method, rtol=1e-8, sensitivity="adjoint"):
        y0 = jnp.stack([2.0 + theta[1], 0.0])
        sol = solve_ivp(van_der_pol, (0.0, 150.0), y0, method, te, args=(theta[0],),
                        rtol=rtol, atol=1e-10, sensitivity=sensitivity)
        return jnp.sum(sol.y[0] * jnp.arange(1.0, 6.0))

    theta = jnp.array([100.0, 0.0])
    g = jax.jit(jax.grad(L))(theta)
    ref = fd(lambda th: L(th, "Radau", 1e-11, "forward"), theta, 1e-4)
    np.testing.assert_allclose(g, ref, rtol=2e-4, atol=1e-4)


@pytest.mark.slow  # (several JAX compilations: 15-40 s on the shared 2 cores)
@pytest.mark.parametrize("method", ["BDF", "Radau"])
def test_forward_and_reverse_mode_are_exact_transposes(method):
    f = lambda k: solve_ivp(linear, (0.0, 2.0), Y0, method, TE, args=(k,),  # noqa: E731
                            rtol=1e-6, atol=1e-10, sensitivity="adjoint").y
    np.testing.assert_allclose(jax.jacfwd(f)(K), jax.jacrev(f)(K), rtol=1e-11, atol=1e-14)
    # t0 and t_eval as well
    g = lambda t0, te: solve_ivp(linear, (t0, 2.0), Y0, method, te, args=(K,),  # noqa: E731
                                 rtol=1e-6, atol=1e-10, sensitivity="adjoint").y
    for argnum in (0, 1):
        np.testing.assert_allclose(jax.jacfwd(g, argnum)(0.0, TE[1:]),
                                   jax.jacrev(g, argnum)(0.0, TE[1:]), rtol=1e-10, atol=1e-13)


@pytest.mark.slow  # (several JAX compilations: 15-40 s on the shared 2 cores)
def test_vmap_of_the_gradient_is_one_batched_backward_loop():
    ks = jnp.stack([K, K * 1.1, K * 0.9])
    grad = jax.grad(lambda k: lin_loss(Y0, k, "LSODA"))
    batched = jax.jit(jax.vmap(grad))(ks)
    for i in range(3):
        np.testing.assert_allclose(batched[i], grad(ks[i]), rtol=1e-12)
    # the compiled backward loop runs on the whole batch's recorded steps at once
    text = str(jax.make_jaxpr(jax.vmap(grad))(ks))
    assert "f64[3,16385,2]" in text  # (batch, steps + 1, n): the batched record


@pytest.mark.slow  # (3-8 s on the shared 2 cores)
def test_closed_over_parameters_and_pytree_args():
    def L(k):
        sol = solve_ivp(lambda t, y, d: linear(t, y, jnp.stack([d["a"], k[1], k[2]])),
                        (0.0, 2.0), Y0, "BDF", TE, args=({"a": k[0]},), rtol=1e-9, atol=1e-12,
                        sensitivity="adjoint")
        return jnp.sum(jnp.sin(sol.y.T) * W)

    np.testing.assert_allclose(jax.jit(jax.grad(L))(K), jax.grad(
        lambda k: lin_loss(Y0, k, "BDF"))(K), rtol=1e-12)


def test_too_small_checkpoint_budget_is_a_clear_error():
    with pytest.raises(ValueError, match=r"checkpoints >= \d+"):
        jax.grad(lambda k: lin_loss(Y0, k, "BDF", checkpoints=3))(K)
    # the value alone records nothing, so any budget is fine
    assert np.isfinite(float(lin_loss(Y0, K, "BDF", checkpoints=3)))


def test_status_and_counts_under_differentiation():
    # Under jvp the solve's own outputs come from the derivative rule: the same nfev as
    # the plain solve; status -2 (and NaN states) when the steps overflow the record.
    def out(k, **kw):
        sol = solve_ivp(linear, (0.0, 2.0), Y0, "BDF", TE, args=(k,), rtol=1e-9, atol=1e-12,
                        sensitivity="adjoint", **kw)
        return sol.y, sol.status, sol.nfev

    plain = out(K)
    (y, status, nfev), _ = jax.jvp(out, (K,), (K,))
    assert int(status) == 0 and int(nfev) == int(plain[2]) > 0
    (y, status, _), _ = jax.jvp(lambda k: out(k, checkpoints=3, on_failure="nan"), (K,), (K,))
    assert int(status) == -2 and np.isnan(y).all()


def test_failed_solve_gives_nan_gradients_with_the_nan_policy():
    def L(k):
        sol = solve_ivp(lambda t, y: k * y ** 2, (0.0, 2.0), jnp.ones(1), "BDF", [2.0],
                        sensitivity="adjoint", on_failure="nan")
        return jnp.sum(sol.y)

    assert np.isnan(float(jax.grad(L)(1.0)))


@pytest.mark.parametrize("method", ["Radau", "BDF", "LSODA"])
def test_derivatives_near_an_equilibrium_at_zero_are_finite(method):
    # y' = 1 - exp(y) settles at y = 0: there the state is ~1e-9, but the right-hand side
    # rounds terms of size one, so Newton's corrections on the stages stall near h eps.
    # A purely relative convergence test called every such step unconverged, and both
    # modes returned NaN (found by mutation testing). Closed form: with u = exp(-y),
    # u' = 1 - u, so dy(t)/dy0 = exp(-y0 - t + y(t)).
    te = jnp.array([2.0, 20.0])

    def ys(y0):
        return solve_ivp(lambda t, y: 1 - jnp.exp(y), (0.0, 20.0), y0, method, te,
                         rtol=1e-6, atol=1e-9).y[0]

    y0 = jnp.array([5.0])
    exact_y = -jnp.log(1 + (jnp.exp(-5.0) - 1) * jnp.exp(-te))
    exact = jnp.exp(-5.0 - te + exact_y)                       # (1.0535e-3, 1.3888e-11)
    rev, fwd = jax.jacrev(ys)(y0)[:, 0], jax.jacfwd(ys)(y0)[:, 0]
    np.testing.assert_allclose(rev, fwd, rtol=1e-9, atol=1e-20)
    np.testing.assert_allclose(rev, exact, rtol=1e-4, atol=1e-13)  # atol: below the solve's
