"""A repeat eager call of solve_ivp with dense output, events or step times (issue #44
item 8): RK23 and RK45 run SciPy's loop compiled (`_compiled_trajectory`) and give
SciPy's values; a configuration's first call, whatever that loop cannot vouch for,
and every traced call run SciPy's own loop (`_trajectory`) as before."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.integrate
import scipy.optimize

from jaxbridge.scipy import SolverError
from jaxbridge.scipy.integrate import solve_ivp
from jaxbridge.scipy.integrate._brentq import brentq

SCIPY_SOLVE_IVP = scipy.integrate.solve_ivp  # the reference (the spy below wraps it)
# RK23 takes more steps (and compiles its own programs): in the slow run
RK = [pytest.param("RK23", marks=pytest.mark.slow), "RK45"]
EPS = np.finfo(float).eps


@pytest.fixture
def scipy_loops(monkeypatch):
    """The number of times SciPy's own solve_ivp runs (the traced path's host call)."""
    calls = []

    def counting(*args, **kw):
        calls.append(kw.get("method"))
        return SCIPY_SOLVE_IVP(*args, **kw)
    monkeypatch.setattr(scipy.integrate, "solve_ivp", counting)
    return calls


def oscillator(t, y, k):
    return jnp.stack([y[1], -k * y[0] - 0.1 * y[1] + 0.3 * jnp.sin(t)])


def crossing(t, y, k):
    return y[0]


def rising_velocity(t, y, k):
    return y[1] - 0.5


def event(fun, terminal=None, direction=None):
    """`fun` as a new function with SciPy's event attributes (None: not set)."""
    def ev(t, y, *args):
        return fun(t, y, *args)
    if terminal is not None:
        ev.terminal = terminal
    if direction is not None:
        ev.direction = direction
    return ev


def scipy_reference(fun, t_span, y0, args=(), events=None, **kw):
    """SciPy's own solve_ivp of the same JAX functions, jitted (the arithmetic the
    traced path's host side does), with `dense` (dense_output=True asked or not) and
    its interpolant always (`interpolant`)."""
    f = jax.jit(fun)
    evs = None
    if events is not None:
        evs = []
        for ev in (events if isinstance(events, list) else [events]):
            g = jax.jit(ev)
            h = (lambda g: lambda t, y, *a: float(g(t, y, *a)))(g)
            h.terminal = getattr(ev, "terminal", None)
            h.direction = getattr(ev, "direction", 0)
            evs.append(h)
    dense = bool(kw.pop("dense_output", False))
    ref = SCIPY_SOLVE_IVP(lambda t, y, *a: np.asarray(f(t, y, *a)), t_span, np.asarray(y0),
                          args=args or None, events=evs, dense_output=True, **kw)
    ref.dense, ref.interpolant = dense, ref.sol
    return ref


def close(actual, desired, rtol=1e-10):
    np.testing.assert_allclose(np.asarray(actual), desired, rtol=rtol, atol=rtol)


# Step times follow the rounding of SciPy's step-size control: its error estimate (the
# K^T E sum) cancels to ~EPS/rtol relative, and XLA contracts multiply-adds (FMA) where
# NumPy rounds twice, so the compiled loop's step times agree with SciPy's to ~1e-9
# relative (3e-7 at worst, seen at rtol=1e-8; SciPy's own on another machine's BLAS
# differ alike). Event times, states at t_eval and the interpolant inside the span do
# not follow them (1e-10); the states at the step times are SciPy's solution there.
STEP_TIMES_RTOL = 1e-6


