"""`quad`'s integrand a Gauss-Kronrod interval at a time (`_gk21_nodes`) and its eager path.

SciPy asks for one abscissa at a time; `NodeTable` evaluates the 21 nodes of each
interval SciPy is expected to work on in one vectorized JAX call and serves the
requests from that table -- but only a request whose abscissa is bit for bit a
tabulated one. These tests try to make the table lie (abscissae one ulp off, signed
zeros, a SciPy that asks in its own order or for other points), compare `quad` with
SciPy's own on hard integrands, and hold the eager path to the cases a repeat call
meets (changed closures, mutated arrays, fresh lambdas, `jit`, `grad`).
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.integrate

from jaxbridge.scipy.integrate import _quad, quad
from jaxbridge.scipy.integrate._gk21_nodes import NodeTable, gk21_nodes, seed_intervals


def twice_table(seeds, log=None):
    """A table of `2 x`: a value served for a wrong abscissa shows as a wrong value."""
    def one(x):
        if log is not None:
            log.append(x)
        return 2.0 * x
    return NodeTable(one, lambda xs: 2.0 * xs, seeds)


def test_requests_one_ulp_off_a_node_are_evaluated_at_the_requested_point():
    table = twice_table([(0.0, 3.0)])
    nodes = gk21_nodes(0.0, 3.0)
    assert table(nodes[0]) == 2.0 * nodes[0]  # the centre: the interval is evaluated
    for x in nodes[1:]:
        for off in (np.nextafter(x, np.inf), np.nextafter(x, -np.inf)):
            assert table(float(off)) == 2.0 * float(off)
        assert table(x) == 2.0 * x
    assert table.info() == {"served": 21, "direct": 40, "evaluated": 21}


def test_signed_zero_is_never_served_from_the_table():
    table = NodeTable(lambda x: math.copysign(1.0, x), lambda xs: np.copysign(1.0, xs),
                      [(-1.0, 1.0)])  # centre 0.0: tabulated as +0.0
    assert table(-0.0) == -1.0 and table(0.0) == 1.0
    assert table.info()["evaluated"] == 21 and table.info()["served"] == 0


def test_a_wrong_guess_costs_evaluations_never_values():
    """SciPy asking for the centre of an expected interval and then for other points
    (as a SciPy with another rule would): every value is the function's at the point."""
    log = []
    table = twice_table([(0.0, 1.0)], log)
    rng = np.random.default_rng(0)
    asked = [0.5, *rng.uniform(0.0, 1.0, 50).tolist(), 0.25, 0.75, *gk21_nodes(0.0, 1.0)]
    assert [table(x) for x in asked] == [2.0 * x for x in asked]
    assert table.info()["served"] == 3 + 21  # 0.5, the halves' centres, the nodes


def test_nodes_follow_scipy_on_finite_ranges_points_and_reversed_limits():
    """On this machine SciPy's requests are the predicted nodes (a check of the guess,
    not of correctness: a mismatch would only cost speed)."""
    f = lambda x: abs(x - 0.3) * np.exp(-x)  # noqa: E731 - a kink: many bisections
    for a, b, points in ((0.0, 3.0, None), (3.0, 0.0, None), (-1.0, 1.0, (0.3,)),
                         (0.0, 1.0, (0.3, 0.31, 0.9))):
        table = NodeTable(f, lambda xs: np.abs(xs - 0.3) * np.exp(-xs),
                          seed_intervals(a, b, points or ()))
        kw = {} if points is None else {"points": points}
        assert scipy.integrate.quad(table, a, b, **kw) == scipy.integrate.quad(f, a, b, **kw)
        assert table.info()["direct"] <= 1, (a, b, points, table.info())


def test_seed_intervals():
    assert seed_intervals(0.0, np.inf) == [] and seed_intervals(1.0, 1.0) == []
    assert seed_intervals(0.0, 2.0, (1.0, 5.0, -1.0)) == [(0.0, 1.0), (1.0, 2.0)]
    assert seed_intervals(2.0, 0.0, (1.0,)) == [(2.0, 1.0), (1.0, 0.0)]


