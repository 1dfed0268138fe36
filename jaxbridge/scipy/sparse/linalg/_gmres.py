"""Matrix-free GMRES for the compiled root: lean loops for small and mid-size problems.

`jax.scipy.sparse.linalg.gmres` runs nested loops per Arnoldi step (iterated
Gram-Schmidt, a loop over the previous Givens rotations) and stores its basis by
columns; on a DEQ of 512 unknowns that loop overhead, not the products, is the cost
of a Newton step. Here the basis is stored by rows; Gram-Schmidt is one pass, and a
second only where the first cancelled (Daniel-Gragg-Kaufman-Stewart; "twice is
enough"), or for large problems modified Gram-Schmidt over the rows built so far;
and the Givens rotations are accumulated in one small orthogonal matrix,
so rotating a new Hessenberg column is one product. The iterates are GMRES's by its
definition (the minimizer over the first Krylov space that meets the tolerance), up to
rounding. JAX's incremental GMRES has them too, except where a cycle stops
early: there it adds the residual's own component, in b's units, to x. Restarts do not
repair that: on a matrix of norm 2e3 at tol 1e-3, its relative residual is 0.80 after
one cycle and 0.19 after 20 (JAX 0.10.2 and 0.12.0.1; its batched GMRES is right).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ... import _loops as loops

_SQRT2 = float(np.sqrt(2.0))
# from this many unknowns on, Gram-Schmidt runs over the basis rows built so far, one
# at a time (modified Gram-Schmidt): a pass over the whole (m+1) x n basis is memory
# traffic that dominates an Arnoldi step there, while on small problems the per-row
# loop's overhead would
_MGS_MIN = 4096


def _divide(a: jax.Array, d: jax.Array, otherwise: float) -> jax.Array:
    """a / d where d > 0, else `otherwise` (neither branch of the `where` divides by 0)."""
    return jnp.where(d > 0, a / jnp.where(d > 0, d, 1.0), otherwise)


def _modified_gram_schmidt(V: jax.Array, w: jax.Array, k: jax.Array) -> tuple:
    """Orthogonalize w against the basis rows 0..k only, one row at a time."""
    def body(i: jax.Array, hw: tuple) -> tuple:
        h, w = hw
        hi = V[i] @ w
        return h.at[i].set(hi), w - hi * V[i]
    return loops.fori_loop(0, k + 1, body, (jnp.zeros(V.shape[0], w.dtype), w))


def cycle(matvec: Callable[[jax.Array], jax.Array], b: jax.Array, tol: Any, atol: Any,
          m: int) -> jax.Array:
    """One cycle of GMRES from 0 (SciPy's KrylovJacobian runs its solver with maxiter=1):
    up to `m` Arnoldi steps, stopping when ||b - A x|| <= max(tol ||b||, atol).

    Leaner than `jax.scipy.sparse.linalg.gmres(solve_method="incremental")`, whose
    nested loops (Gram-Schmidt, Givens rotations) dominate a small problem's Newton
    step (see the module's docstring).
    """
    n, dtype = b.shape[0], b.dtype
    b_norm = jnp.linalg.norm(b)
    target = jnp.maximum(tol * b_norm, atol)
    safe = jnp.where(b_norm > 0, b_norm, 1.0)
    V = jnp.zeros((m + 1, n), dtype).at[0].set(b / safe)
    R = jnp.eye(m, m + 1, dtype=dtype)  # row k: the k-th column of the triangular factor
    Q = jnp.eye(m + 1, dtype=dtype)     # the product of the Givens rotations so far
    g0 = jnp.zeros(m + 1, dtype).at[0].set(b_norm)

    def cond(c: tuple) -> jax.Array:
        k, _, _, Q = c
        return (k < m) & (jnp.abs(Q[k, 0] * b_norm) > target)

    def step(c: tuple) -> tuple:
        k, V, R, Q = c
        w = matvec(V[k])
        if n >= _MGS_MIN:
            h, w = _modified_gram_schmidt(V, w, k)
            beta = jnp.linalg.norm(w)
        else:
            w_norm = jnp.linalg.norm(w)
            h = V @ w
            w = w - h @ V
            beta = jnp.linalg.norm(w)

            def again(hw: tuple) -> tuple:  # the second pass
                h, w = hw
                h2 = V @ w
                w = w - h2 @ V
                return h + h2, w, jnp.linalg.norm(w)
            # DGKS: pass again only after cancellation
            h, w, beta = loops.cond(beta < w_norm / _SQRT2, again,
                                      lambda hw: (*hw, beta), (h, w))
        V = V.at[k + 1].set(_divide(w, beta, 0.0))
        col = Q @ h.at[k + 1].set(beta)
        a, e = col[k], col[k + 1]
        r = jnp.hypot(a, e)
        cs, sn = _divide(a, r, 1.0), _divide(e, r, 0.0)
        col = col.at[k].set(r).at[k + 1].set(0.0)
        qk, qk1 = Q[k], Q[k + 1]
        Q = Q.at[k].set(cs * qk + sn * qk1).at[k + 1].set(cs * qk1 - sn * qk)
        return k + 1, V, R.at[k].set(col), Q

    k, V, R, Q = loops.while_loop(cond, step, (jnp.zeros((), jnp.int32), V, R, Q))
    # the least-squares right-hand side takes rows 0..k-1 only: row k holds the residual
    # (in b's units, not x's), and rows of R from k on are the identity's, so y is zero
    # from k on. No step taken (the target met by x = 0 already) gives 0, as JAX's GMRES
    g = jnp.where(jnp.arange(m) < k, (Q @ g0)[:m], 0.0)
    y = jax.scipy.linalg.solve_triangular(R[:, :m].T, g, lower=False)
    return y @ V[:m]


def solve(matvec: Callable[[jax.Array], jax.Array], b: jax.Array, tol: Any, m: int,
          maxiter: int) -> jax.Array:
    """Restarted GMRES from 0: cycles of at most `m` Arnoldi steps on the residual,
    until ||b - A x|| <= tol ||b|| or `maxiter` cycles."""
    m = max(1, min(m, b.shape[0]))
    target = tol * jnp.linalg.norm(b)

    def cond(c: tuple) -> jax.Array:
        i, _, r = c
        return (i < maxiter) & (jnp.linalg.norm(r) > target)

    def body(c: tuple) -> tuple:
        i, x, r = c
        x = x + cycle(matvec, r, 0.0, target, m)
        return i + 1, x, b - matvec(x)

    return loops.while_loop(cond, body, (jnp.zeros((), jnp.int32), jnp.zeros_like(b), b))[1]
