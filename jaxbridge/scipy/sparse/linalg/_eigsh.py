"""`eigsh`: ARPACK's symmetric eigenpairs, with eigenvalue and eigenvector derivatives."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import scipy.sparse
import scipy.sparse.linalg

from .... import _foreign
from ..._common import SolverError, as_float_array, check_policy, f64, failure
from ._coo import as_coo


@dataclasses.dataclass(frozen=True)
class EigshOptions:
    """The static arguments of one eigsh call (SciPy's names; `n` is A's order)."""

    n: int
    k: int
    sigma: float | None = None
    which: str = "LM"
    ncv: int | None = None
    maxiter: int | None = None
    tol: float = 0.0
    mode: str = "normal"
    on_failure: str = "raise"
    dense: bool = False  # A came dense: `data` is the (n, n) matrix; row, col are empty


def _eig_result(data: Any, row: Any, col: Any, v0: Any, *, opts: EigshOptions) -> Any:
    n, k = opts.n, opts.k
    return (jax.ShapeDtypeStruct((k,), data.dtype), jax.ShapeDtypeStruct((n, k), data.dtype))


def _csr(data: np.ndarray, row: np.ndarray, col: np.ndarray, n: int) -> Any:
    return scipy.sparse.coo_matrix((np.asarray(data, np.float64), (row, col)),
                                   shape=(n, n)).tocsr()


@functools.lru_cache(maxsize=8)
def _grid(n: int) -> tuple[np.ndarray, np.ndarray]:
    """The row and column of each entry of a dense (n, n) matrix, row-major (read-only:
    every call of the rules shares them)."""
    row, col = (a.ravel() for a in np.indices((n, n), dtype=np.int32))
    row.flags.writeable = col.flags.writeable = False
    return row, col


def _entries(data: np.ndarray, row: np.ndarray, col: np.ndarray,
             opts: EigshOptions) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A's stored values with their rows and columns (for a dense A, every entry)."""
    return (np.ravel(data), *_grid(opts.n)) if opts.dense else (data, row, col)


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
def _eigsh(data: Any, row: Any, col: Any, v0: Any, *, opts: EigshOptions) -> Any:
    n, k = opts.n, opts.k
    # A dense matrix stays dense, as in SciPy: ARPACK's ~100s of products then cost a
    # BLAS matvec each, not a sparse product over every entry and its Python dispatch
    # (eigsh of a dense 100x100 matrix: 2x SciPy's time through CSR); and it goes to the
    # host call as it is, without the (row, col) grid of its entries.
    A = f64(data) if opts.dense else _csr(data, row, col, n)
    try:
        w, v = scipy.sparse.linalg.eigsh(
            A, k=k, sigma=opts.sigma, which=opts.which,
            v0=_start(n) if v0.size == 0 else f64(v0), ncv=opts.ncv, maxiter=opts.maxiter,
            tol=opts.tol, mode=opts.mode)
    except scipy.sparse.linalg.ArpackError as exc:  # includes ArpackNoConvergence
        if opts.on_failure == "raise":
            raise failure("sparse.linalg.eigsh", f"ARPACK: {exc}") from None
        return np.full(k, np.nan, data.dtype), np.full((n, k), np.nan, data.dtype)
    order = np.argsort(w)
    w, v = w[order], v[:, order]
    flip = np.sign(v[np.argmax(np.abs(v), axis=0), np.arange(k)])
    v = v * np.where(flip == 0, 1.0, flip)
    return w.astype(data.dtype), v.astype(data.dtype)


