"""jaxbridge.scipy.optimize takes SciPy's arguments as SciPy does: method names in any
case, scalar x0 and x_scale, and SciPy's exception types for bad input -- each checked
against the installed SciPy's own behaviour."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.optimize
import scipy.sparse
import scipy.sparse.linalg

from jaxbridge.scipy.optimize import least_squares, minimize, root
from jaxbridge.scipy.sparse.linalg import spsolve


def quartic(x, c):
    return jnp.sum((x - c) ** 2) + 0.1 * jnp.sum(x ** 4)


def quartic_np(x, c):
    return np.sum((x - c) ** 2) + 0.1 * np.sum(x ** 4)


C = np.array([1.0, -2.0])


@pytest.mark.parametrize("given, canonical", [
    ("l-bfgs-b", "L-BFGS-B"), ("nelder-mead", "Nelder-Mead"), ("NELDER-MEAD", "Nelder-Mead"),
    ("tnc", "TNC"), ("newton-cg", "Newton-CG"), ("cg", "CG")])
def test_minimize_method_names_in_any_case_run_as_the_canonical_method(given, canonical):
    """SciPy lower-cases the method name; ours runs the same method, with its exact
    Hessian for 'newton-cg' (same iterates and counts as 'Newton-CG'), and agrees with
    SciPy's minimum."""
    ours = minimize(quartic, jnp.zeros(2), args=(jnp.asarray(C),), method=given, tol=1e-10)
    same = minimize(quartic, jnp.zeros(2), args=(jnp.asarray(C),), method=canonical, tol=1e-10)
    assert (int(ours.nfev), int(ours.njev), int(ours.nit)) == \
        (int(same.nfev), int(same.njev), int(same.nit))
    np.testing.assert_array_equal(ours.x, same.x)
    jac = None if canonical in ("Nelder-Mead",) else (lambda x, c: 2 * (x - c) + 0.4 * x ** 3)
    hess = (lambda x, c: np.diag(2 + 1.2 * x ** 2)) if canonical == "Newton-CG" \
        else None
    ref = scipy.optimize.minimize(quartic_np, np.zeros(2), args=(C,), method=given, jac=jac,
                                  hess=hess, tol=1e-10)
    np.testing.assert_allclose(ours.x, ref.x, atol=1e-4)


def test_newton_cg_lower_case_uses_the_exact_hessian():
    """'newton-cg' once reached SciPy without a Hessian (SciPy then differences the
    gradient): the counts equal those of SciPy given the exact Hessian-vector product."""
    ours = minimize(quartic, jnp.zeros(2), args=(jnp.asarray(C),), method="newton-cg")
    ref = scipy.optimize.minimize(quartic_np, np.zeros(2), args=(C,), method="newton-cg",
                                  jac=lambda x, c: 2 * (x - c) + 0.4 * x ** 3,
                                  hessp=lambda x, v, c: (2 + 1.2 * x ** 2) * v)
    assert (int(ours.nfev), int(ours.njev), int(ours.nit)) == (ref.nfev, ref.njev, ref.nit)
    np.testing.assert_allclose(ours.x, ref.x, rtol=1e-10)


def test_lower_case_bounded_method_takes_bounds_and_errors_name_the_canonical_method():
    """'powell' with bounds runs (SciPy's Powell takes bounds), with the gradient flowing
    to the active bound; a method without bounds is named as SciPy spells it."""
    bounds = [(0.0, 0.5), (-1.0, 3.0)]
    ours = minimize(quartic, jnp.zeros(2), args=(jnp.asarray(C),), method="powell",
                    bounds=bounds, options={"xtol": 1e-10, "ftol": 1e-14})
    ref = scipy.optimize.minimize(quartic_np, np.zeros(2), args=(C,), method="powell",
                                  bounds=bounds, options={"xtol": 1e-10, "ftol": 1e-14})
    np.testing.assert_allclose(ours.x, ref.x, atol=1e-6)
    hi = jax.grad(lambda b: minimize(quartic, jnp.zeros(2), args=(jnp.asarray(C),),
                                     method="powell", bounds=[(0.0, b), (-1.0, 3.0)]).x[0])(0.5)
    assert float(hi) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="method 'BFGS' does not take bounds"):
        minimize(quartic, jnp.zeros(2), args=(jnp.asarray(C),), method="bfgs", bounds=bounds)


