"""Softplus in float32: where the naive formula breaks, and a stable one with its VJP rule.

The naive `log(1 + exp(x))` overflows to inf for x > ~88 in float32, and JAX's
derivative of it, `exp(x) / (1 + exp(x))`, becomes inf/inf = nan; for very negative
x it loses all precision in `1 + exp(x)`. The stable version
`max(x, 0) + log1p(exp(-|x|))` is written in NumPy and wrapped with `jb.foreign`,
with the VJP rule `ct * sigmoid(x)` (and the JVP rule `sigmoid(x) * dx`). When the
built-in C++ kernel `jaxbridge.ops.softplus` is available it is shown too. Everything
is evaluated under `jax.jit`; the table compares values and gradients at
x = -10, 0, 10, 80, 100 with a float64 reference. Exits non-zero if a stable version
is wrong or not finite.
"""

import sys

import jax
import jax.numpy as jnp
import numpy as np
import scipy.special

import jaxbridge as jb

POINTS = np.array([-10.0, 0.0, 10.0, 80.0, 100.0], np.float32)


def naive_jnp(x):
    """The textbook formula, differentiated by JAX."""
    return jnp.log(1.0 + jnp.exp(x))


@jb.foreign(lambda x: x, vmap="vectorized")
def naive_host(x):
    """The textbook formula in NumPy ..."""
    with np.errstate(over="ignore"):
        return np.log(1.0 + np.exp(x))


@naive_host.defvjp
def naive_host_vjp(primals, y, ct):
    """... with the textbook derivative exp(x) / (1 + exp(x))."""
    (x,) = primals
    with np.errstate(over="ignore", invalid="ignore"):
        return (ct * np.exp(x) / (1.0 + np.exp(x)),)


@jb.foreign(lambda x: x, vmap="vectorized")
def stable_softplus(x):
    """softplus(x) = max(x, 0) + log1p(exp(-|x|)): no overflow, full precision."""
    return (np.maximum(x, 0) + np.log1p(np.exp(-np.abs(x)))).astype(x.dtype)


@stable_softplus.defvjp
def stable_softplus_vjp(primals, y, ct):
    """d softplus / dx = sigmoid(x), evaluated stably by scipy.special.expit."""
    (x,) = primals
    return ((ct * scipy.special.expit(x)).astype(x.dtype),)


@stable_softplus.defjvp
def stable_softplus_jvp(primals, y, tangents):
    (x,), (dx,) = primals, tangents
    return (scipy.special.expit(x) * dx).astype(x.dtype)


def builtin_softplus():
    """`jaxbridge.ops.softplus` (the C++ kernel) if it is built, else (None, reason)."""
    try:
        from jaxbridge import ops
    except ImportError as err:
        return None, f"jaxbridge.ops is not available ({err})"
    fn = getattr(ops, "softplus", None)
    if fn is None:
        return None, "jaxbridge.ops has no softplus"
    if not ops.available():
        return None, f"jaxbridge.ops kernels are not built ({ops.IMPORT_ERROR})"
    return fn, "jaxbridge.ops.softplus (C++ kernel)"


def value_and_grad(f):
    """Values and elementwise gradients, both from one jitted function."""
    @jax.jit
    def run(x):
        value, vjp = jax.vjp(f, x)
        return value, vjp(jnp.ones_like(value))[0]
    return run


def main() -> int:
    x = jnp.asarray(POINTS)
    impls = {"naive jnp": naive_jnp, "naive numpy": naive_host, "stable numpy": stable_softplus}
    kernel, why = builtin_softplus()
    if kernel is not None:
        impls["C++ kernel"] = kernel
    print(f"built-in kernel: {why}")

    results = {name: [np.asarray(a) for a in value_and_grad(f)(x)] for name, f in impls.items()}
    x64 = POINTS.astype(np.float64)
    ref_value, ref_grad = np.logaddexp(0.0, x64), scipy.special.expit(x64)

    header = f"{'x':>6} | " + " | ".join(f"{name:^23}" for name in impls) + " | float64 reference"
    print(header)
    print(f"{'':>6} | " + " | ".join(f"{'value':>11} {'grad':>11}" for _ in impls)
          + f" | {'value':>11} {'grad':>11}")
    print("-" * len(header))
    for i, xi in enumerate(POINTS):
        cells = [f"{results[n][0][i]:11.5g} {results[n][1][i]:11.5g}" for n in impls]
        print(f"{xi:6.0f} | " + " | ".join(cells) + f" | {ref_value[i]:11.5g} {ref_grad[i]:11.5g}")

    ok = True
    for name, (value, grad) in results.items():
        finite = bool(np.all(np.isfinite(value)) and np.all(np.isfinite(grad)))
        rel_v = float(np.max(np.abs(value - ref_value) / np.maximum(np.abs(ref_value), 1e-30)))
        rel_g = float(np.max(np.abs(grad - ref_grad) / np.maximum(np.abs(ref_grad), 1e-30)))
        dtype_ok = value.dtype == np.float32 and grad.dtype == np.float32
        print(f"{name:13s} all finite: {str(finite):5s}  max rel. error: value {rel_v:.1e}, "
              f"grad {rel_g:.1e}")
        if name.startswith("naive"):
            ok &= not finite  # the demonstration: the naive formula must break at x = 100
        else:
            ok &= finite and dtype_ok and rel_v < 1e-6 and rel_g < 1e-6
    jac = jax.jit(jax.jacfwd(stable_softplus))(x)
    ok &= bool(np.allclose(np.diag(np.asarray(jac)), ref_grad, rtol=1e-6))
    print("the naive formula gives inf/nan at x = 100 (float32 exp overflows past ~88.7) and "
          "loses digits at x = -10 (1 + exp(x) rounds); the stable ones stay exact")
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