def assert_matches(res, ref, ts=None):
    """Every field of `res` (padded as jaxbridge pads them) against SciPy's `ref`."""
    assert int(res.status) == ref.status and res.message == ref.message
    assert bool(res.success) == ref.success
    assert int(res.nfev) == ref.nfev and int(res.njev) == ref.njev == 0
    m = int(res.n_points)
    assert m == len(ref.t)
    steps = res.t.shape[0] != m and np.isinf(np.asarray(res.t)[-1])  # t_eval=None
    close(res.t[:m], ref.t, STEP_TIMES_RTOL if steps else 1e-10)
    want_y = ref.interpolant(np.asarray(res.t[:m])) if steps and m else ref.y
    close(res.y[..., :m], want_y, 1e-9 if steps else 1e-10)
    if ref.t_events is None:
        assert res.t_events is None
    else:
        assert len(res.t_events) == len(ref.t_events)
        for i, (te, ye) in enumerate(zip(ref.t_events, ref.y_events)):
            k = int(res.n_events[i])
            assert k == len(te), (i, k, te)
            close(res.t_events[i][:k], te)
            close(res.y_events[i][:k], ye)
            assert np.all(np.isnan(np.asarray(res.t_events[i][k:])))
    if not ref.dense:
        assert res.sol is None
        return
    n = int(res.sol.n_nodes)
    our_ts = np.asarray(res.sol.ts[:n])
    close(our_ts, ref.sol.ts, STEP_TIMES_RTOL)
    t = np.linspace(ref.sol.t_min, ref.sol.t_max, 201) if ts is None else ts
    close(res.sol(t), ref.sol(t))
    close(jnp.stack([res.sol(s) for s in our_ts]), np.stack([ref.sol(s) for s in our_ts]),
          1e-9)


# ------------------------------------------------------------------ dense output
@pytest.mark.parametrize("method", RK)
def test_dense_output_is_scipys_without_scipys_loop(method, scipy_loops):
    y0, args = jnp.array([1.0, 0.0]), (2.0,)
    ref = scipy_reference(oscillator, (0.0, 12.0), y0, args, method=method,
                          dense_output=True, rtol=1e-6, atol=1e-9)
    for _ in range(3):  # first (SciPy's loop), second (compiled), repeat
        res = solve_ivp(oscillator, (0.0, 12.0), y0, method=method, args=args,
                        dense_output=True, rtol=1e-6, atol=1e-9)
        assert_matches(res, ref)
    assert len(scipy_loops) == 1  # the first call (a new configuration)
    m = int(res.n_points)
    assert np.all(np.isinf(np.asarray(res.t[m:])))


@pytest.mark.parametrize("method", ["RK45", pytest.param("DOP853", marks=pytest.mark.slow)])
def test_dense_output_time_derivative_is_the_interpolants(method):
    """jax.grad and jax.jvp of sol(t) in t: the interpolant's own derivative (central
    differences of SciPy's interpolant, inside one step)."""
    y0, args = jnp.array([1.0, 0.0]), (2.0,)
    ref = scipy_reference(oscillator, (0.0, 6.0), y0, args, method=method,
                          dense_output=True, rtol=1e-6, atol=1e-9)
    res = solve_ivp(oscillator, (0.0, 6.0), y0, method=method, args=args,
                    dense_output=True, rtol=1e-6, atol=1e-9)
    ts = 0.5 * (ref.sol.ts[1:] + ref.sol.ts[:-1])  # step midpoints
    h = 1e-6
    want = (ref.sol(ts + h) - ref.sol(ts - h)) / (2 * h)
    got = jax.vmap(jax.jacfwd(res.sol))(jnp.asarray(ts)).T
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-8)
    g = jax.grad(lambda t: res.sol(t)[0])(ts[2])
    np.testing.assert_allclose(g, want[0, 2], rtol=1e-6, atol=1e-8)
    _, tangent = jax.jvp(res.sol, (jnp.asarray(ts[3]),), (jnp.asarray(1.0),))
    np.testing.assert_allclose(tangent, want[:, 3], rtol=1e-6, atol=1e-8)


def test_dense_output_with_t_eval_backward_and_a_state_of_any_shape(scipy_loops):
    def fun(t, y):
        return jnp.stack([-0.5 * y[0], y[0] - 0.2 * y[1]])
    y0 = jnp.array([[2.0, 1.0], [0.5, -1.0]])
    t_eval = np.linspace(5.0, 1.0, 9)
    ref = SCIPY_SOLVE_IVP(lambda t, y: np.asarray(fun(t, y.reshape(2, 2))).ravel(),
                          (5.0, 1.0), np.ravel(y0), t_eval=t_eval, dense_output=True,
                          rtol=1e-8, atol=1e-10)
    for _ in range(2):
        res = solve_ivp(fun, (5.0, 1.0), y0, t_eval=t_eval, dense_output=True, rtol=1e-8,
                        atol=1e-10)
    assert len(scipy_loops) == 1  # the first call (a new configuration)
    assert res.y.shape == (2, 2, 9)
    close(res.y.reshape(4, 9), ref.y)
    assert int(res.nfev) == ref.nfev and int(res.n_points) == 9
    close(res.sol(t_eval).reshape(4, 9), ref.sol(t_eval))
    n = int(res.sol.n_nodes)
    close(res.sol.ts[:n], ref.sol.ts, STEP_TIMES_RTOL)


