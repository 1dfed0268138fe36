"""Per-call cost of calling NumPy from jitted JAX code: ours against the peers, side by side.

One run prints (`python benchmarks/hostcall.py`):

* calls: a jitted `lax.fori_loop` whose body computes `x + 1` on the host, per call, at
  1, 1e3 and 1e6 elements, float32 and float64, through
    - ours           `jb.foreign` on the native trampoline,
    - buffer_cb      `jax.experimental.buffer_callback`,
    - JAXbind        `jaxbind.get_nonlinear_call` (a peer; `pip install jaxbind`),
    - pure_cb        `jax.pure_callback`,
  in three ways of producing the result:
    - returns        the function returns `x + 1` (a fresh array, copied into XLA's),
    - out=           it writes `np.add(x, 1, out=out)` into XLA's output buffer,
    - in place       the output is the input's buffer (`aliases=` for ours,
                     `input_output_aliases` for buffer_callback; JAXbind and
                     pure_callback have no such mode);
* grad: `jax.grad` through 200 calls of `sin` at n=1000 (forward and adjoint on the
  host), ours vs JAXbind vs `jax.custom_vjp` + `pure_callback`, per call;
* sharded: a `batch_dims=1` function on 2 CPU devices (per-shard calls on two XLA
  worker threads) vs the same call on one device (the calling thread).

Each figure is best / median over interleaved rounds, and each ratio is also given
paired (peer / ours within each round: median and min-max over rounds); the machine
is shared, so compare ratios, not absolute times. `--only view_guard` runs the
kept-view guard's section (thread budgets: benchmarks/threads.py); `--only failing` the cost
of a host function that raises, in a process of millions of objects.

Usage: `python benchmarks/hostcall.py [--quick] [--repeats N] [--only SECTION ...]
[--sizes 1 1000 1000000] [--json [DIR]]`; `--json` also writes the calls and grad tables
to benchmarks/results/hostcall.json and hostcall_grad.json (see benchmarks/record.py).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from record import Table, add_json_option

import jaxbridge as jb

try:
    from jax.experimental.buffer_callback import buffer_callback
except ImportError:  # older/newer JAX without it
    buffer_callback = None
try:
    import jaxbind
except ImportError:  # a peer, installed with the `bench` extra
    jaxbind = None

REPEATS = 5
# --json DIR: where the tables are written as results files (None: printed only)
JSON_DIR: str | None = None
# What a timing measures: wall-clock time, or (--clock cpu) the CPU time of the whole
# process (XLA runs large loops on its own threads, so the calling thread's CPU time
# would miss them): time spent waiting for a core that another process holds is not
# counted, time spent on a core slowed by others' cache and memory traffic still is.
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}
clock = CLOCKS["wall"]
clock_name = "wall"


def host_sin(x):
    return np.sin(x)


def per_call_us(body, x, iters, repeats=5):
    """Best of `repeats` timings of a jitted fori_loop of `iters` calls, per call."""
    loop = jax.jit(lambda x: jax.lax.fori_loop(0, iters, lambda i, v: body(v), x))
    loop(x).block_until_ready()  # compile + warm up
    best = float("inf")
    for _ in range(repeats):
        t0 = clock()
        loop(x).block_until_ready()
        best = min(best, clock() - t0)
    return best / iters * 1e6


def interleaved(mechanisms, x, iters, repeats):
    """{name: [per-call us of each round]}, the mechanisms taking turns in each round
    (the order rotates from round to round, so that none always follows the same one)."""
    times = {name: [] for name in mechanisms}
    names = list(mechanisms)
    for r in range(repeats):
        for name in names[r % len(names):] + names[:r % len(names)]:
            body, n_iters = mechanisms[name]
            times[name].append(per_call_us(body, x, n_iters or iters, repeats=3))
    return times


def show(samples):
    """best / median of the rounds: under load from other processes the best is the
    steadiest estimate of a mechanism's own cost."""
    return f"{min(samples):.2f} / {statistics.median(samples):.2f}"


def ratio(peer, ours):
    """peer / ours by best and (in parentheses) by median."""
    return (f"{min(peer) / min(ours):.2f}x "
            f"({statistics.median(peer) / statistics.median(ours):.2f}x)")


