"""Host functions' own work at full speed: thread budgets inside host calls, side by side.

One run prints, for each case, the time outside jaxbridge, inside it with the default
thread policy (``auto``), and inside with one thread (the old default cap), and the
ratios inside / outside:

* NumPy 1500x1500 float32 matmul (`jb.foreign`);
* torch 1500x1500 float32 matmul (`jaxbridge.torch.wrap`);
* an MLP 64-256-256-10, batch 128, forward + backward (`wrap_module` under
  `value_and_grad`, against eager torch);
* `torch.sin` at 1M elements (`wrap`) against `np.sin` in `jb.foreign`;
* the case the cap was made for: a grad step of ``tanh(A @ x)`` with a NumPy rule,
  A 256x256, x 256x16;

each on an idle machine and with one core busy (a second process spinning), and the
1500x1500 matmul as 2 and 4 concurrent per-shard calls (forced host devices) against the
same matmuls one after another outside jaxbridge with all threads.

Usage: ``python benchmarks/threads.py [--repeats N] [--quick] [--json]``. Timings are
best of N; run it on a quiet machine (nothing else running) and compare ratios.
``--json`` writes benchmarks/results/threads.json for `benchmarks/plots.py`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

import jaxbridge as jb
from jaxbridge._foreign import threads

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from record import Table, add_json_option  # noqa: E402

try:
    import torch

    import jaxbridge.torch as jt
except ImportError:  # torch is an optional extra (Python 3.11)
    torch = None

BUSY = "import time\nt = time.time()\nwhile time.time() - t < 900: pass\n"


def best_ms(fn: Callable[[], object], repeats: int, warmup: int = 8) -> float:
    """Best of `repeats` timings of `fn()` in ms, after `warmup` calls (the thread
    policy's first calls try both choices)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times) * 1e3


def ready(x):
    return jax.block_until_ready(x)


def numpy_matmul(n: int = 1500):
    a = np.random.default_rng(0).random((n, n), dtype=np.float32)
    f = jax.jit(jb.foreign(lambda x: x)(lambda x: x @ a))
    x = jnp.asarray(a)
    return (lambda: a @ a), (lambda: ready(f(x)))


def torch_matmul(n: int = 1500):
    a = torch.rand(n, n)
    f = jax.jit(jt.wrap(lambda x: x @ a))
    x = jnp.asarray(a.numpy())
    return (lambda: a @ a), (lambda: ready(f(x)))


def mlp_step(batch: int = 128):
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.Tanh(),
                              torch.nn.Linear(256, 256), torch.nn.Tanh(),
                              torch.nn.Linear(256, 10))
    x, y = torch.randn(batch, 64), torch.randn(batch, 10)

    def eager():
        net.zero_grad()
        loss = ((net(x) - y) ** 2).mean()
        loss.backward()
        return loss

    apply, params = jt.wrap_module(net)
    xj, yj = jnp.asarray(x.numpy()), jnp.asarray(y.numpy())
    step = jax.jit(jax.value_and_grad(lambda p: jnp.mean((apply(p, xj) - yj) ** 2)))
    return eager, (lambda: ready(step(params)))


def sin_1m(n: int = 1 << 20):
    x = np.linspace(0, 1, n, dtype=np.float32)
    f_np = jax.jit(jb.foreign(lambda x: x)(np.sin))
    f_torch = jax.jit(jt.wrap(torch.sin))
    xj = jnp.asarray(x)
    return (lambda: ready(f_np(xj))), (lambda: ready(f_torch(xj)))


def rule_matmul(n: int = 256):
    a = np.random.default_rng(0).normal(size=(n, n)) / n
    f = jb.foreign(lambda x: x)(lambda x: np.tanh(a @ x))
    f.defvjp(lambda p, y, ct: (a.T @ ((1 - y ** 2) * ct),))
    step = jax.jit(lambda v: v - 1e-3 * jax.grad(lambda v: jnp.sum(f(v)))(v))
    x = jnp.ones((n, 16), jnp.float64)

    def outside():  # the same NumPy work, no JAX
        y = np.tanh(a @ np.ones((n, 16)))
        return a.T @ ((1 - y ** 2) * np.ones((n, 16)))

    return outside, (lambda: ready(step(x)))


def inside_both_ways(make, repeats: int) -> dict[str, float]:
    """outside / inside (auto) / inside (one thread), each fresh (its own tuner), in
    interleaved rounds (this machine's speed drifts by tens of percent between seconds):
    the best of `repeats` rounds of each."""
    outside, inside = make()
    _, inside_one = make()
    ways = {"outside": (outside, None), "auto": (inside, "auto"), "one thread": (inside_one, 1)}
    best = {name: float("inf") for name in ways}
    for round_ in range(repeats):
        for name, (fn, setting) in ways.items():
            if setting is not None:
                threads.use(setting)
            best[name] = min(best[name], best_ms(fn, 1, warmup=12 if round_ == 0 else 2))
    threads.use(None)
    return best


