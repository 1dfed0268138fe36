"""Run under 8 forced CPU devices (by tests/test_sharding.py): foreign functions on
sharded inputs run once per shard with no all-gather of their inputs."""

import os

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + " --xla_force_host_platform_device_count=8")

import re  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import jaxbridge as jb  # noqa: E402

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
    return re.findall(r"= (\S+) custom-call\([^)]*\), custom_call_target=\"" + target, hlo)


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
    shapes = custom_call_operand_shapes(hlo, "jaxbridge_host_call_batched")
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
    # Built-in C++ kernels: an error under a plain multi-device jit, per shard in shard_map.
    from jaxbridge import ops
    try:
        jax.jit(ops.softplus)(x)
    except jb.errors.ShardingError as exc:
        assert "shard_map" in str(exc)
    else:
        raise AssertionError("expected an error for a kernel on a mesh")
    per_shard = jax.shard_map(ops.softplus, mesh=mesh, in_specs=P("batch"), out_specs=P("batch"))
    g = jax.jit(jax.grad(lambda x: jnp.sum(per_shard(x))))(x)
    np.testing.assert_allclose(g, jax.nn.sigmoid(x), rtol=1e-12)

    # A per-shard call runs on an XLA worker thread: its exception cannot be re-raised
    # as itself there, so it crosses XLA as a status that says what happened, and
    # jaxbridge.errors.original_exception hands back the object.
    class ShardFailure(Exception):
        pass

    @jb.foreign(lambda x: x, batch_dims=1)
    def fails_per_shard(x):
        raise ShardFailure("shard went wrong")

    try:
        jax.jit(fails_per_shard)(x).block_until_ready()
    except ShardFailure:
        pass  # delivered as itself (the shard ran on the calling thread)
    except Exception as exc:  # noqa: BLE001
        assert "ShardFailure: shard went wrong" in str(exc) and "fails_per_shard" in str(exc)
        assert isinstance(jb.errors.original_exception(exc), ShardFailure)
    else:
        raise AssertionError("expected the shard's exception")
    # ... and eager calls, where jaxbridge owns the call site, raise the object itself.
    try:
        fails_per_shard(x)
    except ShardFailure:
        pass
    print("sharded host calls OK")


if __name__ == "__main__":
    main()
