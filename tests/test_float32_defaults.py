"""The dtype-dependent defaults, run with JAX's default float32 (jax_enable_x64 off).

conftest.py turns x64 on for the whole suite, as most comparisons with SciPy need it; a
user who never touches that flag gets float32 arrays and other defaults: solve_ivp
steps through SciPy's loop instead of the compiled one, root's compiled DF-SANE is
unavailable, check_rules cannot upcast. These tests run those paths as such a user
would, under `jax.enable_x64(False)`, against SciPy and finite differences.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.integrate
import scipy.optimize

import jaxbridge as jb
from jaxbridge.errors import RuleCheckError
from jaxbridge.scipy.integrate import solve_ivp
from jaxbridge.scipy.optimize import root
from jaxbridge.testing import check_rules


@pytest.fixture(autouse=True)
def float32_default():
    with jax.enable_x64(False):
        assert jnp.result_type(float) == jnp.float32
        yield


def decay(t, y, k):
    return -k * y


def test_solve_ivp_runs_scipys_loop_in_float32_and_matches_scipy():
    y0 = jnp.array([1.0, 2.0])
    t_eval = jnp.array([0.5, 1.0])

    @jax.jit
    def final(k):
        return solve_ivp(decay, (0.0, 1.0), y0, t_eval=t_eval, args=(k,), rtol=1e-6,
                         atol=1e-8).y

    ys = final(jnp.float32(0.7))
    assert ys.dtype == jnp.float32
    ref = scipy.integrate.solve_ivp(lambda t, y: -0.7 * y, (0.0, 1.0), [1.0, 2.0],
                                    t_eval=[0.5, 1.0], rtol=1e-6, atol=1e-8)
    assert ref.success
    np.testing.assert_allclose(ys, ref.y, rtol=1e-5)


def test_solve_ivp_gradient_in_float32_matches_the_exact_one():
    def loss(k):
        sol = solve_ivp(decay, (0.0, 1.0), jnp.array([1.0]), t_eval=jnp.array([1.0]),
                        args=(k,), rtol=1e-7, atol=1e-9)
        return sol.y[0, -1]

    k = jnp.float32(0.7)
    g = jax.jit(jax.grad(loss))(k)
    assert g.dtype == jnp.float32
    np.testing.assert_allclose(g, -np.exp(-0.7), rtol=1e-4)  # d/dk exp(-k) at t=1


def test_compiled_stepping_without_x64_is_a_clear_error():
    with pytest.raises(ValueError, match=r"solve_ivp.*jax_enable_x64"):
        solve_ivp(decay, (0.0, 1.0), jnp.array([1.0]), t_eval=jnp.array([1.0]), args=(0.5,),
                  stepping="compiled")


def test_root_in_float32_matches_scipy_and_its_implicit_gradient():
    def residual(x, a):
        return x**3 + x - a

    @jax.jit
    def solve(a):
        return root(residual, jnp.array([0.5]), args=(a,)).x[0]

    a = jnp.float32(3.0)
    x = solve(a)
    ref = scipy.optimize.root(lambda x: x**3 + x - 3.0, [0.5])
    assert ref.success
    np.testing.assert_allclose(x, ref.x[0], rtol=1e-5)
    # implicit function theorem: dx/da = 1 / (3 x^2 + 1)
    np.testing.assert_allclose(jax.grad(solve)(a), 1.0 / (3 * ref.x[0] ** 2 + 1), rtol=1e-4)


def test_root_compiled_stepping_without_x64_is_a_clear_error():
    with pytest.raises(ValueError, match="jax_enable_x64"):
        root(lambda x: x - 1.0, jnp.array([0.0]), method="df-sane", stepping="compiled")


def test_a_host_function_keeps_float32_under_jit_grad_and_vmap():
    @jb.foreign(lambda x: x)
    def cube(x):
        return np.asarray(x) ** 3

    @cube.defvjp
    def cube_vjp(primals, y, ct):
        (x,) = primals
        return (3 * x**2 * ct,)

    x = jnp.linspace(0.5, 1.5, 4)
    assert x.dtype == jnp.float32
    np.testing.assert_allclose(jax.jit(cube)(x), x**3, rtol=1e-6)
    g = jax.jit(jax.grad(lambda x: cube(x).sum()))(x)
    assert g.dtype == jnp.float32
    np.testing.assert_allclose(g, 3 * x**2, rtol=1e-6)
    np.testing.assert_allclose(jax.vmap(cube)(x[:, None]), x[:, None] ** 3, rtol=1e-6)


def test_check_rules_in_float32_passes_a_right_rule_and_catches_a_wrong_one():
    @jb.foreign(lambda x: x)
    def double(x):
        return 2 * np.asarray(x)

    @double.defvjp
    def double_vjp(primals, y, ct):
        return (2 * ct,)

    x = jnp.linspace(0.1, 1.0, 3)
    report = check_rules(double, x)
    assert report.passed and report.results, report

    @jb.foreign(lambda x: x)
    def double_wrong(x):
        return 2 * np.asarray(x)

    @double_wrong.defvjp
    def double_wrong_vjp(primals, y, ct):
        return (-2 * ct,)

    with pytest.raises(RuleCheckError, match="sign flipped"):
        check_rules(double_wrong, x)
