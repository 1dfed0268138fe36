"""Differentiable `scipy.sparse.linalg`: `spsolve` and `eigsh`, gradients w.r.t. A's nonzeros.

**spsolve.**
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

**eigsh.** `A v_i = lam_i v_i` for k eigenpairs of a symmetric A (ARPACK). With `dA`
symmetrized (the function is defined on symmetric matrices, as `jnp.linalg.eigh`):
`dlam_i = v_i^T dA v_i` and `dv_i = -(A - lam_i)^+ (I - v_i v_i^T) dA v_i`, the
pseudo-inverse on the complement of `v_i`, applied by one sparse LU of the bordered
matrix `[[A - lam_i, v_i], [v_i^T, 0]]` (nonsingular exactly when `lam_i` is simple).
The adjoint uses the same solves. A degenerate eigenvalue has no unique
eigenvector, hence no eigenvector derivative: asking for one in reverse mode raises
`SolverError` (eigenvalue gradients stay available). Forward mode cannot ask: its rule
computes every output's tangent, used or not, so a degenerate eigenvector's tangent is
NaN there (as in `jnp.linalg.eigh`), and the eigenvalues' tangents stay exact.
Eigenvector signs are fixed (largest component positive) so results are deterministic.
"""

from __future__ import annotations

import hashlib
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import scipy.sparse
import scipy.sparse.linalg

from ... import _foreign
from .._common import (
    LruCache,
    SolverError,
    as_float_array,
    check_policy,
    check_real,
    f64,
    failure,
)

__all__ = ["spsolve", "eigsh", "FACTOR_CACHE_SIZE", "factor_cache_info"]

FACTOR_CACHE_SIZE = 8
_cache = LruCache(lambda: FACTOR_CACHE_SIZE)


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


def _as_coo(A: Any, n: int | None, name: str = "spsolve"
            ) -> tuple[jax.Array, jax.Array, jax.Array]:
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


def spsolve(A: Any, b: Any, permc_spec: str | None = None, use_umfpack: bool = True, *,
            on_failure: str = "raise") -> jax.Array:
    """Solve `A x = b` for square sparse `A` with SciPy's SuperLU; differentiable.

    Args:
      A: a `jax.experimental.sparse.BCOO` or `BCSR`, a COO tuple `(data, (row, col))`
        or a CSR tuple `(data, indices, indptr)` (SciPy's constructor forms); shape
        `(n, n)` with `n = b.shape[0]`. Gradients flow to the stored values `data`
        (one per stored entry, duplicates included); the index arrays are integers.
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
      TypeError: `A` in none of the accepted forms.
      ValueError: a malformed `A` (not square, a BCOO with batch or dense dimensions,
        a bad CSR `indptr`) or `b` not 1-D or 2-D.

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
    data, row, col = _as_coo(A, b.shape[0])
    check_real(data, "sparse.linalg.spsolve", "A")
    if not jnp.issubdtype(data.dtype, jnp.floating):
        data = data.astype(b.dtype)
    return _spsolve(data, row.astype(jnp.int32), col.astype(jnp.int32), b,
                    permc_spec=permc_spec, on_failure=on_failure)


# =================================================================== eigsh
def _eig_result(data: Any, row: Any, col: Any, v0: Any, *, n: int, k: int, **_: Any) -> Any:
    return (jax.ShapeDtypeStruct((k,), data.dtype), jax.ShapeDtypeStruct((n, k), data.dtype))


def _csr(data: np.ndarray, row: np.ndarray, col: np.ndarray, n: int) -> Any:
    return scipy.sparse.coo_matrix((np.asarray(data, np.float64), (row, col)),
                                   shape=(n, n)).tocsr()


def _sym_apply(d: np.ndarray, row: np.ndarray, col: np.ndarray, n: int,
               v: np.ndarray) -> np.ndarray:
    """`(dA + dA^T)/2 @ v` for the COO perturbation `dA` with values `d`."""
    M = _csr(d, row, col, n)
    return 0.5 * (M @ v + M.T @ v)


def _sym_outer(row: np.ndarray, col: np.ndarray, u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Per stored entry: `(u[r] v[c] + u[c] v[r]) / 2` (summed over columns of u, v)."""
    return 0.5 * np.sum(u[row] * v[col] + u[col] * v[row], axis=-1)


