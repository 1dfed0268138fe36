"""jaxbridge.torch: a large fresh result written by torch into XLA's buffer (`_redirect`).

With ``redirect=True`` (opt-in), after the first call, the operation that makes a
function's large result writes it into XLA's output buffer with its ``out=`` overload:
no result tensor of torch's own, no copy. Every test checks values against plain
torch/NumPy, and the fallbacks: other control flow, views, in-place updates, kept
results (every alias stays valid, with and without the redirect), exceptions, aliased
buffers.
"""

import os

import pytest

torch = pytest.importorskip(
    "torch", reason="jaxbridge.torch needs PyTorch: pip install -e '.[torch]' (Python 3.11)")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import jaxbridge.torch as jt  # noqa: E402
from jaxbridge.errors import KeptViewError  # noqa: E402
from jaxbridge.torch import _host, _redirect  # noqa: E402

# The fast path is the CPU path's (XLA's buffers as NumPy views): on the GPU machine
# these tests pin the CPU device.
pytestmark = pytest.mark.cpu

N = 1 << 20  # 4 MiB of float32: above _redirect.MIN_BYTES


def redirected(fn, **options):
    """`jt.wrap(fn, redirect=True)`: the redirect is opt-in."""
    return jt.wrap(fn, redirect=True, **options)


@pytest.fixture
def copies(monkeypatch):
    """How many results were copied into XLA's buffers (calls of `_write_one`)."""
    count = []
    write = _host._write_one

    def counted(*args):
        count.append(1)
        return write(*args)

    monkeypatch.setattr(_host, "_write_one", counted)
    return count


def test_a_fresh_result_is_written_into_xlas_buffer_after_the_first_call(copies):
    f = redirected(lambda x: x + 1)
    loop = jax.jit(lambda x: jax.lax.fori_loop(0, 50, lambda i, v: f(v), x))
    y = loop(jnp.zeros(N, jnp.float32))
    np.testing.assert_array_equal(y, 50.0)
    assert len(copies) == 1  # the first call learns (and copies); the other 49 do not
    z = loop(jnp.arange(N, dtype=jnp.float32))  # the same signature: nothing to learn
    np.testing.assert_array_equal(z, np.arange(N, dtype=np.float32) + 50)
    assert len(copies) == 1


def test_the_last_of_several_operations_is_the_one_redirected(copies):
    # sin, mul, add: the add (the third aten call) makes the result; an add of the
    # same kind after it, whose value is discarded, must not write into the buffer.
    def f(x):
        y = torch.sin(x) * 2 + 1
        _ = y + 5  # a later operation of the same overload, not the result
        return y

    g = jax.jit(redirected(f))
    x = jnp.linspace(-1.0, 1.0, N, dtype=jnp.float32)
    want = np.sin(np.asarray(x)) * 2 + 1
    for _ in range(3):
        np.testing.assert_allclose(g(x), want, rtol=1e-6, atol=1e-6)
    assert len(copies) == 1


def test_keyword_arguments_reach_the_out_overload(copies):
    f = jax.jit(redirected(lambda x: torch.add(x, 1, alpha=3)))  # alpha is keyword-only
    x = jnp.arange(N, dtype=jnp.float32)
    for _ in range(3):
        np.testing.assert_array_equal(f(x), x + 3)
    assert len(copies) == 1


def test_plans_need_256_kib_of_result_per_operation():
    # 17 aten calls (adds): a plan from a result of 17 x 256 KiB, none from one element
    # less (the dispatch mode's cost grows with the calls, the copy's saving with the bytes).
    def chain(x):
        def run():
            y = x
            for _ in range(17):
                y = y + 1
            return y
        return run

    n = 17 * (256 << 10) // 4
    for size, planned in ((n, True), (n - 1, False)):
        _, plan = _redirect.learn(chain(torch.zeros(size)), np.zeros(size, np.float32))
        assert (plan is not None) == planned, size


def test_small_results_are_copied_as_before(copies):
    # Below MIN_BYTES (1 MiB) the dispatch mode could cost more than the copy it saves:
    # 512 KiB from one operation is copied.
    f = jax.jit(redirected(lambda x: x + 1))
    x = jnp.arange(1 << 17, dtype=jnp.float32)
    for _ in range(3):
        np.testing.assert_array_equal(f(x), x + 1)
    assert len(copies) == 3


@pytest.mark.parametrize("dtype", [jnp.int32, jnp.float64, jnp.bfloat16])
def test_other_dtypes_and_two_arguments(copies, dtype):
    f = jax.jit(redirected(lambda a, b: a * b - a))
    a = jnp.arange(N, dtype=dtype) % 7
    b = jnp.full(N, 3, dtype)
    for _ in range(3):
        np.testing.assert_array_equal(f(a, b), a * b - a)
    # bfloat16 has no NumPy view of the same memory: its results are always copied
    assert len(copies) == (3 if dtype == jnp.bfloat16 else 1)


