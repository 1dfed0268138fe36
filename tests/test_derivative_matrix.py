"""The derivative coverage matrix: every public differentiable function of jaxbridge,
every differentiable argument, every differentiation mode, checked against a reference.

One row per (function, differentiable argument, input regime); one column per mode:

  jvp           ``jax.jvp`` along a random tangent (eager)       vs ``J t``
  jacfwd        ``jax.jit(jax.jacfwd(f))``                       vs ``J``
  vjp           ``jax.vjp`` with a random cotangent (eager)      vs ``J^T c``
  jacrev        ``jax.jit(jax.jacrev(f))``                       vs ``J``
  vmap.jacfwd   ``jax.jit(jax.vmap(jax.jacfwd(f)))`` over B points: EVERY batch element
  vmap.jacrev   ``jax.jit(jax.vmap(jax.jacrev(f)))`` over B points: EVERY batch element

in float64 and float32. The reference Jacobian ``J`` is always float64: either the
Jacobian of a jnp twin (a closed form or a pure-JAX solver of the same problem) or
finite differences of the function itself (Ridders' extrapolation with an error bound
per element, `jaxbridge._testing._fd.ridders`, the rule checker's own machinery).

Coverage is enforced, not hoped for: `test_every_public_function_has_rows` lists the
public functions from the modules' ``__all__`` and fails for one without a row, and
`test_every_parameter_is_covered_or_declared` fails for a parameter that is neither
differentiated by some row nor declared static / without derivative (with the reason)
in `NOT_DIFFERENTIABLE`. Derivatives that the documentation says do not exist (NaN by
design) are cells too: they check that the NaN appears (never a silent zero).

Adding a function is one `Row(...)` entry in `ROWS` (plus its static parameters in
`NOT_DIFFERENTIABLE`); a new module is one line in `MODULES`. Run with ``-s`` to see the
matrix printed.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import extension_missing

import jaxbridge.ops as ops
from jaxbridge._testing._fd import element_scales, ridders
from jaxbridge.scipy import integrate, optimize, signal, special
from jaxbridge.scipy.sparse import linalg as sparse_linalg

#: Public modules whose functions the matrix must cover (``__all__`` is the list).
MODULES = (
    "jaxbridge.scipy.integrate",
    "jaxbridge.scipy.optimize",
    "jaxbridge.scipy.signal",
    "jaxbridge.scipy.special",
    "jaxbridge.scipy.sparse.linalg",
    "jaxbridge.ops",
)

#: Public callables that are not differentiable functions, with the reason.
NOT_FUNCTIONS = {
    "jaxbridge.scipy.sparse.linalg.factor_cache_info": "cache statistics (no array inputs)",
    "jaxbridge.ops.available": "reports whether the extension is built",
    "jaxbridge.ops.export_checks": "lists the kernels' jax.export checks",
}

MODES = ("jvp", "jacfwd", "vjp", "jacrev", "vmap.jacfwd", "vmap.jacrev")
DTYPES = ("float64", "float32")

_FLOAT32_OFF = "the function computes in float64 whatever the input dtype"

# ------------------------------------------------------------------ the rows


@dataclasses.dataclass(frozen=True, eq=False)  # hashed by identity (functools.cache)
class Row:
    """One function, one differentiated argument, one input regime.

    Attributes:
      function: the public name, ``module.name`` without the ``jaxbridge.`` prefix.
      param: the signature parameter that is differentiated (``fun`` for arrays the
        user's function closes over).
      regime: what this row's inputs exercise (shown in the matrix).
      f: ``f(p) -> array``: the function of the differentiated argument (1-D ``p``).
      points: B >= 2 points (float64, 1-D) of the same shape; point 0 is used by the
        unbatched modes, all of them by the vmap modes.
      twin: a jnp function of `p` computing the same values (its JAX Jacobian is the
        reference); None: float64 finite differences of `f` are the reference.
      nan: the documented behaviour is a NaN derivative (no derivative exists).
      rtol, atol: tolerances in float64 (atol relative to max |J|); float32 uses
        ``max(rtol, rtol32)``.
      dtypes: the dtypes the row runs in.
      slow: run every cell of the row only with ``-m slow`` (else see `DEFAULT_CELLS`).
      default: for solver rows, the float64 modes of the default run (the others, and
        rows without any, run with ``-m slow``: each solver cell costs seconds).
    """

    function: str
    param: str
    regime: str
    f: Callable[[jax.Array], jax.Array]
    points: tuple[np.ndarray, ...]
    twin: Callable[[jax.Array], jax.Array] | None = None
    nan: bool = False
    rtol: float = 1e-6
    atol: float = 1e-9
    rtol32: float = 2e-3
    dtypes: tuple[str, ...] = DTYPES
    slow: bool = False
    default: tuple[str, ...] = ()

    @property
    def heavy(self) -> bool:
        """A solver row (each cell compiles and runs iterative solves)."""
        return self.function.split(".")[1] in ("integrate", "optimize")

    @property
    def id(self) -> str:
        return f"{self.function}:{self.param}[{self.regime}]"


def _pts(*ps: Sequence[float]) -> tuple[np.ndarray, ...]:
    return tuple(np.asarray(p, np.float64) for p in ps)


def _like(v: float, x: jax.Array) -> jax.Array:
    """A constant argument in `x`'s dtype (a Python float would promote float32 to float64:
    the special functions take the result type of all their arguments as arrays)."""
    return jnp.asarray(v, x.dtype)


# ---- scipy.special: elementwise; finite differences across the real domain
def _special_rows() -> list[Row]:
    rows = []
    elementwise = {
        # name: (function of x, points spanning the domain, regime)
        "kv": (
            lambda x: special.kv(_like(1.5, x), x),
            _pts([0.05, 0.7, 4.0, 30.0], [0.2, 1.5, 9.0, 60.0]),
            "x>0 incl. near the pole at 0",
        ),
        "kve": (
            lambda x: special.kve(_like(1.5, x), x),
            _pts([0.05, 0.7, 4.0, 30.0], [0.2, 1.5, 9.0, 60.0]),
            "x>0 incl. near the pole at 0",
        ),
        "iv": (
            lambda x: special.iv(_like(1.0, x), x),
            _pts([-3.0, -0.4, 0.3, 5.0], [-6.0, -1.0, 1.0, 2.5]),
            "x<0 and x>0 (integer order)",
        ),
        "ive": (
            lambda x: special.ive(_like(1.0, x), x),
            _pts([-2.0, -0.5, 0.3, 3.0], [-40.0, -7.0, 0.8, 60.0]),
            "x<0 and x>0 (integer order)",
        ),
        "hyp1f1": (
            lambda x: special.hyp1f1(_like(0.5, x), _like(1.5, x), x),
            _pts([-4.0, -0.5, 0.5, 3.0], [-9.0, -1.5, 1.5, 6.0]),
            "x<0 and x>0",
        ),
        "ellipk": (
            lambda m: special.ellipk(m),
            _pts([-3.0, 0.0, 0.5, 0.999], [-0.5, 0.1, 0.9, 0.99]),
            "m<0, m=0, near the branch point m=1",
        ),
        "ellipe": (
            lambda m: special.ellipe(m),
            _pts([-3.0, 0.0, 0.5, 0.999], [-0.5, 0.1, 0.9, 0.99]),
            "m<0, m=0, near the branch point m=1",
        ),
        "erfcx": (
            lambda x: special.erfcx(x),
            _pts([-2.0, -0.3, 1.0, 30.0, 80.0], [-1.0, 0.0, 3.0, 49.0, 51.0]),
            "x<0, 0, the asymptotic branch |x|>50",
        ),
        "erfi": (
            lambda x: special.erfi(x),
            _pts([-2.0, 0.0, 0.5, 3.0], [-0.7, -3.0, 1.0, 2.0]),
            "x<0, 0, x>0",
        ),
        "dawsn": (
            lambda x: special.dawsn(x),
            _pts([-60.0, -1.0, 0.2, 2.0, 70.0], [-3.0, 0.0, 0.7, 49.0, 51.0]),
            "x<0, 0, the asymptotic branch |x|>50",
        ),
    }
    for name, (fn, points, regime) in elementwise.items():
        param = "m" if name.startswith("ellip") else "x"
        rows.append(Row(f"scipy.special.{name}", param, regime, fn, points))
    # The order (and hyp1f1's a, b): no closed-form derivative; documented as NaN.
    for name, param, fn in (
        ("kv", "v", lambda v: special.kv(v, _like(2.0, v))),
        ("kve", "v", lambda v: special.kve(v, _like(2.0, v))),
        ("iv", "v", lambda v: special.iv(v, _like(2.0, v))),
        ("ive", "v", lambda v: special.ive(v, _like(2.0, v))),
        ("hyp1f1", "a", lambda a: special.hyp1f1(a, _like(1.5, a), _like(2.0, a))),
        ("hyp1f1", "b", lambda b: special.hyp1f1(_like(0.5, b), b, _like(2.0, b))),
    ):
        rows.append(
            Row(f"scipy.special.{name}", param, "documented NaN", fn, _pts([0.5], [2.5]), nan=True)
        )
    return rows


# ---- scipy.signal.lfilter: every argument, finite differences
_B, _A = np.array([0.5, 0.3, -0.2]), np.array([1.0, -0.6, 0.25])
_X, _ZI = np.array([1.0, -2.0, 0.5, 3.0, 0.0, -1.0, 2.0, 0.7]), np.array([0.3, -0.4])


def _lfilter_rows() -> list[Row]:
    def at(which: str) -> Callable:
        def f(p: jax.Array) -> jax.Array:
            kw = {"b": _B, "a": _A, "x": _X, "zi": _ZI}
            kw = {k: jnp.asarray(v, p.dtype) for k, v in kw.items()}
            kw[which] = p
            y, zf = signal.lfilter(kw["b"], kw["a"], kw["x"], zi=kw["zi"])
            return jnp.concatenate([y, zf])

        return f

    base = {"b": _B, "a": _A, "x": _X, "zi": _ZI}
    return [
        Row(
            "scipy.signal.lfilter",
            k,
            "stable filter, with zi",
            at(k),
            _pts(v, v * np.linspace(0.8, 1.1, v.size)),
        )
        for k, v in base.items()
    ] + [
        # Two channels (x and zi 2-D, filtered along the last axis): the rules must use
        # the time axis, not the first one (two mutants that swapped them survived the
        # 1-D rows: tests/MUTATION.md).
        Row(
            "scipy.signal.lfilter",
            "x",
            "2 channels (2-D x and zi)",
            lambda p: jnp.concatenate(
                [
                    jnp.ravel(v)
                    for v in signal.lfilter(
                        jnp.asarray(_B, p.dtype),
                        jnp.asarray(_A, p.dtype),
                        p.reshape(2, 8),
                        zi=jnp.asarray(np.stack([_ZI, -_ZI]), p.dtype),
                    )
                ]
            ),
            _pts(np.concatenate([_X, _X[::-1]]), np.concatenate([-_X, 0.5 * _X])),
        )
    ]


# ---- scipy.sparse.linalg: jnp twins (dense solve, eigh)
_ROW, _COL = np.array([0, 0, 1, 1, 1, 2, 2]), np.array([0, 1, 0, 1, 2, 1, 2])
_DATA, _RHS = np.array([4.0, 1.0, -1.0, 5.0, 2.0, 0.5, 3.0]), np.array([1.0, -2.0, 0.5])


def _dense(data: jax.Array) -> jax.Array:
    return jnp.zeros((3, 3), data.dtype).at[_ROW, _COL].add(data)


def _eig_matrix(s: jax.Array) -> jax.Array:
    """A symmetric 5x5 matrix from its 15 upper-triangle entries plus a spread diagonal."""
    iu = np.triu_indices(5)
    U = jnp.zeros((5, 5), s.dtype).at[iu].set(s)
    return U + U.T - jnp.diag(jnp.diag(U)) + jnp.diag(jnp.arange(1.0, 6.0, dtype=s.dtype) * 2)


def _eig_twin(s: jax.Array) -> jax.Array:
    w, v = jnp.linalg.eigh(_eig_matrix(s))
    w, v = w[-2:], v[:, -2:]
    big = jnp.take_along_axis(v, jnp.argmax(jnp.abs(v), axis=0)[None], axis=0)
    return jnp.concatenate([w, (v * jnp.sign(big)).ravel()])


def _eig_ours(s: jax.Array) -> jax.Array:
    w, v = sparse_linalg.eigsh(_eig_matrix(s), k=2)
    return jnp.concatenate([w, v.ravel()])


def _sparse_rows() -> list[Row]:
    s0 = np.random.default_rng(1).uniform(-0.3, 0.3, 15)
    s1 = np.random.default_rng(2).uniform(-0.3, 0.3, 15)
    return [
        Row(
            "scipy.sparse.linalg.spsolve",
            "A",
            "COO data, duplicates-free",
            lambda d: sparse_linalg.spsolve(
                (d, (jnp.asarray(_ROW), jnp.asarray(_COL))), jnp.asarray(_RHS, d.dtype)
            ),
            _pts(_DATA, _DATA * 1.3 - 0.2),
            twin=lambda d: jnp.linalg.solve(_dense(d), jnp.asarray(_RHS, d.dtype)),
        ),
        Row(
            "scipy.sparse.linalg.spsolve",
            "b",
            "right-hand side",
            lambda b: sparse_linalg.spsolve(
                (jnp.asarray(_DATA, b.dtype), (jnp.asarray(_ROW), jnp.asarray(_COL))), b
            ),
            _pts(_RHS, -2 * _RHS + 1),
            twin=lambda b: jnp.linalg.solve(_dense(jnp.asarray(_DATA, b.dtype)), b),
        ),
        Row(
            "scipy.sparse.linalg.eigsh",
            "A",
            "dense symmetric, top-2 pairs (w and v)",
            _eig_ours,
            _pts(s0, s1),
            twin=_eig_twin,
            rtol=1e-6,
            atol=1e-8,
            rtol32=5e-3,
        ),
    ]


# ---- scipy.integrate.solve_ivp: dy/dt = -k y + c; closed form twin
_Y0, _K, _C = np.array([1.0, -0.5]), np.array([0.7, 1.3]), np.array([0.2, -0.1])
_T0, _T1, _TEVAL = 0.1, 2.0, np.array([0.5, 1.0, 1.9])


def _ivp_closed_form(y0: Any, k: Any, t0: Any, t_eval: Any) -> jax.Array:
    ystar = jnp.asarray(_C, k.dtype) / k
    decay = jnp.exp(-k[:, None] * (t_eval - t0)[None, :])
    return (ystar[:, None] + (y0 - ystar)[:, None] * decay).ravel()


def _ivp_rows() -> list[Row]:
    def make(which: str, **kw: Any) -> tuple[Callable, Callable]:
        def parts(p: jax.Array) -> dict:
            d = {"y0": _Y0, "k": _K, "t0": np.array([_T0]), "t1": np.array([_T1]), "t_eval": _TEVAL}
            d = {key: jnp.asarray(v, p.dtype) for key, v in d.items()}
            d[which] = p
            return d

        def ours(p: jax.Array) -> jax.Array:
            d = parts(p)
            c = jnp.asarray(_C, p.dtype)
            if kw.get("closure"):
                k = d["k"]
                fun, args = (lambda t, y: -k * y + c), None
            else:
                fun, args = (lambda t, y, k: -k * y + c), (d["k"],)
            sol = integrate.solve_ivp(
                fun,
                (d["t0"][0], d["t1"][0]),
                d["y0"],
                t_eval=d["t_eval"],
                args=args,
                rtol=kw.get("rtol", 1e-10),
                atol=1e-12,
                method=kw.get("method", "RK45"),
                sensitivity=kw.get("sensitivity", "auto"),
            )
            return sol.y.ravel()

        def twin(p: jax.Array) -> jax.Array:
            d = parts(p)
            return _ivp_closed_form(d["y0"], d["k"], d["t0"][0], d["t_eval"])

        return ours, twin

    rows = []
    spec = [
        ("y0", "y0", "RK45", {}, _pts(_Y0, [0.3, 2.0], [-1.0, 0.1])),
        ("args", "k", "RK45 (args=(k,))", {}, _pts(_K, [0.4, 2.0])),
        ("fun", "k", "RK45, k closed over", {"closure": True}, _pts(_K, [0.4, 2.0])),
        ("t_span", "t0", "t0 = t_span[0]", {}, _pts([_T0], [0.3], [-0.2])),
        ("t_span", "t1", "tf = t_span[1] (outputs at t_eval: zero)", {}, _pts([_T1], [2.5])),
        ("t_eval", "t_eval", "every evaluation time", {}, _pts(_TEVAL, [0.2, 1.2, 1.5])),
        ("args", "k", "sensitivity='adjoint'", {"sensitivity": "adjoint"}, _pts(_K, [0.4, 2.0])),
        ("y0", "y0", "sensitivity='adjoint'", {"sensitivity": "adjoint"}, _pts(_Y0, [0.3, 2.0])),
        (
            "t_eval",
            "t_eval",
            "sensitivity='adjoint'",
            {"sensitivity": "adjoint"},
            _pts(_TEVAL, [0.2, 1.2, 1.5]),
        ),
        ("args", "k", "implicit BDF", {"method": "BDF"}, _pts(_K, [0.4, 2.0])),
        (
            "args",
            "k",
            "implicit Radau, adjoint",
            {"method": "Radau", "sensitivity": "adjoint"},
            _pts(_K, [0.4, 2.0]),
        ),
    ]
    default = {
        "RK45": ("vmap.jacfwd",),
        "RK45 (args=(k,))": ("vmap.jacrev",),
        "RK45, k closed over": ("vmap.jacrev",),
        "t0 = t_span[0]": ("vmap.jacfwd",),
        "every evaluation time": ("vmap.jacrev",),
    }
    for param, which, regime, kw, points in spec:
        ours, twin = make(which, **kw)
        rows.append(
            Row(
                "scipy.integrate.solve_ivp",
                param,
                regime,
                ours,
                points,
                twin=twin,
                rtol=1e-6,
                atol=1e-7,
                rtol32=1e-2,
                default=default.get(regime, ()),
            )
        )
    return rows


# ---- scipy.integrate.quad: int_a^b exp(-c x) dx; closed form twin
def _quad_rows() -> list[Row]:
    def make(which: str, closure: bool = False) -> tuple[Callable, Callable]:
        def parts(p: jax.Array) -> dict:
            d = {
                "a": jnp.asarray(0.2, p.dtype),
                "b": jnp.asarray(1.5, p.dtype),
                "c": jnp.asarray(-0.8, p.dtype),
            }
            d[which] = p[0]
            return d

        def ours(p: jax.Array) -> jax.Array:
            d = parts(p)
            if closure:
                c = d["c"]
                y, _ = integrate.quad(
                    lambda x: jnp.exp(-c * x),
                    d["a"],
                    d["b"],
                    epsabs=_quad_eps(p),
                    epsrel=_quad_eps(p),
                )
            else:
                y, _ = integrate.quad(
                    lambda x, c: jnp.exp(-c * x),
                    d["a"],
                    d["b"],
                    args=(d["c"],),
                    epsabs=_quad_eps(p),
                    epsrel=_quad_eps(p),
                )
            return y[None]

        def twin(p: jax.Array) -> jax.Array:
            d = parts(p)
            return ((jnp.exp(-d["c"] * d["a"]) - jnp.exp(-d["c"] * d["b"])) / d["c"])[None]

        return ours, twin

    rows = []
    for param, which, regime, closure, points in (
        ("a", "a", "lower limit (Leibniz)", False, _pts([0.2], [-1.0])),
        ("b", "b", "upper limit (Leibniz)", False, _pts([1.5], [0.5], [3.0])),
        ("args", "c", "args=(c,), c<0 and c>0", False, _pts([-0.8], [1.7])),
        ("func", "c", "c closed over", True, _pts([-0.8], [1.7])),
    ):
        ours, twin = make(which, closure)
        rows.append(
            Row(
                "scipy.integrate.quad",
                param,
                regime,
                ours,
                points,
                twin=twin,
                rtol=1e-7,
                atol=1e-9,
                default=("vmap.jacfwd",) if param in ("a", "func") else ("vmap.jacrev",),
            )
        )
    return rows


def _bvp_rows() -> list[Row]:
    """y'' = -k^2 y, y(0) = 0, y(1) = 1: y(x) = sin(k x) / sin(k), at x = 0.25 and 0.5
    (sol.sol, SciPy's spline in JAX), k closed over by `fun` (the IFT on the converged
    collocation system)."""
    from jaxbridge.scipy.integrate import solve_bvp

    xs = jnp.array([0.25, 0.5])

    def closed(k: jax.Array) -> jax.Array:
        return jnp.sin(k[0] * xs.astype(k.dtype)) / jnp.sin(k[0])

    def ours(k: jax.Array) -> jax.Array:
        mesh = jnp.linspace(0.0, 1.0, 11, dtype=k.dtype)
        res = solve_bvp(lambda x, y: jnp.stack([y[1], -k[0] ** 2 * y[0]]),
                        lambda ya, yb: jnp.stack([ya[0], yb[0] - 1.0]),
                        mesh, jnp.zeros((2, 11), k.dtype), tol=1e-8, max_nodes=5000)
        return res.sol(xs.astype(k.dtype))[0]

    return [Row("scipy.integrate.solve_bvp", "fun", "k closed over, k in (0, pi)", ours,
                _pts([1.3], [2.1]), twin=closed, rtol=1e-5, atol=1e-7, rtol32=2e-2,
                dtypes=("float64",), default=("jacrev",))]


# ---- scipy.optimize: jnp twins (closed forms, or Newton in JAX on the same problem)
def _quad_eps(p: jax.Array) -> float:
    """quad's epsabs/epsrel: SciPy's default in float64, what float32 can reach else."""
    return 1.49e-8 if p.dtype == jnp.float64 else 1e-5


def _tol(p: jax.Array) -> float:
    """A solver tolerance the dtype can reach (SciPy fails on 1e-12 in float32)."""
    return 1e-12 if p.dtype == jnp.float64 else 1e-6


def _newton(F: Callable[[jax.Array], jax.Array], x: jax.Array, iters: int = 40) -> jax.Array:
    """A root of F by Newton's method in JAX (differentiable through its iterations)."""

    def step(x: jax.Array, _: Any) -> tuple[jax.Array, None]:
        return x - jnp.linalg.solve(jax.jacfwd(F)(x), F(x)), None

    return jax.lax.scan(step, x, None, length=iters)[0]


