"""`jax.custom_gradient` style with a NumPy forward: `f(x) -> (value, grad_fn)`.

`jb.custom_gradient(result)` is jaxbridge's one-function form: the wrapped NumPy
function returns its value and a function mapping the output cotangent to the input
cotangents. Three patterns, each compared with the gradient we expect:

* `clipped_log(x)`: `log(x)` whose gradient `1/x` is clipped to [-10, 10] (it blows
  up near 0);
* `clip_grad_norm(x, max_norm=...)`: the identity whose backward pass rescales the
  cotangent to a norm of at most `max_norm` (a static keyword argument);
* `log1pexp(x)`: a stable-gradient pattern, the gradient written as `sigmoid(x)`
  instead of `exp(x) / (1 + exp(x))` (which is nan for large x).

We also check `clipped_log` against the same function written with
`jax.custom_gradient`, and train through the clipped functions in a jitted loop.
Exits non-zero if a check fails.
"""

import sys

import jax
import jax.numpy as jnp
import numpy as np
import scipy.special

import jaxbridge as jb

jax.config.update("jax_enable_x64", True)


@jb.custom_gradient(lambda x: x)
def clipped_log(x):
    """log(x), with its gradient 1/x clipped to [-10, 10]."""
    return np.log(x), lambda ct: ct * np.clip(1.0 / x, -10.0, 10.0)


@jb.custom_gradient(lambda x, max_norm: x)
def clip_grad_norm(x, *, max_norm):
    """The identity; the backward pass rescales the cotangent to norm <= max_norm."""
    def grad_fn(ct):
        norm = np.linalg.norm(ct)
        return ct * min(1.0, max_norm / norm) if norm > 0 else ct
    return np.array(x), grad_fn


@jb.custom_gradient(lambda x: x)
def log1pexp(x):
    """log(1 + exp(x)) computed stably, with the stable gradient sigmoid(x)."""
    return np.logaddexp(0.0, x), lambda ct: ct * scipy.special.expit(x)


@jax.custom_gradient
def jax_clipped_log(x):
    """The same as `clipped_log`, with JAX's own `jax.custom_gradient`."""
    return jnp.log(x), lambda ct: (ct * jnp.clip(1.0 / x, -10.0, 10.0),)


def main() -> int:
    checks = {}
    x = jnp.array([0.01, 0.05, 0.1, 0.5, 1.0, 4.0])

    # 1. clipped_log: value log(x), gradient clip(1/x, -10, 10); also under jit and vmap.
    grad = jax.jit(jax.grad(lambda x: clipped_log(x).sum()))(x)
    expected = jnp.clip(1.0 / x, -10.0, 10.0)
    checks["clipped_log value"] = float(jnp.max(jnp.abs(clipped_log(x) - jnp.log(x))))
    checks["clipped_log grad vs clip(1/x)"] = float(jnp.max(jnp.abs(grad - expected)))
    ref = jax.grad(lambda x: jax_clipped_log(x).sum())(x)
    checks["clipped_log grad vs jax.custom_gradient"] = float(jnp.max(jnp.abs(grad - ref)))
    per_elem = jax.vmap(jax.grad(lambda s: clipped_log(s)))(x)
    checks["clipped_log vmap(grad) (scalar calls)"] = float(jnp.max(jnp.abs(per_elem - expected)))
    print(f"{'x':>8} {'log(x)':>10} {'d/dx clipped':>14} {'1/x':>10}")
    for xi, vi, gi in zip(np.asarray(x), np.asarray(clipped_log(x)), np.asarray(grad)):
        print(f"{xi:8.2f} {vi:10.4f} {gi:14.4f} {1 / xi:10.4f}")

    # 2. clip_grad_norm: the cotangent of a loss with a large gradient is rescaled.
    v = jnp.array([3.0, -4.0, 12.0])
    loss = lambda v: 10.0 * jnp.sum(clip_grad_norm(v, max_norm=1.0) ** 2)  # noqa: E731
    raw = 20.0 * v                                     # gradient without clipping
    expected = raw / jnp.linalg.norm(raw)              # norm clipped to 1
    g = jax.jit(jax.grad(loss))(v)
    checks["clip_grad_norm grad vs rescaled"] = float(jnp.max(jnp.abs(g - expected)))
    print(f"clip_grad_norm: raw gradient norm {float(jnp.linalg.norm(raw)):.1f}, "
          f"clipped norm {float(jnp.linalg.norm(g)):.6f}")

    # 3. log1pexp: value and stable gradient, even at x = 800 where exp overflows.
    big = jnp.array([-800.0, -30.0, 0.0, 30.0, 800.0])
    value, g = jax.jit(jax.vmap(jax.value_and_grad(log1pexp)))(big)
    naive_g = jax.vmap(jax.grad(lambda x: jnp.log(1.0 + jnp.exp(x))))(big)
    checks["log1pexp value vs jax.nn.softplus"] = float(
        jnp.max(jnp.abs(value - jax.nn.softplus(big))))
    checks["log1pexp grad vs jax.nn.sigmoid"] = float(jnp.max(jnp.abs(g - jax.nn.sigmoid(big))))
    finite = bool(jnp.all(jnp.isfinite(g)))
    print(f"log1pexp grad at {np.asarray(big).tolist()}: ours {np.asarray(g).round(6).tolist()}"
          f", naive jnp {np.asarray(naive_g).tolist()}")

    # 4. Training through the clipped gradient: fit log(x) = t starting next to 0,
    #    where the unclipped gradient 2*(log x - t)/x is ~ -1e3 and overshoots.
    t = jnp.array([-1.0, 0.0, 1.0])
    objective = lambda x, log: jnp.sum((log(x) - t) ** 2)  # noqa: E731

    @jax.jit
    def step(x):
        value, g = jax.value_and_grad(objective)(x, clipped_log)
        return jnp.maximum(x - 0.1 * g, 1e-3), value

    xs = jnp.full(3, 0.01)
    first_naive = xs - 0.1 * jax.grad(objective)(xs, jnp.log)
    for it in range(1001):
        xs, value = step(xs)
        if it % 250 == 0:
            print(f"step {it:4d}  loss {float(value):.3e}  x {np.asarray(xs).round(4).tolist()}")
    fit_err = float(jnp.max(jnp.abs(xs - jnp.exp(t))))
    print(f"(an unclipped first step would jump from 0.01 to "
          f"{np.asarray(first_naive).round(1).tolist()})")
    print(f"fitted x = exp(t) to {fit_err:.1e} in 1000 jitted steps through clipped_log")

    for what, err in checks.items():
        print(f"{what:42s} max abs error {err:.2e}")
    ok = all(err < 1e-12 for err in checks.values()) and finite and fit_err < 1e-6
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