def test_options_max_step_first_step_tolerance_arrays_vectorized(scipy_loops):
    y0 = jnp.array([1.0, 0.0])
    kw = dict(method="RK45", dense_output=True, rtol=[1e-6, 1e-7], atol=[1e-9, 1e-8],
              max_step=0.7, first_step=0.01)

    def vec(t, y, k):  # vectorized=True: y of shape (n, k)
        return jnp.stack([y[1], -k * y[0] - 0.1 * y[1] + 0.3 * jnp.sin(t)])
    ref = scipy_reference(oscillator, (0.0, 5.0), y0, (2.0,), **kw)
    for _ in range(2):
        res = solve_ivp(vec, (0.0, 5.0), y0, args=(2.0,), vectorized=True, **kw)
    assert_matches(res, ref)
    assert len(scipy_loops) == 1  # the first call (a new configuration)
    assert np.all(np.diff(ref.t) <= 0.7)


# ------------------------------------------------------------------ events
@pytest.mark.parametrize("method", RK)
def test_events_are_scipys_without_scipys_loop(method, scipy_loops):
    """Several event functions, direction filters, a terminal count of 3 and outputs at
    t_eval (NaN after the terminal event)."""
    y0, args = jnp.array([1.0, 0.0]), (4.0,)
    events = [event(crossing, direction=1.0), event(rising_velocity, direction=-1.0),
              event(crossing, terminal=3, direction=-1.0)]
    t_eval = np.linspace(0.0, 20.0, 41)
    ref = scipy_reference(oscillator, (0.0, 20.0), y0, args, events, method=method,
                          t_eval=t_eval, rtol=1e-8, atol=1e-10)
    assert ref.status == 1 and len(ref.t) < 41
    for _ in range(2):
        res = solve_ivp(oscillator, (0.0, 20.0), y0, method=method, args=args,
                        t_eval=t_eval, events=events, rtol=1e-8, atol=1e-10)
    assert_matches(res, ref)
    assert np.all(np.isnan(np.asarray(res.y[:, int(res.n_points):])))
    assert len(scipy_loops) == 1  # the first call (a new configuration)


@pytest.mark.parametrize("method", RK)
def test_terminal_event_with_dense_output_and_step_times(method, scipy_loops):
    y0, args = jnp.array([1.0, 0.0]), (4.0,)
    events = [event(crossing, terminal=2), event(rising_velocity)]
    ref = scipy_reference(oscillator, (0.0, 20.0), y0, args, events, method=method,
                          dense_output=True, rtol=1e-7, atol=1e-10)
    for _ in range(2):
        res = solve_ivp(oscillator, (0.0, 20.0), y0, method=method, args=args,
                        events=events, dense_output=True, rtol=1e-7, atol=1e-10)
    assert_matches(res, ref)
    m = int(res.n_points)
    assert float(res.t[m - 1]) == pytest.approx(ref.t_events[0][-1], rel=1e-12)
    assert len(scipy_loops) == 1  # the first call (a new configuration)


def test_more_events_than_slots_are_counted():
    events = event(lambda t, y: jnp.sin(10.0 * t))
    ref = scipy_reference(lambda t, y: -y, (0.0, 3.0), jnp.ones(1), events=events,
                          rtol=1e-8, atol=1e-10)
    for _ in range(2):
        res = solve_ivp(lambda t, y: -y, (0.0, 3.0), jnp.ones(1), events=events, rtol=1e-8,
                        atol=1e-10, max_events=4)
    assert int(res.n_events[0]) == len(ref.t_events[0]) == 10
    close(res.t_events[0], ref.t_events[0][:4])


