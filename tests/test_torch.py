"""jaxbridge.torch: torch functions and modules as JAX functions, checked against torch's
own autograd (torch.func.jacrev/jacfwd/hessian, loss.backward(), torch.optim.Adam)."""

import os
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip(
    "torch", reason="jaxbridge.torch needs PyTorch: pip install -e '.[torch]' (Python 3.11)")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import jaxbridge.torch as jt  # noqa: E402
from jaxbridge.errors import ForeignCallError, KeptViewError, ResultMismatchError  # noqa: E402
from jaxbridge.testing import CheckOptions, check_rules  # noqa: E402


def t(x):
    return torch.from_numpy(np.array(x))


def close(a, b, tol=1e-10):
    a = a.cpu() if isinstance(a, torch.Tensor) else a  # a CUDA tensor on the GPU machine
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=tol, atol=tol)


# Where a wrapped function runs: on CUDA tensors where JAX computes on the GPU and torch
# has CUDA (benchmarks/gpu_session.sh torch-tests), else on CPU tensors.
CALL_DEVICE = "cuda" if jax.default_backend() == "gpu" and torch.cuda.is_available() else "cpu"


def model(a, b):
    """A pytree in, a pytree out, an integer output among them."""
    return {"y": torch.tanh(a) @ b, "n": (a > 0).sum()}


@pytest.fixture
def ab(rng):
    return rng.normal(size=(3, 2)), rng.normal(size=(2,))


# ---------------------------------------------------------------- values and derivatives
@pytest.mark.parametrize("mode", ["eager", "jit"])
def test_values_match_torch(ab, mode):
    f = jt.wrap(model)
    g = jax.jit(f) if mode == "jit" else f
    out = g(*ab)
    ref = model(t(ab[0]), t(ab[1]))
    close(out["y"], ref["y"])
    assert out["n"].dtype == jnp.int64 and int(out["n"]) == int(ref["n"])


def test_first_derivatives_match_torch_autograd(ab):
    f = jt.wrap(model)
    y = lambda a, b: f(a, b)["y"]  # noqa: E731
    ref_rev = torch.func.jacrev(lambda a, b: model(a, b)["y"], argnums=(0, 1))(*map(t, ab))
    for jac in (jax.jacrev, jax.jacfwd):
        got = jax.jit(jac(y, argnums=(0, 1)))(*ab)
        close(got[0], ref_rev[0])
        close(got[1], ref_rev[1])
    ct = np.array([1.0, -2.0, 0.5])
    _, pull = jax.vjp(y, *ab)
    close(pull(ct)[0], ref_rev[0].numpy().T @ ct if False else
          np.einsum("i,ijk->jk", ct, ref_rev[0].numpy()))
    _, dy = jax.jvp(y, ab, (np.ones((3, 2)), np.zeros(2)))
    close(dy, ref_rev[0].numpy().sum(axis=(1, 2)))


def test_hessian_and_third_order_match_torch(rng):
    def energy(x):
        return (torch.sin(x) * x.roll(1)).sum() + (x ** 4).sum()

    f = jt.wrap(energy)
    x = rng.normal(size=4)
    ref = torch.func.hessian(energy)(t(x))
    close(jax.jit(jax.hessian(f))(x), ref)                     # forward over reverse
    close(jax.jacrev(jax.jacrev(f))(x), ref)                   # reverse over reverse
    close(jax.jacfwd(jax.jacfwd(f))(x), ref)                   # forward over forward
    third = jax.grad(jax.grad(jax.grad(jt.wrap(torch.sin))))(0.7)
    close(third, -np.cos(0.7))


@pytest.mark.slow
def test_check_rules_passes_on_a_wrapped_torch_function(ab):
    f = jt.wrap(model)
    assert f.derivatives().forward and f.derivatives().reverse and f.derivatives().second_order
    report = check_rules(f, *ab, check_options=CheckOptions(second_order=True))
    assert report.passed, report
    summary = report.summary()
    for check in ("vjp_fd", "jvp_fd", "jvp_vjp_consistency", "second_order",
                  "derivatives_checked"):
        assert summary[check] == "pass", (check, report)


@pytest.mark.slow  # ~4 s: several second-order traces
def test_complex_derivatives_follow_jax_conventions():
    """torch's VJP is the adjoint under Re<a, b>, JAX's the transpose: they differ by
    a conjugation, for holomorphic (z * z) and non-holomorphic (conj, abs) parts."""
    f = jt.wrap(lambda z, w: z * z * w.conj() + torch.abs(z))

    def twin(z, w):
        return z * z * jnp.conj(w) + jnp.abs(z)

    z = np.array([1 + 2j, 0.5 - 1j, 2 + 0.1j])
    w = np.array([0.3 - 1j, 1j, 2 + 0j])
    ct = np.array([1 - 1j, 2 + 0.5j, -1j])
    for got, want in zip(jax.vjp(f, z, w)[1](ct), jax.vjp(twin, z, w)[1](ct)):
        close(got, want)
    close(jax.jvp(f, (z, w), (w, z))[1], jax.jvp(twin, (z, w), (w, z))[1])
    grad = jax.grad(lambda z: jnp.real(f(z, w).sum()))
    grad_twin = jax.grad(lambda z: jnp.real(twin(z, w).sum()))
    close(jax.vjp(grad, z)[1](w)[0], jax.vjp(grad_twin, z)[1](w)[0])  # second order
    close(jax.jvp(grad, (z,), (w,))[1], jax.jvp(grad_twin, (z,), (w,))[1])