@_eigsh.defvjp
def _eigsh_vjp(primals: tuple, out: Any, ct: Any, *, opts: EigshOptions) -> Any:
    n, k, on_failure = opts.n, opts.k, opts.on_failure
    data, row, col = _entries(primals[0], primals[1], primals[2], opts)
    shape, dtype = primals[0].shape, primals[0].dtype
    w, v = f64(out[0]), f64(out[1])
    w_bar, v_bar = f64(ct[0]), f64(ct[1])
    if not np.all(np.isfinite(w)):
        return np.full(shape, np.nan, dtype), None, None, None
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
            return np.full(shape, np.nan, dtype), None, None, None
    d_bar = _sym_outer(row, col, v * w_bar, v)
    for i in range(k):
        if np.any(v_bar[:, i]):
            u = _pinv_solve(A, w[i], v[:, i], v_bar[:, i], i, w, on_failure)
            d_bar = d_bar - _sym_outer(row, col, u[:, None], v[:, i:i + 1])
    return d_bar.reshape(shape).astype(dtype), None, None, None


@_eigsh.defjvp
def _eigsh_jvp(primals: tuple, out: Any, tangents: Any, *, opts: EigshOptions) -> Any:
    n, k = opts.n, opts.k
    data, row, col = _entries(primals[0], primals[1], primals[2], opts)
    d_data = tangents[0]
    w, v = f64(out[0]), f64(out[1])
    if d_data is None:
        return None
    if not np.all(np.isfinite(w)):
        return np.full(k, np.nan, data.dtype), np.full((n, k), np.nan, data.dtype)
    dAv = _sym_apply(f64(np.ravel(d_data)), row, col, n, v)
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
    check_policy(on_failure, "sparse.linalg.eigsh")
    _check_supported(M=M, Minv=Minv, OPinv=OPinv, rng=rng)
    n = _order(A, k)
    opts = EigshOptions(n=n, k=int(k), sigma=None if sigma is None else float(sigma),
                        which=which, ncv=ncv, maxiter=maxiter, tol=float(tol), mode=mode,
                        on_failure=on_failure)
    w, v = _eigenpairs(A, v0, opts)
    return (w, v) if return_eigenvectors else w


def _check_supported(**given: Any) -> None:
    """NotImplementedError naming the first of SciPy's arguments given that has no rule."""
    for arg, value in given.items():
        if value is not None:
            raise NotImplementedError(
                f"jaxbridge.scipy.sparse.linalg.eigsh: `{arg}` is not supported (the "
                f"generalized problem and custom operators have no derivative rule here)")


def _order(A: Any, k: int) -> int:
    """A's order n, checked: A square and 0 < k < n."""
    shape = getattr(A, "shape", None)
    if shape is None or len(shape) != 2 or shape[0] != shape[1]:
        # SciPy's types: a matrix of the wrong shape is a ValueError, no matrix a TypeError
        kind = TypeError if shape is None else ValueError
        raise kind(f"jaxbridge.scipy.sparse.linalg.eigsh: A must be a square BCOO/BCSR, "
                   f"dense array or SciPy sparse matrix; got {type(A).__name__} of shape "
                   f"{shape}")
    n = int(shape[0])
    if not 0 < k < n:
        raise ValueError(f"jaxbridge.scipy.sparse.linalg.eigsh: k must satisfy 0 < k < n = "
                         f"{n} (ARPACK), got {k}")
    return n


def _eigenpairs(A: Any, v0: Any, opts: EigshOptions) -> tuple[jax.Array, jax.Array]:
    """(w, v) of A in any accepted form, differentiable in its stored values."""
    from jax.experimental import sparse as jsparse

    n = opts.n
    row: Any
    col: Any
    if isinstance(A, (jsparse.BCOO, jsparse.BCSR)) or scipy.sparse.issparse(A):
        data, row, col = as_coo(A, n, "eigsh")
        row, col = row.astype(jnp.int32), col.astype(jnp.int32)
    else:  # dense: the matrix itself (its gradient: the whole matrix)
        data, row, col = A, _NO_INDICES, _NO_INDICES
        opts = dataclasses.replace(opts, dense=True)
    data = as_float_array(data, "sparse.linalg.eigsh", "A")
    v0 = jnp.zeros(0, data.dtype) if v0 is None else jax.lax.stop_gradient(
        jnp.asarray(v0, data.dtype).reshape(n))
    return _eigsh(data, row, col, v0, opts=opts)


_NO_INDICES = np.zeros(0, np.int32)
