"""solve_ivp with events, dense_output=True and t_eval=None (issue 26): SciPy's values,
implicit-function-theorem gradients of event times, dense output as a JAX function."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.integrate
from conftest import fd

from jaxbridge.scipy import SolverError
from jaxbridge.scipy.integrate import OdeSolution, solve_ivp

METHODS = ["RK23", "RK45", "DOP853", "Radau", "BDF", "LSODA"]
# RK23 takes thousands of steps at the tight tolerances used here: in the slow run
METHODS_FAST = [pytest.param("RK23", marks=pytest.mark.slow), *METHODS[1:]]
# ... and RK45 too in the gradient tests (12-14 s each on 2 shared cores)
METHODS_GRAD = [pytest.param(m, marks=pytest.mark.slow) if m in ("RK23", "RK45") else m
                for m in METHODS]
IMPLICIT = ("Radau", "BDF", "LSODA")
TOL = dict(rtol=1e-10, atol=1e-12)


def cannon(t, s, cd):
    x, y, vx, vy = s
    v = jnp.sqrt(vx ** 2 + vy ** 2)
    return jnp.stack([vx, vy, -cd * v * vx, -9.81 - cd * v * vy])


def ground(t, s, cd):
    return s[1]


ground.terminal = True
ground.direction = -1


def apex(t, s, cd):
    return s[3]


S0 = jnp.array([0.0, 0.0, 10.0, 10.0])


def scipy_reference(fun, t_span, y0, method, args, events=(), **kw):
    """SciPy's own solve of the same JAX functions (jitted, as the host side runs them,
    so the two do the same arithmetic), with the same exact Jacobian."""
    f = jax.jit(lambda t, y: fun(t, y, *args))
    extra = {}
    if method in IMPLICIT:
        j = jax.jit(jax.jacfwd(lambda t, y: fun(t, y, *args), argnums=1))
        extra["jac"] = lambda t, y: np.asarray(j(t, y))
    evs = []
    for ev in events:
        g = jax.jit(lambda t, y, ev=ev: ev(t, y, *args))
        h = (lambda g: lambda t, y: float(g(t, y)))(g)
        h.terminal = getattr(ev, "terminal", False)
        h.direction = getattr(ev, "direction", 0)
        evs.append(h)
    ref = scipy.integrate.solve_ivp(lambda t, y: np.asarray(f(t, y)), t_span, np.asarray(y0),
                                    method, events=evs or None, **extra, **kw)
    assert ref.success, ref.message
    return ref


# ------------------------------------------------------------------ events: values
# Exact agreement with SciPy holds where XLA does SciPy's float64 arithmetic operation for
# operation (XLA:CPU). XLA:GPU contracts multiply-adds into FMAs, which moved step times
# by up to 1e-3 relative (LSODA) on an H200 (2026-11-26): these run on the CPU (mark
# `cpu`). On any device, the closed-form tests below (event times, dense output and their
# gradients) hold the GPU to the solution's accuracy.
@pytest.mark.cpu
@pytest.mark.parametrize("method", METHODS_FAST)
def test_event_times_and_states_match_scipy(method):
    sol = solve_ivp(cannon, (0.0, 10.0), S0, method, events=[ground, apex], args=(0.1,), **TOL)
    ref = scipy_reference(cannon, (0.0, 10.0), S0, method, (0.1,), [ground, apex],
                          dense_output=True, **TOL)
    assert int(sol.status) == ref.status == 1 and sol.message == ref.message
    assert isinstance(sol.t_events, list) and len(sol.t_events) == 2
    np.testing.assert_array_equal(sol.n_events, [1, 1])
    for i in range(2):
        assert sol.t_events[i].shape == (16,) and sol.y_events[i].shape == (16, 4)
        np.testing.assert_allclose(sol.t_events[i][:1], ref.t_events[i], rtol=1e-13)
        np.testing.assert_allclose(sol.y_events[i][:1], ref.y_events[i], rtol=1e-12,
                                   atol=1e-13)
        assert np.all(np.isnan(sol.t_events[i][1:])) and np.all(np.isnan(sol.y_events[i][1:]))
    # t_eval=None: SciPy's own step times, the last one the impact
    n = int(sol.n_points)
    assert n == len(ref.t) and sol.t.shape == (4097,)
    if method == "Radau":
        # Radau's step sizes come from an error estimate that cancels heavily, so they
        # follow the host BLAS's rounding: on the H200 host's CPU (2026-11-26) its step
        # times differed from SciPy's by 1.2e-5 relative (every other method: < 1e-13).
        # The states must still be SciPy's solution at our step times.
        np.testing.assert_allclose(sol.t[:n], ref.t, rtol=1e-4)
        np.testing.assert_allclose(sol.y[:, :n], ref.sol(np.asarray(sol.t[:n])), rtol=1e-8,
                                   atol=1e-9)
    else:
        np.testing.assert_allclose(sol.t[:n], ref.t, rtol=1e-13)
        np.testing.assert_allclose(sol.y[:, :n], ref.y, rtol=1e-12, atol=1e-12)
    assert np.all(np.isinf(sol.t[n:])) and np.all(np.isinf(sol.y[:, n:]))


def test_terminal_event_stops_t_eval_outputs():
    te = jnp.linspace(0.0, 3.0, 7)
    sol = solve_ivp(cannon, (0.0, 10.0), S0, t_eval=te, events=ground, args=(0.1,), **TOL)
    ref = scipy_reference(cannon, (0.0, 10.0), S0, "RK45", (0.1,), [ground], t_eval=te, **TOL)
    m = len(ref.t)
    assert m == 4 and int(sol.n_points) == m and int(sol.status) == 1 and bool(sol.success)
    np.testing.assert_allclose(sol.y[:, :m], ref.y, rtol=1e-12, atol=1e-12)
    assert np.all(np.isnan(sol.y[:, m:]))
    np.testing.assert_array_equal(sol.t, te)
    # the gradient of an output before the impact is that of the plain solve
    g = jax.grad(lambda c: solve_ivp(cannon, (0.0, 10.0), S0, t_eval=te, events=ground,
                                     args=(c,), **TOL).y[0, 3])(0.1)
    g_fd = fd(lambda c: solve_ivp(cannon, (0.0, 10.0), S0, t_eval=te, events=ground,
                                  args=(c,), **TOL).y[0, 3], 0.1)
    np.testing.assert_allclose(g, g_fd, rtol=1e-6)


def test_terminal_count_and_direction():
    """SciPy's `terminal=2` stops at the second event; `direction` filters crossings."""
    def osc(t, y):
        return jnp.stack([y[1], -y[0]])

    def down(t, y):
        return y[0]
    down.direction = -1
    down.terminal = 2
    sol = solve_ivp(osc, (0.0, 20.0), jnp.array([1.0, 0.0]), events=down, **TOL)
    np.testing.assert_allclose(sol.t_events[0][:2], [np.pi / 2, 5 * np.pi / 2], rtol=1e-9)
    assert int(sol.n_events[0]) == 2 and int(sol.status) == 1
    np.testing.assert_allclose(sol.t[int(sol.n_points) - 1], 5 * np.pi / 2, rtol=1e-9)


