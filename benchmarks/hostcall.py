"""Per-call cost of calling NumPy from jitted JAX code, side by side.

Each row times a jitted `lax.fori_loop` whose body calls `sin` through one
mechanism, and divides by the number of iterations:

* jnp          native `jnp.sin` (the floor),
* jaxbridge    `jb.foreign` on the native host-call trampoline,
* jb out=      `jb.foreign(..., out=True)`: the result written in place,
* jb+pure_cb   `jb.foreign(..., backend="pure_callback")` (jaxbridge's fallback),
* pure_cb      `jax.pure_callback` written by hand,
* buffer_cb    `jax.experimental.buffer_callback` written by hand,

for 1, 1e3 and 1e6 float32 elements, then a `grad` step through a bridged function
vs `jax.custom_vjp` + `jax.pure_callback` written by hand, then:

* the kept-view guard: zero-copy views checked after each call vs the copies a
  function gets once it kept a view;
* BLAS threads: a NumPy rule calling `A @ x` with BLAS capped at 1 thread during host
  calls (the default) vs left to itself;
* per-shard calls: a `batch_dims=1` function on 2 CPU devices (two XLA worker threads
  per iteration) vs the same call on one device (the calling thread).

Usage: `python benchmarks/hostcall.py [--quick] [--only SECTION ...]`.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
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


def host_sin_into(x, *, out):
    np.sin(x, out=out)


def make_mechanisms(shape):
    out = jax.ShapeDtypeStruct(shape, jnp.float32)
    ours = jb.foreign(lambda x: x)(host_sin)
    ours_pc = jb.foreign(lambda x: x, backend="pure_callback")(host_sin)
    mechanisms = {
        "jnp": jnp.sin,
        "jaxbridge": ours,
        "jb out=": jb.foreign(lambda x: x, out=True)(host_sin_into),
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


def table(title, names, rows, ratio_name, ratio):
    print(f"\n## {title}")
    print("| elements | " + " | ".join(names) + f" | {ratio_name} |")
    print("|---" * (len(names) + 2) + "|")
    for n, times in rows:
        print(f"| {n:>9} | " + " | ".join(f"{times[k]:.2f}" for k in names)
              + f" | {ratio(times):.2f}x |")


SIZES = [(1, 2000), (1000, 2000), (1_000_000, 40)]


def section_calls(scale):
    rows = []
    for n, iters in SIZES:
        iters = max(5, int(iters * scale))
        x = jnp.linspace(0, 1, n, dtype=jnp.float32)
        rows.append((n, {k: per_call_us(f, x, iters) for k, f in make_mechanisms((n,)).items()}))
    names = list(rows[0][1])
    table("per call inside jitted fori_loop (us); ratio = pure_cb / jaxbridge", names, rows,
          "pure_cb/jaxbridge", lambda t: t["pure_cb"] / t["jaxbridge"])
    if "buffer_cb" in names:
        print("\nin place vs buffer_callback (ratio < 1: ours is faster): "
              + ", ".join(f"{n}: {t['jb out=']/t['buffer_cb']:.2f}x" for n, t in rows)
              + "; pure_callback / jb out= at 1 element: "
              + f"{rows[0][1]['pure_cb'] / rows[0][1]['jb out=']:.0f}x")


def section_grad(scale):
    rows = []
    for n, iters in SIZES:
        iters = max(5, int(iters * scale))
        x = jnp.linspace(0, 1, n, dtype=jnp.float32)
        rows.append((n, {k: grad_step_us(f, x, iters) for k, f in grad_mechanisms().items()}))
    table("grad step inside jitted fori_loop (us); ratio = by hand / jaxbridge",
          list(rows[0][1]), rows, "by-hand/jaxbridge",
          lambda t: t["custom_vjp+pure_cb"] / t["jaxbridge"])


def section_view_guard(scale):
    from jaxbridge._foreign import hostcall
    rows = []
    for n, iters in SIZES:
        iters = max(5, int(iters * scale))
        x = jnp.linspace(0, 1, n, dtype=jnp.float32)
        checked = jb.foreign(lambda x: x)(host_sin)
        copying = jb.foreign(lambda x: x)(host_sin)
        copying.definition.copy_policy("forward").copy = True  # as after a kept view
        rows.append((n, {"zero-copy + check": per_call_us(checked, x, iters),
                         "copies": per_call_us(copying, x, iters)}))
    table("kept-view guard (us per call): zero-copy views checked after the call vs copies",
          ["zero-copy + check", "copies"], rows, "copies/zero-copy",
          lambda t: t["copies"] / t["zero-copy + check"])
    del hostcall


BUSY = "import time\nt = time.time()\nwhile time.time() - t < 600: pass\n"


def section_blas(scale):
    """On an idle machine BLAS's threads help a little; as soon as another process uses a
    core, BLAS threads that spin-wait for each other lose their time slices and a rule's
    matmul takes up to ~80x longer. Measured both ways, one core kept busy for the second."""
    from jaxbridge._foreign import hostcall
    jax.config.update("jax_enable_x64", True)
    rows = []
    for n in (64, 256):
        a = np.random.default_rng(0).normal(size=(n, n)) / n
        f = jb.foreign(lambda x: x)(lambda x, a=a: np.tanh(a @ x))
        f.defvjp(lambda p, y, ct, a=a: (a.T @ ((1 - y ** 2) * ct),))
        step = jax.grad(lambda v: jnp.sum(f(v)))
        x = jnp.ones((n, 16), jnp.float64)
        iters = max(20, int((2000 if n == 64 else 400) * scale))
        times = {}
        for busy in (False, True):
            burner = subprocess.Popen([sys.executable, "-c", BUSY]) if busy else None
            time.sleep(1.0 if busy else 0.0)  # let it start spinning
            try:
                for label, limit in (("capped at 1 (default)", 1), ("unlimited", 0)):
                    hostcall.set_host_blas_threads(limit)
                    key = f"{label}, {'1 core busy' if busy else 'idle'}"
                    times[key] = per_call_us(lambda v: v - 1e-3 * step(v), x, iters, repeats=3)
            finally:
                if burner is not None:
                    burner.kill()
        hostcall.set_host_blas_threads(None)
        rows.append((n, times))
    table("BLAS threads: grad step of tanh(A @ x) with a NumPy rule, A n x n, x n x 16 "
          "(us per step)", list(rows[0][1]), rows, "unlimited/capped when busy",
          lambda t: t["unlimited, 1 core busy"] / t["capped at 1 (default), 1 core busy"])
    jax.config.update("jax_enable_x64", False)


SHARDED_CHILD = """
import os, sys, time
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
import jaxbridge as jb
iters = int(sys.argv[1])
f = jb.foreign(lambda x: x, batch_dims=1)(lambda x: np.sin(x))
def per_iter(x):
    loop = jax.jit(lambda x: jax.lax.fori_loop(0, iters, lambda i, v: f(v), x))
    loop(x).block_until_ready()
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter(); loop(x).block_until_ready()
        best = min(best, time.perf_counter() - t)
    return best / iters * 1e6
