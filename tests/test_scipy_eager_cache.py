"""Repeat eager calls (issue #44 item 8): kept traces and whole-call programs.

A repeat eager call (same function object, same shapes) reuses the trace of the
user's function and runs one compiled program. These tests hold that to what users
do between calls: change a closed-over Python float, NumPy array (in place!), JAX
array or global; mutate an argument array in place; change `args`; pass a fresh
lambda each time. Every answer must be the new one, checked against closed forms,
and the caches must stay bounded and keep no user function alive.
"""

import functools
import gc
import weakref

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.signal

from jaxbridge.scipy import _common, _trace_cache
from jaxbridge.scipy.integrate import quad, solve_ivp
from jaxbridge.scipy.optimize import least_squares, minimize, root
from jaxbridge.scipy.signal import lfilter

T_EVAL = np.array([0.5, 1.0])
TIGHT = dict(rtol=1e-10, atol=1e-12)
RATE = 0.5  # a module global the functions below read


def decay_at_1(fun, y0=(1.0,), **kw):
    """y(1) of y' = fun(t, y) from y0 (SciPy's compiled-loop path: t_eval given)."""
    sol = solve_ivp(fun, (0.0, 1.0), np.asarray(y0, float), t_eval=T_EVAL, **TIGHT, **kw)
    return np.asarray(sol.y[:, -1])


def count_traces(monkeypatch):
    """A list that grows by one whenever `jax.make_jaxpr` traces a function."""
    traces = []
    make_jaxpr = jax.make_jaxpr

    def counting(fun, *args, **kwargs):
        traced = make_jaxpr(fun, *args, **kwargs)

        def run(*xs):
            traces.append(fun)
            return traced(*xs)
        return run
    monkeypatch.setattr(jax, "make_jaxpr", counting)
    return traces


# ------------------------------------------------------------------ kept traces
def test_a_repeat_call_does_not_trace_the_function_again(monkeypatch):
    """The same function with the same shapes: traced once, then reused (on main
    0ee1fac every call traced the function again)."""
    def f(t, y):
        return -0.5 * y

    decay_at_1(f)
    traces = count_traces(monkeypatch)
    hits = _trace_cache.trace_cache_info()["hits"]
    for _ in range(3):
        np.testing.assert_allclose(decay_at_1(f), [np.exp(-0.5)], rtol=1e-8)
    assert traces == []
    assert _trace_cache.trace_cache_info()["hits"] == hits + 3


def test_a_function_with_side_effects_on_an_object_is_traced_every_call(monkeypatch):
    """A function that reaches a mutable object (here a counter) is untracked."""
    class Counter:
        n = 0

    calls = Counter()

    def f(t, y):
        calls.n += 1
        return -0.5 * y

    traces = count_traces(monkeypatch)
    for _ in range(3):
        np.testing.assert_allclose(decay_at_1(f), [np.exp(-0.5)], rtol=1e-8)
    assert calls.n == 3 and len(traces) == 3


def test_a_rebound_closed_over_float_gives_the_new_answer():
    """A Python float is baked into a trace as a literal: a new value must be seen."""
    k = 0.5

    def f(t, y):
        return -k * y

    for value in (0.5, 1.0, 2.0):
        k = value
        np.testing.assert_allclose(decay_at_1(f), [np.exp(-value)], rtol=1e-8)
        sol = solve_ivp(f, (0.0, 1.0), np.ones(1), dense_output=True, **TIGHT)
        np.testing.assert_allclose(np.asarray(sol.sol(1.0)), [np.exp(-value)], rtol=1e-8)


def test_a_numpy_array_mutated_in_place_gives_the_new_answer():
    """A closed-over NumPy array written in place (same object, new contents)."""
    rates = np.array([0.5, 1.0])

    def f(t, y):
        return -rates * y

    first = decay_at_1(f, y0=(1.0, 1.0))
    rates[:] = [2.0, 3.0]
    np.testing.assert_allclose(first, np.exp([-0.5, -1.0]), rtol=1e-8)
    np.testing.assert_allclose(decay_at_1(f, y0=(1.0, 1.0)), np.exp([-2.0, -3.0]),
                               rtol=1e-8)


def test_a_large_numpy_array_mutated_in_place_gives_the_new_answer():
    """Past MAX_ARRAY_BYTES the array is not compared: the function is traced anew."""
    n = _trace_cache.MAX_ARRAY_BYTES // 8 + 1
    rates = np.full(n, 0.5)

    def f(t, y):
        return -rates[:1] * y

    np.testing.assert_allclose(decay_at_1(f), [np.exp(-0.5)], rtol=1e-8)
    rates[0] = 2.0
    np.testing.assert_allclose(decay_at_1(f), [np.exp(-2.0)], rtol=1e-8)


