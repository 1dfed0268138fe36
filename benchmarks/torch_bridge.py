"""jaxbridge.torch against the other ways to call PyTorch from JAX, side by side.

    python benchmarks/torch_bridge.py [--repeats 5] [--quick]

1. Per call, inside a jitted `fori_loop`, of `x + 1` at 1 element and 1M elements:
   `jaxbridge.torch.wrap`; a hand-written `jax.pure_callback` bridge with
   `torch.from_numpy`; torch2jax (PyPI `wrap-torch2jax`, if installed; it compiles a
   C++ extension on first use); the NumPy `jb.foreign` path (returning a new
   array, and in place with `out=True`); and `jaxbridge.torch.wrap(torch.add)`, a torch
   operator, which writes into XLA's output buffer with `out=` (no result tensor), and
   `wrap(fn, result=..., out=True)` with `fn` calling `torch.add(x, 1, out=out)`; and
   `wrap(fn, redirect=True)`, whose result torch writes into XLA's buffer from the second
   call on (opt-in; the default copies it).
2. The redirect's worth at 1M elements for `x + 1` and `torch.sin(x) * 2`: the default
   (copy) against ``redirect=True``, and the NumPy `jb.foreign` path.
3. An MLP, forward + backward: `jax.value_and_grad` of `wrap_module` under `jit`
   against the same model in eager torch (`loss.backward()`).

Each case is compiled once (and run twice before timing); the cases then run interleaved,
`--repeats` times; the table shows medians and the spread
(min-max) of the ratios, since other processes share the machine.
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
import torch
from record import Table, add_json_option

import jaxbridge as jb
import jaxbridge.torch as jt

try:
    from wrap_torch2jax import torch2jax
except ImportError:  # benchmark-only peer
    torch2jax = None


def compiled_loop(f, x, calls: int):
    """`calls` calls of `f` inside one jitted fori_loop, compiled and run twice: timing
    then measures the steady state of a training loop, not the first run after a
    compilation (whose allocations leave the heap in a state that costs page faults)."""
    loop = jax.jit(lambda x: jax.lax.fori_loop(0, calls, lambda i, v: f(v), x))
    loop(x).block_until_ready()
    loop(x).block_until_ready()
    return loop


def per_call(loop, x, calls: int) -> tuple[float, float]:
    """Microseconds per call of the compiled loop's `calls` calls: (CPU time of this
    process, wall time). On a machine shared with other processes, wall time counts the
    time slices lost to them; CPU time does not, and is the steadier measure of the work
    done (host calls run on the calling thread)."""
    wall, cpu = time.perf_counter(), time.process_time()
    loop(x).block_until_ready()
    return ((time.process_time() - cpu) / calls * 1e6,
            (time.perf_counter() - wall) / calls * 1e6)


def add_one_torch(x):
    return x + 1


def bridges(n: int) -> dict:
    x = jnp.zeros(n, jnp.float32)
    struct = jax.ShapeDtypeStruct(x.shape, x.dtype)

    def pure_cb(v):
        return jax.pure_callback(
            lambda a: add_one_torch(torch.from_numpy(np.asarray(a))).numpy(), struct, v,
            vmap_method="sequential")

    numpy_new = jb.foreign(lambda v: v)(lambda a: a + np.float32(1))

    @jb.foreign(lambda v: v, out=True)
    def numpy_in_place(a, out):
        np.add(a, np.float32(1), out=out)

    add_op = jt.wrap(torch.add)

    @jt.wrap(result=struct, out=True)
    def add_one_out(v, out):
        torch.add(v, 1, out=out)

    one = np.float32(1)
    cases = {"jaxbridge.torch": jt.wrap(add_one_torch),
             "jaxbridge.torch redirect": jt.wrap(add_one_torch, redirect=True),
             "pure_callback": pure_cb,
             "numpy jb.foreign": numpy_new, "numpy jb.foreign out=": numpy_in_place,
             "jaxbridge.torch op": lambda v: add_op(v, one),
             "jaxbridge.torch out=": add_one_out}
    if torch2jax is not None:
        cases["torch2jax"] = torch2jax(add_one_torch, x)
    return {name: (f, x) for name, f in cases.items()}


def redirect_cases(n: int) -> dict:
    """`x + 1` and `torch.sin(x) * 2` on `n` float32 elements: the default (torch's
    result copied into XLA's buffer), ``redirect=True``, and NumPy through jb.foreign."""
    x = jnp.linspace(-1.0, 1.0, n, dtype=jnp.float32)
    two = np.float32(2)
    fns = {"x + 1": (add_one_torch, lambda a: a + np.float32(1)),
           "sin(x) * 2": (lambda t: torch.sin(t) * 2, lambda a: np.sin(a) * two)}
    cases = {}
    for label, (torch_fn, numpy_fn) in fns.items():
        cases[f"{label}: copy (default)"] = (jt.wrap(torch_fn), x)
        cases[f"{label}: redirect=True"] = (jt.wrap(torch_fn, redirect=True), x)
        cases[f"{label}: numpy jb.foreign"] = (jb.foreign(lambda v: v)(numpy_fn), x)
    return cases


def redirect_worth(n: int, calls: int, repeats: int) -> None:
    cases = {name: (compiled_loop(f, x, calls), x) for name, (f, x) in redirect_cases(n).items()}
    cpu: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(repeats):
        for name, (f, x) in cases.items():
            cpu[name].append(per_call(f, x, calls)[0])
    print(f"\nThe redirect at {n} elements, CPU us per call, median (min-max), and the "
          f"per-repeat ratio of the default (copy) to redirect=True:")
    for name in cases:
        print(f"  {name:32s} {summary(cpu[name])}")
    for label in ("x + 1", "sin(x) * 2"):
        copy, redirect = cpu[f"{label}: copy (default)"], cpu[f"{label}: redirect=True"]
        numpy_path = cpu[f"{label}: numpy jb.foreign"]
        print(f"  {label}: copy / redirect {summary([a / b for a, b in zip(copy, redirect)])}; "
              f"copy / numpy {summary([a / b for a, b in zip(copy, numpy_path)])}; redirect / "
              f"numpy {summary([a / b for a, b in zip(redirect, numpy_path)])}")


def mlp_case(batch: int, width: int):
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(64, width), torch.nn.Tanh(),
                              torch.nn.Linear(width, width), torch.nn.Tanh(),
                              torch.nn.Linear(width, 10))
    rng = np.random.default_rng(0)
    x = rng.normal(size=(batch, 64)).astype(np.float32)
    y = rng.normal(size=(batch, 10)).astype(np.float32)
    apply, params = jt.wrap_module(net)
    step = jax.jit(jax.value_and_grad(lambda p: jnp.mean((apply(p, x) - y) ** 2)))
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)

    def ours():
        loss, grads = step(params)
        jax.block_until_ready(grads)

    def eager():
        net.zero_grad()
        loss = ((net(xt) - yt) ** 2).mean()
        loss.backward()

    return {"wrap_module (jit value_and_grad)": ours, "eager torch": eager}