def paired(peer, ours):
    """peer / ours within each round (the two ran minutes apart at most, seconds at 1M
    elements, so a change in outside load affects both): median [min-max] over rounds."""
    each = sorted(p / o for p, o in zip(peer, ours))
    return f"{statistics.median(each):.2f}x [{each[0]:.2f}-{each[-1]:.2f}]"


def table(title, names, rows, ratio_name, ratio):
    print(f"\n## {title}")
    print("| elements | " + " | ".join(names) + f" | {ratio_name} |")
    print("|---" * (len(names) + 2) + "|")
    for n, times in rows:
        print(f"| {n:>9} | " + " | ".join(f"{times[k]:.2f}" for k in names)
              + f" | {ratio(times):.2f}x |")


# ---------------------------------------------------------------- calls: x + 1
def add_one(x):
    return x + 1


def add_one_into(x, *, out):
    np.add(x, 1, out=out)


def jaxbind_call(fill):
    def abstract(*args, **kwargs):
        return ((args[0].shape, args[0].dtype),)

    op = jaxbind.get_nonlinear_call(fill, (None, None), abstract, abstract)
    return lambda x: op(x)[0]


def call_mechanisms(shape, dtype, slow_iters):
    """{mode: {mechanism: (body, iterations or None)}} for `x + 1`."""
    out = jax.ShapeDtypeStruct(shape, dtype)
    modes = {
        "returns": {
            "ours": (jb.foreign(lambda x: x)(add_one), None),
            "pure_cb": (lambda x: jax.pure_callback(add_one, out, x), slow_iters),
        },
        "out=": {"ours": (jb.foreign(lambda x: x, out=True)(add_one_into), None)},
        "in place": {"ours": (jb.foreign(lambda x: x, out=True,
                                         aliases={"forward": {0: 0}})(add_one_into), None)},
    }
    # buffer_callback hands the callback XLA's buffers on their device: NumPy can view
    # them on the CPU only (on a GPU they are device memory).
    if buffer_callback is not None and jax.default_backend() == "cpu":
        def bc_returns(ctx, o, x):
            np.asarray(o)[...] = np.asarray(x) + 1

        def bc_out(ctx, o, x):
            np.add(np.asarray(x), 1, out=np.asarray(o))

        def bc_in_place(ctx, o, x):
            o = np.asarray(o)
            np.add(o, 1, out=o)

        modes["returns"]["buffer_cb"] = (buffer_callback(bc_returns, out), None)
        modes["out="]["buffer_cb"] = (buffer_callback(bc_out, out), None)
        modes["in place"]["buffer_cb"] = (
            buffer_callback(bc_in_place, out, input_output_aliases={0: 0}), None)
    if jaxbind is not None:
        def jbind_returns(outs, args, kwargs):
            outs[0][...] = args[0] + 1

        def jbind_out(outs, args, kwargs):
            np.add(args[0], 1, out=outs[0])

        modes["returns"]["JAXbind"] = (jaxbind_call(jbind_returns), None)
        modes["out="]["JAXbind"] = (jaxbind_call(jbind_out), None)
    return modes


SIZES = [(1, 2000), (1000, 2000), (1_000_000, 30)]
PEERS = ("buffer_cb", "JAXbind", "pure_cb")


