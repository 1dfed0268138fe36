"""Differentiable `scipy.sparse.linalg.spsolve`: gradients w.r.t. b and A's nonzeros.

`x = A^{-1} b` with `A` sparse. The adjoint is one more solve with the transpose:
`lam = A^{-T} x_bar`, `b_bar = lam`, and for each stored entry `(r, c, v)` of A,
`v_bar = -lam[r] x[c]` (duplicates are summed by SciPy, and each gets its own
cotangent, which is exactly right). The tangent is `dx = A^{-1}(db - dA x)`.

**Factorization reuse.** The forward pass factors A once with `scipy.sparse.linalg.splu`
and keeps the factor in a small host-side LRU cache (`FACTOR_CACHE_SIZE` entries).
The key is a BLAKE2b digest of A's bytes (values, row and column indices, shape and
dtype), so a factor is only ever reused for bit-identical matrices: hashing costs
O(nnz), far less than a factorization, and no stale factor can be used after A
changes, under `vmap`, or across threads. The backward (and forward-mode) pass
looks the factor up and solves with `trans="T"`; on a miss (evicted) it refactors.
"""

from __future__ import annotations

import collections
import hashlib
import threading
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import scipy.sparse
import scipy.sparse.linalg

from ... import _foreign
from .._common import as_float_array, check_policy, failure

__all__ = ["spsolve", "FACTOR_CACHE_SIZE", "factor_cache_info"]

FACTOR_CACHE_SIZE = 8
_cache: collections.OrderedDict[bytes, Any] = collections.OrderedDict()
_lock = threading.Lock()
_stats = {"hits": 0, "misses": 0}


def factor_cache_info() -> dict:
    """Hits, misses and current size of the host-side factor cache."""
    with _lock:
        return {**_stats, "size": len(_cache), "maxsize": FACTOR_CACHE_SIZE}


def _digest(data, row, col, n) -> bytes:
    h = hashlib.blake2b(digest_size=20)
    for arr in (data, row, col):
        arr = np.ascontiguousarray(arr)
        h.update(str((arr.dtype.str, arr.shape)).encode())
        h.update(arr.data)
    h.update(str(n).encode())
    return h.digest()


def _factor(data, row, col, n, permc_spec):
    """splu of the COO matrix, from the cache when bit-identical (None if singular)."""
    key = _digest(data, row, col, n) + str(permc_spec).encode()
    with _lock:
        lu = _cache.get(key)
        if lu is not None:
            _cache.move_to_end(key)
            _stats["hits"] += 1
            return lu
        _stats["misses"] += 1
    A = scipy.sparse.coo_matrix((np.asarray(data, np.float64), (row, col)), shape=(n, n)).tocsc()
    try:
        lu = scipy.sparse.linalg.splu(A, permc_spec=permc_spec)
    except RuntimeError as exc:  # "Factor is exactly singular"
        return exc
    with _lock:
        _cache[key] = lu
        while len(_cache) > max(FACTOR_CACHE_SIZE, 0):
            _cache.popitem(last=False)
    return lu


def _singular(lu, on_failure):
    if on_failure == "raise":
        raise failure("sparse.linalg.spsolve", f"splu: {lu}")


@_foreign.foreign(lambda data, row, col, b, **_: b)
def _spsolve(data, row, col, b, *, permc_spec, on_failure):
    n = b.shape[0]
    lu = _factor(data, row, col, n, permc_spec)
    if isinstance(lu, Exception):
        _singular(lu, on_failure)
        return np.full(b.shape, np.nan, b.dtype)
    x = lu.solve(np.asarray(b, np.float64))
    if not np.all(np.isfinite(x)):
        if on_failure == "raise":
            raise failure("sparse.linalg.spsolve", "the solution is not finite")
        x = np.full(b.shape, np.nan)
    return x.astype(b.dtype)


@_spsolve.defvjp
def _spsolve_vjp(primals, x, ct, *, permc_spec, on_failure):
    data, row, col, b = primals
    n = b.shape[0]
    lu = _factor(data, row, col, n, permc_spec)
    if isinstance(lu, Exception) or not np.all(np.isfinite(x)):
        return (np.full(data.shape, np.nan, data.dtype), None, None,
                np.full(b.shape, np.nan, b.dtype))
    lam = lu.solve(np.asarray(ct, np.float64), trans="T")
    xs = np.asarray(x, np.float64)
    if b.ndim == 1:
        d_bar = -lam[row] * xs[col]
    else:
        d_bar = -np.einsum("ij,ij->i", lam[row], xs[col])
    return d_bar.astype(data.dtype), None, None, lam.astype(b.dtype)


