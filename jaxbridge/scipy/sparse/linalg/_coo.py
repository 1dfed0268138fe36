"""The forms a sparse (or dense) matrix is given in, as COO triples (data, row, col)."""

from __future__ import annotations

import warnings
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import scipy.sparse


def as_coo(A: Any, n: int | None,
           name: str = "spsolve") -> tuple[jax.Array, jax.Array, jax.Array]:
    """(data, row, col) from a BCOO/BCSR, a SciPy sparse matrix (constant), or (spsolve)
    a SciPy-style constructor tuple or a dense array."""
    from jax.experimental import sparse as jsparse

    if scipy.sparse.issparse(A):  # a constant matrix: no gradient flows to it
        if n is not None and A.shape != (n, n):
            raise shape_error(A.shape, n)
        coo = scipy.sparse.coo_matrix(A)
        return jnp.asarray(coo.data), jnp.asarray(coo.row), jnp.asarray(coo.col)
    if isinstance(A, jsparse.BCOO):
        if A.n_batch or A.n_dense or A.ndim != 2:
            raise ValueError("jaxbridge.scipy.sparse.linalg.spsolve: BCOO must be a plain 2-D "
                             "matrix (no batch or dense dimensions)")
        if n is not None and A.shape != (n, n):
            raise shape_error(A.shape, n)
        return A.data, A.indices[:, 0], A.indices[:, 1]
    if isinstance(A, jsparse.BCSR):
        if n is not None and A.shape != (n, n):
            raise shape_error(A.shape, n)
        A = (A.data, A.indices, A.indptr)
    if n is None:
        raise TypeError(
            f"jaxbridge.scipy.sparse.linalg.{name}: A must be a jax.experimental.sparse.BCOO "
            f"or BCSR, a SciPy sparse matrix or a dense array; got {type(A).__name__}")
    if isinstance(A, tuple) and len(A) == 2 and isinstance(A[1], tuple) and len(A[1]) == 2:
        data, (row, col) = A  # COO: (data, (row, col))
        row, col = jnp.asarray(row), jnp.asarray(col)
        _check_indices(row, col, n)
        return jnp.asarray(data), row, col
    if isinstance(A, tuple) and len(A) == 3:
        data, indices, indptr = (jnp.asarray(v) for v in A)  # CSR
        if indptr.shape != (n + 1,):
            raise ValueError(f"jaxbridge.scipy.sparse.linalg.spsolve: CSR indptr must have "
                             f"length n + 1 = {n + 1}, got {indptr.shape}")
        row = jnp.repeat(jnp.arange(n, dtype=indices.dtype), jnp.diff(indptr),
                         total_repeat_length=data.shape[0])
        _check_indices(row, indices, n)
        return data, row, indices
    return _dense(A, n)


def _dense(A: Any, n: int) -> tuple[jax.Array, jax.Array, jax.Array]:
    """spsolve's dense `A` (SciPy converts it to CSC, with a SparseEfficiencyWarning):
    every entry stored, so gradients flow to each; anything else is SciPy's ValueError."""
    try:
        dense: Any = jnp.asarray(A)
    except (TypeError, ValueError):
        dense = None
    if dense is None or dense.ndim != 2 or not (jnp.issubdtype(dense.dtype, jnp.number) or
                                                dense.dtype == jnp.bool_):
        raise ValueError(
            "jaxbridge.scipy.sparse.linalg.spsolve: A must be a jax.experimental.sparse.BCOO "
            "or BCSR, a SciPy sparse matrix, a COO tuple (data, (row, col)), a CSR tuple "
            f"(data, indices, indptr) or a dense 2-D array; got {type(A).__name__}")
    if dense.shape != (n, n):
        raise shape_error(dense.shape, n)
    warnings.warn("jaxbridge.scipy.sparse.linalg.spsolve: A is dense; it is solved as a "
                  "sparse matrix with every entry stored (SciPy's spsolve requires A be CSC "
                  "or CSR matrix format)", scipy.sparse.SparseEfficiencyWarning, stacklevel=4)
    row, col = jnp.meshgrid(jnp.arange(n), jnp.arange(n), indexing="ij")
    return dense.ravel(), row.ravel(), col.ravel()


def shape_error(shape: tuple, n: int) -> ValueError:
    """spsolve's error for an `A` of the wrong shape for `b` of `n` rows (SciPy's
    ValueError: "matrix must be square", "matrix - rhs dimension mismatch")."""
    if len(shape) != 2 or shape[0] != shape[1]:
        return ValueError(f"jaxbridge.scipy.sparse.linalg.spsolve: A must be square, got "
                          f"shape {tuple(shape)}")
    return ValueError(f"jaxbridge.scipy.sparse.linalg.spsolve: A of shape {tuple(shape)} "
                      f"does not match b's {n} rows (A x = b needs A of shape ({n}, {n}))")


def _check_indices(row: jax.Array, col: jax.Array, n: int) -> None:
    """A constructor tuple's indices lie in the (n, n) matrix `b` implies (checked when
    concrete; SciPy's ValueError: "row index exceeds matrix dimensions")."""
    try:
        r, c = np.asarray(row), np.asarray(col)
    except (jax.errors.ConcretizationTypeError, jax.errors.TracerArrayConversionError):
        return
    for what, idx in (("row", r), ("column", c)):
        if idx.size and (idx.min() < 0 or idx.max() >= n):
            raise ValueError(f"jaxbridge.scipy.sparse.linalg.spsolve: A's {what} indices must "
                             f"lie in [0, {n}) (A is (n, n) with n = b.shape[0] = {n}); got "
                             f"{what} indices from {idx.min()} to {idx.max()}")