@pytest.mark.parametrize("method", ["HYBR", "LM", "Df-Sane", "KRYLOV"])
def test_root_method_names_in_any_case(method):
    """root's 'HYBR' gets JAX's Jacobian as 'hybr' does (same counts), 'Df-Sane' runs
    compiled as 'df-sane' does (SciPy itself takes these spellings); all find SciPy's root."""
    def f(x):
        return x ** 3 + 2.0 * x - jnp.array([1.0, 2.0])
    ours = root(f, jnp.zeros(2), method=method, tol=1e-12)
    same = root(f, jnp.zeros(2), method=method.lower(), tol=1e-12)
    assert (int(ours.nfev), int(ours.njev)) == (int(same.nfev), int(same.njev))
    assert scipy.optimize.root(np.cos, np.ones(1), method=method).success  # SciPy's case rule
    ref = scipy.optimize.root(lambda x: x ** 3 + 2.0 * x - np.array([1.0, 2.0]), np.zeros(2),
                              method="hybr", tol=1e-12)
    np.testing.assert_allclose(ours.x, ref.x, atol=1e-6)


def test_root_upper_case_hybr_uses_jax_jacobian():
    """'HYBR' once reached SciPy without a Jacobian (finite differences, njev 0)."""
    ours = root(lambda x: x ** 3 - 2.0, jnp.ones(1), method="HYBR")
    assert int(ours.njev) > 0


@pytest.mark.parametrize("solve", [
    lambda x0, a: root(lambda x: x ** 3 + a * x - 1.0, x0, stepping="scipy"),
    lambda x0, a: root(lambda x: x ** 3 + a * x - 1.0, x0, method="df-sane", tol=1e-12),
    lambda x0, a: minimize(lambda x: jnp.sum((x - a) ** 2 + 0.1 * x ** 4), x0),
    lambda x0, a: least_squares(lambda x: x ** 3 + a * x - 1.0, x0)],
    ids=["root", "root-compiled", "minimize", "least_squares"])
def test_scalar_x0_gives_shape_1_results_with_gradients(solve):
    """SciPy returns x of shape (1,) for a scalar x0; so do we, and jax.grad flows
    through res.x[0] (checked against central differences)."""
    res = solve(0.5, 2.0)
    assert res.x.shape == (1,)
    g = jax.grad(lambda a: solve(0.5, a).x[0])(2.0)
    h = 1e-5
    fd = (solve(0.5, 2.0 + h).x[0] - solve(0.5, 2.0 - h).x[0]) / (2 * h)
    assert float(g) == pytest.approx(float(fd), rel=1e-5)


def test_scalar_x0_shape_matches_scipy():
    ref = [scipy.optimize.root(lambda x: x ** 3 - 2.0, 1.0).x.shape,
           scipy.optimize.minimize(lambda x: np.sum((x - 1.0) ** 2), 0.0).x.shape,
           scipy.optimize.least_squares(lambda x: x - 1.0, 0.0).x.shape]
    ours = [root(lambda x: x ** 3 - 2.0, 1.0).x.shape,
            minimize(lambda x: jnp.sum((x - 1.0) ** 2), 0.0).x.shape,
            least_squares(lambda x: x - 1.0, 0.0).x.shape]
    assert ours == ref == [(1,)] * 3


