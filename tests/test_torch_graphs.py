"""jaxbridge.torch: a forward call differentiated in reverse mode keeps its autograd graph
for the VJP call (jaxbridge/torch/_graphs.py), so a training step runs the module's
forward once, as eager torch does. Each test checks the gradient against torch itself,
and that the graph is a hint only: gone, reused, batched or stale, the answer stays right.
"""

import numpy as np
import pytest

torch = pytest.importorskip(
    "torch", reason="jaxbridge.torch needs PyTorch: pip install -e '.[torch]' (Python 3.11)")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import jaxbridge.torch as jt  # noqa: E402
from jaxbridge.torch import _graphs  # noqa: E402

pytestmark = pytest.mark.cpu


@pytest.fixture(autouse=True)
def no_graphs_kept():
    """Each test starts with no graph kept (earlier tests may leave some behind)."""
    _graphs.clear()


def counted_mlp():
    """A float64 MLP whose forward calls are counted (a forward hook, as users add)."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(),
                              torch.nn.Linear(8, 2)).double()
    net.calls = 0

    def count(module, args, output):
        module.calls += 1

    net.register_forward_hook(count)
    return net


def torch_loss_and_grads(net, params, x):
    ps = {k: torch.tensor(np.asarray(v), requires_grad=True) for k, v in params.items()}
    out = torch.func.functional_call(net, ps, (torch.tensor(np.asarray(x)),))
    loss = (out ** 2).sum()
    loss.backward()
    return float(loss.detach()), {k: v.grad.numpy() for k, v in ps.items()}


def data():
    return jnp.asarray(np.random.default_rng(0).normal(size=(5, 4)))


def assert_grads(got, want):
    for name in want:
        np.testing.assert_allclose(np.asarray(got[name]), want[name], rtol=1e-12, atol=1e-12,
                                   err_msg=name)


@pytest.mark.parametrize("mode", ["eager", "jit"])
def test_a_training_step_runs_the_forward_once(mode):
    # Before: the VJP call ran the module again (two forwards a step).
    net, x = counted_mlp(), data()
    apply, params = jt.wrap_module(net)
    step = jax.value_and_grad(lambda p: jnp.sum(apply(p, x) ** 2))
    step = jax.jit(step) if mode == "jit" else step
    want_loss, want = torch_loss_and_grads(net, params, x)
    step(params)  # the first call traces (shape inference runs the module on meta tensors)
    for _ in range(3):
        net.calls = 0
        loss, grads = step(params)
        jax.block_until_ready(grads)
        assert net.calls == 1
        np.testing.assert_allclose(float(loss), want_loss, rtol=1e-12)
        assert_grads(grads, want)
    assert _graphs.kept_count() == 0  # each step took its graph


def test_the_kept_graph_holds_no_view_of_xlas_buffers():
    # The forward's inputs and saved tensors are XLA's buffers during the call only:
    # after unrelated work reuses that memory, the backward must still be right.
    net, x = counted_mlp(), data()
    apply, params = jt.wrap_module(net)
    _, want = torch_loss_and_grads(net, params, x)
    loss_of = jax.jit(lambda p, x: jnp.sum(apply(p, x) ** 2))
    _, pull = jax.vjp(loss_of, params, x)
    del x
    for v in range(20):  # overwrite freed memory
        jax.block_until_ready(jnp.full((5, 4), float(v)) + jnp.full((8, 4), -1.0).sum())
    assert_grads(pull(1.0)[0], want)


def test_a_pullback_called_twice_runs_the_function_again_the_second_time():
    net, x = counted_mlp(), data()
    apply, params = jt.wrap_module(net)
    _, want = torch_loss_and_grads(net, params, x)
    _, pull = jax.vjp(lambda p: jnp.sum(apply(p, x) ** 2), params)
    net.calls = 0
    first = pull(1.0)[0]
    assert net.calls == 0  # the kept graph
    second = pull(1.0)[0]
    assert net.calls == 1  # gone: the function runs again
    assert_grads(first, want)
    assert_grads(second, want)


def test_graphs_nobody_takes_are_bounded():
    net, x = counted_mlp(), data()
    apply, params = jt.wrap_module(net)
    pulls = [jax.vjp(lambda p: jnp.sum(apply(p, x) ** 2), params)[1]
             for _ in range(3 * _graphs.KEPT)]
    assert _graphs.kept_count() == _graphs.KEPT
    _, want = torch_loss_and_grads(net, params, x)
    assert_grads(pulls[0](1.0)[0], want)  # dropped long ago: runs again, still right
    assert_grads(pulls[-1](1.0)[0], want)  # still kept
    for pull in pulls:
        pull(1.0)
    assert _graphs.kept_count() == 0


def test_a_closed_over_tensor_changed_in_place_before_the_backward():
    # Autograd refuses a graph whose saved tensor was modified: the VJP call then runs
    # the function again on the current value, as every call without a kept graph does.
    w = torch.tensor([1.0, 2.0], dtype=torch.float64)
    f = jt.wrap(lambda x: (x * w).sum())
    x = jnp.array([3.0, 4.0])
    _, pull = jax.vjp(f, x)
    w.mul_(2)
    np.testing.assert_allclose(np.asarray(pull(1.0)[0]), [2.0, 4.0])


def test_jacrev_vmap_of_grad_and_hessian_are_right():
    net, x = counted_mlp(), data()
    apply, params = jt.wrap_module(net)
    bias = params["2.bias"]

    def out(b):
        return apply({**params, "2.bias": b}, x)

    np.testing.assert_allclose(np.asarray(jax.jacrev(out)(bias)),
                               np.broadcast_to(np.eye(2), (5, 2, 2)), atol=1e-15)
    loss = lambda p: jnp.sum(apply(p, x) ** 2)  # noqa: E731
    _, want = torch_loss_and_grads(net, params, x)
    stacked = jax.tree.map(lambda a: jnp.stack([a, a]), params)
    grads = jax.vmap(jax.grad(loss))(stacked)
    for name in want:
        np.testing.assert_allclose(np.asarray(grads[name]), np.stack([want[name]] * 2),
                                   rtol=1e-12, atol=1e-12)
    # d2/db2 of sum((h + b)^2) over 5 rows: 10 I
    hess = jax.hessian(lambda b: jnp.sum(out(b) ** 2))(bias)
    np.testing.assert_allclose(np.asarray(hess), 10 * np.eye(2), rtol=1e-12)


def test_a_function_of_several_arguments_and_integer_inputs():
    def f(x, idx, scale):
        return (x[idx] * scale).sin(), x.sum()

    g = jt.wrap(f)
    x = jnp.linspace(0.0, 1.0, 6)
    idx = jnp.array([0, 2, 5])

    def loss(x, scale):
        a, b = g(x, idx, scale)
        return jnp.sum(a) + 2 * b

    gx, gs = jax.jit(jax.grad(loss, argnums=(0, 1)))(x, jnp.float64(3.0))
    want_x = 2 * np.ones(6)
    want_x[[0, 2, 5]] += 3.0 * np.cos(3.0 * np.asarray(x)[[0, 2, 5]])
    np.testing.assert_allclose(np.asarray(gx), want_x, rtol=1e-12)
    xi = np.asarray(x)[[0, 2, 5]]
    np.testing.assert_allclose(float(gs), np.sum(xi * np.cos(3.0 * xi)), rtol=1e-12)


def test_forward_mode_and_plain_calls_keep_nothing():
    net, x = counted_mlp(), data()
    apply, params = jt.wrap_module(net)
    before = _graphs.kept_count()
    jax.jit(lambda p: apply(p, x))(params)
    jax.jvp(lambda b: apply({**params, "2.bias": b}, x), (params["2.bias"],),
            (jnp.ones(2),))
    assert _graphs.kept_count() == before


def test_outputs_that_do_not_depend_on_the_inputs():
    f = jt.wrap(lambda x: (torch.ones(3, dtype=torch.float64), x * 2))
    g = jax.grad(lambda x: jnp.sum(f(x)[0]) + jnp.sum(f(x)[1]))(jnp.ones(2))
    np.testing.assert_allclose(np.asarray(g), [2.0, 2.0])
