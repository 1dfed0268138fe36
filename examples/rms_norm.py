"""JAX's FFI tutorial, done with jaxbridge: RMS normalization in C++ with its residual.

JAX's tutorial ("Foreign function interface", docs.jax.dev) writes RMS normalization
over the last axis in C++ (examples/rms_norm_tutorial.cc), registers its three handlers
with `jax.ffi.register_ffi_target`, calls them with `jax.ffi.ffi_call` and ties forward
and backward together with `jax.custom_vjp`, keeping the row norms as the residual so
the backward pass does not compute them again (`tutorial_rms_norm` below, its Python
side as the tutorial writes it). With jaxbridge (`jaxbridge_rms_norm`), the C++ of
examples/rms_norm.cc is compiled and cached by `jaxbridge.cpp.load`, and one
declaration gives a function that also has forward mode (`jvp`, `jacfwd`), a vectorized
`vmap`, export, a plain forward for calls nobody differentiates, and attribute types
read from the C++.

This script checks both against a jnp twin (values, `grad`, `jvp`, `vmap`, in float32
and float64), shows in the compiled programs which handlers run, checks jaxbridge's
derivatives with `jaxbridge.testing.check_rules`, shows a result declared too small
caught by guarded outputs instead of corrupting memory, and times the two side by
side (`benchmarks/rms_norm.py` does it at the tutorial's sizes, in alternating rounds).
Prints OK at the end; exits non-zero if anything disagrees.
"""

import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import jaxbridge as jb
from jaxbridge.testing import check_rules

jax.config.update("jax_enable_x64", True)
HERE = Path(__file__).resolve().parent


def jaxbridge_rms_norm(*, always_residuals: bool = False) -> jb.Kernel:
    """examples/rms_norm.cc as one differentiable function `rms_norm(x, eps=1e-5)`.

    `always_residuals`: declare the forward that returns the residual as the only
    forward (what a call costs when nobody differentiates it and residuals are
    computed anyway); by default calls nobody differentiates run the plain one.
    """
    lib = jb.cpp.load("rms_norm", sources=[HERE / "rms_norm.cc"])
    return lib.kernel(
        "RmsNormWithResiduals" if always_residuals else "RmsNorm",
        forward_with_residuals=None if always_residuals else "RmsNormWithResiduals",
        vjp="RmsNormDerivative", jvp="RmsNormDerivative",  # J is symmetric
        name="rms_norm_always_residuals" if always_residuals else "rms_norm",
        result=lambda x, **_: x,  # y: x's shape and dtype
        residuals=lambda x, **_: jax.ShapeDtypeStruct(x.shape[:-1], x.dtype),  # 1 / rms
        attrs={"eps": 1e-5},  # a default; the type (C++ float) comes from .Attr<float>
        vmap="vectorized",  # the handlers loop over every leading dimension
        pass_outputs=False,  # the derivatives need x and the residual, not y
        aliases={"vjp": {2: 0}})  # the VJP writes ct_x over ct (operand 2)


def tutorial_rms_norm():
    """The tutorial's Python side, as the tutorial writes it: three targets registered
    by hand, ffi_call, and a custom_vjp that keeps the residual (reverse mode only)."""
    lib = jb.cpp.load("rms_norm_tutorial", sources=[HERE / "rms_norm_tutorial.cc"])
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


def twin(x, eps=1e-5):
    """The same function in jnp (eps rounded to float32, as the C++ attribute is)."""
    eps = float(np.float32(eps))
    return x / jnp.sqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps)


def agree(what, got, want, dtype):
    tol = 2e-5 if dtype == np.float32 else 1e-12
    err = float(np.max(np.abs(np.asarray(got) - np.asarray(want))))
    print(f"  {what:<34} max |error| {err:.1e}")
    if not err <= tol:
        print(f"FAILED: {what}: error {err:.1e} > {tol:.0e}")
        sys.exit(1)