def helper_rate():
    return RATE


@pytest.mark.parametrize("read", ["directly", "through a module function"])
def test_a_rebound_jax_array_and_a_changed_global_give_the_new_answer(read):
    """A global read by `f`, or by a module function `f` calls (the snapshot follows
    calls), and a rebound closed-over JAX array."""
    global RATE
    k = jnp.array([0.5])

    def f(t, y):
        return -k * (RATE if read == "directly" else helper_rate()) * y

    np.testing.assert_allclose(decay_at_1(f), [np.exp(-0.25)], rtol=1e-8)
    k = jnp.array([2.0])
    np.testing.assert_allclose(decay_at_1(f), [np.exp(-1.0)], rtol=1e-8)
    try:
        RATE = 1.5
        np.testing.assert_allclose(decay_at_1(f), [np.exp(-3.0)], rtol=1e-8)
    finally:
        RATE = 0.5


def test_mutable_containers_and_objects_are_traced_every_call():
    """A dict, a list or an object's attribute cannot be snapshotted cheaply: such
    functions are traced on every call, and right."""
    params = {"k": 0.5}
    box = [0.5]

    class Model:
        k = 0.5

    model = Model()
    funs = {"dict": (lambda t, y: -params["k"] * y, lambda v: params.update(k=v)),
            "list": (lambda t, y: -box[0] * y, lambda v: box.__setitem__(0, v)),
            "object": (lambda t, y: -model.k * y, lambda v: setattr(model, "k", v))}
    for name, (f, set_k) in funs.items():
        assert _trace_cache.snapshot(f) is None, name
        for value in (0.5, 2.0):
            set_k(value)
            np.testing.assert_allclose(decay_at_1(f), [np.exp(-value)], rtol=1e-8)


def test_changed_args_and_an_argument_mutated_in_place_give_the_new_answer():
    """`args=(p,)` are operands; `y0` mutated in place between calls is read anew."""
    def f(t, y, k):
        return -k * y

    y0 = np.array([1.0])
    for k in (0.5, 1.0):
        np.testing.assert_allclose(decay_at_1(f, args=(k,)), [np.exp(-k)], rtol=1e-8)
    np.testing.assert_allclose(decay_at_1(f, y0=y0, args=(np.array([2.0]),)),
                               [np.exp(-2.0)], rtol=1e-8)
    y0[0] = 3.0
    np.testing.assert_allclose(decay_at_1(f, y0=y0, args=(np.array([2.0]),)),
                               [3 * np.exp(-2.0)], rtol=1e-8)


def test_static_args_changing_give_the_new_answer():
    """A Python int in `args` is static (it reaches the function as the int)."""
    def f(t, y, power):
        return -(0.5 ** power) * y

    for power in (1, 2, 3):
        np.testing.assert_allclose(decay_at_1(f, args=(power,)), [np.exp(-0.5 ** power)],
                                   rtol=1e-8)


def test_partial_and_defaults_are_snapshotted():
    def f(t, y, k=0.5):
        return -k * y

    np.testing.assert_allclose(decay_at_1(functools.partial(f, k=2.0)), [np.exp(-2.0)],
                               rtol=1e-8)
    np.testing.assert_allclose(decay_at_1(functools.partial(f, k=3.0)), [np.exp(-3.0)],
                               rtol=1e-8)
    f.__defaults__ = (1.5,)
    np.testing.assert_allclose(decay_at_1(f), [np.exp(-1.5)], rtol=1e-8)


def test_events_and_root_see_changed_closures():
    """The events path (SciPy's loop) and root read a changed closure too."""
    level = 0.5

    def hit(t, y):
        return y[0] - level

    def f(t, y):
        return -y

    for value in (0.5, 0.25):
        level = value
        sol = solve_ivp(f, (0.0, 5.0), np.ones(1), events=hit, **TIGHT)
        assert float(sol.t_events[0][0]) == pytest.approx(-np.log(value), rel=1e-7)
    c = 2.0

    def g(x):
        return x ** 2 - c

    for value in (2.0, 9.0):
        c = value
        assert float(root(g, np.ones(1)).x[0]) == pytest.approx(np.sqrt(value), rel=1e-8)