def test_event_at_t0_and_at_a_step_end(scipy_loops):
    """An event exactly at t0 (recorded at t0), and one whose function is zero exactly
    at one of the loop's step ends: recorded twice, at the end of that step and at the
    start of the next, as SciPy's `find_active_events` does at its own step ends."""
    fun = lambda t, y: -0.5 * y  # noqa: E731
    y0 = jnp.array([2.0, 4.0])
    scipy_steps = SCIPY_SOLVE_IVP(lambda t, y: -0.5 * y, (0.0, 10.0), np.asarray(y0)).t
    at_scipy_step = event(lambda t, y: t - scipy_steps[3])
    ref = scipy_reference(fun, (0.0, 10.0), y0, events=[event(lambda t, y: t), at_scipy_step])
    assert list(ref.t_events[0]) == [0.0] and list(ref.t_events[1]) == [scipy_steps[3]] * 2

    def solve(t_k):  # t_k an operand: one program for both calls, so the same steps
        t_k = jnp.asarray(t_k)
        return solve_ivp(fun, (0.0, 10.0), y0, events=[event(lambda t, y: t),
                                                       event(lambda t, y: t - t_k)])
    solve(-1.0)  # (a configuration's first call runs SciPy's loop)
    t_k = float(solve(-1.0).t[3])
    res = solve(t_k)
    assert float(res.t[3]) == t_k
    assert len(scipy_loops) == 1
    np.testing.assert_array_equal(res.n_events, [1, 2])
    assert float(res.t_events[0][0]) == 0.0
    np.testing.assert_array_equal(res.t_events[1][:2], [t_k, t_k])
    close(res.y_events[1][:2], np.stack([ref.interpolant(t_k)] * 2), 1e-9)
    assert int(res.nfev) == ref.nfev and int(res.n_points) == len(ref.t)


def test_terminal_event_at_t0_with_step_times_and_dense_output(scipy_loops):
    """A terminal event at t0 in the first step: SciPy's step times are [t0, t0] with one
    segment (its `donot_append` applies from the second step on)."""
    ev = event(lambda t, y: t, terminal=True)
    y0 = jnp.array([1.0])
    ref = scipy_reference(lambda t, y: -y, (0.0, 1.0), y0, events=ev, dense_output=True)
    assert list(ref.t) == [0.0, 0.0] and list(ref.sol.ts) == [0.0, 0.0]
    for _ in range(2):
        res = solve_ivp(lambda t, y: -y, (0.0, 1.0), y0, events=ev, dense_output=True)
    assert_matches(res, ref, ts=np.array([0.0, 0.5, 1.0]))
    assert len(scipy_loops) == 1  # the first call (a new configuration)


# ------------------------------------------------------------------ repeat calls
def test_closed_over_values_and_a_fresh_function_each_call(scipy_loops):
    """Each call's own closed-over values (one compiled program for all of them)."""
    def ev(t, y):
        return y[0] - 0.5
    for k in (0.5, 1.0, 2.0, 3.0):
        kk = jnp.asarray(k)
        fun = lambda t, y: -kk * y  # noqa: E731 - a new function each call
        res = solve_ivp(fun, (0.0, 4.0), jnp.array([1.0, 2.0]), events=ev,
                        dense_output=True, rtol=1e-8, atol=1e-10)
        ref = scipy_reference(lambda t, y: -k * y, (0.0, 4.0), jnp.array([1.0, 2.0]),
                              events=ev, dense_output=True, rtol=1e-8, atol=1e-10)
        assert_matches(res, ref)
        close(res.t_events[0][:1], [np.log(2.0) / k], 1e-7)  # (the solution's accuracy)
    assert len(scipy_loops) == 1  # the first call (a new configuration)


def test_traced_calls_keep_scipys_loop_with_the_same_values(scipy_loops):
    y0, events = jnp.array([1.0, 0.0]), [event(crossing, terminal=2)]

    def solve(y0, k):
        return solve_ivp(oscillator, (0.0, 20.0), y0, args=(k,), events=events,
                         t_eval=jnp.linspace(0.0, 20.0, 21), dense_output=True, rtol=1e-8,
                         atol=1e-10)
    eager = solve(y0, 4.0)  # (a configuration's first call runs SciPy's loop)
    eager = solve(y0, 4.0)
    assert len(scipy_loops) == 1
    jitted = jax.jit(solve)(y0, 4.0)
    assert len(scipy_loops) == 2
    for field in ("y", "t_events", "y_events", "nfev", "status", "n_events", "n_points"):
        a, b = getattr(jitted, field), getattr(eager, field)
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-10, atol=1e-12)
    ts = jnp.linspace(0.0, float(eager.t_events[0][1]), 7)
    close(jitted.sol(ts), np.asarray(eager.sol(ts)))
    n = int(jitted.sol.n_nodes)
    close(jitted.sol.ts[:n], np.asarray(eager.sol.ts[:n]), STEP_TIMES_RTOL)

    def t_first(k):
        return solve(y0, k).t_events[0][0]
    g = jax.grad(t_first)(4.0)
    assert len(scipy_loops) > 2  # grad: SciPy's loop and its forward sensitivities
    h = 1e-5
    fd = (t_first(4.0 + h) - t_first(4.0 - h)) / (2 * h)
    np.testing.assert_allclose(g, fd, rtol=1e-5)
    batched = jax.vmap(lambda k: solve(y0, k).t_events[0][0])(jnp.array([4.0, 9.0]))
    np.testing.assert_allclose(batched[0], eager.t_events[0][0], rtol=1e-12)