def check_values(rms_norm, tutorial):
    print("values and derivatives vs a jnp twin:")
    for dtype in (np.float32, np.float64):
        x = jnp.asarray(np.random.default_rng(0).normal(size=(8, 16)), dtype)
        w = jnp.asarray(np.random.default_rng(1).normal(size=(8, 16)), dtype)

        def loss(f, w=w):
            return jax.jit(jax.grad(lambda v: 0.5 * jnp.sum((f(v) - w) ** 2)))

        name = np.dtype(dtype).name
        agree(f"{name} jit", jax.jit(rms_norm)(x), twin(x), dtype)
        agree(f"{name} grad (the adjoint)", loss(rms_norm)(x), loss(twin)(x), dtype)
        agree(f"{name} grad, the tutorial's", loss(tutorial)(x), loss(twin)(x), dtype)
        agree(f"{name} jvp (the tangent)", jax.jvp(rms_norm, (x,), (w,))[1],
              jax.jvp(twin, (x,), (w,))[1], dtype)
        agree(f"{name} vmap of grad", jax.vmap(loss(rms_norm))(jnp.stack([x, -x])),
              jax.vmap(loss(twin))(jnp.stack([x, -x])), dtype)


def custom_calls(f, *args):
    text = jax.jit(f).lower(*args).compile().as_text()
    return sorted(line.split('custom_call_target="')[1].split('"')[0]
                  for line in text.splitlines() if "custom-call(" in line)


def show_programs(rms_norm):
    x = jnp.ones((4, 8), jnp.float32)
    plain = custom_calls(rms_norm, x)
    diff = custom_calls(jax.grad(lambda x: jnp.sum(rms_norm(x) ** 2)), x)
    print(f"a plain call runs {plain}\n"
          f"a gradient runs   {diff}")
    if plain != [rms_norm.target("forward", "cpu")] or rms_norm.target(
            "forward_with_residuals", "cpu") not in diff:
        print("FAILED: the programs do not run the handlers they should")
        sys.exit(1)


def show_guard():
    """The tutorial's hazard: a result declared smaller than what the handler writes.
    Guarded, the call fails with the kernel, target and output named."""
    lib = jb.cpp.load("rms_norm", sources=[HERE / "rms_norm.cc"])
    half = lib.kernel("RmsNorm", name="rms_norm_half",
                      result=lambda x, **_: jax.ShapeDtypeStruct(
                          (x.shape[0] // 2, x.shape[1]), x.dtype),
                      attrs={"eps": 1e-5}, guard_outputs=True)
    try:
        half(jnp.ones((8, 16), jnp.float32)).block_until_ready()
    except jax.errors.JaxRuntimeError as err:
        print("a result declared too small, guarded:\n  " + str(err).split(". ")[0])
        return
    print("FAILED: the write past the end was not reported")
    sys.exit(1)


def best_ms(f, *args, repeats=20):
    jax.block_until_ready(f(*args))
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(f(*args))
        best = min(best, time.perf_counter() - t0)
    return best * 1e3


def side_by_side(rms_norm, tutorial, always):
    x = jnp.asarray(np.random.default_rng(0).normal(size=(1024, 1024)), jnp.float32)
    w = 0.5 * x

    def fwd_bwd(f):
        return jax.jit(jax.grad(lambda x, w: 0.5 * jnp.sum((f(x) - w) ** 2)))

    rows = [("forward", jax.jit(rms_norm), jax.jit(tutorial), (x,)),
            ("forward + backward", fwd_bwd(rms_norm), fwd_bwd(tutorial), (x, w)),
            ("forward, always residuals", jax.jit(always), jax.jit(tutorial), (x,))]
    print("side by side, float32[1024, 1024], best of 20 (one run; benchmarks/rms_norm.py "
          "measures in alternating rounds):")
    print(f"  {'':<26} {'jaxbridge':>10} {'tutorial':>10} {'ratio':>6}")
    for what, ours, theirs, args in rows:
        a, b = best_ms(ours, *args), best_ms(theirs, *args)
        print(f"  {what:<26} {a:>8.2f}ms {b:>8.2f}ms {a / b:>6.2f}")


def main():
    rms_norm, tutorial = jaxbridge_rms_norm(), tutorial_rms_norm()
    check_values(rms_norm, tutorial)
    show_programs(rms_norm)
    report = check_rules(rms_norm, jnp.asarray(np.random.default_rng(2).normal(size=(3, 5)),
                                               jnp.float32))
    print(str(report).splitlines()[0])  # "check_rules(rms_norm) in float64: all checks ..."
    show_guard()
    side_by_side(rms_norm, tutorial, jaxbridge_rms_norm(always_residuals=True))
    print("OK")


if __name__ == "__main__":
    main()
