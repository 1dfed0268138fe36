"""Old public spellings that still work for one release, each with a DeprecationWarning
naming the new one (the words: docs/layout.md's "Vocabulary" table).

* `renamed_keyword`: a keyword argument given by its old name (``adjoint=`` -> ``vjp=``).
* `renamed_attribute`: an attribute read by its old name (``Kernel.adjoint``).
* `renamed_role`: a kernel role named the old way (``aliases={"adjoint": ...}``).
* `renamed_value`: an option's value spelled the old way (``vmap="batch"``).
* `RENAMED_ROLES`: old role word -> new one.
"""

from __future__ import annotations

import warnings
from typing import Any

__all__ = ["RENAMED_ROLES", "renamed_attribute", "renamed_keyword", "renamed_role",
           "renamed_value"]

# A kernel's derivative roles used to be named for the maps; JAX names them for the rules.
RENAMED_ROLES = {"adjoint": "vjp", "tangent": "jvp"}


def renamed_keyword(where: str, new: str, new_value: Any, old: str, old_value: Any,
                    stacklevel: int) -> Any:
    """The value of keyword `new`, or of its deprecated spelling `old` (warned at the
    caller `stacklevel` frames up from the function calling this one).

    Raises:
      TypeError: both spellings were given.

    Example:
        >>> import warnings
        >>> with warnings.catch_warnings(record=True) as seen:
        ...     warnings.simplefilter("always")
        ...     renamed_keyword("jaxbridge.kernel", "vjp", None, "adjoint", "t", 1)
        't'
        >>> str(seen[0].message)
        "jaxbridge.kernel: adjoint= is deprecated; write vjp= (JAX's word for the same rule)"
    """
    if old_value is None:
        return new_value
    if new_value is not None:
        raise TypeError(f"{where}: got both {new}= and its deprecated spelling {old}=; "
                        f"pass {new}= only")
    # stacklevel + 2: past this function and the public one that called it.
    warnings.warn(f"{where}: {old}= is deprecated; write {new}= (JAX's word for the same "
                  f"rule)", DeprecationWarning, stacklevel=stacklevel + 2)
    return old_value


def renamed_attribute(where: str, new: str, old: str, stacklevel: int) -> None:
    """Warn that attribute `old` of `where` is now `new` (at the caller `stacklevel`
    frames up from the property calling this).

    Example:
        >>> import warnings
        >>> with warnings.catch_warnings(record=True) as seen:
        ...     warnings.simplefilter("always")
        ...     renamed_attribute("jaxbridge.Kernel", "vjp", "adjoint", 1)
        >>> str(seen[0].message)
        "jaxbridge.Kernel.adjoint is deprecated; read .vjp (JAX's word for the same rule)"
    """
    warnings.warn(f"{where}.{old} is deprecated; read .{new} (JAX's word for the same "
                  f"rule)", DeprecationWarning, stacklevel=stacklevel + 2)


def renamed_role(where: str, role: Any, stacklevel: int) -> Any:
    """`role`, with the deprecated ``"adjoint"``/``"tangent"`` read as ``"vjp"``/``"jvp"``
    (warned at the caller `stacklevel` frames up from the function calling this one).

    Example:
        >>> renamed_role("jaxbridge.kernel", "forward", 1)
        'forward'
    """
    if not isinstance(role, str) or role not in RENAMED_ROLES:
        return role
    new = RENAMED_ROLES[role]
    warnings.warn(f"{where}: the role {role!r} is deprecated; write {new!r} (JAX's word "
                  f"for the same rule)", DeprecationWarning, stacklevel=stacklevel + 2)
    return new


def renamed_value(where: str, option: str, value: Any, old: str, new: str,
                  stacklevel: int) -> Any:
    """`value` of `option`, with the deprecated `old` read as `new` (warned at the
    caller `stacklevel` frames up from the function calling this one).

    Example:
        >>> renamed_value("jaxbridge.kernel", "vmap", "loop", "batch", "vectorized", 1)
        'loop'
    """
    if not isinstance(value, str) or value != old:
        return value
    warnings.warn(f"{where}: {option}={old!r} is deprecated; write {option}={new!r} (the "
                  f"same word as jaxbridge.foreign's)", DeprecationWarning,
                  stacklevel=stacklevel + 2)
    return new
