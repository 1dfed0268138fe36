"""Closures and SciPy's `args` across the jaxbridge.scipy catalog (issue #14 item 2, #13).

A silent zero gradient is a release blocker: every function that takes a JAX callable
is differentiated with its parameters passed through `args` and closed over (lambda,
functools.partial, callable class instance, Equinox module), under grad, jit(grad),
jacfwd and vmap, and the gradients must be the same, and nonzero, and match finite
differences. Fresh closures per call must not pile up compiled programs or keep the
user's functions alive.
"""

import functools
import gc
import weakref

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxbridge.scipy import _common
from jaxbridge.scipy.integrate import quad, solve_ivp
from jaxbridge.scipy.optimize import least_squares, minimize, root

TH = jnp.array([0.7, 0.4])
TIGHT = dict(xtol=1e-14, ftol=1e-14, gtol=1e-14)


# ------------------------------------------------------------------ the problems
# Each: (the user's function f(*own_args, th), run(fun, args) -> scalar loss).
def ode_f(t, y, th):
    return -th[0] * y + th[1] * jnp.sin(t)


def ode_run(fun, args=()):
    sol = solve_ivp(fun, (0.0, 1.0), jnp.array([1.0, 2.0]), t_eval=jnp.array([0.5, 1.0]),
                    args=args, rtol=1e-10, atol=1e-12)
    return jnp.sum(sol.y ** 2)


def quad_f(x, th):
    return th[0] * jnp.exp(-th[1] * x ** 2)


def quad_run(fun, args=()):
    return quad(fun, 0.0, 1.0, args)[0] ** 2


def root_f(x, th):
    W = jnp.array([[th[0], 0.1], [0.0, th[1]]])
    return x - jnp.tanh(W @ x + 0.1)


def root_run(fun, args=()):
    return jnp.sum(root(fun, jnp.zeros(2), args, tol=1e-13).x ** 2)


def min_f(x, th):
    return jnp.sum((x - th) ** 2) + 0.1 * jnp.sum(x ** 4)


def min_run(fun, args=()):
    return jnp.sum(jnp.sin(minimize(fun, jnp.zeros(2), args, method="Newton-CG",
                                    tol=1e-13).x))


def lsq_f(x, th):
    return jnp.stack([x[0] - th[0], x[1] - th[1], 0.3 * x[0] * x[1] - 0.1])


def lsq_run(fun, args=()):
    return jnp.sum(least_squares(fun, jnp.ones(2), args=args, **TIGHT).x ** 3)


PROBLEMS = {"solve_ivp": (ode_f, ode_run), "quad": (quad_f, quad_run),
            "root": (root_f, root_run), "minimize": (min_f, min_run),
            "least_squares": (lsq_f, lsq_run)}


class Closure:
    """A callable class instance holding the parameters."""

    def __init__(self, f, th):
        self.f, self.th = f, th

    def __call__(self, *xs):
        return self.f(*xs, self.th)


def closed(kind, f, th):
    """`f` with `th` bound, in the ways users write it."""
    if kind == "lambda":
        return lambda *xs: f(*xs, th)
    if kind == "partial":
        return functools.partial(lambda th, *xs: f(*xs, th), th)
    if kind == "class":
        return Closure(f, th)
    if kind == "equinox":
        eqx = pytest.importorskip("equinox")

        class Model(eqx.Module):
            th: jax.Array

            def __call__(self, *xs):
                return f(*xs, self.th)
        return Model(th)
    raise ValueError(kind)


def loss(problem, kind):
    f, run = PROBLEMS[problem]
    if kind == "args":
        return lambda th: run(f, (th,))
    return lambda th: run(closed(kind, f, th))


def fd(L, th, eps=1e-6):
    th = np.asarray(th, np.float64)
    return np.array([(float(L(jnp.asarray(th + eps * e))) - float(L(jnp.asarray(th - eps * e))))
                     / (2 * eps) for e in np.eye(th.size)])


