"""The static options of one `solve_ivp` call: one frozen object the private rules take.

`IvpConfig` is hashable (the host calls and the jitted programs are keyed on it) and
compares the user's functions by their traced structure, so repeated solves of the
same problem share JAX's caches. The choices `"auto"` resolves to (`stepping`,
`sensitivity`) are made here, once, for every path.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax.numpy as jnp
import numpy as np
import scipy.sparse

from . import _rk
from ._ode import IMPLICIT_METHODS

SENSITIVITIES = ("auto", "adjoint", "forward")
STEPPINGS = ("auto", "scipy", "compiled")
MAX_EVENTS = 16   # default slots per event function
MAX_STEPS = 4096  # default slots for SciPy's steps (t_eval=None, dense_output)
FORWARD_SENSITIVITY_MAX = 64  # augmented size n (1 + n + P) up to which "auto" -> forward


class StaticMatrix:
    """A constant matrix SciPy reads (a constant `jac`, `jac_sparsity`), dense or
    `scipy.sparse`, as a static option: hashed and compared by its content, so that the
    configuration holding it stays a cache key, and handed to SciPy as the user gave it
    (a sparse matrix keeps SciPy's sparse LU).

    >>> StaticMatrix(np.eye(2)) == StaticMatrix(scipy.sparse.eye(2).toarray())
    True
    """

    def __init__(self, matrix: Any) -> None:
        if scipy.sparse.issparse(matrix):
            self.matrix: Any = scipy.sparse.csc_matrix(matrix, dtype=np.float64)
            self.matrix.sum_duplicates()
            m = self.matrix
            parts: tuple = (m.data, m.indices, m.indptr)
        else:
            self.matrix = np.array(matrix, np.float64)
            parts = (self.matrix,)
        self.shape: tuple[int, ...] = tuple(self.matrix.shape)
        self._key = (self.sparse, self.shape, *(np.ascontiguousarray(a).tobytes()
                                                for a in parts))

    @property
    def sparse(self) -> bool:
        """Whether SciPy gets a sparse matrix."""
        return scipy.sparse.issparse(self.matrix)

    def dense(self) -> np.ndarray:
        """The matrix as a dense float64 array (what JAX's derivatives use)."""
        return self.matrix.toarray() if self.sparse else self.matrix

    def __hash__(self) -> int:
        return hash(self._key)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, StaticMatrix) and self._key == other._key


@dataclasses.dataclass(frozen=True)
class IvpConfig:
    """Everything static about one `solve_ivp` call (hashable: the host call's key).

    The fields after `capacity` are those of the events / dense output / step times
    path (`events_path`); the plain path leaves them at their defaults.
    """

    fun: Any               # the right-hand side, a HostFun
    jac: Any               # a HostFun, None (JAX's Jacobian) or False (SciPy's)
    method: str
    rtol: float | tuple    # SciPy's tolerances: a float, or one per state component
    atol: float | tuple
    adjoint_rtol: float    # tolerances of the gradient solve (adjoint or sensitivities)
    adjoint_atol: float
    sensitivity: str       # "forward" or "adjoint" (resolved from "auto")
    on_failure: str
    options: tuple         # SciPy's **options, as sorted items
    stepping: str          # "compiled" or "scipy" (resolved from "auto")
    checkpoints: int | None = None
    capacity: int = 0      # accepted steps the stiff record holds (`_stiff.max_states`)
    events: tuple = ()     # the event functions, as HostFuns
    terminal: tuple = ()   # SciPy's `terminal` per event (0: not terminal)
    direction: tuple = ()  # SciPy's `direction` per event
    max_events: int = MAX_EVENTS
    max_steps: int = MAX_STEPS
    steps: bool = False    # t_eval=None: the outputs are SciPy's step times
    dense: bool = False    # dense_output=True
    events_path: bool = False  # events, dense output or step times: SciPy's loop keeps them
    jac_matrix: StaticMatrix | None = None  # a constant `jac`, passed to SciPy as given
    jac_sparsity: StaticMatrix | None = None  # SciPy's `jac_sparsity` (Radau, BDF)

    def scipy_jac(self, jac_function: Any) -> Any:
        """What SciPy's `jac=` gets: the constant matrix (SciPy then never re-evaluates
        it, as for the user's own call) or the host function of the Jacobian (its
        values as a sparse matrix where the user gave `jac_sparsity`, so that SciPy's
        Newton iteration factors it with its sparse LU, as for SciPy's own Jacobian)."""
        if self.jac_matrix is not None:
            return self.jac_matrix.matrix
        if self.jac_sparsity is not None:
            return lambda t, y: scipy.sparse.csc_matrix(jac_function(t, y))
        return jac_function

    def state_jac_kw(self, jac_function: Any) -> dict:
        """The Jacobian arguments of SciPy's solve of the state itself (not of an
        augmented sensitivity or adjoint system): `jac` for the implicit methods unless
        `jac=False`, and `jac_sparsity` where given (SciPy's finite differences use it)."""
        kw: dict = {}
        if self.method in IMPLICIT_METHODS and self.jac is not False:
            kw["jac"] = self.scipy_jac(jac_function)
        if self.jac_sparsity is not None:
            kw["jac_sparsity"] = self.jac_sparsity.matrix
        return kw

    @property
    def scipy_tols(self) -> dict:
        """`rtol` and `atol` as `scipy.integrate.solve_ivp` takes them (arrays of one per
        state component where the user gave arrays)."""
        return {"rtol": np.asarray(self.rtol), "atol": np.asarray(self.atol)}

    @property
    def min_rtol(self) -> float:
        """The smallest `rtol` (one tolerance for a system larger than the state's)."""
        return float(np.min(self.rtol))

    @property
    def min_atol(self) -> float:
        """The smallest `atol` (a floor for Newton's corrections, the sensitivities')."""
        return float(np.min(self.atol))

    def state_atol(self, n: int) -> np.ndarray:
        """`atol` for each of the `n` state components."""
        return np.broadcast_to(np.asarray(self.atol, np.float64), (n,))

    @property
    def nodes(self) -> bool:
        """Whether the host call returns the states at SciPy's step times."""
        return self.steps or self.dense


def sensitivity_choice(sensitivity: str, n: int, P: int, compiled_implicit: bool = False
                       ) -> str:
    """"auto": forward sensitivities for a small augmented system, else the adjoint; for
    the implicit methods with compiled derivatives, always the adjoint (measured faster
    than SciPy solving the augmented sensitivity system even for n = P = 3: Robertson,
    benchmarks/RESULTS.md).

    >>> sensitivity_choice("auto", 2, 1), sensitivity_choice("auto", 20, 5)
    ('forward', 'adjoint')
    """
    if sensitivity not in SENSITIVITIES:
        raise ValueError(f"jaxbridge.scipy.integrate.solve_ivp: sensitivity must be one of "
                         f"{SENSITIVITIES}, got {sensitivity!r}")
    if sensitivity == "auto":
        if compiled_implicit:
            return "adjoint"
        return "forward" if n * (1 + n + P) <= FORWARD_SENSITIVITY_MAX else "adjoint"
    return sensitivity


def stepping_choice(stepping: str, method: str, options: tuple, name: str) -> str:
    """Who runs the step loop: "compiled" where it applies (and was not refused), else
    "scipy"; "compiled" where it does not apply raises."""
    if stepping not in STEPPINGS:
        raise ValueError(f"jaxbridge.scipy.{name}: stepping must be one of {STEPPINGS}, got "
                         f"{stepping!r}")
    x64 = jnp.result_type(float) == jnp.float64
    ok = _rk.supported(method, options) or (method in IMPLICIT_METHODS and bool(x64))
    if stepping == "compiled" and not ok:
        raise ValueError(
            f"jaxbridge.scipy.{name}: stepping='compiled' runs SciPy's explicit methods "
            f"{_rk.EXPLICIT} with the options {_rk.OPTIONS} only (and compiles the "
            f"derivatives of the implicit ones {IMPLICIT_METHODS}), with jax_enable_x64 on; "
            f"got method={method!r}, options={[k for k, _ in options]}")
    if stepping == "auto":
        return "compiled" if ok else "scipy"
    return stepping
