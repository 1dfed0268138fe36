"""Long-running programs and strictness (issue 13): dropped functions release what they
held, nothing is silently cast, what cannot be pickled or exported says so; and any
callable works in any mode (issue 12)."""

import functools
import gc
import pickle
import time
import weakref

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxbridge as jb
from jaxbridge._foreign import hostcall
from jaxbridge.errors import BackendError, ResultMismatchError


# ----------------------------------------------------------------- nothing leaks
class Payload:
    """Something big a user's function closes over."""

    def __init__(self):
        self.data = np.ones(1 << 16)


def _make_functions(n, kind):
    refs = []
    for i in range(n):
        payload = Payload()
        refs.append(weakref.ref(payload))

        @jb.foreign(lambda x: x)
        def f(x, payload=payload, i=i):
            return np.asarray(x) + payload.data[0] + i

        f.defvjp(lambda p, y, ct: (ct,))
        x = jnp.ones(3)
        if kind == "jit":
            jax.jit(f)(x).block_until_ready()
        elif kind == "eager":
            f(x).block_until_ready()
        else:
            jax.jit(jax.grad(lambda x: f(x).sum()))(x).block_until_ready()
    return refs


@pytest.mark.parametrize("kind", ["jit", "eager",
                                  pytest.param("jit(grad)", marks=pytest.mark.slow)])
def test_dropped_functions_release_their_closures_and_callbacks(kind):
    _make_functions(5, kind)  # warm up JAX's own caches
    gc.collect()
    baseline = hostcall.num_registered()
    refs = _make_functions(60, kind)
    # XLA's CPU client holds on to the program it ran last until it runs another one,
    # and JAX 0.10 lets go of it a moment after block_until_ready returns.
    jax.jit(lambda x: x * 2)(jnp.ones(2)).block_until_ready()
    deadline = time.monotonic() + 5.0
    while True:
        gc.collect()
        alive = sum(r() is not None for r in refs)
        if (alive == 0 and hostcall.num_registered() <= baseline) \
                or time.monotonic() > deadline:
            break
        time.sleep(0.01)
    assert alive == 0, f"{alive} closures kept alive after the drop"
    assert hostcall.num_registered() <= baseline


def test_live_function_keeps_working_after_others_are_dropped():
    keep = jb.foreign(lambda x: x)(lambda x: np.asarray(x) * 2)
    jitted = jax.jit(keep)
    np.testing.assert_allclose(jitted(jnp.ones(2)), 2.0)
    _make_functions(20, "jit")
    gc.collect()
    np.testing.assert_allclose(jitted(jnp.ones(2)), 2.0)
    np.testing.assert_allclose(keep(jnp.ones(2)), 2.0)


# ----------------------------------------------------------------- strict means strict
@pytest.mark.parametrize("declared, value, problem", [
    (jnp.float32, np.ones(2, np.float32), "shape"),
    (jnp.float32, None, "none"),
    (jnp.float32, np.asarray(0.5), "dtype"),     # a 0-d array is an array: no weak typing
])
def test_results_are_checked_strictly(declared, value, problem):
    f = jb.foreign(jax.ShapeDtypeStruct((), declared))(lambda x: value)
    for call in (f, jax.jit(f)):
        with pytest.raises(ResultMismatchError) as info:
            call(jnp.float32(1.0))
        assert info.value.problem == problem
        assert info.value.declared == f"{np.dtype(declared).name}[]"
        assert "'<lambda>'" in str(info.value)


def test_scalar_of_the_declared_dtype_is_accepted():
    f = jb.foreign(jax.ShapeDtypeStruct((), jnp.float32))(lambda x: np.float32(2.5))
    assert float(jax.jit(f)(jnp.float32(1.0))) == 2.5