def _root_residual(x: jax.Array, a: jax.Array) -> jax.Array:
    return jnp.stack([x[0] ** 3 + a[0] * x[0] - 1.0 + 0.3 * x[1], x[1] ** 3 + a[1] * x[1] + 0.5])


def _root_rows() -> list[Row]:
    rows = []
    # df-sane and krylov (float64): the compiled loop (custom_root), the others SciPy's
    # loop (a host call)
    for method in ("hybr", "lm", "krylov", "df-sane"):

        def ours(a: jax.Array, method: str = method) -> jax.Array:
            return optimize.root(
                _root_residual, jnp.zeros(2, a.dtype), args=(a,), method=method, tol=_tol(a)
            ).x

        def ours_closure(a: jax.Array, method: str = method) -> jax.Array:
            return optimize.root(
                lambda x: _root_residual(x, a), jnp.zeros(2, a.dtype), method=method, tol=_tol(a)
            ).x

        def twin(a: jax.Array) -> jax.Array:
            return _newton(lambda x: _root_residual(x, a), jnp.array([0.45, -0.3], a.dtype))

        rows.append(
            Row(
                "scipy.optimize.root",
                "args",
                f"method={method}",
                ours,
                _pts([2.0, 1.5], [1.0, 3.0]),
                twin=twin,
                rtol=1e-6,
                atol=1e-8,
                rtol32=5e-3,
                default={"hybr": ("vmap.jacrev",), "df-sane": ("vmap.jacfwd",),
                         "krylov": ("vmap.jacrev",)}.get(method, ()),
                # SciPy's newton_krylov fails in float32 ("Jacobian inversion yielded
                # zero vector"): a float64-only row.
                dtypes=("float64",) if method == "krylov" else DTYPES,
            )
        )
        if method == "hybr":
            rows.append(
                Row(
                    "scipy.optimize.root",
                    "fun",
                    "a closed over",
                    ours_closure,
                    _pts([2.0, 1.5], [1.0, 3.0]),
                    twin=twin,
                    rtol=1e-6,
                    atol=1e-8,
                    rtol32=5e-3,
                    default=("vmap.jacfwd",),
                )
            )
    rows.append(
        Row(
            "scipy.optimize.root",
            "x0",
            "the solution does not depend on x0",
            lambda x0: (
                optimize.root(
                    _root_residual, x0, args=(jnp.array([2.0, 1.5], x0.dtype),), tol=_tol(x0)
                ).x
            ),
            _pts([0.1, -0.1], [0.5, 0.2]),
            twin=lambda x0: (
                _newton(lambda x: _root_residual(x, jnp.array([2.0, 1.5])), jnp.array([0.45, -0.3]))
                + 0 * x0[0]
            ),
            rtol=1e-6,
            atol=1e-8,
        )
    )
    return rows


