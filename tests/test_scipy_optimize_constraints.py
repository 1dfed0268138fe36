"""minimize with `constraints` (SLSQP, trust-constr) and `hess`/`hessp`: SciPy's answers,
derivatives of x* through the KKT conditions of the active set."""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.optimize
from scipy.optimize import LinearConstraint, NonlinearConstraint

from jaxbridge.scipy import SolverError
from jaxbridge.scipy.optimize import minimize

METHODS = ("SLSQP", "trust-constr")
#: trust-constr, an interior method, does not reach 1e-12 on these problems (SciPy's
#: own run neither: "The maximum number of function evaluations is exceeded").
TOL = {"SLSQP": 1e-12, "trust-constr": 1e-9}


def distance(x, p):
    return jnp.sum((x - p) ** 2)


def simplex_forms(method):
    """x >= 0 and sum(x) = 1 in SciPy's forms: dicts, bounds, constraint objects."""
    eq = {"type": "eq", "fun": lambda x: jnp.sum(x) - 1.0}
    return {
        "dicts": dict(constraints=[eq, {"type": "ineq", "fun": lambda x: x}]),
        "bounds": dict(constraints=eq, bounds=[(0, None)] * 3),
        "objects": dict(constraints=(LinearConstraint(np.ones((1, 3)), 1.0, 1.0),
                                     NonlinearConstraint(lambda x: x, 0.0, np.inf))),
        "linear": dict(constraints=LinearConstraint(np.vstack([np.ones(3), np.eye(3)]),
                                                    [1, 0, 0, 0], [1, np.inf, np.inf, np.inf])),
    }


def simplex_projection_jacobian(x):
    """d proj(p)/dp on the support S of x = proj(p): I - 11^T/|S| there, zero elsewhere."""
    s = (np.asarray(x) > 1e-8).astype(float)
    return np.diag(s) - np.outer(s, s) / s.sum()


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("form", [pytest.param("dicts", marks=pytest.mark.slow), "bounds",
                                  "objects", pytest.param("linear", marks=pytest.mark.slow)])
def test_simplex_projection_equals_scipy_and_its_closed_form_derivative(method, form):
    kw = simplex_forms(method)[form]

    tol = TOL[method]

    def project(p):
        return minimize(distance, jnp.full(3, 1 / 3), args=(p,), method=method, tol=tol,
                        **kw).x

    p = jnp.array([0.5, 0.3, -0.4])  # x* = (0.6, 0.4, 0): x_3 >= 0 active
    ref_kw = {k: v for k, v in kw.items() if k != "constraints"}
    ref_cons = simplex_forms(method)[form]["constraints"]
    ref_cons = [ref_cons] if not isinstance(ref_cons, (list, tuple)) else list(ref_cons)
    ref_cons = [_numpy_constraint(c) for c in ref_cons]
    ref = scipy.optimize.minimize(lambda x: np.sum((x - p) ** 2), np.full(3, 1 / 3),
                                  jac=lambda x: 2 * (x - p), method=method, tol=tol,
                                  constraints=ref_cons, **ref_kw)
    assert ref.success
    x = project(p)
    # (SciPy's trust-constr stops 1e-5 short of x* on a LinearConstraint, as here)
    np.testing.assert_allclose(x, ref.x, atol=1e-6 if method == "SLSQP" else 2e-5)
    np.testing.assert_allclose(x, [0.6, 0.4, 0.0], atol=1e-6)
    want = simplex_projection_jacobian([0.6, 0.4, 0.0])
    np.testing.assert_allclose(jax.jacrev(project)(p), want, atol=1e-6)
    np.testing.assert_allclose(jax.jacfwd(project)(p), want, atol=1e-6)


def _numpy_constraint(con):
    """The same constraint for SciPy's own minimize: NumPy values, exact Jacobian (as
    jaxbridge gives SciPy)."""
    def values(f):
        return lambda x: np.asarray(f(jnp.asarray(x)))

    def jacobian(f):
        return lambda x: np.atleast_2d(np.asarray(jax.jacfwd(f)(jnp.asarray(x))))
    if isinstance(con, dict):
        return {**con, "fun": values(con["fun"]), "jac": jacobian(con["fun"])}
    if isinstance(con, NonlinearConstraint):
        return NonlinearConstraint(values(con.fun), con.lb, con.ub, jac=jacobian(con.fun))
    return con


