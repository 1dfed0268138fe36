"""What a long-running program keeps: N distinct functions jitted, called once, dropped.

Side by side in one process each (fresh interpreters, so neither inherits the other's
caches): plain JAX lambdas `jax.jit(lambda x: jnp.sin(x) + i)` and foreign functions
`jax.jit(jb.foreign(...)(lambda x: np.sin(x) + i))`. Prints the resident memory per
function while alive, what is left after dropping them all and `gc.collect()` (before
and after glibc's `malloc_trim` returns freed pages to the system), and how many host
callables are still registered.

Usage: `python benchmarks/memory.py [N]` (default 300).
"""

from __future__ import annotations

import subprocess
import sys

CHILD = r"""
import ctypes, gc, os, sys
import jax, jax.numpy as jnp, numpy as np
import jaxbridge as jb
from jaxbridge._foreign import hostcall

def rss_mib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20

kind, n = sys.argv[1], int(sys.argv[2])
x = jnp.ones(16)

def make(i):
    if kind == "jax":
        return jax.jit(lambda x: jnp.sin(x) + i)
    return jax.jit(jb.foreign(lambda x: x)(lambda x, i=i: np.sin(x) + i))

for i in range(20):  # JAX's own one-time caches first
    make(i)(x).block_until_ready()
gc.collect()
base, registered = rss_mib(), hostcall.num_registered()
alive = []
for i in range(n):
    f = make(i)
    f(x).block_until_ready()
    alive.append(f)
gc.collect()
peak = rss_mib()
del alive, f
jax.jit(lambda x: x * 2)(x).block_until_ready()  # XLA keeps the last program it ran
gc.collect()
dropped = rss_mib()
ctypes.CDLL("libc.so.6").malloc_trim(0)
trimmed = rss_mib()
print(f"{(peak - base) * 1024 / n:.0f} {dropped - base:.1f} {trimmed - base:.1f} "
      f"{hostcall.num_registered() - registered}")
"""


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 300
    print(f"## {n} functions jitted, called once, dropped (resident memory)")
    print("| kind | alive (KiB per function) | after drop (MiB) | after malloc_trim (MiB) "
          "| host callables still registered |")
    print("|---|---|---|---|---|")
    for kind, label in (("jax", "plain JAX lambda"), ("foreign", "jb.foreign function")):
        out = subprocess.run([sys.executable, "-c", CHILD, kind, str(n)], capture_output=True,
                             text=True, check=True, env={"JAX_PLATFORMS": "cpu",
                                                         **__import__("os").environ})
        alive, dropped, trimmed, registered = out.stdout.split()
        print(f"| {label} | {alive} | {dropped} | {trimmed} | {registered} |")


if __name__ == "__main__":
    main()
