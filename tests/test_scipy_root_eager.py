"""root(method="hybr") called eagerly again: MINPACK's hybrj as one compiled program.

A repeat eager call (a function structure met before) runs hybrj's loop in one JAX
program (`optimize/_hybrj.py`, MINPACK's arithmetic in csrc/math/minpack_hybrj.h).
Its results must be SciPy's: each case below runs SciPy's own root on the same JAX
function (jitted, as NumPy) and compares every field -- x, fun, status, message,
nfev, njev, fjac, r, qtf -- with SciPy's general path forbidden during the call, so the
compiled loop is what answered. One case compares with a NumPy twin of the residual,
whose last bits differ from JAX's.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.optimize
from conftest import extension_missing

from jaxbridge.scipy import SolverError
from jaxbridge.scipy.optimize import _hybrj, _run_scipy, root

# MINPACK's steps are CPU handlers: where a GPU is JAX's default, the compiled loop
# runs for operands on the CPU (elsewhere SciPy's loop does, as before)
pytestmark = pytest.mark.cpu

if not _hybrj.available():  # pragma: no cover - only with JAXBRIDGE_TESTS_WITHOUT_EXTENSIONS=1
    pytest.skip(f"jaxbridge._builtin not built: {extension_missing('_builtin')}",
                allow_module_level=True)


def _readme(x):
    return jnp.array([x[0] + 0.5 * (x[0] - x[1]) ** 3 - 1.0, 0.5 * (x[1] - x[0]) ** 3 + x[1]])


def _rosen(x):
    return jnp.array([10.0 * (x[1] - x[0] ** 2), 1.0 - x[0]])


def _broyden_tridiagonal(x):
    xp = jnp.concatenate([x[1:], jnp.zeros(1)])
    xm = jnp.concatenate([jnp.zeros(1), x[:-1]])
    return (3.0 - 2.0 * x) * x - xm - 2.0 * xp + 1.0


def _powell_badly_scaled(x):  # MINPACK's test problem 3
    return jnp.array([1e4 * x[0] * x[1] - 1.0, jnp.exp(-x[0]) + jnp.exp(-x[1]) - 1.0001])


def _scipy_tests(x):  # scipy/optimize/tests/test__root.py's TestRoot problem
    return jnp.array([x[0] ** 2 - 2 * x[1] - 1, x[0] - x[1] ** 2 + 1.5])


def _singular(x):  # Jacobian singular at the root (0, 0)
    return jnp.array([x[0] ** 2, x[1] ** 2])


def _no_root(x):  # x^2 + 1 > 0: hybr stops with status 4 or 5
    return x ** 2 + 1.0


def _trig(x):  # MINPACK's trigonometric function, n = 10
    n = x.size
    s = n - jnp.sum(jnp.cos(x))
    return s + jnp.arange(1, n + 1) * (1 - jnp.cos(x)) - jnp.sin(x)


CASES = {
    "readme": (_readme, np.zeros(2), {}),
    "rosenbrock": (_rosen, np.array([-1.2, 1.0]), {}),
    "broyden n=1": (_broyden_tridiagonal, -np.ones(1), {}),
    "broyden n=3": (_broyden_tridiagonal, -np.ones(3), {}),
    "broyden n=10": (_broyden_tridiagonal, -np.ones(10), {}),
    "powell badly scaled": (_powell_badly_scaled, np.array([0.0, 1.0]), {}),
    "scipy test__root": (_scipy_tests, np.array([2.0, 0.0]), {}),
    "singular jacobian": (_singular, np.array([1.0, 2.0]), {}),
    "no root": (_no_root, np.array([0.5, 1.0]), {}),
    "trigonometric n=10": (_trig, np.full(10, 0.1), {}),
    "xtol": (_broyden_tridiagonal, -np.ones(5), {"xtol": 1e-3}),
    "maxfev": (_rosen, np.array([-1.2, 1.0]), {"maxfev": 6}),
    "factor and diag": (_broyden_tridiagonal, -np.ones(4),
                        {"factor": 0.5, "diag": (1.0, 2.0, 3.0, 4.0)}),
}


def _scipy_root(fun, x0, args=(), jac=None, **kw):
    """SciPy's root on the same JAX function (jitted, flattened as hybr flattens)."""
    shape = np.shape(x0)
    f = jax.jit(lambda x, *a: jnp.ravel(fun(x.reshape(shape), *a)))
    J = jax.jit(jax.jacfwd(f) if jac is None
                else lambda x, *a: jnp.reshape(jac(x.reshape(shape), *a), (x.size, x.size)))
    return scipy.optimize.root(lambda x, *a: np.asarray(f(x, *a)), np.ravel(x0), args=args,
                               jac=lambda x, *a: np.asarray(J(x, *a)), method="hybr", **kw)