def test_scalar_x_scale_with_several_variables():
    """SciPy broadcasts a scalar x_scale; the fit equals SciPy's (same counts)."""
    t = np.linspace(0.0, 1.0, 6)

    def residual(th):
        return th[0] * jnp.exp(-th[1] * t) + th[2] - 2.0 * np.exp(-1.5 * t) - 0.5
    ours = least_squares(residual, jnp.ones(3), x_scale=2.0)
    ref = scipy.optimize.least_squares(lambda th: np.asarray(residual(th)), np.ones(3),
                                       x_scale=2.0, jac=lambda th: np.asarray(
                                           jax.jacfwd(residual)(jnp.asarray(th))))
    np.testing.assert_allclose(ours.x, ref.x, rtol=1e-7)
    assert int(ours.nfev) == ref.nfev


def _f(x):
    return np.sum((np.asarray(x) - 1.0) ** 2)


def _r(x):
    return np.asarray(x) ** 3 - 2.0


BAD_INPUT = {  # name: (SciPy's call, ours) with the same bad input
    "minimize unknown method": (
        lambda: scipy.optimize.minimize(_f, np.zeros(2), method="foo"),
        lambda: minimize(lambda x: jnp.sum((x - 1.0) ** 2), jnp.zeros(2), method="foo")),
    "root unknown method": (
        lambda: scipy.optimize.root(_r, np.ones(1), method="foo"),
        lambda: root(lambda x: x ** 3 - 2.0, jnp.ones(1), method="foo")),
    "least_squares unknown method": (
        lambda: scipy.optimize.least_squares(_r, np.ones(1), method="foo"),
        lambda: least_squares(lambda x: x ** 3 - 2.0, jnp.ones(1), method="foo")),
    "least_squares method case": (
        lambda: scipy.optimize.least_squares(_r, np.ones(1), method="TRF"),
        lambda: least_squares(lambda x: x ** 3 - 2.0, jnp.ones(1), method="TRF")),
    "least_squares unknown loss": (
        lambda: scipy.optimize.least_squares(_r, np.ones(1), loss="foo"),
        lambda: least_squares(lambda x: x ** 3 - 2.0, jnp.ones(1), loss="foo")),
    "least_squares bounds of 3": (
        lambda: scipy.optimize.least_squares(_r, np.ones(2), bounds=(0, 1, 2)),
        lambda: least_squares(lambda x: x ** 3 - 2.0, jnp.ones(2), bounds=(0, 1, 2))),
    "least_squares bounds shape": (
        lambda: scipy.optimize.least_squares(_r, np.ones(2), bounds=([0, 0, 0], [3, 3, 3])),
        lambda: least_squares(lambda x: x ** 3 - 2.0, jnp.ones(2),
                              bounds=([0, 0, 0], [3, 3, 3]))),
    "least_squares x0 2-D": (
        lambda: scipy.optimize.least_squares(lambda x: np.ravel(x) - 1, np.zeros((2, 2))),
        lambda: least_squares(lambda x: jnp.ravel(x) - 1, jnp.zeros((2, 2)))),
    "least_squares negative x_scale": (
        lambda: scipy.optimize.least_squares(_r, np.ones(1), x_scale=-1.0),
        lambda: least_squares(lambda x: x ** 3 - 2.0, jnp.ones(1), x_scale=-1.0)),
    "least_squares lm with bounds": (
        lambda: scipy.optimize.least_squares(_r, np.ones(1), method="lm", bounds=(0, 2)),
        lambda: least_squares(lambda x: x ** 3 - 2.0, jnp.ones(1), method="lm",
                              bounds=(0, 2))),
    "least_squares x0 outside bounds": (
        lambda: scipy.optimize.least_squares(_r, 5 * np.ones(1), bounds=(0, 2)),
        lambda: least_squares(lambda x: x ** 3 - 2.0, 5 * jnp.ones(1), bounds=(0, 2))),
    "minimize x0 2-D": (
        lambda: scipy.optimize.minimize(_f, np.zeros((2, 2))),
        lambda: minimize(lambda x: jnp.sum((x - 1.0) ** 2), jnp.zeros((2, 2)))),
    "minimize bounds length": (
        lambda: scipy.optimize.minimize(_f, np.ones(2), bounds=[(0, 1)] * 3),
        lambda: minimize(lambda x: jnp.sum((x - 1.0) ** 2), jnp.ones(2),
                         bounds=[(0, 1)] * 3)),
    "minimize bounds not a sequence": (
        lambda: scipy.optimize.minimize(_f, np.ones(2), bounds=5),
        lambda: minimize(lambda x: jnp.sum((x - 1.0) ** 2), jnp.ones(2), bounds=5)),
    "spsolve b of the wrong length": (
        lambda: scipy.sparse.linalg.spsolve(scipy.sparse.csc_matrix(2 * np.eye(3)),
                                            np.ones(4)),
        lambda: spsolve(scipy.sparse.csc_matrix(2 * np.eye(3)), jnp.ones(4))),
    "spsolve A not square": (
        lambda: scipy.sparse.linalg.spsolve(scipy.sparse.csc_matrix(np.ones((2, 3))),
                                            np.ones(2)),
        lambda: spsolve(scipy.sparse.csc_matrix(np.ones((2, 3))), jnp.ones(2))),
    "spsolve A a string": (
        lambda: scipy.sparse.linalg.spsolve("a", np.ones(2)),
        lambda: spsolve("a", jnp.ones(2))),
    "spsolve COO index outside": (
        lambda: scipy.sparse.linalg.spsolve(
            scipy.sparse.csc_matrix(([1.0, 1.0], ([0, 1], [0, 2])), shape=(2, 2)),
            np.ones(2)),
        lambda: spsolve((jnp.ones(2), (jnp.array([0, 1]), jnp.array([0, 2]))), jnp.ones(2))),
}
SPSOLVE_ARGUMENT = {"spsolve b of the wrong length": "b's 4 rows",
                    "spsolve A not square": "A must be square",
                    "spsolve A a string": "A must be",
                    "spsolve COO index outside": "A's column indices"}