@pytest.mark.parametrize("method", METHODS)
def test_equality_on_a_sphere_with_traced_radius(method):
    """x* = r p/|p| on |x| = r (a NonlinearConstraint whose lb = ub = r^2 is traced):
    dx*/dp = r (I - u u^T)/|p| and dx*/dr = u, u = p/|p|; reverse and forward mode."""
    def on_sphere(p, r):
        con = NonlinearConstraint(lambda x: x @ x, r ** 2, r ** 2)
        return minimize(distance, jnp.array([1.0, 0.0, 0.0]), args=(p,), constraints=con,
                        method=method, tol=TOL[method]).x

    p, r = jnp.array([1.0, 2.0, 2.0]), 0.5
    u = np.asarray(p) / 3.0
    np.testing.assert_allclose(on_sphere(p, r), r * u, atol=1e-7)
    dp, dr = jax.jacrev(on_sphere, argnums=(0, 1))(p, r)
    np.testing.assert_allclose(dp, r * (np.eye(3) - np.outer(u, u)) / 3.0, atol=1e-7)
    np.testing.assert_allclose(dr, u, atol=1e-7)
    _, tangent = jax.jvp(on_sphere, (p, r), (jnp.array([0.0, 1.0, 0.0]), 0.0))
    np.testing.assert_allclose(tangent, (r * (np.eye(3) - np.outer(u, u)) / 3.0)[:, 1],
                               atol=1e-7)


@pytest.mark.parametrize("method", METHODS)
def test_inequality_active_and_inactive_with_dict_args(method):
    """x0 + x1 <= b as an 'ineq' dict with args=(b,): inside, x* = p (identity); outside,
    the projection onto the half plane; the gradient in b is the constraint's."""
    def solve(p, b):
        con = {"type": "ineq", "fun": lambda x, b: b - x[0] - x[1], "args": (b,)}
        return minimize(distance, jnp.zeros(2), args=(p,), constraints=[con],
                        method=method, tol=TOL[method]).x

    inside = jnp.array([0.2, 0.3])
    listed = {"type": "ineq", "fun": lambda x, b: b - x[0] - x[1], "args": [1.0]}
    np.testing.assert_allclose(minimize(distance, jnp.zeros(2), args=(jnp.array([1.0, 0.6]),),
                                        constraints=listed, method=method).x, [0.7, 0.3],
                               atol=1e-5)  # a list of args is unpacked, as SciPy does
    np.testing.assert_allclose(solve(inside, 1.0), inside, atol=1e-6)
    np.testing.assert_allclose(jax.jacrev(solve)(inside, 1.0), np.eye(2), atol=1e-6)
    np.testing.assert_allclose(jax.grad(lambda b: solve(inside, b).sum())(1.0), 0.0,
                               atol=1e-6)
    outside = jnp.array([1.0, 0.6])  # x* = p - 0.3 (1, 1)
    np.testing.assert_allclose(solve(outside, 1.0), [0.7, 0.3], atol=1e-6)
    np.testing.assert_allclose(jax.jacrev(solve)(outside, 1.0),
                               np.eye(2) - 0.5 * np.ones((2, 2)), atol=1e-6)
    np.testing.assert_allclose(jax.grad(lambda b: solve(outside, b)[0])(1.0), 0.5, atol=1e-6)


def hs071_like(x, a):
    """A nonlinear objective with a parameter vector `a` (Hock-Schittkowski 71's shape)."""
    return x[0] * x[3] * (x[0] + x[1] + x[2]) + x[2] + a[0] * x[1] ** 2 + a[1] * x[0]


