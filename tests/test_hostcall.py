"""The host-call path: errors that keep their identity, checked results, no leaks,
no deadlocks, zero-copy read-only views."""

import gc
import re
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxbridge as jb
from jaxbridge._foreign import hostcall as _hostcall

BACKENDS = ["native", "pure_callback"]


def identity_spec(x):
    return x


@pytest.mark.parametrize("jit", [False, True])
def test_exception_reaches_caller_as_itself_naming_the_function(jit):
    @jb.foreign(identity_spec)
    def exploding(x):
        raise KeyError("the key that was missing")

    call = jax.jit(exploding) if jit else exploding
    with pytest.raises(KeyError, match="the key that was missing") as info:
        jax.block_until_ready(call(jnp.ones(3)))
    assert any("'exploding'" in note for note in info.value.__notes__)
    # The process keeps working afterwards.
    assert float(jax.jit(lambda x: x + 1)(1.0)) == 2.0


@pytest.mark.parametrize("jit", [False, True])
def test_pure_callback_backend_raises_the_exception_itself_naming_the_function(jit):
    # jax.pure_callback turns exceptions into runtime errors; ours carries a token, and
    # the runtime error JAX raises for it is the user's exception object.
    log = []

    @jb.foreign(identity_spec, backend="pure_callback")
    def exploding(x):
        log.append(KeyError("the key that was missing"))
        raise log[-1]

    call = jax.jit(exploding) if jit else exploding
    with pytest.raises(KeyError, match="the key that was missing") as info:
        jax.block_until_ready(call(jnp.ones(3)))
    assert info.value is log[-1]
    assert any("'exploding'" in note for note in info.value.__notes__)
    if jit:  # it crossed XLA as a status: the object kept for it is the one raised
        assert jb.errors.original_exception(info.value) is info.value


@pytest.mark.parametrize("backend", BACKENDS)
def test_exception_in_a_rule_names_the_rule(backend):
    @jb.foreign(identity_spec, backend=backend)
    def f(x):
        return np.sin(x)

    @f.defvjp
    def _vjp(primals, out, ct):
        raise ZeroDivisionError("adjoint failed")

    with pytest.raises(ZeroDivisionError, match="adjoint failed") as info:
        jax.block_until_ready(jax.jit(jax.grad(lambda x: jnp.sum(f(x))))(jnp.ones(2)))
    assert any("VJP rule (defvjp)" in n and "'f'" in n for n in info.value.__notes__)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "result, pattern",
    [
        (lambda x: np.ones(4),
         r"output of foreign function 'f' has shape \[4\].*declared float64\[3\]"),
        (lambda x: np.ones(3, np.float32), r"dtype float32; declared float64\[3\].*astype"),
        (lambda x: (x, x), r"output of foreign function 'f' has the wrong structure"),
        (lambda x: None, r"output of foreign function 'f' is None"),
    ],
)
def test_wrong_results_are_reported_not_cast(backend, result, pattern):
    @jb.foreign(identity_spec, backend=backend)
    def f(x):
        return result(x)

    with pytest.raises(Exception, match=pattern):
        jax.block_until_ready(jax.jit(f)(jnp.ones(3)))


@pytest.mark.parametrize(
    "rule, pattern",
    [
        (lambda p, o, ct: (ct, ct), r"one cotangent \(or None\) per positional argument \(1\)"),
        (lambda p, o, ct: ct, r"must return a tuple"),
        (lambda p, o, ct: (np.ones(5),), r"cotangent 0 .*shape \[5\].*declared float64\[3\]"),
        (lambda p, o, ct: (ct.astype(np.float32),), r"cotangent 0 .*dtype float32.*astype"),
    ],
)
def test_wrong_cotangents_are_reported(rule, pattern):
    @jb.foreign(identity_spec)
    def f(x):
        return np.sin(x)

    f.defvjp(rule)
    with pytest.raises(Exception, match=pattern):
        jax.block_until_ready(jax.grad(lambda x: jnp.sum(f(x)))(jnp.ones(3)))