@pytest.mark.parametrize("name", list(BAD_INPUT))
def test_bad_input_raises_scipys_exception_type(name):
    """The same bad input: SciPy's exception type, ours with its own clear message."""
    scipy_call, ours = BAD_INPUT[name]
    with pytest.raises(Exception) as scipy_exc:
        scipy_call()
    with pytest.raises(type(scipy_exc.value)) as our_exc:
        ours()
    assert type(our_exc.value) is type(scipy_exc.value)
    if name in SPSOLVE_ARGUMENT:  # the message names spsolve and the argument
        assert "jaxbridge.scipy.sparse.linalg.spsolve" in str(our_exc.value)
        assert SPSOLVE_ARGUMENT[name] in str(our_exc.value)


@pytest.mark.parametrize("method", ["hybr", "lm", "broyden1", "df-sane"])
def test_root_2d_x0_as_scipy(method):
    """SciPy's hybr and lm flatten x0 (fun sees x of shape (4,), x comes back 1-D); its
    other methods keep x's shape; `fun` comes back 1-D from every method. Ours the same,
    values equal, gradients flow."""
    seen = []

    def f_np(x):
        seen.append(np.shape(x))
        return x ** 3 + 2.0 * x - np.arange(1.0, 1.0 + np.size(x)).reshape(np.shape(x))

    def f(x, a=2.0):
        return x ** 3 + a * x - jnp.arange(1.0, 1.0 + x.size).reshape(x.shape)
    ref = scipy.optimize.root(f_np, np.ones((2, 2)), method=method)
    ours = root(f, jnp.ones((2, 2)), method=method)
    assert ours.x.shape == ref.x.shape and ours.fun.shape == ref.fun.shape
    if method in ("hybr", "lm"):
        assert set(seen) == {(4,)}
    np.testing.assert_allclose(ours.x, ref.x, rtol=1e-5)
    g = jax.grad(lambda a: jnp.ravel(root(lambda x: f(x, a), jnp.ones((2, 2)),
                                          method=method).x)[0])(2.0)
    x1 = float(np.ravel(ours.x)[0])
    assert float(g) == pytest.approx(-x1 / (3 * x1 ** 2 + 2.0), rel=1e-5)


