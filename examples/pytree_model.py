"""A model made of plain Python classes registered as pytrees, one layer in NumPy.

`Linear` and `Activation` are ordinary classes registered with
`jax.tree_util.register_pytree_node`; `Model` is a dataclass registered with
`jax.tree_util.register_dataclass`. The hidden `Linear` layer's forward runs in
NumPy through `jb.foreign`, and it takes the layer object itself as an argument: its
VJP returns the weight gradients as a `Linear`, in the caller's structure. `jax.grad`
of a loss w.r.t. the whole model then returns a `Model`-shaped pytree of gradients,
which we compare with JAX autodiff of the same model using only jnp, before a jitted
training loop. Exits non-zero if a check fails.
"""

import dataclasses
import sys

import jax
import jax.numpy as jnp
import numpy as np

import jaxbridge as jb

jax.config.update("jax_enable_x64", True)


class Linear:
    """y = x @ w + b. `host=True` runs it in NumPy (a static flag, in the treedef)."""

    def __init__(self, w, b, host=False):
        self.w, self.b, self.host = w, b, host

    def __call__(self, x):
        return host_linear(self, x) if self.host else x @ self.w + self.b

    def __repr__(self):
        return f"Linear(w={getattr(self.w, 'shape', self.w)}, b={getattr(self.b, 'shape', self.b)})"


jax.tree_util.register_pytree_node(
    Linear, lambda l: ((l.w, l.b), l.host), lambda host, wb: Linear(*wb, host=host))


class Activation:
    """A parametric softplus, softplus(beta * x) / beta, with a learnable beta."""

    def __init__(self, beta):
        self.beta = beta

    def __call__(self, x):
        return jax.nn.softplus(self.beta * x) / self.beta

    def __repr__(self):
        return f"Activation(beta={getattr(self.beta, 'shape', self.beta)})"


jax.tree_util.register_pytree_node(
    Activation, lambda a: ((a.beta,), None), lambda _, children: Activation(*children))


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Model:
    hidden: Linear
    act: Activation
    head: Linear

    def __call__(self, x):
        return self.head(self.act(self.hidden(x)))


@jb.foreign(lambda layer, x: jax.ShapeDtypeStruct((x.shape[0], layer.w.shape[1]), x.dtype))
def host_linear(layer, x):
    """x @ w + b in NumPy; `layer` arrives as a Linear holding NumPy arrays."""
    return x @ layer.w + layer.b


@host_linear.defvjp
def host_linear_vjp(primals, y, ct):
    """Cotangents in the caller's structure: a Linear for the layer, an array for x."""
    layer, x = primals
    return Linear(x.T @ ct, ct.sum(axis=0), host=layer.host), ct @ layer.w.T


def init(key, sizes, host):
    k1, k2 = jax.random.split(key)
    (n_in, n_hidden, n_out) = sizes
    return Model(
        hidden=Linear(jax.random.normal(k1, (n_in, n_hidden)) / np.sqrt(n_in),
                      jnp.zeros(n_hidden), host=host),
        act=Activation(jnp.array(1.0)),
        head=Linear(jax.random.normal(k2, (n_hidden, n_out)) / np.sqrt(n_hidden),
                    jnp.zeros(n_out)))


def loss(model, x, y):
    return jnp.mean((model(x) - y) ** 2)


def main() -> int:
    sizes = (3, 16, 1)
    x = jax.random.uniform(jax.random.PRNGKey(1), (128, 3), jnp.float64, -2.0, 2.0)
    y = jnp.sin(x[:, :1]) * jnp.cos(x[:, 1:2]) + 0.3 * x[:, 2:]

    model = init(jax.random.PRNGKey(0), sizes, host=True)
    twin = dataclasses.replace(model, hidden=Linear(model.hidden.w, model.hidden.b))  # jnp only

    # 1. jax.grad w.r.t. the whole model: a Model of gradients, like the jnp twin's.
    grads = jax.jit(jax.grad(loss))(model, x, y)
    ref = jax.grad(loss)(twin, x, y)
    print(f"grads: {grads}")
    structure_ok = (isinstance(grads, Model) and isinstance(grads.hidden, Linear)
                    and grads.hidden.host and [a.shape for a in jax.tree.leaves(grads)]
                    == [a.shape for a in jax.tree.leaves(ref)])
    err = max(float(jnp.max(jnp.abs(a - b)))
              for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(ref)))
    print(f"jax.grad(model) vs JAX autodiff of the jnp twin: max abs error {err:.2e} "
          f"(Model-shaped: {structure_ok})")

    # 2. A jitted training loop (plain SGD on every leaf, beta included).
    @jax.jit
    def step(model):
        value, g = jax.value_and_grad(loss)(model, x, y)
        return jax.tree.map(lambda p, d: p - 0.1 * d, model, g), value

    first = float(loss(model, x, y))
    for it in range(1001):
        model, value = step(model)
        if it % 250 == 0:
            print(f"step {it:4d}  loss {float(value):.4e}  beta {float(model.act.beta):.3f}")
    final = float(loss(model, x, y))
    print(f"loss {first:.4e} -> {final:.4e} in 1000 jitted steps; hidden layer still on the "
          f"host: {model.hidden.host}")

    ok = err < 1e-12 and structure_ok and final < 0.1 * first
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
