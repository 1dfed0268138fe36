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


@pytest.mark.parametrize("kind", ["jit", "eager", "jit(grad)"])
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
    (jnp.int32, 3.7, "dtype"),                   # was silently truncated to 3
    (jnp.float32, np.complex128(1 + 2j), "dtype"),  # was silently 1.0
    (jnp.float16, 1e6, "dtype"),                 # was silently inf
    (jnp.float32, 0.5, "dtype"),                 # a Python float is float64
    (jnp.float32, np.ones(2, np.float32), "shape"),
    (jnp.float32, None, "none"),
])
def test_scalar_results_are_checked_like_arrays(declared, value, problem):
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