HARD = {  # name: (jnp integrand, NumPy twin, a, b, quad keywords)
    "gauss": (lambda x: jnp.exp(-x * x), lambda x: np.exp(-x * x), 0.0, 3.0, {}),
    "log singularity": (lambda x: jnp.sqrt(x) * jnp.log(x),
                        lambda x: np.sqrt(x) * np.log(x), 0.0, 1.0, {}),
    "oscillating": (lambda x: jnp.sin(30 * x) * jnp.exp(-x),
                    lambda x: np.sin(30 * x) * np.exp(-x), 0.0, 5.0, {}),
    "kink, reversed": (lambda x: jnp.abs(x - 0.3), lambda x: np.abs(x - 0.3), 1.0, -1.0,
                       {}),
    "kink at a point": (lambda x: jnp.abs(x - 0.3), lambda x: np.abs(x - 0.3), -1.0, 1.0,
                        {"points": [0.3]}),
    "infinite": (lambda x: 1 / (1 + x * x), lambda x: 1 / (1 + x * x), 0.0, np.inf, {}),
}


@pytest.mark.parametrize("case", list(HARD))
def test_quad_equals_scipy_and_the_point_by_point_path(case, monkeypatch):
    f, f_np, a, b, kw = HARD[case]
    ref = scipy.integrate.quad(f_np, a, b, **kw)
    y, err = quad(f, a, b, **kw)
    np.testing.assert_allclose([float(y), float(err)], ref, rtol=1e-13, atol=1e-13)
    # the same call evaluating every request directly, as before the table
    monkeypatch.setattr(_quad, "NodeTable", lambda one, many, seeds: one)
    assert (float(y), float(err)) == tuple(float(v) for v in quad(f, a, b, **kw))


def test_each_interval_pair_is_one_jax_call(monkeypatch):
    """The Gaussian needs one interval (21 requests): one vectorized call, no other."""
    calls = []
    f_many = _quad._Integrand.f_many
    monkeypatch.setattr(_quad._Integrand, "f_many",
                        lambda self, xs: calls.append(xs.size) or f_many(self, xs))
    monkeypatch.setattr(_quad._Integrand, "f", lambda self, x: pytest.fail("direct call"))
    quad(lambda x: jnp.exp(-x * x), 0.0, 3.0)
    assert calls == [42]  # (21 nodes, padded to the one compiled shape)
    calls.clear()
    monkeypatch.undo()
    monkeypatch.setattr(_quad._Integrand, "f_many",
                        lambda self, xs: calls.append(xs.size) or f_many(self, xs))
    quad(lambda x: jnp.sqrt(x) * jnp.log(x), 0.0, 1.0)  # 315 requests
    assert set(calls) == {42} and len(calls) == 8  # (315 requests: 21 + 7 x 42)


def test_a_scipy_asking_in_another_order_gets_the_functions_values(monkeypatch):
    """A SciPy whose quad asks for shuffled, perturbed and repeated points: the sum of
    what it gets equals the sum of the integrand at what it asked."""
    rng = np.random.default_rng(1)
    nodes = gk21_nodes(0.0, 3.0)
    asked = [nodes[0], *[float(np.nextafter(x, 9.0)) for x in nodes[1:5]],
             *rng.permutation(nodes[1:]).tolist(), -0.0, 0.0, nodes[3]]

    def other_quad(func, a, b, full_output=0, **_):
        return float(sum(func(x) for x in asked)), 0.0

    monkeypatch.setattr(scipy.integrate, "quad", other_quad)
    y, _ = quad(lambda x: jnp.exp(-x * x) + x, 0.0, 3.0)
    assert float(y) == pytest.approx(sum(math.exp(-x * x) + x for x in asked), rel=1e-15)


def test_repeat_calls_see_closures_mutated_arrays_args_and_fresh_lambdas():
    c = np.array([1.0])
    scale = 2.0

    def bump(x, k):
        return scale * jnp.exp(-c[0] * k * x)

    def exact(c0, k, s):
        return s * (1 - np.exp(-c0 * k)) / (c0 * k)

    for c0, k, s in ((1.0, 1.0, 2.0), (3.0, 1.0, 2.0), (3.0, 0.5, 2.0), (3.0, 0.5, -1.0)):
        c[0], scale = c0, s  # mutated in place, rebound
        assert float(quad(bump, 0.0, 1.0, args=(k,))[0]) == pytest.approx(
            exact(c0, k, s), rel=1e-12)
        for j in range(3):  # a fresh lambda per call, closing over the loop variable
            assert float(quad(lambda x: jnp.exp(-j * x) + c[0], 0.0, 1.0)[0]) == \
                pytest.approx((1 - math.exp(-j)) / j + c0 if j else 1.0 + c0, rel=1e-12)