# ----------------------------------------------------------------- JAX's scalar rules
# Python and NumPy scalars are weakly typed, as in JAX (`jnp.int32(1) + 42` is int32):
# a value that converts exactly takes the declared dtype; a lossy one is an error.
def test_python_literals_convert_exactly_to_the_declared_dtype():
    @jb.foreign(lambda x: (jax.ShapeDtypeStruct((), jnp.int32),
                           jax.ShapeDtypeStruct((), jnp.float32),
                           jax.ShapeDtypeStruct((), jnp.uint8),
                           jax.ShapeDtypeStruct((), jnp.bool_)))
    def stats(x):
        count = int(np.count_nonzero(x > 0))      # a Python int for an int32
        return count, 0.5, np.int64(255), 1       # 0.5 for float32, 255 for uint8, 1: True

    x = jnp.asarray([-1.0, 2.0, 3.0], jnp.float32)
    for call in (stats, jax.jit(stats)):
        count, half, top, flag = call(x)
        assert (count.dtype, half.dtype, top.dtype, flag.dtype) == (
            jnp.int32, jnp.float32, jnp.uint8, jnp.bool_)
        assert (int(count), float(half), int(top), bool(flag)) == (2, 0.5, 255, True)
    counts = jax.vmap(lambda v: stats(v)[0])(jnp.stack([x, -x]))
    np.testing.assert_array_equal(counts, np.array([2, 1], np.int32))


def test_rules_may_return_python_scalars():
    # A loss whose VJP returns a Python float for a float32 scalar input, in a scan.
    @jb.foreign(lambda x: jax.ShapeDtypeStruct((), x.dtype))
    def double(x):
        return 2.0 * float(x)

    @double.defvjp
    def _(primals, y, ct):
        return (2.0 * float(ct),)

    @double.defjvp
    def _(primals, y, tangents):
        return 2.0 * float(tangents[0])

    def loss(x):
        return jax.lax.scan(lambda c, _: (double(c), None), x, None, length=3)[0]

    x = jnp.float32(1.5)
    assert jax.jit(loss)(x).dtype == jnp.float32 and float(jax.jit(loss)(x)) == 12.0
    assert float(jax.jit(jax.grad(loss))(x)) == 8.0
    assert float(jax.jvp(loss, (x,), (jnp.float32(1.0),))[1]) == 8.0


@pytest.mark.parametrize("declared, value, why", [
    (jnp.int32, 3.7, r"3.7 is not a whole number"),
    (jnp.float32, 1e40, r"1e\+40 overflows float32"),
    (jnp.uint8, -1, r"-1 is outside the range of uint8 \[0, 255\]"),
    (jnp.int32, 2**40, r"1099511627776 is outside the range of int32"),
    (jnp.float32, np.complex128(1 + 2j), r"\(1\+2j\) has an imaginary part"),
    (jnp.float16, np.float64(1e6), r"1000000.0 overflows float16"),
])
def test_lossy_scalar_results_are_errors_naming_function_and_value(declared, value, why):
    @jb.foreign(lambda x: jax.ShapeDtypeStruct((), declared))
    def lossy(x):
        return value

    for call in (lossy, jax.jit(lossy)):
        with pytest.raises(ResultMismatchError, match=r"output of foreign function 'lossy' "
                           rf".*declared {np.dtype(declared).name}\[\]: {why}") as info:
            call(jnp.float32(1.0))
        assert info.value.problem == "dtype"


def test_lossy_scalar_cotangent_is_an_error_naming_the_argument():
    f = jb.foreign(lambda k, x: x)(lambda k, x: x * k.astype(x.dtype))
    # k is an int32 input: it has no cotangent, so the 0.5 returned for it is never checked
    f.defvjp(lambda p, y, ct: (0.5, ct * p[0].astype(ct.dtype)))
    g = jb.foreign(lambda x: jax.ShapeDtypeStruct((), jnp.float32))(lambda x: np.float32(x))
    g.defvjp(lambda p, y, ct: (1e40,))
    with pytest.raises(ResultMismatchError, match=r"cotangent 0 of foreign function "
                       r"'<lambda>'.*1e\+40 overflows float32"):
        jax.grad(g)(jnp.float32(1.0))
    grad = jax.grad(lambda x: f(jnp.int32(3), x).sum())(jnp.ones(2, jnp.float32))
    np.testing.assert_array_equal(grad, np.full(2, 3.0, np.float32))


def test_cast_true_still_casts_lossy_scalars():
    f = jb.foreign(lambda x: jax.ShapeDtypeStruct((), jnp.int32), cast=True)(lambda x: 3.7)
    assert int(jax.jit(f)(jnp.float32(0.0))) == 3


