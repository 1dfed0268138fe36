"""The forms a sparse (or dense) matrix is given in, as COO triples (data, row, col)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import scipy.sparse


def as_coo(A: Any, n: int | None,
           name: str = "spsolve") -> tuple[jax.Array, jax.Array, jax.Array]:
    """(data, row, col) from a BCOO/BCSR, a SciPy sparse matrix (constant), a dense
    array (eigsh), or a SciPy-style constructor tuple (spsolve)."""
    from jax.experimental import sparse as jsparse

    if scipy.sparse.issparse(A):  # a constant matrix: no gradient flows to it
        coo = scipy.sparse.coo_matrix(A)
        return jnp.asarray(coo.data), jnp.asarray(coo.row), jnp.asarray(coo.col)
    if name == "eigsh" and isinstance(A, (jax.Array, np.ndarray)):
        A = jnp.asarray(A)
        if A.ndim != 2 or A.shape[0] != A.shape[1]:
            raise ValueError(f"jaxbridge.scipy.sparse.linalg.eigsh: A must be square, got "
                             f"shape {A.shape}")
        row, col = jnp.meshgrid(jnp.arange(A.shape[0]), jnp.arange(A.shape[0]), indexing="ij")
        return A.ravel(), row.ravel(), col.ravel()
    if isinstance(A, jsparse.BCOO):
        if A.n_batch or A.n_dense or A.ndim != 2:
            raise ValueError("jaxbridge.scipy.sparse.linalg.spsolve: BCOO must be a plain 2-D "
                             "matrix (no batch or dense dimensions)")
        return A.data, A.indices[:, 0], A.indices[:, 1]
    if isinstance(A, jsparse.BCSR):
        A = (A.data, A.indices, A.indptr)
    if n is None:
        raise TypeError(
            f"jaxbridge.scipy.sparse.linalg.{name}: A must be a jax.experimental.sparse.BCOO "
            f"or BCSR, a SciPy sparse matrix or a dense array; got {type(A).__name__}")
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
        "BCSR, a SciPy sparse matrix, a COO tuple (data, (row, col)) or a CSR tuple "
        f"(data, indices, indptr); got {type(A).__name__}")