@_spsolve.defjvp
def _spsolve_jvp(primals, x, tangents, *, permc_spec, on_failure):
    data, row, col, b = primals
    d_data, _, _, db = tangents
    n = b.shape[0]
    lu = _factor(data, row, col, n, permc_spec)
    if isinstance(lu, Exception) or not np.all(np.isfinite(x)):
        return np.full(b.shape, np.nan, b.dtype)
    rhs = np.zeros(b.shape) if db is None else np.array(db, np.float64)
    if d_data is not None:
        xs = np.asarray(x, np.float64)
        contrib = np.asarray(d_data, np.float64).reshape(-1, *([1] * (b.ndim - 1))) * xs[col]
        np.add.at(rhs, row, -contrib)
    return lu.solve(rhs).astype(b.dtype)


def _as_coo(A: Any, n: int) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(data, row, col) from a BCOO/BCSR or SciPy-style constructor tuple."""
    from jax.experimental import sparse as jsparse

    if isinstance(A, jsparse.BCOO):
        if A.n_batch or A.n_dense or A.ndim != 2:
            raise ValueError("jaxbridge.scipy.sparse.linalg.spsolve: BCOO must be a plain 2-D "
                             "matrix (no batch or dense dimensions)")
        return A.data, A.indices[:, 0], A.indices[:, 1]
    if isinstance(A, jsparse.BCSR):
        A = (A.data, A.indices, A.indptr)
    if isinstance(A, tuple) and len(A) == 2 and isinstance(A[1], tuple) and len(A[1]) == 2:
        data, (row, col) = A  # COO: (data, (row, col))
        return jnp.asarray(data), jnp.asarray(row), jnp.asarray(col)
    if isinstance(A, tuple) and len(A) == 3:
        data, indices, indptr = (jnp.asarray(v) for v in A)  # CSR
        if indptr.shape != (n + 1,):
            raise ValueError(f"jaxbridge.scipy.sparse.linalg.spsolve: CSR indptr must have "
                             f"length n + 1 = {n + 1}, got {indptr.shape}")
        row = jnp.repeat(jnp.arange(n, dtype=indices.dtype), jnp.diff(indptr),
                         total_repeat_length=data.shape[0])
        return data, row, indices
    raise TypeError(
        "jaxbridge.scipy.sparse.linalg.spsolve: A must be a jax.experimental.sparse.BCOO or "
        "BCSR, a COO tuple (data, (row, col)) or a CSR tuple (data, indices, indptr); got "
        f"{type(A).__name__}")


def spsolve(A: Any, b: Any, *, permc_spec: str = "COLAMD",
            on_failure: str = "raise") -> jax.Array:
    """Solve `A x = b` for square sparse `A` with SciPy's SuperLU; differentiable.

    Args:
      A: a `jax.experimental.sparse.BCOO` or `BCSR`, a COO tuple `(data, (row, col))`
        or a CSR tuple `(data, indices, indptr)` (SciPy's constructor forms); shape
        `(n, n)` with `n = b.shape[0]`. Gradients flow to the stored values `data`
        (one per stored entry, duplicates included); the index arrays are integers.
      b: right-hand side, shape `(n,)` or `(n, k)`.
      permc_spec: SuperLU's column ordering (static).
      on_failure: "raise" (singular matrix: an error with SuperLU's message) or "nan".

    Returns:
      `x`, shaped like `b`. One `splu` factorization serves the forward solve, the
      adjoint solve and the tangent solve (see the module docstring for the cache).
    """
    check_policy(on_failure, "sparse.linalg.spsolve")
    b = as_float_array(b)
    if b.ndim not in (1, 2):
        raise ValueError(f"jaxbridge.scipy.sparse.linalg.spsolve: b must be 1-D or 2-D, got "
                         f"shape {b.shape}")
    data, row, col = _as_coo(A, b.shape[0])
    if not jnp.issubdtype(data.dtype, jnp.floating):
        data = data.astype(b.dtype)
    return _spsolve(data, row.astype(jnp.int32), col.astype(jnp.int32), b,
                    permc_spec=permc_spec, on_failure=on_failure)