def test_grad_inside_scan_and_closure(rng):
    k = rng.normal(size=3)
    step = jt.wrap(lambda c, x: torch.tanh(c * x))

    def loss(c):
        def body(carry, x):
            y = step(carry, x)
            return y, y.sum()
        return jax.lax.scan(body, c, jnp.asarray(k)[None].repeat(5, 0))[1].sum()

    def ref(c):
        carry, total = c, 0.0
        for _ in range(5):
            carry = torch.tanh(carry * t(k))
            total = total + carry.sum()
        return total

    close(jax.jit(jax.grad(loss))(np.ones(3)), torch.func.grad(ref)(t(np.ones(3))))


# ---------------------------------------------------------------- vmap
def test_vmap_is_one_torch_vmap_call(rng):
    calls = []

    def f(x, w):
        calls.append(tuple(x.shape))
        return x @ w

    w = rng.normal(size=(3, 2))
    xs = rng.normal(size=(5, 4, 3))
    out = jax.jit(jax.vmap(jt.wrap(f), in_axes=(0, None)))(xs, w)
    close(out, xs @ w)
    assert calls[-1] == (4, 3) and len(calls) <= 2  # meta trace + one batched call
    grads = jax.vmap(jax.grad(lambda x: jt.wrap(f)(x, w).sum()))(xs)
    close(grads, np.broadcast_to(w.sum(1), xs.shape))


def test_static_leaves_and_keywords_under_grad_and_vmap(rng):
    calls = []

    def f(args, scale=1.0):
        x, mode = args  # `mode`, a string leaf, is static; so is the keyword `scale`
        calls.append(tuple(x.shape))
        return (torch.tanh(x) if mode == "tanh" else torch.sin(x)) * scale

    g = jt.wrap(f)
    x = rng.normal(size=(2, 3))
    close(g((x, "tanh"), scale=2.0), 2 * np.tanh(x))
    close(jax.grad(lambda x: g((x, "sin"), scale=2.0).sum())(x), 2 * np.cos(x))
    calls.clear()
    close(jax.jit(jax.vmap(lambda x: g((x, "tanh"), scale=2.0)))(x), 2 * np.tanh(x))
    assert calls == [(3,), (3,)]  # meta trace, then one torch.vmap call (no loop)
    close(jax.vmap(jax.grad(lambda x: g((x, "tanh"), scale=3.0).sum()))(x),
          3 / np.cosh(x) ** 2)


def test_vmap_falls_back_to_a_loop_for_data_dependent_code(rng):
    def clipped(x):
        return x * 2 if x.sum().item() > 0 else -x  # .item(): torch.vmap cannot batch

    xs = rng.normal(size=(6, 3))
    expect = np.where(xs.sum(1, keepdims=True) > 0, 2 * xs, -xs)
    f = jt.wrap(clipped)
    close(jax.jit(jax.vmap(f))(xs), expect)
    close(jax.vmap(jax.vmap(f))(xs.reshape(2, 3, 3)), expect.reshape(2, 3, 3))
    close(jax.vmap(jt.wrap(clipped, vmap="loop"))(xs), expect)
    grads = jax.vmap(jax.grad(lambda x: f(x).sum()))(xs)
    close(grads, np.where(xs.sum(1, keepdims=True) > 0, 2.0, -1.0) * np.ones_like(xs))

    # torch.vmap is tried once per wrapped function: later batched calls loop at once.
    calls = []

    def counted(x):
        calls.append(x.shape)
        return clipped(x)

    g = jax.jit(jax.vmap(jt.wrap(counted)))
    close(g(xs), expect)  # tries torch.vmap, then loops
    calls.clear()
    close(g(xs), expect)
    assert calls == [torch.Size([3])] * 6, calls  # six elements, no torch.vmap call


# ---------------------------------------------------------------- dtypes and zero copy
@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32", "int32", "int8",
                                   "uint8", "bool"])
def test_dtypes_pass_through(dtype):
    seen = []

    def f(x):
        seen.append(x.dtype)
        return ~x if x.dtype == torch.bool else x * 3

    x = jnp.arange(6).reshape(2, 3).astype(dtype)
    out = jax.jit(jt.wrap(f))(x)
    assert out.dtype == x.dtype
    expect = ~np.asarray(x) if dtype == "bool" else np.asarray(x) * 3
    np.testing.assert_array_equal(np.asarray(out).astype(np.float64), expect.astype(np.float64))
    assert str(seen[-1]) == f"torch.{dtype}"