def _compiled_root(monkeypatch, fun, x0, **kw):
    """Our root, called once (its general path) and then again with SciPy's general
    path forbidden: the second answer is the compiled loop's."""
    first = root(fun, x0, **kw)
    with monkeypatch.context() as m:
        def forbidden(*a, **k):
            raise AssertionError("the general path ran")
        m.setattr(_run_scipy.scipy.optimize, "root", forbidden)
        again = root(fun, x0, **kw)
    return first, again


def _assert_scipy(ours, ref, exact=True):
    assert int(ours.status) == ref.status and bool(ours.success) == ref.success
    assert ours.message == ref.message
    assert int(ours.nfev) == ref.nfev and int(ours.njev) == ref.njev
    if ref.success:
        np.testing.assert_allclose(ours.x, ref.x, rtol=1e-12 if exact else 1e-10, atol=0)
        np.testing.assert_allclose(ours.fun, ref.fun, rtol=1e-9, atol=1e-14)
    else:
        assert np.all(np.isnan(ours.x))  # on_failure="nan"
    # MINPACK's arithmetic is SciPy's to the bit, but XLA may round the residual in the
    # last bit differently inside the loop than in SciPy's jitted function; near the
    # root the Broyden update of r, fjac and qtf divides such differences by a tiny
    # step (measured: 2.2e-8 relative on r, x 3e-17 apart, test below)
    for field in ("fjac", "r", "qtf"):
        np.testing.assert_allclose(getattr(ours, field), ref[field], rtol=1e-7,
                                   atol=1e-10 if exact else 1e-8, err_msg=field)


@pytest.mark.parametrize("case", CASES)
def test_repeat_call_is_scipys_hybr(monkeypatch, case):
    fun, x0, options = CASES[case]
    ref = _scipy_root(fun, x0, options=options)
    first, again = _compiled_root(monkeypatch, fun, x0, options=options, on_failure="nan")
    _assert_scipy(first, ref)
    _assert_scipy(again, ref)
    assert again.method == "hybr" and int(again.nit) == -1


def test_failures_cover_both_slow_progress_statuses_and_maxfev():
    statuses = {_scipy_root(*CASES[c][:2], options=CASES[c][2]).status
                for c in ("no root", "maxfev")}
    assert 2 in statuses and statuses & {4, 5}


def test_failure_raises_scipys_message(monkeypatch):
    ref = _scipy_root(_no_root, CASES["no root"][1])
    root(_no_root, CASES["no root"][1], on_failure="nan")
    with pytest.raises(SolverError, match="not making good progress") as info:
        _compiled_root(monkeypatch, _no_root, CASES["no root"][1])
    assert ref.message.split("\n")[0] in str(info.value)


def test_numpy_twin_within_rounding(monkeypatch):
    def np_res(x):
        return np.array([x[0] + 0.5 * (x[0] - x[1]) ** 3 - 1.0,
                         0.5 * (x[1] - x[0]) ** 3 + x[1]])

    def np_jac(x):
        d = 1.5 * (x[0] - x[1]) ** 2
        return np.array([[1 + d, -d], [-d, 1 + d]])
    ref = scipy.optimize.root(np_res, np.zeros(2), jac=np_jac, method="hybr")
    _, again = _compiled_root(monkeypatch, _readme, np.zeros(2))
    # the same steps: NumPy's x ** 3 and JAX's differ in the last bit, no more
    _assert_scipy(again, ref, exact=False)


def test_args_and_user_jacobian(monkeypatch):
    def fun(x, a, b):
        return jnp.array([x[0] ** 3 + a * x[1] - 1.0, b * x[1] - jnp.sin(x[0])])

    def jac(x, a, b):
        return jnp.array([[3 * x[0] ** 2, a], [-jnp.cos(x[0]), b]])
    ref = _scipy_root(fun, np.array([0.5, 0.5]), args=(2.0, 3.0), jac=jac)
    _, again = _compiled_root(monkeypatch, fun, np.array([0.5, 0.5]), args=(2.0, 3.0),
                              jac=jac)
    _assert_scipy(again, ref)


def test_changed_closure_and_fresh_lambda_each_call(monkeypatch):
    x0 = np.array([0.3])
    a0 = jnp.float64(0.5)
    root(lambda x: x ** 3 + a0 * x - 1.0, x0)  # the structure (a closure), seen once
    for a in (jnp.float64(1.0), jnp.float64(2.0), jnp.float64(5.0)):
        # (at a = 5 SciPy's jitted residual and the loop's differ in the last bit near
        # the root: r 2.2e-8 relative apart, x 3e-17)
        ref = _scipy_root(lambda x, a: x ** 3 + a * x - 1.0, x0, args=(a,))
        with monkeypatch.context() as m:
            m.setattr(_run_scipy.scipy.optimize, "root",
                      lambda *a, **k: pytest.fail("the general path ran"))
            sol = root(lambda x: x ** 3 + a * x - 1.0, x0)  # a fresh lambda, new value
        x = float(sol.x[0])
        assert abs(x ** 3 + float(a) * x - 1.0) < 1e-12
        _assert_scipy(sol, ref)


