"""Per-call cost of calling NumPy from jitted JAX code, side by side.

Each row times a jitted `lax.fori_loop` whose body calls `sin` through one
mechanism, and divides by the number of iterations:

* jnp          native `jnp.sin` (the floor),
* jaxbridge    `jb.foreign` on the native host-call trampoline,
* jb+pure_cb   `jb.foreign(..., backend="pure_callback")` (jaxbridge's fallback),
* pure_cb      `jax.pure_callback` written by hand,
* buffer_cb    `jax.experimental.buffer_callback` written by hand,

for 1, 1e3 and 1e6 float32 elements, then a `grad` step through a bridged function
vs `jax.custom_vjp` + `jax.pure_callback` written by hand. Prints tables with the
ratios. Usage: `python benchmarks/hostcall.py [--quick]`.
"""

from __future__ import annotations

import argparse
import platform
import time

import jax
import jax.numpy as jnp
import numpy as np

import jaxbridge as jb

try:
    from jax.experimental.buffer_callback import buffer_callback
except ImportError:  # older/newer JAX without it
    buffer_callback = None


def host_sin(x):
    return np.sin(x)


def make_mechanisms(shape):
    out = jax.ShapeDtypeStruct(shape, jnp.float32)
    ours = jb.foreign(lambda x: x)(host_sin)
    ours_pc = jb.foreign(lambda x: x, backend="pure_callback")(host_sin)
    mechanisms = {
        "jnp": jnp.sin,
        "jaxbridge": ours,
        "jb+pure_cb": ours_pc,
        "pure_cb": lambda x: jax.pure_callback(host_sin, out, x, vmap_method="sequential"),
    }
    if buffer_callback is not None:
        def fill(ctx, out_buf, x):
            np.sin(np.asarray(x), out=np.asarray(out_buf))
        mechanisms["buffer_cb"] = buffer_callback(fill, out)
    return mechanisms


def per_call_us(body, x, iters, repeats=5):
    loop = jax.jit(lambda x: jax.lax.fori_loop(0, iters, lambda i, v: body(v), x))
    loop(x).block_until_ready()  # compile + warm up
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        loop(x).block_until_ready()
        best = min(best, time.perf_counter() - t0)
    return best / iters * 1e6


def grad_mechanisms():
    ours = jb.foreign(lambda x: x)(host_sin)
    ours.defvjp(lambda p, out, ct: (np.cos(p[0]) * ct,))

    @jax.custom_vjp
    def by_hand(x):
        return jax.pure_callback(host_sin, jax.ShapeDtypeStruct(x.shape, x.dtype), x)

    def fwd(x):
        return by_hand(x), x

    def bwd(x, ct):
        cos_ct = lambda x, ct: np.cos(x) * ct  # noqa: E731
        return (jax.pure_callback(cos_ct, jax.ShapeDtypeStruct(x.shape, x.dtype), x, ct),)

    by_hand.defvjp(fwd, bwd)
    return {"jnp": jnp.sin, "jaxbridge": ours, "custom_vjp+pure_cb": by_hand}


def grad_step_us(f, x, iters, repeats=5):
    step = jax.grad(lambda v: jnp.sum(f(v)))
    return per_call_us(lambda v: v - 1e-3 * step(v), x, iters, repeats)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer iterations")
    args = parser.parse_args()
    scale = 0.2 if args.quick else 1.0
    print(f"# jaxbridge {jb.__version__}, jax {jax.__version__}, numpy {np.__version__}, "
          f"{platform.processor() or platform.machine()}, backend {jax.default_backend()}, "
          f"{time.strftime('%Y-%m-%d')}")
    print("\n## per call inside jitted fori_loop (us); ratio = pure_cb / jaxbridge")
    sizes = [(1, 2000), (1000, 2000), (1_000_000, 40)]
    names = list(make_mechanisms((1,)))
    print("| elements | " + " | ".join(names) + " | pure_cb/jaxbridge |")
    print("|---" * (len(names) + 2) + "|")
    for n, iters in sizes:
        iters = max(5, int(iters * scale))
        x = jnp.linspace(0, 1, n, dtype=jnp.float32)
        times = {k: per_call_us(f, x, iters) for k, f in make_mechanisms((n,)).items()}
        ratio = times["pure_cb"] / times["jaxbridge"]
        print(f"| {n:>9} | " + " | ".join(f"{times[k]:.2f}" for k in names)
              + f" | {ratio:.1f}x |")

    print("\n## grad step inside jitted fori_loop (us); ratio = by hand / jaxbridge")
    names = list(grad_mechanisms())
    print("| elements | " + " | ".join(names) + " | by-hand/jaxbridge |")
    print("|---" * (len(names) + 2) + "|")
    for n, iters in sizes:
        iters = max(5, int(iters * scale))
        x = jnp.linspace(0, 1, n, dtype=jnp.float32)
        times = {k: grad_step_us(f, x, iters) for k, f in grad_mechanisms().items()}
        ratio = times["custom_vjp+pure_cb"] / times["jaxbridge"]
        print(f"| {n:>9} | " + " | ".join(f"{times[k]:.2f}" for k in names)
              + f" | {ratio:.1f}x |")


if __name__ == "__main__":
    main()