def test_integer_only_output_has_zero_derivatives_in_both_modes():
    # round-to-int: no differentiable output, so forward mode gives a float0 tangent (as
    # for the jnp twin), and reverse mode a zero gradient.
    f = jt.wrap(lambda x: torch.round(x * 3).to(torch.int64))
    x = jnp.linspace(0.0, 1.0, 4)
    y, tan = jax.jvp(f, (x,), (jnp.ones(4),))
    np.testing.assert_array_equal(y, jnp.round(x * 3).astype(jnp.int64))
    assert tan.dtype == jax.dtypes.float0 and tan.shape == (4,)
    np.testing.assert_array_equal(jax.grad(lambda x: f(x).astype(float).sum())(x), 0.0)


def test_bfloat16_gradient():
    g = jax.grad(lambda x: jt.wrap(torch.sin)(x).astype(jnp.float32).sum())(
        jnp.linspace(0, 1, 4, dtype=jnp.bfloat16))
    assert g.dtype == jnp.bfloat16
    close(np.asarray(g, np.float32), np.cos(np.linspace(0, 1, 4)), tol=1e-2)


def test_inputs_reach_torch_without_a_copy():
    pointers = []

    def f(x):
        pointers.append(x.data_ptr())
        return x + 1

    x = jnp.arange(1024.0)
    jax.jit(jt.wrap(f))(x).block_until_ready()
    assert pointers[-1] == x.unsafe_buffer_pointer()


# ---------------------------------------------------------------- host-call guarantees
class MyError(Exception):
    pass


def test_torch_exception_reaches_except_under_jit():
    def bad(x):
        raise MyError("boom")

    f = jt.wrap(bad, result=jax.ShapeDtypeStruct((2,), jnp.float64))
    with pytest.raises(MyError, match="boom"):
        jax.jit(f)(jnp.ones(2))


def test_exception_in_backward_reaches_caller():
    class Fragile(torch.autograd.Function):
        @staticmethod
        def forward(x):
            return x * 2

        @staticmethod
        def setup_context(ctx, inputs, output):
            pass

        @staticmethod
        def backward(ctx, g):
            raise MyError("no backward")

    f = jt.wrap(Fragile.apply)
    with pytest.raises(MyError, match="no backward"):
        jax.jit(jax.grad(lambda x: f(x).sum()))(jnp.ones(2))


def test_torch_code_that_calls_jax_does_not_deadlock_an_unsynced_loop():
    def mixed(x):  # torch, with a JAX computation inside
        y = jnp.sin(jnp.asarray(x.cpu().numpy()))
        return torch.from_numpy(np.array(y)).to(x.device) + x

    f = jax.jit(lambda x: jt.wrap(mixed)(x) * 0.5)
    x = jnp.ones(4)
    for _ in range(40):  # no block_until_ready: steps queue up as in a training loop
        x = f(x)
    expect = np.ones(4)
    for _ in range(40):
        expect = (np.sin(expect) + expect) * 0.5
    close(x, expect)


def test_kept_tensor_is_caught():
    kept = []

    def keep(x):
        kept.append(x)
        return x * 2

    f = jax.jit(jt.wrap(keep))
    with pytest.raises(KeptViewError, match="'keep' kept input tensor"):
        f(jnp.ones(3))
    close(kept[-1], np.ones(3))  # the kept tensor holds a private copy, still valid
    close(f(jnp.full(3, 2.0)), np.full(3, 4.0))  # from now on: copies, no error
    close(kept[-1], np.full(3, 2.0))
    close(kept[-2], np.ones(3))
    # a function with a static leaf (a string) gets copies of its tensors only
    def keep_scaled(args):
        x, how = args
        kept.append(x)
        return x * (3 if how == "triple" else 2)

    w = jt.wrap(keep_scaled)
    g = jax.jit(lambda x: w((x, "triple")))
    with pytest.raises(KeptViewError, match="'keep_scaled' kept input tensor"):
        g(jnp.ones(3))
    close(g(jnp.full(3, 2.0)), np.full(3, 6.0))
    close(kept[-1], np.full(3, 2.0))


def test_writing_into_an_input_is_an_error():
    def inplace(x):
        x.add_(1)
        return x.clone()

    with pytest.raises(ForeignCallError, match="modified input leaf 0 in place"):
        jax.jit(jt.wrap(inplace))(jnp.ones(3))


@pytest.mark.slow  # a subprocess with 4 CPU devices: ~15 s
def test_sharded_inputs_with_batch_dims_run_per_shard():
    script = textwrap.dedent("""
        import jax, jax.numpy as jnp, numpy as np, torch
        from jax.sharding import NamedSharding, PartitionSpec as P
        import jaxbridge.torch as jt
        shapes = []
        def f(x):
            shapes.append(tuple(x.shape))
            return torch.tanh(x) * 2
        g = jt.wrap(f, batch_dims=1)
        mesh = jax.make_mesh((4,), ("b",))
        x = jax.device_put(np.arange(32.0, dtype=np.float32).reshape(8, 4) / 32,
                           NamedSharding(mesh, P("b")))
        y = jax.jit(g)(x)
        np.testing.assert_allclose(y, np.tanh(np.asarray(x)) * 2, rtol=1e-6)
        assert shapes[-4:] == [(2, 4)] * 4, shapes
        dx = jax.jit(jax.grad(lambda x: g(x).sum()))(x)
        np.testing.assert_allclose(dx, 2 / np.cosh(np.asarray(x)) ** 2, rtol=1e-5)
        print("per shard OK")
    """)
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               XLA_FLAGS="--xla_force_host_platform_device_count=4")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=300, env=env)
    assert "per shard OK" in proc.stdout, proc.stdout + proc.stderr