# Quadratic 0.5 x^T Q x - c^T x with a coupling term, so a bound on x0 moves x1.
_Q = np.array([[2.0, 0.8], [0.8, 1.5]])
_C_FREE, _C_LOW, _C_HIGH = np.array([0.5, -0.4]), np.array([-3.0, 0.5]), np.array([6.0, 0.5])


def _quad_obj(x: jax.Array, c: jax.Array) -> jax.Array:
    Q = jnp.asarray(_Q, x.dtype)
    return 0.5 * x @ Q @ x - c @ x


def _bounded_optimum(c: jax.Array, lb: jax.Array, ub: jax.Array, held: int) -> jax.Array:
    """The minimizer of `_quad_obj` with x0 held at lb0 (held=-1), ub0 (+1) or free (0)."""
    Q = jnp.asarray(_Q, c.dtype)
    if held == 0:
        return jnp.linalg.solve(Q, c)
    x0 = lb[0] if held < 0 else ub[0]
    return jnp.stack([x0, (c[1] - Q[1, 0] * x0) / Q[1, 1]])


def _minimize_rows() -> list[Row]:
    rows = []
    lb0, ub0 = np.array([-1.0, -np.inf]), np.array([2.0, np.inf])
    lb_fd, ub_fd = np.array([-1.0]), np.array([2.0])
    for method, tol in (("BFGS", 1e-12), ("Newton-CG", 1e-12), ("Nelder-Mead", 1e-14)):

        def ours(c: jax.Array, method: str = method, tol: float = tol) -> jax.Array:
            opts = (
                {"xatol": 1e-13, "fatol": 1e-15, "maxiter": 4000}
                if method == "Nelder-Mead"
                else None
            )
            return optimize.minimize(
                _quad_obj,
                jnp.zeros(2, c.dtype),
                args=(c,),
                method=method,
                tol=tol if c.dtype == jnp.float64 else _tol(c),
                options=opts,
            ).x

        rows.append(
            Row(
                "scipy.optimize.minimize",
                "args",
                f"method={method}",
                ours,
                _pts(_C_FREE, [1.0, 2.0]),
                twin=lambda c: _bounded_optimum(c, None, None, 0),
                rtol=1e-6,
                atol=1e-7,
                rtol32=5e-3,
                dtypes=DTYPES if method != "Nelder-Mead" else ("float64",),
                default=("vmap.jacrev",) if method == "BFGS" else (),
            )
        )
    rows.append(
        Row(
            "scipy.optimize.minimize",
            "fun",
            "c closed over (BFGS)",
            lambda c: (
                optimize.minimize(
                    lambda x: _quad_obj(x, c), jnp.zeros(2, c.dtype), method="BFGS", tol=_tol(c)
                ).x
            ),
            _pts(_C_FREE, [1.0, 2.0]),
            twin=lambda c: _bounded_optimum(c, None, None, 0),
            rtol=1e-6,
            atol=1e-7,
            rtol32=5e-3,
            default=("vmap.jacfwd",),
        )
    )
    rows.append(
        Row(
            "scipy.optimize.minimize",
            "x0",
            "the optimum does not depend on x0",
            lambda x0: (
                optimize.minimize(
                    _quad_obj,
                    x0,
                    args=(jnp.asarray(_C_FREE, x0.dtype),),
                    method="BFGS",
                    tol=_tol(x0),
                ).x
            ),
            _pts([0.0, 0.0], [0.3, -0.2]),
            twin=lambda x0: _bounded_optimum(jnp.asarray(_C_FREE), None, None, 0) + 0 * x0[0],
            rtol=1e-6,
            atol=1e-7,
            rtol32=5e-3,
            # BFGS in float32 stops with "precision loss" from some starting points.
            dtypes=("float64",),
        )
    )

    # Bounds on x0 (L-BFGS-B): the differentiated bound is p; c decides active or not.
    for which, c, held, regime in (
        ("lb", _C_LOW, -1, "active lower bound"),
        ("ub", _C_HIGH, 1, "active upper bound"),
        ("lb", _C_FREE, 0, "inactive bounds (zero)"),
        ("ub", _C_FREE, 0, "inactive bounds (zero)"),
    ):

        def ours(p: jax.Array, which: str = which, c: np.ndarray = c) -> jax.Array:
            lb = (
                jnp.concatenate([p, jnp.asarray([-np.inf], p.dtype)])
                if which == "lb"
                else jnp.asarray(lb0, p.dtype)
            )
            ub = (
                jnp.concatenate([p, jnp.asarray([np.inf], p.dtype)])
                if which == "ub"
                else jnp.asarray(ub0, p.dtype)
            )
            return optimize.minimize(
                _quad_obj,
                jnp.zeros(2, p.dtype),
                args=(jnp.asarray(c, p.dtype),),
                method="L-BFGS-B",
                bounds=(lb, ub),
                tol=1e-14,
                options={"maxiter": 1000},
            ).x

        def twin(
            p: jax.Array, which: str = which, c: np.ndarray = c, held: int = held
        ) -> jax.Array:
            lb = p if which == "lb" else jnp.asarray(lb_fd)
            ub = p if which == "ub" else jnp.asarray(ub_fd)
            return _bounded_optimum(jnp.asarray(c, p.dtype), lb, ub, held)

        pts = _pts(lb_fd, [-1.2], [-0.8]) if which == "lb" else _pts(ub_fd, [2.3], [1.8])
        default = {-1: ("vmap.jacfwd", "vmap.jacrev"), 1: ("vmap.jacfwd",)}.get(
            held, ("vmap.jacrev",) if which == "lb" else ()
        )
        rows.append(
            Row(
                "scipy.optimize.minimize",
                "bounds",
                f"{which}: {regime}",
                ours,
                pts,
                twin=twin,
                rtol=1e-6,
                atol=1e-7,
                rtol32=5e-3,
                default=default,
            )
        )
    rows.append(
        Row(
            "scipy.optimize.minimize",
            "args",
            "c with x0 at its lower bound",
            lambda c: (
                optimize.minimize(
                    _quad_obj,
                    jnp.zeros(2, c.dtype),
                    args=(c,),
                    method="L-BFGS-B",
                    bounds=(jnp.asarray(lb0, c.dtype), jnp.asarray(ub0, c.dtype)),
                    tol=1e-14,
                    options={"maxiter": 1000},
                ).x
            ),
            _pts(_C_LOW, [-4.0, 1.0]),
            twin=lambda c: _bounded_optimum(c, jnp.asarray(lb_fd), None, -1),
            rtol=1e-6,
            atol=1e-7,
            rtol32=5e-3,
            default=("vmap.jacrev",),
        )
    )
    return rows


