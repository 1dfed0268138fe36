"""jaxbridge quickstart: a SciPy solver, made differentiable, inside a jitted training loop.

We wrap `scipy.linalg.solve` (opaque to JAX) with its VJP rule (one transposed solve),
check its gradient against JAX's own `jnp.linalg.solve`, then fit the diagonal of a
linear system by gradient descent, with the whole training step under `jax.jit`.
Exits non-zero if the gradient check fails.
"""

import sys

import jax
import jax.numpy as jnp
import numpy as np
import scipy.linalg

import jaxbridge as jb

jax.config.update("jax_enable_x64", True)


@jb.foreign(lambda a, b: b)  # result: same shape and dtype as `b`
def solve(a, b):
    """x = A^{-1} b, computed by SciPy on the host."""
    return scipy.linalg.solve(a, b)


@solve.defvjp
def solve_vjp(primals, x, ct):
    """VJP: lambda = A^{-T} ct; d/dA = -lambda x^T, d/db = lambda."""
    a, _ = primals
    lam = scipy.linalg.solve(a.T, ct)
    return -np.outer(lam, x), lam


@solve.defjvp
def solve_jvp(primals, x, tangents):
    """Tangent: dx = A^{-1} (db - dA x); None marks a zero tangent."""
    a, _ = primals
    da, db = tangents
    rhs = np.zeros_like(x) if db is None else np.array(db)
    if da is not None:
        rhs = rhs - da @ x
    return scipy.linalg.solve(a, rhs)


def main() -> int:
    n = 8
    key_a, key_b = jax.random.split(jax.random.PRNGKey(0))
    base = jax.random.normal(key_a, (n, n)) / n
    b = jax.random.normal(key_b, (n,))
    true_diag = jnp.linspace(1.0, 3.0, n)
    target = jnp.linalg.solve(base + jnp.diag(true_diag), b)

    def loss(diag, solver):
        x = solver(base + jnp.diag(diag), b)
        return jnp.sum((x - target) ** 2)

    # 1. Gradients, under jit, against JAX's own autodiff of jnp.linalg.solve.
    diag0 = jnp.full(n, 2.0)
    ours = jax.jit(jax.grad(loss), static_argnums=1)(diag0, solve)
    ref = jax.grad(loss)(diag0, jnp.linalg.solve)
    err = float(jnp.max(jnp.abs(ours - ref)))
    fwd = jax.jacfwd(solve, argnums=1)(base + jnp.diag(diag0), b)
    rev = jax.jacrev(solve, argnums=1)(base + jnp.diag(diag0), b)
    print(f"gradient vs JAX autodiff: max abs error {err:.2e}")
    print(f"jacfwd vs jacrev:         max abs error {float(jnp.max(jnp.abs(fwd - rev))):.2e}")

    # 2. A jitted training loop through the SciPy solver.
    @jax.jit
    def step(diag):
        value, grad = jax.value_and_grad(loss)(diag, solve)
        return diag - 1.0 * grad, value

    diag = diag0
    first = None
    for it in range(201):
        diag, value = step(diag)
        first = float(value) if first is None else first
        if it % 50 == 0:
            print(f"step {it:4d}  loss {float(value):.3e}")
    final = float(loss(diag, solve))
    print(f"loss reduced {first / final:.1e}x by 200 jitted steps through scipy.linalg.solve")
    print(jb.info()["native"] and "host calls ran through the native trampoline"
          or "host calls ran through jax.pure_callback")

    ok = err < 1e-10 and final < 1e-4 * first
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