# ---------------------------------------------------------------- result shapes
def test_a_result_of_another_shape_or_dtype_is_an_error_even_where_it_would_fit():
    """A [1] result where [3] was declared would broadcast silently into XLA's buffer,
    and a float32 result would be cast silently into a float64 one: both are refused,
    on the one-array path and on the pytree path alike."""
    declared = jax.ShapeDtypeStruct((3,), jnp.float32)
    one = jt.wrap(lambda x: x.sum(0, keepdim=True), result=declared)
    two = jt.wrap(lambda x, y: (x * y).sum(0, keepdim=True), result=declared)
    x = jnp.ones(3, jnp.float32)
    with pytest.raises(ResultMismatchError, match="shape \\[1\\], but \\[3\\] was declared"):
        jax.jit(one)(x)
    with pytest.raises(ResultMismatchError, match="shape \\[1\\], but \\[3\\] was declared"):
        jax.jit(two)(x, x)
    # a pytree of another structure: two results where one pair of three was declared
    pair = jt.wrap(lambda x, y: (x * y, x + y), result=(declared, declared, declared))
    with pytest.raises(ResultMismatchError, match="returned a pytree of structure"):
        jax.jit(pair)(x, x)
    longer = jt.wrap(lambda x: torch.cat([x, x[:1]]), result=declared)  # [4], not [3]
    with pytest.raises(ResultMismatchError, match="shape \\[4\\], but \\[3\\] was declared"):
        jax.jit(longer)(x)
    declared = jax.ShapeDtypeStruct((3,), jnp.float64)
    one = jt.wrap(lambda x: x.float(), result=declared)
    two = jt.wrap(lambda x, y: (x * y).float(), result=declared)
    x = jnp.ones(3, jnp.float64)
    with pytest.raises(ResultMismatchError, match="dtype torch.float32, but float64"):
        jax.jit(one)(x)
    with pytest.raises(ResultMismatchError, match="dtype torch.float32, but float64"):
        jax.jit(two)(x, x)


def test_shapes_come_from_meta_tensors_without_running_on_data():
    seen = []

    def f(x):
        seen.append(x.device.type)
        return x.sum(0)

    out = jax.jit(jt.wrap(f))(jnp.ones((3, 2)))
    close(out, [3.0, 3.0])
    assert seen == ["meta", CALL_DEVICE]


def test_data_dependent_function_traces_on_fillings_once():
    seen = []

    def f(x):
        seen.append(x.tolist())
        return x * 2 if bool(x.sum() > 0) else x * 3

    g = jax.jit(jt.wrap(f))
    close(g(jnp.full(2, 5.0)), [10.0, 10.0])
    close(g(-jnp.full(2, 5.0)), [-15.0, -15.0])
    # one run each on zeros, ones and a spread of values (not the data), then two calls
    assert seen == [[0.0, 0.0], [1.0, 1.0], [-1.0, 0.0], [5.0, 5.0], [-5.0, -5.0]]


def test_zeros_run_on_the_device_the_call_runs_on():
    """Code written for the device it runs on (here: a tensor made on `x`'s device type
    named by string, and data-dependent control flow, so meta tensors fail) finds its
    result shapes from zeros on that same device."""
    devices = []

    def f(x):
        devices.append(x.device.type)
        scale = torch.ones(x.shape, dtype=x.dtype, device=CALL_DEVICE)
        return x * scale * (2 if bool(x.sum() >= 0) else 3)

    close(jax.jit(jt.wrap(f))(jnp.ones(3)), [2.0, 2.0, 2.0])
    assert devices == ["meta"] + [CALL_DEVICE] * 4  # three fillings, then the call


@pytest.mark.slow
def test_result_declared_and_error_messages():
    def unique(x):
        return torch.unique(x)  # shape depends on the data

    # One entry on zeros and on ones, three on a spread of values: tracing says so.
    with pytest.raises(ResultMismatchError, match="depends on the data.*result="):
        jax.jit(jt.wrap(unique))(jnp.arange(3.0))
    f = jt.wrap(unique, result=jax.ShapeDtypeStruct((3,), jnp.float64))
    np.testing.assert_array_equal(jax.jit(f)(jnp.array([2.0, 0.0, 1.0])), [0, 1, 2])
    with pytest.raises(ResultMismatchError, match="shape \\[2\\].*\\[3\\] was declared"):
        jax.jit(f)(jnp.array([1.0, 0.0, 1.0]))
    wrong = jt.wrap(lambda x: x.float(), result=jax.ShapeDtypeStruct((3,), jnp.float64))
    with pytest.raises(ResultMismatchError, match="dtype torch.float32"):
        jax.jit(wrong)(jnp.ones(3))
    with pytest.raises(TypeError, match="expected a torch function"):
        jt.wrap(3)
    with pytest.raises(ValueError, match="vmap must be one of"):
        jt.wrap(torch.sin, vmap="sometimes")