# least_squares: exponential fit (nonlinear, nonzero residuals: the full Hessian matters)
_T = np.linspace(0.0, 1.0, 6)
_DATA_LSQ = 2.0 * np.exp(-1.5 * _T) + np.array([0.05, -0.03, 0.02, -0.04, 0.01, 0.03])
_DATA_LSQ2 = 1.6 * np.exp(-1.1 * _T) + np.array([-0.02, 0.04, -0.01, 0.03, -0.05, 0.02])
# the robust losses' second point: one residual past their switch at z = (r / f_scale)^2 = 1
# (huber's linear part: z_3 = 1.6 at the fit; soft_l1 1.6, cauchy 1.8, arctan 2.2)
_DATA_LSQ_TAIL = _DATA_LSQ2 + np.array([0.0, 0.0, 0.0, 0.12, 0.0, 0.0])


def _exp_residual(theta: jax.Array, data: jax.Array) -> jax.Array:
    return theta[0] * jnp.exp(-theta[1] * jnp.asarray(_T, theta.dtype)) - data


def _rho_jnp(loss: str, z: jax.Array) -> jax.Array:
    return {
        "linear": z,
        "soft_l1": 2 * (jnp.sqrt(1 + z) - 1),
        "cauchy": jnp.log1p(z),
        "huber": jnp.where(z <= 1, z, 2 * jnp.sqrt(z) - 1),
        "arctan": jnp.arctan(z),
    }[loss]


