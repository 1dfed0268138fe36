"""Hypothesis strategies for inputs of derivative-rule tests (`jaxbridge.testing.strategies`).

Importing this module needs Hypothesis (``pip install hypothesis``); jaxbridge itself
does not. The values are kept finite, moderate and (for matrices) well conditioned,
so that finite differences are meaningful.

Example:
    >>> from hypothesis import given
    >>> from jaxbridge.testing import assert_rules_correct, strategies as jst
    >>> @given(jst.arrays(shape=jst.shapes(max_dims=2)))
    ... def test_host_sin(x):
    ...     assert_rules_correct(host_sin, x)
"""

from __future__ import annotations

from typing import Any

import numpy as np

try:
    from hypothesis import strategies as st
    from hypothesis.extra import numpy as hnp
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("jaxbridge.testing.strategies needs Hypothesis: pip install hypothesis"
                      ) from exc

__all__ = ["shapes", "arrays", "positive_arrays", "well_conditioned_matrices", "array_tuples"]


def shapes(*, min_dims: int = 0, max_dims: int = 3, min_side: int = 1,
           max_side: int = 4) -> st.SearchStrategy[tuple[int, ...]]:
    """Array shapes, small by default (at most 4**3 elements).

    Args:
      min_dims: the fewest dimensions (0: scalars included).
      max_dims: the most dimensions.
      min_side: the smallest size of a dimension.
      max_side: the largest size of a dimension.

    Returns:
      A Hypothesis strategy of shape tuples.

    Example:
        >>> shapes(min_dims=1, max_dims=2).example()  # doctest: +SKIP
        (3, 1)
    """
    return hnp.array_shapes(min_dims=min_dims, max_dims=max_dims, min_side=min_side,
                            max_side=max_side)


def arrays(dtype: Any = np.float64, shape: Any = None, *, min_value: float = -2.0,
           max_value: float = 2.0) -> st.SearchStrategy[np.ndarray]:
    """Finite arrays of `dtype` with elements in [min_value, max_value].

    `shape` is a tuple, a strategy of tuples, or None (``shapes()``). Complex dtypes
    get real and imaginary parts in the range.

    Args:
      dtype: a NumPy dtype: floating, complex, integer or bool.
      shape: a tuple, a strategy of tuples, or None (``shapes()``).
      min_value: the smallest element (of each part, for complex dtypes).
      max_value: the largest element.

    Returns:
      A Hypothesis strategy of NumPy arrays, never NaN or infinite.

    Example:
        >>> arrays(np.float32, (2, 3)).example().shape  # doctest: +SKIP
        (2, 3)
    """
    dtype = np.dtype(dtype)
    shape = shapes() if shape is None else shape
    if np.issubdtype(dtype, np.complexfloating):
        part = np.float32 if dtype == np.complex64 else np.float64
        shape_st = st.just(shape) if isinstance(shape, (int, tuple)) else shape
        return shape_st.flatmap(lambda s: st.tuples(
            arrays(part, s, min_value=min_value, max_value=max_value),
            arrays(part, s, min_value=min_value, max_value=max_value)).map(
                lambda ri: (ri[0] + 1j * ri[1]).astype(dtype)))
    elements: st.SearchStrategy[Any]
    if np.issubdtype(dtype, np.integer):
        elements = st.integers(int(min_value), int(max_value))
    elif dtype == np.bool_:
        elements = st.booleans()
    else:
        width = 8 * dtype.itemsize
        lo, hi = _inward(min_value, max_value, dtype)
        elements = st.floats(lo, hi, allow_nan=False, allow_infinity=False, width=width)
    return hnp.arrays(dtype, shape, elements=elements)


def _inward(lo: float, hi: float, dtype: np.dtype) -> tuple[float, float]:
    """[lo, hi] narrowed to the nearest values of floating `dtype` inside it: Hypothesis
    refuses bounds a float32 or float16 cannot represent exactly (0.1, say)."""
    a, b = dtype.type(lo), dtype.type(hi)
    # compared as Python floats: NumPy compares a float32 with a Python float in float32
    # (NEP 50), where 0.7 rounded down still equals 0.7
    if float(a) < lo:
        a = np.nextafter(a, dtype.type(np.inf))
    if float(b) > hi:
        b = np.nextafter(b, dtype.type(-np.inf))
    return float(a), float(b)


def positive_arrays(dtype: Any = np.float64, shape: Any = None, *, min_value: float = 0.1,
                    max_value: float = 3.0) -> st.SearchStrategy[np.ndarray]:
    """Arrays with elements in [min_value, max_value] (for log, sqrt, gamma, ...).

    Args and returns as in `arrays`, with a positive default range.

    Example:
        >>> bool((positive_arrays(np.float64, (3,)).example() > 0).all())  # doctest: +SKIP
        True
    """
    return arrays(dtype, shape, min_value=min_value, max_value=max_value)


def well_conditioned_matrices(n: int | st.SearchStrategy[int] | None = None, *,
                              dtype: Any = np.float64,
                              batch_shape: tuple[int, ...] = ()) -> st.SearchStrategy[np.ndarray]:
    """Square matrices ``I * n + A`` with ``|A_ij| <= 1/2``: strictly diagonally
    dominant (each row's diagonal exceeds the rest of the row by at least ``n / 2``), so
    invertible with condition number (in the infinity norm) at most 3.

    Args:
      n: the size: an int, a strategy of ints, or None (1 to 4).
      dtype: a floating NumPy dtype.
      batch_shape: leading batch dimensions of every matrix.

    Returns:
      A Hypothesis strategy of arrays of shape ``(*batch_shape, n, n)``.

    Example:
        >>> well_conditioned_matrices(3).example().shape  # doctest: +SKIP
        (3, 3)
    """
    sizes = st.integers(1, 4) if n is None else (st.just(n) if isinstance(n, int) else n)

    def build(k: int) -> st.SearchStrategy[np.ndarray]:
        return arrays(dtype, (*batch_shape, k, k), min_value=-0.5, max_value=0.5).map(
            lambda a: (a + k * np.eye(k, dtype=a.dtype)).astype(dtype))

    return sizes.flatmap(build)


def array_tuples(n: int, dtype: Any = np.float64, *, shape: Any = None,
                 same_shape: bool = True) -> st.SearchStrategy[tuple[np.ndarray, ...]]:
    """`n` arrays, all of one random shape (or each its own with ``same_shape=False``).

    Args:
      n: how many arrays.
      dtype: their NumPy dtype.
      shape: a tuple, a strategy of tuples, or None (``shapes()``).
      same_shape: one shape for all (default) or one each.

    Returns:
      A Hypothesis strategy of n-tuples of arrays.

    Example:
        >>> a, b = array_tuples(2).example()  # doctest: +SKIP
        >>> a.shape == b.shape  # doctest: +SKIP
        True
    """
    shape = shapes() if shape is None else shape
    if same_shape:
        shape_st = st.just(shape) if isinstance(shape, (int, tuple)) else shape
        return shape_st.flatmap(lambda s: st.tuples(*[arrays(dtype, s) for _ in range(n)]))
    return st.tuples(*[arrays(dtype, shape) for _ in range(n)])