BRANCH = {"name": "add"}


def branchy(x):
    """The same signature, other operations, as a global says (data-dependent code)."""
    name = BRANCH["name"]
    if name == "add":
        return x + 1
    if name == "add_then_mul":  # the learned add now makes an intermediate
        return (x + 1) * 2
    if name == "transposed":  # the learned add fills the buffer; the result is its
        return (x + 1).t()     # transpose, a view: copied onto itself it would scramble
    return x * 3  # another operation where the add was


@pytest.mark.parametrize("later", ["add_then_mul", "transposed", "mul"])
def test_other_control_flow_on_a_later_call_falls_back_to_the_copy(copies, later):
    f = jax.jit(redirected(branchy))
    x = jnp.arange(N, dtype=jnp.float32).reshape(1024, 1024)
    BRANCH["name"] = "add"
    np.testing.assert_array_equal(f(x), x + 1)
    np.testing.assert_array_equal(f(x), x + 1)
    assert len(copies) == 1
    try:
        BRANCH["name"] = later
        want = {"add_then_mul": (x + 1) * 2, "transposed": (x + 1).T, "mul": x * 3}[later]
        np.testing.assert_array_equal(f(x), want)
        np.testing.assert_array_equal(f(x), want)
        BRANCH["name"] = "add"  # the plan was dropped at the surprise: copies from now on
        np.testing.assert_array_equal(f(x), x + 1)
        assert len(copies) == 4
    finally:
        BRANCH["name"] = "add"