def _lsq_twin(data: jax.Array, loss: str = "linear", f_scale: float = 1.0) -> jax.Array:
    def cost(theta: jax.Array, loss: str) -> jax.Array:
        z = (_exp_residual(theta, data) / f_scale) ** 2
        return 0.5 * f_scale**2 * jnp.sum(_rho_jnp(loss, z))

    # Newton on the linear loss first: from there it converges for the robust losses too.
    start = _newton(
        jax.grad(functools.partial(cost, loss="linear")), jnp.array([2.0, 1.5], data.dtype)
    )
    if loss == "linear":
        return start
    return _newton(jax.grad(functools.partial(cost, loss=loss)), start)


_A_LIN = np.array([[1.0, 0.5], [0.2, 1.0], [1.0, -1.0], [0.3, 0.4]])


def _least_squares_rows() -> list[Row]:
    rows = []
    for method in ("trf", "dogbox", "lm"):

        def ours(d: jax.Array, method: str = method) -> jax.Array:
            return optimize.least_squares(
                _exp_residual,
                jnp.ones(2, d.dtype),
                args=(d,),
                method=method,
                ftol=1e-15,
                xtol=1e-15,
                gtol=1e-15,
            ).x

        rows.append(
            Row(
                "scipy.optimize.least_squares",
                "args",
                f"method={method}",
                ours,
                _pts(_DATA_LSQ, _DATA_LSQ2),
                twin=_lsq_twin,
                rtol=1e-6,
                atol=1e-7,
                rtol32=1e-2,
                default={"trf": ("vmap.jacrev",), "lm": ("vmap.jacfwd",),
                         "dogbox": ("jacrev",)}.get(method, ()),
            )
        )
    for loss in ("soft_l1", "huber", "cauchy", "arctan"):

        def ours(d: jax.Array, loss: str = loss) -> jax.Array:
            return optimize.least_squares(
                _exp_residual,
                jnp.ones(2, d.dtype),
                args=(d,),
                loss=loss,
                f_scale=0.1,
                ftol=1e-15,
                xtol=1e-15,
                gtol=1e-15,
            ).x

        rows.append(
            Row(
                "scipy.optimize.least_squares",
                "args",
                f"trf, loss={loss}",
                ours,
                _pts(_DATA_LSQ, _DATA_LSQ_TAIL),
                twin=functools.partial(_lsq_twin, loss=loss, f_scale=0.1),
                rtol=1e-6,
                atol=1e-7,
                rtol32=1e-2,
                default=("vmap.jacrev",) if loss in ("soft_l1", "huber") else (),
            )
        )
    rows.append(
        Row(
            "scipy.optimize.least_squares",
            "fun",
            "data closed over (trf)",
            lambda d: (
                optimize.least_squares(
                    lambda th: _exp_residual(th, d),
                    jnp.ones(2, d.dtype),
                    ftol=1e-15,
                    xtol=1e-15,
                    gtol=1e-15,
                ).x
            ),
            _pts(_DATA_LSQ, _DATA_LSQ2),
            twin=_lsq_twin,
            rtol=1e-6,
            atol=1e-7,
            rtol32=1e-2,
            default=("vmap.jacfwd",),
        )
    )

    # Bounds: linear residuals A x - d, i.e. _quad_obj with Q = A^T A, c = A^T d.
    Q = _A_LIN.T @ _A_LIN
    for method in ("trf", "dogbox"):
        for which, held, regime in (
            ("lb", -1, "active lower bound"),
            ("ub", 1, "active upper bound"),
            ("lb", 0, "inactive bounds (zero)"),
        ):
            c = {-1: _C_LOW, 1: _C_HIGH, 0: _C_FREE}[held]
            d = np.linalg.lstsq(_A_LIN.T, c, rcond=None)[0]  # A^T d = c

            def ours(
                p: jax.Array, which: str = which, d: np.ndarray = d, method: str = method
            ) -> jax.Array:
                lb = (
                    jnp.concatenate([p, jnp.asarray([-np.inf], p.dtype)])
                    if which == "lb"
                    else jnp.asarray([-1.0, -np.inf], p.dtype)
                )
                ub = (
                    jnp.concatenate([p, jnp.asarray([np.inf], p.dtype)])
                    if which == "ub"
                    else jnp.asarray([2.0, np.inf], p.dtype)
                )
                A = jnp.asarray(_A_LIN, p.dtype)
                return optimize.least_squares(
                    lambda x: A @ x - jnp.asarray(d, p.dtype),
                    jnp.zeros(2, p.dtype),
                    bounds=(lb, ub),
                    method=method,
                    ftol=1e-15,
                    xtol=1e-15,
                    gtol=1e-15,
                ).x

            def twin(
                p: jax.Array, which: str = which, c: np.ndarray = c, held: int = held
            ) -> jax.Array:
                lb = p if which == "lb" else jnp.asarray([-1.0])
                ub = p if which == "ub" else jnp.asarray([2.0])
                Qj, cj = jnp.asarray(Q), jnp.asarray(c)
                if held == 0:
                    return jnp.linalg.solve(Qj, cj) + 0 * p[0]
                x0 = lb[0] if held < 0 else ub[0]
                return jnp.stack([x0, (cj[1] - Qj[1, 0] * x0) / Qj[1, 1]])

            pts = _pts([-1.0], [-1.2], [-0.8]) if which == "lb" else _pts([2.0], [2.3], [1.8])
            rows.append(
                Row(
                    "scipy.optimize.least_squares",
                    "bounds",
                    f"{method}, {which}: {regime}",
                    ours,
                    pts,
                    twin=twin,
                    rtol=1e-6,
                    atol=1e-7,
                    rtol32=1e-2,
                    default=(("vmap.jacfwd",) if held < 0 else ("vmap.jacrev",) if held > 0 else ())
                    if method == "trf"
                    else (),
                )
            )
    return rows


