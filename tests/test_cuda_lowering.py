"""The GPU half stays honest without a GPU: every built-in kernel and every kind of
host call lowers for CUDA on this CPU machine, under jit, grad, jvp and vmap, to the
native targets (never a silent fallback)."""

import re

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


@pytest.mark.parametrize("how", ["jit", "grad", "jvp", "vmap"])
def test_eigsh_of_a_dense_matrix_lowers_for_cuda(how):
    from jaxbridge.scipy.sparse.linalg import eigsh

    A = jnp.diag(jnp.arange(1.0, 7.0)) + 0.1 * (jnp.eye(6, k=1) + jnp.eye(6, k=-1))
    text = cuda_hlo(transforms(lambda A: eigsh(A, k=2)[0], 1)[how], A)
    assert "jaxbridge_host_call" in text


@pytest.mark.parametrize("method", ["df-sane", "krylov"])
@pytest.mark.parametrize("how", ["jit", "grad", "jvp", "vmap"])
def test_compiled_root_lowers_for_cuda(how, method):
    """root(method="df-sane" / "krylov") runs compiled in the program; its only host
    calls are the on_failure="raise" status checks, through the native handler."""
    from jaxbridge.scipy.optimize import root

    def solve(a):
        return root(lambda x, a: x - 0.5 * jnp.tanh(a * x + 1.0), jnp.zeros(3), args=(a,),
                    method=method, stepping="compiled").x

    text = cuda_hlo(transforms(solve, 1)[how], jnp.ones(3))
    assert "jaxbridge_host_call" in text
    assert "python_gpu_callback" not in text


def _ivp_events(cd):
    from jaxbridge.scipy.integrate import solve_ivp

    def ground(t, s, cd):
        return s[1]
    ground.terminal = True
    sol = solve_ivp(lambda t, s, cd: jnp.stack([s[2], s[3], -cd * s[2], -9.81 - cd * s[3]]),
                    (0.0, 5.0), jnp.array([0.0, 0.0, 10.0, 10.0]), events=ground, args=(cd,),
                    dense_output=True, max_events=2, max_steps=64)
    return sol.t_events[0][0] + sol.sol(0.3)[1] + sol.y[1, 1]


def _bvp(k):
    from jaxbridge.scipy.integrate import solve_bvp
    res = solve_bvp(lambda x, y: jnp.stack([y[1], -k ** 2 * y[0]]),
                    lambda ya, yb: jnp.stack([ya[0], yb[0] - 1.0]),
                    jnp.linspace(0.0, 1.0, 5), jnp.zeros((2, 5)), max_nodes=50)
    return res.sol(0.5)[0] + res.y[0, 1]


@pytest.mark.parametrize("solver", [_ivp_events, _bvp])
@pytest.mark.parametrize("how", ["jit", "grad", "jvp", "vmap"])
def test_scipy_events_dense_and_bvp_lower_for_cuda(solver, how):
    """solve_ivp with events / dense output / t_eval=None and solve_bvp (issue 26)."""
    text = cuda_hlo(transforms(solver, 1)[how], jnp.float64(0.1))
    assert "jaxbridge_host_call" in text
    assert "python_gpu_callback" not in text


def _ivp_stiff_adjoint(k):
    from jaxbridge.scipy.integrate import solve_ivp
    sol = solve_ivp(lambda t, y, k: jnp.stack([-k * y[0] + y[1], -y[1]]), (0.0, 1.0),
                    jnp.ones(2), "BDF", jnp.array([0.5, 1.0]), args=(k,),
                    sensitivity="adjoint", checkpoints=64)
    return sol.y[0]


@pytest.mark.parametrize("how", ["jit", "grad", "jvp", "vmap"])
def test_stiff_compiled_adjoint_lowers_for_cuda(how):
    """BDF/Radau/LSODA with sensitivity="adjoint": the recording host call and the
    compiled Radau IIA derivative loops (issue 22)."""
    text = cuda_hlo(transforms(_ivp_stiff_adjoint, 1)[how], jnp.float64(3.0))
    assert "jaxbridge_host_call" in text
    assert "python_gpu_callback" not in text
    if how in ("grad", "jvp"):
        assert "while" in text  # the derivative loop over the recorded steps


@pytest.mark.parametrize("how", ["jit", "grad", "jvp", "vmap"])
def test_torch_calls_lower_for_cuda_to_the_native_handler(how):
    torch = pytest.importorskip(
        "torch", reason="jaxbridge.torch needs PyTorch: pip install -e '.[torch]' (Python 3.11)")
    import jaxbridge.torch as jt

    f = jt.wrap(lambda x: torch.sin(x) * x)
    text = cuda_hlo(transforms(f, 1)[how], jnp.ones(2))
    assert "jaxbridge_host_call" in text
    assert "python_gpu_callback" not in text
    second = cuda_hlo(jax.hessian(lambda x: f(x).sum()), jnp.ones(2))  # torch.func, nested
    assert second.count("jaxbridge_host_call") >= 2