def section_calls(scale, repeats, sizes=None):
    table = Table(
        "hostcall", "Host call of `x + 1` per call inside a jitted fori_loop",
        "us per call, best / median", ["dtype", "elements", "mode", "ours", "buffer_cb",
                                       "JAXbind", "pure_cb", "buffer_cb/ours", "JAXbind/ours",
                                       "pure_cb/ours", "buffer_cb/ours paired",
                                       "JAXbind/ours paired"],
        method=(f"{clock_name} clock; each figure best / median of {repeats} interleaved "
                "rounds with the order rotating; ratios are peer / ours (> 1: ours is "
                "faster) by best, by median in parentheses, and paired (per round) median "
                "[min-max]"),
        legend={"returns": "the function returns a new array",
                "out=": "it writes np.add(x, 1, out=out) into XLA's output buffer",
                "in place": "the output is the input's buffer (aliases=; JAXbind and "
                            "pure_callback have no such mode)",
                "ours": "jaxbridge (jb.foreign, native handler)",
                "buffer_cb": "jax.experimental.buffer_callback", "pure_cb": "jax.pure_callback"},
        packages=("jaxbind",))
    print("\n## x + 1 per call inside a jitted fori_loop (us; best / median of "
          f"{repeats} interleaved rounds); ratio = peer / ours by best (by median); "
          "> 1: ours is faster; paired = peer / ours within each round, median [min-max]")
    print("| dtype | elements | mode | ours | buffer_cb | JAXbind | pure_cb "
          "| buffer_cb/ours | JAXbind/ours | pure_cb/ours | buffer_cb/ours paired "
          "| JAXbind/ours paired |")
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for dtype in (jnp.float32, jnp.float64):
        for n, iters in SIZES:
            if sizes and n not in sizes:
                continue
            iters = max(5, int(iters * scale))
            slow = max(5, iters // 10)
            x = jnp.zeros(n, dtype)
            for mode, mechanisms in call_mechanisms((n,), dtype, slow).items():
                times = interleaved(mechanisms, x, iters, repeats)
                cells = [show(times[k]) if k in times else "-" for k in ("ours", *PEERS)]
                ratios = [ratio(times[k], times["ours"]) if k in times else "-"
                          for k in PEERS]
                ratios += [paired(times[k], times["ours"]) if k in times else "-"
                           for k in PEERS[:2]]
                print(f"| {np.dtype(dtype).name} | {n} | {mode} | " + " | ".join(cells)
                      + " | " + " | ".join(ratios) + " |", flush=True)
                table.add([np.dtype(dtype).name, n, mode, *cells, *ratios])
    table.save(JSON_DIR)


# ---------------------------------------------------------------- grad through many calls
def grad_mechanisms():
    ours = jb.foreign(lambda x: x)(host_sin)
    ours.defvjp(lambda p, out, ct: (np.cos(p[0]) * ct,))

    def sin_into(x, *, out):
        np.sin(x, out=out)

    def vjp_into(p, y, ct, *, out):
        np.multiply(np.cos(p[0]), ct, out=out[0])

    ours_out = jb.foreign(lambda x: x, out=True)(sin_into)
    ours_out.defvjp(vjp_into, out=True)

    @jax.custom_vjp
    def by_hand(x):
        return jax.pure_callback(host_sin, jax.ShapeDtypeStruct(x.shape, x.dtype), x)

    def fwd(x):
        return by_hand(x), x

    def bwd(x, ct):
        cos_ct = lambda x, ct: np.cos(x) * ct  # noqa: E731
        return (jax.pure_callback(cos_ct, jax.ShapeDtypeStruct(x.shape, x.dtype), x, ct),)

    by_hand.defvjp(fwd, bwd)
    mechanisms = {"jnp": jnp.sin, "ours": ours, "ours out=": ours_out}
    if jaxbind is not None:
        def f(outs, args, kwargs):
            np.sin(args[0], out=outs[0])

        def f_jvp(outs, args, kwargs):  # args: (x, dx)
            np.multiply(np.cos(args[0]), args[1], out=outs[0])

        def f_vjp(outs, args, kwargs):  # args: (x, ct)
            np.multiply(np.cos(args[0]), args[1], out=outs[0])

        def abstract(*args, **kwargs):
            return ((args[0].shape, args[0].dtype),)

        op = jaxbind.get_nonlinear_call(f, (f_jvp, f_vjp), abstract, abstract)
        mechanisms["JAXbind"] = lambda x: op(x)[0]
    mechanisms["custom_vjp+pure_cb"] = by_hand
    return mechanisms


GRAD_CALLS = 200


def grad_us_per_call(f, x, repeats=3):
    """jax.grad through GRAD_CALLS chained calls: us per call (forward + adjoint)."""
    loss = jax.jit(jax.grad(lambda v: jnp.sum(
        jax.lax.fori_loop(0, GRAD_CALLS, lambda i, u: f(u), v))))
    loss(x).block_until_ready()
    best = float("inf")
    for _ in range(repeats):
        t0 = clock()
        loss(x).block_until_ready()
        best = min(best, clock() - t0)
    return best / GRAD_CALLS * 1e6


def section_grad(scale, repeats):
    x = jnp.linspace(0, 1, 1000, dtype=jnp.float32)
    mechanisms = grad_mechanisms()
    ref = jax.grad(lambda v: jnp.sum(jax.lax.fori_loop(0, GRAD_CALLS, lambda i, u: jnp.sin(u),
                                                       v)))(x)
    for name, f in mechanisms.items():  # every mechanism computes the same gradient
        g = jax.jit(jax.grad(lambda v, f=f: jnp.sum(
            jax.lax.fori_loop(0, GRAD_CALLS, lambda i, u: f(u), v))))(x)
        np.testing.assert_allclose(g, ref, rtol=1e-4, err_msg=name)
    table = Table(
        "hostcall_grad", f"jax.grad through {GRAD_CALLS} chained host calls of sin, n = 1000 "
        "float32", "us per call, best / median", ["mechanism", "us per call", "mechanism/ours",
                                                  "paired"],
        method=(f"{clock_name} clock; best / median of {repeats} interleaved rounds; "
                "mechanism/ours is the mechanism's time over ours (> 1: ours is faster), by "
                "best, by median in parentheses, and paired median [min-max]"),
        legend={"ours": "jaxbridge, VJP rule called directly by the native handler",
                "custom_vjp+pure_cb": "jax.custom_vjp around jax.pure_callback"},
        packages=("jaxbind",))
    times = {name: [] for name in mechanisms}
    for _ in range(repeats):
        for name, f in mechanisms.items():
            times[name].append(grad_us_per_call(f, x))
    print(f"\n## jax.grad through {GRAD_CALLS} chained sin calls, n=1000 float32 (us per "
          "call, forward + adjoint; best / median); ratio = mechanism / ours by best "
          "(by median)")
    print("| mechanism | us per call | mechanism/ours | paired |")
    print("|---|---:|---:|---:|")
    for name, samples in times.items():
        print(f"| {name} | {show(samples)} | {ratio(samples, times['ours'])} | "
              f"{paired(samples, times['ours'])} |")
        table.add([name, show(samples), ratio(samples, times["ours"]),
                   paired(samples, times["ours"])])
    table.save(JSON_DIR)


def section_view_guard(scale, repeats):
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


class _Failure(Exception):
    pass


def _raise(x):
    raise _Failure("host function failed")


def section_failing(scale, repeats):
    """A host function that raises, called under jit and caught by the caller, in a
    process holding a few million Python objects (a training script's state): ours
    against `pure_callback`. A full garbage collection per failing call would cost
    ~0.3 s here; the kept-view check runs one only after a call that returned."""
    heap = [[i, str(i)] for i in range(3_000_000)]
    x = jnp.linspace(0, 1, 1000)
    ours = jax.jit(jb.foreign(lambda x: x)(_raise))
    pure = jax.jit(lambda x: jax.pure_callback(_raise, jax.ShapeDtypeStruct(x.shape, x.dtype),
                                               x))
    calls = max(3, int(20 * scale))

    def fail_and_catch(f):
        try:
            jax.block_until_ready(f(x))
        except Exception:  # noqa: BLE001 - pure_callback's error type varies by call
            pass

    def per_failing_call_ms(f):
        for _ in range(2):  # compile, and reach the steady state
            fail_and_catch(f)
        start = clock()
        for _ in range(calls):
            fail_and_catch(f)
        return (clock() - start) / calls * 1e3

    rows = {"ours": [], "pure_cb": []}
    for _ in range(repeats):
        for name, f in (("ours", ours), ("pure_cb", pure)):
            rows[name].append(per_failing_call_ms(f))
    print(f"\n### a failing host call, caught (ms per call; {len(heap):,} objects alive)\n")
    print("| mechanism | best / median | vs ours |\n|---|---|---|")
    for name, samples in rows.items():
        print(f"| {name} | {min(samples):.2f} / {statistics.median(samples):.2f} | "
              f"{statistics.median(samples) / statistics.median(rows['ours']):.1f}x |")
    del heap


SHARDED_CHILD = """
import os, sys, time
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
import jaxbridge as jb
iters, rounds = int(sys.argv[1]), int(sys.argv[2])
f = jb.foreign(lambda x: x, batch_dims=1)(lambda x: np.sin(x))
def per_iter(body, x):
    loop = jax.jit(lambda x: jax.lax.fori_loop(0, iters, lambda i, v: body(v), x))
    loop(x).block_until_ready()
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter(); loop(x).block_until_ready()
        best = min(best, time.perf_counter() - t)
    return best / iters * 1e6
x = jnp.linspace(0, 1, 8, dtype=jnp.float32).reshape(2, 4)
one_dev = jax.device_put(x, jax.devices()[0])
mesh = Mesh(np.array(jax.devices()[:2]), ("b",))
two_dev = jax.device_put(x, NamedSharding(mesh, P("b")))
for _ in range(rounds):
    print(per_iter(f, one_dev), per_iter(f, two_dev), per_iter(jnp.sin, one_dev),
          per_iter(jnp.sin, two_dev), flush=True)
"""


def section_sharded(scale, repeats):
    """One loop iteration on 2 devices makes 2 per-shard calls, on two XLA worker threads
    that take the GIL in turn; on 1 device it makes one call on the calling thread."""
    flags = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2"
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=flags)
    iters = str(max(50, int(2000 * scale)))
    out = subprocess.run([sys.executable, "-c", SHARDED_CHILD, iters, str(repeats)], env=env,
                         capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        print("\n## per-shard calls: failed\n" + out.stderr[-2000:])
        return
    rows = [list(map(float, line.split())) for line in out.stdout.split("\n") if line.strip()]
    one, two, jnp_one, jnp_two = (list(col) for col in zip(*rows))
    print("\n## per-shard host calls: `sin` with batch_dims=1 on 2 rows (us per loop "
          f"iteration; best / median of {repeats} rounds)")
    print("| one device (calling thread) | 2 devices (2 per-shard calls on XLA worker "
          "threads) | iteration ratio 2 dev / 1 dev | paired | jnp.sin 1 dev | "
          "jnp.sin 2 dev |")
    print("|---:|---:|---:|---:|---:|---:|")
    print(f"| {show(one)} | {show(two)} | {ratio(two, one)} | {paired(two, one)} | "
          f"{show(jnp_one)} | {show(jnp_two)} |")
    print(f"Each per-shard call (2 per iteration) costs {min(two) / min(one) / 2:.2f}x "
          "a main-thread call (by best).")


SECTIONS = {"calls": section_calls, "grad": section_grad, "sharded": section_sharded,
            "view_guard": section_view_guard,
            "failing": section_failing}
DEFAULT = ("calls", "grad", "sharded")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer iterations")
    parser.add_argument("--repeats", type=int, default=REPEATS, help="interleaved rounds")
    parser.add_argument("--only", nargs="*", choices=list(SECTIONS), help="sections to run")
    parser.add_argument("--sizes", nargs="*", type=int, choices=[n for n, _ in SIZES],
                        help="element counts of the calls section (default: all)")
    parser.add_argument("--clock", choices=list(CLOCKS), default="wall",
                        help="wall-clock time, or the process's CPU time (calls and grad "
                             "sections; less sensitive to other processes)")
    add_json_option(parser)
    args = parser.parse_args()
    global clock, clock_name, JSON_DIR
    clock, clock_name, JSON_DIR = CLOCKS[args.clock], args.clock, args.json
    jax.config.update("jax_enable_x64", True)  # float64 rows; every array's dtype is explicit
    scale = 0.2 if args.quick else 1.0
    peers = ", ".join(f"{m.__name__} {getattr(m, '__version__', '?')}"
                      for m in (jaxbind,) if m is not None) or "JAXbind not installed"
    print(f"# jaxbridge {jb.__version__}, jax {jax.__version__}, numpy {np.__version__}, "
          f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"backend {jax.default_backend()}, Python {platform.python_version()}, {peers}, "
          f"{time.strftime('%Y-%m-%d %H:%M')}, clock: {args.clock}, load average "
          f"{' '.join(f'{v:.1f}' for v in os.getloadavg())}")
    for name in args.only or DEFAULT:
        if name == "calls":
            section_calls(scale, args.repeats, args.sizes)
        else:
            SECTIONS[name](scale, args.repeats)


if __name__ == "__main__":
    main()
