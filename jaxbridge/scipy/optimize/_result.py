"""OptimizeResult, what root, minimize and least_squares return: a dict, as SciPy's is."""

from __future__ import annotations

from typing import Any, ClassVar

import jax
import scipy.optimize

from .._common import Result


class OptimizeResult(scipy.optimize.OptimizeResult):
    """What :func:`root`, :func:`minimize` and :func:`least_squares` return.

    SciPy's `OptimizeResult` (a `dict` with attribute access: ``res["x"]``, ``res.x``,
    ``res.keys()``; code that checks for SciPy's result, as
    ``scipy.optimize.brute(..., finish=minimize)`` does, takes this one), and a
    JAX pytree: its array fields are leaves, its strings (root's `method`) static, so
    it can be returned from `jit` and `vmap`. The keys are the fields the call
    computed, as in SciPy; a field SciPy has and this call does not compute
    (`hess_inv`, ...) reads as None by attribute.

    SciPy's field names: `x` (differentiable), `fun` (F(x*) for root, 1-D as in
    SciPy; f(x*) for minimize, the residuals for least_squares; differentiable),
    `success`, `status`, `nfev`, `njev`, `nit` (SciPy's counters, -1 where the method
    does not report one); `jac` (minimize: the gradient at x*; least_squares: the
    Jacobian, its rows scaled by the robust loss as SciPy's), root's `method`, for
    least_squares `cost`, `grad`, `optimality`, `active_mask`, and the method's own
    fields from SciPy's run (`direc`, `final_simplex`, `hess_inv`, `hess`, `nhev`,
    `maxcv`, `fjac`, `r`, `qtf`, `ipvt`, `cov_x`). `message` is SciPy's own text
    where the call was not traced; a jitted call's result has no `message` key, and
    `res.message` reads a text derived from `status`.

    >>> import scipy.optimize
    >>> res = OptimizeResult(x=1.0, success=True)
    >>> isinstance(res, dict), res["x"], res.x, sorted(res), res.hess_inv
    (True, 1.0, 1.0, ['success', 'x'], None)
    >>> isinstance(res, scipy.optimize.OptimizeResult)
    True
    """

    _fields: ClassVar[tuple[str, ...]] = (
        "x", "fun", "jac", "cost", "grad", "optimality", "active_mask", "success", "status",
        "nfev", "njev", "nit", "hess_inv", "method", "message", "direc", "final_simplex",
        "nhev", "hess", "maxcv", "fjac", "r", "qtf", "ipvt", "cov_x")
    _messages: ClassVar[dict[int, str]] = {}

    def __init__(self, **fields: Any) -> None:
        super().__init__((k, v) for k, v in fields.items() if v is not None)

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            if name in self._fields:
                return None
            raise AttributeError(name) from None

    @property
    def message(self) -> str:
        """SciPy's message: its own text where the call was not traced (the `message`
        key), else a text derived from `status`."""
        if isinstance(self.get("message"), str):
            return str(self["message"])
        return str(vars(Result)["message"].fget(self))


def _flatten(res: OptimizeResult) -> tuple[list[Any], tuple]:
    leaves = [k for k, v in res.items() if not isinstance(v, str)]
    static = tuple((k, v) for k, v in res.items() if isinstance(v, str))
    return [res[k] for k in leaves], (tuple(leaves), static)


def _flatten_with_keys(res: OptimizeResult) -> tuple[list[Any], tuple]:
    children, aux = _flatten(res)
    return [(jax.tree_util.DictKey(k), c) for k, c in zip(aux[0], children)], aux


def _unflatten(aux: tuple, children: Any) -> OptimizeResult:
    res = OptimizeResult()
    dict.update(res, zip(aux[0], children))  # None children too: the structure is aux's
    dict.update(res, aux[1])
    return res


jax.tree_util.register_pytree_with_keys(OptimizeResult, _flatten_with_keys, _unflatten,
                                        _flatten)