def test_wrong_tangent_is_reported():
    @jb.foreign(identity_spec)
    def f(x):
        return np.sin(x)

    f.defjvp(lambda p, o, t: np.ones(7))
    with pytest.raises(Exception, match=r"tangent output of foreign function 'f' has shape \[7\]"):
        jax.block_until_ready(jax.jvp(f, (jnp.ones(3),), (jnp.ones(3),)))


def test_none_tangent_is_zeros_from_a_jvp_rule_and_an_error_from_a_linear_function():
    # A JVP rule may return None for an output leaf that does not move: zeros.
    @jb.foreign(lambda x: {"y": x, "c": x})
    def f(x):
        return {"y": np.sin(x), "c": np.full_like(x, 3.0)}

    f.defjvp(lambda p, o, t: {"y": np.cos(p[0]) * t[0], "c": None})

    def twin(x):
        return {"y": jnp.sin(x), "c": jnp.full_like(x, 3.0)}

    x, t = jnp.linspace(-1.0, 1.0, 4), jnp.arange(1.0, 5.0)
    for ours, ref in ((jax.jvp(f, (x,), (t,))[1], jax.jvp(twin, (x,), (t,))[1]),
                      (jax.jit(jax.jacfwd(f))(x), jax.jacfwd(twin)(x))):
        np.testing.assert_allclose(ours["y"], ref["y"], rtol=1e-15)
        np.testing.assert_array_equal(ours["c"], ref["c"])

    # A linear function is its own tangent: None there is the function's bug, reported
    # (here it returns None for a zero input, so only its tangent call sees it).
    @jb.foreign(identity_spec, linear=True)
    def double(x):
        return 2 * x if np.any(x) else None

    with pytest.raises(Exception, match=r"tangent output of foreign function 'double' is None"):
        jax.block_until_ready(jax.jvp(double, (jnp.ones(3),), (jnp.zeros(3),)))


def test_bad_declarations_and_arguments_fail_at_trace_time():
    with pytest.raises(ValueError, match="vmap must be one of"):
        jb.foreign(identity_spec, vmap="parallel")(np.sin)
    with pytest.raises(ValueError, match="backend must be one of"):
        jb.foreign(identity_spec, backend="gpu")(np.sin)
    with pytest.raises(TypeError, match="must be a pytree of jax.ShapeDtypeStruct"):
        jb.foreign(lambda x: "not a shape")(np.sin)(jnp.ones(2))

    @jb.foreign(lambda x, *, opts: x)
    def f(x, *, opts):
        return x

    with pytest.raises(TypeError, match=r"keyword argument 'opts' is static.*hashable"):
        f(jnp.ones(2), opts=[1, 2])
    with pytest.raises(ValueError, match="kind must be one of"):
        f.defvjp(lambda *a: None, kind="torch")


def test_inputs_are_read_only_zero_copy_views():
    seen = {}

    @jb.foreign(identity_spec, backend="native")
    def f(x):
        seen["writeable"] = x.flags.writeable
        seen["owndata"] = x.flags.owndata
        try:
            x[0] = 1.0
        except ValueError:
            seen["write_refused"] = True
        return x * 2

    np.testing.assert_allclose(jax.jit(f)(jnp.arange(3.0)), [0, 2, 4])
    assert seen == {"writeable": False, "owndata": False, "write_refused": True}


def test_native_backend_is_used_on_cpu():
    assert "cpu" in _hostcall.native_platforms()

    @jb.foreign(identity_spec, backend="native")
    def f(x):
        return x + 1

    text = jax.jit(f).lower(jnp.ones(2)).as_text()
    assert "jaxbridge_host_call" in text


def test_function_that_calls_jax_does_not_deadlock():
    @jb.foreign(identity_spec)
    def uses_jax(x):
        return np.asarray(jax.jit(jnp.sin)(jnp.asarray(x)))

    out = jax.jit(lambda x: jax.lax.fori_loop(0, 3, lambda i, x: uses_jax(x), x))(jnp.ones(3))
    np.testing.assert_allclose(out, np.sin(np.sin(np.sin(np.ones(3)))), rtol=1e-12)