# ---- jaxbridge.ops: C++ kernels; jnp twins
def _softplus_twin(x: jax.Array) -> jax.Array:
    return jnp.logaddexp(2.0 * x, 0.0) / 2.0


_TRIDIAG = {
    "dl": [0.0, -1.0, 0.5, 0.3],
    "d": [4.0, 3.0, 5.0, 2.5],
    "du": [1.0, 0.4, -0.7, 0.0],
    "b": [1.0, -2.0, 0.5, 3.0],
}
_TRIDIAG_ALT = {
    "dl": [0.2, 0.6, -0.5, 1.0],
    "d": [5.0, -4.0, 6.0, 3.0],
    "du": [-1.0, 0.9, 0.2, 0.5],
    "b": [-3.0, 0.1, 2.0, 1.0],
}


def _tridiag_parts(which: str, p: jax.Array) -> dict:
    parts = {k: jnp.asarray(v, p.dtype) for k, v in _TRIDIAG.items()}
    parts[which] = p
    return parts


def _tridiag_dense(parts: dict) -> jax.Array:
    dl, d, du = parts["dl"], parts["d"], parts["du"]
    return jnp.diag(d) + jnp.diag(dl[1:], -1) + jnp.diag(du[:-1], 1)


_RBF_X = np.array([[0.0, 1.0], [0.5, -0.3], [1.2, 0.4]])
_RBF_Y = np.array([[0.1, 0.9], [-1.0, 0.2]])


def _rbf_parts(which: str, p: jax.Array) -> tuple:
    x, y, l = jnp.asarray(_RBF_X, p.dtype), jnp.asarray(_RBF_Y, p.dtype), jnp.asarray(0.8, p.dtype)
    if which == "x":
        x = p.reshape(3, 2)
    elif which == "y":
        y = p.reshape(2, 2)
    else:
        l = p[0]
    return x, y, l


def _rbf_twin(which: str, p: jax.Array) -> jax.Array:
    x, y, l = _rbf_parts(which, p)
    d2 = jnp.sum((x[:, None, :] - y[None, :, :]) ** 2, axis=-1)
    return jnp.exp(-d2 / (2 * l**2)).ravel()


def _ops_rows() -> list[Row]:
    rows = [
        Row(
            "ops.softplus",
            "x",
            "x<0, 0, x>0, large |x| (beta=2)",
            lambda x: ops.softplus(x, beta=2.0),
            _pts([-30.0, -1.0, 0.0, 0.5, 25.0], [-3.0, -0.2, 0.1, 2.0, 8.0]),
            twin=_softplus_twin,
            rtol=1e-12,
            atol=1e-14,
            rtol32=1e-5,
        )
    ]
    for which in ("dl", "d", "du", "b"):
        rows.append(
            Row(
                "ops.tridiagonal_solve",
                which,
                "diagonally dominant",
                lambda p, w=which: ops.tridiagonal_solve(**_tridiag_parts(w, p)),
                _pts(_TRIDIAG[which], _TRIDIAG_ALT[which]),
                twin=lambda p, w=which: jnp.linalg.solve(
                    _tridiag_dense(_tridiag_parts(w, p)), _tridiag_parts(w, p)["b"]
                ),
                rtol=1e-10,
                atol=1e-12,
                rtol32=1e-4,
            )
        )
    for which, points in (
        ("x", _pts(_RBF_X.ravel(), _RBF_X.ravel()[::-1] * 0.7)),
        ("y", _pts(_RBF_Y.ravel(), _RBF_Y.ravel() * -1.3)),
        ("length_scale", _pts([0.8], [0.3], [2.0])),
    ):
        rows.append(
            Row(
                "ops.rbf_kernel",
                which,
                "3x2 vs 2x2 points",
                lambda p, w=which: ops.rbf_kernel(*_rbf_parts(w, p)).ravel(),
                points,
                twin=functools.partial(_rbf_twin, which),
                rtol=1e-10,
                atol=1e-12,
                rtol32=1e-4,
            )
        )
    return rows


ROWS: tuple[Row, ...] = tuple(
    _special_rows()
    + _lfilter_rows()
    + _sparse_rows()
    + _ivp_rows()
    + _quad_rows()
    + _bvp_rows()
    + _root_rows()
    + _minimize_rows()
    + _least_squares_rows()
    + _ops_rows()
)