@pytest.mark.parametrize("fn", [
    lambda x: (x + 1)[:],                      # a view: copied
    lambda x: (x + 1).mul_(2),                 # updated in place after it was made
    lambda x: torch.cat([x[: N // 2] + 1, x[N // 2:] - 1]),  # two operations' results
    lambda x: (x + 1).to(torch.float64).to(torch.float32),
], ids=["view", "in_place", "cat", "casts"])
def test_results_made_in_other_ways_are_right(fn):
    f = jax.jit(redirected(fn))
    x = jnp.arange(N, dtype=jnp.float32)
    want = fn(torch.from_numpy(np.asarray(x).copy())).numpy()
    for _ in range(3):
        np.testing.assert_array_equal(f(x), want)


def test_a_kept_result_stays_valid_and_later_calls_copy(copies):
    kept = []

    def keeps(x):
        y = x * 2
        kept.append(y)
        return y

    f = jax.jit(redirected(keeps))
    x = jnp.arange(N, dtype=jnp.float32)
    for k in range(4):
        np.testing.assert_array_equal(f(x + k), (x + k) * 2)
    values = [float(t[5]) for t in kept if t.device.type == "cpu"]  # not the meta trace's
    assert values == [10.0, 12.0, 14.0, 16.0]
    assert len(copies) == 3  # learned (copy), kept once (written in place), then copies


def test_an_exception_on_a_redirected_call_keeps_its_type():
    class Diverged(Exception):
        pass

    calls = []

    def fails_on_third(x):
        calls.append(1) if x.device.type == "cpu" else None  # not the meta-tensor trace
        if len(calls) == 3:
            raise Diverged("third call")
        return x + 1

    f = jax.jit(redirected(fails_on_third, result=jax.ShapeDtypeStruct((N,), jnp.float32)))
    x = jnp.zeros(N, jnp.float32)
    np.testing.assert_array_equal(f(x), 1.0)
    np.testing.assert_array_equal(f(x), 1.0)
    with pytest.raises(Diverged, match="third call"):
        jax.block_until_ready(f(x))
    np.testing.assert_array_equal(f(x), 1.0)


def test_derivatives_vmap_and_small_results_are_unchanged():
    f = redirected(lambda x: torch.sin(x) * 2)
    x = jnp.linspace(-3.0, 3.0, N, dtype=jnp.float32)
    for _ in range(2):
        np.testing.assert_allclose(jax.jit(f)(x), 2 * np.sin(np.asarray(x)), rtol=1e-6,
                                   atol=1e-6)
    g = jax.jit(jax.grad(lambda x: jnp.sum(f(x))))(x)
    np.testing.assert_allclose(g, 2 * np.cos(np.asarray(x)), rtol=1e-5, atol=1e-6)
    xb = x.reshape(2, -1)
    np.testing.assert_allclose(jax.jit(jax.vmap(f))(xb), 2 * np.sin(np.asarray(xb)),
                               rtol=1e-6, atol=1e-6)
    small = jnp.linspace(-1.0, 1.0, 1000, dtype=jnp.float32)
    np.testing.assert_allclose(jax.jit(f)(small), 2 * np.sin(np.asarray(small)), rtol=1e-6)


def test_a_wrong_result_is_still_named_on_the_learning_call():
    f = redirected(lambda x: x[1:] + 1, result=jax.ShapeDtypeStruct((N,), jnp.float32))
    with pytest.raises(Exception, match=r"shape"):
        jax.block_until_ready(jax.jit(f)(jnp.zeros(N, jnp.float32)))


def test_a_buffer_that_overlaps_an_input_is_never_written_through():
    a = np.zeros(16, np.float32)
    t = torch.from_numpy(a)
    assert _redirect.overlaps_inputs([t], a)
    assert _redirect.overlaps_inputs([t[4:8]], a[6:10])        # partial overlap
    assert not _redirect.overlaps_inputs([t[:8]], a[8:])        # adjacent
    assert not _redirect.overlaps_inputs([t[:0], 3.0], a)       # empty tensor, a static leaf
    assert _redirect.overlaps_inputs([torch.from_numpy(a[8:])], a[:9])


def test_plans_need_a_large_result_and_an_out_overload():
    big = np.zeros(N, np.float32)
    x = torch.ones(N)
    _, plan = _redirect.learn(lambda: x + 1, big)
    assert plan is not None and plan.index == 0 and plan.out_func.__name__ == "add.out"
    _, plan = _redirect.learn(lambda: x + 1, np.zeros(1000, np.float32)[:1000])
    assert plan is None  # too small: not worth the dispatch mode
    many = np.zeros(N, np.float32)  # 4 MiB over 20 operations: under 256 KiB each

    def chain():
        y = x
        for _ in range(20):
            y = y + 1
        return y
    _, plan = _redirect.learn(chain, many)
    assert plan is None
    _, plan = _redirect.learn(lambda: x.sum().expand(N).contiguous() * 1, big)
    assert plan is not None and plan.index == 3  # sum, expand, clone, mul: the last


def test_a_plan_far_into_the_sequence_fires():
    # The 301st aten call makes the result (positions past CPython's small-int cache).
    x = torch.zeros(4)

    def call():
        y = x
        for _ in range(301):
            y = y + 1
        return y

    _, plan = _redirect.learn(call, np.zeros(4, np.float32))
    assert plan is None  # 16 bytes: too small for a plan of its own; take the add's
    out = np.zeros(4, np.float32)
    plan = _redirect.Plan(300, torch.ops.aten.add.Tensor, torch.ops.aten.add.out)
    value, written, moved = _redirect.run_redirected(call, out, plan)
    assert written and not moved and value.data_ptr() == out.ctypes.data
    np.testing.assert_array_equal(out, 301.0)


@pytest.mark.slow  # a subprocess with 4 CPU devices: ~10 s
def test_sharded_calls_on_worker_threads_redirect_each_shard():
    # XLA runs one call per shard, on its worker threads at once: each writes its own
    # shard's buffer, under its own thread's dispatch mode.
    import os
    import subprocess
    import sys
    import textwrap
    script = textwrap.dedent("""
        import jax, jax.numpy as jnp, numpy as np, torch
        from jax.sharding import NamedSharding, PartitionSpec as P
        import jaxbridge.torch as jt
        from jaxbridge.torch import _host
        copies = []
        write = _host._write_one
        _host._write_one = lambda *a: (copies.append(1), write(*a))
        g = jax.jit(jt.wrap(lambda x: torch.sin(x) * 2 + x, batch_dims=1, redirect=True))
        mesh = jax.make_mesh((4,), ("b",))
        x = jax.device_put(np.linspace(-3, 3, 4 << 20, dtype=np.float32).reshape(8, -1),
                           NamedSharding(mesh, P("b")))
        learned = None
        for k in range(4):
            np.testing.assert_allclose(g(x + k), np.sin(np.asarray(x) + k) * 2
                                       + np.asarray(x) + k, rtol=1e-5, atol=1e-5)
            learned = len(copies) if learned is None else learned
        # the shards share one signature: 1 to 4 of them learn (and copy) on the first
        # call, as they race; every later call writes XLA's buffers directly
        assert 1 <= learned <= 4 and len(copies) == learned, (learned, copies)
        print("per shard OK")
    """)
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               XLA_FLAGS="--xla_force_host_platform_device_count=4")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=300, env=env)
    assert "per shard OK" in proc.stdout, proc.stdout + proc.stderr


# ------------------------------------------------ results the function keeps (issue #38)
class _Holder(torch.nn.Module):
    """A module that keeps its last output as an attribute (as activation caches do)."""

    def forward(self, x):
        y = torch.sin(x) * 2
        self.last = y.detach()
        return y


KEEPS = ["detach", "view", "slice", "list", "dict", "module_attribute", "itself"]


def _keeping():
    """`torch.sin(x) * 2` keeping, on every call, each kind of thing that shares its
    result's memory; and a function returning, per kind, what each call kept (the
    meta-tensor trace's left out)."""
    holder, calls, cache, kept = _Holder(), [], {}, {how: [] for how in KEEPS}

    def run(x):
        y = holder(x)
        calls.append(y.device.type)
        key = len(calls)
        cache[key] = {"last": y}
        kept["detach"].append(y.detach())
        kept["view"].append(y.view(-1))
        kept["slice"].append(y[1:])
        kept["list"].append([y])
        kept["dict"].append(cache[key])
        kept["module_attribute"].append(holder.last)
        kept["itself"].append(y)
        return y

    def read(how):
        values = [v for v, device in zip(kept[how], calls) if device == "cpu"]
        return [v[0] if isinstance(v, list) else v["last"] if isinstance(v, dict) else v
                for v in values]
    return run, read


@pytest.mark.parametrize("redirect", [False, True], ids=["default", "redirect"])
def test_a_kept_alias_of_the_result_stays_valid_after_later_jax_work(redirect):
    # Found on 46cbabe: the alias pointed into XLA's freed output buffer (KeptViewError
    # on the second call, garbage after an unrelated jnp.full, a segfault at 16M).
    run, read = _keeping()
    g = jax.jit(jt.wrap(run, redirect=True) if redirect else jt.wrap(run))
    x = jnp.linspace(-1.0, 1.0, N, dtype=jnp.float32)
    wants = [2 * np.sin(np.asarray(x + k)) for k in range(3)]
    for k in range(3):
        y = g(x + k)
        np.testing.assert_allclose(y, wants[k], rtol=1e-6, atol=1e-6)
        del y
        other = [jnp.full(N, 7.0 + i, jnp.float32) * (i + 1) for i in range(4)]
        jax.block_until_ready(other)  # XLA reuses the freed buffers for these
        for how in KEEPS:
            kept = read(how)
            assert len(kept) == k + 1, how
            for j in {0, k}:  # the first call's (the longest kept) and this call's
                want = wants[j][1:] if how == "slice" else wants[j]
                np.testing.assert_allclose(kept[j].numpy(), want, rtol=1e-6, atol=1e-6,
                                           err_msg=f"{how}: call {j}, checked after call {k}")


def test_the_redirect_is_opt_in_and_copies_by_default(copies):
    f = jax.jit(jt.wrap(lambda x: x + 1))
    x = jnp.arange(N, dtype=jnp.float32)
    for _ in range(3):
        np.testing.assert_array_equal(f(x), x + 1)
    assert len(copies) == 3


@pytest.mark.slow  # a subprocess, 64 MiB results on 2 cores: ~15 s
def test_a_kept_detached_result_of_16m_elements_does_not_crash():
    # 46cbabe: a segfault (or garbage) once XLA reused the 64 MiB buffer.
    import subprocess
    import sys
    import textwrap
    script = textwrap.dedent("""
        import jax, jax.numpy as jnp, numpy as np, torch
        import jaxbridge.torch as jt
        cache = {}

        def f(x):
            y = torch.sin(x) * 2
            cache["last"] = y.detach()
            return y

        n = 16 << 20
        x = jnp.linspace(-1.0, 1.0, n, dtype=jnp.float32)
        for redirect in (False, True):
            g = jax.jit(jt.wrap(f, redirect=redirect))
            for k in range(3):
                y = g(x + k)
                del y
                other = [jnp.full(n, 3.0, jnp.float32) + i for i in range(3)]
                jax.block_until_ready(other)
                want = 2 * np.sin(np.asarray(x + k))
                assert np.allclose(cache["last"].numpy(), want, atol=1e-5), (redirect, k)
                del other
        print("kept alias valid")
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=240, env=dict(os.environ, JAX_PLATFORMS="cpu"))
    assert proc.returncode == 0 and "kept alias valid" in proc.stdout, \
        (proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:])


@pytest.mark.parametrize("how", ["itself", "view", "detach"])
def test_out_true_keeping_its_output_buffer_fails_and_the_kept_tensor_stays_valid(how):
    # 46cbabe: KeptViewError said the kept arrays got a private copy, but the torch
    # tensor still pointed into XLA's buffer
    kept = []

    @jt.wrap(result=lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), out=True)
    def doubled(x, out):
        torch.mul(x, 2, out=out)
        if out.device.type == "cpu":  # not the meta-tensor trace
            kept.append({"itself": out, "view": out[:], "detach": out.detach()}[how])

    x = jnp.arange(N, dtype=jnp.float32)
    with pytest.raises(KeptViewError, match="'doubled' .out=True. kept output tensor"):
        jax.block_until_ready(jax.jit(doubled)(x))
    jax.block_until_ready([jnp.full(N, 5.0, jnp.float32) + i for i in range(4)])
    np.testing.assert_array_equal(kept[0].numpy(), 2 * np.asarray(x))