def test_concurrent_calls_from_threads():
    @jb.foreign(identity_spec)
    def f(x):
        return np.cos(x)

    g = jax.jit(f)
    errors = []

    def work(seed):
        try:
            x = jnp.full(16, float(seed))
            for _ in range(20):
                np.testing.assert_allclose(g(x), np.cos(np.asarray(x)))
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors and not any(t.is_alive() for t in threads)


@pytest.mark.slow
def test_many_closures_traced_repeatedly_do_not_leak_callables():
    def run_batch(n):
        for i in range(n):
            @jb.foreign(identity_spec)
            def f(x, i=i):
                return x + i

            f.defvjp(lambda p, o, ct: (ct,))
            jax.jit(jax.grad(lambda x: jnp.sum(f(x))))(jnp.ones(2)).block_until_ready()

    run_batch(20)
    jax.clear_caches()
    gc.collect()
    baseline = _hostcall.num_registered()
    run_batch(60)
    jax.clear_caches()
    gc.collect()
    assert _hostcall.num_registered() <= baseline + 5


# ----------------------------------------------------------------- aliases=
def _add_one_in_place(seen=None):
    def add_one(x, *, out):
        if seen is not None:
            seen.append(np.shares_memory(x, out))
        np.add(x, 1.0, out=out)

    f = jb.foreign(identity_spec, out=True, aliases={"forward": {0: 0}})(add_one)
    f.defvjp(lambda primals, out, ct: (ct,))
    return f


def test_aliased_result_is_written_into_the_input_buffer():
    seen = []
    f = _add_one_in_place(seen)
    hlo = jax.jit(f).lower(jnp.ones(4)).as_text()
    assert re.search(r"output_operand_alias<[^>]*operand_index = 0", hlo), hlo
    # A temporary input (dead after the call) is updated in place: no fresh buffer.
    out = jax.jit(lambda x: jax.lax.fori_loop(0, 3, lambda i, v: f(v * 2.0), x))(jnp.ones(4))
    np.testing.assert_allclose(out, 15.0)  # ((1*2+1)*2+1)*2+1
    assert seen and all(seen), seen


def test_aliased_values_under_jit_grad_vmap_and_scan():
    f = _add_one_in_place()
    x = jnp.arange(6.0).reshape(2, 3)
    np.testing.assert_allclose(jax.jit(f)(x), x + 1)
    np.testing.assert_allclose(f(x), x + 1)  # eager
    np.testing.assert_allclose(jax.vmap(f)(x), x + 1)
    np.testing.assert_allclose(jax.jit(jax.vmap(f, in_axes=1, out_axes=1))(x), x + 1)
    g = jax.jit(jax.grad(lambda x: jnp.sum(f(x) * x)))(x)
    np.testing.assert_allclose(g, 2 * x + 1)  # d/dx sum((x + 1) x)
    carry, _ = jax.lax.scan(lambda c, _: (f(c), None), x, None, length=4)
    np.testing.assert_allclose(carry, x + 4)


def test_aliased_input_still_live_is_not_clobbered():
    f = _add_one_in_place()
    x = jnp.arange(4.0)
    both = jax.jit(lambda x: (f(x), x * 10.0))(x)  # x is used after the call: XLA copies
    np.testing.assert_allclose(both[0], [1, 2, 3, 4])
    np.testing.assert_allclose(both[1], [0, 10, 20, 30])
    np.testing.assert_allclose(x, [0, 1, 2, 3])  # the caller's array is untouched
    np.testing.assert_allclose(jax.jit(f)(x), [1, 2, 3, 4])
    np.testing.assert_allclose(x, [0, 1, 2, 3])


def test_aliases_of_a_returning_function_with_pytree_arguments():
    # Operands are the array leaves of the arguments (s, d["a"], d["b"]), results the
    # leaves of the result ({"a", "b"}); a function that returns is copied into them.
    @jb.foreign(lambda s, d: d, aliases={"forward": {1: 0, 2: 1}})
    def scaled(s, d):
        return {"a": d["a"] * s, "b": d["b"] + 1}

    d = {"a": jnp.ones(3), "b": jnp.zeros(2, jnp.int32)}
    out = jax.jit(scaled)(jnp.float32(3.0), d)
    np.testing.assert_allclose(out["a"], 3.0)
    np.testing.assert_array_equal(out["b"], [1, 1])
    np.testing.assert_allclose(d["a"], 1.0)  # not clobbered
    hlo = jax.jit(scaled).lower(jnp.float32(3.0), d).as_text()
    assert len(re.findall(r"output_operand_alias<", hlo)) == 2