#: Parameters of the public functions that are not differentiated, with the reason.
#: Every other parameter must be the `param` of some row.
NOT_DIFFERENTIABLE: dict[str, dict[str, str]] = {
    "scipy.special.kv": {},
    "scipy.special.kve": {},
    "scipy.special.iv": {},
    "scipy.special.ive": {},
    "scipy.special.hyp1f1": {},
    "scipy.special.ellipk": {},
    "scipy.special.ellipe": {},
    "scipy.special.erfcx": {},
    "scipy.special.erfi": {},
    "scipy.special.dawsn": {},
    "scipy.signal.lfilter": {"axis": "static int"},
    "scipy.sparse.linalg.spsolve": {
        "permc_spec": "static option",
        "use_umfpack": "accepted and ignored",
        "on_failure": "static policy",
    },
    "scipy.sparse.linalg.eigsh": {
        "k": "static int",
        "M": "not supported (raises)",
        "sigma": "static shift",
        "which": "static",
        "v0": "the result does not depend on it (documented: zero)",
        "ncv": "static",
        "maxiter": "static",
        "tol": "static",
        "return_eigenvectors": "static",
        "Minv": "not supported (raises)",
        "OPinv": "not supported (raises)",
        "mode": "static",
        "rng": "not supported (raises)",
        "on_failure": "static policy",
    },
    "scipy.integrate.solve_ivp": {
        "method": "static",
        "dense_output": "not supported (raises)",
        "events": "not supported (raises)",
        "vectorized": "accepted and ignored",
        "rtol": "static tolerance",
        "atol": "static tolerance",
        "jac": "its closed-over arrays are stop_gradient'ed (a Jacobian has no derivative "
        "effect on the solution)",
        "adjoint_rtol": "static tolerance",
        "adjoint_atol": "static tolerance",
        "sensitivity": "static",
        "stepping": "static",
        "checkpoints": "static memory budget of the discrete adjoint",
        "on_failure": "static policy",
    },
    "scipy.integrate.solve_bvp": {
        "bc": "differentiated through its closed-over arrays like fun (same IFT solve; "
        "the fun row covers the mechanism)",
        "x": "the initial mesh: the solution does not depend on it",
        "y": "the guess: the solution does not depend on it (zero gradient, documented)",
        "p": "the unknown parameters are outputs (res.p), not inputs",
        "S": "not supported (raises)",
        "fun_jac": "accepted and ignored (JAX computes the Jacobians)",
        "bc_jac": "accepted and ignored (JAX computes the Jacobians)",
        "tol": "static tolerance",
        "max_nodes": "static",
        "verbose": "static",
        "bc_tol": "static tolerance",
        "on_failure": "static policy",
    },
    "scipy.integrate.quad": {
        "full_output": "not supported (raises)",
        "epsabs": "static tolerance",
        "epsrel": "static tolerance",
        "limit": "static",
        "points": "static",
        "weight": "not supported (raises)",
        "wvar": "not supported (raises)",
        "wopts": "not supported (raises)",
        "maxp1": "static",
        "limlst": "static",
        "complex_func": "not supported (raises)",
        "on_failure": "static policy",
    },
    "scipy.optimize.root": {
        "method": "static",
        "jac": "closed-over arrays are stop_gradient'ed",
        "tol": "static",
        "callback": "static (hashable)",
        "options": "static",
        "linear_solver": "static",
        "on_failure": "static policy",
        "stepping": "static choice of loop (SciPy's or compiled)",
    },
    "scipy.optimize.minimize": {
        "method": "static",
        "jac": "closed-over arrays are stop_gradient'ed",
        "hess": "not supported (raises)",
        "hessp": "not supported (raises)",
        "constraints": "not supported (raises)",
        "tol": "static",
        "callback": "static (hashable)",
        "options": "static",
        "linear_solver": "static",
        "on_failure": "static policy",
    },
    "scipy.optimize.least_squares": {
        "jac": "closed-over arrays are stop_gradient'ed",
        "method": "static",
        "ftol": "static",
        "xtol": "static",
        "gtol": "static",
        "x_scale": "static",
        "loss": "static",
        "f_scale": "static float",
        "diff_step": "ignored (JAX's Jacobian)",
        "tr_solver": "static",
        "tr_options": "static",
        "jac_sparsity": "not supported (raises)",
        "max_nfev": "static",
        "verbose": "static",
        "kwargs": "not supported (raises)",
        "callback": "static (hashable)",
        "workers": "not supported (raises)",
        "x0": "the optimum does not depend on x0 (covered for root and minimize)",
        "linear_solver": "static",
        "on_failure": "static policy",
    },
    "ops.softplus": {"beta": "static FFI attribute (documented: use softplus(beta*x)/beta)"},
    "ops.tridiagonal_solve": {},
    "ops.rbf_kernel": {},
}

# ------------------------------------------------------------------ references


def _f64(row: Row) -> Callable[[np.ndarray], np.ndarray]:
    jitted = jax.jit(row.f)
    return lambda p: np.asarray(jitted(jnp.asarray(p, jnp.float64)), np.float64)