def test_2d_x0_is_flattened_as_scipy(monkeypatch):
    x0 = np.array([[0.5, 1.5], [2.5, 3.5]])
    target = np.arange(1.0, 5.0).reshape(2, 2)

    def fun(x):
        assert x.ndim == 1  # SciPy's hybr hands fun the flat x
        return x ** 3 - target.ravel()
    ref = _scipy_root(fun, x0.ravel())
    _, again = _compiled_root(monkeypatch, fun, x0)
    assert again.x.shape == (4,)
    _assert_scipy(again, ref)


def test_traced_calls_keep_the_general_path():
    def solve(a):
        return root(lambda x: x ** 3 + a * x - 1.0, jnp.array([0.3])).x[0]
    eager = [float(solve(2.0)) for _ in range(3)]
    assert eager[0] == eager[1] == eager[2]
    assert float(jax.jit(solve)(2.0)) == pytest.approx(eager[0], rel=1e-12)
    x = eager[0]
    assert float(jax.grad(solve)(2.0)) == pytest.approx(-x / (3 * x ** 2 + 2.0), rel=1e-9)


def test_options_it_does_not_reproduce_fall_back(monkeypatch):
    x0 = np.array([-1.2, 1.0])
    kw = dict(options={"band": (1, 1)})  # only SciPy's hybrd uses band
    for _ in range(2):
        sol = root(_rosen, x0, **kw)
    assert sol.success
    with monkeypatch.context() as m:
        m.setattr(_run_scipy.scipy.optimize, "root",
                  lambda *a, **k: pytest.fail("the general path ran"))
        with pytest.raises(pytest.fail.Exception):
            root(_rosen, x0, **kw)


def test_wrong_size_residual_gets_scipys_error():
    def fun(x):
        return jnp.concatenate([x, x])
    for _ in range(2):
        with pytest.raises(TypeError, match="mismatch between the input and output shape"):
            root(fun, np.ones(2))


def test_without_the_extension_the_general_path_answers(monkeypatch):
    monkeypatch.setattr(_hybrj, "available", lambda: False)
    ref = _scipy_root(_rosen, np.array([-1.2, 1.0]))
    for _ in range(3):
        _assert_scipy(root(_rosen, np.array([-1.2, 1.0])), ref)


@pytest.mark.parametrize("target", ["jaxbridge_hybrj_after_fun", "jaxbridge_hybrj_after_jac"])
def test_steps_refuse_a_state_of_the_wrong_size(target):
    n = 3
    shapes = (jax.ShapeDtypeStruct((5,), jnp.float64), jax.ShapeDtypeStruct((12,), jnp.int32))
    value = jnp.ones(n if target.endswith("fun") else (n, n))
    call = jax.ffi.ffi_call(target, shapes)
    with pytest.raises(Exception, match=f"{target}: argument 'state': expected 39 elements"):
        jax.block_until_ready(call(jnp.zeros(5), jnp.zeros(12, jnp.int32), value))
    with pytest.raises(Exception, match=f"{target}: argument 'istate': expected int32"):
        jax.block_until_ready(call(jnp.zeros(5), jnp.zeros(12), value))


def test_changed_python_float_closure_gives_the_new_root():
    # a closed-over Python float is part of the trace: each new value is a new
    # configuration (SciPy's loop on its first sight), never a stale compiled one
    x0 = np.array([0.3])
    for a in (1.0, 2.0, 1.0, 2.0, 5.0):
        x = float(root(lambda x: x ** 3 + a * x - 1.0, x0).x[0])
        assert abs(x ** 3 + a * x - 1.0) < 1e-12


def test_float32_x0_as_scipys_loop_gives_it(monkeypatch):
    x0 = np.array([-1.2, 1.0], np.float32)
    general = root(_rosen, x0, stepping="scipy")
    _, again = _compiled_root(monkeypatch, _rosen, x0)
    assert again.x.dtype == np.float32 and again.fun.dtype == general.fun.dtype
    np.testing.assert_array_equal(again.x, general.x)
    assert int(again.nfev) == int(general.nfev) and int(again.status) == int(general.status)
    np.testing.assert_allclose(again.r, general.r, rtol=1e-7)