# ------------------------------------------------------------------ gradients
@pytest.mark.parametrize("problem,kind", [
    pytest.param(problem, kind, marks=pytest.mark.slow)  # compiles the ODE gradient twice
    if (problem, kind) in {("solve_ivp", "lambda"), ("solve_ivp", "partial")}
    else (problem, kind) for problem in PROBLEMS
    for kind in ("lambda", "partial", "class", "equinox")])
def test_closure_gradient_equals_args_gradient_under_jit(problem, kind):
    """The issue's silent zero: jit(grad) through a closure over a traced value."""
    g_args = jax.grad(loss(problem, "args"))(TH)
    g_closure = jax.jit(jax.grad(loss(problem, kind)))(TH)
    assert np.all(np.abs(g_args) > 1e-3), g_args  # a zero gradient here would hide bugs
    np.testing.assert_allclose(g_closure, g_args, rtol=1e-10, atol=1e-13)


@pytest.mark.parametrize("problem", [pytest.param(p, marks=pytest.mark.slow)  # long: the ODE
                                     if p == "solve_ivp" else p for p in PROBLEMS])
def test_closure_gradients_every_transformation(problem):
    L, La = loss(problem, "lambda"), loss(problem, "args")
    g = jax.grad(La)(TH)
    np.testing.assert_allclose(g, fd(La, TH), rtol=1e-5, atol=1e-8)  # the reference
    np.testing.assert_allclose(jax.grad(L)(TH), g, rtol=1e-10, atol=1e-13)  # eager
    np.testing.assert_allclose(jax.jacfwd(L)(TH), g, rtol=1e-8, atol=1e-11)
    ths = jnp.stack([TH, TH * 1.1])
    batched = jax.jit(jax.vmap(jax.grad(L)))(ths)
    np.testing.assert_allclose(batched[0], g, rtol=1e-10, atol=1e-13)
    np.testing.assert_allclose(batched[1], jax.grad(La)(ths[1]), rtol=1e-10, atol=1e-13)


@pytest.mark.parametrize("problem", list(PROBLEMS))
def test_closures_over_concrete_arrays_and_python_floats(problem):
    """Closed-over constants: the value equals the args version, eager and jitted."""
    f, run = PROBLEMS[problem]
    th_np = np.asarray(TH)
    ref = float(run(f, (TH,)))
    concrete = jnp.asarray(th_np)
    assert float(run(lambda *xs: f(*xs, concrete))) == pytest.approx(ref, rel=1e-12)
    assert float(jax.jit(lambda: run(lambda *xs: f(*xs, concrete)))()) == \
        pytest.approx(ref, rel=1e-12)
    a, b = float(th_np[0]), float(th_np[1])
    floats = lambda *xs: f(*xs, jnp.array([a, b]))  # noqa: E731  (Python floats)
    assert float(run(floats)) == pytest.approx(ref, rel=1e-12)


def test_closure_and_args_together_and_mixed_dtypes():
    """A function using both: args (a dict pytree) and a closed-over traced scalar; an
    integer index array closed over stays a fixed (non-differentiable) input."""
    idx = jnp.array([1, 0])

    def L(k, c):
        def rhs(t, y, p):
            return -k * y[idx] * p["w"] + c
        return jnp.sum(solve_ivp(rhs, (0.0, 1.0), jnp.ones(2), t_eval=[1.0],
                                 args=({"w": jnp.array([1.0, 2.0])},), rtol=1e-10,
                                 atol=1e-12).y)

    g = jax.jit(jax.grad(L, (0, 1)))(0.5, 0.2)
    ref = fd(lambda v: L(v[0], v[1]), np.array([0.5, 0.2]))
    np.testing.assert_allclose(np.array(g), ref, rtol=1e-6)


