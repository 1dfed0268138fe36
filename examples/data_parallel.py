"""Data-parallel training with a SciPy layer and a C++ kernel: 8 devices, or N processes.

The model is `x -> erf(x W1 + b1) -> softplus(. W2 + b2) -> . W3 + b3`, trained with
SGD + momentum in one `jax.jit`-compiled step on a batch sharded over a 1-D device
mesh (axis "batch"), parameters replicated:

* `erf` is `scipy.special.erf` wrapped with `jb.foreign(..., batch_dims=1)`: XLA runs
  it, and its VJP rule, once per shard on the shard's own device (no gather);
* `softplus` is the built-in C++ kernel `jaxbridge.ops.softplus`, called inside
  `jax.shard_map` (always safe on a mesh); `jax.nn.softplus` if the kernel is missing
  or fails a probe (a note says why);
* the gradients of the replicated parameters are all-reduced by XLA (the compiled
  step is checked to contain an all-reduce and no all-gather of the batch).

The gradient is checked against the same model written with jnp only; the loss
trajectory is printed. Modes:

    python examples/data_parallel.py                  # 1 process, 8 CPU devices
    python examples/data_parallel.py --launch 2       # 2 processes x 4 CPU devices,
        # on localhost (jax.distributed + gloo CPU collectives); then checks that the
        # loss trajectory equals the single-process one (run as a reference subprocess,
        # or read from --reference FILE written by a single-process run with --out FILE)
    python examples/data_parallel.py --bench --devices 4   # throughput, one JSON line

A process started with JAXBRIDGE_COORDINATOR / JAXBRIDGE_NUM_PROCESSES /
JAXBRIDGE_PROCESS_ID in its environment is a worker of a multi-process run. The
launcher gives every worker its own process group, a time limit, and kills them
all (SIGTERM, then SIGKILL) when one fails or time runs out. Prints `OK` and exits 0
when every check passes, exits 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import scipy.special
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import jaxbridge as jb

ENV_COORDINATOR = "JAXBRIDGE_COORDINATOR"
ENV_NUM_PROCESSES = "JAXBRIDGE_NUM_PROCESSES"
ENV_PROCESS_ID = "JAXBRIDGE_PROCESS_ID"
TOTAL_DEVICES = 8
SIZES = (6, 32, 32, 1)
LR, MOMENTUM = 0.05, 0.9
TWO_OVER_SQRT_PI = 2.0 / math.sqrt(math.pi)  # a Python float: keeps float32 float32

# ------------------------------------------------------------------ the SciPy layer
host_calls: list[tuple[str, tuple]] = []  # (which, shape) of every host call, for the demo


@jb.foreign(lambda z: z, batch_dims=1)
def erf(z):
    """The error function, by scipy.special.erf on the host, once per batch shard."""
    host_calls.append(("erf", z.shape))
    return scipy.special.erf(z)


@erf.defvjp
def erf_vjp(primals, y, ct):
    (z,) = primals
    host_calls.append(("erf_vjp", z.shape))
    return (ct * TWO_OVER_SQRT_PI * np.exp(-z * z),)


@erf.defjvp
def erf_jvp(primals, y, tangents):
    (z,), (dz,) = primals, tangents
    return TWO_OVER_SQRT_PI * np.exp(-z * z) * dz


def keep_sharded(fn, sharding):
    """`fn` with its result constrained to `sharding`. Under the Shardy partitioner
    (JAX's default) XLA does not propagate the batch sharding of a host call's result
    to its users, and would all-gather the result (not its inputs) where a later op
    needs it, e.g. the weight gradient `h.T @ delta`. The constraint keeps the result
    sharded, so the gradient is a per-shard partial sum plus one all-reduce."""
    def constrained(*args):
        return jax.lax.with_sharding_constraint(fn(*args), sharding)
    return constrained


def make_mesh():
    """A 1-D mesh over every device (of every process), axis "batch" (Auto sharding)."""
    return jax.make_mesh((jax.device_count(),), ("batch",), axis_types=(AxisType.Auto,))


# ------------------------------------------------------------------ the C++ kernel
def pick_softplus(mesh, dtype):
    """(softplus on batch-sharded arrays, description): the C++ kernel in shard_map,
    if it imports and its value and gradient pass a probe; else jax.nn.softplus."""
    try:
        from jaxbridge import ops
        if not ops.available():
            raise ImportError(ops.IMPORT_ERROR)
        fn = jax.shard_map(lambda h: ops.softplus(h), mesh=mesh, in_specs=P("batch"),
                           out_specs=P("batch"))
        probe = global_array(np.linspace(-3, 3, 2 * mesh.size, dtype=dtype).reshape(-1, 1),
                             NamedSharding(mesh, P("batch")))
        ours = jax.jit(jax.value_and_grad(lambda h: jnp.sum(fn(h) ** 2)))(probe)
        ref = jax.jit(jax.value_and_grad(lambda h: jnp.sum(jax.nn.softplus(h) ** 2)))(probe)
        for a, b in zip(ours, ref):
            np.testing.assert_allclose(np.asarray(a.addressable_data(0)),
                                       np.asarray(b.addressable_data(0)), rtol=1e-5)
        return fn, "jaxbridge.ops.softplus (C++ kernel, inside jax.shard_map)"
    except Exception as err:  # noqa: BLE001 - any failure selects the documented fallback
        first = (str(err).strip().splitlines() or [""])[0][:160]
        return jax.nn.softplus, (f"jax.nn.softplus (note: C++ kernel not used: "
                                 f"{type(err).__name__}: {first})")


# ------------------------------------------------------------------ model and data
def init_params(seed, dtype):
    rs = np.random.RandomState(seed)
    return [{"w": (rs.standard_normal((m, n)) / np.sqrt(m)).astype(dtype),
             "b": np.zeros((n,), dtype)} for m, n in zip(SIZES, SIZES[1:])]


def make_loss(erf_fn, softplus_fn):
    def loss(params, x, y):
        p1, p2, p3 = params
        h = erf_fn(x @ p1["w"] + p1["b"])
        h = softplus_fn(h @ p2["w"] + p2["b"])
        return jnp.mean((h @ p3["w"] + p3["b"] - y) ** 2)
    return loss


def make_data(seed, n_batches, batch, dtype):
    """`n_batches` global batches (the same in every process): y = sin(x.a) + cos(x.b)/2."""
    rs = np.random.RandomState(seed)
    x = rs.standard_normal((n_batches, batch, SIZES[0]))
    a, b = rs.standard_normal((2, SIZES[0]))
    y = (np.sin(x @ a) + 0.5 * np.cos(x @ b))[..., None]
    return x.astype(dtype), y.astype(dtype)


def global_array(value, sharding):
    """A global jax.Array from `value` (the full array, known to every process), built
    from this process's rows with jax.make_array_from_process_local_data."""
    value = np.asarray(value)
    if sharding.is_fully_replicated:
        return jax.make_array_from_process_local_data(sharding, value, value.shape)
    rows = sharding.addressable_devices_indices_map(value.shape).values()
    lo = min(r[0].start or 0 for r in rows)
    hi = max(value.shape[0] if r[0].stop is None else r[0].stop for r in rows)
    return jax.make_array_from_process_local_data(sharding, value[lo:hi], value.shape)


def make_step(loss):
    def step(params, velocity, x, y):
        value, grads = jax.value_and_grad(loss)(params, x, y)
        velocity = jax.tree.map(lambda v, g: MOMENTUM * v + g, velocity, grads)
        params = jax.tree.map(lambda p, v: p - LR * v, params, velocity)
        return params, velocity, value
    return step


def local_value(x) -> np.ndarray:
    """A replicated global array's value, read from this process's first shard."""
    return np.asarray(x.addressable_data(0))


# ------------------------------------------------------------------ one process
def setup(args) -> dict:
    """Start JAX (one process, or a worker of a multi-process run)."""
    worker = os.environ.get(ENV_COORDINATOR)
    if args.dtype == "float64":
        jax.config.update("jax_enable_x64", True)
    if worker:
        n_proc = int(os.environ[ENV_NUM_PROCESSES])
        pid = int(os.environ[ENV_PROCESS_ID])
        jax.config.update("jax_num_cpu_devices", args.devices // n_proc)
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(worker, n_proc, pid, initialization_timeout=60,
                                   heartbeat_timeout_seconds=30, shutdown_timeout_seconds=30)
    else:
        jax.config.update("jax_num_cpu_devices", args.devices)
    if jax.device_count() != args.devices:
        raise RuntimeError(f"expected {args.devices} devices, JAX has {jax.device_count()} "
                           f"(was the CPU backend started before this script set its count?)")
    if worker and args.inject and pid == args.inject_process:
        print(f"[process {pid}] injected fault: {args.inject}", flush=True)
        if args.inject == "crash":
            os._exit(3)
        time.sleep(3600)
    return {"process": jax.process_index(), "processes": jax.process_count()}


def train(args) -> int:
    info = setup(args)
    pid, say = info["process"], print
    if info["processes"] > 1:
        def say(*a, **k):  # noqa: E306
            print(f"[process {pid}]", *a, **k, flush=True)
    dtype = np.dtype(args.dtype)
    mesh = make_mesh()
    batch_sh, repl = NamedSharding(mesh, P("batch")), NamedSharding(mesh, P())
    say(f"jax {jax.__version__}: {jax.process_count()} process(es), {jax.device_count()} "
        f"devices ({jax.local_device_count()} local), mesh {dict(mesh.shape)}, {dtype.name}")

    softplus, softplus_name = pick_softplus(mesh, dtype)
    say(f"layers: erf = scipy.special.erf via jb.foreign(batch_dims=1); softplus = "
        f"{softplus_name}")

    batch = args.batch_per_device * jax.device_count()
    xs, ys = make_data(1, args.batches, batch, dtype)
    xs = [global_array(x, batch_sh) for x in xs]
    ys = [global_array(y, batch_sh) for y in ys]
    params = [{k: global_array(v, repl) for k, v in layer.items()}
              for layer in init_params(0, dtype)]
    velocity = jax.tree.map(lambda p: global_array(np.zeros(p.shape, dtype), repl), params)

    loss = make_loss(keep_sharded(erf, batch_sh), softplus)
    loss_jnp = make_loss(jax.scipy.special.erf, jax.nn.softplus)
    step = jax.jit(make_step(loss), out_shardings=(repl, repl, repl), donate_argnums=(0, 1))

    # 1. The compiled step: one host call per shard, the gradient all-reduced, no gather.
    hlo = step.lower(params, velocity, xs[0], ys[0]).compile().as_text()
    shard_rows = batch // jax.device_count()
    # In a program on several devices a host call runs inside XLA's buffer callback (so
    # that host code may itself call JAX); on one device it is jaxbridge's own target.
    host = [line for line in hlo.splitlines() if "custom-call(" in line and any(
        target in line for target in ("xla_buffer_python_cpu_callback",
                                       "jaxbridge_host_call_batched"))]
    failures = []
    if len(host) != 2 or not all(f"[{shard_rows},{SIZES[1]}]" in line for line in host):
        failures.append(f"expected 2 per-shard host calls on [{shard_rows},{SIZES[1]}] "
                        f"(erf, its adjoint), compiled: {host}")
    if "all-reduce" not in hlo:
        failures.append("the compiled step has no all-reduce of the gradients")
    if "all-gather" in hlo:
        failures.append("the compiled step gathers: " + ", ".join(
            line.strip()[:120] for line in hlo.splitlines() if "all-gather" in line))
    say(f"compiled step: {len(host)} host calls on [{shard_rows},{SIZES[1]}] shards, "
        f"{hlo.count('all-reduce(')} all-reduce(s), {hlo.count('all-gather(')} all-gather(s)")

    # 2. The gradient against JAX autodiff of the jnp-only twin, on the sharded batch.
    g = jax.jit(jax.grad(loss), out_shardings=repl)(params, xs[0], ys[0])
    g_ref = jax.jit(jax.grad(loss_jnp), out_shardings=repl)(params, xs[0], ys[0])
    rel = max(float(np.max(np.abs(local_value(u) - local_value(v)))
                    / (np.max(np.abs(local_value(v))) + 1e-30))
              for u, v in zip(jax.tree.leaves(g), jax.tree.leaves(g_ref)))
    tol = 1e-10 if dtype == np.float64 else 1e-4
    say(f"gradient vs jnp twin: max relative error {rel:.2e} (tolerance {tol:.0e})")
    if not rel <= tol:
        failures.append(f"gradient differs from the jnp twin: {rel:.2e} > {tol:.0e}")

    # 3. Training: the loss trajectory.
    del host_calls[:]
    losses = []
    for it in range(args.steps):
        params, velocity, value = step(params, velocity, xs[it % len(xs)], ys[it % len(ys)])
        losses.append(float(local_value(value)))
        if it % max(1, args.steps // 10) == 0 or it == args.steps - 1:
            say(f"step {it:4d}  loss {losses[-1]:.6e}")
    per_step = {w: sum(1 for c in host_calls if c[0] == w) / args.steps
                for w in ("erf", "erf_vjp")}
    shapes = sorted({c[1] for c in host_calls})
    say(f"host calls per step in this process: erf {per_step['erf']:g}, adjoint "
        f"{per_step['erf_vjp']:g} (one per local device: {jax.local_device_count()}), "
        f"shapes {shapes}")
    if per_step != {"erf": jax.local_device_count(), "erf_vjp": jax.local_device_count()} \
            or shapes != [(shard_rows, SIZES[1])]:
        failures.append(f"expected one host call per local shard per step, got {per_step} "
                        f"on {shapes}")
    if args.steps >= 10 and not losses[-1] < 0.75 * losses[0]:  # shorter runs: too noisy
        failures.append(f"the loss did not decrease: {losses[0]:.4e} -> {losses[-1]:.4e}")
    say(f"loss {losses[0]:.6e} -> {losses[-1]:.6e} in {args.steps} steps")
    print("TRAJECTORY " + json.dumps({"process": pid, "losses": losses,
                                      "softplus": softplus_name}), flush=True)
    if args.out and pid == 0:
        with open(args.out, "w") as f:
            json.dump({"losses": losses, "devices": jax.device_count(),
                       "processes": jax.process_count(), "dtype": dtype.name}, f)

    if info["processes"] > 1:
        jax.distributed.shutdown()
    for msg in failures:
        say("FAILED: " + msg)
    if failures:
        return 1
    say("OK") if info["processes"] > 1 else print("OK")
    return 0


# ------------------------------------------------------------------ benchmark mode
def bench(args) -> int:
    """Examples/s of the jitted step (bridged model and jnp twin), one JSON line."""
    setup(args)
    dtype = np.dtype(args.dtype)
    mesh = make_mesh()
    batch_sh, repl = NamedSharding(mesh, P("batch")), NamedSharding(mesh, P())
    softplus, softplus_name = pick_softplus(mesh, dtype)
    batch = args.batch_per_device * jax.device_count()
    x, y = (global_array(a[0], batch_sh) for a in make_data(1, 1, batch, dtype))
    result = {"devices": jax.device_count(), "batch": batch, "softplus": softplus_name,
              "jax": jax.__version__, "dtype": dtype.name}
    for name, loss in (("bridged", make_loss(keep_sharded(erf, batch_sh), softplus)),
                       ("jnp", make_loss(jax.scipy.special.erf, jax.nn.softplus))):
        params = [{k: global_array(v, repl) for k, v in layer.items()}
                  for layer in init_params(0, dtype)]
        velocity = jax.tree.map(jnp.zeros_like, params)
        step = jax.jit(make_step(loss), out_shardings=(repl, repl, repl))
        jax.block_until_ready(step(params, velocity, x, y))  # compile, warm up
        best = float("inf")
        for _ in range(args.rounds):
            t0 = time.perf_counter()
            p, v = params, velocity
            for _ in range(args.steps):
                p, v, value = step(p, v, x, y)
            jax.block_until_ready(value)
            best = min(best, (time.perf_counter() - t0) / args.steps)
        result[name] = batch / best
    print("BENCH " + json.dumps(result), flush=True)
    return 0


# ------------------------------------------------------------------ the launcher
def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _kill_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)  # the worker is the leader of its own process group
    except (ProcessLookupError, PermissionError):
        pass


def launch(argv: list[str], num_processes: int, timeout: float,
           echo: bool = True) -> tuple[list[int | None], list[str]]:
    """Run `python <this script> *argv` as `num_processes` workers of one
    jax.distributed run on 127.0.0.1. Returns (exit codes, outputs). Never hangs: a
    worker that fails, or time running out, ends every worker's process group."""
    env = dict(os.environ, **{ENV_COORDINATOR: f"127.0.0.1:{free_port()}",
                              ENV_NUM_PROCESSES: str(num_processes)})
    env.pop("XLA_FLAGS", None)  # the device count is set through jax_num_cpu_devices
    procs: list[subprocess.Popen] = []
    started = time.monotonic()
    outputs: list[list[str]] = [[] for _ in range(num_processes)]
    readers = []

    def pump(i: int, stream) -> None:
        for line in stream:
            outputs[i].append(line)
            if echo:
                sys.stdout.write(line if line.startswith("[process") else f"[process {i}] {line}")
                sys.stdout.flush()

    try:
        for i in range(num_processes):
            procs.append(subprocess.Popen(
                [sys.executable, os.path.abspath(__file__), *argv],
                env=dict(env, **{ENV_PROCESS_ID: str(i)}), stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT, text=True, start_new_session=True))
            readers.append(threading.Thread(target=pump, args=(i, procs[-1].stdout),
                                            daemon=True))
            readers[-1].start()
        print(f"launcher: worker pids {[p.pid for p in procs]}", flush=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            codes = [p.poll() for p in procs]
            if any(c not in (None, 0) for c in codes) or all(c == 0 for c in codes):
                break
            time.sleep(0.1)
        else:
            print(f"launcher: timed out after {timeout:.0f} s; killing the workers", flush=True)
        if any(p.poll() not in (None, 0) for p in procs):
            print(f"launcher: a worker failed after {time.monotonic() - started:.1f} s; "
                  f"killing the others", flush=True)
    finally:
        for p in procs:  # anything still running: SIGTERM, then SIGKILL
            if p.poll() is None:
                _kill_group(p, signal.SIGTERM)
        end = time.monotonic() + 3  # JAX catches SIGTERM (preemption notifier): then SIGKILL
        for p in procs:
            try:
                p.wait(timeout=max(0.1, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                _kill_group(p, signal.SIGKILL)
                p.wait()
        for t in readers:
            t.join(timeout=5)
    return [p.returncode for p in procs], ["".join(o) for o in outputs]


def trajectories(output: str) -> list[list[float]]:
    return [json.loads(line.split(" ", 1)[1])["losses"]
            for line in output.splitlines() if line.startswith("TRAJECTORY ")]


def drop_option(argv: list[str], name: str) -> list[str]:
    """`argv` without option `name` and its value (`--name V` or `--name=V`)."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a == name:
            skip = True
        elif not a.startswith(name + "="):
            out.append(a)
    return out


def run_launch(args, argv: list[str]) -> int:
    n = args.launch
    if n < 1 or args.devices % n:
        print(f"FAILED: --launch {n} must divide --devices {args.devices}")
        return 1
    worker_argv = drop_option(argv, "--launch")
    print(f"launching {n} processes x {args.devices // n} CPU devices on 127.0.0.1", flush=True)
    t0 = time.monotonic()
    codes, outputs = launch(worker_argv, n, args.timeout)
    print(f"workers finished in {time.monotonic() - t0:.1f} s with exit codes {codes}")
    if codes != [0] * n:
        print(f"FAILED: worker exit codes {codes}")
        return 1
    runs = [t for o in outputs for t in trajectories(o)]
    if len(runs) != n:
        print(f"FAILED: expected {n} loss trajectories, got {len(runs)}")
        return 1

    if args.reference:
        with open(args.reference) as f:
            ref = json.load(f)["losses"]
        source = args.reference
    else:  # the same run in one process with all the devices
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "single.json")
            single = drop_option(drop_option(worker_argv, "--out"), "--timeout")
            proc = subprocess.run([sys.executable, os.path.abspath(__file__), *single,
                                   "--out", path], capture_output=True, text=True,
                                  timeout=args.timeout, env={k: v for k, v in os.environ.items()
                                                             if k != "XLA_FLAGS"})
            if proc.returncode != 0:
                print(f"FAILED: the single-process reference run failed:\n{proc.stdout}\n"
                      f"{proc.stderr}")
                return 1
            with open(path) as f:
                ref = json.load(f)["losses"]
        source = "a single-process run"
    worst = max(float(np.max(np.abs(np.array(r) - np.array(ref)) / np.abs(np.array(ref))))
                for r in runs)
    rtol = 1e-6
    print(f"loss trajectory of {n} processes vs {source}: max relative difference "
          f"{worst:.2e} over {len(ref)} steps (tolerance {rtol:.0e})")
    if len(runs[0]) != len(ref) or not worst <= rtol:
        print("FAILED: the multi-process loss trajectory differs from the single-process one")
        return 1
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"losses": runs[0], "devices": args.devices, "processes": n,
                       "dtype": args.dtype}, f)
    print("OK")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=TOTAL_DEVICES,
                        help="total CPU devices (over all processes)")
    parser.add_argument("--launch", type=int, default=0, metavar="N",
                        help="run as N processes on localhost (jax.distributed)")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--batches", type=int, default=4, help="distinct global batches")
    parser.add_argument("--batch-per-device", type=int, default=16)
    parser.add_argument("--dtype", choices=("float32", "float64"), default="float64")
    parser.add_argument("--out", help="write the loss trajectory (JSON) here")
    parser.add_argument("--reference", help="--launch: compare with this --out file")
    parser.add_argument("--timeout", type=float, default=120,
                        help="--launch: seconds before every worker is killed")
    parser.add_argument("--bench", action="store_true", help="print throughput (JSON)")
    parser.add_argument("--inject", choices=("crash", "hang"),
                        help="(for tests) make worker --inject-process crash or hang after "
                             "jax.distributed.initialize")
    parser.add_argument("--inject-process", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3, help="--bench: timing rounds")
    args = parser.parse_args(argv)
    if args.launch:
        return run_launch(args, argv)
    return bench(args) if args.bench else train(args)


if __name__ == "__main__":
    sys.exit(main())
