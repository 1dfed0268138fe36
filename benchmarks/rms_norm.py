"""JAX's FFI tutorial kernel (RMS normalization over the last axis), registered by hand as
the tutorial does, side by side with the same kernel through jaxbridge (CPU).

    PYTHONPATH=. python benchmarks/rms_norm.py [--quick] [--rounds 5]

Both sides are declared in examples/rms_norm.py. The tutorial's: its C++ handlers
(examples/rms_norm_tutorial.cc: RmsNorm, RmsNormFwd -> (y, res), RmsNormBwd(res, x,
ct)), registered with `jax.ffi.register_ffi_target`, called with `jax.ffi.ffi_call`
and differentiated through `jax.custom_vjp` with the residual. jaxbridge's side:
examples/rms_norm.cc through `jaxbridge.cpp.load` and `Library.kernel` (a plain forward
for calls nobody differentiates, a forward with the residual for those that are, one
derivative handler for adjoint and tangent, the adjoint writing into its cotangent).
Both are compiled by `jaxbridge.cpp.load` with the same flags. Everything is jitted;
each case is timed in alternating rounds and each side keeps its best round, so load
from other processes hits both alike. Printed per case, jaxbridge / tutorial (lower is
better for jaxbridge):

* forward       a call nobody differentiates, vs the tutorial's function called
                plainly (its custom_vjp runs the kernel without residuals);
* fwd + bwd     `jax.grad` of 0.5 |f(x) - w|^2, vs the tutorial's custom_vjp with its
                residual (the cotangent is an intermediate, as in training);
* vjp, cotangent an argument: `jax.vjp` pulled back with a jit argument, which the
                aliased adjoint must copy before it writes into it (the tutorial's does
                not alias);
* forward, always residuals: what a plain call would cost if the forward always
                returned them (jaxbridge without forward_with_residuals=), vs the plain.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import os
import platform
import tempfile
import time
import types
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

jax.config.update("jax_enable_x64", True)

ROOT = Path(__file__).resolve().parents[1]


def _example() -> types.ModuleType:
    """examples/rms_norm.py: both declarations, the tutorial's and jaxbridge's."""
    spec = importlib.util.spec_from_file_location("rms_norm_example",
                                                  ROOT / "examples" / "rms_norm.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def best_time(fn, *args, min_time: float = 0.05) -> float:
    """Best seconds per call of the jitted `fn` over a few repeats."""
    jax.block_until_ready(fn(*args))
    n = 1
    while True:
        t0 = time.perf_counter()
        for _ in range(n):
            out = fn(*args)
        jax.block_until_ready(out)
        if time.perf_counter() - t0 > min_time or n > 1 << 16:
            break
        n *= 2
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(n):
            out = fn(*args)
        jax.block_until_ready(out)
        best = min(best, (time.perf_counter() - t0) / n)
    return best


def side_by_side(ours, theirs, args, rounds: int) -> tuple[float, float]:
    """(ours, theirs): best seconds per call, timed in alternating rounds."""
    for mine, yours in zip(jax.tree_util.tree_leaves(ours(*args)),
                           jax.tree_util.tree_leaves(theirs(*args))):  # the same numbers
        np.testing.assert_allclose(np.asarray(mine), np.asarray(yours), rtol=1e-4, atol=1e-5)
    a, b = [], []
    for _ in range(rounds):
        a.append(best_time(ours, *args))
        b.append(best_time(theirs, *args))
    return min(a), min(b)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, a quick check")
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds per case")
    opts = parser.parse_args()
    os.environ.setdefault("JAXBRIDGE_CACHE_DIR", tempfile.mkdtemp(prefix="jaxbridge-bench-"))
    example = _example()
    tutorial, ours = example.tutorial_rms_norm(), example.jaxbridge_rms_norm()
    always = example.jaxbridge_rms_norm(always_residuals=True)
    sizes = [(64, 128), (512, 128)] if opts.quick else [(1024, 1024), (8192, 1024)]
    print(f"# RMS norm, jaxbridge vs JAX's FFI tutorial kernel, {datetime.date.today()}, "
          f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
          f"JAX {jax.__version__}, {opts.rounds} alternating rounds, best of each")
    print(f"{'shape':>13} {'dtype':>8} {'case':>27} {'jaxbridge':>11} {'tutorial':>11} "
          f"{'ratio':>6}")
    for shape in sizes:
        for dtype in (np.float32, np.float64):
            x = jnp.asarray(np.random.default_rng(0).normal(size=shape), dtype)
            w = jnp.asarray(np.random.default_rng(1).normal(size=shape), dtype)

            def fwd_bwd(f):  # a loss whose cotangent is an intermediate, as in training
                return jax.jit(jax.grad(lambda x, w: 0.5 * jnp.sum((f(x) - w) ** 2)))

            def vjp(f):  # the cotangent is an argument: the aliased adjoint copies it first
                return jax.jit(lambda x, w: jax.vjp(f, x)[1](w)[0])

            cases = {
                "forward": (jax.jit(ours), jax.jit(tutorial), (x,)),
                "fwd + bwd": (fwd_bwd(ours), fwd_bwd(tutorial), (x, w)),
                "vjp, cotangent an argument": (vjp(ours), vjp(tutorial), (x, w)),
                "forward, always residuals": (jax.jit(always), jax.jit(ours), (x,)),
            }
            for case, (a, b, args) in cases.items():
                ta, tb = side_by_side(a, b, args, opts.rounds)
                print(f"{str(shape):>13} {np.dtype(dtype).name:>8} {case:>27} "
                      f"{ta * 1e3:>9.3f}ms {tb * 1e3:>9.3f}ms {ta / tb:>6.2f}")
    print("ratio: jaxbridge / tutorial (the last case: always-residuals / jaxbridge's plain "
          "forward). Goals: forward and fwd + bwd <= 1.0.")


if __name__ == "__main__":
    main()