def test_only_calling_convention_errors_get_the_note_on_how_scipy_calls_the_function():
    """A TypeError while tracing (args forgotten) gets a note saying how SciPy calls the
    function; the user's own error (a ValueError of their model) reaches them
    unchanged, not blamed on the calling convention."""
    def forgot_args(x, p):
        return jnp.sum((x - p) ** 2)

    with pytest.raises(TypeError) as info:
        minimize(forgot_args, jnp.zeros(2))
    assert "traced `fun` as fun(x, *args), as SciPy calls it" in "".join(info.value.__notes__)

    def own_error(x):
        raise ValueError("negative concentration")

    for call in (lambda: minimize(own_error, jnp.zeros(2)), lambda: quad(own_error, 0.0, 1.0)):
        with pytest.raises(ValueError) as info:
            call()
        assert str(info.value) == "negative concentration"
        assert not any("jaxbridge" in n for n in getattr(info.value, "__notes__", []))


# ------------------------------------------------------------------ memory (#13)
@pytest.mark.slow
def test_fresh_closures_reuse_programs_and_are_collectable():
    """A fresh closure per call (the usual way) compiles once, and the dropped
    functions are garbage (the host cache keys on the traced structure)."""
    te = jnp.array([0.5, 1.0])
    refs = []

    def one(i):
        k = jnp.array(1.0 + 0.01 * i)
        f = lambda t, y: -k * y  # noqa: E731
        refs.append(weakref.ref(f))
        sol = solve_ivp(f, (0.0, 1.0), jnp.ones(2), t_eval=te, rtol=1e-8)
        g = jax.grad(lambda k: solve_ivp(lambda t, y: -k * y, (0.0, 1.0), jnp.ones(2),
                                         t_eval=te, rtol=1e-8).y.sum())(k)
        return float(sol.y[0, -1]), float(g)

    one(0)
    before = _common.host_cache_info()
    for i in range(1, 15):
        y, g = one(i)
        k = 1.0 + 0.01 * i
        assert y == pytest.approx(np.exp(-k), rel=1e-6)
        assert g == pytest.approx(-2 * np.exp(-0.5 * k) * 0.5 - 2 * np.exp(-k), rel=1e-5)
    after = _common.host_cache_info()
    assert after["misses"] == before["misses"]  # nothing compiled again
    assert after["size"] == before["size"]
    gc.collect()
    assert sum(r() is not None for r in refs) == 0


def test_host_cache_is_bounded(monkeypatch):
    """Distinct functions (Python-float constants differ) evict old entries."""
    monkeypatch.setattr(_common, "HOST_CACHE_SIZE", 4)
    for i in range(10):
        c = 1.0 + 0.1 * i  # a Python float: a different program each time
        quad(lambda x: jnp.exp(-c * x), 0.0, 1.0)
        assert _common.host_cache_info()["size"] <= 4


def test_python_floats_in_args_are_operands_one_program_for_every_value():
    """A Python float in `args` is an operand (as an array is), not a constant baked
    into the program: new values reuse the compiled program (unlike a closed-over
    Python float, above), and the values are right."""
    def f(x, c):
        return jnp.exp(-c * x)

    quad(f, 0.0, 1.0, (0.5,))
    misses = _common.host_cache_info()["misses"]
    for c in (1.0, 1.5, 2.0):
        assert float(quad(f, 0.0, 1.0, (c,))[0]) == pytest.approx((1 - np.exp(-c)) / c,
                                                                  rel=1e-12)
    assert _common.host_cache_info()["misses"] == misses


def test_python_ints_and_bools_in_args_stay_python_values():
    """Sizes, counts and flags in `args` reach the function as the Python values SciPy
    would pass (a `range`, an `if`, a shape), not as traced arrays."""
    def f(x, n, squared, c):
        terms = jnp.stack([c * x ** i for i in range(n)])  # a count and a shape
        total = jnp.sum(terms.reshape(n))
        return total ** 2 if squared else total  # a flag

    # int_0^1 c (1 + x + x^2) dx = 11 c / 6; squared: c^2 int (1 + x + x^2)^2 = 37 c^2 / 10
    assert float(quad(f, 0.0, 1.0, (3, False, 2.0))[0]) == pytest.approx(11 / 3, rel=1e-12)
    g = jax.grad(lambda c: quad(f, 0.0, 1.0, (3, True, c))[0])(2.0)
    assert float(g) == pytest.approx(2 * 2.0 * 37 / 10, rel=1e-12)