def _degenerate(w: np.ndarray, i: int) -> float | None:
    """The gap to the nearest other computed eigenvalue when it is below round-off."""
    others = np.delete(w, i)
    if others.size == 0:
        return None
    gap = float(np.min(np.abs(others - w[i])))
    return gap if gap <= 1e-9 * max(1.0, float(np.max(np.abs(w)))) else None


def _eigenspace_problem(A: Any, w: np.ndarray, v: np.ndarray, w_bar: np.ndarray,
                        i: int) -> str | None:
    """Why the derivative of eigenvalue i is basis-dependent, or None if it is not.

    It is not when the eigenvalue is simple, or when all its copies were computed and
    have equal cotangents; the bordered matrix `[[A - lam, Vc], [Vc^T, 0]]` with the
    computed copies `Vc` is nonsingular exactly when no copy is missing.
    """
    scale = 1e-9 * max(1.0, float(np.max(np.abs(w))))
    cluster = np.flatnonzero(np.abs(w - w[i]) <= scale)
    if np.ptp(w_bar[cluster]) > 0:
        return (f"eigenvalue {i} ({w[i]:.6g}) is degenerate and the cotangents of its "
                f"{cluster.size} copies differ")
    n, Vc = v.shape[0], v[:, cluster]
    B = scipy.sparse.bmat([[A - w[i] * scipy.sparse.identity(n, format="csr"), Vc],
                           [Vc.T, None]], format="csc")
    rhs = np.concatenate([np.ones(n), np.zeros(cluster.size)])
    try:
        u = scipy.sparse.linalg.splu(B).solve(rhs)
    except RuntimeError:
        u = np.full(rhs.size, np.inf)
    if np.all(np.isfinite(u)) and np.linalg.norm(u) < 1e12 * np.sqrt(n):
        return None
    return (f"eigenvalue {i} ({w[i]:.6g}) is degenerate with an eigenvalue that was not "
            f"computed")


def _pinv_solve(A: Any, lam: float, v: np.ndarray, rhs: np.ndarray, i: int,
                w: np.ndarray, on_failure: str) -> np.ndarray:
    """`u` with `(A - lam) u = (I - v v^T) rhs`, `v^T u = 0` (the bordered system)."""
    gap = _degenerate(w, i)
    problem = None
    if gap is not None:
        problem = (f"eigenvalue {i} ({w[i]:.6g}) is degenerate (another computed eigenvalue "
                   f"is {gap:.2g} away)")
    else:
        n = v.size
        B = scipy.sparse.bmat([[A - lam * scipy.sparse.identity(n, format="csr"), v[:, None]],
                               [v[None, :], None]], format="csc")
        try:
            u = scipy.sparse.linalg.splu(B).solve(np.concatenate([rhs - v * (v @ rhs), [0.0]]))
        except RuntimeError:
            u = np.full(n + 1, np.inf)
        if np.all(np.isfinite(u)) and np.linalg.norm(u[:n]) < 1e12 * (1 + np.linalg.norm(rhs)):
            return u[:n]
        problem = (f"eigenvalue {i} ({w[i]:.6g}) is degenerate with an eigenvalue that was "
                   f"not computed (A - lambda I is singular on the complement of v)")
    if on_failure == "raise":
        raise SolverError(
            f"jaxbridge.scipy.sparse.linalg.eigsh: {problem}: its eigenvector is not unique, so "
            f"it has no derivative. Differentiate only the eigenvalues, or a quantity that "
            f"does not depend on the choice of basis in the eigenspace.")
    return np.full(v.size, np.nan)


def _start(n: int) -> np.ndarray:
    """ARPACK's starting vector when none is given: generic, but the same every call
    (SciPy draws a random one; a JAX function must be deterministic)."""
    return np.random.default_rng(20240607).uniform(-1.0, 1.0, n)