def test_jit_grad_dtypes_and_devices_as_before():
    f = lambda x, k: jnp.exp(-k * x)  # noqa: E731
    eager = quad(f, 0.0, 1.0, args=(2.0,))
    jitted = jax.jit(lambda: quad(f, 0.0, 1.0, args=(2.0,)))()  # constants: a host call
    assert [float(v) for v in eager] == [float(v) for v in jitted]
    assert all(isinstance(v, jax.Array) and v.dtype == jnp.float64 for v in eager)
    g = jax.grad(lambda k, b: quad(f, 0.0, b, args=(k,))[0], argnums=(0, 1))(2.0, 1.0)
    assert float(g[0]) == pytest.approx((3 * math.exp(-2) - 1) / 4, rel=1e-8)
    assert float(g[1]) == pytest.approx(math.exp(-2), rel=1e-12)
    y32, e32 = quad(f, np.float32(0.0), np.float32(1.0), args=(2.0,))
    assert y32.dtype == e32.dtype == jnp.float32
    assert float(y32) == pytest.approx((1 - math.exp(-2)) / 2, rel=1e-6)
    cpu = jax.devices("cpu")[0]
    y, _ = quad(f, jax.device_put(0.0, cpu), 1.0, args=(2.0,))
    assert y.devices() == {cpu}


def test_bad_input_still_raises_as_before():
    with pytest.raises(TypeError, match="integrate.quad: `func` must return a scalar"):
        quad(lambda x: jnp.ones(2) * x, 0.0, 1.0)
    with pytest.raises(TypeError, match="`func` must be callable"):
        quad("exp", 0.0, 1.0)
    with pytest.raises(TypeError):  # JAX's: a string is not a limit
        quad(lambda x: x, "zero", 1.0)


def test_an_integrand_jax_cannot_vmap_is_evaluated_point_by_point():
    """A `pure_callback` without `vmap_method` raises under `vmap`: quad worked with it
    before the vectorized nodes, and still does (values from the callback itself)."""
    calls = []

    def host_gauss(x):
        calls.append(float(x))
        return np.exp(-x * x)

    f = lambda x: jax.pure_callback(  # noqa: E731
        host_gauss, jax.ShapeDtypeStruct((), jnp.float64), x)
    y, err = quad(f, 0.0, 3.0)
    assert (float(y), float(err)) == scipy.integrate.quad(lambda x: np.exp(-x * x), 0, 3)
    assert len(calls) == 21


def test_an_error_of_the_integrand_surfaces_as_itself():
    class Boom(Exception):
        pass

    def host(x):
        if x > 2.0:
            raise Boom(f"x = {x}")
        return np.exp(-x * x)

    f = lambda x: jax.pure_callback(  # noqa: E731
        host, jax.ShapeDtypeStruct((), jnp.float64), x, vmap_method="sequential")
    with pytest.raises(Exception) as info:
        quad(f, 0.0, 3.0)
    assert "x = " in str(info.value)


def test_the_limits_dtype_follows_jax_settings_between_calls():
    """The limits' promotion is memoized: it must still follow x64 and strict
    promotion as jnp.asarray and jnp.result_type do."""
    f = lambda x: jnp.exp(-x)  # noqa: E731
    assert quad(f, 0, 1)[0].dtype == jnp.float64
    with jax.enable_x64(False):
        y, err = quad(f, 0, 1)
        assert y.dtype == err.dtype == jnp.float32
    assert quad(f, np.float32(0.0), 1.0)[0].dtype == jnp.float64  # (memoized now)
    with jax.numpy_dtype_promotion("strict"):  # float32 with float64: JAX's error
        with pytest.raises(Exception, match="promot"):
            quad(f, np.float32(0.0), 1.0)