# ------------------------------------------------------------------ events: gradients
@pytest.mark.parametrize("method", METHODS_GRAD)
def test_decay_event_gradients_closed_form(method):
    """y' = -k y from y0 at t0 hits c at t* = t0 + log(y0 / c) / k: dt*/dk = -(t* - t0)/k,
    dt*/dc = -1/(k c) (a parameter of the event function), dt*/dy0 = 1/(k y0),
    dt*/dt0 = 1; and y(t*) = c whatever the inputs (zero gradient)."""
    def t_star(k, c, y0, t0):
        def hit(t, y):
            return y[0] - c
        sol = solve_ivp(lambda t, y: -k * y, (t0, 5.0), jnp.stack([y0]), method,
                        t_eval=jnp.zeros(0), events=hit, rtol=1e-9, atol=1e-12)
        return sol.t_events[0][0], sol.y_events[0][0, 0]

    k, c, y0, t0 = 1.3, 0.4, 2.0, 0.2
    ts = t0 + np.log(y0 / c) / k
    t, y = t_star(k, c, y0, t0)
    np.testing.assert_allclose(t, ts, rtol=1e-8)
    np.testing.assert_allclose(y, c, rtol=1e-8)
    grads = jax.jit(jax.grad(lambda *a: t_star(*a)[0], argnums=(0, 1, 2, 3)))(k, c, y0, t0)
    np.testing.assert_allclose(grads, [-(ts - t0) / k, -1 / (k * c), 1 / (k * y0), 1.0],
                               rtol=1e-6)
    gy = jax.grad(lambda *a: t_star(*a)[1], argnums=(0, 1, 2))(k, c, y0, t0)
    np.testing.assert_allclose(gy, [0.0, 1.0, 0.0], atol=1e-6)
    _, tangent = jax.jvp(lambda k: t_star(k, c, y0, t0)[0], (k,), (1.0,))
    np.testing.assert_allclose(tangent, -(ts - t0) / k, rtol=1e-6)


