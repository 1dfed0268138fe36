"""A Flax NNX module whose forward pass runs in NumPy, trained with nnx.Optimizer.

`HostDense` holds two parameters (`w`, `b`); its forward `tanh(x @ w + b)` is a NumPy
function wrapped with `jb.foreign`, with its VJP rule written in NumPy too. We
check `nnx.grad` of the module state against JAX autodiff of a jnp twin module with
the same parameters, then fit a teacher network with `nnx.Optimizer` + optax in an
`nnx.jit`-compiled step. Exits non-zero if a check fails.

Needs: flax, optax (`pip install -e ".[examples]"`).
"""

import sys

try:
    import optax
    from flax import nnx
except ImportError as err:  # the test skips before running us; a user sees why
    print(f"this example needs flax and optax ({err}); pip install -e '.[examples]'")
    sys.exit(2)

import jax
import jax.numpy as jnp
import numpy as np

import jaxbridge as jb

jax.config.update("jax_enable_x64", True)


def _dense_result(w, b, x):
    return jax.ShapeDtypeStruct((*x.shape[:-1], w.shape[1]), x.dtype)


@jb.foreign(_dense_result)
def host_dense_tanh(w, b, x):
    """y = tanh(x @ w + b), computed by NumPy on the host."""
    return np.tanh(x @ w + b)


@host_dense_tanh.defvjp
def host_dense_tanh_vjp(primals, y, ct):
    """With g = ct * (1 - y^2): dw = x^T g, db = sum(g), dx = g w^T."""
    w, _, x = primals
    g = ct * (1.0 - y * y)
    return x.T @ g, g.sum(axis=0), g @ w.T


class HostDense(nnx.Module):
    """A dense layer with a tanh, evaluated in NumPy through jaxbridge."""

    def __init__(self, n_in: int, n_out: int, *, rngs: nnx.Rngs):
        scale = 1.0 / np.sqrt(n_in)
        self.w = nnx.Param(scale * jax.random.normal(rngs.params(), (n_in, n_out), jnp.float64))
        self.b = nnx.Param(jnp.zeros((n_out,), jnp.float64))

    def __call__(self, x):
        return host_dense_tanh(self.w[...], self.b[...], x)


class JnpDense(HostDense):
    """The same layer in jnp: the reference for JAX's own autodiff."""

    def __call__(self, x):
        return jnp.tanh(x @ self.w[...] + self.b[...])


def mse(model, x, y):
    return jnp.mean((model(x) - y) ** 2)


def main() -> int:
    n_in, n_out, n_data = 5, 3, 64
    key_x, key_t = jax.random.split(jax.random.PRNGKey(0))
    x = jax.random.normal(key_x, (n_data, n_in), jnp.float64)
    teacher = JnpDense(n_in, n_out, rngs=nnx.Rngs(42))
    y = teacher(x)

    model = HostDense(n_in, n_out, rngs=nnx.Rngs(0))
    twin = JnpDense(n_in, n_out, rngs=nnx.Rngs(1))
    nnx.update(twin, nnx.state(model))          # identical parameters

    # 1. Gradients of the module state: nnx.grad through the foreign VJP vs. jnp autodiff.
    print(f"module forward: {host_dense_tanh!r}")
    grads = nnx.jit(nnx.grad(mse))(model, x, y)
    ref = nnx.grad(mse)(twin, x, y)
    print(f"gradient state type: {type(grads).__name__} with keys {sorted(grads.keys())}")
    err = max(float(jnp.max(jnp.abs(a - b))) for a, b in
              zip(jax.tree.leaves(grads), jax.tree.leaves(ref)))
    same_tree = jax.tree.structure(grads) == jax.tree.structure(ref)
    print(f"nnx.grad vs JAX autodiff of the jnp twin: max abs error {err:.2e} "
          f"(same State structure: {same_tree})")

    # 2. A short training loop with nnx.Optimizer + optax, the step under nnx.jit.
    optimizer = nnx.Optimizer(model, optax.adam(5e-2), wrt=nnx.Param)

    @nnx.jit
    def train_step(model, optimizer, x, y):
        loss, grads = nnx.value_and_grad(mse)(model, x, y)
        optimizer.update(model, grads)
        return loss

    first = float(mse(model, x, y))
    for step in range(301):
        loss = train_step(model, optimizer, x, y)
        if step % 75 == 0:
            print(f"step {step:4d}  loss {float(loss):.3e}")
    final = float(mse(model, x, y))
    print(f"loss {first:.3e} -> {final:.3e} after 300 nnx.jit steps through the NumPy layer")

    ok = err < 1e-12 and same_tree and final < 1e-3 * first
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
