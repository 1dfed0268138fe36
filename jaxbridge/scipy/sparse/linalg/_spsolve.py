"""`spsolve`: SuperLU's sparse solve, one factorization (cached) for the solve and its rules."""

from __future__ import annotations

import hashlib
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import scipy.sparse
import scipy.sparse.linalg

from .... import _foreign
from ..._common import LruCache, as_float_array, check_policy, check_real, failure
from ._coo import as_coo


def _cache_size() -> int:
    """FACTOR_CACHE_SIZE as the package holds it now (users set it there)."""
    from . import FACTOR_CACHE_SIZE

    return FACTOR_CACHE_SIZE


_cache = LruCache(_cache_size)


def factor_cache_info() -> dict:
    """Hits, misses and current size of the host-side factor cache of `spsolve`.

    The cache holds the last `FACTOR_CACHE_SIZE` SuperLU factorizations, keyed by a
    digest of A's bytes, so the adjoint and tangent solves reuse the forward's factor.

    Returns:
      A dict with the counters and the current number of entries.

    Example:
        >>> from jaxbridge.scipy.sparse.linalg import factor_cache_info
        >>> sorted(factor_cache_info())
        ['hits', 'maxsize', 'misses', 'size']
    """
    return _cache.info()


def _digest(data: Any, row: Any, col: Any, n: int) -> bytes:
    h = hashlib.blake2b(digest_size=20)
    for arr in (data, row, col):
        arr = np.ascontiguousarray(arr)
        h.update(str((arr.dtype.str, arr.shape)).encode())
        h.update(arr.data)
    h.update(str(n).encode())
    return h.digest()


def _factor(data: Any, row: Any, col: Any, n: int, permc_spec: str) -> Any:
    """splu of the COO matrix, from the cache when bit-identical (None if singular)."""
    key = _digest(data, row, col, n) + str(permc_spec).encode()
    lu = _cache.get(key)
    if lu is not None:
        return lu
    A = scipy.sparse.coo_matrix((np.asarray(data, np.float64), (row, col)), shape=(n, n)).tocsc()
    try:
        lu = scipy.sparse.linalg.splu(A, permc_spec=permc_spec)
    except RuntimeError as exc:  # "Factor is exactly singular"
        return exc
    return _cache.put(key, lu)


def _singular(lu: Any, on_failure: str) -> None:
    if on_failure == "raise":
        raise failure("sparse.linalg.spsolve", f"splu: {lu}")


@_foreign.foreign(lambda data, row, col, b, **_: b)
def _spsolve(data: np.ndarray, row: np.ndarray, col: np.ndarray, b: np.ndarray, *,
             permc_spec: str, on_failure: str) -> np.ndarray:
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
def _spsolve_vjp(primals: tuple, x: np.ndarray, ct: np.ndarray, *, permc_spec: str,
                 on_failure: str) -> tuple:
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
def _spsolve_jvp(primals: tuple, x: np.ndarray, tangents: tuple, *, permc_spec: str,
                 on_failure: str) -> np.ndarray:
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


def spsolve(A: Any, b: Any, permc_spec: str | None = None, use_umfpack: bool = True, *,
            on_failure: str = "raise") -> jax.Array:
    """Solve `A x = b` for square sparse `A` with SciPy's SuperLU; differentiable.

    Args:
      A: a `jax.experimental.sparse.BCOO` or `BCSR`, a COO tuple `(data, (row, col))`
        or a CSR tuple `(data, indices, indptr)` (SciPy's constructor forms), a SciPy
        sparse matrix (a constant), or as in SciPy a dense array (with SciPy's
        `SparseEfficiencyWarning`; every entry is stored); shape `(n, n)` with
        `n = b.shape[0]`. Gradients flow to the stored values `data` (one per stored
        entry, duplicates included); the index arrays are integers.
      b: right-hand side, shape `(n,)` or `(n, k)`.
      permc_spec: SuperLU's column ordering (static; None: SciPy's default, COLAMD).
      use_umfpack: accepted for SciPy compatibility; SuperLU is always used (its
        factor is reused for the adjoint).
      on_failure: "raise" (singular matrix: an error with SuperLU's message) or "nan".

    Returns:
      `x`, shaped like `b`. One `splu` factorization serves the forward solve, the
      adjoint solve and the tangent solve (see the module docstring for the cache).

    Raises:
      SolverError: a singular matrix or a non-finite solution, with
        ``on_failure="raise"`` (eager and under `jit`).
      ValueError: as in SciPy, `A` in none of the accepted forms, a malformed `A` (not
        square, not (n, n) for `b`'s n rows, indices outside it, a BCOO with batch or
        dense dimensions, a bad CSR `indptr`) or `b` not 1-D or 2-D.

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from jaxbridge.scipy.sparse.linalg import spsolve
      >>> data, row, col = jnp.array([2.0, 1.0, 4.0]), jnp.array([0, 0, 1]), jnp.array([0, 1, 1])
      >>> [float(v) for v in spsolve((data, (row, col)), jnp.array([3.0, 4.0]))]
      [1.0, 1.0]
    """
    del use_umfpack
    permc_spec = "COLAMD" if permc_spec is None else permc_spec
    check_policy(on_failure, "sparse.linalg.spsolve")
    b = as_float_array(b, "sparse.linalg.spsolve", "b")
    if b.ndim not in (1, 2):
        raise ValueError(f"jaxbridge.scipy.sparse.linalg.spsolve: b must be 1-D or 2-D, got "
                         f"shape {b.shape}")
    data, row, col = as_coo(A, b.shape[0])
    check_real(data, "sparse.linalg.spsolve", "A")
    if not jnp.issubdtype(data.dtype, jnp.floating):
        data = data.astype(b.dtype)
    return _spsolve(data, row.astype(jnp.int32), col.astype(jnp.int32), b,
                    permc_spec=permc_spec, on_failure=on_failure)