@pytest.mark.slow
def test_oscillator_zero_crossings_closed_form_under_vmap():
    """y'' = -k y, y(0) = (1, 0): the j-th zero crossing is (2j + 1) pi / (2 sqrt(k))."""
    def crossings(k):
        return solve_ivp(lambda t, y: jnp.stack([y[1], -k * y[0]]), (0.0, 10.0),
                         jnp.array([1.0, 0.0]), events=lambda t, y: y[0], max_events=4,
                         rtol=1e-9, atol=1e-12)

    ks = jnp.array([1.0, 4.0])
    sols = jax.jit(jax.vmap(crossings))(ks)
    j = np.arange(4)
    for b, k in enumerate(np.asarray(ks)):
        count = int(np.floor(10.0 * np.sqrt(k) / np.pi + 0.5))
        assert int(sols.n_events[b, 0]) == count  # all counted, the first 4 stored
        expect = np.where(j < count, (2 * j + 1) * np.pi / (2 * np.sqrt(k)), np.nan)
        np.testing.assert_allclose(sols.t_events[0][b], expect, rtol=1e-9)
    g = jax.vmap(jax.grad(lambda k: jnp.sum(crossings(k).t_events[0][:3])))(ks)
    expect = -(2 * j[None, :3] + 1) * np.pi / 4 * np.asarray(ks)[:, None] ** -1.5
    np.testing.assert_allclose(g, expect.sum(1), rtol=1e-6)
    gf = jax.jacfwd(lambda k: crossings(k).t_events[0][:3])(4.0)
    np.testing.assert_allclose(gf, expect[1], rtol=1e-6)


@pytest.mark.parametrize("method", [pytest.param("RK45", marks=pytest.mark.slow),
                                    pytest.param("Radau", marks=pytest.mark.slow), "LSODA"])
def test_cannonball_gradients_vs_finite_differences_of_scipy(method):
    """d(impact time, impact distance)/d(drag) against central differences of SciPy's
    own solve of the same problem (float64)."""
    def ours(cd):
        sol = solve_ivp(cannon, (0.0, 10.0), S0, method, events=ground, args=(cd,), **TOL)
        return jnp.stack([sol.t_events[0][0], sol.y_events[0][0, 0]])

    def scipy_solve(cd):
        ref = scipy_reference(cannon, (0.0, 10.0), S0, method, (float(cd),), [ground], **TOL)
        return np.array([ref.t_events[0][0], ref.y_events[0][0, 0]])

    ref = (scipy_solve(0.1 + 1e-5) - scipy_solve(0.1 - 1e-5)) / 2e-5
    np.testing.assert_allclose(jax.jacrev(ours)(0.1), ref, rtol=1e-5)
    np.testing.assert_allclose(jax.jacfwd(ours)(0.1), ref, rtol=1e-5)


def test_gradient_wrt_closed_over_event_threshold_and_y0():
    def L(h, v):
        def level(t, s, cd):
            return s[1] + h
        sol = solve_ivp(cannon, (0.0, 5.0), jnp.array([0.0, 0.0, 10.0, v]), events=level,
                        args=(0.1,), **TOL)
        return sol.t_events[0][0] + sol.y_events[0][0, 0]

    g = jax.grad(L, argnums=(0, 1))(0.5, 10.0)
    np.testing.assert_allclose(g[0], fd(lambda h: L(h, 10.0), 0.5), rtol=1e-6)
    np.testing.assert_allclose(g[1], fd(lambda v: L(0.5, v), 10.0), rtol=1e-6)


