"""jaxbridge.scipy.integrate: solve_ivp (adjoint / forward sensitivities) and quad."""

import functools
import pathlib
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.integrate
import scipy.sparse
from conftest import fd

from jaxbridge.scipy import SolverError
from jaxbridge.scipy.integrate import quad, solve_ivp
from jaxbridge.scipy.integrate._options import sensitivity_choice

ROOT = pathlib.Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------ problems
def damped(t, y, p):
    """Damped oscillator with a time-dependent forcing: exercises df/dt too."""
    return jnp.stack([y[1], -p["k"] * y[0] - p["c"] * y[1] + 0.1 * jnp.sin(t)])


P = {"k": jnp.array(2.0), "c": jnp.array(0.3)}
Y0 = jnp.array([1.0, 0.0])
TE = jnp.linspace(0.5, 3.0, 6)


def robertson(t, y, k):
    y1, y2, y3 = y
    return jnp.stack([-k[0] * y1 + k[2] * y2 * y3,
                      k[0] * y1 - k[1] * y2 ** 2 - k[2] * y2 * y3,
                      k[1] * y2 ** 2])


K = jnp.array([0.04, 3e7, 1e4])


def loss(y0, p, te, t0, method="RK45", **kw):
    sol = solve_ivp(damped, (t0, 3.5), y0, method=method, t_eval=te, args=(p,), rtol=1e-10,
                    atol=1e-12, **kw)
    return jnp.sum(jnp.sin(sol.y) * jnp.arange(1.0, 7.0)[None, :])



def rk4_solve(f, y0, ts, p, steps_per=200):
    """A pure-JAX fixed-step RK4 reference, differentiated by JAX itself."""
    def interval(y, tt):
        ta, tb = tt
        h = (tb - ta) / steps_per

        def step(i, y):
            t = ta + i * h
            k1 = f(t, y, p)
            k2 = f(t + h / 2, y + h / 2 * k1, p)
            k3 = f(t + h / 2, y + h / 2 * k2, p)
            k4 = f(t + h, y + h * k3, p)
            return y + h / 6 * (k1 + 2 * k2 + 2 * k3 + k4)
        y = jax.lax.fori_loop(0, steps_per, step, y)
        return y, y
    _, ys = jax.lax.scan(interval, y0, (ts[:-1], ts[1:]))
    return ys


# ------------------------------------------------------------------ values
@pytest.mark.parametrize("method", ["RK45", "DOP853", "BDF", "Radau", "LSODA"])
def test_values_match_scipy(method):
    sol = solve_ivp(damped, (0.0, 3.0), Y0, method, TE, args=(P,), rtol=1e-8, atol=1e-10)
    ref = scipy.integrate.solve_ivp(
        lambda t, y: np.asarray(damped(t, jnp.asarray(y), P)), (0.0, 3.0), np.asarray(Y0),
        method=method, t_eval=np.asarray(TE), rtol=1e-8, atol=1e-10)
    assert ref.success, ref.message
    assert sol.y.shape == (2, 6) and sol.t.shape == (6,)
    assert bool(sol.success) and int(sol.status) == 0
    assert int(sol.nfev) > 0 and sol.sol is None and sol.t_events is None
    np.testing.assert_allclose(sol.y, ref.y, rtol=1e-6, atol=1e-8)


def test_no_args_and_multidim_state():
    def f(t, y):
        return -y * jnp.arange(1.0, 7.0).reshape(2, 3)
    sol = solve_ivp(f, (0.0, 1.0), jnp.ones((2, 3)), t_eval=jnp.array([0.0, 1.0]), rtol=1e-8,
                    atol=1e-10)
    assert sol.y.shape == (2, 3, 2)
    np.testing.assert_allclose(sol.y[..., 1], np.exp(-np.arange(1.0, 7.0)).reshape(2, 3),
                               rtol=1e-5, atol=1e-8)


# ------------------------------------------------------------------ gradients
@pytest.mark.parametrize("method,sensitivity", [
    pytest.param(m, s, marks=pytest.mark.slow) if m == "RK45" or (m, s) == ("BDF", "adjoint")
    else (m, s) for m in ("RK45", "BDF", "Radau", "LSODA") for s in ("adjoint", "forward")])
def test_gradients_vs_finite_differences(method, sensitivity):
    g_y0, g_p, g_te, g_t0 = jax.jit(
        jax.grad(functools.partial(loss, method=method, sensitivity=sensitivity),
                 argnums=(0, 1, 2, 3)))(Y0, P, TE, 0.0)
    # Finite differences of a smooth high-order solve (an adaptive solver's output is
    # only piecewise smooth in its inputs; LSODA's method switching makes it noisy).
    ref = "DOP853"
    tol = dict(rtol=2e-6, atol=2e-6)
    np.testing.assert_allclose(g_y0, fd(lambda y: loss(y, P, TE, 0.0, ref), Y0), **tol)
    np.testing.assert_allclose(g_te, fd(lambda t: loss(Y0, P, t, 0.0, ref), TE), **tol)
    np.testing.assert_allclose(
        g_p["k"], fd(lambda k: loss(Y0, {"k": k, "c": P["c"]}, TE, 0.0, ref), P["k"]), **tol)
    np.testing.assert_allclose(g_t0, fd(lambda t: loss(Y0, P, TE, t, ref), 0.0), **tol)


@pytest.mark.slow
@pytest.mark.parametrize("sensitivity", ["adjoint", "forward"])
def test_gradients_match_pure_jax_rk4(sensitivity):
    ts = jnp.concatenate([jnp.zeros(1), TE])

    def ref_loss(y0, p):
        return jnp.sum(jnp.sin(rk4_solve(damped, y0, ts, p).T) * jnp.arange(1.0, 7.0)[None, :])

    ours = jax.grad(lambda y0, p: loss(y0, p, TE, 0.0, sensitivity=sensitivity),
                    argnums=(0, 1))(Y0, P)
    ref = jax.grad(ref_loss, argnums=(0, 1))(Y0, P)
    np.testing.assert_allclose(ours[0], ref[0], rtol=1e-7)
    np.testing.assert_allclose(ours[1]["k"], ref[1]["k"], rtol=1e-7)
    np.testing.assert_allclose(ours[1]["c"], ref[1]["c"], rtol=1e-7)


