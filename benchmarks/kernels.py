"""Benchmarks of jaxbridge's kernel bridge and built-in kernels (CPU or GPU).

    PYTHONPATH=. python benchmarks/kernels.py [--quick] [--only kernels]
        [--kernel softplus rbf_kernel] [--dtype float32|float64|both]

(a) bridge overhead: `jaxbridge.ops.softplus` (jb.kernel) vs a hand-written
    `jax.ffi.ffi_call` + `jax.custom_vjp` calling the very same FFI targets:
    per call inside a jitted fori_loop, per jitted dispatch, and per grad step.
(b) each built-in kernel vs its best jnp equivalent (and
    `jax.lax.linalg.tridiagonal_solve`) at small to large sizes, forward, grad and
    (rbf) jvp, with the fraction of memory bandwidth the kernel's minimal traffic
    reaches (measured with a large NumPy copy on CPU, a jitted `2 * x` over 1 GiB on
    GPU). Everything runs on JAX's default backend: on a GPU machine, the CUDA
    kernels, at larger sizes.
Ratios are jaxbridge / reference (lower is better for jaxbridge). In (b) the two
sides are timed in alternating rounds and each keeps its best round, so that load
from other processes on the machine hits both alike. JAXBRIDGE_CPU_ISA=baseline|avx2
caps the instruction set of the C++ kernels (the header line says which one ran).
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import re
import time

import jax
import jax.numpy as jnp
import numpy as np

jax.config.update("jax_enable_x64", True)

from record import Table, add_json_option  # noqa: E402

from jaxbridge import ops  # noqa: E402


def timeit(fn, *args, min_time=0.15, repeats=5) -> float:
    """Median seconds per call of fn(*args) (blocked on the result)."""
    jax.block_until_ready(fn(*args))
    n, t = 1, 0.0
    while True:
        t0 = time.perf_counter()
        for _ in range(n):
            out = fn(*args)
        jax.block_until_ready(out)
        t = time.perf_counter() - t0
        if t > min_time / repeats or n > 1 << 20:
            break
        n *= 4
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(n):
            out = fn(*args)
        jax.block_until_ready(out)
        times.append((time.perf_counter() - t0) / n)
    return float(np.median(times))


def compare(fb, frefs: dict, *args, rounds: int = 3) -> tuple[float, str, float]:
    """Best seconds per call of fb and of the fastest reference, timed in alternation."""
    tb, tr = [], {k: [] for k in frefs}
    for _ in range(rounds):
        tb.append(timeit(fb, *args, min_time=0.05, repeats=3))
        for k, f in frefs.items():
            tr[k].append(timeit(f, *args, min_time=0.05, repeats=3))
    best = min(tr, key=lambda k: min(tr[k]))
    return min(tb), best, min(tr[best])


ON_GPU = jax.default_backend() == "gpu"
PLATFORM = f"GPU, {jax.devices()[0].device_kind}" if ON_GPU else "CPU"


def host_bandwidth() -> float:
    """Bytes/s of a large NumPy copy (read + write counted)."""
    a = np.ones(1 << 25)  # 256 MiB
    b = np.empty_like(a)
    np.copyto(b, a)
    best = min(_t(lambda: np.copyto(b, a)) for _ in range(5))
    return 2 * a.nbytes / best


def device_bandwidth() -> float:
    """Bytes/s of a jitted elementwise `2 * x` over 1 GiB of float32 on the default
    device (read + write counted): the ceiling a bandwidth-bound kernel can reach."""
    x = jnp.ones(1 << 28, jnp.float32)
    double = jax.jit(lambda a: 2 * a)
    return 2 * x.nbytes / min(timeit(double, x, min_time=0.2, repeats=5) for _ in range(3))


def _t(f) -> float:
    t0 = time.perf_counter()
    f()
    return time.perf_counter() - t0


def fmt_t(s: float) -> str:
    return f"{s * 1e6:9.2f} us" if s < 1e-3 else f"{s * 1e3:9.3f} ms"


def table(title: str, header: list[str], rows: list[list[str]]) -> None:
    print(f"\n### {title}\n")
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join("---" for _ in header) + "|")
    for r in rows:
        print("| " + " | ".join(r) + " |")


# ----------------------------------------------------------------- (a) bridge overhead
def hand_written_softplus():
    ops._register()

    # jaxbridge.ops.softplus gives x a trailing unit axis (so that XLA can split every
    # dimension of x across devices); the twin does the same, outside the custom_vjp.
    def fwd_call(x):
        return jax.ffi.ffi_call("jaxbridge_softplus_fwd", jax.ShapeDtypeStruct(x.shape, x.dtype),
                                vmap_method="broadcast_all")(x, beta=np.float64(1.0))

    @jax.custom_vjp
    def sp_unit(x):
        return fwd_call(x)

    def sp_fwd(x):
        return fwd_call(x), x

    def sp_bwd(x, ct):  # the adjoint needs only x and overwrites the cotangent
        return (jax.ffi.ffi_call("jaxbridge_softplus_adj", jax.ShapeDtypeStruct(x.shape, x.dtype),
                                 vmap_method="broadcast_all", input_output_aliases={1: 0})(
                                     x, ct, beta=np.float64(1.0)),)

    def sp(x):
        return sp_unit(x.reshape(*x.shape, 1)).reshape(x.shape)

    sp_unit.defvjp(sp_fwd, sp_bwd)
    return sp


def bench_overhead(quick: bool) -> None:
    hand = hand_written_softplus()
    bridged = ops.softplus
    rows = []
    for n in ([1, 100_000] if quick else [1, 1000, 100_000, 1_000_000]):
        x = jnp.linspace(-3, 3, n, dtype=jnp.float32)
        iters = 1000 if n <= 1000 else 20

        def loop(f):
            return jax.jit(lambda x: jax.lax.fori_loop(0, iters, lambda i, c: f(c) - 0.5, x))

        def grad_step(f):
            return jax.jit(jax.grad(lambda x: f(x).sum()))

        cases = [
            ("call in fori_loop", loop(bridged), loop(hand), iters),
            ("jitted call", jax.jit(bridged), jax.jit(hand), 1),
            ("grad step (jit)", grad_step(bridged), grad_step(hand), 1),
        ]
        for label, fb, fh, per in cases:
            same = _stablehlo(fb, x) == _stablehlo(fh, x)
            tb, _, th = compare(fb, {"hand": fh}, x, rounds=5)
            tb, th = tb / per, th / per
            rows.append([label, f"{n:,}", fmt_t(tb), fmt_t(th), f"{tb / th:.3f}x",
                         "yes" if same else "NO"])
    table(f"(a) jb.kernel vs hand-written ffi_call + custom_vjp (softplus, float32, {PLATFORM})",
          ["what", "elements", "jaxbridge", "hand-written", "ratio", "same StableHLO"], rows)


def _stablehlo(f, *args) -> str:
    """The lowered program without names and locations (which differ harmlessly), nor
    the batch-partitioning attributes jb.kernel adds (ffi_call cannot; they only tell
    XLA's partitioner how to split the call over devices)."""
    text = f.lower(*args).as_text()
    text = re.sub(r"mhlo\.frontend_attributes = \{num_batch_dims = \"\d+\"\}, ?", "", text)
    text = re.sub(r",? ?sdy\.sharding_rule = #sdy\.op_sharding_rule<.*?\}>", "", text)
    return re.sub(r"@\w+|loc\(.*?\)|#loc\d*", "", text)


# ----------------------------------------------------------------- (b) kernels vs jnp
def rbf_jnp_diff(x, y, l):
    d2 = jnp.sum((x[:, None, :] - y[None, :, :]) ** 2, -1)
    return jnp.exp(-d2 / (2 * l**2))


def rbf_jnp_gemm(x, y, l):
    d2 = jnp.sum(x**2, -1)[:, None] + jnp.sum(y**2, -1)[None, :] - 2 * x @ y.T
    return jnp.exp(-jnp.maximum(d2, 0) / (2 * l**2))


def bench_kernels(quick: bool, bw: float, kernels: list[str], dtypes: list,
                  json_dir: str | None = None) -> None:
    record = Table("kernels", "Built-in kernels against the best jnp/lax equivalent", "us",
                   ["dtype", "kernel", "size", "jaxbridge (us)", "reference (us)",
                    "reference is"],
                   method=f"on {PLATFORM}; alternating rounds, best round kept")
    for dt in dtypes:
        rows = []
        if "softplus" in kernels:
            rows += bench_softplus(quick, bw, dt)
        if "tridiagonal_solve" in kernels:
            rows += bench_tridiag(quick, bw, dt)
        if "rbf_kernel" in kernels:
            rows += bench_rbf(quick, bw, dt)
        table(f"(b) built-in kernels vs best jnp/lax equivalent ({PLATFORM}, "
              f"{np.dtype(dt).name}; ratio = jaxbridge / reference; BW = fraction of measured "
              "copy bandwidth reached by the kernel's minimal traffic)",
              ["kernel", "size", "jaxbridge", "reference", "reference is", "ratio", "BW"], rows)
        for kernel, size, ours, reference, reference_is, *_ in rows:
            record.add([np.dtype(dt).name, kernel, size, microseconds(ours),
                        microseconds(reference), reference_is])
    record.save(json_dir)


def microseconds(shown: str) -> float:
    """A time as fmt_t prints it ("5.45 us", "1.111 ms"), in us to 3 significant digits."""
    value, unit = shown.split()
    return float(f"{float(value) * (1e3 if unit == 'ms' else 1.0):.3g}")


def bench_softplus(quick: bool, bw: float, dt) -> list:
    rng = np.random.default_rng(0)
    rows = []
    # softplus: read n + write n
    sizes = [1000, 100_000, 1_000_000, 10_000_000] + ([100_000_000] if ON_GPU else [])
    for n in (sizes[::3] if quick else sizes):
        x = jnp.asarray(rng.normal(size=n) * 5, dt)
        ct = jnp.asarray(rng.normal(size=n), dt)
        f_jb, f_ref = jax.jit(ops.softplus), jax.jit(jax.nn.softplus)
        g_jb = jax.jit(jax.grad(lambda x: ops.softplus(x).sum()))
        g_ref = jax.jit(jax.grad(lambda x: jax.nn.softplus(x).sum()))
        tb, _, tr = compare(f_jb, {"ref": f_ref}, x)
        bytes_ = 2 * x.nbytes
        rows.append(["softplus", f"n={n:,}", fmt_t(tb), fmt_t(tr), "jax.nn.softplus",
                     f"{tb / tr:.2f}x", f"{bytes_ / tb / bw:.0%}"])
        tb, _, tr = compare(g_jb, {"ref": g_ref}, x)
        rows.append(["softplus grad", f"n={n:,}", fmt_t(tb), fmt_t(tr), "jax.nn.softplus",
                     f"{tb / tr:.2f}x", "-"])
        # vjp with a cotangent passed in (a jit argument: XLA copies it before our
        # adjoint overwrites it); minimal traffic: read x and ct, write the result.
        v_jb = jax.jit(lambda x, c: jax.vjp(ops.softplus, x)[1](c)[0])
        v_ref = jax.jit(lambda x, c: jax.vjp(jax.nn.softplus, x)[1](c)[0])
        tb, _, tr = compare(v_jb, {"ref": v_ref}, x, ct)
        rows.append(["softplus vjp(ct)", f"n={n:,}", fmt_t(tb), fmt_t(tr), "jax.nn.softplus",
                     f"{tb / tr:.2f}x", f"{3 * x.nbytes / tb / bw:.0%}"])
    return rows


def bench_tridiag(quick: bool, bw: float, dt) -> list:
    rng = np.random.default_rng(0)
    rows = []
    # tridiagonal: read 4 n + write n per system
    sizes = [(1, 1000), (1000, 1000)] if quick else [(1, 1000), (100, 100), (1000, 1000),
                                                     (10, 100_000)]
    if ON_GPU:
        sizes += [(100_000, 64), (10_000, 1000)]
    for batch, n in sizes:
        dl, du, b = (jnp.asarray(rng.normal(size=(batch, n)), dt) for _ in range(3))
        d = jnp.asarray(4 + rng.random((batch, n)), dt)
        f_jb = jax.jit(ops.tridiagonal_solve)
        f_ref = jax.jit(lambda dl, d, du, b: jax.lax.linalg.tridiagonal_solve(
            dl, d, du, b[..., None])[..., 0])
        tb, _, tr = compare(f_jb, {"ref": f_ref}, dl, d, du, b)
        bytes_ = 5 * d.nbytes
        rows.append(["tridiagonal_solve", f"{batch}x{n:,}", fmt_t(tb), fmt_t(tr),
                     "lax.linalg.tridiagonal_solve", f"{tb / tr:.2f}x", f"{bytes_ / tb / bw:.0%}"])
        g_jb = jax.jit(jax.grad(lambda *a: ops.tridiagonal_solve(*a).sum(), argnums=(0, 1, 2, 3)))
        g_ref = jax.jit(jax.grad(lambda *a: f_ref(*a).sum(), argnums=(0, 1, 2, 3)))
        tb, _, tr = compare(g_jb, {"ref": g_ref}, dl, d, du, b)
        rows.append(["tridiagonal_solve grad", f"{batch}x{n:,}", fmt_t(tb), fmt_t(tr),
                     "lax.linalg.tridiagonal_solve", f"{tb / tr:.2f}x", "-"])
    return rows


def bench_rbf(quick: bool, bw: float, dt) -> list:
    rng = np.random.default_rng(0)
    rows = []
    # RBF: write n*m (+ read inputs)
    sizes = ([(100, 100, 3), (2000, 2000, 3)] if quick else
             [(100, 100, 3), (1000, 1000, 3), (2000, 2000, 3), (1000, 1000, 64)])
    if ON_GPU:
        sizes += [(8000, 8000, 3), (4000, 4000, 64)]
    for n, m, dim in sizes:
        x = jnp.asarray(rng.normal(size=(n, dim)), dt)
        y = jnp.asarray(rng.normal(size=(m, dim)), dt)
        l = jnp.asarray(1.3, dt)
        refs = {"jnp (diff)": rbf_jnp_diff, "jnp (gemm)": rbf_jnp_gemm}
        bytes_ = (n * m + (n + m) * dim) * np.dtype(dt).itemsize
        modes = {
            "": jax.jit,
            " grad": lambda f: jax.jit(jax.grad(lambda *a: (f(*a) ** 2).sum(), argnums=(0, 1, 2))),
            " jvp": lambda f: jax.jit(lambda *a: jax.jvp(f, a, a)[1]),
        }
        for mode, wrap in modes.items():
            tb, best, tr = compare(wrap(ops.rbf_kernel), {k: wrap(f) for k, f in refs.items()},
                                   x, y, l)
            rows.append([f"rbf_kernel{mode}", f"{n}x{m}x{dim}", fmt_t(tb), fmt_t(tr), best,
                         f"{tb / tr:.2f}x", f"{bytes_ / tb / bw:.0%}" if not mode else "-"])
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--quick", action="store_true", help="fewer sizes (about 30 s)")
    p.add_argument("--only", choices=["overhead", "kernels"], default=None)
    p.add_argument("--kernel", nargs="+", default=["softplus", "tridiagonal_solve", "rbf_kernel"],
                   choices=["softplus", "tridiagonal_solve", "rbf_kernel"],
                   help="kernels for part (b)")
    p.add_argument("--dtype", choices=["float32", "float64", "both"], default="both")
    add_json_option(p)
    args = p.parse_args()
    dtypes = [np.float32, np.float64] if args.dtype == "both" else [np.dtype(args.dtype).type]
    bw = device_bandwidth() if ON_GPU else host_bandwidth()
    try:
        from jaxbridge import _builtin
        isa = _builtin._cpu_isa()
    except (ImportError, AttributeError):
        isa = "?"
    print(f"# jaxbridge kernel benchmarks — {datetime.date.today()}")
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs "
          f"visible; python {platform.python_version()}, jax {jax.__version__}, numpy "
          f"{np.__version__}; running on {PLATFORM}; copy bandwidth {bw / 1e9:.1f} GB/s; "
          f"C++ kernels' ISA (CPU): {isa}")
    if args.only in (None, "overhead"):
        bench_overhead(args.quick)
    if args.only in (None, "kernels"):
        bench_kernels(args.quick, bw, args.kernel, dtypes, args.json)


if __name__ == "__main__":
    main()