def hs071_solution(a, c, method="SLSQP", numpy=False, x0=(1.0, 5.0, 5.0, 1.0)):
    """x* of hs071_like s.t. prod(x) >= c, |x|^2 = 40, 1 <= x <= 5."""
    mod = np if numpy else jnp
    cons = [{"type": "ineq", "fun": lambda x: mod.prod(x) - c},
            {"type": "eq", "fun": lambda x: mod.sum(x ** 2) - 40.0}]
    x0 = np.array(x0)
    if numpy:
        res = scipy.optimize.minimize(lambda x: float(hs071_like(x, a)), x0, method=method,
                                      constraints=cons, bounds=[(1, 5)] * 4, tol=1e-9,
                                      options={"maxiter": 500})
        assert res.success, res.message
        return res.x
    return minimize(hs071_like, x0, args=(a,), method=method, constraints=cons,
                    bounds=[(1, 5)] * 4, tol=1e-9, options={"maxiter": 500}).x


def test_mixed_constraints_and_bounds_against_finite_differences_of_scipy():
    """A loss of x* (nonlinear objective, active inequality, equality, an active bound)
    differentiated in the objective's args and a closed-over constraint level, against
    central differences of SciPy's own SLSQP solution."""
    a, c = np.array([0.1, -0.2]), 25.0
    x = hs071_solution(jnp.asarray(a), c)
    ref = hs071_solution(a, c, numpy=True)
    np.testing.assert_allclose(x, ref, atol=1e-7)
    assert abs(ref[0] - 1.0) < 1e-8  # the bound x_0 >= 1 holds

    weights = np.array([1.0, -2.0, 0.5, 3.0])

    def loss(a, c):
        return jnp.dot(weights, hs071_solution(a, c))

    ga, gc = jax.grad(loss, argnums=(0, 1))(jnp.asarray(a), c)
    # SciPy's SLSQP fails on the perturbed problems below tol=1e-9, where its x* holds
    # to ~1e-8: a step of 1e-3, from x*, keeps the differences' noise near 1e-5.
    h = 1e-3

    def scipy_loss(a, c):
        return weights @ hs071_solution(a, c, numpy=True, x0=ref)
    fd_a = [(scipy_loss(a + h * e, c) - scipy_loss(a - h * e, c)) / (2 * h) for e in np.eye(2)]
    fd_c = (scipy_loss(a, c + h) - scipy_loss(a, c - h)) / (2 * h)
    np.testing.assert_allclose(ga, fd_a, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(gc, fd_c, rtol=1e-4, atol=1e-4)
    assert ga[1] == pytest.approx(0.0, abs=1e-12)  # a_1 x_0 with x_0 held by its bound
    assert abs(gc) > 1e-3  # the inequality is active: its level moves x*


def test_jit_grad_in_a_training_loop_and_closed_over_parameters():
    """jit(grad) of a loss through the projection, parameters closed over (not args),
    in a loop of gradient steps: equals the closed form each step."""
    target = jnp.array([0.9, 0.2, 0.1])

    @jax.jit
    def step(p):
        def loss(p):
            con = {"type": "eq", "fun": lambda x: jnp.sum(x) - 1.0}
            x = minimize(lambda x: jnp.sum((x - p) ** 2), jnp.full(3, 1 / 3),
                         bounds=[(0, None)] * 3, constraints=con, tol=1e-12).x
            return jnp.sum((x - target) ** 2), x
        (value, x), g = jax.value_and_grad(loss, has_aux=True)(p)
        return p - 0.5 * g, value, x, g

    p = jnp.array([0.5, 0.3, -0.4])
    for _ in range(3):
        new_p, _, x, g = step(p)
        want = simplex_projection_jacobian(x).T @ (2 * (np.asarray(x) - target))
        np.testing.assert_allclose(g, want, atol=1e-6)
        p = new_p


def test_vmap_over_parameters_with_different_active_sets():
    """One projection per row, each with its own active set (one bound, none, two)."""
    con = {"type": "eq", "fun": lambda x: jnp.sum(x) - 1.0}

    def project(p):
        return minimize(lambda x: jnp.sum((x - p) ** 2), jnp.zeros(3), constraints=con,
                        bounds=[(0, None)] * 3, tol=1e-12).x

    P = jnp.array([[0.5, 0.3, -0.4], [0.2, 0.2, 0.2], [2.0, 0.0, 0.0]])
    X = jax.vmap(project)(P)
    np.testing.assert_allclose(X, [[0.6, 0.4, 0], [1 / 3] * 3, [1, 0, 0]], atol=1e-8)
    for x, J in zip(X, jax.vmap(jax.jacrev(project))(P)):
        np.testing.assert_allclose(J, simplex_projection_jacobian(x), atol=1e-8)


def test_objective_jac_forms_float32_and_a_constraint_jac_that_is_not_called():
    """jac=True (fun returns (f, g)), a jac function closing over p, float32 x0: the same
    projection and derivative; a constraint dict's own 'jac' is not called (JAX's
    Jacobian is exact)."""
    def unused_jac(x):
        raise AssertionError("the constraint's jac was called")

    cons = [{"type": "eq", "fun": lambda x: jnp.sum(x) - 1.0, "jac": unused_jac}]
    bounds = [(0, None)] * 3
    p = jnp.array([0.5, 0.3, -0.4])
    want = simplex_projection_jacobian([0.6, 0.4, 0.0])
    forms = {
        "jac=True": lambda p: minimize(lambda x: (jnp.sum((x - p) ** 2), 2 * (x - p)),
                                       jnp.zeros(3), jac=True, constraints=cons,
                                       bounds=bounds, tol=1e-12).x,
        "jac function": lambda p: minimize(lambda x: jnp.sum((x - p) ** 2), jnp.zeros(3),
                                           jac=lambda x: 2 * (x - p), constraints=cons,
                                           bounds=bounds, tol=1e-12).x,
        "float32": lambda p: minimize(distance, jnp.zeros(3, jnp.float32), args=(p,),
                                      constraints=cons, bounds=bounds, tol=1e-7).x}
    for name, project in forms.items():
        p_in = p.astype(jnp.float32) if name == "float32" else p
        atol = 1e-5 if name == "float32" else 1e-8
        assert project(p_in).dtype == p_in.dtype, name
        np.testing.assert_allclose(project(p_in), [0.6, 0.4, 0.0], atol=atol, err_msg=name)
        np.testing.assert_allclose(jax.jacrev(project)(p_in), want, atol=atol, err_msg=name)


def test_krylov_linear_solver_with_constraints_raises():
    con = {"type": "eq", "fun": lambda x: jnp.sum(x) - 1.0}
    for solver in ("cg", "gmres"):
        with pytest.raises(NotImplementedError, match="minimize.*linear_solver.*constraints"):
            minimize(distance, jnp.zeros(2), args=(jnp.ones(2),), constraints=con,
                     linear_solver=solver)


def test_multipliers_are_those_trust_constr_returns(monkeypatch):
    """The least-squares multipliers at x* (an equality and an upper inequality active,
    bounds not) equal minus trust-constr's own `v` (SciPy's Lagrangian is f + v.c); the
    derivative of x* matches central differences of SciPy's own solution."""
    from jaxbridge.scipy.optimize import _kkt, _run_scipy
    seen = {}
    active_set, scipy_minimize = _kkt.KKT.active_set, scipy.optimize.minimize

    def spy_active_set(self, x, on_failure):
        seen["side"], seen["lam"] = out = active_set(self, x, on_failure)
        return out

    def spy_minimize(*args, **kw):
        res = scipy_minimize(*args, **kw)
        seen["v"] = res.v
        return res
    monkeypatch.setattr(_kkt.KKT, "active_set", spy_active_set)
    monkeypatch.setattr(_run_scipy.scipy.optimize, "minimize", spy_minimize)

    def solve(p, numpy=False):
        mod = np if numpy else jnp
        con = NonlinearConstraint(lambda x: mod.array([x @ x, x[0] + x[1]]), [0.25, -np.inf],
                                  [0.25, 0.4],
                                  jac=lambda x: np.array([2 * x, [1.0, 1.0, 0.0]]))
        kw = dict(constraints=con, method="trust-constr", bounds=[(-1, 0.4)] * 3, tol=1e-10)
        if numpy:
            res = scipy_minimize(lambda x: np.sum((x - p) ** 2), np.zeros(3),
                                 jac=lambda x: 2 * (x - p), **kw)
            assert res.success
            return res.x
        return minimize(distance, jnp.zeros(3), args=(p,), **kw).x

    p = np.array([1.0, 2.0, 2.0])
    grad = jax.grad(lambda p: solve(p)[2])(jnp.asarray(p))
    np.testing.assert_array_equal(seen["side"], [0, 0, 0, -1, 1])  # the bounds are rows 0-2
    np.testing.assert_allclose(seen["lam"][3:], -seen["v"][0], rtol=1e-5)
    np.testing.assert_allclose(solve(jnp.asarray(p)), solve(p, numpy=True), atol=1e-6)
    h = 1e-4
    fd = [(solve(p + h * e, numpy=True)[2] - solve(p - h * e, numpy=True)[2]) / (2 * h)
          for e in np.eye(3)]
    np.testing.assert_allclose(grad, fd, atol=1e-4)


def test_method_none_with_constraints_is_slsqp_as_in_scipy():
    con = {"type": "eq", "fun": lambda x: jnp.sum(x) - 1.0}
    p = jnp.array([0.5, 0.3, -0.4])
    ours = minimize(distance, jnp.zeros(3), args=(p,), constraints=con)
    ref = scipy.optimize.minimize(lambda x: np.sum((x - p) ** 2), np.zeros(3),
                                  constraints={"type": "eq", "fun": lambda x: x.sum() - 1},
                                  method="SLSQP")
    assert ref.success
    np.testing.assert_allclose(ours.x, ref.x, atol=1e-8)
    assert int(ours.nit) == ref.nit


def test_methods_without_constraints_warn_as_scipy_and_cobyla_raises():
    con = {"type": "eq", "fun": lambda x: jnp.sum(x) - 1.0}
    p = jnp.array([0.5, 0.3])
    with pytest.warns(RuntimeWarning, match="Method BFGS cannot handle constraints"):
        res = minimize(distance, jnp.zeros(2), args=(p,), method="BFGS", constraints=con)
    np.testing.assert_allclose(res.x, p, atol=1e-6)  # ignored, as SciPy ignores them
    for method in ("COBYLA", "COBYQA"):
        with pytest.raises(NotImplementedError, match=r"minimize.*constraints.*SLSQP"):
            minimize(distance, jnp.zeros(2), args=(p,), method=method, constraints=con)


@pytest.mark.parametrize("con, exc, match", [
    ({"type": "eq"}, ValueError, r"minimize: constraints\[0\] has no function"),
    ({"type": "foo", "fun": jnp.sum}, ValueError, r"minimize: constraints\[0\].*'foo'"),
    ({"fun": jnp.sum}, KeyError, r"minimize: constraints\[0\] has no type"),
    ({"type": 1, "fun": jnp.sum}, TypeError, r"minimize: constraints\[0\]\['type'\]"),
    (LinearConstraint(np.ones((1, 3)), 0, 1), ValueError,
     r"minimize: constraints\[0\] \(LinearConstraint\).*x0's 2 columns"),
    ("x >= 0", TypeError, "minimize: constraints must be"),
])
def test_bad_constraints_raise_scipys_exception_types(con, exc, match):
    with pytest.raises(exc, match=match):
        minimize(distance, jnp.zeros(2), args=(jnp.ones(2),), method="SLSQP", constraints=con)
    if not isinstance(con, str):  # SciPy's own exception type for the same input
        ref_con = {**con, "fun": np.sum} if isinstance(con, dict) and "fun" in con else con
        with pytest.raises(exc):
            scipy.optimize.minimize(lambda x: np.sum(x ** 2), np.zeros(2), method="SLSQP",
                                    constraints=ref_con)


def test_linearly_dependent_active_constraints_raise_or_give_nan():
    """sum(x) = 1 and sum(x) <= 1, both active: the multipliers are not unique; the
    derivative says so (the values are SciPy's)."""
    cons = [{"type": "eq", "fun": lambda x: jnp.sum(x) - 1.0},
            {"type": "ineq", "fun": lambda x: 1.0 - jnp.sum(x)}]

    def solve(p, on_failure="raise"):
        return minimize(distance, jnp.zeros(2), args=(p,), constraints=cons, tol=1e-12,
                        on_failure=on_failure).x

    p = jnp.array([0.8, 0.6])
    np.testing.assert_allclose(solve(p), [0.6, 0.4], atol=1e-8)  # values are fine
    with pytest.raises(SolverError, match="minimize.*linearly dependent"):
        jax.grad(lambda p: solve(p).sum())(p)
    assert np.isnan(jax.grad(lambda p: solve(p, "nan").sum())(p)).all()


def test_strict_complementarity_violated_raises():
    """x <= 1 with the unconstrained minimum exactly at 1: active with zero multiplier,
    x*(p) = min(p, 1) has no derivative at p = 1."""
    con = {"type": "ineq", "fun": lambda x: 1.0 - x}

    def solve(p):
        return minimize(distance, jnp.zeros(1), args=(p,), constraints=con, tol=1e-12).x[0]

    assert abs(float(solve(jnp.array([1.0]))) - 1.0) < 1e-9
    with pytest.raises(SolverError, match="strict complementarity"):
        jax.grad(solve)(jnp.array([1.0]))
    np.testing.assert_allclose(jax.grad(solve)(jnp.array([2.0])), [0.0], atol=1e-9)
    np.testing.assert_allclose(jax.grad(solve)(jnp.array([0.5])), [1.0], atol=1e-9)


def test_keep_feasible_reaches_trust_constr():
    """keep_feasible=True (honoured by trust-constr): the iterates stay inside; the
    answer and derivative are those of the problem."""
    seen = []
    con = NonlinearConstraint(lambda x: x[0] ** 2 + x[1] ** 2, 0.0, 1.0, keep_feasible=True)

    def solve(p):
        return minimize(distance, jnp.array([0.1, 0.1]), args=(p,), constraints=con,
                        method="trust-constr", tol=1e-10,
                        callback=lambda intermediate_result: seen.append(
                            np.array(intermediate_result.x))).x

    p = jnp.array([3.0, 4.0])
    np.testing.assert_allclose(solve(p), [0.6, 0.8], atol=1e-6)
    assert seen and max(np.sum(x ** 2) for x in seen) <= 1.0 + 1e-12
    u = np.array([0.6, 0.8])
    np.testing.assert_allclose(jax.jacrev(solve)(p), (np.eye(2) - np.outer(u, u)) / 5.0,
                               atol=1e-6)


# ------------------------------------------------------------------ hess / hessp
def quartic(x, c):
    return jnp.sum((x - c) ** 2) + 0.1 * jnp.sum(x ** 4)


def quartic_np(x, c):
    return float(np.sum((x - c) ** 2) + 0.1 * np.sum(x ** 4))


C = np.array([1.0, -2.0])
#: Below this, trust-constr's last iterations (ever shorter steps) depend on rounding:
#: the counts of two runs with the same Hessian in JAX and in NumPy part at 1e-8.
TRUST_CONSTR_TOL = 1e-6


def _grad_np(x, c):
    return 2 * (x - c) + 0.4 * x ** 3


def _hess_np(x, c):
    """Not the Hessian (it adds |grad f| I, zero only at x*): SciPy's iterates show
    whether it was used."""
    return np.diag(2 + 1.2 * x ** 2) + np.linalg.norm(_grad_np(x, c)) * np.eye(2)


def _hess_jax(x, c):
    g = 2 * (x - c) + 0.4 * x ** 3
    return jnp.diag(2 + 1.2 * x ** 2) + jnp.linalg.norm(g) * jnp.eye(2)


@pytest.mark.parametrize("method, kind", [
    ("Newton-CG", "hess"), ("Newton-CG", "hessp"),
    pytest.param("trust-ncg", "hessp", marks=pytest.mark.slow),
    ("trust-exact", "hess"), pytest.param("dogleg", "hess", marks=pytest.mark.slow),
    pytest.param("trust-krylov", "hessp", marks=pytest.mark.slow),
    ("trust-constr", "hess"), pytest.param("trust-constr", "hessp", marks=pytest.mark.slow)])
def test_user_hessian_reaches_scipy(method, kind):
    """A user's inexact Hessian (or its products), written in JAX: SciPy calls it as often
    as it calls the same Hessian in NumPy in its own run (counted on the host), with the
    same iterates; the derivative of x* is still exact (JAX's Hessian)."""
    calls = []

    def counted(x, c):
        jax.debug.callback(lambda: calls.append(1))
        return _hess_jax(x, c)

    ref_calls = []

    def ref_counted(x, c):
        ref_calls.append(1)
        return _hess_np(x, c)

    jfun = {"hess": counted, "hessp": lambda x, v, c: counted(x, c) @ v}[kind]
    nfun = {"hess": ref_counted, "hessp": lambda x, v, c: ref_counted(x, c) @ v}[kind]
    tol = TRUST_CONSTR_TOL if method == "trust-constr" else 1e-8

    def solve(c):
        return minimize(quartic, jnp.zeros(2), args=(c,), method=method, tol=tol,
                        **{kind: jfun})

    ref = scipy.optimize.minimize(quartic_np, np.zeros(2), args=(C,), method=method,
                                  jac=_grad_np, tol=tol, **{kind: nfun})
    assert ref.success
    ours = solve(jnp.asarray(C))
    assert (int(ours.nit), int(ours.nfev)) == (ref.nit, ref.nfev)
    assert len(calls) == len(ref_calls) > 0
    np.testing.assert_allclose(ours.x, ref.x, rtol=1e-9, atol=1e-12)
    x = np.asarray(ours.x)
    want = 2 * np.diag(1 / (2 + 1.2 * x ** 2))  # dx*/dc = H^-1 * 2 at the minimum
    np.testing.assert_allclose(jax.jacrev(lambda c: solve(c).x)(jnp.asarray(C)), want,
                               rtol=1e-12)  # exact at the x* found


def test_user_hess_closing_over_a_traced_value_under_jit():
    """hess closes over the traced argument c (as a JAX function may): it is lifted out,
    and SciPy's counts equal its own with the same Hessian."""
    @jax.jit
    def solve(c):
        return minimize(quartic, jnp.zeros(2), args=(c,), method="trust-exact", tol=1e-8,
                        hess=lambda x, _: _hess_jax(x, c)).nit

    ref = scipy.optimize.minimize(quartic_np, np.zeros(2), args=(C,), method="trust-exact",
                                  jac=_grad_np, tol=1e-8, hess=_hess_np)
    assert ref.success
    assert int(solve(jnp.asarray(C))) == ref.nit


@pytest.mark.parametrize("hess", ["2-point", "3-point", scipy.optimize.BFGS(),
                                  scipy.optimize.SR1()])
def test_hess_strings_and_update_strategies_for_trust_constr(hess):
    ref = scipy.optimize.minimize(quartic_np, np.zeros(2), args=(C,), method="trust-constr",
                                  jac=_grad_np, hess=hess, tol=TRUST_CONSTR_TOL)
    ours = minimize(quartic, jnp.zeros(2), args=(jnp.asarray(C),), method="trust-constr",
                    hess=hess, tol=TRUST_CONSTR_TOL)
    assert ref.success
    np.testing.assert_allclose(ours.x, ref.x, atol=1e-7)
    assert int(ours.nit) == ref.nit


def test_hess_and_hessp_with_methods_that_ignore_them_warn_as_scipy():
    args = (jnp.asarray(C),)
    for kind, fun, message in (
            ("hess", lambda x, c: jnp.eye(2), "does not use Hessian information"),
            ("hessp", lambda x, v, c: v, "does not use Hessian-vector product")):
        with warnings.catch_warnings(record=True) as ref_warnings:
            warnings.simplefilter("always")
            scipy.optimize.minimize(quartic_np, np.zeros(2), args=(C,), method="BFGS",
                                    **{kind: fun})
        assert any(message in str(w.message) for w in ref_warnings)
        with pytest.warns(RuntimeWarning, match=f"Method BFGS {message}"):
            res = minimize(quartic, jnp.zeros(2), args=args, method="BFGS", **{kind: fun})
        assert res.success
