"""Data-parallel scaling: throughput of the training step of examples/data_parallel.py
at 1, 2, 4 and 8 devices (weak scaling: a fixed batch per device).

Each device count runs in its own subprocess (`data_parallel.py --bench --devices k`),
since the number of CPU devices is fixed when JAX starts. For each it times the
jitted step of the bridged model (SciPy `erf` once per shard via
`jb.foreign(batch_dims=1)`, softplus, all-reduced gradients) and of its jnp-only
twin, best of 3 rounds, and reports examples/s and the efficiency against ideal
linear scaling from 1 device: `throughput(k) / (k * throughput(1))`.

On a CPU host the "devices" are threads sharing the machine's cores: with c cores,
throughput cannot grow beyond about c x, so these numbers show the shape of the
scaling (and the host-call overhead per shard), not the speed of real accelerators.

Usage: `python benchmarks/scaling.py [--devices 1 2 4 8] [--batch-per-device 8192]
[--steps 10] [--dtype float32]`; prints a markdown table. Takes well under 3 minutes.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import platform
import subprocess
import sys

from record import Table, add_json_option

ROOT = pathlib.Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "data_parallel.py"


def measure(devices: int, args) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env.update(JAX_PLATFORMS="cpu", PYTHONPATH=os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    cmd = [sys.executable, str(EXAMPLE), "--bench", "--devices", str(devices),
           "--batch-per-device", str(args.batch_per_device), "--steps", str(args.steps),
           "--dtype", args.dtype]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stdout}\n{proc.stderr}")
    line = next(x for x in proc.stdout.splitlines() if x.startswith("BENCH "))
    return json.loads(line.split(" ", 1)[1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--batch-per-device", type=int, default=8192)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    parser.add_argument("--timeout", type=float, default=120, help="seconds per device count")
    add_json_option(parser)
    args = parser.parse_args()
    record = Table("scaling", f"Data-parallel training step of examples/data_parallel.py, "
                   f"{args.batch_per_device} examples per device, {args.dtype}",
                   "examples per second", ["devices", "global batch", "jaxbridge ex/s",
                                           "jnp twin ex/s"],
                   method=f"{args.steps} steps per device count; CPU devices share the "
                          f"{os.cpu_count()} cores, so this shows the scaling shape, not "
                          "accelerator speed")

    rows = []
    for k in args.devices:
        r = measure(k, args)
        rows.append(r)
        record.add([r["devices"], r["batch"], round(r["bridged"]), round(r["jnp"])])
        print(f"{k} device(s): {r['bridged']:,.0f} examples/s bridged, {r['jnp']:,.0f} jnp",
              file=sys.stderr, flush=True)
    base = rows[0]
    n0 = base["devices"]
    print(f"Data-parallel step, {args.batch_per_device} examples per device, {args.dtype}; "
          f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"Python {platform.python_version()}, jax {base['jax']}, "
          f"{datetime.date.today().isoformat()}")
    print(f"softplus: {base['softplus']}\n")
    print("| devices | global batch | bridged ex/s | efficiency | jnp twin ex/s | efficiency "
          "| bridged / jnp |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        k = r["devices"] / n0
        print(f"| {r['devices']} | {r['batch']} | {r['bridged']:,.0f} | "
              f"{r['bridged'] / (k * base['bridged']):.0%} | {r['jnp']:,.0f} | "
              f"{r['jnp'] / (k * base['jnp']):.0%} | {r['bridged'] / r['jnp']:.2f} |")
    print(f"\nEfficiency = throughput(k) / (k x throughput({n0})). CPU devices are threads "
          f"sharing {os.cpu_count()} cores: the table shows the scaling shape, not speed.")
    record.save(args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
