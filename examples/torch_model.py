"""A PyTorch nn.Module trained by optax inside a jitted JAX loop, step for step with torch.

`jaxbridge.torch.wrap_module` turns a torch MLP into ``apply(params, x)`` and a dict
of JAX arrays keyed by torch's parameter names. We train it with `optax.adam` in a
`jax.jit`-compiled `lax.scan` of steps, and train an identical copy of the module
with `torch.optim.Adam` in eager torch; both see the same mini-batches. The losses and
the final parameters must agree (float32 rounding only), and the loss must fall.
Exits non-zero if a check fails.

Needs: torch and optax (`pip install -e ".[torch,examples]"`).
"""

import copy
import sys

try:
    import optax
    import torch

    import jaxbridge.torch as jt
except ImportError as err:  # the test skips before running us; a user sees why
    print(f"this example needs torch and optax ({err}); "
          f"pip install -e '.[torch,examples]'")
    sys.exit(2)

import jax
import jax.numpy as jnp
import numpy as np

STEPS, BATCH, LR = 80, 32, 1e-2


def make_data(rng):
    """A smooth target on R^4; one mini-batch per step."""
    x = rng.normal(size=(STEPS, BATCH, 4)).astype(np.float32)
    y = np.sin(x @ np.array([1.0, -0.5, 0.25, 2.0], np.float32))[..., None]
    return x, y.astype(np.float32)


def main() -> int:
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 32), torch.nn.SiLU(),
                              torch.nn.Linear(32, 32), torch.nn.SiLU(),
                              torch.nn.Linear(32, 1))
    twin = copy.deepcopy(net)  # trained by torch itself, for comparison
    xs, ys = make_data(np.random.default_rng(0))

    # ---- JAX: optax.adam over the wrapped module, all steps in one jitted scan
    apply, params = jt.wrap_module(net)
    opt = optax.adam(LR)

    def loss_fn(p, x, y):
        return jnp.mean((apply(p, x) - y) ** 2)

    @jax.jit
    def train(params, xs, ys):
        def step(carry, batch):
            p, state = carry
            loss, grads = jax.value_and_grad(loss_fn)(p, *batch)
            updates, state = opt.update(grads, state, p)
            return (optax.apply_updates(p, updates), state), loss

        (params, _), losses = jax.lax.scan(step, (params, opt.init(params)), (xs, ys))
        return params, losses

    params, losses = train(params, xs, ys)

    # ---- torch: the same model, the same batches, torch.optim.Adam
    torch_opt = torch.optim.Adam(twin.parameters(), lr=LR)
    torch_losses = []
    for x, y in zip(xs, ys):
        torch_opt.zero_grad()
        loss = ((twin(torch.from_numpy(x)) - torch.from_numpy(y)) ** 2).mean()
        loss.backward()
        torch_opt.step()
        torch_losses.append(loss.item())

    loss_gap = float(np.max(np.abs(np.asarray(losses) - np.array(torch_losses))))
    param_gap = max(float(np.max(np.abs(np.asarray(params[name]) - p.detach().numpy())))
                    for name, p in twin.named_parameters())
    print(f"loss: {float(losses[0]):.4f} -> {float(losses[-1]):.4f} (jax+optax), "
          f"{torch_losses[0]:.4f} -> {torch_losses[-1]:.4f} (torch)")
    print(f"largest difference: loss {loss_gap:.2e}, parameters {param_gap:.2e}")
    ok = loss_gap < 1e-4 and param_gap < 1e-4 and float(losses[-1]) < 0.7 * float(losses[0])
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
