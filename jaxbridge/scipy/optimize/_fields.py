"""SciPy's result fields beyond `x`, `fun` and the counters: `message`, and the fields
one method has (Powell's `direc`, Nelder-Mead's `final_simplex`, BFGS's `hess_inv`,
hybr's `fjac`, ...), brought back from SciPy's run on the host.

The host call's outputs have static shapes, so each (kind, method) declares its fields'
shapes here (`spec`) before SciPy runs; `host_values` fills them from SciPy's result
(NaN where SciPy's value is None). A message is a string, which no array can carry: the
host call returns its number in a process-wide table (`message_id`), and the front end
turns a concrete number back into SciPy's text (`message_text`); under `jit` the number
is traced and the result has no `message` key (`res.message` then reads a text derived
from `status`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["spec", "host_values", "no_tangents", "has_cotangent", "message_id",
           "message_text", "NO_MESSAGE"]

NO_MESSAGE = -1          # no text (the table is full, or the path has none)
_MAX_MESSAGES = 4096     # SciPy's messages are few; some quote numbers, so cap the table
_messages: list[str] = []
_ids: dict[str, int] = {}
_lock = threading.Lock()  # host calls run on XLA's worker threads too


def message_id(text: Any) -> int:
    """The number of SciPy's message `text` in the process-wide table (added if new).

    >>> message_text(message_id("The solution converged."))
    'The solution converged.'
    """
    text = str(text)
    with _lock:
        code = _ids.get(text)
        if code is None:
            if len(_messages) >= _MAX_MESSAGES:
                return NO_MESSAGE
            code = _ids[text] = len(_messages)
            _messages.append(text)
    return code


def message_text(code: Any) -> str | None:
    """SciPy's message numbered `code`, or None when `code` is traced or has no text."""
    try:
        i = int(code)
    except (TypeError, jax.errors.ConcretizationTypeError):
        return None
    return _messages[i] if 0 <= i < len(_messages) else None


def _f64(*shape: int) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(shape, jnp.result_type(float))  # float64 with x64 on


def _i32(*shape: int) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(shape, jnp.int32)


# (kind, method) -> field -> its shape and dtype for n unknowns
_SPECS: dict[tuple[str, str], dict[str, Callable[[int], Any]]] = {
    ("minimize", "Nelder-Mead"): {"final_simplex": lambda n: (_f64(n + 1, n), _f64(n + 1))},
    ("minimize", "Powell"): {"direc": lambda n: _f64(n, n)},
    ("minimize", "BFGS"): {"hess_inv": lambda n: _f64(n, n)},
    ("minimize", "L-BFGS-B"): {"hess_inv": lambda n: _f64(n, n)},  # SciPy: an operator
    ("minimize", "Newton-CG"): {"nhev": lambda n: _i32()},
    ("minimize", "COBYLA"): {"maxcv": lambda n: _f64()},
    ("minimize", "COBYQA"): {"maxcv": lambda n: _f64()},
    ("root", "hybr"): {"fjac": lambda n: _f64(n, n), "r": lambda n: _f64(n * (n + 1) // 2),
                       "qtf": lambda n: _f64(n)},
    ("root", "lm"): {"fjac": lambda n: _f64(n, n), "ipvt": lambda n: _i32(n),
                     "qtf": lambda n: _f64(n), "cov_x": lambda n: _f64(n, n)},
}
for _m in ("dogleg", "trust-ncg", "trust-exact", "trust-krylov"):
    _SPECS["minimize", _m] = {"nhev": lambda n: _i32(), "hess": lambda n: _f64(n, n)}


def spec(kind: str, method: Any, n: int) -> dict[str, Any]:
    """The fields SciPy's `kind(method=method)` result has beyond the common ones, each
    as its (pytree of) `ShapeDtypeStruct` for `n` unknowns.

    >>> spec("minimize", "Powell", 3)["direc"].shape
    (3, 3)
    """
    fields = _SPECS.get((kind, method), {}) if isinstance(method, str) else {}
    return {name: shape(n) for name, shape in fields.items()}


def host_values(sol: Any, fields: dict[str, Any]) -> dict[str, Any]:
    """SciPy's result `sol`'s values of `fields` (from `spec`), as NumPy arrays of the
    declared shapes: a dense matrix for an operator (L-BFGS-B's `hess_inv`), NaN (or -1
    for integers) where SciPy's value is None or absent (lm's `cov_x` when singular)."""
    def one(value: Any, want: jax.ShapeDtypeStruct) -> np.ndarray:
        if hasattr(value, "todense"):
            value = value.todense()
        missing = -1 if jnp.issubdtype(want.dtype, jnp.integer) else np.nan
        if value is None:
            return np.full(want.shape, missing, want.dtype)
        arr = np.asarray(value)
        if arr.size != int(np.prod(want.shape, dtype=int)):
            return np.full(want.shape, missing, want.dtype)
        return arr.reshape(want.shape).astype(want.dtype)
    get = sol.get if hasattr(sol, "get") else (lambda k: getattr(sol, k, None))
    out: dict[str, Any] = {}
    for name, want in fields.items():
        value = get(name)
        if isinstance(want, tuple):  # Nelder-Mead's final_simplex: (vertices, values)
            parts = (None,) * len(want) if value is None else tuple(value)
            out[name] = tuple(one(v, w) for v, w in zip(parts, want))
        else:
            out[name] = one(value, want)
    return out


def no_tangents(values: dict[str, Any]) -> dict[str, Any]:
    """The fields' tangents: they have no derivative rule (SciPy's internals), so NaN
    for the floating ones, never a silent zero; None (no tangent) for the integers."""
    def one(v: Any) -> Any:
        v = np.asarray(v)
        return np.full(v.shape, np.nan, v.dtype) if np.issubdtype(v.dtype, np.floating) \
            else None
    return {name: tuple(one(p) for p in v) if isinstance(v, tuple) else one(v)
            for name, v in values.items()}


def has_cotangent(cts: Any) -> bool:
    """Whether a cotangent reaches the fields (then the gradient is NaN: no rule)."""
    for leaf in jax.tree_util.tree_leaves(cts):
        arr = np.asarray(leaf)
        if np.issubdtype(arr.dtype, np.floating) and np.any(arr != 0):
            return True
    return False