@pytest.mark.parametrize("aliases, error, pattern", [
    ([(0, 0)], TypeError, r"argument 'aliases': expected a dict"),
    ({"adjoint": {0: 0}}, ValueError, r"unknown role 'adjoint'"),
    ({"forward": {0: -1}}, TypeError, r"non-negative ints"),
    ({"forward": {0: True}}, TypeError, r"non-negative ints"),
    ({"forward": {0: 0, 1: 0}}, ValueError, r"two operands aliased to the same result"),
])
def test_bad_aliases_are_refused_when_declared(aliases, error, pattern):
    with pytest.raises(error, match=r"jaxbridge.foreign 'f'.*" + pattern):
        @jb.foreign(identity_spec, aliases=aliases)
        def f(x):
            return x


def test_aliases_that_do_not_fit_the_call_are_refused_at_trace_time():
    @jb.foreign(lambda x, i: x, aliases={"forward": {1: 0}})
    def f(x, i):
        return x

    with pytest.raises(ValueError, match=r"aliases\['forward'\] maps operand 1 "
                       r"\(int32\[3\]\) to result 0 \(float32\[3\]\); aliased buffers "
                       r"need the same shape and dtype"):
        jax.jit(f)(jnp.ones(3, jnp.float32), jnp.ones(3, jnp.int32))

    @jb.foreign(identity_spec, aliases={"forward": {2: 0}})
    def g(x):
        return x

    with pytest.raises(ValueError, match=r"maps operand 2 to result 0, but this call has 1 "
                       r"array operand\(s\) and 1 result\(s\)"):
        g(jnp.ones(3))


# ----------------------------------------------------------------- GPU
# Host calls from GPU programs: the CUDA handler stages operands through pinned host
# memory on XLA's stream (csrc/hostcall/cuda_staging.cc); pure_callback is the fallback.
@pytest.mark.gpu
@pytest.mark.parametrize("backend", BACKENDS)
def test_gpu_host_call_values_grad_and_vmap(gpu, backend):
    import os
    if backend == "native" and os.environ.get("JAXBRIDGE_GPU_TESTS_ON_CPU") != "1":
        assert "cuda" in _hostcall.native_platforms(), "built without the CUDA host-call handler"

    @jb.foreign(lambda x, k: (x, jax.ShapeDtypeStruct(k.shape, k.dtype)), backend=backend)
    def sin_and_count(x, k):
        return np.sin(x), k + 1

    @sin_and_count.defvjp
    def _(primals, out, ct):
        return (np.cos(primals[0]) * ct[0], None)

    rng = np.random.default_rng(0)
    for shape in [(0,), (1,), (3, 5), (1 << 20,)]:  # the last one regrows the staging block
        x = jax.device_put(rng.normal(size=shape), gpu)
        k = jax.device_put(np.arange(int(np.prod(shape)), dtype=np.int32).reshape(shape), gpu)
        y, k1 = jax.jit(sin_and_count)(x, k)
        assert y.devices() == {gpu}
        np.testing.assert_allclose(y, np.sin(np.asarray(x)), rtol=1e-15)
        np.testing.assert_array_equal(k1, np.asarray(k) + 1)
        g = jax.jit(jax.grad(lambda x: sin_and_count(x, k)[0].sum()))(x)
        np.testing.assert_allclose(g, np.cos(np.asarray(x)), rtol=1e-15)
    xs = jax.device_put(rng.normal(size=(4, 3)), gpu)
    ks = jax.device_put(np.zeros((4, 3), np.int32), gpu)
    np.testing.assert_allclose(jax.vmap(sin_and_count)(xs, ks)[0], np.sin(np.asarray(xs)))