def test_callable_loss_is_still_refused_as_unsupported():
    """SciPy takes a callable loss; ours has no JAX form of it and says so."""
    with pytest.raises(NotImplementedError, match="least_squares: `loss`"):
        least_squares(lambda x: x - 1.0, jnp.ones(1), loss=lambda z: np.vstack([z] * 3))


def test_result_is_scipys_optimize_result_a_dict():
    """SciPy's OptimizeResult is a dict with attribute access; ours is one (SciPy's own
    class), with SciPy's keys for the fields computed, and reads absent ones as None."""
    ours = minimize(quartic, jnp.zeros(2), args=(jnp.asarray(C),))
    ref = scipy.optimize.minimize(quartic_np, np.zeros(2), args=(C,))
    assert isinstance(ours, dict) and isinstance(ours, scipy.optimize.OptimizeResult)
    assert ours["x"] is ours.x and ours["fun"] is ours.fun
    assert set(ref.keys()) <= set(ours.keys())
    assert ours.message == ours["message"] == ref.message
    newton = minimize(quartic, jnp.zeros(2), args=(jnp.asarray(C),), method="Newton-CG")
    assert newton.hess_inv is None and "hess_inv" not in newton  # (as in SciPy's)
    with pytest.raises(AttributeError):
        _ = ours.no_such_field


def test_brute_finishes_with_our_minimize():
    """scipy.optimize.brute(..., finish=minimize) reads SciPy's OptimizeResult."""
    def f(x):
        return (x[0] - 0.3) ** 2 + (x[1] + 0.7) ** 2 + 0.1 * jnp.sum(x ** 4)
    ranges = ((-1.0, 1.0), (-1.0, 1.0))
    ours = scipy.optimize.brute(f, ranges, Ns=5, finish=minimize)
    ref = scipy.optimize.brute(lambda x: float(f(jnp.asarray(x))), ranges, Ns=5,
                               finish=scipy.optimize.minimize)
    np.testing.assert_allclose(ours, ref, atol=1e-5)


def test_result_stays_a_pytree_under_jit_vmap_and_grad():
    """The dict is a JAX pytree: returned from jit (same keys), batched by vmap, and
    differentiated through res["x"] (against central differences)."""
    def solve(c):
        return minimize(quartic, jnp.zeros(2), args=(c,), method="Newton-CG", tol=1e-12)
    c = jnp.asarray(C)
    eager, jitted = solve(c), jax.jit(solve)(c)
    # (SciPy's message is a string, which jit cannot return from a traced solve)
    assert type(jitted) is type(eager) and list(jitted) == [k for k in eager if k != "message"]
    np.testing.assert_allclose(jitted["x"], eager["x"], rtol=1e-10)
    batched = jax.vmap(solve)(jnp.stack([c, 2 * c]))
    np.testing.assert_allclose(batched.x[1], solve(2 * c).x, rtol=1e-8)
    g = jax.grad(lambda c: solve(c)["x"][0])(c)
    h = 1e-5
    e = jnp.array([h, 0.0])
    fd = (solve(c + e)["x"][0] - solve(c - e)["x"][0]) / (2 * h)
    assert float(g[0]) == pytest.approx(float(fd), rel=1e-5)
    root_res = jax.jit(lambda a: root(lambda x: x ** 3 + a * x - 1.0, jnp.zeros(1)))(2.0)
    assert root_res.method == "hybr"


@pytest.mark.parametrize("method", ["hybr", "HYBR", "lm", "df-sane", "krylov"])
def test_root_result_names_its_method_as_scipy_does(method):
    def f(x):
        return x ** 3 - 2.0
    ours = root(f, jnp.ones(1), method=method)
    ref = scipy.optimize.root(lambda x: x ** 3 - 2.0, np.ones(1), method=method)
    assert ours.method == ref.method
    assert ours["method"] == ref["method"]