def timed(fn, reps: int) -> float:
    """CPU time per run (us): the eager torch side runs torch's own threads too, which
    process time counts (all threads of this process)."""
    fn()
    start = time.process_time()
    for _ in range(reps):
        fn()
    return (time.process_time() - start) / reps * 1e6


def summary(samples: list[float]) -> str:
    return f"{statistics.median(samples):9.2f} ({min(samples):.2f}-{max(samples):.2f})"


def ops_alone(n: int, repeats: int) -> dict[str, list[float]]:
    """CPU time (us) of `x + 1` on `n` float32 elements returning a new array, outside
    any bridge: torch on one thread (as the host call caps it) and NumPy."""
    a = np.zeros(n, np.float32)
    t = torch.from_numpy(a)
    one = np.float32(1)
    cases = {"torch": lambda: t + 1, "numpy": lambda: a + one}
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        times: dict[str, list[float]] = {name: [] for name in cases}
        for _ in range(repeats):
            for name, fn in cases.items():
                times[name].append(timed(fn, 200))
    finally:
        torch.set_num_threads(before)
    return times


def bridge_overheads(n: int, cpu: dict[str, list[float]], repeats: int) -> None:
    """What each bridge adds to its library's own `x + 1`: the fresh-tensor goal
    compares torch's kernel with NumPy's as much as the bridges."""
    alone = ops_alone(n, repeats)
    torch_op, numpy_op = statistics.median(alone["torch"]), statistics.median(alone["numpy"])
    ours, numpy_path = (statistics.median(cpu["jaxbridge.torch"]),
                        statistics.median(cpu["numpy jb.foreign"]))
    print(f"  `x + 1` alone, outside any bridge, CPU us, median: torch (1 thread) "
          f"{torch_op:.1f}, NumPy {numpy_op:.1f} (torch / NumPy {torch_op / numpy_op:.2f})")
    print(f"  what the bridge adds to it (case - op alone): jaxbridge.torch "
          f"{ours - torch_op:.1f} us, numpy jb.foreign {numpy_path - numpy_op:.1f} us")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="fewer calls per sample")
    add_json_option(parser)
    args = parser.parse_args()
    scale = 0.2 if args.quick else 1.0
    record = Table(
        "torch_bridge", "PyTorch bridge: per call of `x + 1` inside a jitted fori_loop",
        "us of CPU time per call, median (min-max)",
        ["mechanism", "1 element", "1M elements"],
        method=(f"CPU time of the process per call, median (min-max) of {args.repeats} "
                "interleaved repeats; all mechanisms in one process"),
        legend={"jaxbridge.torch": "jaxbridge.torch.wrap(lambda x: x + 1), the default "
                                   "(the result copied into XLA's buffer)",
                "jaxbridge.torch redirect": "the same with redirect=True (torch writes the "
                                            "result into XLA's buffer)",
                "jaxbridge.torch op": "wrap(torch.add) called as add(x, np.float32(1))",
                "jaxbridge.torch out=": "wrap(fn, out=True): fn calls torch.add(x, 1, out=out)",
                "pure_callback": "jax.pure_callback with torch.from_numpy",
                "numpy jb.foreign": "NumPy through jb.foreign (a new array; out=: in place)"},
        packages=("torch", "wrap-torch2jax"))
    measured: dict[str, dict[int, str]] = {}
    print(f"jax {jax.__version__}, torch {torch.__version__}, torch2jax "
          f"{'not installed' if torch2jax is None else 'installed'}, "
          f"{torch.get_num_threads()} torch threads; {args.repeats} interleaved repeats")

    for n, calls in ((1, int(4000 * scale)), (1_000_000, max(int(200 * scale), 5))):
        cases = {name: (compiled_loop(f, x, calls), x) for name, (f, x) in bridges(n).items()}
        cpu: dict[str, list[float]] = {name: [] for name in cases}
        wall: dict[str, list[float]] = {name: [] for name in cases}
        ratios: dict[str, list[float]] = {name: [] for name in cases}
        for _ in range(args.repeats):
            now = {name: per_call(f, x, calls) for name, (f, x) in cases.items()}
            for name in cases:
                cpu[name].append(now[name][0])
                wall[name].append(now[name][1])
                ratios[name].append(now[name][0] / now["jaxbridge.torch"][0])
        print(f"\n{n} element(s), `x + 1` per call, us, median (min-max): CPU time, wall "
              f"time, and the CPU-time ratio to jaxbridge.torch in the same repeat:")
        for name in cases:
            print(f"  {name:22s} cpu {summary(cpu[name])}  wall {summary(wall[name])}  "
                  f"x{summary(ratios[name])}")
            measured.setdefault(name, {})[n] = summary(cpu[name])
        print("  goals, CPU-time ratios per repeat, median (min-max):")
        goals = [("pure_callback", "jaxbridge.torch"), ("torch2jax", "jaxbridge.torch"),
                 ("jaxbridge.torch", "numpy jb.foreign"),
                 ("jaxbridge.torch redirect", "numpy jb.foreign"),
                 ("jaxbridge.torch", "jaxbridge.torch redirect"),
                 ("jaxbridge.torch op", "numpy jb.foreign"),
                 ("jaxbridge.torch out=", "numpy jb.foreign"),
                 ("jaxbridge.torch out=", "numpy jb.foreign out=")]
        for a, b in goals:
            if a in cpu and b in cpu:
                print(f"    {a} / {b}: "
                      f"{summary([p / q for p, q in zip(cpu[a], cpu[b])])}")
        if n > 1:
            bridge_overheads(n, cpu, args.repeats)

    for name, cells in measured.items():
        record.add([name, cells.get(1, "-"), cells.get(1_000_000, "-")])
    record.save(args.json)

    redirect_worth(1_000_000, max(int(200 * scale), 5), args.repeats)

    # Ours runs torch capped at one thread during host calls (the default); eager torch
    # runs with its own thread count. CPU time compares the work either way.
    cases_mlp = mlp_case(batch=128, width=256)
    samples = {name: [] for name in cases_mlp}
    ratio = []
    reps = max(int(50 * scale), 5)
    for _ in range(args.repeats):
        now = {name: timed(fn, reps) for name, fn in cases_mlp.items()}
        for name in cases_mlp:
            samples[name].append(now[name])
        ratio.append(now["wrap_module (jit value_and_grad)"] / now["eager torch"])
    print("\nMLP 64-256-256-10, batch 128, forward + backward, CPU time (us, median (min-max)):")
    for name in cases_mlp:
        print(f"  {name:34s} {summary(samples[name])}")
    print(f"  ratio wrap_module / eager torch    {summary(ratio)}")


if __name__ == "__main__":
    main()