@functools.cache
def reference(row: Row, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(J, E): the float64 reference Jacobian at point k and its elementwise error bound."""
    p = row.points[k]
    if row.nan:  # nothing to compare with: the cell checks for NaN
        m = int(np.prod(jax.eval_shape(row.f, jnp.asarray(p)).shape))
        return np.full((m, p.size), np.nan), np.zeros((m, p.size))
    if row.twin is not None:
        J = np.asarray(jax.jacfwd(row.twin)(jnp.asarray(p)), np.float64)
        return J.reshape(-1, p.size), np.zeros((J.size // p.size, p.size))
    f = _f64(row)
    scales = element_scales(p)
    cols, errs = [], []
    for i in range(p.size):
        e = np.zeros(p.size)
        e[i] = scales[i]
        d = ridders(lambda h: [f(p + h * e)], 0.1, float(np.finfo(np.float64).eps))
        cols.append(d.value[0].ravel() / scales[i])
        errs.append(d.error[0].ravel() / scales[i])
    return np.stack(cols, axis=-1), np.stack(errs, axis=-1)


# ------------------------------------------------------------------ the cells


def _rng(row: Row, mode: str) -> np.random.Generator:
    return np.random.default_rng(abs(hash((row.id, mode))) % 2**32)


def _ours(row: Row, mode: str, dtype: str) -> tuple[list[np.ndarray], list[tuple]]:
    """Our derivatives, and per value the (J, E, how to apply) of its reference."""
    dt = np.dtype(dtype)
    p = jnp.asarray(row.points[0], dt)
    rng = _rng(row, mode)
    if mode in ("jvp", "vjp"):
        J, E = reference(row, 0)
        if mode == "jvp":
            t = rng.uniform(-1, 1, p.size)
            _, got = jax.jvp(row.f, (p,), (jnp.asarray(t, dt),))
            return [np.ravel(got)], [(J @ t, np.abs(E) @ np.abs(t), np.abs(J) @ np.abs(t))]
        c = rng.uniform(-1, 1, J.shape[0])
        y, pull = jax.vjp(row.f, p)
        (got,) = pull(jnp.asarray(c, dt).reshape(jnp.shape(y)))
        return [np.ravel(got)], [(c @ J, np.abs(c) @ np.abs(E), np.abs(c) @ np.abs(J))]
    jac = jax.jacfwd if mode.endswith("jacfwd") else jax.jacrev
    if mode.startswith("vmap"):
        P = jnp.asarray(np.stack(row.points), dt)
        got = np.asarray(jax.jit(jax.vmap(jac(row.f)))(P))
        refs = [reference(row, k) for k in range(len(row.points))]
        return (
            [got[k].reshape(refs[k][0].shape) for k in range(len(refs))],
            [(J, E, np.abs(J)) for J, E in refs],
        )
    J, E = reference(row, 0)
    got = np.asarray(jax.jit(jac(row.f))(p)).reshape(J.shape)
    return [got], [(J, E, np.abs(J))]


def check_cell(row: Row, mode: str, dtype: str) -> str:
    """Run one cell; return "ok" or raise AssertionError with the numbers."""
    gots, refs = _ours(row, mode, dtype)
    if row.nan:
        for got in gots:
            assert np.isnan(got).all(), (
                f"{row.id} {mode} {dtype}: documented as NaN (no derivative), got {got}"
            )
        return "NaN"
    rtol = row.rtol if dtype == "float64" else max(row.rtol, row.rtol32)
    for k, (got, (want, fd_err, mag)) in enumerate(zip(gots, refs)):
        scale = max(float(np.max(mag)), 1e-300)
        allowed = (
            rtol * mag
            + row.atol * scale
            + fd_err
            + (rtol * 1e-3 * scale if dtype == "float32" else 0)
        )
        bad = ~(np.abs(got - want) <= allowed)
        if bad.any():
            where = "" if len(gots) == 1 else f" batch element {k} of {len(gots)}:"
            raise AssertionError(
                f"{row.id} {mode} {dtype}:{where} derivative differs from the reference "
                f"({'jnp twin' if row.twin else 'float64 finite differences'}) at "
                f"{np.argwhere(bad).tolist()[:6]}:\n got  {got[bad][:6]}\n want {want[bad][:6]}\n"
                f" allowed {allowed[bad][:6]}"
            )
    return "ok"


# ------------------------------------------------------------------ the tests

_RESULTS: dict[tuple[str, str, str], str] = {}


@pytest.fixture(scope="module", autouse=True)
def _print_matrix():
    yield
    if not _RESULTS:
        return
    ids = [r.id for r in ROWS]
    width = max(len(i) for i in ids)
    cols = [f"{m}/{d[-2:]}" for d in DTYPES for m in MODES]
    lines = [
        "",
        f"derivative coverage matrix: {len(ROWS)} rows x {len(cols)} columns "
        f"({sum(v != 'slow' for v in _RESULTS.values())} cells run)",
        " " * width + " | " + " ".join(f"{c:>13}" for c in cols),
    ]
    for r in ROWS:
        if not any(key[0] == r.id for key in _RESULTS):
            continue
        cells = []
        for d in DTYPES:
            for m in MODES:
                v = _RESULTS.get((r.id, m, d), "-" if d not in r.dtypes else "not run")
                cells.append(f"{v:>13}")
        lines.append(f"{r.id:<{width}} | " + " ".join(cells))
    print("\n".join(lines))


#: The cells of the default run; the rest run with ``-m slow``. Three per
#: row: the tangent rule eagerly (jvp), the adjoint under jit and vmap together
#: (vmap.jacrev: the batching rule around the adjoint), and the float32 path under jit
#: (jacfwd); every rule of every row, at half the cost of all six modes.
#: Solver rows (each cell compiles and runs solves: seconds on a loaded 2-core machine)
#: run only the modes they name in `Row.default`.
DEFAULT_CELLS = {
    ("vmap.jacrev", "float64"),
    ("jvp", "float64"),
    ("jacfwd", "float32"),
}


def _in_default_run(row: Row, mode: str, dtype: str) -> bool:
    if row.slow:
        return False
    if row.heavy:
        return dtype == "float64" and mode in row.default
    return (mode, dtype) in DEFAULT_CELLS


#: Cells that fail because of a known, reported bug (not a documented limitation):
#: strict xfails, so the fix turns them into failures until the entry is removed.
#: (function prefix, params or None, regime prefix, dtype, modes) -> (exception, the bug).
KNOWN_BUGS: dict[tuple, tuple[type[BaseException], str]] = {}


def _known_bug(row: Row, mode: str, dtype: str) -> tuple | None:
    for (prefix, params, regime, dt, modes), bug in KNOWN_BUGS.items():
        if (
            row.function.startswith(prefix)
            and (params is None or row.param in params)
            and row.regime.startswith(regime)
            and dtype == dt
            and mode in modes
            and not (row.param == "bounds" and "inactive" in row.regime)
        ):
            return bug
    return None


def _cells() -> list:
    out = []
    for row in ROWS:
        for dtype in row.dtypes:
            for mode in MODES:
                marks = [] if _in_default_run(row, mode, dtype) else [pytest.mark.slow]
                bug = _known_bug(row, mode, dtype)
                if bug:
                    marks.append(pytest.mark.xfail(raises=bug[0], strict=True, reason=bug[1]))
                out.append(
                    pytest.param(row, mode, dtype, marks=marks, id=f"{row.id}-{mode}-{dtype}")
                )
    return out


@pytest.mark.parametrize("row,mode,dtype", _cells())
def test_cell(row: Row, mode: str, dtype: str):
    if row.function.startswith("ops.") and not ops.available():  # only with the opt-out
        pytest.skip(f"jaxbridge._builtin not built: {extension_missing('_builtin')}")
    try:
        _RESULTS[(row.id, mode, dtype)] = check_cell(row, mode, dtype)
    except BaseException:
        _RESULTS[(row.id, mode, dtype)] = "FAIL"
        raise


def _public_functions() -> dict[str, Callable]:
    found = {}
    for modname in MODULES:
        mod = importlib.import_module(modname)
        for name in mod.__all__:
            obj = getattr(mod, name)
            full = f"{modname}.{name}"
            if inspect.isfunction(obj) and full not in NOT_FUNCTIONS:
                found[full.removeprefix("jaxbridge.")] = obj
    return found


def test_every_public_function_has_rows():
    public = _public_functions()
    covered = {r.function for r in ROWS}
    missing = sorted(set(public) - covered)
    assert not missing, f"public differentiable functions without a row in ROWS: {missing}"
    unknown = sorted(covered - set(public))
    assert not unknown, f"rows for functions that are not public: {unknown}"
    stale = sorted(set(NOT_DIFFERENTIABLE) - set(public))
    assert not stale, f"NOT_DIFFERENTIABLE names functions that are not public: {stale}"


def test_every_parameter_is_covered_or_declared():
    problems = []
    for name, fn in _public_functions().items():
        params = [
            p
            for p in inspect.signature(fn).parameters.values()
            if p.kind is not inspect.Parameter.VAR_KEYWORD
        ]
        rows = {r.param for r in ROWS if r.function == name}
        declared = NOT_DIFFERENTIABLE.get(name)
        if declared is None:
            problems.append(f"{name}: no entry in NOT_DIFFERENTIABLE")
            continue
        for p in params:
            if p.name not in rows and p.name not in declared:
                problems.append(f"{name}: parameter {p.name!r} has no row and no reason")
            if p.name in rows and p.name in declared:
                problems.append(f"{name}: parameter {p.name!r} is both covered and declared")
        for p in rows | set(declared):
            if p not in {q.name for q in params}:
                problems.append(f"{name}: {p!r} is not a parameter")
    assert not problems, "\n".join(problems)


def test_rows_have_distinct_ids_and_batches():
    ids = [r.id for r in ROWS]
    assert len(ids) == len(set(ids)), sorted(i for i in ids if ids.count(i) > 1)
    for r in ROWS:
        assert len(r.points) >= 2, f"{r.id}: vmap needs >= 2 batch points"
        assert len({p.shape for p in r.points}) == 1, r.id
        assert any(not np.array_equal(r.points[0], q) for q in r.points[1:]), r.id
