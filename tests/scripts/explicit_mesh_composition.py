"""Run under 4 forced CPU devices (by tests/test_sharding.py): on a mesh with
AxisType.Explicit axes, a batch_dims host function and a batch_dims kernel keep their
input's sharding wherever they stand -- `f(x) + 1`, `jnp.sum(f(x) ** 2)`, its grad, a
`lax.scan` over steps, a `vmap` over a leading axis, `shard_map` -- with no all-gather
in the compiled program and the values of a NumPy reference."""

import os

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + " --xla_force_host_platform_device_count=4")

import re  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import AxisType, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import jaxbridge as jb  # noqa: E402
from jaxbridge import ops  # noqa: E402

jax.config.update("jax_enable_x64", True)
ROWS, COLS = 8, 3


@jb.foreign(lambda x: x, batch_dims=1)
def host_sin(x):
    assert x.shape[0] < ROWS, f"called on {x.shape}: not split per shard"
    return np.sin(x)


host_sin.defvjp(lambda primals, out, ct: (np.cos(primals[0]) * ct,))


def kernel_softplus(x):
    return ops.softplus(x)


CASES = {  # name: a program of f, run with ours and with its jnp twin
    "f(x) + 1": lambda f, x: f(x) + 1,
    "sum(f(x)**2)": lambda f, x: jnp.sum(f(x) ** 2),
    "grad": lambda f, x: jax.grad(lambda x: jnp.sum(f(x) ** 2))(x),
    "scan": lambda f, x: jax.lax.scan(lambda c, _: (f(c) + 0.5, None), x, None, length=3)[0],
    "vmap": lambda f, x: jax.vmap(f)(x.reshape(ROWS, COLS, 1)),
}


def main() -> None:
    assert jax.device_count() == 4
    mesh = jax.make_mesh((4,), ("d",), axis_types=(AxisType.Explicit,))
    jnp_twins = {host_sin: jnp.sin, kernel_softplus: jax.nn.softplus}
    with jax.set_mesh(mesh):
        x = jax.device_put(jnp.linspace(-1, 1, ROWS * COLS).reshape(ROWS, COLS),
                           NamedSharding(mesh, P("d")))
        for f in (host_sin, kernel_softplus):
            for name, program in CASES.items():
                run = jax.jit(lambda x, program=program, f=f: program(f, x))
                out = run(x)
                ref = program(jnp_twins[f], jnp.asarray(np.asarray(x)))
                np.testing.assert_allclose(np.asarray(out), np.asarray(ref), rtol=1e-12,
                                           err_msg=f"{f.__name__}: {name}")
                if out.ndim:  # sharded like the input along its leading axis
                    assert out.sharding.spec[0] == "d", (f.__name__, name, out.sharding)
                    assert str(jax.typeof(out)).startswith(f"float64[{ROWS}@d"), \
                        (f.__name__, name, jax.typeof(out))
                hlo = run.lower(x).compile().as_text()
                assert "all-gather" not in hlo, (f.__name__, name)
                assert re.search(r"custom-call\(", hlo), (f.__name__, name)

        # shard_map: the function runs on the local block, the result stays sharded.
        for f in (host_sin, kernel_softplus):
            mapped = jax.shard_map(lambda x, f=f: f(x) + 1, mesh=mesh, in_specs=P("d"),
                                   out_specs=P("d"))
            run = jax.jit(mapped)
            out = run(x)
            np.testing.assert_allclose(np.asarray(out),
                                       np.asarray(jnp_twins[f](np.asarray(x)) + 1), rtol=1e-12)
            assert out.sharding.spec[0] == "d", out.sharding
            assert "all-gather" not in run.lower(x).compile().as_text()
            g = jax.jit(jax.grad(lambda x, mapped=mapped: jnp.sum(mapped(x) ** 2)))(x)
            assert g.sharding.spec[0] == "d", g.sharding
            assert np.all(np.isfinite(np.asarray(g)))
    print("explicit mesh composition OK")


if __name__ == "__main__":
    main()