def test_minimize_jac_is_the_gradient_at_the_minimum():
    """minimize's `jac` as SciPy's: the gradient at x (here exact, from JAX), and
    differentiable (its derivative in c against central differences)."""
    ours = minimize(quartic, jnp.zeros(2), args=(jnp.asarray(C),), method="Newton-CG",
                    tol=1e-12)
    ref = scipy.optimize.minimize(quartic_np, np.zeros(2), args=(C,), method="Newton-CG",
                                  tol=1e-12, jac=lambda x, c: 2 * (x - c) + 0.4 * x ** 3,
                                  hessp=lambda x, v, c: (2 + 1.2 * x ** 2) * v)
    np.testing.assert_allclose(ours.jac, ref.jac, atol=1e-8)
    # (at the minimum the gradient is rounding-sized, ~1e-13: compiled and NumPy
    # arithmetic round it differently by ~1e-16)
    np.testing.assert_allclose(ours.jac, 2 * (ours.x - C) + 0.4 * ours.x ** 3, rtol=1e-12,
                               atol=1e-15)

    def jac_at_minimum(c):  # grad_x f(x*(c), c) = 0 for every c: H dx*/dc - 2 I = 0
        return minimize(quartic, jnp.zeros(2), args=(c,), method="Newton-CG", tol=1e-12).jac
    d = jax.jacobian(jac_at_minimum)(jnp.asarray(C))
    np.testing.assert_allclose(d, np.zeros((2, 2)), atol=1e-8)


# SciPy's result keys left to the constraints' support in minimize: SLSQP's Lagrange
# multipliers and trust-constr's constraint report
CONSTRAINT_KEYS = {"SLSQP": {"multipliers"},
                   "trust-constr": {"niter", "lagrangian_grad", "grad", "v", "tr_radius",
                                    "optimality", "constr_nfev", "execution_time", "method",
                                    "constr_penalty", "constr_violation", "constr_njev",
                                    "cg_niter", "constr", "nhev", "cg_stop_cond",
                                    "constr_nhev"}}
GRADIENT_FREE = ("Nelder-Mead", "Powell", "COBYLA", "COBYQA")
EXACT_HESSIAN = ("dogleg", "trust-exact", "trust-constr")  # ours: JAX's matrix
HESSIAN_PRODUCT = ("Newton-CG", "trust-ncg", "trust-krylov")  # ours: JAX's products


def _quartic_derivatives():
    g = lambda x: 2 * (x - C) + 0.4 * x ** 3  # noqa: E731
    h = lambda x: np.diag(2 + 1.2 * x ** 2)  # noqa: E731
    return g, h


@pytest.mark.parametrize("method", ["Nelder-Mead", "Powell", "CG", "BFGS", "Newton-CG",
                                    "L-BFGS-B", "TNC", "COBYLA", "COBYQA", "SLSQP",
                                    "trust-constr", "dogleg", "trust-ncg", "trust-exact",
                                    "trust-krylov"])
def test_minimize_result_has_scipys_keys_and_message(method):
    """Every key of SciPy's result for the method (SciPy given the exact derivatives
    ours uses), with SciPy's own message and the counters SciPy reports."""
    g, h = _quartic_derivatives()
    ref = scipy.optimize.minimize(
        lambda x: quartic_np(x, C), np.zeros(2), method=method,
        jac=None if method in GRADIENT_FREE else g,
        hess=h if method in EXACT_HESSIAN else None,
        hessp=(lambda x, v: h(x) @ v) if method in HESSIAN_PRODUCT else None)
    ours = minimize(lambda x: quartic(x, jnp.asarray(C)), jnp.zeros(2), method=method)
    missing = set(ref.keys()) - set(ours.keys())
    assert missing == CONSTRAINT_KEYS.get(method, set()), missing
    assert ours.message == ours["message"] == ref.message
    for key in ("nfev", "njev", "nit", "nhev"):
        if key in ref and key not in CONSTRAINT_KEYS.get(method, ()):
            assert int(ours[key]) == pytest.approx(int(ref[key]), abs=3), key
    if "hess" in ref:
        np.testing.assert_allclose(ours.hess, ref.hess, rtol=1e-8)
    if "maxcv" in ref:
        assert float(ours.maxcv) == ref.maxcv


