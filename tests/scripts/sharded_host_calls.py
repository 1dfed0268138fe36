"""Run under 8 forced CPU devices (by tests/test_sharding.py): foreign functions on
sharded inputs run once per shard with no all-gather of their inputs."""

import os

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + " --xla_force_host_platform_device_count=8")

import re  # noqa: E402
import threading  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import jaxbridge as jb  # noqa: E402
from jaxbridge import ops  # noqa: E402

jax.config.update("jax_enable_x64", True)
calls = []


@jb.foreign(lambda x, y: x, batch_dims=1)
def sin_mul(x, y):
    calls.append(("forward", x.shape))
    return np.sin(x) * y


@sin_mul.defvjp
def _vjp(primals, out, ct):
    calls.append(("vjp", ct.shape))
    x, y = primals
    return np.cos(x) * y * ct, np.sin(x) * ct


def custom_call_operand_shapes(hlo: str, target: str) -> list[str]:
    """The result shapes of the custom calls of `target` (a tuple's first element)."""
    return [s.lstrip("(") for s in re.findall(
        r"= (\S+) custom-call\([^)]*\), custom_call_target=\"" + target, hlo)]


def explicit_axes(sin_mul) -> None:
    """Meshes with AxisType.Explicit axes (jax.make_mesh's default in new JAX): results
    are typed sharded like their inputs, one call per shard, no gather."""
    from jax.sharding import AxisType

    mesh = jax.make_mesh((8,), ("e",), axis_types=(AxisType.Explicit,))
    with jax.sharding.use_mesh(mesh) if hasattr(jax.sharding, "use_mesh") \
            else jax.set_mesh(mesh):
        shard = NamedSharding(mesh, P("e"))
        x = jax.device_put(jnp.linspace(0, 1, 16 * 3).reshape(16, 3), shard)
        y = jax.device_put(jnp.linspace(1, 2, 16 * 3).reshape(16, 3), shard)
        for f, args, target, local in (
                (sin_mul, (x, y), "xla_buffer_python_cpu_callback", "f64[2,3]"),
                (ops.softplus, (x,), "jaxbridge_softplus_fwd", "f64[2,3,1]")):
            out = jax.jit(f)(*args)
            assert out.sharding.spec[0] == "e", (target, out.sharding)
            assert str(jax.typeof(out)).startswith("float64[16@e"), jax.typeof(out)
            hlo = jax.jit(f).lower(*args).compile().as_text()
            shapes = custom_call_operand_shapes(hlo, target)
            assert shapes and all(s.startswith(local) for s in shapes), (target, shapes)
            assert "all-gather" not in hlo, target
            g = jax.jit(jax.grad(lambda *a: jnp.sum(f(*a) ** 2)))(*args)
            assert g.sharding.spec[0] == "e", g.sharding
        np.testing.assert_allclose(jax.jit(sin_mul)(x, y), np.sin(np.asarray(x)) * np.asarray(y))
        np.testing.assert_allclose(jax.jit(ops.softplus)(x), np.logaddexp(0, np.asarray(x)))


def kernels_split_only_their_batch_dims(mesh) -> None:
    """Built-in kernels declare which axes are independent: elementwise softplus splits
    along every axis of x (here the second), while a tridiagonal system is coupled along
    n: sharded along n, its inputs are gathered and each system solved whole (the
    declared batch dims are the leading ones), never solved per shard in pieces."""
    cols = NamedSharding(mesh, P(None, "batch"))
    x = jax.device_put(jnp.linspace(-2, 2, 3 * 16).reshape(3, 16), cols)
    np.testing.assert_allclose(jax.jit(ops.softplus)(x), np.logaddexp(0, np.asarray(x)))
    hlo = jax.jit(ops.softplus).lower(x).compile().as_text()
    shapes = custom_call_operand_shapes(hlo, "jaxbridge_softplus_fwd")
    assert shapes and all(s.startswith("f64[3,2,") for s in shapes), shapes
    assert "all-gather" not in hlo
    d, off = jax.device_put(jnp.full((2, 16), 4.0), cols), jax.device_put(jnp.ones((2, 16)), cols)
    b = jax.device_put(jnp.arange(32.0).reshape(2, 16), cols)
    A = np.diag(np.full(16, 4.0)) + np.diag(np.ones(15), 1) + np.diag(np.ones(15), -1)
    np.testing.assert_allclose(jax.jit(ops.tridiagonal_solve)(off, d, off, b),
                               np.linalg.solve(A, np.asarray(b).T).T, rtol=1e-12)


