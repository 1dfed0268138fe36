"""jaxbridge.testing.strategies keep their documented promises: shapes within their
bounds, finite elements within [min_value, max_value] (each part, for complex dtypes),
the requested dtype, positive arrays, diagonally dominant matrices, tuples of one shape
or of their own. `hypothesis.find` searches for a counterexample (or for the extreme
the strategy must reach), so a strategy that draws outside its range is caught."""

import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import errors, find, given, settings  # noqa: E402

from jaxbridge.testing import strategies as jst  # noqa: E402

QUICK = settings(max_examples=30, deadline=None, derandomize=True, database=None)
SEARCH = settings(max_examples=200, deadline=None, derandomize=True, database=None)
NEVER = settings(max_examples=100, deadline=None, derandomize=True, database=None)


def _never(strategy, condition):
    """No drawn example satisfies `condition`."""
    with pytest.raises(errors.NoSuchExample):
        find(strategy, condition, settings=NEVER)


def test_shapes_stay_within_their_bounds_and_reach_them():
    _never(jst.shapes(), lambda s: len(s) > 3 or any(d < 1 or d > 4 for d in s))
    assert find(jst.shapes(), lambda s: 4 in s, settings=SEARCH)
    assert find(jst.shapes(), lambda s: len(s) == 3, settings=SEARCH)
    assert find(jst.shapes(), lambda s: len(s) == 0, settings=SEARCH) == ()
    assert find(jst.shapes(), lambda s: 1 in s, settings=SEARCH)  # min_side=1 by default
    _never(jst.shapes(min_dims=1, max_dims=2, min_side=2, max_side=3),
           lambda s: not 1 <= len(s) <= 2 or any(d < 2 or d > 3 for d in s))


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.float16])
def test_real_arrays_are_finite_in_range_and_of_their_dtype(dtype):
    @QUICK
    @given(jst.arrays(dtype))
    def run(x):
        assert x.dtype == dtype
        assert np.all(np.isfinite(x)) and np.all((x >= -2.0) & (x <= 2.0))

    run()
    # the whole range is used, and a fixed shape is kept
    assert find(jst.arrays(dtype, (3,)), lambda x: np.any(x <= -1.5), settings=SEARCH).shape == (3,)
    assert find(jst.arrays(dtype, (3,)), lambda x: np.any(x >= 1.5), settings=SEARCH).shape == (3,)
    _never(jst.arrays(dtype, (2,), min_value=0.5, max_value=1.0),
           lambda x: np.any((x < 0.5) | (x > 1.0)))
    # bounds the dtype cannot represent (0.1 in float32 and float16) are kept, inward
    _never(jst.positive_arrays(dtype, (3,)),
           lambda x: x.dtype != dtype or np.any((x.astype(np.float64) < 0.1)
                                                 | (x.astype(np.float64) > 3.0)))


def test_float32_bounds_are_narrowed_inward_by_one_step_at_most():
    """Bounds a float32 cannot represent are replaced by the nearest float32 inside them
    (0.7 rounds down and 1.1 up, so both move), and bounds it can (0.5, 1.0) are kept:
    every value a float32 has in [min_value, max_value] can be drawn, no other."""
    f32 = np.float32
    # compared in float64: NumPy compares float32 with 0.7 in float32 (NEP 50), where
    # the float32 below 0.7 equals it
    _never(jst.arrays(f32, (3,), min_value=0.7, max_value=1.1),
           lambda x: np.any((x.astype(np.float64) < 0.7) | (x.astype(np.float64) > 1.1)))
    inside_lo, inside_hi = np.nextafter(f32(0.7), f32(np.inf)), np.nextafter(f32(1.1), f32(0))
    assert find(jst.arrays(f32, (1,), min_value=0.7, max_value=1.1),
                lambda x: x[0] == inside_lo, settings=SEARCH) is not None
    assert find(jst.arrays(f32, (1,), min_value=0.7, max_value=1.1),
                lambda x: x[0] == inside_hi, settings=SEARCH) is not None
    for bound in (0.5, 1.0):
        assert find(jst.arrays(f32, (1,), min_value=0.5, max_value=1.0),
                    lambda x, b=bound: x[0] == b, settings=SEARCH) is not None
    # the largest float32 below a bound that rounds down (0.7) is the largest value drawn
    assert find(jst.arrays(f32, (1,), min_value=0.5, max_value=0.7),
                lambda x: x[0] == f32(0.7), settings=SEARCH) is not None


@pytest.mark.slow  # ~4 s each (Hypothesis searching for both parts at their bounds)
@pytest.mark.parametrize("dtype, part", [(np.complex128, np.float64),
                                         (np.complex64, np.float32)])