def test_powell_direc_and_nelder_mead_final_simplex_are_scipys():
    """The same run as SciPy's (the same function values): the same direction set and
    final simplex, to rounding."""
    f = lambda x: quartic_np(x, C)  # noqa: E731
    ours = minimize(lambda x: quartic(x, jnp.asarray(C)), jnp.zeros(2), method="Powell")
    ref = scipy.optimize.minimize(f, np.zeros(2), method="Powell")
    np.testing.assert_allclose(ours.direc, ref.direc, rtol=1e-10, atol=1e-14)
    assert ours.direc.shape == (2, 2)
    ours = minimize(lambda x: quartic(x, jnp.asarray(C)), jnp.zeros(2), method="nelder-mead")
    ref = scipy.optimize.minimize(f, np.zeros(2), method="Nelder-Mead")
    assert len(ours.final_simplex) == 2
    for a, b in zip(ours.final_simplex, ref.final_simplex):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-14)
    ours = minimize(lambda x: quartic(x, jnp.asarray(C)), jnp.zeros(2), method="BFGS")
    ref = scipy.optimize.minimize(f, np.zeros(2), method="BFGS",
                                  jac=_quartic_derivatives()[0])
    np.testing.assert_allclose(ours.hess_inv, ref.hess_inv, rtol=1e-6)
    ours = minimize(lambda x: quartic(x, jnp.asarray(C)), jnp.zeros(2), method="L-BFGS-B")
    ref = scipy.optimize.minimize(f, np.zeros(2), method="L-BFGS-B",
                                  jac=_quartic_derivatives()[0])
    np.testing.assert_allclose(ours.hess_inv, ref.hess_inv.todense(), rtol=1e-6)


def _system(x):
    return x ** 3 + 2.0 * x - jnp.array([1.0, 2.0])


@pytest.mark.parametrize("method", ["hybr", "lm", "broyden1", "broyden2", "anderson",
                                    "diagbroyden", "krylov", "df-sane"])
def test_root_result_has_scipys_keys_and_message(method):
    jac = (lambda x: np.diag(3 * x ** 2 + 2.0)) if method in ("hybr", "lm") else None
    ref = scipy.optimize.root(lambda x: np.asarray(_system(jnp.asarray(x))), np.ones(2),
                              method=method, jac=jac)
    assert ref.success  # (from zeros SciPy's krylov stops at maxiter; ours converges)
    ours = root(_system, jnp.ones(2), method=method)
    assert set(ref.keys()) <= set(ours.keys())
    assert ours.message == ref.message
    for key in set(ref.keys()) & {"fjac", "r", "qtf", "ipvt", "cov_x"}:
        np.testing.assert_allclose(ours[key], ref[key], rtol=1e-6, atol=1e-12, err_msg=key)


@pytest.mark.parametrize("method", ["trf", "dogbox", "lm"])
def test_least_squares_result_has_scipys_keys_and_message(method):
    ref = scipy.optimize.least_squares(lambda x: np.asarray(_system(jnp.asarray(x))),
                                       np.zeros(2), method=method,
                                       jac=lambda x: np.diag(3 * x ** 2 + 2.0))
    ours = least_squares(_system, jnp.zeros(2), method=method)
    assert set(ref.keys()) <= set(ours.keys())
    assert ours.message == ref.message
    assert (int(ours.status), int(ours.nfev), int(ours.njev)) == (ref.status, ref.nfev,
                                                                  ref.njev)