@pytest.mark.gpu
def test_gpu_host_calls_in_a_scan_see_the_previous_step(gpu):
    # Each call must wait for the kernel before it (stream order) and its result
    # must be on the device before the next kernel reads it.
    @jb.foreign(identity_spec)
    def host_step(x):
        return np.sqrt(x + 1.0)

    def step(c, _):
        c = host_step(c * 2.0)
        return c, c.sum()

    x0 = jax.device_put(np.linspace(0, 1, 4096), gpu)
    out, sums = jax.jit(lambda x: jax.lax.scan(step, x, None, length=50))(x0)
    ref, ref_sums = np.asarray(x0), []
    for _ in range(50):
        ref = np.sqrt(ref * 2.0 + 1.0)
        ref_sums.append(ref.sum())
    np.testing.assert_allclose(out, ref, rtol=1e-14)
    np.testing.assert_allclose(sums, ref_sums, rtol=1e-13)


@pytest.mark.gpu
@pytest.mark.parametrize("size", [4, 1 << 20])
def test_gpu_aliased_result_is_written_into_the_staged_input(gpu, size):
    # On the GPU both the operand and the result are staged through host memory; an
    # aliased pair shares one staging slot, so the function updates its input in place
    # there as on the CPU, and the device buffer gets the result.
    seen = []
    f = _add_one_in_place(seen)
    x = jax.device_put(np.linspace(0.0, 1.0, size), gpu)
    out = jax.jit(lambda x: jax.lax.fori_loop(0, 3, lambda i, v: f(v * 2.0), x))(x)
    assert out.devices() == {gpu}
    np.testing.assert_allclose(out, np.asarray(x) * 8.0 + 7.0, rtol=1e-15)
    assert seen and all(seen), seen
    both = jax.jit(lambda x: (f(x), x * 10.0))(x)  # x still live: XLA copies, not clobbered
    np.testing.assert_allclose(both[0], np.asarray(x) + 1.0)
    np.testing.assert_allclose(both[1], np.asarray(x) * 10.0)


@pytest.mark.gpu
def test_gpu_host_call_exception_keeps_its_identity(gpu):
    @jb.foreign(identity_spec)
    def exploding_on_gpu(x):
        raise KeyError("missing on the GPU path")

    with pytest.raises(KeyError, match="missing on the GPU path") as info:
        jax.block_until_ready(jax.jit(exploding_on_gpu)(jax.device_put(np.ones(3), gpu)))
    assert any("'exploding_on_gpu'" in note for note in info.value.__notes__)
    x = jax.device_put(np.ones(3), gpu)
    np.testing.assert_allclose(jax.jit(lambda x: x + 1)(x), 2.0)  # the device still works


def test_vmap_of_a_batch_dims_function_is_one_host_call_looping_on_the_host():
    # vmap adds a batch dimension XLA may split (on a mesh, lax.map would gather); the
    # function itself still sees one element's arrays, as vmap="loop" promises.
    seen = []

    @jb.foreign(lambda x, w: x, batch_dims=1)
    def rows(x, w):
        seen.append((x.shape, w.shape))
        return np.tanh(x * w)

    rows.defvjp(lambda p, y, ct: ((1 - y ** 2) * ct * p[1], (1 - y ** 2) * ct * p[0]))
    x = jnp.linspace(-1, 1, 3 * 4 * 2).reshape(3, 4, 2)
    w = jnp.linspace(0.5, 1.5, 4 * 2).reshape(4, 2)
    out = jax.jit(jax.vmap(rows, in_axes=(0, None)))(x, w)
    np.testing.assert_allclose(out, np.tanh(np.asarray(x) * np.asarray(w)), rtol=1e-6)
    assert seen == [((4, 2), (4, 2))] * 3
    hlo = jax.jit(jax.vmap(rows, in_axes=(0, None))).lower(x, w).as_text()
    assert hlo.count("custom_call @jaxbridge_host_call") == 1  # one call, not a loop
    g = jax.jit(jax.grad(lambda w: jnp.sum(jax.vmap(rows, in_axes=(1, None),
                                                    out_axes=1)(x.transpose(1, 0, 2), w))))(w)
    ref = jax.grad(lambda w: jnp.sum(jnp.tanh(x * w[None])))(w)
    np.testing.assert_allclose(g, ref, rtol=1e-5)