def test_complex_arrays_have_both_parts_in_range(dtype, part):
    @QUICK
    @given(jst.arrays(dtype, (3,)))
    def run(z):
        assert z.dtype == dtype and z.shape == (3,)
        assert np.all(np.abs(z.real) <= 2.0) and np.all(np.abs(z.imag) <= 2.0)

    run()
    # the imaginary part is drawn, with both signs, independently of the real part
    for condition in (lambda z: np.any(z.imag < -1.0), lambda z: np.any(z.imag > 1.0),
                      lambda z: np.any(np.abs(z.imag - z.real) > 1.0)):
        assert find(jst.arrays(dtype, (2,)), condition, settings=SEARCH).dtype == dtype
    # each part is a value of the real dtype of that width (complex64: float32 parts),
    # and complex128 uses float64's precision, not only float32's values
    _never(jst.arrays(dtype, (2,)), lambda z: np.any(z.imag.astype(part) != z.imag))
    # bounds the part's dtype cannot represent are narrowed in that dtype (0.7 and 1.1
    # round outward in float32)
    def outside(z):
        parts = np.stack([z.real, z.imag]).astype(np.float64)
        return np.any((parts < 0.7) | (parts > 1.1))
    _never(jst.arrays(dtype, (2,), min_value=0.7, max_value=1.1), outside)
    # a one-signed range is kept by both parts (complex positive_arrays: Re, Im > 0)
    _never(jst.positive_arrays(dtype, (2,)),
           lambda z: np.any((z.real < 0.1) | (z.real > 3.0) | (z.imag < 0.1) | (z.imag > 3.0)))
    if part == np.float64:
        assert find(jst.arrays(dtype, (2,)),
                    lambda z: np.any(z.imag.astype(np.float32) != z.imag), settings=SEARCH) \
            .dtype == dtype


def test_integer_and_boolean_arrays():
    _never(jst.arrays(np.int32, (4,), min_value=-3, max_value=5),
           lambda x: x.dtype != np.int32 or np.any((x < -3) | (x > 5)))
    assert find(jst.arrays(np.int32, (4,), min_value=-3, max_value=5),
                lambda x: -3 in x and 5 in x, settings=SEARCH).dtype == np.int32
    b = find(jst.arrays(np.bool_, (4,)), lambda x: x.any() and not x.all(), settings=SEARCH)
    assert b.dtype == np.bool_


def test_positive_arrays_are_positive_in_their_default_range():
    _never(jst.positive_arrays(np.float64, (3,)), lambda x: np.any((x < 0.1) | (x > 3.0)))
    for condition in (lambda x: np.any(x > 2.5), lambda x: np.any(x < 0.2)):
        assert find(jst.positive_arrays(np.float64, (3,)), condition,
                    settings=SEARCH).dtype == np.float64


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_well_conditioned_matrices_are_diagonally_dominant(dtype):
    def dominant(a):
        k = a.shape[-1]
        off = np.abs(a - np.eye(k) * k)
        return a.dtype == dtype and np.all(off <= 0.5 + 1e-6)

    @QUICK
    @given(jst.well_conditioned_matrices(dtype=dtype, batch_shape=(2,)))
    def run(a):
        assert a.ndim == 3 and a.shape[0] == 2 and a.shape[1] == a.shape[2]
        assert 1 <= a.shape[-1] <= 4
        assert dominant(a)
        # strictly diagonally dominant by at least k/2 in every row: cond_inf <= 3
        assert np.all(np.linalg.cond(a.astype(np.float64), np.inf) <= 3.0 + 1e-5)

    run()
    assert find(jst.well_conditioned_matrices(3), lambda a: a.shape == (3, 3), settings=SEARCH) \
        is not None
    assert find(jst.well_conditioned_matrices(), lambda a: a.shape == (4, 4), settings=SEARCH) \
        is not None
    assert find(jst.well_conditioned_matrices(), lambda a: a.shape == (1, 1), settings=SEARCH) \
        is not None
    # n is passed by position or by name; dtype and batch_shape by name only
    assert find(jst.well_conditioned_matrices(n=2), lambda a: True).shape == (2, 2)
    with pytest.raises(TypeError):
        jst.well_conditioned_matrices(2, np.float32)
    # the off-diagonal part spans [-1/2, 1/2]
    assert find(jst.well_conditioned_matrices(2), lambda a: a[0, 1] < -0.4, settings=SEARCH) \
        is not None
    assert find(jst.well_conditioned_matrices(2), lambda a: a[0, 1] > 0.4, settings=SEARCH) \
        is not None


def test_array_tuples_share_one_shape_unless_asked_otherwise():
    _never(jst.array_tuples(3), lambda t: len(t) != 3 or len({a.shape for a in t}) != 1)
    assert len(find(jst.array_tuples(2, same_shape=False),
                    lambda t: t[0].shape != t[1].shape, settings=SEARCH)) == 2
    _never(jst.array_tuples(2, np.float32, shape=(2, 3)),
           lambda t: any(a.shape != (2, 3) or a.dtype != np.float32 for a in t))
    _never(jst.array_tuples(2, same_shape=False, shape=(1,)),
           lambda t: any(a.shape != (1,) for a in t))