def main() -> None:
    assert jax.device_count() == 8
    mesh = Mesh(np.array(jax.devices()), ("batch",))
    shard = NamedSharding(mesh, P("batch"))
    x = jax.device_put(jnp.linspace(0, 1, 16 * 3).reshape(16, 3), shard)
    y = jax.device_put(jnp.linspace(1, 2, 16 * 3).reshape(16, 3), shard)

    loss = lambda x, y: jnp.sum(sin_mul(x, y) ** 2)  # noqa: E731
    ref = lambda x, y: jnp.sum((jnp.sin(x) * y) ** 2)  # noqa: E731
    step = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)), out_shardings=(None, (shard, shard)))
    value, grads = step(x, y)
    ref_value, ref_grads = jax.value_and_grad(ref, argnums=(0, 1))(x, y)
    np.testing.assert_allclose(value, ref_value, rtol=1e-12)
    for g, r in zip(grads, ref_grads):
        np.testing.assert_allclose(g, r, rtol=1e-12)
        assert g.sharding.spec == P("batch"), g.sharding

    # One call per shard, each on the shard's own rows (2 of 16), forward and adjoint.
    assert sorted(calls) == sorted([("forward", (2, 3))] * 8 + [("vjp", (2, 3))] * 8), calls
    hlo = step.lower(x, y).compile().as_text()
    # (in a program on several CPU devices, host calls run inside XLA's buffer callback)
    shapes = custom_call_operand_shapes(hlo, "xla_buffer_python_cpu_callback")
    assert shapes and all(s.startswith("f64[2,3]") for s in shapes), shapes
    gathered = re.findall(r"all-gather\(([^)]*)\)", hlo)
    assert not any("param" in operand for operand in gathered), f"inputs gathered: {gathered}"

    # A function that cannot be split is an error, not a silent gather ...
    plain = jb.foreign(lambda x: x)(np.sin)
    try:
        jax.jit(plain)(x)
    except jb.errors.ShardingError as exc:
        assert "would gather its inputs" in str(exc) and "batch_dims" in str(exc)
    else:
        raise AssertionError("expected an error for an unsplittable call on a mesh")
    # ... unless the gather is asked for explicitly.
    replicated = jb.foreign(lambda x: x, on_mesh="replicate")(np.sin)
    np.testing.assert_allclose(jax.jit(replicated)(x), np.sin(np.asarray(x)))

    # shard_map: a replicated parameter's gradient sums every shard's contribution.
    @jb.foreign(lambda w, x: x)
    def layer(w, x):
        return np.tanh(w * x)

    layer.defvjp(lambda p, out, ct: (np.sum((1 - out ** 2) * ct * p[1], axis=0),
                                     (1 - out ** 2) * ct * p[0]))
    w = jnp.array([0.5, 1.0, 1.5])
    mapped = jax.shard_map(layer, mesh=mesh, in_specs=(P(), P("batch")), out_specs=P("batch"))
    g = jax.jit(jax.grad(lambda w: jnp.sum(mapped(w, x))))(w)
    np.testing.assert_allclose(g, jax.grad(lambda w: jnp.sum(jnp.tanh(w * x)))(w), rtol=1e-12)
    # Built-in C++ kernels are batch-partitionable: one call per shard, no gather ...
    hlo = jax.jit(jax.grad(lambda x: jnp.sum(ops.softplus(x)))).lower(x).compile().as_text()
    shapes = custom_call_operand_shapes(hlo, "jaxbridge_softplus_adj")  # (x[..., None])
    assert shapes and all(s.startswith("f64[2,3,1]") for s in shapes), shapes
    assert not any("param" in op for op in re.findall(r"all-gather\(([^)]*)\)", hlo))
    np.testing.assert_allclose(jax.jit(ops.softplus)(x), np.logaddexp(0, np.asarray(x)))
    # ... a kernel that declares no batch dimensions is an error, not a silent gather ...
    plain_kernel = jb.kernel("jaxbridge_softplus_fwd", result=lambda x, **_: x,
                             attrs={"beta": 1.0}, name="softplus_unsplit")
    try:
        jax.jit(plain_kernel)(x)
    except jb.errors.ShardingError as exc:
        assert "shard_map" in str(exc) and "batch_dims" in str(exc)
    else:
        raise AssertionError("expected an error for an unsplittable kernel on a mesh")
    # ... and inside shard_map every kernel runs per shard.
    per_shard = jax.shard_map(ops.softplus, mesh=mesh, in_specs=P("batch"), out_specs=P("batch"))
    g = jax.jit(jax.grad(lambda x: jnp.sum(per_shard(x))))(x)
    np.testing.assert_allclose(g, jax.nn.sigmoid(x), rtol=1e-12)
    explicit_axes(sin_mul)
    kernels_split_only_their_batch_dims(mesh)

    # Per-shard calls run on XLA's worker threads, where the calling Python thread cannot
    # be reached: the exception crosses XLA as a status, and JAX's runtime error for it
    # is raised as the exception object itself, under jit and in a jitted gradient.
    class ShardFailure(Exception):
        pass

    raised, workers = [], []

    def fail(what):
        workers.append(isinstance(threading.current_thread(), threading._DummyThread))
        raised.append(ShardFailure(f"shard went wrong in the {what}"))
        raise raised[-1]

    failing = {"forward": True}

    @jb.foreign(lambda x: x, batch_dims=1)
    def fails_per_shard(x):
        if failing["forward"]:
            fail("forward")
        return np.sin(x)

    @fails_per_shard.defvjp
    def _fails(primals, out, ct):
        fail("adjoint")

    loss = jax.jit(jax.grad(lambda x: jnp.sum(fails_per_shard(x))))
    for program, what in ((jax.jit(fails_per_shard), "forward"), (loss, "forward"),
                          (loss, "adjoint")):
        failing["forward"] = what == "forward"
        raised.clear()
        workers.clear()
        try:
            jax.block_until_ready(program(x))
        except ShardFailure as exc:
            assert any(exc is r for r in raised) and what in str(exc), (exc, what)
            assert any("'fails_per_shard'" in n for n in exc.__notes__), exc.__notes__
        else:
            raise AssertionError("expected the shard's exception")
        assert any(workers), "expected per-shard calls on XLA's worker threads"
    # ... and eager calls, where jaxbridge owns the call site, raise the object itself.
    failing["forward"] = True
    try:
        jax.block_until_ready(fails_per_shard(x))
    except ShardFailure as exc:
        assert any(exc is r for r in raised)
    else:
        raise AssertionError("expected the shard's exception")
    print("sharded host calls OK")


if __name__ == "__main__":
    main()
