"""A regression model with a SciPy layer (and a C++ kernel), trained in a jitted step.

The model is `x -> erf(x W1 + b1) -> softplus(. W2 + b2) -> . W3 + b3`:

* `erf` is `scipy.special.erf`, wrapped with `jb.foreign` (vectorized under vmap),
  with its VJP rule `2/sqrt(pi) exp(-z^2) ct` and JVP rule in NumPy;
* `softplus` is the built-in C++ kernel `jaxbridge.ops.softplus` where it is built,
  else `jax.nn.softplus`.

We check the gradient of the loss against JAX autodiff of the same model written
with jnp only (`jax.scipy.special.erf`, `jax.nn.softplus`), train with optax's Adam
(SGD with momentum if optax is missing) in a `jax.jit`-compiled step with a progress line
(tqdm if installed), save the loss curve as a PNG if matplotlib is installed (to
`--out DIR`, default a new temporary directory), and time the compiled step against
the jnp-only model. Exits non-zero if a check fails.
"""

import argparse
import os
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
import scipy.special

import jaxbridge as jb

jax.config.update("jax_enable_x64", True)

try:
    import optax
except ImportError:
    optax = None
try:
    from tqdm import tqdm
except ImportError:
    tqdm = None


# ------------------------------------------------------------------ the SciPy layer
@jb.foreign(lambda z: z, vmap="vectorized")
def erf(z):
    """The error function, by scipy.special.erf on the host."""
    return scipy.special.erf(z)


@erf.defvjp
def erf_vjp(primals, y, ct):
    (z,) = primals
    return (ct * (2.0 / np.sqrt(np.pi)) * np.exp(-z * z),)


@erf.defjvp
def erf_jvp(primals, y, tangents):
    (z,), (dz,) = primals, tangents
    return (2.0 / np.sqrt(np.pi)) * np.exp(-z * z) * dz


def builtin_softplus():
    """(softplus, description): the C++ kernel if available, else jax.nn.softplus."""
    try:
        from jaxbridge import ops
        if not ops.available():
            raise ImportError(f"kernels not built: {ops.IMPORT_ERROR}")
        return ops.softplus, "jaxbridge.ops.softplus (C++ kernel)"
    except (ImportError, AttributeError) as err:
        return jax.nn.softplus, f"jax.nn.softplus (no C++ kernel: {err})"


# ------------------------------------------------------------------ the model
def init_params(key, sizes, dtype):
    params = []
    for k, (n_in, n_out) in zip(jax.random.split(key, len(sizes) - 1), zip(sizes, sizes[1:])):
        params.append({"w": jax.random.normal(k, (n_in, n_out), dtype) / np.sqrt(n_in),
                       "b": jnp.zeros((n_out,), dtype)})
    return params


def make_model(erf_fn, softplus_fn):
    def model(params, x):
        p1, p2, p3 = params
        h = erf_fn(x @ p1["w"] + p1["b"])
        h = softplus_fn(h @ p2["w"] + p2["b"])
        return h @ p3["w"] + p3["b"]
    return model


def make_loss(model):
    def loss(params, x, y):
        return jnp.mean((model(params, x) - y) ** 2)
    return loss


def make_step(loss, opt):
    """One jitted training step: (params, opt_state, x, y) -> (params, opt_state, loss)."""
    if opt is None:  # SGD with momentum; the state is the velocity
        @jax.jit
        def step(params, velocity, x, y):
            value, g = jax.value_and_grad(loss)(params, x, y)
            velocity = jax.tree.map(lambda v, d: 0.9 * v + d, velocity, g)
            return jax.tree.map(lambda p, v: p - 0.05 * v, params, velocity), velocity, value
        return step

    @jax.jit
    def step(params, state, x, y):
        value, g = jax.value_and_grad(loss)(params, x, y)
        updates, state = opt.update(g, state, params)
        return optax.apply_updates(params, updates), state, value
    return step


