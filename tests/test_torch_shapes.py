"""jaxbridge.torch: where a wrapped function's result shapes come from (`_shapes`).

Meta tensors first; a function that needs data runs on zero-filled tensors and on two
more fillings, and a result whose shape depends on the data is an error that names
``result=``, never a silent empty array. Declared results are checked on every call,
the same under `jit` as eagerly. An exception the function raises while its shapes are
found reaches the caller as itself.
"""

import numpy as np
import pytest

torch = pytest.importorskip(
    "torch", reason="jaxbridge.torch needs PyTorch: pip install -e '.[torch]' (Python 3.11)")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from hypothesis import Phase, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import jaxbridge.torch as jt  # noqa: E402
from jaxbridge.errors import ResultMismatchError  # noqa: E402

X = jnp.array([1.5, -2.0, 3.0, 0.5], jnp.float32)


def run(f, mode, *args):
    return jax.block_until_ready(jax.jit(f)(*args) if mode == "jit" else f(*args))


# ------------------------------------------------------ data-dependent result sizes
DATA_DEPENDENT = {
    "mask": lambda x: x[x > 0],                          # the example
    "masked_select": lambda x: torch.masked_select(x, x > 0),
    "nonzero": lambda x: torch.nonzero(x),
    "unique": lambda x: torch.unique(x),
    "item": lambda x: x[: int((x > 0).sum())],           # a size through .item()
    "numpy": lambda x: torch.from_numpy(np.flatnonzero(x.cpu().numpy() > 0)),
    "rare": lambda x: x[x > 100],                        # empty on every filling
}


@pytest.mark.parametrize("mode", ["eager", "jit"])
@pytest.mark.parametrize("name", DATA_DEPENDENT)
def test_a_data_dependent_result_size_is_an_error_naming_result(name, mode):
    # 46cbabe: shapes found on zeros, (0,), and jax.jit returned [] for x[x > 0]
    f = jt.wrap(DATA_DEPENDENT[name])
    with pytest.raises(ResultMismatchError, match=r"depends on the data.*result=") as info:
        run(f, mode, X)
    assert info.value.problem == "shape"


def test_the_error_says_what_each_filling_gave():
    with pytest.raises(ResultMismatchError) as info:
        jax.jit(jt.wrap(lambda x: x[x > 0]))(X)
    message = str(info.value)
    assert "'<lambda>'" in message and "[0] on zeros" in message and "[4] on ones" in message


def test_a_declared_result_makes_a_data_dependent_size_work_and_checks_it():
    positive = jt.wrap(lambda x: x[x > 0], result=jax.ShapeDtypeStruct((3,), jnp.float32))
    for mode in ("eager", "jit"):
        np.testing.assert_array_equal(run(positive, mode, X), [1.5, 3.0, 0.5])
        with pytest.raises(ResultMismatchError, match=r"shape \[1\], but \[3\] was declared"):
            run(positive, mode, -X)


@pytest.mark.parametrize("mode", ["eager", "jit"])
def test_fixed_shapes_through_data_dependent_steps_still_trace(mode):
    def scaled(x):  # a data-dependent intermediate, a fixed-shape result
        return x * x[x > 0].sum()

    def branchy(x):  # control flow on values, the same shape either way
        return x * 2 if bool(x.sum() > 0) else x * 3

    np.testing.assert_allclose(run(jt.wrap(scaled), mode, X), np.asarray(X) * 5.0)
    np.testing.assert_allclose(run(jt.wrap(branchy), mode, X), np.asarray(X) * 2)
    np.testing.assert_allclose(run(jt.wrap(branchy), mode, -X), -np.asarray(X) * 3)


def test_a_shape_that_depends_on_values_through_control_flow_is_an_error():
    def head(x):
        return x[:2] if bool(x.sum() > 0) else x

    with pytest.raises(ResultMismatchError, match=r"depends on the data.*result="):
        jax.jit(jt.wrap(head))(X)


def test_a_function_of_empty_inputs_may_return_empty_results():
    f = jt.wrap(lambda x: x[x > 0] if bool(x.numel() == 0) else x)
    assert jax.jit(f)(jnp.zeros((0,), jnp.float32)).shape == (0,)


# ------------------------------------------------------ exceptions while finding shapes
class MyError(Exception):
    pass


