"""What a differentiable callable can do, as it says itself: `Derivatives`.

Every jaxbridge callable that carries derivative rules (`jb.foreign` functions, linear
ones, `jb.custom_gradient`, `jb.kernel`; later the PyTorch wrapper) answers one
question, ``f.derivatives()``: which modes of differentiation exist and what computes
them. `jaxbridge.testing.check_rules` plans its checks from that answer instead of
guessing from attributes, so a new kind of rule (a transpose, a rule that serves both
modes) cannot be skipped silently.

A wrapper outside jaxbridge takes part by defining a ``derivatives()`` method that
returns a `Derivatives`.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

__all__ = ["Derivatives", "derivatives_of"]


@dataclasses.dataclass(frozen=True)
class Derivatives:
    """Which derivatives a function has, and what computes each one.

    Attributes:
      forward: what computes forward mode (``jax.jvp``, ``jacfwd``), in words, e.g.
        ``"defjvp rule (numpy)"`` or ``"the function itself (linear=True)"``; None when
        the function has no forward mode.
      reverse: what computes reverse mode (``jax.grad``, ``vjp``, ``jacrev``), e.g.
        ``"defvjp rule (numpy)"``, ``"deftranspose rule (numpy)"``, ``"VJP
        kernel"``; None when it has none.
      second_order: whether derivatives of the derivatives exist (Hessians): rules
        that JAX traces (``kind="jax"``), or a linear function with a transpose.
      missing: what to add for the absent modes, e.g. ``"define @f.defjvp for
        forward mode"`` ("" when nothing is absent).

    Example:
        >>> import numpy as np, jaxbridge as jb
        >>> A = np.array([[1.0, 2.0], [0.0, 3.0]])
        >>> matvec = jb.foreign(lambda x: x, linear=True)(lambda x: A @ x)
        >>> matvec.deftranspose(lambda ct: (A.T @ ct,))  # doctest: +ELLIPSIS
        <function <lambda> at ...>
        >>> d = matvec.derivatives()
        >>> d.forward, d.reverse, d.second_order
        ('the function itself (linear=True)', 'deftranspose rule (numpy)', True)
    """

    forward: str | None = None
    reverse: str | None = None
    second_order: bool = False
    missing: str = ""

    @property
    def how(self) -> str:
        """One line for reports: each mode and what computes it.

        Example:
            >>> Derivatives(reverse="VJP kernel").how
            'forward mode: none; reverse mode: VJP kernel; second order: no'
        """
        return (f"forward mode: {self.forward or 'none'}; reverse mode: "
                f"{self.reverse or 'none'}; second order: {'yes' if self.second_order else 'no'}")


def derivatives_of(f: Any) -> Derivatives | None:
    """`f.derivatives()` if `f` (or the function inside a ``functools.partial`` of it)
    answers with a `Derivatives`; None when it does not say (then a caller probes).

    Example:
        >>> derivatives_of(len) is None
        True
    """
    while isinstance(f, functools.partial):
        f = f.func
    ask = getattr(type(f), "derivatives", None)
    if not callable(ask):
        return None
    try:
        answer = f.derivatives()
    except TypeError:  # a `derivatives` attribute that means something else: not ours
        return None
    return answer if isinstance(answer, Derivatives) else None