# ---------------------------------------------------------------- modules
def make_mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(3, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))


def data(rng):
    x = rng.normal(size=(32, 3)).astype(np.float32)
    return x, np.sin(x.sum(1, keepdims=True)).astype(np.float32)


def test_module_gradients_equal_torch_autograd(rng):
    net = make_mlp()
    apply, params = jt.wrap_module(net)
    assert sorted(params) == ["0.bias", "0.weight", "2.bias", "2.weight"]
    x, y = data(rng)
    grads = jax.jit(jax.grad(lambda p: jnp.mean((apply(p, x) - y) ** 2)))(params)
    ((net(t(x)) - t(y)) ** 2).mean().backward()
    for name, p in net.named_parameters():
        close(grads[name], p.grad, tol=1e-6)


def test_grad_with_respect_to_one_argument_asks_torch_for_that_one_alone():
    """torch's Hurwitz zeta has a derivative in `q` only: grad with respect to `q` (its
    `x` held fixed, as a model's data is) works, because torch is asked for the
    cotangents JAX uses and no others (before, it was asked for all and raised)."""
    f = jt.wrap(lambda x, q: torch.special.zeta(x, q))
    x, q = jnp.array([2.0, 3.0]), jnp.array([1.5, 2.5])
    want = -np.asarray(x) * torch.special.zeta(t(np.asarray(x) + 1), t(np.asarray(q))).numpy()
    close(jax.jit(jax.grad(lambda q: f(x, q).sum()))(q), want, tol=1e-12)
    close(jax.grad(lambda q: f(x, q).sum())(q), want, tol=1e-12)


def test_module_backward_returns_no_gradient_for_the_data(rng):
    """grad with respect to the parameters: the backward host call returns the
    parameters' gradients and nothing for the data (a first layer's input gradient
    costs as much as its weight gradient)."""
    apply, params = jt.wrap_module(make_mlp())
    x, y = data(rng)
    step = jax.jit(jax.grad(lambda p: jnp.mean((apply(p, x) - y) ** 2)))
    calls = [line for line in step.trace(params).lower().as_text().splitlines()
             if "custom_call" in line]
    assert len(calls) == 2 and "32x3xf32" not in calls[1].split("->")[-1], calls


def test_module_with_tied_weights_and_a_parametrization_equals_torch(rng):
    """An encoder and decoder sharing one weight (given once, under its first name, and
    swapped in at both places, as functional_call does), and a weight-normed layer
    (its parameters live in a parametrization's own module). The module's own tensors are
    back in place after every call."""
    torch.manual_seed(0)
    enc, dec = torch.nn.Linear(3, 5, bias=False), torch.nn.Linear(5, 3, bias=False)
    dec.weight = torch.nn.Parameter(enc.weight.detach().T.contiguous())  # not tied yet

    class AutoEncoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.enc = enc
            self.mid = torch.nn.utils.parametrizations.weight_norm(torch.nn.Linear(5, 5))
            self.out = torch.nn.Linear(5, 5, bias=False)
            self.out.weight = self.mid.parametrizations.weight.original1  # tied

        def forward(self, x):
            return self.out(torch.tanh(self.mid(torch.tanh(self.enc(x)))))

    net = AutoEncoder()
    before = {n: p for n, p in net.named_parameters(remove_duplicate=False)}
    apply, params = jt.wrap_module(net)
    assert "out.weight" not in params  # tied: named once
    x = rng.normal(size=(4, 3)).astype(np.float32)
    grads = jax.jit(jax.grad(lambda p: jnp.sum(apply(p, x) ** 2)))(params)
    net.zero_grad()
    (net(t(x)) ** 2).sum().backward()
    for name, p in net.named_parameters():
        close(grads[name], p.grad, tol=1e-5)
    close(apply(params, x), net(t(x)).detach(), tol=1e-6)
    after = dict(net.named_parameters(remove_duplicate=False))
    assert all(after[n] is p for n, p in before.items())


def test_module_changed_after_wrapping_runs_the_params_it_is_given(rng):
    """A layer replaced after wrapping (same names): the call uses the params passed,
    at the new layer's places, not the new layer's own values or the old layer."""
    torch.manual_seed(0)
    net = make_mlp()
    apply, params = jt.wrap_module(net)
    x, _ = data(rng)
    first = np.asarray(apply(params, x))
    net[0] = torch.nn.Linear(net[0].in_features, net[0].out_features)  # fresh values
    close(apply(params, x), first, tol=1e-6)
    net[2].weight = torch.nn.Parameter(torch.zeros_like(net[2].weight))
    close(apply(params, x), first, tol=1e-6)