def validated(x):
    if x.shape[0] != 3:
        raise MyError(f"expected 3 rows, got {x.shape[0]}")
    return x * 2


def always_raises(x):
    raise MyError("no shapes today")


@pytest.mark.parametrize("mode", ["eager", "jit"])
@pytest.mark.parametrize("fn", [validated, always_raises])
def test_an_exception_raised_while_finding_shapes_is_the_users_own(fn, mode):
    # 46cbabe: a TypeError ("could not find the shapes ..."), so `except MyError` missed it
    f = jt.wrap(fn)
    try:
        run(f, mode, X)
    except MyError as err:
        notes = "\n".join(getattr(err, "__notes__", []))
        assert f"function {fn.__name__!r}" in notes and "result=" in notes, notes
    else:
        pytest.fail("MyError was not raised")


def test_a_function_that_needs_real_data_names_result_in_its_own_exception():
    def needs_data(x):
        if bool(x.sum() == 0):
            raise ValueError("all zero")
        return x

    with pytest.raises(ValueError, match="all zero") as info:
        jax.jit(jt.wrap(needs_data)).trace(jnp.ones(3))
    assert "zero-filled tensors" in "".join(info.value.__notes__)
    f = jt.wrap(needs_data, result=jax.ShapeDtypeStruct((3,), jnp.float64))
    np.testing.assert_array_equal(jax.jit(f)(jnp.ones(3)), np.ones(3))


# ------------------------------------------------------ declared vs actual, every form
SHAPES = [(), (0,), (3,), (2, 0), (2, 3)]
DTYPES = [jnp.float32, jnp.float64, jnp.int32]


def _forms(declared_empty: bool):
    """(declared, actual): a declared result (None: found by tracing) and what the
    function returns: a fixed (shape, dtype) or a data-dependent size."""
    shapes = [s for s in SHAPES if (0 in s) == declared_empty]
    declared = st.tuples(st.sampled_from(shapes), st.sampled_from(DTYPES))
    if not declared_empty:
        declared = st.one_of(st.none(), declared)
    actual = st.one_of(st.tuples(st.sampled_from(SHAPES), st.sampled_from(DTYPES)),
                       st.sampled_from(["positive", "above_one"]))
    return st.tuples(declared, actual)


def _function(actual):
    if actual == "positive":
        return lambda x: x[x > 0]
    if actual == "above_one":
        return lambda x: x[x > 1]
    shape, dtype = actual
    torch_dtype = {jnp.float32: torch.float32, jnp.float64: torch.float64,
                   jnp.int32: torch.int32}[dtype]
    return lambda x: torch.full(shape, 2, dtype=torch_dtype, device=x.device) + \
        (x.sum() * 0).to(torch_dtype)


def _outcome(f, mode):
    try:
        return np.asarray(run(f, mode, X))
    except ResultMismatchError as err:
        return ResultMismatchError, err.problem


def _agree(form):
    declared, actual = form
    f = jt.wrap(_function(actual), result=None if declared is None
                else jax.ShapeDtypeStruct(*declared))
    eager, jitted = _outcome(f, "eager"), _outcome(f, "jit")
    if isinstance(eager, tuple) or isinstance(jitted, tuple):
        assert isinstance(eager, tuple) and eager == jitted, (form, eager, jitted)
    else:
        np.testing.assert_array_equal(eager, jitted)
        assert eager.dtype == jitted.dtype
    if isinstance(actual, str):  # X has 3 positive entries, 2 above one
        fits = declared is not None and declared[0] == ((3,) if actual == "positive" else (2,)) \
            and declared[1] == jnp.float32
    else:
        fits = declared is None or tuple(declared[0]) == tuple(actual[0]) and \
            np.dtype(declared[1]) == np.dtype(actual[1])
    if fits:
        assert not isinstance(eager, tuple), (form, eager)
    else:  # never a silent wrong value
        assert isinstance(eager, tuple), (form, eager)


@settings(max_examples=25, deadline=None)
@given(_forms(declared_empty=False))
def test_declared_and_actual_results_agree_in_jit_and_eager(form):
    _agree(form)


@settings(max_examples=10, deadline=None, phases=(Phase.explicit, Phase.generate))
@given(_forms(declared_empty=True))
def test_declared_empty_results_still_run_the_function_under_jit(form):
    _agree(form)
