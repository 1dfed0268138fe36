"""JAX's FFI tutorial kernel (RMS normalization over the last axis), registered by hand as
the tutorial does, side by side with the same kernel through jaxbridge (CPU).

    PYTHONPATH=. python benchmarks/rms_norm.py [--quick] [--rounds 5]

The tutorial's side: its C++ handlers (RmsNorm, RmsNormFwd -> (y, res), RmsNormBwd(res,
x, ct)), registered with `jax.ffi.register_ffi_target`, called with `jax.ffi.ffi_call`
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
import os
import platform
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

jax.config.update("jax_enable_x64", True)

import jaxbridge as jb  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]

# JAX's tutorial kernel (docs.jax.dev "Foreign function interface", examples/ffi:
# rms_norm.cc), float32 and float64, as the tutorial writes it.
TUTORIAL_CC = r"""
#include <cmath>
#include <cstdint>
#include <utility>
#include "xla/ffi/api/ffi.h"
namespace ffi = xla::ffi;

template <typename T>
T ComputeRmsNorm(float eps, int64_t size, const T *x, T *y) {
  T sm = static_cast<T>(0);
  for (int64_t n = 0; n < size; ++n) sm += x[n] * x[n];
  T scale = static_cast<T>(1) / std::sqrt(sm / static_cast<T>(size) + static_cast<T>(eps));
  for (int64_t n = 0; n < size; ++n) y[n] = x[n] * scale;
  return scale;
}

template <typename T>
void ComputeRmsNormBwd(int64_t size, T res, const T *x, const T *ct_y, T *ct_x) {
  T ct_res = static_cast<T>(0);
  for (int64_t n = 0; n < size; ++n) ct_res += x[n] * ct_y[n];
  T factor = ct_res * res * res * res / static_cast<T>(size);
  for (int64_t n = 0; n < size; ++n) ct_x[n] = res * ct_y[n] - factor * x[n];
}

std::pair<int64_t, int64_t> GetDims(const ffi::AnyBuffer &buffer) {
  auto dims = buffer.dimensions();
  if (dims.size() == 0) return std::make_pair(0, 0);
  return std::make_pair(buffer.element_count(), dims.back());
}

template <typename T>
ffi::Error Fwd(float eps, ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> y, T *res) {
  auto [total, last] = GetDims(x);
  if (last == 0) return ffi::Error::InvalidArgument("RmsNorm input must be an array");
  const T *xd = x.typed_data<T>();
  T *yd = y->typed_data<T>();
  for (int64_t n = 0; n < total; n += last) {
    T r = ComputeRmsNorm(eps, last, &xd[n], &yd[n]);
    if (res) res[n / last] = r;
  }
  return ffi::Error::Success();
}

ffi::Error RmsNormImpl(float eps, ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> y) {
  if (x.element_type() == ffi::F32) return Fwd<float>(eps, x, y, nullptr);
  if (x.element_type() == ffi::F64) return Fwd<double>(eps, x, y, nullptr);
  return ffi::Error::InvalidArgument("Unsupported input data type");
}
XLA_FFI_DEFINE_HANDLER_SYMBOL(RmsNorm, RmsNormImpl,
    ffi::Ffi::Bind().Attr<float>("eps").Arg<ffi::AnyBuffer>().Ret<ffi::AnyBuffer>());

ffi::Error RmsNormFwdImpl(float eps, ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> y,
                          ffi::Result<ffi::AnyBuffer> res) {
  if (x.element_type() == ffi::F32) return Fwd<float>(eps, x, y, res->typed_data<float>());
  if (x.element_type() == ffi::F64) return Fwd<double>(eps, x, y, res->typed_data<double>());
  return ffi::Error::InvalidArgument("Unsupported input data type");
}
XLA_FFI_DEFINE_HANDLER_SYMBOL(RmsNormFwd, RmsNormFwdImpl,
    ffi::Ffi::Bind().Attr<float>("eps").Arg<ffi::AnyBuffer>().Ret<ffi::AnyBuffer>()
        .Ret<ffi::AnyBuffer>());

