"""The GPU half stays honest without a GPU: every built-in kernel and every kind of
host call lowers for CUDA on this CPU machine, under jit, grad, jvp and vmap, to the
native targets (never a silent fallback)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxbridge as jb
from jaxbridge import ops
from jaxbridge._foreign import hostcall

pytestmark = pytest.mark.skipif("cuda" not in hostcall.native_platforms(),
                                reason="jaxbridge was built without CUDA (no nvcc at build time)")


def cuda_hlo(fn, *args):
    return jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()


def transforms(f, n_args):
    """f under jit, grad, jvp and vmap (as functions of the same arguments)."""
    def loss(*a):
        return jnp.sum(jax.tree_util.tree_leaves(f(*a))[0])
    return {
        "jit": f,
        "grad": jax.grad(loss, argnums=tuple(range(n_args))),
        "jvp": lambda *a: jax.jvp(f, a, a),
        "vmap": lambda *a: jax.vmap(f)(*[x[None] for x in a]),
    }


TRIDIAG = tuple(jnp.asarray(v) for v in (np.full(5, -1.0), np.full(5, 4.0), np.full(5, -1.0),
                                          np.linspace(0, 1, 5)))
OPS = {
    "softplus": (ops.softplus, (jnp.linspace(-2, 2, 6),), "jaxbridge_softplus"),
    "tridiagonal_solve": (ops.tridiagonal_solve, TRIDIAG, "jaxbridge_tridiagonal_solve"),
    "rbf_kernel": (ops.rbf_kernel, (jnp.ones((3, 2)), jnp.zeros((4, 2)), jnp.float64(1.5)),
                   "jaxbridge_rbf_kernel"),
}
ROLE_SUFFIX = {"jit": "_fwd", "grad": "_adj", "jvp": "_tan", "vmap": "_fwd"}


@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("how", ["jit", "grad", "jvp", "vmap"])
def test_builtin_kernels_lower_for_cuda(op, how):
    f, args, stem = OPS[op]
    text = cuda_hlo(transforms(f, len(args))[how], *args)
    assert f'"{stem}{ROLE_SUFFIX[how]}"' in text or f"@{stem}{ROLE_SUFFIX[how]}" in text \
        or f"{stem}{ROLE_SUFFIX[how]}" in text


def _host_sin():
    f = jb.foreign(lambda x: x)(np.sin)
    f.defvjp(lambda p, y, ct: (np.cos(p[0]) * ct,))
    f.defjvp(lambda p, y, t: np.cos(p[0]) * t[0])
    return f


def _host_linear():
    a = np.array([[1.0, 2.0], [0.0, 3.0]])
    f = jb.foreign(lambda x: x, linear=True)(lambda x: a @ x)
    f.deftranspose(lambda ct: (a.T @ ct,))
    return f


def _host_in_place():
    def sin_into(x, *, out):
        np.sin(x, out=out)

    f = jb.foreign(lambda x: x, out=True)(sin_into)
    f.defvjp(lambda p, y, ct, *, out: np.multiply(np.cos(p[0]), ct, out=out[0]), out=True)
    f.defjvp(lambda p, y, t: np.cos(p[0]) * t[0])
    return f


def _host_aliased():
    def sin_into(x, *, out):
        np.sin(x, out=out)

    f = jb.foreign(lambda x: x, out=True, aliases={"forward": {0: 0}})(sin_into)
    f.defvjp(lambda p, y, ct: (np.cos(p[0]) * ct,))
    f.defjvp(lambda p, y, t: np.cos(p[0]) * t[0])
    return f


def _host_batch_dims():
    f = jb.foreign(lambda x: x, batch_dims=1)(np.sin)
    f.defvjp(lambda p, y, ct: (np.cos(p[0]) * ct,))
    f.defjvp(lambda p, y, t: np.cos(p[0]) * t[0])
    return f


HOST = {"rules": _host_sin, "linear": _host_linear, "in_place": _host_in_place,
        "aliased": _host_aliased, "batch_dims": _host_batch_dims}


@pytest.mark.parametrize("kind", list(HOST))
@pytest.mark.parametrize("how", ["jit", "grad", "jvp", "vmap"])
def test_host_calls_lower_for_cuda_to_the_native_handler(kind, how):
    f = HOST[kind]()
    text = cuda_hlo(transforms(f, 1)[how], jnp.ones((2, 1)))
    assert "jaxbridge_host_call" in text
    if kind == "aliased" and how in ("jit", "vmap"):
        assert "output_operand_alias" in text
    assert "python_gpu_callback" not in text  # not the pure_callback fallback


def test_scipy_solver_lowers_for_cuda():
    from jaxbridge.scipy.optimize import root

    def solve(a):
        return root(lambda x, a: x ** 3 + a * x - 1.0, jnp.zeros(1), args=(a,)).x

    text = cuda_hlo(jax.grad(lambda a: solve(a)[0]), jnp.float64(2.0))
    assert "jaxbridge_host_call" in text