@pytest.mark.slow
def test_forward_mode_matches_reverse():
    f = lambda p: solve_ivp(damped, (0.0, 3.0), Y0, t_eval=TE, args=(p,), rtol=1e-10,  # noqa
                            atol=1e-12).y
    fwd = jax.jacfwd(f)(P)
    rev = jax.jacrev(f)(P)
    np.testing.assert_allclose(fwd["k"], rev["k"], rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(fwd["c"], rev["c"], rtol=1e-6, atol=1e-9)
    g = lambda t0, te: solve_ivp(damped, (t0, 3.0), Y0, t_eval=te, args=(P,),  # noqa: E731
                                 rtol=1e-10, atol=1e-12).y
    for argnum in (0, 1):
        np.testing.assert_allclose(jax.jacfwd(g, argnum)(0.0, TE), jax.jacrev(g, argnum)(0.0, TE),
                                   rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("method,sensitivity", [("BDF", "adjoint"), ("BDF", "forward"),
                                                ("LSODA", "forward")])
def test_stiff_robertson_gradient(method, sensitivity):
    te = jnp.array([1.0, 10.0, 100.0])

    def L(logk, method=method, rtol=1e-9):
        sol = solve_ivp(robertson, (0.0, 100.0), jnp.array([1.0, 0.0, 0.0]), method, te,
                        args=(jnp.exp(logk),), rtol=rtol, atol=1e-12, sensitivity=sensitivity)
        return jnp.sum(sol.y[0] + 1e4 * sol.y[1])

    g = jax.jit(jax.grad(L))(jnp.log(K))
    ref = fd(lambda lk: L(lk, "Radau", 1e-11), jnp.log(K), 1e-5)
    np.testing.assert_allclose(g, ref, rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("sensitivity", ["adjoint", "forward"])
def test_no_evaluation_times_gives_zero_gradient(sensitivity):
    def L(y0, p):
        return jnp.sum(solve_ivp(damped, (0.0, 3.0), y0, t_eval=jnp.zeros(0), args=(p,),
                                 sensitivity=sensitivity).y)
    g_y0, g_p = jax.grad(L, argnums=(0, 1))(Y0, P)
    np.testing.assert_array_equal(g_y0, 0.0)
    np.testing.assert_array_equal(g_p["k"], 0.0)


def test_sensitivity_choice_and_bad_value():
    # "auto": forward sensitivities while the augmented system n (1 + n + P) is small.
    assert sensitivity_choice("auto", 3, 3) == "forward"
    assert sensitivity_choice("auto", 20, 0) == "adjoint"
    assert sensitivity_choice("adjoint", 1, 0) == "adjoint"
    # the implicit methods' compiled adjoint is the faster one even for tiny systems
    assert sensitivity_choice("auto", 3, 3, compiled_implicit=True) == "adjoint"
    assert sensitivity_choice("forward", 3, 3, compiled_implicit=True) == "forward"
    with pytest.raises(ValueError, match=r"solve_ivp: sensitivity must be one of .*'backward'"):
        solve_ivp(damped, (0.0, 3.0), Y0, t_eval=TE, args=(P,), sensitivity="backward")


@pytest.mark.slow
def test_forward_sensitivity_vjp_of_multidim_state_and_pytree_params():
    """Both reverse-mode strategies agree on a (2, 2) state and a nested-dict parameter."""
    def f(t, y, p):
        return -p["rates"]["a"] * y + p["b"] * jnp.sin(t)

    p = {"rates": {"a": jnp.array([[1.0, 2.0], [0.5, 3.0]])}, "b": jnp.array(0.2)}
    te = jnp.array([0.0, 0.4, 1.0])

    def L(y0, p, sensitivity):
        ys = solve_ivp(f, (0.0, 1.0), y0, t_eval=te, args=(p,), rtol=1e-10, atol=1e-12,
                       sensitivity=sensitivity).y
        return jnp.sum(ys ** 2 * jnp.arange(1.0, 4.0)[None, None, :])

    fwd = jax.grad(L, argnums=(0, 1))(jnp.ones((2, 2)), p, "forward")
    adj = jax.grad(L, argnums=(0, 1))(jnp.ones((2, 2)), p, "adjoint")
    for a, b in zip(jax.tree_util.tree_leaves(fwd), jax.tree_util.tree_leaves(adj)):
        np.testing.assert_allclose(a, b, rtol=1e-7, atol=1e-10)
    np.testing.assert_allclose(
        fwd[1]["b"], fd(lambda b: L(jnp.ones((2, 2)), {"rates": p["rates"], "b": b}, "forward"),
                        p["b"]), rtol=1e-6)


@pytest.mark.slow
def test_matches_diffrax_if_installed():
    diffrax = pytest.importorskip("diffrax")

    def ref_loss(y0, p):
        term = diffrax.ODETerm(lambda t, y, p: damped(t, y, p))
        sol = diffrax.diffeqsolve(term, diffrax.Tsit5(), 0.0, 3.0, 0.01, y0, args=p,
                                  saveat=diffrax.SaveAt(ts=TE),
                                  stepsize_controller=diffrax.PIDController(rtol=1e-10,
                                                                            atol=1e-12))
        return jnp.sum(jnp.sin(sol.ys.T) * jnp.arange(1.0, 7.0)[None, :])

    ours = jax.grad(lambda y0, p: loss(y0, p, TE, 0.0), argnums=(0, 1))(Y0, P)
    ref = jax.grad(ref_loss, argnums=(0, 1))(Y0, P)
    np.testing.assert_allclose(ours[0], ref[0], rtol=1e-6)
    np.testing.assert_allclose(ours[1]["k"], ref[1]["k"], rtol=1e-6)


# ------------------------------------------------------------------ transformations
@pytest.mark.slow
def test_vmap_over_params_and_jitted_training_loop():
    ks = jnp.array([1.0, 2.0, 3.0])
    f = lambda k: loss(Y0, {"k": k, "c": P["c"]}, TE, 0.0)  # noqa: E731
    batched = jax.jit(jax.vmap(jax.value_and_grad(f)))(ks)
    for i, k in enumerate(ks):
        v, g = jax.value_and_grad(f)(k)
        np.testing.assert_allclose(batched[0][i], v, rtol=1e-12)
        np.testing.assert_allclose(batched[1][i], g, rtol=1e-12)

    target = solve_ivp(damped, (0.0, 3.0), Y0, t_eval=TE, args=(P,), rtol=1e-8, atol=1e-10).y

    def mse(p):
        return jnp.mean((solve_ivp(damped, (0.0, 3.0), Y0, t_eval=TE, args=(p,), rtol=1e-8,
                                   atol=1e-10).y - target) ** 2)

    @jax.jit
    def train(p):
        def step(_, p):
            return jax.tree_util.tree_map(lambda a, g: a - 0.5 * g, p, jax.grad(mse)(p))
        return jax.lax.fori_loop(0, 5, step, p)

    p0 = {"k": jnp.array(1.6), "c": jnp.array(0.3)}
    assert float(mse(train(p0))) < 0.5 * float(mse(p0))


# ------------------------------------------------------------------ failure policy
def blowup(t, y):
    return y ** 2


@pytest.mark.slow
def test_failure_raises_solver_error_eager_and_under_jit():
    """Item 3: `except SolverError` catches a failed solve, eager and under jit."""
    te = jnp.array([0.5, 2.0])
    with pytest.raises(SolverError, match=r"solve_ivp.*method='RK45'.*step size"):
        jax.block_until_ready(solve_ivp(blowup, (0.0, 2.0), jnp.ones(1), t_eval=te).y)
    with pytest.raises(SolverError, match=r"solve_ivp.*step size"):
        jax.block_until_ready(jax.jit(lambda y: solve_ivp(blowup, (0.0, 2.0), y,
                                                          t_eval=te).y)(jnp.ones(1)))
    # A gradient whose forward solve fails, through SciPy's loop and the compiled one.
    # The compiled loop's status check is a host call that XLA runs on one of its worker
    # threads whenever it handed the forward loop to its thread pool (the backward loop
    # runs beside it): the SolverError crosses XLA as a status, and JAX's runtime error
    # for it is raised as the SolverError itself. Each call of the cached gradient is a
    # fresh draw of XLA's thread placement; every one must raise the SolverError.
    with pytest.raises(SolverError):
        jax.block_until_ready(jax.jit(jax.grad(lambda y: solve_ivp(
            blowup, (0.0, 2.0), y, t_eval=te, stepping="scipy").y.sum()))(jnp.ones(1)))
    for method in ("RK45", "DOP853", "BDF"):  # compiled loops; BDF: SciPy's on the host
        grad = jax.jit(jax.grad(lambda y: solve_ivp(blowup, (0.0, 2.0), y, method=method,
                                                    t_eval=te).y.sum()))
        batched = jax.jit(jax.vmap(jax.grad(lambda y: solve_ivp(
            blowup, (0.0, 2.0), y, method=method, t_eval=te).y.sum())))
        for _ in range(8):
            with pytest.raises(SolverError, match=f"method='{method}'.*step size"):
                jax.block_until_ready(grad(jnp.ones(1)))
        with pytest.raises(SolverError, match=f"method='{method}'.*step size"):
            jax.block_until_ready(batched(jnp.ones((2, 1))))


@pytest.mark.slow
def test_failure_nan_policy():
    def f(y0):
        return solve_ivp(blowup, (0.0, 2.0), y0, t_eval=jnp.array([0.5, 2.0]),
                         on_failure="nan")
    sol = f(jnp.ones(1))
    assert np.all(np.isnan(sol.y)) and not bool(sol.success) and int(sol.status) == -1
    assert sol.message == "Integration step failed." and sol["status"] == sol.status
    assert np.all(np.isnan(jax.grad(lambda y: f(y).y.sum())(jnp.ones(1))))
    with pytest.raises(ValueError, match="on_failure"):
        solve_ivp(blowup, (0.0, 2.0), jnp.ones(1), t_eval=[0.5], on_failure="ignore")
    assert issubclass(SolverError, RuntimeError)


# ------------------------------------------------------------------ SciPy's conventions
def lv(t, y, a, b, c, d):
    return jnp.stack([a * y[0] - b * y[0] * y[1], -c * y[1] + d * y[0] * y[1]])


def test_scipy_code_ported_as_is():
    """Item 1: SciPy's call `solve_ivp(lv, (0, 4), y0, t_eval=ts, args=(p,))` with
    `def lv(t, y, p)`, and several scalar args unpacked, give SciPy's values."""
    ts = np.linspace(0.0, 4.0, 9)
    p = (1.5, 1.0, 3.0, 1.0)
    ref = scipy.integrate.solve_ivp(lv, (0, 4), [1.0, 1.0], "RK45", ts, args=p, rtol=1e-9,
                                    atol=1e-11)
    assert ref.success, ref.message
    ours = solve_ivp(lv, (0, 4), [1.0, 1.0], "RK45", ts, args=p, rtol=1e-9, atol=1e-11)
    np.testing.assert_allclose(ours.y, ref.y, rtol=1e-7, atol=1e-9)
    np.testing.assert_allclose(ours.t, ref.t)

    def lv_p(t, y, p):  # one pytree in args
        return lv(t, y, *p)
    ours_p = solve_ivp(lv_p, (0, 4), jnp.ones(2), t_eval=ts, args=(p,), rtol=1e-9, atol=1e-11)
    np.testing.assert_allclose(ours_p.y, ref.y, rtol=1e-7, atol=1e-9)
    # SciPy's defaults (rtol=1e-3, atol=1e-6): SciPy's values, SciPy's step count
    d = solve_ivp(lv, (0, 4), [1.0, 1.0], t_eval=ts, args=p)
    dref = scipy.integrate.solve_ivp(lv, (0, 4), [1.0, 1.0], t_eval=ts, args=p)
    assert dref.success, dref.message
    np.testing.assert_allclose(d.y, dref.y, rtol=1e-9, atol=1e-12)
    assert int(d.nfev) == dref.nfev


def test_bad_input_errors_name_the_argument():
    with pytest.raises(TypeError, match=r"4th positional argument is `method`"):
        solve_ivp(lv, (0, 4), jnp.ones(2), jnp.linspace(0, 4, 3))
    with pytest.raises(TypeError, match=r"solve_ivp: Supplied 'args' cannot be unpacked"):
        solve_ivp(damped, (0.0, 3.0), Y0, t_eval=TE, args=2.0)
    with pytest.raises(ValueError, match=r"t_eval are not within t_span"):
        solve_ivp(damped, (0.0, 1.0), Y0, t_eval=TE, args=(P,))
    with pytest.raises(ValueError, match=r"`fun` must return one array of shape \(2,\)"):
        solve_ivp(lambda t, y: y[0], (0.0, 1.0), Y0, t_eval=[1.0])
    with pytest.raises(TypeError) as info:  # forgot args: a note says how it was called
        solve_ivp(lambda t, y, p: -p * y, (0.0, 1.0), Y0, t_eval=[1.0])
    assert "as fun(t, y, *args)" in "".join(info.value.__notes__)


# ------------------------------------------------------------------ quad
def gauss(x, p):
    return p["a"] * jnp.exp(-p["b"] * x ** 2)


Q = {"a": jnp.array(1.5), "b": jnp.array(0.7)}


def test_quad_value_and_gradients():
    val, err = quad(gauss, 0.0, 2.0, args=(Q,))
    ref = scipy.integrate.quad(lambda x: 1.5 * np.exp(-0.7 * x ** 2), 0.0, 2.0)
    np.testing.assert_allclose(val, ref[0], rtol=1e-12)
    np.testing.assert_allclose(err, ref[1], rtol=1e-6)

    def L(a, b, p):
        return quad(gauss, a, b, (p,))[0] ** 2

    ga, gb, gp = jax.jit(jax.grad(L, argnums=(0, 1, 2)))(0.3, 2.0, Q)
    np.testing.assert_allclose(ga, fd(lambda a: L(a, 2.0, Q), 0.3), rtol=1e-7)
    np.testing.assert_allclose(gb, fd(lambda b: L(0.3, b, Q), 2.0), rtol=1e-7)
    np.testing.assert_allclose(gp["b"], fd(lambda b: L(0.3, 2.0, {"a": Q["a"], "b": b}),
                                           Q["b"]), rtol=1e-7)
    # forward mode and an infinite limit (closed form: a/2 sqrt(pi/b))
    fwd = jax.jacfwd(lambda p: quad(gauss, 0.0, jnp.inf, (p,))[0])(Q)
    np.testing.assert_allclose(fwd["b"], -0.25 * 1.5 * np.sqrt(np.pi) * 0.7 ** -1.5, rtol=1e-8)
    rev = jax.grad(lambda p: quad(gauss, 0.0, jnp.inf, (p,))[0])(Q)
    np.testing.assert_allclose(rev["a"], 0.5 * np.sqrt(np.pi / 0.7), rtol=1e-8)
    bs = jnp.array([0.5, 1.0, 2.0])
    out = jax.vmap(lambda b: quad(gauss, 0.0, jnp.inf, ({"a": Q["a"], "b": b},))[0])(bs)
    np.testing.assert_allclose(out, 0.75 * np.sqrt(np.pi / bs), rtol=1e-8)
    # abserr has no derivative: NaN, never a silent zero
    assert np.isnan(jax.grad(lambda p: quad(gauss, 0.0, 2.0, (p,))[1])(Q)["a"])


def test_quad_scipy_signature_and_points():
    ref = scipy.integrate.quad(lambda x, a, b: a * np.exp(-b * x ** 2), 0.0, 3.0,
                               args=(1.5, 0.7), points=[1.0])
    f = lambda x, a, b: a * jnp.exp(-b * x ** 2)  # noqa: E731
    ours = quad(f, 0.0, 3.0, (1.5, 0.7), 0, 1.49e-8, 1.49e-8, 50, [1.0])
    np.testing.assert_allclose(ours[0], ref[0], rtol=1e-12)
    with pytest.raises(NotImplementedError, match="full_output"):
        quad(f, 0.0, 1.0, (1.0, 1.0), full_output=1)
    with pytest.raises(NotImplementedError, match="weight"):
        quad(f, 0.0, 1.0, (1.0, 1.0), weight="cos", wvar=1.0)
    # (one wording with solve_ivp's event functions: a scalar is shape ())
    # SciPy's TypeError ("only 0-dimensional arrays can be converted to Python scalars")
    with pytest.raises(TypeError, match=r"`func` must return a scalar \(shape \(\)\)"):
        quad(lambda x: jnp.stack([x, x]), 0.0, 1.0)


def test_quad_failure_policy():
    def wiggle(x):
        return jnp.sin(200 * x) * jnp.exp(-x)
    with pytest.raises(SolverError, match="quad.*subdivisions"):
        jax.block_until_ready(quad(wiggle, 0.0, 10.0, limit=2))
    with pytest.raises(SolverError, match="quad.*subdivisions"):
        jax.block_until_ready(jax.jit(lambda b: quad(wiggle, 0.0, b, limit=2)[0])(10.0))
    assert np.isnan(quad(wiggle, 0.0, 10.0, limit=2, on_failure="nan")[0])


# ------------------------------------------------------------------ the example
@pytest.mark.slow  # a whole training run of the example (~10 s)
def test_fit_ode_example_runs():
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "fit_ode.py"), "--no-plot"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "OK" in proc.stdout


# ------------------------------------------------------------------ compiled stepping
@pytest.mark.slow
@pytest.mark.parametrize("method", ["RK23", "RK45", "DOP853"])
def test_compiled_stepping_is_scipys_algorithm(method):
    """stepping="compiled" runs SciPy's own tableau, step control, first step and dense
    output: the same steps (nfev) and SciPy's values to rounding (at a tolerance where
    rounding is not amplified by the step-size feedback)."""
    p = (1.5, 1.0, 3.0, 1.0)
    ts = np.linspace(0.3, 10.0, 25)
    ref = scipy.integrate.solve_ivp(lv, (0, 10), [1.0, 1.0], method, ts, args=p, rtol=1e-8,
                                    atol=1e-8)
    assert ref.success, ref.message
    for stepping in ("compiled", "scipy"):
        ours = solve_ivp(lv, (0, 10), jnp.ones(2), method, ts, args=p, rtol=1e-8, atol=1e-8,
                         stepping=stepping)
        np.testing.assert_allclose(ours.y, ref.y, rtol=1e-11, atol=1e-13)
        assert int(ours.nfev) == ref.nfev and bool(ours.success)
    # options it implements, and the gradient (forward sensitivities, compiled too)
    opts = dict(first_step=0.01, max_step=0.2)
    ref = scipy.integrate.solve_ivp(lv, (0, 10), [1.0, 1.0], method, ts, args=p, rtol=1e-6,
                                    atol=1e-8, **opts)
    ours = solve_ivp(lv, (0, 10), jnp.ones(2), method, ts, args=p, rtol=1e-6, atol=1e-8,
                     stepping="compiled", **opts)
    assert int(ours.nfev) == ref.nfev
    np.testing.assert_allclose(ours.y, ref.y, rtol=1e-9, atol=1e-12)

    def L(q, stepping):
        return jnp.sum(solve_ivp(lv, (0, 3), jnp.ones(2), method, ts[:7], args=tuple(q),
                                 rtol=1e-7, atol=1e-9, stepping=stepping).y ** 2)
    q = jnp.array(p)
    g_c = jax.jit(jax.grad(L), static_argnums=1)(q, "compiled")
    g_s = jax.grad(L)(q, "scipy")
    # the augmented sensitivity systems' steps agree up to rounding amplified by the
    # step-size feedback: the gradients agree well within the solve's tolerance
    np.testing.assert_allclose(g_c, g_s, rtol=1e-5)
    np.testing.assert_allclose(jax.jacfwd(L)(q, "compiled"), g_c, rtol=1e-5)


def test_stepping_choice_errors():
    with pytest.raises(ValueError, match=r"stepping must be one of"):
        solve_ivp(damped, (0.0, 3.0), Y0, t_eval=TE, args=(P,), stepping="fast")
    with pytest.raises(ValueError, match=r"stepping='compiled' runs SciPy's explicit methods"):
        solve_ivp(damped, (0.0, 3.0), Y0, "RK45", TE, args=(P,), stepping="compiled",
                  min_step=1e-3)


def test_args_conventions_are_scipys():
    """solve_ivp (SciPy 1.17) unpacks any iterable `args` and raises its TypeError
    otherwise; quad wraps a non-tuple `args` as one argument."""
    decay = lambda t, y, k, c: -k * y + c  # noqa: E731
    ours = solve_ivp(decay, (0.0, 1.0), jnp.ones(1), t_eval=[1.0], args=[2.0, 0.5], rtol=1e-10,
                     atol=1e-12).y
    ref = scipy.integrate.solve_ivp(decay, (0.0, 1.0), [1.0], t_eval=[1.0], args=[2.0, 0.5],
                                    rtol=1e-10, atol=1e-12)
    assert ref.success
    np.testing.assert_allclose(ours, ref.y, rtol=1e-9)
    with pytest.raises(TypeError, match="cannot be unpacked"):
        scipy.integrate.solve_ivp(decay, (0.0, 1.0), [1.0], args=2.0)
    # an array unpacks along its first axis, and the gradient flows through it
    kc = jnp.array([2.0, 0.5])
    g = jax.grad(lambda kc: solve_ivp(decay, (0.0, 1.0), jnp.ones(1), t_eval=[1.0], args=kc,
                                      rtol=1e-10, atol=1e-12).y[0, 0])(kc)
    k, c = 2.0, 0.5  # y(1) = c/k + (1 - c/k) e^{-k}
    want = [-c / k ** 2 + c / k ** 2 * np.exp(-k) - (1 - c / k) * np.exp(-k), (1 - np.exp(-k)) / k]
    np.testing.assert_allclose(g, want, rtol=1e-7)
    y, _ = quad(lambda x, c: jnp.exp(-c[0] * x) * c[1], 0.0, 1.0, args=jnp.array([2.0, 3.0]))
    ref = scipy.integrate.quad(lambda x, c: np.exp(-c[0] * x) * c[1], 0.0, 1.0,
                               args=np.array([2.0, 3.0]))
    np.testing.assert_allclose(y, ref[0], rtol=1e-10)


# ------------------------------------------------------------------ the compiled loop's derivatives
def lv4(t, y, p):
    return jnp.stack([p[0] * y[0] - p[1] * y[0] * y[1], -p[2] * y[1] + p[3] * y[0] * y[1]])


LV_P, LV_Y0, LV_TE = jnp.array([1.5, 1.0, 3.0, 1.0]), jnp.array([1.0, 1.0]), \
    jnp.linspace(0.5, 6.0, 5)


def lv_loss(p, y0, method="RK45", **kw):
    ys = solve_ivp(lv4, (0.0, 6.0), y0, method, LV_TE, args=(p,), rtol=1e-6, atol=1e-9, **kw).y
    return jnp.sum(jnp.sin(ys) * jnp.arange(1.0, 6.0)[None, :])


@pytest.mark.slow
@pytest.mark.parametrize("method", ["RK23", "RK45", "DOP853"])
def test_discrete_adjoint_is_exact_for_the_discrete_solution(method):
    """Reverse mode (the discrete adjoint) equals JAX's own forward-mode derivative of
    the same compiled loop (step sizes held) to rounding: exact for the discrete
    solution, not merely within tolerance (rtol=1e-6 here)."""
    rev = jax.jit(jax.grad(functools.partial(lv_loss, method=method, sensitivity="adjoint"),
                           argnums=(0, 1)))(LV_P, LV_Y0)
    fwd = jax.jacfwd(functools.partial(lv_loss, method=method), argnums=(0, 1))(LV_P, LV_Y0)
    for r, f in zip(rev, fwd):
        np.testing.assert_allclose(r, f, rtol=1e-11, atol=1e-12)
    # ... and reverse mode by forward sensitivities is the same number
    rf = jax.grad(functools.partial(lv_loss, method=method, sensitivity="forward"),
                  argnums=(0, 1))(LV_P, LV_Y0)
    for r, f in zip(rev, rf):
        np.testing.assert_allclose(r, f, rtol=1e-11, atol=1e-12)


@pytest.mark.slow
def test_discrete_adjoint_vs_closed_form_and_finite_differences():
    """y' = -k y + c: y(t) = c/k + (y0 - c/k) e^{-k t}; gradients in k, c, y0."""
    te = jnp.array([0.5, 1.0, 2.0])

    def out(k, c, y0):
        return solve_ivp(lambda t, y, k, c: -k * y + c, (0.0, 2.0), jnp.atleast_1d(y0),
                         t_eval=te, args=(k, c), rtol=1e-10, atol=1e-12,
                         sensitivity="adjoint").y[0]

    def exact(k, c, y0):
        return c / k + (y0 - c / k) * jnp.exp(-k * te)

    w = jnp.array([1.0, -2.0, 0.5])
    args = (1.3, 0.4, 2.0)
    g = jax.grad(lambda *a: out(*a) @ w, argnums=(0, 1, 2))(*args)
    ref = jax.grad(lambda *a: exact(*a) @ w, argnums=(0, 1, 2))(*args)
    np.testing.assert_allclose(g, ref, rtol=1e-8)
    num = fd(lambda k: out(k, 0.4, 2.0) @ w, jnp.asarray(1.3))
    np.testing.assert_allclose(g[0], num, rtol=1e-6)


@pytest.mark.slow
def test_discrete_adjoint_matches_diffrax_on_a_neural_ode():
    """An MLP vector field with ~300 parameters: our gradient (RK45, discrete adjoint)
    and diffrax's (Tsit5, RecursiveCheckpointAdjoint) agree within the tolerance."""
    diffrax = pytest.importorskip("diffrax")
    k1, k2 = jax.random.split(jax.random.PRNGKey(0))
    params = {"W1": jax.random.normal(k1, (4, 32)) / 2, "b1": jnp.zeros(32),
              "W2": jax.random.normal(k2, (32, 4)) / 6, "b2": jnp.zeros(4)}

    def field(t, y, p):
        return jnp.tanh(y @ p["W1"] + p["b1"]) @ p["W2"] + p["b2"]
    y0, te = jnp.array([1.0, 0.5, -0.5, 0.2]), jnp.linspace(0.5, 3.0, 6)

    def ours(p):
        return jnp.sum(solve_ivp(field, (0.0, 3.0), y0, t_eval=te, args=(p,), rtol=1e-10,
                                 atol=1e-10).y ** 2)

    def theirs(p):
        sol = diffrax.diffeqsolve(
            diffrax.ODETerm(field), diffrax.Tsit5(), 0.0, 3.0, None, y0, args=p,
            saveat=diffrax.SaveAt(ts=te),
            stepsize_controller=diffrax.PIDController(rtol=1e-10, atol=1e-10))
        return jnp.sum(sol.ys ** 2)
    g, ref = jax.jit(jax.grad(ours))(params), jax.jit(jax.grad(theirs))(params)
    for k in params:
        np.testing.assert_allclose(g[k], ref[k], rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("extra", [{}, {"t_eval": None}, {"dense_output": True},
                                   {"events": lambda t, y: y[0] - 0.5}],
                         ids=["t_eval", "steps", "dense_output", "events"])
@pytest.mark.parametrize("bad", [0, 1, 2.5, True, "8"])
def test_bad_checkpoint_budget_is_refused_on_every_path(extra, bad):
    # The events / dense-output / step-times path never uses the budget, but a bad one
    # is still the user's mistake, named the same way.
    kw = {"t_eval": jnp.array([0.5, 1.0]), **extra}
    with pytest.raises(ValueError, match=r"solve_ivp: checkpoints must be None or an int "
                                         r">= 2 .* got " + re.escape(repr(bad))):
        solve_ivp(lambda t, y: -y, (0.0, 1.0), jnp.ones(2), checkpoints=bad, **kw)


@pytest.mark.slow
def test_two_level_checkpointing_gives_the_same_gradient():
    """A small budget stores segment starts and re-runs segments: the same numbers;
    a budget too small for the solve's steps is a clear error. The discrete adjoint is
    asked for by name: "auto" picks forward sensitivities for this small system, and
    they never store a checkpoint."""
    adjoint = functools.partial(lv_loss, sensitivity="adjoint")
    full = jax.grad(adjoint)(LV_P, LV_Y0, checkpoints=None)
    small = jax.grad(adjoint)(LV_P, LV_Y0, checkpoints=24)  # 12 x 12 covers 144 steps
    np.testing.assert_allclose(small, full, rtol=1e-13, atol=1e-14)
    np.testing.assert_allclose(full, jax.grad(lv_loss)(LV_P, LV_Y0, sensitivity="forward"),
                               rtol=1e-9, atol=1e-12)
    with pytest.raises(ValueError, match=r"checkpoint budget is too small.*checkpoints"):
        jax.block_until_ready(jax.grad(lv_loss)(LV_P, LV_Y0, checkpoints=8))
    with pytest.raises(ValueError, match=r"checkpoints must be None or an int >= 2"):
        lv_loss(LV_P, LV_Y0, checkpoints=1)


def test_two_level_checkpointing_with_five_segments_by_default():
    """The default run's check of the segment re-runs (the slow test above uses
    Lotka-Volterra's 144 steps): an oscillator's 25 accepted steps under checkpoints=10
    are five segments of five steps, a budget that covers them exactly, each re-run
    from its stored start. The gradient in both k and y0 equals the one-segment
    adjoint's and forward sensitivities', also where the last segment holds a single
    step."""
    def loss(k, y0, **kw):
        # 1e-8 lies inside the first step: its cotangent enters through that step
        sol = solve_ivp(lambda t, y: jnp.stack([y[1], -k * y[0]]), (0.0, 3.2), y0,
                        t_eval=jnp.array([1e-8, 0.5, 4 / 3, 13 / 6, 3.0]), rtol=1e-6,
                        atol=1e-9, **kw)
        return jnp.sum(sol.y ** 2)
    grad = jax.grad(loss, argnums=(0, 1))
    k, y0 = 2.0, jnp.array([1.0, 0.0])
    one = grad(k, y0, sensitivity="adjoint", checkpoints=None)
    five = grad(k, y0, sensitivity="adjoint", checkpoints=10)
    forward = grad(k, y0, sensitivity="forward")
    for a, b, c in zip(five, one, forward):  # the same steps, summed in another order
        np.testing.assert_allclose(a, b, rtol=1e-11, atol=1e-13)
        np.testing.assert_allclose(a, c, rtol=1e-9, atol=1e-12)
    # a last segment of a single step: 25 = 24 + 1 under checkpoints=48 (L = 24)
    for a, b in zip(grad(k, y0, sensitivity="adjoint", checkpoints=48), one):
        np.testing.assert_allclose(a, b, rtol=1e-11, atol=1e-13)
    with pytest.raises(ValueError, match=r"25 accepted steps.*covers 16"):
        jax.block_until_ready(grad(k, y0, sensitivity="adjoint", checkpoints=8))


@pytest.mark.slow
def test_compiled_gradient_vmaps_as_one_batched_loop():
    """vmap over parameters and initial states: no host call in the program (the loop
    itself is batched), and the values are the per-example gradients."""
    ps = jnp.stack([LV_P, LV_P * 1.1])
    y0s = jnp.stack([LV_Y0, LV_Y0 * 0.8])
    grad = jax.grad(functools.partial(lv_loss, on_failure="nan"), argnums=(0, 1))
    g = jax.jit(jax.vmap(grad))(ps, y0s)
    one = jax.jit(grad)
    for i in range(2):
        gi = one(ps[i], y0s[i])
        np.testing.assert_allclose(g[0][i], gi[0], rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(g[1][i], gi[1], rtol=1e-10, atol=1e-12)
    text = str(jax.make_jaxpr(jax.vmap(grad))(ps, y0s))
    assert "while" in text and "jaxbridge" not in text


def test_compiled_path_bad_input():
    with pytest.raises(ValueError, match=r"`fun` must return one array of shape \(2,\)"):
        solve_ivp(lambda t, y: jnp.zeros(3), (0.0, 1.0), LV_Y0, t_eval=[1.0])
    blowup = lambda t, y: y ** 2  # noqa: E731  (y(t) = 1 / (1 - t): infinite at t = 1)
    with pytest.raises(SolverError):
        jax.block_until_ready(jax.jit(lambda y0: solve_ivp(blowup, (0.0, 2.0), y0,
                                                           t_eval=[2.0]).y)(jnp.ones(1)))
    nan = solve_ivp(blowup, (0.0, 2.0), jnp.ones(1), t_eval=[2.0], on_failure="nan")
    assert int(nan.status) == -1 and np.isnan(nan.y).all()


def test_compiled_forward_mode_with_an_odd_state_size():
    """jacfwd of the compiled loop w.r.t. y0, args and t_eval for three states (the other
    tests have two: an off-by-one in the tangent's layout can hide behind an even n).
    y' = -k y: y(t) = y0 exp(-k t)."""
    def ys(y0, k, te):
        return solve_ivp(lambda t, y, k: -k * y, (0.0, 2.0), y0, t_eval=te, args=(k,),
                         rtol=1e-10, atol=1e-12).y

    def exact(y0, k, te):
        return y0[:, None] * jnp.exp(-k[:, None] * te[None, :])

    y0, k, te = jnp.array([1.0, -0.5, 2.0]), jnp.array([0.4, 1.3, 2.0]), jnp.array([0.5, 1.9])
    ours = jax.jacfwd(ys, argnums=(0, 1, 2))(y0, k, te)
    want = jax.jacfwd(exact, argnums=(0, 1, 2))(y0, k, te)
    for o, w in zip(ours, want):
        np.testing.assert_allclose(o, w, rtol=1e-7, atol=1e-9)


def test_compiled_adjoint_with_steps_longer_than_one_time_unit():
    """A slow decay at a loose tolerance: RK45 takes steps of several time units, so an
    output lies more than one unit after the start of the step that holds it. The
    discrete adjoint equals reverse mode by forward sensitivities (both exact for the
    same discrete solution) and the closed form within the tolerance."""
    def L(k, sensitivity):
        sol = solve_ivp(lambda t, y, k: -k * y, (0.0, 100.0), jnp.array([1.0, 2.0]),
                        t_eval=[30.0, 100.0], args=(k,), rtol=1e-5, atol=1e-9,
                        sensitivity=sensitivity)
        return jnp.sum(sol.y * jnp.array([[1.0, 2.0], [-1.0, 3.0]]))

    k = jnp.array([0.05, 0.02])
    adjoint = jax.grad(L)(k, "adjoint")
    np.testing.assert_allclose(adjoint, jax.grad(L)(k, "forward"), rtol=1e-9)
    exact = lambda k: jnp.sum(jnp.array([1.0, 2.0])[:, None] * jnp.exp(  # noqa: E731
        -k[:, None] * jnp.array([30.0, 100.0])[None, :]) * jnp.array([[1.0, 2.0], [-1.0, 3.0]]))
    np.testing.assert_allclose(adjoint, jax.grad(exact)(k), rtol=1e-3)


@pytest.mark.slow  # ~10 s: two reverse-mode compiles of a 20-output loop
def test_compiled_adjoint_with_more_than_twice_as_many_outputs_as_inputs():
    """Reverse mode where the outputs (40 times of 3 states: 120 values) outnumber the
    tangent inputs (t0, y0, the parameters k and A, the 40 times: 54) more than twice:
    the linear map whose transpose reverse mode takes is padded to the longer of the
    two. Both the discrete adjoint and forward sensitivities equal the closed form
    through expm."""
    A = jnp.array([[-0.5, 1.0, 0.0], [-1.0, -0.5, 0.3], [0.0, -0.3, -0.2]])
    ts = jnp.linspace(0.05, 2.0, 40)
    w = jnp.cos(jnp.arange(120.0)).reshape(3, 40)

    def L(k, y0, sensitivity):
        sol = solve_ivp(lambda t, y, k: k * (A @ y), (0.0, 2.0), y0, t_eval=ts, args=(k,),
                        rtol=1e-10, atol=1e-12, sensitivity=sensitivity)
        return jnp.sum(w * sol.y)

    def exact(k, y0):
        ys = jax.vmap(lambda t: jax.scipy.linalg.expm(k * t * A) @ y0)(ts)  # (40, 3)
        return jnp.sum(w * ys.T)

    k, y0 = 0.8, jnp.array([1.0, -0.5, 2.0])
    want = jax.grad(exact, argnums=(0, 1))(k, y0)
    for sensitivity in ("adjoint", "forward"):
        got = jax.grad(L, argnums=(0, 1))(k, y0, sensitivity)
        for g, r in zip(got, want):
            np.testing.assert_allclose(g, r, rtol=1e-7, atol=1e-9, err_msg=sensitivity)


def test_compiled_failed_solve_gives_nan_gradients_with_the_nan_policy():
    """The compiled loop's discrete adjoint under on_failure="nan": a solve that blows up
    has NaN outputs and a NaN gradient (never a silent zero from the masked outputs)."""
    def L(y0, k):
        sol = solve_ivp(lambda t, y, k: k * y ** 2, (0.0, 2.0), y0, t_eval=[2.0], args=(k,),
                        sensitivity="adjoint", on_failure="nan")
        return jnp.sum(sol.y)

    assert np.isnan(float(L(jnp.ones(1), 1.0)))
    g_y0 = jax.jit(jax.grad(L))(jnp.ones(1), 1.0)
    assert np.isnan(g_y0).all(), g_y0


def test_compiled_gradient_lowers_for_cuda():
    text = jax.jit(jax.grad(lv_loss)).trace(LV_P, LV_Y0).lower(
        lowering_platforms=("cuda",)).as_text()
    assert "while" in text


# ------------------------------------------------------------------ SciPy's loop
def _linear_ode_exact(y0, k, c, t0, te):
    """y' = -k y + c: y(t) = c/k + (y0 - c/k) exp(-k (t - t0)), elementwise."""
    ystar = c / k
    return ystar[:, None] + (y0 - ystar)[:, None] * jnp.exp(-k[:, None] * (te - t0)[None, :])


@pytest.mark.parametrize("method", ["RK45", "Radau"])
def test_scipy_loop_derivatives_match_the_closed_form(method):
    """stepping="scipy": the continuous adjoint (checkpointed at the evaluation times, the
    first of them t0 itself), reverse mode by forward sensitivities, and forward mode
    (jacfwd) w.r.t. y0, args, t0 and t_eval, each against JAX's derivative of the closed
    form. Radau brings the adjoint's exact Jacobian (`adj_jac`) and `jac` in the
    sensitivity solves. Three states with different rates, so that a transposed or
    mis-sliced Jacobian, a wrong sign or a lost jump at an output shows."""
    c = jnp.array([0.2, -0.1, 0.3])
    w = jnp.array([[1.0, -2.0, 0.5, 3.0], [0.7, 1.5, -1.0, 2.0], [-0.3, 0.4, 2.5, -1.2]])

    def ys(y0, k, t0, te, **kw):
        return solve_ivp(lambda t, y, k: -k * y + c, (t0, 2.0), y0, method, te, args=(k,),
                         rtol=1e-10, atol=1e-12, stepping="scipy", **kw).y

    def L(y0, k, t0, te, **kw):
        return jnp.sum(jnp.sin(ys(y0, k, t0, te, **kw)) * w)

    def L_exact(y0, k, t0, te):
        return jnp.sum(jnp.sin(_linear_ode_exact(y0, k, c, t0, te)) * w)

    x = (jnp.array([1.0, -0.5, 2.0]), jnp.array([0.7, 1.3, 2.2]), 0.1,
         jnp.array([0.1, 0.5, 1.0, 1.9]))
    want = jax.grad(L_exact, argnums=(0, 1, 2, 3))(*x)
    for sensitivity in ("adjoint", "forward"):
        got = jax.jit(jax.grad(functools.partial(L, sensitivity=sensitivity),
                               argnums=(0, 1, 2, 3)))(*x)
        for g, e in zip(got, want):
            np.testing.assert_allclose(g, e, rtol=2e-6, atol=1e-8, err_msg=sensitivity)
    jf = jax.jacfwd(ys, argnums=(0, 1, 2, 3))(*x)
    jw = jax.jacfwd(lambda *a: _linear_ode_exact(*a[:2], c, *a[2:]), argnums=(0, 1, 2, 3))(*x)
    for g, e in zip(jf, jw):
        np.testing.assert_allclose(g, e, rtol=2e-6, atol=1e-8)


def test_scipy_loop_gradients_with_one_and_no_evaluation_times():
    """stepping="scipy", both reverse-mode strategies: one evaluation time (the adjoint's
    only interval runs from t0) against the closed form, and none (t_eval=[]): a zero
    gradient in y0, args and t0, like the compiled loop's."""
    c = jnp.array([0.2, -0.1])

    def L(y0, k, t0, te, sensitivity):
        sol = solve_ivp(lambda t, y, k: -k * y + c, (t0, 2.0), y0, t_eval=te, args=(k,),
                        rtol=1e-10, atol=1e-12, stepping="scipy", sensitivity=sensitivity)
        return jnp.sum(jnp.sin(sol.y) * 2.0)

    x = (jnp.array([1.0, -0.5]), jnp.array([0.7, 1.3]), 0.1)
    exact = jax.grad(lambda y0, k, t0: jnp.sum(jnp.sin(_linear_ode_exact(
        y0, k, c, t0, jnp.array([1.5]))) * 2.0), argnums=(0, 1, 2))(*x)
    for sensitivity in ("adjoint", "forward"):
        one = jax.grad(L, argnums=(0, 1, 2))(*x, jnp.array([1.5]), sensitivity)
        for g, e in zip(one, exact):
            np.testing.assert_allclose(g, e, rtol=2e-6, atol=1e-8, err_msg=sensitivity)
        none = jax.grad(L, argnums=(0, 1, 2))(*x, jnp.zeros(0), sensitivity)
        for g in none:
            np.testing.assert_array_equal(g, 0.0)


@pytest.mark.parametrize("method", ["BDF", "LSODA"])
def test_scipy_loop_adjoint_with_many_parameters(method, monkeypatch):
    """The continuous adjoint of an implicit method with more than 64 parameters: its
    exact Jacobian ((n + P)^2 entries, most of them zero) is sparse for BDF and Radau,
    dense for LSODA (which cannot take a sparse one). y' = -(A w) * y + c with 70
    weights w (212 parameters with the closed-over A and c) and rates about 300 and 1
    (stiff, so that LSODA switches to BDF and calls the Jacobian), against the closed
    form; SciPy's solve_ivp is watched to see which kind of Jacobian the adjoint solves
    get."""
    c = jnp.array([0.2, -0.1])
    A = jnp.asarray(np.random.default_rng(0).uniform(0.0, 0.03, (2, 70))
                    * np.array([[300.0], [1.0]]))
    w = jnp.linspace(0.5, 1.5, 70)
    kinds = set()
    solve = scipy.integrate.solve_ivp

    def watched(fun, t_span, y0, *a, jac=None, **kw):
        if callable(jac) and np.size(y0) > 2:  # the adjoint solves: (a, mu)
            def jac(t, z, jac=jac):
                m = jac(t, z)
                kinds.add("sparse" if scipy.sparse.issparse(m) else "dense")
                return m
        return solve(fun, t_span, y0, *a, jac=jac, **kw)

    monkeypatch.setattr(scipy.integrate, "solve_ivp", watched)

    def L(w):
        sol = solve_ivp(lambda t, y, w: -(A @ w) * y + c, (0.0, 2.0), jnp.array([1.0, -0.5]),
                        method, jnp.array([0.5, 2.0]), args=(w,), rtol=1e-10, atol=1e-12,
                        stepping="scipy", sensitivity="adjoint")
        return jnp.sum(jnp.sin(sol.y))

    exact = jax.grad(lambda w: jnp.sum(jnp.sin(_linear_ode_exact(
        jnp.array([1.0, -0.5]), A @ w, c, 0.0, jnp.array([0.5, 2.0])))))(w)
    np.testing.assert_allclose(jax.jit(jax.grad(L))(w), exact, rtol=1e-5, atol=1e-9)
    assert kinds == {"dense" if method == "LSODA" else "sparse"}, kinds


def test_quad_gradient_at_an_endpoint_singularity_matches_the_closed_form():
    """int_0^1 c x^(p-1) dx = c / p: QUADPACK's extrapolation gets the value of the
    singular integrand within a few subintervals, but SciPy's quad_vec (no
    extrapolation), which integrates the whole parameter gradient at once, does not
    reach the tolerance (it used to raise SolverError for grad of c / sqrt(x) even
    at limit=50). The gradient then falls back to quad per parameter: reverse mode
    equals forward mode and the closed form (1/p, -c/p^2), eager and under jit."""
    def y(c, p, limit=50):
        return quad(lambda x: c * x ** (p - 1), 0.0, 1.0, limit=limit)[0]

    c, p = 1.5, 0.3
    want = (1 / p, -c / p ** 2)
    for jac in (jax.grad(y, (0, 1)), jax.jit(jax.grad(y, (0, 1))), jax.jacfwd(y, (0, 1))):
        np.testing.assert_allclose(jac(c, p), want, rtol=1e-9)
    np.testing.assert_allclose(jax.grad(y)(2.0, 0.5, 10), 2.0, rtol=1e-12)  # c / sqrt(x)


def test_quad_gradient_that_does_not_converge_follows_the_failure_policy():
    """int_0^1 x^p dx = 1 / (p + 1): Gauss-Kronrod gets the polynomial's value in one
    interval at p = 2, but its derivative x^p log(x) does not reach the tolerance
    within limit=2 subintervals, by quad_vec or by quad: a SolverError naming the
    parameter gradient under on_failure="raise" (eager and under jit), NaN in both
    modes under "nan", never an unflagged inaccurate number."""
    def L(p, on_failure):
        return quad(lambda x: x ** p, 0.0, 1.0, limit=2, on_failure=on_failure)[0]

    np.testing.assert_allclose(L(2.0, "raise"), 1 / 3, rtol=1e-12)
    for grad in (jax.grad(L), jax.jit(jax.grad(L), static_argnums=1)):
        with pytest.raises(SolverError, match="quad of the parameter gradient"):
            jax.block_until_ready(grad(2.0, "raise"))
        assert np.isnan(grad(2.0, "nan"))
    assert np.isnan(jax.jacfwd(L)(2.0, "nan"))


@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")
def test_scipy_loop_float32_output_that_overflows_has_nan_derivatives_in_both_modes():
    """SciPy solves in float64; a float32 state pushed past float32's largest value by a
    finite right-hand side comes back as inf. Its derivatives are NaN in forward and
    reverse mode alike (never a finite number for an infinite output, and jacfwd agrees
    with jacrev)."""
    def ys(y0):
        return solve_ivp(lambda t, y: jnp.full_like(y, 1e38), (0.0, 2.0), y0,
                         t_eval=[0.5, 2.0], stepping="scipy").y

    y0 = jnp.array([3e38], jnp.float32)
    assert np.isinf(ys(y0)).all()
    for jac in (jax.jacfwd(ys), jax.jacrev(ys)):
        d = jac(y0)
        assert d.shape == (1, 2, 1) and d.dtype == jnp.float32 and np.isnan(d).all(), d


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
def test_scipy_loop_sensitivity_solve_that_fails_follows_the_failure_policy():
    """y' = cbrt(y) from y0 = 0: the solve is y = 0, but its derivative in y0 does not
    exist (solutions from y0 > 0 leave 0 at once: dy(t)/dy0 is infinite), so SciPy fails
    on the sensitivity equations. A SolverError naming the sensitivity solve in both
    modes under on_failure="raise", NaN derivatives under "nan"."""
    def ys(y0, on_failure):
        return solve_ivp(lambda t, y: jnp.cbrt(y), (0.0, 1.0), y0, t_eval=[0.5, 1.0],
                         stepping="scipy", sensitivity="forward", on_failure=on_failure).y

    y0 = jnp.zeros(1)
    np.testing.assert_array_equal(ys(y0, "raise"), 0.0)
    grad = jax.grad(lambda y0, on_failure: jnp.sum(ys(y0, on_failure)))
    tangent = lambda y0, on_failure: jax.jvp(lambda y: ys(y, on_failure),  # noqa: E731
                                             (y0,), (jnp.ones(1),))[1]
    for derivative in (grad, tangent):
        with pytest.raises(SolverError, match="sensitivity solve: Required step size"):
            jax.block_until_ready(derivative(y0, "raise"))
        assert np.isnan(derivative(y0, "nan")).all()


@pytest.mark.parametrize("method", ["Radau", "BDF"])
def test_scipy_loop_adjoint_of_a_reverse_mode_only_right_hand_side_with_jac_false(method):
    """A right-hand side JAX can differentiate in reverse mode only (a jax.custom_vjp
    inside: jax.jacfwd cannot build its Jacobian). With jac=False an implicit method's
    solves use SciPy's finite-difference Jacobian, the forward solve and the continuous
    adjoint's backward solves alike, so `grad` works and matches the closed form
    (y' = -k y: d/dk sum(y(1)) = -(y0_1 + y0_2) exp(-k))."""
    @jax.custom_vjp
    def neg(y):
        return -y

    neg.defvjp(lambda y: (-y, None), lambda _, g: (-g,))

    def L(k):
        sol = solve_ivp(lambda t, y: k * neg(y), (0.0, 1.0), jnp.array([1.0, 2.0]), method,
                        [1.0], jac=False, stepping="scipy", sensitivity="adjoint",
                        rtol=1e-10, atol=1e-12)
        return jnp.sum(sol.y)

    np.testing.assert_allclose(jax.jit(jax.grad(L))(0.7), -3.0 * np.exp(-0.7), rtol=1e-6)


def test_scipy_loop_derivatives_of_a_function_without_parameters():
    """stepping="scipy" with a right-hand side that closes over no array and takes no
    args (an empty parameter pytree): both reverse-mode strategies and forward mode,
    w.r.t. y0 and t_eval, against y(t) = y0 exp(-t / 2)."""
    te = jnp.array([0.5, 1.5])

    def ys(y0, te, sensitivity="auto"):
        return solve_ivp(lambda t, y: -0.5 * y, (0.0, 2.0), y0, "RK45", te, rtol=1e-10,
                         atol=1e-12, stepping="scipy", sensitivity=sensitivity).y

    def exact(y0, te):
        return y0[:, None] * jnp.exp(-0.5 * te)[None, :]

    x = (jnp.array([1.0, -2.0]), te)
    want = jax.jacfwd(exact, argnums=(0, 1))(*x)
    runs = {s: jax.jacrev(functools.partial(ys, sensitivity=s), argnums=(0, 1))(*x)
            for s in ("adjoint", "forward")}
    runs["jacfwd"] = jax.jacfwd(ys, argnums=(0, 1))(*x)
    for name, got in runs.items():
        for g, e in zip(got, want):
            np.testing.assert_allclose(g, e, rtol=1e-7, atol=1e-10, err_msg=name)