def test_memory_stays_bounded_with_fresh_closures():
    """Eager `grad` through the compiled solve_ivp path with a fresh closure per call
    reuses one program (bug: every call traced and compiled a new loop, +13 MiB and
    seconds each, 775 MiB over 60 calls)."""
    psutil = pytest.importorskip("psutil")
    proc = psutil.Process()
    te = jnp.linspace(0.1, 1.0, 5)

    def call(i):
        k = jnp.array([1.0 + 0.001 * i, 0.5])
        L = lambda k: solve_ivp(lambda t, y: -k * y, (0.0, 1.0), jnp.ones(2),  # noqa: E731
                                t_eval=te, rtol=1e-8).y.sum()
        jax.block_until_ready(jax.grad(L)(k))

    for i in range(3):
        call(i)
    gc.collect()
    start = proc.memory_info().rss
    for i in range(30):
        call(i)
    gc.collect()
    grown = (proc.memory_info().rss - start) / 2 ** 20
    assert grown < 40, f"RSS grew by {grown:.0f} MiB over 30 calls"


@pytest.mark.slow
def test_user_jacobians_may_close_over_traced_values_too():
    """`jac` functions are converted like `fun`: closing over a traced value neither
    leaks a tracer nor changes the gradient (which comes from JAX's derivatives)."""
    def ode_loss(k, method):
        f = lambda t, y: -k * y ** 3  # noqa: E731
        jac = lambda t, y: jnp.diag(-3 * k * y ** 2)  # noqa: E731
        return jnp.sum(solve_ivp(f, (0.0, 1.0), jnp.array([1.0, 2.0]), method, [0.5, 1.0],
                                 jac=jac, rtol=1e-10, atol=1e-12).y)
    for method in ("BDF", "Radau"):
        g = jax.jit(jax.grad(ode_loss), static_argnums=1)(0.7, method)
        np.testing.assert_allclose(g, fd(lambda k: ode_loss(k[0], method), np.array([0.7]))[0],
                                   rtol=1e-5)

    def root_loss(th):
        F = lambda x: root_f(x, th)  # noqa: E731
        J = lambda x: jax.jacfwd(root_f)(x, th)  # noqa: E731
        return jnp.sum(root(F, jnp.zeros(2), jac=J, tol=1e-13).x ** 2)
    np.testing.assert_allclose(jax.jit(jax.grad(root_loss))(TH),
                               jax.grad(loss("root", "args"))(TH), rtol=1e-10)

    def min_loss(th):
        f = lambda x: min_f(x, th)  # noqa: E731
        return jnp.sum(jnp.sin(minimize(f, jnp.zeros(2), jac=lambda x: jax.grad(min_f)(x, th),
                                        method="Newton-CG", tol=1e-13).x))
    np.testing.assert_allclose(jax.grad(min_loss)(TH), jax.grad(loss("minimize", "args"))(TH),
                               rtol=1e-6)


@pytest.mark.slow
def test_float32_inputs_keep_their_dtype():
    k = jnp.float32(0.7)

    def L(k):
        return solve_ivp(lambda t, y: -k * y, (0.0, 1.0), jnp.ones(2, jnp.float32),
                         t_eval=jnp.array([1.0], jnp.float32), rtol=1e-6).y.sum()
    assert L(k).dtype == jnp.float32
    g = jax.grad(L)(k)
    assert g.dtype == jnp.float32
    np.testing.assert_allclose(g, -2 * np.exp(-0.7), rtol=1e-4)
    x = root(lambda x: x - jnp.tanh(k * x + 0.1), jnp.zeros(2, jnp.float32)).x
    assert x.dtype == jnp.float32