def test_a_fresh_lambda_per_call_is_right_kept_weakly_and_bounded(monkeypatch):
    """A loop over fresh lambdas: right answers, no lambda kept alive, and the kept
    traces never exceed their bound."""
    monkeypatch.setattr(_trace_cache, "TRACE_CACHE_SIZE", 4)
    refs = []
    keep = []
    for i in range(12):
        k = 0.1 * (i + 1)
        # (k as an array: an operand, so one compiled program serves every lambda)
        f = lambda t, y, k=jnp.array([k]): -k * y  # noqa: E731 - what users write
        np.testing.assert_allclose(decay_at_1(f), [np.exp(-k)], rtol=1e-8)
        refs.append(weakref.ref(f))
        if i % 2:
            keep.append(f)  # live functions: the LRU bound holds them to 4
        del f
        assert _trace_cache.trace_cache_info()["size"] <= 4
    gc.collect()
    assert sum(r() is not None for r in refs) == len(keep)


def test_whole_call_programs_are_bounded(monkeypatch):
    """Problems of ever new structure (a closed-over float is a literal of the trace)
    evict old programs."""
    monkeypatch.setattr(_common, "PROGRAM_CACHE_SIZE", 2)
    for i in range(5):
        c = 0.5123 + 0.25 * i  # (values no other test uses: a new program each)
        f = lambda t, y: -c * y  # noqa: E731 - what users write
        for _ in range(2):  # a key's first call runs as written, the second compiles
            np.testing.assert_allclose(decay_at_1(f), [np.exp(-c)], rtol=1e-8)
        assert _common.program_cache_info()["size"] <= 2


# ------------------------------------------------------------------ transformations
def test_grad_jit_vmap_through_a_kept_trace_are_unchanged():
    """The same function eagerly (trace kept), then under grad, jit and vmap: the
    derivatives and batched values are the closed forms."""
    def f(t, y, k):
        return -k * y

    def y1(k):
        return solve_ivp(f, (0.0, 1.0), jnp.ones(1), t_eval=T_EVAL, args=(k,), **TIGHT).y[0, -1]

    assert float(y1(0.7)) == pytest.approx(np.exp(-0.7), rel=1e-8)
    assert float(jax.grad(y1)(0.7)) == pytest.approx(-np.exp(-0.7), rel=1e-7)
    assert float(jax.jit(jax.grad(y1))(0.7)) == pytest.approx(-np.exp(-0.7), rel=1e-7)
    ks = jnp.array([0.5, 1.0, 2.0])
    np.testing.assert_allclose(np.asarray(jax.vmap(y1)(ks)), np.exp(-np.asarray(ks)),
                               rtol=1e-8)


def test_grad_of_a_closure_after_eager_calls_of_the_same_function():
    """A closure over a traced value is never kept (tracers are untracked); the eager
    calls before it do not leak into the gradient."""
    k = 0.5

    def f(t, y):
        return -k * y

    decay_at_1(f)

    def loss(kk):
        nonlocal k
        k = kk
        try:
            return solve_ivp(f, (0.0, 1.0), jnp.ones(1), t_eval=T_EVAL, **TIGHT).y[0, -1]
        finally:
            k = 0.5

    assert float(jax.grad(loss)(2.0)) == pytest.approx(-np.exp(-2.0), rel=1e-7)
    np.testing.assert_allclose(decay_at_1(f), [np.exp(-0.5)], rtol=1e-8)


def test_dense_output_and_events_program_matches_scipy_and_differentiates():
    """The events/dense path as one program: values against SciPy, the event time's
    derivative against the closed form t* = log(y0 / level) / k."""
    import scipy.integrate

    def f(t, y, k):
        return -k * y

    def hit(t, y, k):
        return y[0] - 0.25

    ours = solve_ivp(f, (0.0, 3.0), np.ones(1), args=(1.0,), events=hit, dense_output=True,
                     **TIGHT)
    ref = scipy.integrate.solve_ivp(lambda t, y: -y, (0.0, 3.0), np.ones(1),
                                    events=lambda t, y: y[0] - 0.25, dense_output=True,
                                    **TIGHT)
    assert float(ours.t_events[0][0]) == pytest.approx(ref.t_events[0][0], rel=1e-10)
    ts = np.linspace(0.0, 3.0, 7)
    np.testing.assert_allclose(np.asarray(ours.sol(ts)), ref.sol(ts), rtol=1e-9)

    def t_star(k):
        return solve_ivp(f, (0.0, 3.0), jnp.ones(1), args=(k,), events=hit,
                         **TIGHT).t_events[0][0]

    assert float(jax.grad(t_star)(1.0)) == pytest.approx(-np.log(4.0), rel=1e-6)


