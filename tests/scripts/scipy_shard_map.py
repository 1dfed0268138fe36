"""Run under 4 forced CPU devices (by the tests/test_scipy_*.py files): jaxbridge.scipy's
solvers inside `jax.shard_map`, values and gradients per shard equal to the same
computation outside it (issue #38).

    python tests/scripts/scipy_shard_map.py SECTION [per-shard]

SECTION picks the solvers (see CASES); "per-shard" runs one problem per shard
(`f(k[0])`), the default a batch of two per shard (`vmap(f)(k)`), as a per-device
batch is written. Each case is checked in three modes: the value, `grad` and
`jacfwd`, inside `jit(shard_map(...))`, against `f` and its derivatives called on
each element outside any mesh. Prints "<section> shard_map OK" when all pass.
"""

import os

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + " --xla_force_host_platform_device_count=4")

import sys  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from jaxbridge.scipy.integrate import quad, solve_ivp  # noqa: E402
from jaxbridge.scipy.optimize import least_squares, minimize, root  # noqa: E402
from jaxbridge.scipy.signal import lfilter  # noqa: E402
from jaxbridge.scipy.sparse.linalg import eigsh  # noqa: E402

jax.config.update("jax_enable_x64", True)
TOL = dict(rtol=1e-8, atol=1e-10)
T1 = jnp.array([0.5, 1.0])


def decay(method, **kw):
    """y' = -k y (closed over), y(1) (the compiled loops, SciPy's loop, events)."""
    def f(k):
        sol = solve_ivp(lambda t, y: -k * y, (0.0, 1.0), jnp.ones(2), method, t_eval=T1,
                        **TOL, **kw)
        return sol.y[0, 1]
    return f


def first_event(k):
    sol = solve_ivp(lambda t, y, k: -k * y, (0.0, 2.0), jnp.ones(1), args=(k,),
                    events=lambda t, y, k: y[0] - 0.5, **TOL)
    return sol.t_events[0][0]


def dense(k):
    sol = solve_ivp(lambda t, y: -k * y, (0.0, 1.0), jnp.ones(1), dense_output=True, **TOL)
    return sol.sol(0.7)[0]


def cubic_root(method, **kw):
    return lambda k: root(lambda x: x ** 3 + k * x - 1.0, jnp.zeros(1), method=method,
                          **kw).x[0]


CASES = {
    # the default test run: the compiled RK loop, the compiled stiff derivatives, the
    # host root finder and minimizer
    "solve_ivp-rk45": {"solve_ivp RK45 (compiled)": decay("RK45")},
    "solve_ivp-bdf": {"solve_ivp BDF (compiled derivatives)": decay("BDF")},
    "root": {"root hybr": cubic_root("hybr")},
    "minimize": {
        "minimize BFGS": lambda k: minimize(lambda x: jnp.sum((x - k) ** 2 + 0.1 * x ** 4),
                                            jnp.zeros(2)).x[0],
    },
    # the slow test run
    "solve_ivp-more": {
        "solve_ivp DOP853 (compiled)": decay("DOP853"),
        "solve_ivp RK45 (SciPy's loop)": decay("RK45", stepping="scipy"),
        "solve_ivp Radau (SciPy's loop)": decay("Radau", stepping="scipy"),
    },
    "solve_ivp-events": {"solve_ivp events": first_event,
                         "solve_ivp dense output": dense},
    "quad": {"quad": lambda k: quad(lambda x: jnp.exp(-k * x), 0.0, 1.0)[0]},
    "root-compiled": {"root df-sane (compiled)": cubic_root("df-sane"),
                      "root krylov (compiled)": cubic_root("krylov")},
    "least_squares": {
        "least_squares": lambda k: least_squares(lambda x: jnp.exp(x) - k,
                                                 jnp.zeros(2)).x[0],
    },
    "eigsh": {
        "eigsh": lambda k: eigsh(jnp.diag(jnp.arange(1.0, 7.0)) + k * jnp.eye(6, k=1)
                                 + k * jnp.eye(6, k=-1), k=1, return_eigenvectors=False)[0],
    },
    "lfilter": {
        "lfilter": lambda k: lfilter(jnp.array([0.5, 0.5]), jnp.array([1.0, -0.3 * k]),
                                     jnp.array([1.0, 0.0, 2.0, 1.0])).sum(),
    },
}


MODES = ("value", "grad", "jacfwd")


def check(name, f, mesh, per_shard):
    """The value, `grad` and `jacfwd` of `f` (one program, compiled once) inside
    `jit(shard_map(...))` against the same program on each element outside any mesh."""
    def all_modes(k):
        return jnp.stack([f(k), jax.grad(f)(k), jax.jacfwd(f)(k)])

    def body(k):
        return all_modes(k[0])[None] if per_shard else jax.vmap(all_modes)(k)

    ks = jnp.linspace(1.0, 2.0, 4 if per_shard else 8)
    inside = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=P("x")))
    got = np.asarray(inside(ks))
    outside = jax.jit(all_modes)
    want = np.array([np.asarray(outside(k)) for k in ks])
    for i, mode in enumerate(MODES):
        np.testing.assert_allclose(got[:, i], want[:, i], rtol=1e-9, atol=1e-12,
                                   err_msg=f"{name} {mode}")
        assert np.all(np.isfinite(got[:, i])) and np.any(got[:, i] != 0), (name, mode, got)


def main():
    section = sys.argv[1]
    per_shard = "per-shard" in sys.argv[2:]
    mesh = Mesh(np.array(jax.devices()), ("x",))
    for name, f in CASES[section].items():
        check(name, f, mesh, per_shard)
        print(f"  {name}: values, grad and jacfwd inside shard_map as outside", flush=True)
    print(f"{section} shard_map OK")


if __name__ == "__main__":
    main()