def test_module_given_a_tied_layer_after_wrapping_swaps_the_tie_too(rng):
    """Layers appended or replaced after wrapping that share a wrapped tensor (tied):
    each call runs as torch.func.functional_call does with the same params (the tie
    takes the value passed), never with the layout the module had before."""
    torch.manual_seed(0)
    net = make_mlp()
    apply, params = jt.wrap_module(net)
    x, _ = data(rng)
    params = {k: v * 1.5 for k, v in params.items()}

    def torch_says():
        tensors = {k: t(np.asarray(v)) for k, v in params.items()}
        return torch.func.functional_call(net, tensors, (t(x),)).detach()

    close(apply(params, x), torch_says(), tol=1e-6)  # the places found for this layout

    def tied_layer():
        layer = torch.nn.Linear(1, 1)
        layer.bias = net[2].bias  # tied to "2.bias"
        return layer

    net.append(torch.nn.Tanh())
    net.append(tied_layer())  # a table more
    close(apply(params, x), torch_says(), tol=1e-6)
    net[4] = tied_layer()  # as many tables, another module
    close(apply(params, x), torch_says(), tol=1e-6)
    net[4].weight = torch.nn.Parameter(torch.full((1, 1), 3.0))  # another tensor in place
    close(apply(params, x), torch_says(), tol=1e-6)


def test_optax_adam_tracks_torch_adam(rng):
    optax = pytest.importorskip("optax", reason="needs optax (pip install -e '.[examples]')")
    net = make_mlp()
    apply, params = jt.wrap_module(net)
    x, y = data(rng)
    opt = optax.adam(1e-2)
    state = opt.init(params)

    @jax.jit
    def step(p, s):
        loss, g = jax.value_and_grad(lambda p: jnp.mean((apply(p, x) - y) ** 2))(p)
        updates, s = opt.update(g, s, p)
        return optax.apply_updates(p, updates), s, loss

    torch_opt = torch.optim.Adam(net.parameters(), lr=1e-2)
    for _ in range(25):
        params, state, loss = step(params, state)
        torch_opt.zero_grad()
        torch_loss = ((net(t(x)) - t(y)) ** 2).mean()
        torch_loss.backward()
        torch_opt.step()
        close(loss, torch_loss.item(), tol=2e-5)
    for name, p in net.named_parameters():
        close(params[name], p.detach(), tol=2e-5)


def test_module_buffers_travel_and_update_in_training_mode(rng):
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    apply, params = jt.wrap_module(net)
    assert sorted(apply.buffers) == ["1.num_batches_tracked", "1.running_mean",
                                     "1.running_var"]
    x, _ = data(rng)
    out, buffers = jax.jit(lambda p, b: apply(p, x, buffers=b))(params, apply.buffers)
    ref = net(t(x))                       # torch updates its running statistics
    close(out, ref.detach(), tol=1e-5)
    close(buffers["1.running_mean"], net[1].running_mean, tol=1e-6)
    close(buffers["1.running_var"], net[1].running_var, tol=1e-6)
    assert int(buffers["1.num_batches_tracked"]) == 1
    stateless = apply(params, x)          # the initial buffers, not updated
    close(stateless, out, tol=1e-6)
    close(apply.buffers["1.running_mean"], np.zeros(4))
    net.eval()
    eval_apply, _ = jt.wrap_module(net)   # eval mode uses the running statistics
    close(eval_apply(params, x), net(t(x)).detach(), tol=1e-5)


def test_module_gradients_through_batch_norm_in_both_modes(rng):
    """The way a CNN is trained: `jax.grad` through a module with BatchNorm, in training
    mode (batch statistics) and eval mode (running statistics), equals torch autograd's,
    with and without `buffers=`. Batch norm refuses to differentiate with respect to its
    running statistics: the buffers travel outside autograd and get no gradient (they
    are state, as in torch). This raised in both modes before."""
    x = rng.normal(size=(8, 3))
    for training in (True, False):
        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4),
                                  torch.nn.Tanh(), torch.nn.Linear(4, 1)).double()
        net[1].running_mean.fill_(0.5)
        net[1].running_var.fill_(2.0)
        net.train(training)
        apply, params = jt.wrap_module(net)
        state = {k: v.clone() for k, v in net.state_dict().items()}
        net(t(x)).pow(2).sum().backward()  # torch's gradient (this updates its statistics)
        net.load_state_dict(state)
        loss = lambda p: jnp.sum(apply(p, x) ** 2)  # noqa: E731
        grads = jax.jit(jax.grad(loss))(params)
        for name, p in net.named_parameters():
            close(grads[name], p.grad, tol=1e-10)
        with_state = jax.grad(
            lambda p, b: jnp.sum(apply(p, x, buffers=b)[0] ** 2), argnums=(0, 1),
            allow_int=True)  # num_batches_tracked is an integer buffer
        g_params, g_buffers = with_state(params, apply.buffers)
        for name, p in net.named_parameters():
            close(g_params[name], p.grad, tol=1e-10)
        assert all(not np.any(np.asarray(v)) for v in g_buffers.values()
                   if np.issubdtype(np.asarray(v).dtype, np.floating))