# ------------------------------------------------------------------ other front ends
def test_lfilter_repeat_calls_read_mutated_inputs():
    """lfilter as one program: an input mutated in place, lists, a scalar `a`."""
    b, a = np.array([0.5, 0.5]), np.array([1.0, -0.3])
    x = np.array([1.0, 0.0, 0.0, 2.0])
    np.testing.assert_allclose(np.asarray(lfilter(b, a, x)), scipy.signal.lfilter(b, a, x),
                               rtol=1e-14)
    x[1] = 5.0
    b[0] = 2.0
    np.testing.assert_allclose(np.asarray(lfilter(b, a, x)), scipy.signal.lfilter(b, a, x),
                               rtol=1e-14)
    np.testing.assert_allclose(np.asarray(lfilter([1.0, 2.0], 2.0, [1.0, 2.0, 3.0])),
                               scipy.signal.lfilter([1.0, 2.0], 2.0, [1.0, 2.0, 3.0]),
                               rtol=1e-14)
    with pytest.raises(ValueError, match="a\\[0\\] must be nonzero"):
        lfilter(b, np.array([0.0, 1.0]), x)


def test_minimize_least_squares_quad_see_changed_closures():
    c = np.array([1.0, -2.0])

    def bowl(x):
        return jnp.sum((x - c) ** 2)

    def residual(x):
        return x - c

    def bump(x):
        return jnp.exp(-c[0] * x)

    for value in ([1.0, -2.0], [3.0, 0.5]):
        c[:] = value
        np.testing.assert_allclose(np.asarray(minimize(bowl, np.zeros(2)).x), value,
                                   atol=1e-6)
        np.testing.assert_allclose(np.asarray(least_squares(residual, np.zeros(2)).x), value,
                                   atol=1e-8)
        assert float(quad(bump, 0.0, 1.0)[0]) == pytest.approx(
            (1 - np.exp(-value[0])) / value[0], rel=1e-10)


def test_least_squares_fields_program_follows_the_closure_and_f_scale():
    """least_squares' result fields (fun, cost, jac, grad, optimality) come from one
    compiled program from the second call on: on every call they are SciPy's for the
    closed-over data and `f_scale` of that call."""
    import scipy.optimize

    c = np.array([1.0, -2.0, 0.5])

    def residual(x):
        return jnp.array([x[0] - c[0], 10.0 * (x[1] - x[0] ** 2) - c[1], x[1] - c[2]])

    def np_residual(x):
        return np.array([x[0] - c[0], 10.0 * (x[1] - x[0] ** 2) - c[1], x[1] - c[2]])

    for value, f_scale in [([1.0, -2.0, 0.5], 1.0)] * 3 + [([0.3, 4.0, -1.0], 1.0),
                                                           ([0.3, 4.0, -1.0], 0.2)]:
        c[:] = value
        ours = least_squares(residual, np.zeros(2), loss="soft_l1", f_scale=f_scale)
        ref = scipy.optimize.least_squares(np_residual, np.zeros(2), loss="soft_l1",
                                           f_scale=f_scale, jac="3-point")
        assert ref.success
        np.testing.assert_allclose(np.asarray(ours.x), ref.x, atol=1e-6)
        for field in ("fun", "cost", "jac", "grad"):
            np.testing.assert_allclose(np.asarray(ours[field]), ref[field], atol=1e-5,
                                       err_msg=field)
        assert float(ours.optimality) == pytest.approx(ref.optimality, abs=1e-5)


def test_special_functions_as_one_program_keep_their_dtypes_and_values():
    """The special functions' argument handling moved into one compiled program: lists,
    Python scalars, float32 arrays and broadcasting give what they gave before."""
    import scipy.special

    from jaxbridge.scipy import special

    x = np.linspace(0.5, 3.0, 4)
    np.testing.assert_allclose(np.asarray(special.kv(1.5, list(x))), scipy.special.kv(1.5, x),
                               rtol=1e-13)
    assert float(special.erfcx(2.0)) == pytest.approx(scipy.special.erfcx(2.0), rel=1e-14)
    out32 = special.erfcx(np.float32(2.0) * np.ones(3, np.float32))
    assert out32.dtype == jnp.float32 and out32.shape == (3,)
    grid = special.hyp1f1(np.array([[0.5], [1.0]]), 2.0, x)
    assert grid.shape == (2, 4)
    np.testing.assert_allclose(np.asarray(grid), scipy.special.hyp1f1(
        np.array([[0.5], [1.0]]), 2.0, x), rtol=1e-12)
    assert float(jax.grad(special.erfcx)(1.0)) == pytest.approx(
        2 * 1.0 * scipy.special.erfcx(1.0) - 2 / np.sqrt(np.pi), rel=1e-12)