@_foreign.foreign(_eig_result)
def _eigsh(data: Any, row: Any, col: Any, v0: Any, *, n: int, k: int, sigma: Any, which: Any,
           ncv: Any, maxiter: Any, tol: Any, mode: Any, on_failure: str) -> Any:
    A = _csr(data, row, col, n)
    try:
        w, v = scipy.sparse.linalg.eigsh(
            A, k=k, sigma=sigma, which=which, v0=_start(n) if v0.size == 0 else f64(v0),
            ncv=ncv, maxiter=maxiter, tol=tol, mode=mode)
    except scipy.sparse.linalg.ArpackError as exc:  # includes ArpackNoConvergence
        if on_failure == "raise":
            raise failure("sparse.linalg.eigsh", f"ARPACK: {exc}") from None
        return np.full(k, np.nan, data.dtype), np.full((n, k), np.nan, data.dtype)
    order = np.argsort(w)
    w, v = w[order], v[:, order]
    flip = np.sign(v[np.argmax(np.abs(v), axis=0), np.arange(k)])
    v = v * np.where(flip == 0, 1.0, flip)
    return w.astype(data.dtype), v.astype(data.dtype)


@_eigsh.defvjp
def _eigsh_vjp(primals: tuple, out: Any, ct: Any, *, n: int, k: int, on_failure: str,
               **_: Any) -> Any:
    data, row, col, v0 = primals
    w, v = f64(out[0]), f64(out[1])
    w_bar, v_bar = f64(ct[0]), f64(ct[1])
    if not np.all(np.isfinite(w)):
        return np.full(data.shape, np.nan, data.dtype), None, None, None
    A = _csr(data, row, col, n)
    for i in map(int, np.flatnonzero(w_bar)):  # each needs its whole eigenspace
        problem = _eigenspace_problem(A, w, v, w_bar, i)
        if problem is not None:
            if on_failure == "raise":
                raise SolverError(
                    f"jaxbridge.scipy.sparse.linalg.eigsh: {problem}, so the gradient depends "
                    f"on an arbitrary basis of the eigenspace. Compute (with k) and weight "
                    f"all copies of a degenerate eigenvalue equally, e.g. differentiate "
                    f"their sum.")
            return np.full(data.shape, np.nan, data.dtype), None, None, None
    d_bar = _sym_outer(row, col, v * w_bar, v)
    for i in range(k):
        if np.any(v_bar[:, i]):
            u = _pinv_solve(A, w[i], v[:, i], v_bar[:, i], i, w, on_failure)
            d_bar = d_bar - _sym_outer(row, col, u[:, None], v[:, i:i + 1])
    return d_bar.astype(data.dtype), None, None, None


@_eigsh.defjvp
def _eigsh_jvp(primals: tuple, out: Any, tangents: Any, *, n: int, k: int,
               **_: Any) -> Any:
    data, row, col, v0 = primals
    d_data = tangents[0]
    w, v = f64(out[0]), f64(out[1])
    if d_data is None:
        return None
    if not np.all(np.isfinite(w)):
        return np.full(k, np.nan, data.dtype), np.full((n, k), np.nan, data.dtype)
    dAv = _sym_apply(f64(d_data), row, col, n, v)
    dw = np.einsum("ik,ik->k", v, dAv)
    A = _csr(data, row, col, n)
    # "nan", whatever the policy: the rule cannot tell whether dv is used, and
    # `jacfwd` of the eigenvalues alone must not fail on a degenerate pair.
    dv = np.stack([-_pinv_solve(A, w[i], v[:, i], dAv[:, i], i, w, "nan")
                   for i in range(k)], axis=1)
    return dw.astype(data.dtype), dv.astype(data.dtype)