def test_module_bad_params_name_the_keys(rng):
    apply, params = jt.wrap_module(make_mlp())
    with pytest.raises(ValueError, match="parameter names.*0.bias"):
        apply({"0.weight": params["0.weight"]}, np.ones((1, 3), np.float32))
    with pytest.raises(ValueError, match="parameter names.*got.*extra"):
        apply({**params, "extra": params["0.bias"]}, np.ones((1, 3), np.float32))
    bn_apply, bn_params = jt.wrap_module(torch.nn.BatchNorm1d(2))
    x = np.ones((3, 2), np.float32)
    few = {k: v for k, v in bn_apply.buffers.items() if k != "running_var"}
    with pytest.raises(ValueError, match="buffer names.*running_var.*got"):
        bn_apply(bn_params, x, buffers=few)
    with pytest.raises(ValueError, match="buffer names.*got.*extra"):
        bn_apply(bn_params, x, buffers={**bn_apply.buffers, "extra": x})
    with pytest.raises(TypeError, match="expected a torch.nn.Module"):
        jt.wrap_module(lambda x: x)


def test_module_runs_in_the_mode_it_was_wrapped_in_and_its_mode_is_left_alone(rng):
    """BatchNorm normalizes by the batch in training mode and by its running statistics
    in eval mode: a wrapped module keeps the mode it had when wrapped, whatever the user
    sets on it afterwards, and the module's own mode is the user's after every call."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    net[1].running_mean.fill_(0.5)  # running statistics that differ from the batch's
    net[1].running_var.fill_(2.0)
    x, _ = data(rng)
    state = {k: v.clone() for k, v in net.state_dict().items()}
    refs = {}
    for mode in (True, False):
        refs[mode] = net.train(mode)(t(x)).detach()
        net.load_state_dict(state)  # undo training mode's update of the statistics
    assert not np.allclose(refs[True], refs[False], atol=1e-2)
    for wrapped_in in (True, False):
        apply, params = jt.wrap_module(net.train(wrapped_in))
        for user_mode in (wrapped_in, not wrapped_in, wrapped_in):
            net.train(user_mode)
            close(jax.jit(apply)(params, x), refs[wrapped_in], tol=1e-5)
            assert net.training is user_mode


# ---------------------------------------------------------------- packaging
def test_import_jaxbridge_does_not_import_torch_and_says_how_to_install_it():
    code = textwrap.dedent("""
        import sys, jaxbridge
        print("torch imported:", "torch" in sys.modules)
        sys.modules["torch"] = None  # as if torch were not installed
        try:
            import jaxbridge.torch
        except ImportError as e:
            print(e)
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert "torch imported: False" in proc.stdout, proc.stdout + proc.stderr
    assert 'pip install -e ".[torch]"' in proc.stdout, proc.stdout + proc.stderr


def test_a_module_called_once_per_shard_at_once_is_left_as_it_was():
    """shard_map over 4 CPU devices runs one call per device at once, on XLA's threads.
    Each call swaps the module's parameters for its own and back: unguarded, one call
    put another's (XLA's buffers, freed after the call) back into the module for good
    (before the calls took turns)."""
    script = textwrap.dedent("""
        import sys
        import jax, jax.numpy as jnp, numpy as np, torch
        from jax.sharding import NamedSharding, PartitionSpec as P
        import jaxbridge.torch as jt
        sys.setswitchinterval(1e-6)  # threads take turns often: races show at once
        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.Tanh(),
                                  torch.nn.Linear(256, 4))
        before = {k: v.detach().clone() for k, v in net.named_parameters()}
        apply, params = jt.wrap_module(net)
        mesh = jax.make_mesh((4,), ("d",))
        x = jax.device_put(np.random.default_rng(0).normal(size=(16, 64)).astype(np.float32),
                           NamedSharding(mesh, P("d")))
        f = jax.jit(jax.shard_map(lambda p, x: apply(p, x), mesh=mesh,
                                  in_specs=(P(), P("d")), out_specs=P("d")))
        want = net(torch.from_numpy(np.asarray(x))).detach().numpy()
        for _ in range(100):
            np.testing.assert_allclose(np.asarray(f(params, x)), want, rtol=1e-5, atol=1e-6)
        for k, v in net.named_parameters():
            assert type(v) is torch.nn.Parameter and torch.equal(v.detach(), before[k]), k
        print("module intact")
    """)
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               XLA_FLAGS="--xla_force_host_platform_device_count=4")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=300, env=env)
    assert "module intact" in proc.stdout, proc.stdout + proc.stderr


