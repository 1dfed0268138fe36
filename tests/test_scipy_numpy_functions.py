"""User functions written in NumPy (not traceable) given to the jaxbridge.scipy drop-ins.

Uncalled by JAX's transformations, such a call is SciPy's own run: its values, counts
and messages equal SciPy's exactly. Under `jit` it runs as a host call where the result
shapes are known; differentiated, it raises `UntraceableFunctionError` naming the
drop-in and the argument, with JAX's error as its cause.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.integrate
import scipy.optimize

from jaxbridge.errors import MissingRuleError, UntraceableFunctionError
from jaxbridge.scipy import SolverError
from jaxbridge.scipy._trace import is_not_traceable
from jaxbridge.scipy.integrate import quad, solve_bvp, solve_ivp
from jaxbridge.scipy.optimize import least_squares, minimize, root


def decay(t, y):
    return -np.asarray(y)  # NumPy: not traceable


def residual(x, p):
    return np.sin(x) - p


def rosen(x):
    return float(scipy.optimize.rosen(np.asarray(x)))


def exp_fit(x):
    t = np.linspace(0.0, 1.0, 6)
    return x[0] * np.exp(-x[1] * t) - 2.0 * np.exp(-1.5 * t)


def _same(ours, ref, keys):
    for k in keys:
        np.testing.assert_array_equal(np.asarray(ours[k]), np.asarray(ref[k]), err_msg=k)


# ---------------------------------------------------------------- eager: SciPy's run
def test_root_equals_scipy():
    ours = root(residual, np.array([0.1]), args=(0.5,))
    ref = scipy.optimize.root(residual, np.array([0.1]), args=(0.5,))
    assert ref.success
    _same(ours, ref, ("x", "fun", "nfev", "success", "status"))
    assert isinstance(ours.x, jax.Array)
    assert ours.message == ref.message
    assert ours.method == "hybr"


@pytest.mark.parametrize("method", ["BFGS", "Nelder-Mead", "L-BFGS-B"])
def test_minimize_equals_scipy(method):
    ours = minimize(rosen, np.array([-1.2, 1.0]), method=method)
    ref = scipy.optimize.minimize(rosen, np.array([-1.2, 1.0]), method=method)
    assert ref.success
    _same(ours, ref, ("x", "fun", "nfev", "nit", "success", "status"))
    assert ours.message == ref.message


def test_least_squares_equals_scipy():
    ours = least_squares(exp_fit, np.ones(2))
    ref = scipy.optimize.least_squares(exp_fit, np.ones(2))
    _same(ours, ref, ("x", "cost", "fun", "jac", "grad", "nfev", "njev", "status",
                      "active_mask"))
    np.testing.assert_allclose(ours.x, [2.0, 1.5], rtol=1e-6)


def test_solve_ivp_equals_scipy_steps_and_t_eval():
    ours = solve_ivp(decay, (0.0, 2.0), np.array([1.0, 2.0]))
    ref = scipy.integrate.solve_ivp(decay, (0.0, 2.0), np.array([1.0, 2.0]))
    _same(ours, ref, ("t", "y", "nfev", "njev", "nlu", "status", "success"))
    assert ours.message == ref.message and ours.n_points == len(ref.t)
    t_eval = np.linspace(0.0, 2.0, 5)
    ours = solve_ivp(decay, (0.0, 2.0), np.array([1.0]), t_eval=t_eval, method="Radau")
    ref = scipy.integrate.solve_ivp(decay, (0.0, 2.0), np.array([1.0]), t_eval=t_eval,
                                    method="Radau")
    _same(ours, ref, ("t", "y", "nfev", "njev", "nlu"))
    np.testing.assert_allclose(ours.y[0], np.exp(-t_eval), rtol=1e-2)


def test_solve_ivp_events_jac_and_dense_output_equal_scipy():
    def hit(t, y):
        return float(y[0]) - 0.5  # float() of the state: not traceable
    hit.terminal = True

    def jac(t, y):
        return -np.eye(1)
    kw = dict(events=hit, dense_output=True, method="BDF", jac=jac)
    ours = solve_ivp(decay, (0.0, 5.0), np.array([1.0]), **kw)
    ref = scipy.integrate.solve_ivp(decay, (0.0, 5.0), np.array([1.0]), **kw)
    assert ref.status == 1
    _same(ours, ref, ("t", "y", "nfev", "njev", "status"))
    np.testing.assert_array_equal(ours.t_events[0], ref.t_events[0])
    np.testing.assert_array_equal(ours.sol(1.0), ref.sol(1.0))
    assert ours.message == ref.message == "A termination event occurred."
    assert ours.n_events.tolist() == [1]


def test_quad_equals_scipy():
    f = lambda x, c: math.exp(-c * x)  # noqa: E731 - math.exp of the point
    ours = quad(f, 0.0, 1.0, args=(2.0,))
    ref = scipy.integrate.quad(f, 0.0, 1.0, args=(2.0,))
    assert (float(ours[0]), float(ours[1])) == ref
    assert isinstance(ours[0], jax.Array)


def test_solve_bvp_equals_scipy():
    def fun(x, y):
        return np.vstack([y[1], -np.exp(y[0])])

    def bc(ya, yb):
        return np.array([ya[0], yb[0]])
    x = np.linspace(0.0, 1.0, 5)
    ours = solve_bvp(fun, bc, x, np.zeros((2, 5)))
    ref = scipy.integrate.solve_bvp(fun, bc, x, np.zeros((2, 5)))
    assert ref.success
    _same(ours, ref, ("x", "y", "yp", "niter", "status", "success"))
    np.testing.assert_array_equal(ours.sol(0.3), ref.sol(0.3))
    assert ours.n_nodes == len(ref.x) and ours.message == ref.message


@pytest.mark.parametrize("fun", [
    lambda t, y: [-math.exp(y[0]) * 0.0 - y[0]],  # math.exp of the state
    lambda t, y: [-float(y[0])],                  # float() of the state
    lambda t, y: [-y[0] if y[0] > 0 else 0.0],    # Python `if` on a value
], ids=["math.exp", "float", "if"])
def test_python_scalar_code_runs_as_scipy(fun):
    t_eval = [0.5, 1.0]
    ours = solve_ivp(fun, (0.0, 1.0), np.array([1.0]), t_eval=t_eval)
    ref = scipy.integrate.solve_ivp(fun, (0.0, 1.0), np.array([1.0]), t_eval=t_eval)
    _same(ours, ref, ("t", "y", "nfev"))
    np.testing.assert_allclose(ours.y[0], np.exp(-np.array(t_eval)), rtol=1e-2)


def test_in_place_numpy_style_code_runs_as_scipy():
    def fun(x):
        out = x.copy()
        out[0] = x[0] ** 2 - 2.0  # item assignment: JAX arrays are immutable
        return out
    ours = root(fun, np.array([1.0]))
    ref = scipy.optimize.root(fun, np.array([1.0]))
    _same(ours, ref, ("x", "nfev"))


# ---------------------------------------------------------------- the user's own errors
class Mine(ValueError):
    pass


def test_users_own_error_surfaces_as_itself():
    def fun(t, y):
        raise Mine("out of range")
    with pytest.raises(Mine, match="out of range"):
        solve_ivp(fun, (0.0, 1.0), np.array([1.0]))

    def late(x):  # NumPy code that fails on its own, once SciPy runs it
        if float(x[0]) > 0.4:
            raise Mine("too far")
        return np.sin(x) - 0.5
    with pytest.raises(Mine, match="too far") as info:
        root(late, np.array([0.1]))
    assert info.value.__context__ is None  # not shown "during handling of" jaxbridge's


def test_users_own_type_error_is_not_taken_for_numpy_code():
    def fun(x):
        raise TypeError("my own type error")
    with pytest.raises(TypeError, match="my own type error") as info:
        root(fun, np.array([0.1]))
    assert not isinstance(info.value, UntraceableFunctionError)
    assert not is_not_traceable(TypeError("JAX arrays are immutable (but raised by me)"))


def test_scipy_error_surfaces_as_scipys():
    with pytest.raises(ValueError, match="dimension") as info:
        solve_ivp(decay, (0.0, 1.0), np.ones((2, 2)))  # SciPy: y0 must be 1-D
    assert not isinstance(info.value, UntraceableFunctionError)


def test_failure_policy_applies_to_scipys_run():
    with pytest.raises(SolverError, match="SciPy reported failure"):
        minimize(rosen, np.array([-1.2, 1.0]), options={"maxiter": 2})
    res = minimize(rosen, np.array([-1.2, 1.0]), options={"maxiter": 2}, on_failure="nan")
    ref = scipy.optimize.minimize(rosen, np.array([-1.2, 1.0]), options={"maxiter": 2})
    assert not bool(res.success) and res.message == ref.message


# ---------------------------------------------------------------- jit: a host call
def test_root_and_minimize_under_jit_equal_scipy():
    x = jax.jit(lambda p: root(residual, np.array([0.1]), args=(p,)).x)(0.5)
    np.testing.assert_array_equal(x, scipy.optimize.root(residual, [0.1], args=(0.5,)).x)
    res = jax.jit(lambda x0: minimize(rosen, x0, method="Nelder-Mead"))(jnp.array([-1.2, 1.0]))
    ref = scipy.optimize.minimize(rosen, np.array([-1.2, 1.0]), method="Nelder-Mead")
    _same(res, ref, ("x", "fun", "nfev", "nit", "success"))


def test_solve_ivp_and_quad_under_jit_in_a_loop():
    def step(i, y):
        return solve_ivp(decay, (0.0, 0.1), y, t_eval=[0.1], rtol=1e-8).y[:, -1]
    y = jax.jit(lambda y0: jax.lax.fori_loop(0, 3, step, y0))(jnp.array([1.0]))
    np.testing.assert_allclose(y, [np.exp(-0.3)], rtol=1e-6)
    val = jax.jit(lambda c: quad(lambda x, c: math.exp(-c * x), 0.0, 1.0, args=(c,))[0])(2.0)
    assert float(val) == scipy.integrate.quad(lambda x: math.exp(-2.0 * x), 0.0, 1.0)[0]


def test_vmap_runs_scipy_per_element():
    ps = jnp.array([0.2, 0.5])
    xs = jax.vmap(lambda p: root(residual, np.array([0.1]), args=(p,)).x)(ps)
    np.testing.assert_allclose(xs[:, 0], np.arcsin(ps), rtol=1e-8)


def test_jit_without_known_shapes_names_the_argument():
    with pytest.raises(UntraceableFunctionError, match="t_eval") as info:
        jax.jit(lambda y0: solve_ivp(decay, (0.0, 1.0), y0).y)(jnp.array([1.0]))
    assert isinstance(info.value.__cause__, jax.errors.TracerArrayConversionError)
    with pytest.raises(UntraceableFunctionError, match="outside jit"):
        jax.jit(lambda x0: least_squares(exp_fit, x0).x)(jnp.ones(2))


# ---------------------------------------------------------------- differentiated: our error
@pytest.mark.parametrize("case", ["root", "solve_ivp", "quad", "minimize-jit"])
def test_grad_raises_untraceable_function_error(case):
    def loss(p):
        if case == "root":
            return root(residual, np.array([0.1]), args=(p,)).x[0]
        if case == "solve_ivp":
            return solve_ivp(lambda t, y, k: -k * np.asarray(y), (0.0, 1.0), jnp.ones(1),
                             t_eval=[1.0], args=(p,)).y[0, 0]
        if case == "quad":
            return quad(lambda x, c: math.exp(-c * x), 0.0, 1.0, args=(p,))[0]
        return jax.jit(lambda p: minimize(lambda x, p: float(np.sum((x - p) ** 2)),
                                          np.zeros(1), args=(p,)).x[0])(p)
    with pytest.raises(UntraceableFunctionError) as info:
        jax.grad(loss)(0.5)
    err = info.value
    assert isinstance(err, (MissingRuleError, TypeError))
    name = {"root": "optimize.root", "solve_ivp": "integrate.solve_ivp",
            "quad": "integrate.quad", "minimize-jit": "optimize.minimize"}[case]
    what = "func" if case == "quad" else "fun"
    assert err.function == name and err.argument == what
    message = str(err)
    assert f"jaxbridge.scipy.{name}: `{what}` is not a JAX function" in message
    assert "jax.numpy" in message and "jaxbridge.foreign" in message
    assert "differentiated" in message
    assert "raised TracerArrayConversionError" in message or \
        "raised ConcretizationTypeError" in message
    if case != "minimize-jit":  # (JAX puts its own frames in __cause__ of an error
        # raised while it differentiates a jitted function)
        assert isinstance(err.__cause__, (jax.errors.TracerArrayConversionError,
                                          jax.errors.ConcretizationTypeError))


def test_closing_over_a_differentiated_value_raises():
    def loss(k):
        return root(lambda x: np.sin(x) - k, np.array([0.1])).x[0]
    with pytest.raises(UntraceableFunctionError, match="closes\\s+over") as info:
        jax.grad(loss)(0.5)
    assert isinstance(info.value.__cause__, UntraceableFunctionError)
    assert "returned a traced value" in str(info.value.__cause__.__cause__)


def test_numpy_jac_with_jax_fun_still_runs_scipy():
    jac = lambda x: np.diag(np.cos(np.asarray(x)))  # noqa: E731
    fun = lambda x: jnp.sin(x) - 0.5  # noqa: E731
    ours = root(fun, np.array([0.1]), jac=jac)
    ref = scipy.optimize.root(fun, np.array([0.1]), jac=jac)
    _same(ours, ref, ("x", "nfev", "njev"))
    with pytest.raises(UntraceableFunctionError, match="`jac`"):
        jax.grad(lambda p: root(lambda x: jnp.sin(x) - p, np.array([0.1]), jac=jac).x[0])(0.5)


def test_jax_functions_keep_the_traceable_path():
    g = jax.grad(lambda p: root(lambda x: jnp.sin(x) - p, jnp.array([0.1])).x[0])(0.5)
    np.testing.assert_allclose(g, 1.0 / np.cos(np.arcsin(0.5)), rtol=1e-6)


def test_compiled_root_methods_run_scipys_loop():
    for method in ("df-sane", "krylov"):
        ours = root(residual, np.array([0.1, 0.2]), args=(0.5,), method=method)
        ref = scipy.optimize.root(residual, np.array([0.1, 0.2]), args=(0.5,), method=method)
        _same(ours, ref, ("x", "nfev", "success"))
        assert ours.message == ref.message


def test_a_drop_in_inside_a_numpy_function():
    def shoot(v):  # NumPy code calling a drop-in on NumPy code (no t_eval: no jit run)
        sol = solve_ivp(lambda t, y: [y[1], -float(y[0])], (0.0, 1.0), [0.0, float(v[0])])
        return np.asarray(sol.y)[0, -1:] - 1.0

    def shoot_ref(v):
        sol = scipy.integrate.solve_ivp(lambda t, y: [y[1], -float(y[0])], (0.0, 1.0),
                                        [0.0, float(v[0])])
        return sol.y[0, -1:] - 1.0
    ours = root(shoot, np.array([1.0]))
    ref = scipy.optimize.root(shoot_ref, np.array([1.0]))
    _same(ours, ref, ("x", "nfev"))
    np.testing.assert_allclose(ours.x, 1.0 / np.sin(1.0), rtol=1e-2)


def test_boolean_mask_code_runs_as_scipy():
    def fun(x):
        return (x[x > 0] ** 2).sum() + ((x - 1.0) ** 2).sum()  # a mask: not traceable
    ours = minimize(fun, np.array([0.5, -0.5]), method="Nelder-Mead")
    ref = scipy.optimize.minimize(fun, np.array([0.5, -0.5]), method="Nelder-Mead")
    _same(ours, ref, ("x", "fun", "nfev"))


def test_the_error_pickles_with_its_attributes():
    import pickle
    err = UntraceableFunctionError("m", function="optimize.root", argument="fun")
    back = pickle.loads(pickle.dumps(err))
    assert (str(back), back.function, back.argument) == ("m", "optimize.root", "fun")


def test_under_jit_a_closed_over_traced_value_raises_naming_args():
    f = jax.jit(lambda p, k: root(lambda x, p: np.sin(x) - p - k, np.array([0.1]),
                                  args=(p,)).x)
    with pytest.raises(UntraceableFunctionError, match="through `args`"):
        f(0.25, 0.25)
    g = jax.jit(lambda p, k: root(lambda x, p, k: np.sin(x) - p - k, np.array([0.1]),
                                  args=(p, k)).x)
    np.testing.assert_allclose(g(0.25, 0.25), np.arcsin([0.5]), rtol=1e-8)


def test_constraints_written_in_numpy_run_as_scipy_and_refuse_grad():
    # A constraint function in NumPy (with a JAX or a NumPy objective): SciPy's answer,
    # and under grad the error names the constraint.
    con = {"type": "eq", "fun": lambda x: np.sum(np.asarray(x)) - 1.0}
    want = scipy.optimize.minimize(lambda x: np.sum((x - 2.0) ** 2), np.zeros(3),
                                   method="SLSQP", constraints=con)
    assert want.success
    for fun in (lambda x: jnp.sum((x - 2.0) ** 2),
                lambda x: float(np.sum((np.asarray(x) - 2.0) ** 2))):
        got = minimize(fun, np.zeros(3), method="SLSQP", constraints=con)
        np.testing.assert_allclose(np.asarray(got.x), want.x, atol=1e-8)

    def first(p):
        return minimize(lambda x: jnp.sum((x - p) ** 2), jnp.zeros(3), method="SLSQP",
                        constraints=con).x[0]

    with pytest.raises(UntraceableFunctionError, match=r"constraints\[0\]"):
        jax.grad(first)(2.0)