# ------------------------------------------------------------------ dense output
@pytest.mark.cpu  # exact agreement with SciPy: see test_event_times_and_states_match_scipy
@pytest.mark.parametrize("method", METHODS_FAST)
@pytest.mark.parametrize("t_span", [(0.0, 5.0), (5.0, 0.0)])
def test_dense_output_matches_scipy(method, t_span):
    def damped(t, y, k):
        return jnp.stack([y[1], -k * y[0] - 0.1 * y[1]])

    tq = np.linspace(-0.5, 5.5, 41)  # extrapolation at both ends, as SciPy does
    # SciPy's own loop: a repeat eager call of RK23/RK45 runs it compiled, whose step
    # times follow XLA's rounding (tests/test_scipy_ivp_eager.py: STEP_TIMES_RTOL)
    sol = solve_ivp(damped, t_span, jnp.array([1.0, 0.0]), method, dense_output=True,
                    args=(2.0,), rtol=1e-8, atol=1e-10, stepping="scipy")
    ref = scipy_reference(damped, t_span, [1.0, 0.0], method, (2.0,), dense_output=True,
                          rtol=1e-8, atol=1e-10)
    assert isinstance(sol.sol, OdeSolution)
    np.testing.assert_allclose(sol.sol(tq), ref.sol(tq), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(sol.sol(2.3), ref.sol(2.3), rtol=1e-12, atol=1e-14)
    assert int(sol.sol.n_segments) == len(ref.sol.interpolants)
    np.testing.assert_allclose(sol.sol.t_min, ref.sol.t_min)
    np.testing.assert_allclose(sol.sol.t_max, ref.sol.t_max)


@pytest.mark.parametrize("method", METHODS_GRAD)
def test_dense_output_gradients_closed_form(method):
    """y'' = -w^2 y, y(0) = (1, 0): sol(t) = cos(w t); d/dw = -t sin(w t), d/dt =
    -w sin(w t); with dense output and t_eval given together."""
    def y_at(w, t):
        sol = solve_ivp(lambda t, y: jnp.stack([y[1], -w ** 2 * y[0]]), (0.0, 3.0),
                        jnp.array([1.0, 0.0]), method, t_eval=jnp.array([1.0, 3.0]),
                        dense_output=True, rtol=1e-10, atol=1e-12)
        return sol.sol(t)[0]

    w, t = 1.2, 1.7
    gw, gt = jax.jit(jax.grad(y_at, argnums=(0, 1)))(w, t)
    np.testing.assert_allclose(y_at(w, t), np.cos(w * t), atol=1e-7)
    np.testing.assert_allclose(gw, -t * np.sin(w * t), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(gt, -w * np.sin(w * t), rtol=1e-5, atol=1e-6)
    ts = jnp.array([0.4, 2.9])
    jac = jax.jacfwd(lambda w: jax.vmap(lambda t: y_at(w, t))(ts))(w)
    np.testing.assert_allclose(jac, -ts * np.sin(w * ts), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("method", [pytest.param(m, marks=pytest.mark.slow)
                                    if m != "BDF" else m for m in METHODS])  # RK45: ~7 s
def test_dense_output_of_a_zero_length_span_is_scipys_constant(method):
    """t_span = (1, 1): SciPy's dense output is one constant segment (its
    ConstantDenseOutput, which has no polynomial coefficients: this raised an
    AttributeError). Ours is y0 at every t, with d/dy0 = I and zero derivatives in the
    parameter and in t. RK45 and BDF by default: one method of each way to store the
    constant (`y_old`, or the first row of C)."""
    def sol_at(k, y0, t):
        return solve_ivp(lambda t, y: -k * y, (1.0, 1.0), y0, method,
                         dense_output=True).sol(t)

    y0, ts = jnp.array([1.0, 2.0]), jnp.array([0.5, 1.0, 1.5])
    ref = scipy_reference(lambda t, y, k: -k * y, (1.0, 1.0), [1.0, 2.0], method, (0.7,),
                          dense_output=True)
    np.testing.assert_array_equal(sol_at(0.7, y0, ts), ref.sol(np.asarray(ts)))
    jk, jy, jt = jax.jacfwd(sol_at, argnums=(0, 1, 2))(0.7, y0, 1.5)
    np.testing.assert_array_equal(jk, np.zeros(2))
    np.testing.assert_array_equal(jy, np.eye(2))
    np.testing.assert_array_equal(jt, np.zeros(2))


@pytest.mark.slow  # ~10 s alone: five DOP853 solves at rtol 1e-11 plus a jit
def test_dense_output_gradient_vs_finite_differences_and_from_jit():
    def sol_of(cd, v):
        return solve_ivp(cannon, (0.0, 2.0), jnp.array([0.0, 0.0, 10.0, v]), "DOP853",
                         dense_output=True, args=(cd,), rtol=1e-11, atol=1e-12).sol

    sol = jax.jit(sol_of)(0.1, 10.0)  # a pytree: returned from jit, called outside
    np.testing.assert_allclose(sol(0.77), sol_of(0.1, 10.0)(0.77), rtol=1e-14)
    L = lambda cd, v: jnp.sum(sol_of(cd, v)(jnp.array([0.3, 1.1, 1.9]))[:2])  # noqa: E731
    g = jax.grad(L, argnums=1)(0.1, 10.0)
    np.testing.assert_allclose(g, fd(lambda v: L(0.1, v), 10.0), rtol=1e-6)


# ------------------------------------------------------------------ t_eval=None
@pytest.mark.parametrize("method", ["RK45", "BDF"])
def test_steps_match_scipy_and_differentiate(method):
    def f(t, y, k):
        return -k * y

    # (SciPy's own loop, as in test_dense_output_matches_scipy)
    sol = solve_ivp(f, (0.0, 2.0), jnp.array([1.0, 2.0]), method, args=(0.7,), rtol=1e-9,
                    atol=1e-12, max_steps=500, stepping="scipy")
    ref = scipy_reference(f, (0.0, 2.0), [1.0, 2.0], method, (0.7,), rtol=1e-9, atol=1e-12)
    n = int(sol.n_points)
    assert n == len(ref.t) and sol.t.shape == (501,) and sol.y.shape == (2, 501)
    np.testing.assert_allclose(sol.t[:n], ref.t, rtol=1e-14)
    np.testing.assert_allclose(sol.y[:, :n], ref.y, rtol=1e-12)
    assert np.all(np.isinf(sol.t[n:])) and sol.t_events is None and sol.sol is None

    def last(k):  # y(2) = 2 exp(-2 k)
        s = solve_ivp(f, (0.0, 2.0), jnp.array([1.0, 2.0]), method, args=(k,), rtol=1e-10,
                      atol=1e-12, max_steps=500)
        return s.y[1, s.n_points - 1]
    np.testing.assert_allclose(jax.grad(last)(0.7), -4 * np.exp(-1.4), rtol=1e-6)


# ------------------------------------------------------------------ bad input, failure
def test_bad_input_errors():
    args = (0.1,)
    with pytest.raises(ValueError, match=r"`events\[0\]` must return a scalar.*\(2,\)"):
        solve_ivp(cannon, (0.0, 1.0), S0, events=lambda t, s, cd: s[:2], args=args)
    with pytest.raises(TypeError, match=r"events\[1\] must be callable"):
        solve_ivp(cannon, (0.0, 1.0), S0, events=[ground, 3.0], args=args)

    def bad(t, s, cd):
        return s[1]
    bad.terminal = -1
    with pytest.raises(ValueError, match="terminal.*boolean or positive integer"):
        solve_ivp(cannon, (0.0, 1.0), S0, events=bad, args=args)
    bad.terminal = 5
    with pytest.raises(ValueError, match=r"terminal=5 needs max_events >= 5"):
        solve_ivp(cannon, (0.0, 1.0), S0, events=bad, args=args, max_events=2)
    with pytest.raises(ValueError, match="max_events must be a positive int"):
        solve_ivp(cannon, (0.0, 1.0), S0, events=ground, args=args, max_events=0)
    with pytest.raises(NotImplementedError, match="sensitivity='adjoint'"):
        solve_ivp(cannon, (0.0, 1.0), S0, events=ground, args=args, sensitivity="adjoint")
    with pytest.raises(ValueError, match=r"more than max_steps=5.*larger max_steps"):
        jax.block_until_ready(solve_ivp(cannon, (0.0, 1.0), S0, args=args, max_steps=5).y)


def test_more_events_than_max_events_are_counted_not_stored():
    """Documented choice: NaN past `max_events` slots, and `n_events` counts them all."""
    sol = solve_ivp(lambda t, y: jnp.stack([y[1], -y[0]]), (0.0, 20.0), jnp.array([1.0, 0.0]),
                    events=lambda t, y: y[0], max_events=2, **TOL)
    assert int(sol.n_events[0]) == 6 and sol.t_events[0].shape == (2,)
    np.testing.assert_allclose(sol.t_events[0], [np.pi / 2, 3 * np.pi / 2], rtol=1e-9)


def test_failure_raises_solver_error_and_nan_policy():
    def blowup(t, y):
        return y ** 2

    def big(t, y):
        return y[0] - 1e300
    with pytest.raises(SolverError, match=r"solve_ivp.*step size"):
        jax.block_until_ready(solve_ivp(blowup, (0.0, 2.0), jnp.ones(1), events=big).y)
    sol = solve_ivp(blowup, (0.0, 2.0), jnp.ones(1), events=big, on_failure="nan")
    assert int(sol.status) == -1 and not bool(sol.success)


def test_failed_solve_has_nan_derivatives_in_both_modes():
    """on_failure="nan": a solve with an event function that blows up (y' = y^2 from 1)
    has NaN outputs at its evaluation times, and their derivatives are NaN in forward
    and reverse mode alike (never a silent zero), as without events."""
    def ys(y0):
        return solve_ivp(lambda t, y: y ** 2, (0.0, 2.0), y0, t_eval=[0.5, 2.0],
                         events=lambda t, y: y[0] - 1e300, on_failure="nan").y

    y0 = jnp.ones(1)
    assert np.isnan(ys(y0)).all()
    for jac in (jax.jacfwd(ys), jax.jacrev(ys)):
        d = jac(y0)
        assert d.shape == (1, 2, 1) and np.isnan(d).all(), d


@pytest.mark.parametrize("t_span", [(0.2, 5.0), (3.0, -1.0)], ids=["forward", "backward"])
def test_event_and_output_derivatives_in_both_modes_and_directions(t_span):
    """jacfwd and jacrev of an event time and the outputs at t_eval w.r.t. k, y0 and t0,
    integrating forward and backward in time: y' = -k y, y(t) = y0 exp(-k (t - t0)),
    which reaches c at t* = t0 + log(y0 / c) / k (going back in time, y grows to c)."""
    t0, t1 = t_span
    c = 0.4 if t1 > t0 else 5.0
    te = jnp.array([1.0, 2.0]) if t1 > t0 else jnp.array([2.0, 1.0])

    def outs(k, y0, t0):
        sol = solve_ivp(lambda t, y: -k * y, (t0, t1), jnp.stack([y0]), "DOP853", t_eval=te,
                        events=lambda t, y: y[0] - c, rtol=1e-10, atol=1e-12)
        return jnp.concatenate([sol.t_events[0][:1], sol.y[0]])

    def exact(k, y0, t0):
        return jnp.concatenate([jnp.stack([t0 + jnp.log(y0 / c) / k]),
                                y0 * jnp.exp(-k * (te - t0))])

    x = (1.3, 2.0, t0)
    want = jax.jacfwd(exact, argnums=(0, 1, 2))(*x)
    np.testing.assert_allclose(outs(*x), exact(*x), rtol=1e-8)
    for jac in (jax.jacfwd, jax.jacrev):
        got = jac(outs, argnums=(0, 1, 2))(*x)
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-9, err_msg=jac.__name__)


# RK45 (~6 s) in the slow stage: Radau's one segment by default, and RK45's dense
# output in test_dense_output_matches_scipy
@pytest.mark.parametrize("method", [pytest.param("RK45", marks=pytest.mark.slow), "Radau"])
def test_dense_output_of_a_one_step_solve_matches_scipy(method):
    """A short span SciPy covers in one step: the dense output is that one segment
    (padded to max_steps by repeating it), SciPy's interpolant in value, and its
    derivative in k matches finite differences."""
    def sol_at(k, ts):
        sol = solve_ivp(lambda t, y: -k * y, (0.0, 0.1), jnp.array([1.0, 2.0]), method,
                        dense_output=True, first_step=0.1, max_steps=8)
        return sol.sol(ts), sol.n_points

    ts = jnp.array([0.0, 0.03, 0.07, 0.1])
    ref = scipy_reference(lambda t, y, k: -k * y, (0.0, 0.1), [1.0, 2.0], method, (0.7,),
                          dense_output=True, first_step=0.1)
    assert len(ref.t) == 2  # one step
    ours, n_points = sol_at(0.7, ts)
    assert int(n_points) == 2
    np.testing.assert_allclose(ours, ref.sol(np.asarray(ts)), rtol=1e-12, atol=1e-14)
    g = jax.grad(lambda k: jnp.sum(sol_at(k, ts)[0][1]))(0.7)
    np.testing.assert_allclose(g, fd(lambda k: jnp.sum(sol_at(k, ts)[0][1]), 0.7), rtol=1e-6)


# ------------------------------------------------------------------ an event at t0 (#38)
def _oscillator(t, y):
    return jnp.stack([y[1], -y[0]])


def _at_max(t, y):  # y'' = -y from (1, 0): y[0] - 1 touches zero at t0 with g' = 0
    return y[0] - 1.0


_at_max.terminal = True


@pytest.mark.parametrize("jitted", [False, True], ids=["eager", "jit"])
@pytest.mark.parametrize("method", METHODS)
def test_terminal_event_at_t0_with_zero_time_derivative_has_scipys_values(method, jitted):
    def run(y0):
        sol = solve_ivp(_oscillator, (0.0, 10.0), y0, method, events=_at_max)
        return sol.t_events[0], sol.y_events[0], sol.n_events, sol.status, sol.t, sol.y

    y0 = jnp.array([1.0, 0.0])
    t_ev, y_ev, n_ev, status, t, y = (jax.jit(run) if jitted else run)(y0)
    ref = scipy_reference(lambda t, y: _oscillator(t, y), (0.0, 10.0), y0, method, (),
                          [_at_max])
    assert ref.status == 1 and ref.t_events[0].tolist() == [0.0]
    assert int(status) == ref.status and int(n_ev[0]) == 1
    np.testing.assert_array_equal(t_ev[:1], ref.t_events[0])  # t0 exactly, not NaN
    np.testing.assert_array_equal(y_ev[:1], ref.y_events[0])  # y0 exactly
    assert np.all(np.isnan(t_ev[1:])) and np.all(np.isnan(y_ev[1:]))
    m = len(ref.t)  # t_eval=None: SciPy's (t0, t*), both t0
    np.testing.assert_array_equal(t[:m], ref.t)
    np.testing.assert_array_equal(y[:, :m], ref.y)


def test_derivative_of_an_event_time_where_the_event_function_does_not_cross_is_nan():
    # docs/guides/ode-events.md: where dg/dt = 0 at t* the event time has no
    # derivative: NaN in forward and reverse mode; the event state's components that
    # do not move there (f = 0) follow y(t*) alone
    def event(a):
        sol = solve_ivp(_oscillator, (0.0, 10.0), jnp.stack([a, 0.0]), "RK45",
                        events=_at_max)
        return sol.t_events[0][0], sol.y_events[0][0]

    assert np.isnan(jax.grad(lambda a: event(a)[0])(1.0))
    t_star, dt_star = jax.jvp(lambda a: event(a)[0], (1.0,), (1.0,))
    assert float(t_star) == 0.0 and np.isnan(dt_star)
    # y*(a) = (a, 0) + f dt*, f = (0, -1): the first component's derivative is 1
    assert float(jax.grad(lambda a: event(a)[1][0])(1.0)) == 1.0
    assert np.isnan(jax.grad(lambda a: event(a)[1][1])(1.0))
    y_star, dy_star = jax.jvp(lambda a: event(a)[1], (1.0,), (1.0,))
    np.testing.assert_array_equal(y_star, [1.0, 0.0])
    assert float(dy_star[0]) == 1.0 and np.isnan(dy_star[1])


@pytest.mark.parametrize("mode", ["grad", "jacfwd"])
def test_an_event_without_derivative_leaves_the_other_slots_exact(mode):
    # y' = 3 k t^2 - 2 t, y(0) = 1: g = y - 1 = t^2 (k t - 1) touches zero at t0 = 0
    # (g' = 0) and crosses it at t* = 1/k, dt*/dk = -1/k^2
    def times(k):
        sol = solve_ivp(lambda t, y: (3 * k * t ** 2 - 2 * t) * jnp.ones_like(y), (0.0, 1.0),
                        jnp.ones(1), "RK45", events=lambda t, y: y[0] - 1.0, t_eval=[1.0],
                        **TOL)
        return sol.t_events[0][:2], sol.y[0, 0]

    t_ev, y1 = times(2.0)
    np.testing.assert_allclose(t_ev, [0.0, 0.5], atol=1e-12)
    assert float(t_ev[0]) == 0.0
    d = jax.grad if mode == "grad" else jax.jacfwd
    np.testing.assert_allclose(d(lambda k: times(k)[0][1])(2.0), -0.25, rtol=1e-8)
    np.testing.assert_allclose(d(lambda k: times(k)[1])(2.0), 1.0, rtol=1e-8)  # y(1) = k
    assert np.isnan(d(lambda k: times(k)[0][0])(2.0))


def _bad_argument_error(kw):
    """(type, message) of what solve_ivp raised for `kw` on top of a valid decay call."""
    call = dict(fun=lambda t, y: -y, t_span=(0.0, 1.0), y0=jnp.ones(2), t_eval=[0.5, 1.0])
    call.update(kw)
    try:
        solve_ivp(**call)
    except (TypeError, ValueError) as exc:
        return type(exc), str(exc)
    return None


def _at_zero(t, y):
    return y[0] - 0.5


@pytest.mark.parametrize("bad", [
    dict(t_eval=[0.5, 2.0]),                       # t_eval outside t_span
    dict(t_eval=[-0.5, 0.5]),
    dict(t_span=(1.0, 0.0), t_eval=[0.5, 1.5]),    # backward, outside
    dict(t_eval=[[0.5, 1.0]]),                     # not 1-D
    dict(t_span=(0.0, 1.0, 2.0)),                  # not (t0, tf)
    dict(y0=jnp.ones(2) + 1j),                     # complex state
    dict(y0=jnp.ones(3), fun=lambda t, y: -y[:2]),  # fun returns the wrong shape
    dict(args=3.0),                                # args cannot be unpacked
], ids=["t_eval_after", "t_eval_before", "t_eval_backward", "t_eval_2d", "t_span_3",
        "y0_complex", "fun_shape", "args_scalar"])
@pytest.mark.parametrize("path", [dict(events=_at_zero), dict(dense_output=True),
                                  dict(events=[])], ids=["events", "dense", "no_events"])
def test_events_and_plain_paths_reject_bad_arguments_alike(bad, path):
    """The events / dense-output path and the plain path check their arguments in one
    place: the same bad t_eval, t_span, y0, fun or args raise the same error (the
    events path once skipped the t_eval-within-t_span check)."""
    plain = _bad_argument_error(bad)
    assert plain is not None, f"the plain path accepted {bad}"
    assert _bad_argument_error({**bad, **path}) == plain


def test_events_path_rejects_bad_choices_as_the_plain_path_does():
    """A sensitivity or stepping that is no choice at all raises on every path."""
    for kw, what in ((dict(sensitivity="backward"), "sensitivity"),
                     (dict(stepping="host"), "stepping")):
        for path in (dict(), dict(events=_at_zero), dict(t_eval=None)):
            call = {"t_eval": [1.0], **path, **kw}
            with pytest.raises(ValueError, match=rf"solve_ivp: {what} must be one of"):
                solve_ivp(lambda t, y: -y, (0.0, 1.0), jnp.ones(1), **call)


def test_gradient_of_a_jitted_solve_with_events_equals_the_eager_one():
    # jax.grad(jax.jit(loss)) raised "mul: arrays must have the same number of
    # dimensions" in the event slots' time shift; eagerly it worked.
    def decay(t, y, k):
        return -k * y

    def half_way(t, y, k):
        return y[0] - 0.5

    def loss(k):
        sol = solve_ivp(decay, (0.0, 2.0), jnp.ones(2), t_eval=jnp.array([2.0]), args=(k,),
                        events=half_way, rtol=1e-10, atol=1e-12)
        return jnp.sum(sol.y) + sol.t_events[0][0]

    k = jnp.array([1.0, 2.0])
    eager = jax.grad(loss)(k)
    jitted = jax.jit(jax.grad(jax.jit(loss)))(k)
    np.testing.assert_allclose(jitted, eager, rtol=1e-12)
    # exact: y_i(2) = exp(-2 k_i); the event y_0 = 0.5 at t* = ln 2 / k_0
    t_star = np.log(2.0) / 1.0
    exact = [-2 * np.exp(-2.0) - t_star / 1.0, -2 * np.exp(-4.0)]
    np.testing.assert_allclose(jitted, exact, rtol=1e-6)
