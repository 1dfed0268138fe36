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

The package keeps SciPy's layout: `_spsolve` (with its factor cache), `_eigsh`,
`_coo` (the matrix forms both accept, as COO triples) and `_gmres` (the compiled
GMRES that `optimize`'s Newton-Krylov root and its tangent solves run).
"""

from ._eigsh import eigsh
from ._spsolve import factor_cache_info, spsolve

__all__ = ["spsolve", "eigsh", "FACTOR_CACHE_SIZE", "factor_cache_info"]

#: How many SuperLU factorizations `spsolve` keeps (read at each insertion: set it here).
FACTOR_CACHE_SIZE = 8