template <typename T>
ffi::Error Bwd(ffi::AnyBuffer res, ffi::AnyBuffer x, ffi::AnyBuffer ct_y,
               ffi::Result<ffi::AnyBuffer> ct_x) {
  auto [total, last] = GetDims(x);
  if (last == 0) return ffi::Error::InvalidArgument("RmsNormBwd inputs must be arrays");
  for (int64_t n = 0; n < total; n += last) {
    ComputeRmsNormBwd(last, res.typed_data<T>()[n / last], &x.typed_data<T>()[n],
                      &ct_y.typed_data<T>()[n], &ct_x->typed_data<T>()[n]);
  }
  return ffi::Error::Success();
}

ffi::Error RmsNormBwdImpl(ffi::AnyBuffer res, ffi::AnyBuffer x, ffi::AnyBuffer ct_y,
                          ffi::Result<ffi::AnyBuffer> ct_x) {
  if (x.element_type() == ffi::F32) return Bwd<float>(res, x, ct_y, ct_x);
  if (x.element_type() == ffi::F64) return Bwd<double>(res, x, ct_y, ct_x);
  return ffi::Error::InvalidArgument("Unsupported input data type");
}
XLA_FFI_DEFINE_HANDLER_SYMBOL(RmsNormBwd, RmsNormBwdImpl,
    ffi::Ffi::Bind().Arg<ffi::AnyBuffer>().Arg<ffi::AnyBuffer>().Arg<ffi::AnyBuffer>()
        .Ret<ffi::AnyBuffer>());
"""


def tutorial_rms_norm():
    """The tutorial's Python side: registered by hand, ffi_call + custom_vjp."""
    lib = jb.cpp.load("tutorial_rms_norm", source=TUTORIAL_CC)  # the compiler only
    for name, symbol in (("tutorial_rms_norm", "RmsNorm"),
                         ("tutorial_rms_norm_fwd", "RmsNormFwd"),
                         ("tutorial_rms_norm_bwd", "RmsNormBwd")):
        jax.ffi.register_ffi_target(name, lib.handlers[symbol], platform="cpu")

    def rms_norm(x, eps=1e-5):
        y_type = jax.ShapeDtypeStruct(x.shape, x.dtype)
        return jax.ffi.ffi_call("tutorial_rms_norm", y_type, vmap_method="broadcast_all")(
            x, eps=np.float32(eps))

    def rms_norm_fwd(x, eps=1e-5):
        y, res = jax.ffi.ffi_call(
            "tutorial_rms_norm_fwd",
            (jax.ShapeDtypeStruct(x.shape, x.dtype),
             jax.ShapeDtypeStruct(x.shape[:-1], x.dtype)),
            vmap_method="broadcast_all")(x, eps=np.float32(eps))
        return y, (res, x)

    def rms_norm_bwd(eps, res, ct):
        del eps
        res, x = res
        return (jax.ffi.ffi_call("tutorial_rms_norm_bwd",
                                 jax.ShapeDtypeStruct(ct.shape, ct.dtype),
                                 vmap_method="broadcast_all")(res, x, ct),)

    rms_norm = jax.custom_vjp(rms_norm, nondiff_argnums=(1,))
    rms_norm.defvjp(rms_norm_fwd, rms_norm_bwd)
    return rms_norm


def jaxbridge_rms_norm(*, with_residual_target: bool = True):
    """examples/rms_norm.cc through jaxbridge (as examples/rms_norm.py declares it)."""
    lib = jb.cpp.load("rms_norm", sources=[ROOT / "examples" / "rms_norm.cc"])
    forward = "RmsNorm" if with_residual_target else "RmsNormWithResiduals"
    return lib.kernel(
        forward, adjoint="RmsNormDerivative", tangent="RmsNormDerivative",
        forward_with_residuals="RmsNormWithResiduals" if with_residual_target else None,
        name="rms_norm" if with_residual_target else "rms_norm_always_residuals",
        result=lambda x, **_: x,
        residuals=lambda x, **_: jax.ShapeDtypeStruct(x.shape[:-1], x.dtype),
        attrs={"eps": 1e-5}, vmap="vectorized", pass_outputs=False,
        aliases={"adjoint": {2: 0}})


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
    tutorial, ours = tutorial_rms_norm(), jaxbridge_rms_norm()
    always = jaxbridge_rms_norm(with_residual_target=False)
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