def test_users_never_see_torchs_warning_about_read_only_inputs():
    """XLA lends its input buffers read-only on purpose, and `torch.from_numpy` warns
    (once per process) about every read-only array: jaxbridge spends that warning when
    imported, so a user's first call prints nothing. A fresh process: the warning is
    given once per process."""
    code = textwrap.dedent("""
        import jax, jax.numpy as jnp, torch
        import jaxbridge.torch as jt
        f = jt.wrap(lambda x: torch.sin(x) * 2)
        print(float(jax.jit(f)(jnp.ones(3))[1]), float(f(jnp.full(2, 0.5))[0]))
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    close([float(v) for v in proc.stdout.split()], [2 * np.sin(1.0), 2 * np.sin(0.5)], 1e-6)
    assert "not writable" not in proc.stderr, proc.stderr


# ---------------------------------------------------------------- torch operators: out=
def test_torch_operators_write_into_xlas_buffer_once_known_exact():
    """A torch operator (torch.sin, torch.add, ...) runs with out= on XLA's output buffer
    from its second call on, once an ordinary call returned exactly the declared dtype
    and shape; where it did not (torch.sum of int32 gives int64, cast to int32 unless
    jax_enable_x64), or where the operator has no out= for these arguments (torch.sum
    of a whole tensor), it keeps returning results that are copied."""
    x = jnp.linspace(-1.0, 1.0, 7, dtype=jnp.float32)
    sin, add, total = jt.wrap(torch.sin), jt.wrap(torch.add), jt.wrap(torch.sum)
    neg = jt.wrap(torch.neg)  # integer and half-precision buffers are written into too
    for _ in range(3):
        for dtype in (jnp.int32, jnp.int8, jnp.float16):
            np.testing.assert_array_equal(jax.jit(neg)(jnp.arange(5, dtype=dtype)),
                                          -np.arange(5, dtype=dtype))
        close(jax.jit(sin)(x), np.sin(np.asarray(x)), 1e-6)
        close(jax.jit(add)(x, 2 * x), 3 * np.asarray(x), 1e-6)
        close(jax.jit(lambda v: add(v, 1))(x), np.asarray(x) + 1, 1e-6)  # a weak int
        assert int(jax.jit(total)(jnp.arange(5, dtype=jnp.int32))) == 10
    assert list(sin._batching.direct.values()) == [True]
    assert all(add._batching.direct.values()) and len(add._batching.direct) == 2
    assert list(total._batching.direct.values()) == [False]
    assert list(neg._batching.direct.values()) == [True, True, True]
    close(jax.grad(lambda v: sin(v).sum())(x), np.cos(np.asarray(x)), 1e-6)  # unchanged
    close(jax.vmap(sin)(x.reshape(7, 1)), np.sin(np.asarray(x)).reshape(7, 1), 1e-6)


# ---------------------------------------------------------------- out=True
def test_out_true_writes_into_xlas_buffers_and_differentiates(rng):
    """wrap(fn, result=..., out=True): fn fills `out` (a pytree of tensors viewing XLA's
    buffers); every transformation goes through torch.func.functionalize of it."""
    structs = lambda a, b: {"y": jax.ShapeDtypeStruct(a.shape, a.dtype),  # noqa: E731
                            "s": jax.ShapeDtypeStruct((), a.dtype)}

    @jt.wrap(result=structs, out=True)
    def f(a, b, out):
        torch.mul(torch.sin(a), b, out=out["y"])
        torch.sum(a * a, dim=0, out=out["s"])

    def twin(a, b):
        return {"y": jnp.sin(a) * b, "s": jnp.sum(a * a)}

    a, b = rng.normal(size=4), rng.normal(size=4)
    for got, want in zip(jax.tree_util.tree_leaves(jax.jit(f)(a, b)),
                         jax.tree_util.tree_leaves(twin(a, b))):
        close(got, want)

    def loss(f):
        def value(a, b):
            out = f(a, b)
            return jnp.sum(out["y"] ** 2) + out["s"]
        return value
    close(jax.jit(jax.grad(loss(f), argnums=(0, 1)))(a, b)[0],
          jax.grad(loss(twin), argnums=(0, 1))(a, b)[0])
    close(jax.jvp(f, (a, b), (b, a))[1]["y"], jax.jvp(twin, (a, b), (b, a))[1]["y"])
    A, B = rng.normal(size=(3, 4)), rng.normal(size=(3, 4))
    close(jax.vmap(f)(A, B)["y"], jax.vmap(twin)(A, B)["y"])


@pytest.mark.slow
def test_out_true_second_order(rng):
    """Forward over reverse through torch.func.functionalize (4-9 s: slow stage)."""
    @jt.wrap(result=lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), out=True)
    def f(a, out):
        torch.mul(torch.sin(a), a, out=out)

    a, t_ = rng.normal(size=4), rng.normal(size=4)
    hvp = [jax.jvp(jax.grad(lambda v: jnp.sum(g(v) ** 2)), (a,), (t_,))[1]
           for g in (f, lambda v: jnp.sin(v) * v)]
    close(*hvp)


def test_out_true_needs_result_and_a_function_that_returns_none():
    with pytest.raises(TypeError, match="out=True needs result="):
        jt.wrap(lambda x, out: None, out=True)
    with pytest.raises(TypeError, match="out must be True or False"):
        jt.wrap(lambda x: x, out="yes")

    @jt.wrap(result=jax.ShapeDtypeStruct((2,), jnp.float64), out=True)
    def returns(x, out):
        out.copy_(x)
        return out

    with pytest.raises(ResultMismatchError, match="must write its results into `out` and "
                                                  "return None; it returned Tensor"):
        jax.jit(returns)(np.ones(2))