def eigsh(A: Any, k: int = 6, M: Any = None, sigma: float | None = None, which: str = "LM",
          v0: Any = None, ncv: int | None = None, maxiter: int | None = None,
          tol: float = 0, return_eigenvectors: bool = True, Minv: Any = None,
          OPinv: Any = None, mode: str = "normal", rng: Any = None, *,
          on_failure: str = "raise") -> Any:
    """`scipy.sparse.linalg.eigsh`: k eigenpairs of a symmetric matrix; differentiable in A.

    Same signature and results as SciPy: `(w, v)` (eigenvalues ascending, `v[:, i]`
    the unit eigenvectors), or `w` with `return_eigenvectors=False`.

    Args:
      A: symmetric, a `jax.experimental.sparse.BCOO`/`BCSR` (gradients flow to its
        stored values), a dense array (gradient: the whole matrix), or a SciPy sparse
        matrix (a constant). Perturbations are symmetrized, as in `jnp.linalg.eigh`.
      k: the number of eigenpairs, as in SciPy (ARPACK).
      M: the generalized problem is not supported (raises, naming the argument).
      sigma: as in SciPy: selects shift-invert mode.
      which: as in SciPy ("LM", "SA", ...).
      v0: as in SciPy. The result does not depend on it (zero gradient, correctly);
        without one, a fixed generic start vector is used (SciPy draws a random
        one), so results are deterministic.
      ncv: as in SciPy.
      maxiter: as in SciPy.
      tol: as in SciPy (0: machine precision).
      return_eigenvectors: as in SciPy: False returns `w` alone.
      Minv: custom operators are not supported (raises, naming the argument).
      OPinv: custom operators are not supported (raises, naming the argument).
      mode: as in SciPy (with `sigma`).
      rng: not supported (raises, naming the argument); see `v0`.
      on_failure: "raise" (ARPACK's failure, or a reverse-mode eigenvector derivative
        asked of a degenerate eigenvalue: `jaxbridge.scipy.SolverError`) or "nan". In
        forward mode a degenerate eigenvector's tangent is NaN under either policy (the
        rule computes it whether or not it is used; the eigenvalues' stay exact).

    Returns:
      ``(w, v)``: the eigenvalues, shape ``(k,)``, ascending, and the unit
      eigenvectors as columns, shape ``(n, k)``; or ``w`` alone with
      ``return_eigenvectors=False``. Both differentiable in `A`.

    Raises:
      SolverError: see `on_failure`.
      NotImplementedError: `M`, `Minv`, `OPinv` or `rng` given.
      TypeError: `A` not a square BCOO/BCSR, dense array or SciPy sparse matrix.
      ValueError: not ``0 < k < n``.

    Gradients: eigenvalues `dlam = v^T dA v`; eigenvectors through one bordered
    sparse solve per eigenpair (see the module docstring). Eigenvector signs are
    normalized (largest component positive).

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from jaxbridge.scipy.sparse.linalg import eigsh
      >>> A = jnp.diag(jnp.arange(1.0, 7.0)) + 0.1 * (jnp.eye(6, k=1) + jnp.eye(6, k=-1))
      >>> w = eigsh(A, k=2, return_eigenvectors=False)
      >>> [round(float(x), 4) for x in w]
      [5.0, 6.01]
      >>> g = jax.grad(lambda A: eigsh(A, k=1, return_eigenvectors=False)[0])(A)
      >>> round(float(g[5, 5]), 4)  # v_5^2 of the top eigenvector
      0.9902
    """
    name = "sparse.linalg.eigsh"
    check_policy(on_failure, name)
    for arg, value in (("M", M), ("Minv", Minv), ("OPinv", OPinv), ("rng", rng)):
        if value is not None:
            raise NotImplementedError(
                f"jaxbridge.scipy.{name}: `{arg}` is not supported (the generalized problem "
                f"and custom operators have no derivative rule here)")
    from jax.experimental import sparse as jsparse
    shape = getattr(A, "shape", None)
    if shape is None or len(shape) != 2 or shape[0] != shape[1]:
        raise TypeError(f"jaxbridge.scipy.{name}: A must be a square BCOO/BCSR, dense array or "
                        f"SciPy sparse matrix; got {type(A).__name__} of shape {shape}")
    n = int(shape[0])
    if not 0 < k < n:
        raise ValueError(f"jaxbridge.scipy.{name}: k must satisfy 0 < k < n = {n} (ARPACK), "
                         f"got {k}")
    if isinstance(A, (jsparse.BCOO, jsparse.BCSR)) or scipy.sparse.issparse(A):
        data, row, col = _as_coo(A, n, "eigsh")
    else:
        data, row, col = _as_coo(jnp.asarray(A), None, "eigsh")
    data = as_float_array(data, name, "A")
    v0 = jnp.zeros(0, data.dtype) if v0 is None else jax.lax.stop_gradient(
        jnp.asarray(v0, data.dtype).reshape(n))
    w, v = _eigsh(data, row.astype(jnp.int32), col.astype(jnp.int32), v0, n=n, k=int(k),
                  sigma=None if sigma is None else float(sigma), which=which,
                  ncv=ncv, maxiter=maxiter, tol=float(tol), mode=mode,
                  on_failure=on_failure)
    return (w, v) if return_eigenvectors else w