# ------------------------------------------------------------------ SciPy's loop instead
def test_zero_size_state_is_scipys():
    ref = SCIPY_SOLVE_IVP(lambda t, y: y, (0.0, 1.0), np.zeros(0), dense_output=True)
    res = solve_ivp(lambda t, y: y, (0.0, 1.0), jnp.zeros(0), dense_output=True)
    res = solve_ivp(lambda t, y: y, (0.0, 1.0), jnp.zeros(0), dense_output=True)
    assert int(res.n_points) == len(ref.t) and int(res.nfev) == ref.nfev
    close(res.t[:len(ref.t)], ref.t)


def test_failing_solve_raises_scipys_failure_or_gives_nan():
    def blows_up(t, y):
        return y ** 2
    for _ in range(2):
        with pytest.raises(SolverError, match="Required step size"):
            solve_ivp(blows_up, (0.0, 2.0), jnp.ones(1), dense_output=True,
                      events=lambda t, y: y[0] - 2.0)
    res = solve_ivp(blows_up, (0.0, 2.0), jnp.ones(1), dense_output=True, on_failure="nan")
    ref = SCIPY_SOLVE_IVP(lambda t, y: y ** 2, (0.0, 2.0), np.ones(1), dense_output=True)
    assert int(res.status) == ref.status == -1 and not bool(res.success)
    assert int(res.nfev) == ref.nfev


def test_a_configuration_that_keeps_giving_up_tries_the_compiled_loop_less_often(
        monkeypatch, scipy_loops):
    """A solve the compiled loop cannot vouch for runs it and then SciPy's loop; when
    that repeats, the compiled loop is tried on fewer and fewer calls, and on every
    call again once it succeeds."""
    from jaxbridge.scipy.integrate import _ivp
    compiled_runs = []

    def counting(key, make):
        run = _ivp_repeat_program(key, make)
        if run is None:
            return None
        return lambda operands: compiled_runs.append(key) or run(operands)
    _ivp_repeat_program = _ivp.repeat_program
    monkeypatch.setattr(_ivp, "repeat_program", counting)

    def blows_up(t, y):
        return y ** 2
    ref = SCIPY_SOLVE_IVP(lambda t, y: y ** 2, (0.0, 2.0), np.ones(1), dense_output=True)
    for _ in range(12):
        res = solve_ivp(blows_up, (0.0, 2.0), jnp.ones(1), dense_output=True,
                        on_failure="nan")
        assert int(res.status) == ref.status == -1 and int(res.nfev) == ref.nfev
    assert len(scipy_loops) == 12  # every answer is SciPy's loop's
    assert len(compiled_runs) == 4  # the 2nd, 3rd, 5th and 9th calls tried it
    # the same configuration on data it can solve: tried again within 8 calls, and
    # from then on every call is the compiled loop's alone
    fine = SCIPY_SOLVE_IVP(lambda t, y: y ** 2, (0.0, 2.0), np.full(1, 0.1),
                           dense_output=True)
    for _ in range(8):
        res = solve_ivp(blows_up, (0.0, 2.0), jnp.full(1, 0.1), dense_output=True,
                        on_failure="nan")
    loops, runs = len(scipy_loops), len(compiled_runs)
    for _ in range(3):
        res = solve_ivp(blows_up, (0.0, 2.0), jnp.full(1, 0.1), dense_output=True,
                        on_failure="nan")
    assert (len(scipy_loops), len(compiled_runs)) == (loops, runs + 3)
    assert int(res.status) == fine.status == 0 and int(res.nfev) == fine.nfev
    close(res.sol(1.5), fine.sol(1.5))