SHARDED = textwrap.dedent("""
    import os, sys, time, json
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={sys.argv[1]}"
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    import jaxbridge as jb
    from jaxbridge._foreign import threads
    shards, n, repeats = int(sys.argv[1]), 1500, int(sys.argv[2])
    a = np.random.default_rng(0).random((n, n), dtype=np.float32)
    mesh = Mesh(np.array(jax.devices()), ("d",))
    x = jax.device_put(jnp.asarray(np.stack([a] * shards)), NamedSharding(mesh, P("d")))

    def best(fn):
        for _ in range(4):
            fn()
        ts = []
        for _ in range(repeats):
            t = time.perf_counter(); fn(); ts.append(time.perf_counter() - t)
        return min(ts) * 1e3

    out = {"outside, one after another": best(lambda: [a @ a for _ in range(shards)])}
    for setting in ("auto", 1, "unlimited"):
        threads.use(setting)
        f = jax.jit(jb.foreign(lambda x: x, batch_dims=1)(
            lambda x: (x.reshape(n, n) @ a).reshape(x.shape)))
        out[f"per-shard, {setting}"] = best(lambda: jax.block_until_ready(f(x)))
    print(json.dumps(out))
""")


def sharded(shards: int, repeats: int) -> dict[str, float]:
    proc = subprocess.run([sys.executable, "-c", SHARDED, str(shards), str(repeats)],
                          capture_output=True, text=True, timeout=900,
                          env=dict(os.environ, JAX_PLATFORMS="cpu"))
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def print_row(name: str, t: dict[str, float], table: Table | None = None,
              load: str = "idle") -> None:
    base = t.get("outside") or t.get("outside, one after another")
    cells = "  ".join(f"{k} {v:8.2f} ms" for k, v in t.items())
    ratios = "  ".join(f"{k}/outside {v / base:.2f}" for k, v in t.items()
                       if not k.startswith("outside"))
    print(f"{name:52s} {cells}   {ratios}", flush=True)
    if table is not None:
        auto = t.get("auto", t.get("per-shard, auto"))
        one = t.get("one thread", t.get("per-shard, 1"))
        table.add([name, load, _ms(base), _ms(auto), _ms(one), f"{auto / base:.2f}",
                   "-" if one is None else f"{auto / one:.2f}"])


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}" if value < 10 else f"{value:.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--quick", action="store_true", help="3 repeats, no busy core")
    add_json_option(parser)
    args = parser.parse_args()
    table = Table(
        "threads", "Thread budgets inside host calls: the same work outside jaxbridge, "
        "inside with the default budget (auto), and inside with one thread (the cap "
        "before the budgets)", f"ms per call, best of {3 if args.quick else args.repeats}",
        ["case", "load", "outside", "auto", "one thread", "auto / outside",
         "auto / one thread"],
        method="\"one core busy\": a second process spinning on one core; per-shard rows: 2 "
        "or 4 forced CPU devices, the matmuls at once inside jaxbridge against the same "
        "matmuls one after another outside it with all threads; outside: the same work "
        "called directly, the libraries with their own thread counts (the MLP: eager "
        "torch; torch.sin: np.sin in jb.foreign)", packages=("torch",))
    repeats = 3 if args.quick else args.repeats
    jax.config.update("jax_enable_x64", True)
    print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} cores; "
          f"jax {jax.__version__}, numpy {np.__version__}"
          + (f", torch {torch.__version__}" if torch is not None else "")
          + f"; {time.strftime('%Y-%m-%d')}")
    cases = [("NumPy 1500² matmul (jb.foreign)", numpy_matmul),
             ("grad of tanh(A @ x), NumPy rule, A 256²", rule_matmul)]
    if torch is not None:
        cases += [("torch 1500² matmul (wrap)", torch_matmul),
                  ("MLP 64-256-256-10 fwd + bwd, batch 128 (wrap_module)", mlp_step)]
    for busy in ((False,) if args.quick else (False, True)):
        burner = subprocess.Popen([sys.executable, "-c", BUSY]) if busy else None
        if busy:
            time.sleep(1.0)
        try:
            load = "one core busy" if busy else "idle"
            print(f"\n## {'one core busy (a second process spinning)' if busy else 'idle'}")
            for name, make in cases:
                print_row(name, inside_both_ways(make, repeats), table, load)
            if torch is not None:
                np_sin, torch_sin = sin_1m()
                threads.use("auto")
                t = {"outside": best_ms(np_sin, repeats), "auto": best_ms(torch_sin, repeats)}
                threads.use(None)
                print_row("torch.sin 1M (wrap) against np.sin (jb.foreign)", t, table, load)
        finally:
            if burner is not None:
                burner.kill()
    print("\n## concurrent per-shard calls of a 1500^2 matmul (idle)")
    for shards in (2, 4):
        print_row(f"{shards} per-shard 1500² matmuls at once (outside: {shards} in a row)",
                  sharded(shards, repeats), table)
    table.save(args.json)


if __name__ == "__main__":
    main()