def time_step(step, params, state, x, y, repeats):
    """Seconds per compiled step (compilation excluded), best of 3 rounds."""
    jax.block_until_ready(step(params, state, x, y))
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(repeats):
            out = step(params, state, x, y)
        jax.block_until_ready(out)
        best = min(best, (time.perf_counter() - t0) / repeats)
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="directory for loss_curve.png (default: a temp dir)")
    parser.add_argument("--steps", type=int, default=400)
    args = parser.parse_args()

    dtype = jnp.float64
    softplus, softplus_name = builtin_softplus()
    print(f"layers: {erf!r}; softplus = {softplus_name}")
    print(f"optimizer: {'optax.adam' if optax else 'SGD with momentum (optax not installed)'}")

    # Data: y = sin(x . a) + 0.5 cos(x . b), 512 samples in 6 dimensions.
    kx, ka, kp = jax.random.split(jax.random.PRNGKey(0), 3)
    x = jax.random.normal(kx, (512, 6), dtype)
    a, b = jax.random.normal(ka, (2, 6), dtype)
    y = (jnp.sin(x @ a) + 0.5 * jnp.cos(x @ b))[:, None]
    params = init_params(kp, (6, 32, 32, 1), dtype)

    loss = make_loss(make_model(erf, softplus))
    loss_jnp = make_loss(make_model(jax.scipy.special.erf, jax.nn.softplus))

    # 1. Gradient check against JAX autodiff of the jnp-only model.
    g = jax.jit(jax.grad(loss))(params, x, y)
    g_ref = jax.grad(loss_jnp)(params, x, y)
    err = max(float(jnp.max(jnp.abs(u - v))) for u, v in
              zip(jax.tree.leaves(g), jax.tree.leaves(g_ref)))
    print(f"gradient vs JAX autodiff of the jnp-only model: max abs error {err:.2e}")

    # 2. Training, the whole step under jax.jit.
    opt = optax.adam(1e-2) if optax else None
    state = opt.init(params) if opt else jax.tree.map(jnp.zeros_like, params)
    step = make_step(loss, opt)
    losses = []
    bar = tqdm(total=args.steps, desc="training", mininterval=0.5, ascii=True) if tqdm else None
    for it in range(args.steps):
        params, state, value = step(params, state, x, y)
        losses.append(float(value))
        if bar is not None:
            bar.update(1)
        if it % 100 == 0 or it == args.steps - 1:
            line = f"step {it:4d}  loss {losses[-1]:.4e}"
            bar.write(line) if bar is not None else print(line, flush=True)
    if bar is not None:
        bar.close()
    print(f"loss {losses[0]:.4e} -> {losses[-1]:.4e} in {args.steps} jitted steps")

    # 3. The loss curve, if matplotlib is installed (never written into the repository).
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no loss-curve plot")
    else:
        out_dir = args.out or tempfile.mkdtemp(prefix="jaxbridge-example-")
        os.makedirs(out_dir, exist_ok=True)
        path = os.path.join(out_dir, "loss_curve.png")
        fig, ax = plt.subplots(figsize=(6, 4))
        ax.semilogy(losses)
        ax.set(xlabel="step", ylabel="training MSE",
               title="erf (SciPy) + softplus layers, jitted step")
        fig.tight_layout()
        fig.savefig(path, dpi=100)
        plt.close(fig)
        print(f"loss curve written to {path}")

    # 4. Cost of the compiled step, against the same model with jnp ops only.
    step_jnp = make_step(loss_jnp, opt)
    state0 = opt.init(params) if opt else jax.tree.map(jnp.zeros_like, params)
    t_ours = time_step(step, params, state0, x, y, repeats=50)
    t_jnp = time_step(step_jnp, params, state0, x, y, repeats=50)
    print(f"step time: with host layers {t_ours * 1e3:.3f} ms, jnp only {t_jnp * 1e3:.3f} ms, "
          f"ratio {t_ours / t_jnp:.1f}x")

    ok = err < 1e-12 and losses[-1] < 0.1 * losses[0]
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