def test_more_steps_than_max_steps_raises_as_before():
    for _ in range(2):
        with pytest.raises(ValueError, match="max_steps=5"):
            solve_ivp(oscillator, (0.0, 20.0), jnp.array([1.0, 0.0]), args=(4.0,),
                      dense_output=True, max_steps=5)


def test_first_step_beyond_the_span_and_a_tiny_rtol_are_scipys(scipy_loops):
    with pytest.raises(ValueError, match="first_step"):
        solve_ivp(lambda t, y: -y, (0.0, 1.0), jnp.ones(1), dense_output=True,
                  first_step=2.0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = solve_ivp(lambda t, y: -y, (0.0, 1.0), jnp.ones(1), dense_output=True,
                        rtol=1e-20, atol=1e-12)
    assert any("rtol" in str(w.message) for w in caught)
    ref = SCIPY_SOLVE_IVP(lambda t, y: -y, (0.0, 1.0), np.ones(1), dense_output=True,
                          rtol=1e-20, atol=1e-12)
    assert int(res.nfev) == ref.nfev
    assert len(scipy_loops) == 2


@pytest.mark.parametrize("kw", [dict(stepping="scipy"), dict(method="DOP853"),
                                dict(method="Radau")])
def test_stepping_scipy_dop853_and_implicit_methods_keep_scipys_loop(kw, scipy_loops):
    """stepping="scipy" asks for SciPy's loop; DOP853's step sizes follow the summation
    order of its error estimate (see `_compiled_trajectory.METHODS`)."""
    ev = event(lambda t, y: y[0] - 0.5)
    ref = scipy_reference(lambda t, y: -y, (0.0, 2.0), jnp.ones(1), events=ev,
                          dense_output=True, method=kw.get("method", "RK45"), rtol=1e-9,
                          atol=1e-12)
    for _ in range(2):
        res = solve_ivp(lambda t, y: -y, (0.0, 2.0), jnp.ones(1), events=ev,
                        dense_output=True, rtol=1e-9, atol=1e-12, **kw)
    assert len(scipy_loops) == 2
    n = int(res.n_points)
    np.testing.assert_allclose(res.t[:n], ref.t, rtol=1e-14)
    np.testing.assert_allclose(res.t_events[0][:1], ref.t_events[0], rtol=1e-14)


# ------------------------------------------------------------------ brentq
@pytest.mark.parametrize("f, a, b", [
    (lambda x: x ** 3 - 2 * x - 5, 2.0, 3.0),
    (lambda x: jnp.cos(x) - x, 0.0, 1.0),
    (lambda x: jnp.exp(x) - 1e3, 0.0, 10.0),
    (lambda x: x - 0.7, 1.0, 0.0),
    (lambda x: x, 0.0, 1.0),
    (lambda x: jnp.where(x > 0.5, 1.0, -1.0), 0.0, 1.0),
])
def test_brentq_is_scipys(f, a, b):
    want = scipy.optimize.brentq(lambda x: float(f(x)), a, b, xtol=4 * EPS, rtol=4 * EPS)
    root, ok = jax.jit(lambda a, b: brentq(f, a, b, 4 * EPS, 4 * EPS))(a, b)
    assert bool(ok) and float(root) == want


@pytest.mark.parametrize("f, a, b, error", [
    (lambda x: x - 2.0, 0.0, 1.0, ValueError),            # no sign change
    (lambda x: (x - 0.3) ** 3, 0.0, 1.0, RuntimeError),    # no convergence in 100
    (lambda x: jnp.where(x > 0.6, jnp.nan, x - 0.5), 0.0, 1.0, ValueError),  # NaN
    (lambda x: jnp.log(x), -1.0, 2.0, ValueError),         # NaN at an end
])
def test_brentq_refuses_where_scipy_raises(f, a, b, error):
    with pytest.raises(error):
        scipy.optimize.brentq(lambda x: float(f(x)), a, b, xtol=4 * EPS, rtol=4 * EPS)
    _, ok = brentq(f, jnp.asarray(a), jnp.asarray(b), 4 * EPS, 4 * EPS)
    assert not bool(ok)