@pytest.mark.parametrize("how", ["jit", "grad", "jvp", "vmap"])
def test_torch_calls_for_cuda_run_on_device_buffers(how, monkeypatch):
    """Every torch call lowered for CUDA (forward, autograd adjoint, torch.func tangent)
    offers the trampoline its device fill (DLPack views of XLA's device buffers, XLA's
    stream: csrc/hostcall/device_call.cc) where torch has CUDA; CPU-only torch is faked
    into having it here."""
    import gc

    torch = pytest.importorskip(
        "torch", reason="jaxbridge.torch needs PyTorch: pip install -e '.[torch]' (Python 3.11)")
    import jaxbridge.torch as jt
    from jaxbridge.torch import _device

    monkeypatch.setattr(_device, "_has_cuda", [True])
    f = jt.wrap(lambda x: torch.sin(x) * x)
    # Held, not just their ids: a freed one's address could be a new one's.
    before = [o for o in gc.get_objects() if type(o) is hostcall.HostCallable]
    seen = {id(o) for o in before}
    text = cuda_hlo(transforms(f, 1)[how], jnp.ones(2))
    made = [o for o in gc.get_objects()
            if type(o) is hostcall.HostCallable and id(o) not in seen]
    assert text.count("jaxbridge_host_call") == len(made) >= 1
    assert all(callable(o.device_fill) for o in made)


@pytest.mark.parametrize("how", ["jit", "grad", "jvp", "vmap"])
def test_torch_out_true_calls_lower_for_cuda(how):
    """wrap(fn, out=True) (fn writes into XLA's buffers; derivatives through
    torch.func.functionalize) lowers to the native handler too."""
    torch = pytest.importorskip(
        "torch", reason="jaxbridge.torch needs PyTorch: pip install -e '.[torch]' (Python 3.11)")
    import jaxbridge.torch as jt

    @jt.wrap(result=lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), out=True)
    def f(x, out):
        torch.mul(torch.sin(x), x, out=out)

    text = cuda_hlo(transforms(f, 1)[how], jnp.ones(2))
    assert "jaxbridge_host_call" in text
    assert "python_gpu_callback" not in text


# ------------------------------------------------------------------ kernels with residuals
def _residual_kernel(guarded):
    """A kernel with residuals and a forward_with_residuals target on CPU and CUDA (the
    built-in softplus handlers re-registered under this kernel's names: lowering checks
    which targets a program calls, not what they compute)."""
    regs = {p.lower(): t for p, t in ops._builtin_ext.registrations().items()}
    both = {role: {plat: regs[plat][f"jaxbridge_softplus_{sym}"] for plat in ("cpu", "cuda")}
            for role, sym in (("fwd", "fwd"), ("adj", "adj"), ("tan", "tan"))}
    return jb.kernel(both["fwd"], both["adj"], both["tan"], forward_with_residuals=both["fwd"],
                     name="residual_lowering", namespace="tests.cuda",
                     result=lambda x, **_: x, residuals=lambda x, **_: x,
                     attrs={"beta": 1.0}, vmap="vectorized", pass_outputs=False,
                     guard_outputs=guarded)


RESIDUAL_ROLE = {"jit": "forward", "grad": "vjp", "jvp": "jvp", "vmap": "forward"}


@pytest.mark.parametrize("guarded", [False, True])
@pytest.mark.parametrize("how", ["jit", "grad", "jvp", "vmap"])
def test_kernels_with_residuals_lower_for_cuda(how, guarded):
    """The plain forward where nothing is differentiated, the forward with residuals and
    the derivative kernel where something is; guarded, the same targets through the
    guarded call (its CUDA handler: csrc/builtin/guard_cuda.cc)."""
    ops.softplus(jnp.ones(1))  # registers the built-in handlers (CPU and CUDA)
    k = _residual_kernel(guarded)
    text = cuda_hlo(transforms(k, 1)[how], jnp.linspace(-1.0, 1.0, 4))

    def calls(role):  # the target's name, not a longer one it begins
        return re.search(re.escape(k.target(role, "cuda")) + r"(?![\w.])", text) is not None

    assert calls(RESIDUAL_ROLE[how])
    assert calls("forward_with_residuals") == (how in ("grad", "jvp"))
    assert calls("forward") == (how in ("jit", "vmap"))
    assert ("jaxbridge_guarded" in text) == guarded