def test_message_under_jit_is_derived_and_fields_batch_under_vmap():
    """A string cannot be traced: under jit the result has no `message` key and reads a
    text derived from `status`; the method's fields are arrays, batched by vmap and
    returned from jit."""
    def solve(c):
        return minimize(quartic, jnp.zeros(2), args=(c,), method="Powell")
    eager, jitted = solve(jnp.asarray(C)), jax.jit(solve)(jnp.asarray(C))
    assert "message" in eager and "message" not in jitted
    assert isinstance(jitted.message, str) and "status 0" in jitted.message
    np.testing.assert_allclose(jitted.direc, eager.direc, rtol=1e-12)
    batched = jax.vmap(solve)(jnp.stack([jnp.asarray(C), 2 * jnp.asarray(C)]))
    assert batched.direc.shape == (2, 2, 2)
    np.testing.assert_allclose(batched.direc[1], solve(2 * jnp.asarray(C)).direc,
                               rtol=1e-12)
    g = jax.grad(lambda c: solve(c).x[0])(jnp.asarray(C))  # the fields do not block grad
    assert np.all(np.isfinite(g))
    # SciPy's internals have no derivative rule: NaN in both modes, never a silent zero
    assert np.all(np.isnan(jax.grad(lambda c: solve(c).direc[0, 0])(jnp.asarray(C))))
    tangent = jax.jvp(lambda c: solve(c).direc, (jnp.asarray(C),), (jnp.ones(2),))[1]
    assert np.all(np.isnan(tangent))


@pytest.mark.parametrize("loss", ["soft_l1", "huber", "cauchy", "arctan", "linear"])
@pytest.mark.parametrize("method,bounds", [("trf", None), ("trf", ([0.0, 1.4], [10.0, 10.0])),
                                           ("dogbox", None)])
def test_least_squares_jac_is_scaled_by_the_robust_loss_as_scipys(loss, method, bounds):
    """SciPy returns the Jacobian with its rows scaled by the loss's weights (it was the
    raw Jacobian: 0.5-0.7 apart); `grad`, `cost`, `fun`, `optimality` as SciPy's."""
    t = np.linspace(0.0, 3.0, 12)
    data = 2.0 * np.exp(-1.3 * t) + 0.3 * np.sin(7 * t)
    data[3] += 2.0  # an outlier: the robust losses weigh it down

    def residual(th):
        return th[0] * jnp.exp(-th[1] * t) - data
    kw = dict(loss=loss, f_scale=0.5, method=method, xtol=1e-14, ftol=1e-14, gtol=1e-14)
    if bounds is not None:
        kw["bounds"] = bounds
    ref = scipy.optimize.least_squares(
        lambda th: np.asarray(residual(jnp.asarray(th))), np.array([1.0, 1.5]),
        jac=lambda th: np.asarray(jax.jacfwd(residual)(jnp.asarray(th))), **kw)
    ours = least_squares(residual, jnp.array([1.0, 1.5]), **kw)
    assert ref.success and ours.success
    np.testing.assert_allclose(ours.x, ref.x, rtol=1e-8)
    for key in ("jac", "fun", "grad"):
        np.testing.assert_allclose(ours[key], ref[key], rtol=1e-6, atol=1e-8, err_msg=key)
    assert float(ours.cost) == pytest.approx(ref.cost, rel=1e-10)
    assert float(ours.optimality) == pytest.approx(ref.optimality, abs=1e-8)
    if loss != "linear":
        raw = jax.jacfwd(residual)(ours.x)
        assert np.max(np.abs(raw - ours.jac)) > 0.1  # (the scaling is not a no-op here)
    if (loss, method, bounds) != ("cauchy", "trf", None):
        return  # (the derivative of the scaled jac: once, it costs three fits)

    def jac_entry(d):  # differentiable: in the data, against central differences
        return least_squares(lambda th: th[0] * jnp.exp(-th[1] * t) - d,
                             jnp.array([1.0, 1.5]), **kw).jac[3, 0]
    e = np.zeros_like(data)
    e[5] = 1e-6
    fd = (jac_entry(data + e) - jac_entry(data - e)) / 2e-6
    assert float(jax.grad(jac_entry)(jnp.asarray(data))[5]) == pytest.approx(float(fd),
                                                                          rel=1e-4, abs=1e-7)