def test_cast_true_casts_same_shape_results_only():
    f = jb.foreign(lambda x: x, cast=True)(lambda x: np.asarray(x, np.float64) * 2)
    f.defvjp(lambda p, y, ct: (np.asarray(ct, np.float64) * 2,))  # float64 constants
    x = jnp.ones(3, jnp.float32)
    y = jax.jit(f)(x)
    assert y.dtype == jnp.float32
    g = jax.grad(lambda x: f(x).sum())(x)
    assert g.dtype == jnp.float32 and np.allclose(g, 2.0)
    bad = jb.foreign(lambda x: x, cast=True)(lambda x: np.ones(4))
    with pytest.raises(ResultMismatchError, match="shape"):
        bad(x)


# ----------------------------------------------------------------- pickling and export
@jb.foreign(lambda x: x)
def module_level_sin(x):
    return np.sin(x)


def test_module_level_foreign_function_pickles_by_reference():
    assert pickle.loads(pickle.dumps(module_level_sin)) is module_level_sin


def test_local_foreign_function_pickling_says_what_to_do():
    local = jb.foreign(lambda x: x)(np.cos)
    with pytest.raises(TypeError, match=r"jaxbridge: foreign function .*cannot be pickled.*"
                                        r"module level"):
        pickle.dumps(local)


def test_exporting_a_host_call_is_a_clear_error():
    with pytest.raises(BackendError, match=r"cannot be exported with jax\.export.*C\+\+ kernel"):
        jax.export.export(jax.jit(module_level_sin))(jax.ShapeDtypeStruct((3,), jnp.float32))


# ----------------------------------------------------------------- any callable, any mode
class Scale:
    """A callable class instance as the host function."""

    def __init__(self, k):
        self.k = k

    def __call__(self, x):
        return np.asarray(x) * self.k


@pytest.mark.parametrize("fun, expect", [
    (functools.partial(np.multiply, 3.0), 3.0),
    (Scale(4.0), 4.0),
    (np.negative, -1.0),
])
def test_any_callable_can_be_wrapped(fun, expect):
    f = jb.foreign(lambda x: x)(fun)
    f.defvjp(lambda p, y, ct: (ct * expect,))
    x = jnp.ones(3)
    np.testing.assert_allclose(f(x), expect)
    np.testing.assert_allclose(jax.jit(f)(x), expect)
    np.testing.assert_allclose(jax.grad(lambda x: f(x).sum())(x), expect)
    assert isinstance(f.__name__, str) and f.__name__ in repr(f)


def test_foreign_functions_and_kernels_work_under_disable_jit():
    f = jb.foreign(lambda x: x)(lambda x: np.asarray(x) * 2)
    f.defvjp(lambda p, y, ct: (2 * ct,))
    x = jnp.linspace(-1.0, 1.0, 4)
    with jax.disable_jit():
        np.testing.assert_allclose(f(x), 2 * x)
        np.testing.assert_allclose(jax.jit(f)(x), 2 * x)
        np.testing.assert_allclose(jax.grad(lambda x: f(x).sum())(x), 2.0)
        np.testing.assert_allclose(jax.vmap(f)(x[:, None]), 2 * x[:, None])
        np.testing.assert_allclose(jb.ops.softplus(x), jnp.logaddexp(0, x), rtol=1e-6)
        np.testing.assert_allclose(jax.grad(lambda x: jb.ops.softplus(x).sum())(x),
                                   jax.nn.sigmoid(x), rtol=1e-6)


def test_call_signatures_per_function_are_bounded():
    from jaxbridge._foreign.definition import SIGNATURES_KEPT

    f = jb.foreign(lambda x, **_: x)(lambda x, k: np.asarray(x) + k)
    for k in range(SIGNATURES_KEPT + 40):  # a new static keyword value each call
        f(jnp.ones(1), k=float(k))
    assert len(f.definition.signatures) == SIGNATURES_KEPT
    np.testing.assert_allclose(f(jnp.ones(1), k=0.0), 1.0)  # an evicted one is remade