x = jnp.linspace(0, 1, 8, dtype=jnp.float32).reshape(2, 4)
one = per_iter(jax.device_put(x, jax.devices()[0]))
mesh = Mesh(np.array(jax.devices()[:2]), ("b",))
two = per_iter(jax.device_put(x, NamedSharding(mesh, P("b"))))
print(f"{one:.2f} {two:.2f}")
"""


def section_sharded(scale):
    flags = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2"
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=flags)
    iters = str(max(50, int(2000 * scale)))
    out = subprocess.run([sys.executable, "-c", SHARDED_CHILD, iters], env=env,
                         capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        print("\n## per-shard calls: failed\n" + out.stderr[-2000:])
        return
    one, two = map(float, out.stdout.split())
    print("\n## per-shard host calls (us per loop iteration, batch_dims=1, 2 rows)")
    print("| one device (calling thread) | 2 devices (2 XLA worker threads) | ratio |")
    print("|---|---|---|")
    print(f"| {one:.2f} | {two:.2f} | {two / one:.2f}x |")


SECTIONS = {"calls": section_calls, "grad": section_grad, "view_guard": section_view_guard,
            "blas": section_blas, "sharded": section_sharded}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer iterations")
    parser.add_argument("--only", nargs="*", choices=list(SECTIONS), help="sections to run")
    args = parser.parse_args()
    scale = 0.2 if args.quick else 1.0
    print(f"# jaxbridge {jb.__version__}, jax {jax.__version__}, numpy {np.__version__}, "
          f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"backend {jax.default_backend()}, {time.strftime('%Y-%m-%d')}")
    for name in args.only or SECTIONS:
        SECTIONS[name](scale)


if __name__ == "__main__":
    main()
