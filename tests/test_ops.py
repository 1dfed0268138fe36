"""Built-in C++ kernels in jaxbridge.ops: values, gradients, transformations, errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.special
from conftest import extension_missing, tol
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.test_util import check_grads

import jaxbridge as jb
import jaxbridge.ops as ops

if not ops.available():  # pragma: no cover - only with JAXBRIDGE_TESTS_WITHOUT_EXTENSIONS=1
    pytest.skip(f"jaxbridge._builtin not built: {extension_missing('_builtin')}",
                allow_module_level=True)

FLOATS = [np.float32, np.float64]


# ----------------------------------------------------------------- references
def np_softplus(x, beta=1.0):
    return np.logaddexp(0.0, beta * np.asarray(x, np.float64)) / beta


def np_tridiag(dl, d, du, b):
    dl, d, du, b = (np.asarray(a, np.float64) for a in (dl, d, du, b))
    n = d.shape[-1]
    a = np.zeros((*d.shape, n))
    idx = np.arange(n)
    a[..., idx, idx] = d
    a[..., idx[1:], idx[:-1]] = dl[..., 1:]
    a[..., idx[:-1], idx[1:]] = du[..., :-1]
    return np.linalg.solve(a, b[..., None])[..., 0]


def np_rbf(x, y, l):
    x, y, l = (np.asarray(a, np.float64) for a in (x, y, l))
    d2 = ((x[..., :, None, :] - y[..., None, :, :]) ** 2).sum(-1)
    return np.exp(-d2 / (2 * l[..., None, None] ** 2))


def tridiag_args(rng, shape, dtype):
    dl, du, b = rng.normal(size=(3, *shape))
    d = 4.0 + rng.random(shape)  # diagonally dominant
    return tuple(np.asarray(a, dtype) for a in (dl, d, du, b))


def rbf_args(rng, batch, n, m, dim, dtype):
    x = rng.normal(size=(*batch, n, dim))
    y = rng.normal(size=(*batch, m, dim))
    l = 0.8 + rng.random(batch)
    return tuple(np.asarray(a, dtype) for a in (x, y, l))


# ----------------------------------------------------------------- values
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("beta", [1.0, 2.5])
def test_softplus_values(rng, dtype, beta):
    x = np.asarray(rng.normal(size=(5, 7)) * 10, dtype)
    got = ops.softplus(x, beta=beta)
    assert got.dtype == dtype and got.shape == x.shape
    np.testing.assert_allclose(got, np_softplus(x, beta), rtol=10 * tol(dtype), atol=1e-6)


def test_softplus_extreme_values_float32():
    x = jnp.array([-1e4, -100.0, -20.0, 0.0, 20.0, 100.0, 1e4], jnp.float32)
    y = ops.softplus(x)
    g = jax.grad(lambda x: ops.softplus(x).sum())(x)
    assert np.all(np.isfinite(y)) and np.all(np.isfinite(g))
    np.testing.assert_allclose(y, np_softplus(x), rtol=1e-6, atol=1e-30)
    np.testing.assert_allclose(g, [0, 0, 2.061e-9, 0.5, 1, 1, 1], rtol=1e-3, atol=1e-30)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("shape", [(1,), (2,), (9,), (3, 17), (2, 2, 5)])
def test_tridiagonal_solve_values(rng, dtype, shape):
    args = tridiag_args(rng, shape, dtype)
    got = ops.tridiagonal_solve(*args)
    assert got.dtype == dtype and got.shape == shape
    np.testing.assert_allclose(got, np_tridiag(*args), rtol=50 * tol(dtype), atol=1e-5)


def test_tridiagonal_matches_lax(rng):
    dl, d, du, b = tridiag_args(rng, (4, 12), np.float64)
    want = jax.lax.linalg.tridiagonal_solve(dl, d, du, b[..., None])[..., 0]
    np.testing.assert_allclose(ops.tridiagonal_solve(dl, d, du, b), want, rtol=1e-12)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("batch,n,m,dim", [((), 4, 5, 3), ((), 1, 1, 1), ((2,), 3, 6, 2),
                                           ((2, 3), 2, 2, 4)])
def test_rbf_kernel_values(rng, dtype, batch, n, m, dim):
    x, y, l = rbf_args(rng, batch, n, m, dim, dtype)
    got = ops.rbf_kernel(x, y, l)
    assert got.dtype == dtype and got.shape == (*batch, n, m)
    np.testing.assert_allclose(got, np_rbf(x, y, l), rtol=20 * tol(dtype), atol=1e-6)


def test_rbf_scalar_length_scale_broadcasts(rng):
    x, y, _ = rbf_args(rng, (3,), 2, 4, 2, np.float64)
    np.testing.assert_allclose(ops.rbf_kernel(x, y, 0.7),
                               np_rbf(x, y, np.full(3, 0.7)), rtol=1e-12)
    # the default length scale is 1
    np.testing.assert_allclose(ops.rbf_kernel(x, y), np_rbf(x, y, np.ones(3)), rtol=1e-12)


# ----------------------------------------------------------------- vectorized CPU paths
# The CPU kernels are compiled per instruction set (baseline, AVX2, AVX-512) and
# picked at run time; `cpu_isa` runs a test under each one this CPU has.
def _isas():
    from jaxbridge import _builtin
    best = _builtin._cpu_isa()
    return ["baseline", "avx2", "avx512"][: ["baseline", "avx2", "avx512"].index(best) + 1]


@pytest.fixture(params=_isas())
def cpu_isa(request):
    from jaxbridge import _builtin
    best = _builtin._cpu_isa()
    assert _builtin._set_cpu_isa_limit(request.param) == request.param
    yield request.param
    _builtin._set_cpu_isa_limit(best)


def np_rbf_derivatives(x, y, l, ct, tx, ty, tl):
    """float64 (gx, gy, gl) = ct-weighted adjoint and dK = tangent of rbf_kernel."""
    x, y, l, ct, tx, ty, tl = (np.asarray(a, np.float64) for a in (x, y, l, ct, tx, ty, tl))
    diff = x[..., :, None, :] - y[..., None, :, :]
    d2 = (diff**2).sum(-1)
    lb = l[..., None, None]
    k = np.exp(-d2 / (2 * lb**2))
    g = ct * k
    gx = -(g[..., None] * diff).sum(-2) / lb**2
    gy = (g[..., None] * diff).sum(-3) / lb**2
    gl = (g * d2).sum((-1, -2)) / l**3
    tdiff = tx[..., :, None, :] - ty[..., None, :, :]
    dk = k * (-(diff * tdiff).sum(-1) / lb**2 + d2 * tl[..., None, None] / lb**3)
    return gx, gy, gl, dk


@pytest.mark.parametrize("dtype", FLOATS)
def test_softplus_special_values(cpu_isa, dtype):
    big = {np.float32: 1e4, np.float64: 1e6}[dtype]
    x = np.array([-np.inf, -big, -800, -100, -20, -1e-3, -0.0, 0.0, 1e-3, 20, 100, big, np.inf,
                  np.nan], dtype)
    y = np.asarray(ops.softplus(x))
    g = np.asarray(jax.grad(lambda x: ops.softplus(x).sum())(x))
    with np.errstate(invalid="ignore"):  # the NumPy reference at inf - inf
        ref = np_softplus(x)
    assert np.isnan(y[-1]) and np.isnan(g[-1])
    y, g, ref, xs = y[:-1], g[:-1], ref[:-1], x[:-1]
    assert y[0] == 0 and y[-1] == np.inf and g[0] == 0 and g[-1] == 1
    assert np.all(np.isfinite(y[1:-1])) and np.all(np.isfinite(g))
    assert np.all(y[xs >= 100] == xs[xs >= 100])  # exactly x once exp(-x) is below an ulp
    # softplus(-100) = 3.7e-44 is subnormal in float32, flushed to 0 under XLA (which runs
    # with flush-to-zero); values down to the smallest normal number are accurate.
    assert np.all(y >= 0) and 0 <= y[3] < 1e-40 and y[4] > 0
    tiny = np.finfo(dtype).tiny
    np.testing.assert_allclose(y, ref, rtol=4 * np.finfo(dtype).eps, atol=tiny)
    sig = scipy.special.expit(xs.astype(np.float64))
    np.testing.assert_allclose(g, sig, rtol=8 * np.finfo(dtype).eps, atol=tiny)


@pytest.mark.parametrize("dtype", FLOATS)
def test_softplus_accuracy_over_range(cpu_isa, dtype):
    # Every lane position and tail length: 7919 (prime) points, dense over the range.
    lo = {np.float32: -110.0, np.float64: -760.0}[dtype]
    x = np.linspace(lo, 40.0, 7919).astype(dtype)
    for beta in (1.0, 0.3):
        y = np.asarray(jax.jit(lambda x, b=beta: ops.softplus(x, beta=b))(x))
        g = np.asarray(jax.grad(lambda x, b=beta: ops.softplus(x, beta=b).sum())(x))
        # The kernel rounds z = beta x to dtype first (as any dtype implementation does);
        # compare with the exact function of that z.
        z = (np.asarray(beta, dtype) * x).astype(np.float64)
        tiny = np.finfo(dtype).tiny  # subnormal results are flushed to 0 under XLA
        np.testing.assert_allclose(y, np_softplus(z) / beta, rtol=6 * np.finfo(dtype).eps,
                                   atol=4 * tiny / beta)
        np.testing.assert_allclose(g, scipy.special.expit(z), rtol=8 * np.finfo(dtype).eps,
                                   atol=4 * tiny)


@pytest.mark.parametrize("n", [1, 3, 15, 16, 17, 33, 65, 1031, 100_003])
def test_softplus_sizes(rng, n):
    # Not multiples of the vector width; the largest spans several parallel chunks.
    for dtype in FLOATS:
        x = np.asarray(rng.normal(size=n) * 8, dtype)
        np.testing.assert_allclose(ops.softplus(x), np_softplus(x), rtol=6 * np.finfo(dtype).eps,
                                   atol=1e-30)


RBF_SHAPES = [  # (batch, n, m, dim): row tiles / panel widths (32 f32, 16 f64) not filled,
    ((), 1, 1, 1),  # both distance forms (dim <= 8 direct, larger via |x|^2+|y|^2-2x.y)
    ((), 17, 33, 3),
    ((2,), 9, 70, 8),
    ((), 70, 45, 9),
    ((3,), 5, 17, 64),
    ((), 130, 100, 64),
]


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("batch,n,m,dim", RBF_SHAPES)
def test_rbf_kernel_all_modes_vs_numpy(cpu_isa, rng, dtype, batch, n, m, dim):
    x, y, l = rbf_args(rng, batch, n, m, dim, dtype)
    l = l * np.asarray(np.sqrt(dim), dtype)  # keep K away from 0 at dim 64
    ct, tx, ty, tl = (np.asarray(rng.normal(size=s), dtype)
                      for s in ((*batch, n, m), x.shape, y.shape, l.shape))
    tol = {np.float32: 2e-5, np.float64: 1e-12}[dtype]
    k = ops.rbf_kernel(x, y, l)
    np.testing.assert_allclose(k, np_rbf(x, y, l), rtol=tol, atol=tol)
    gx, gy, gl = jax.grad(lambda *a: (ops.rbf_kernel(*a) * ct).sum(), argnums=(0, 1, 2))(x, y, l)
    dk = jax.jvp(ops.rbf_kernel, (x, y, l), (tx, ty, tl))[1]
    want = np_rbf_derivatives(x, y, l, ct, tx, ty, tl)
    for got, ref in zip((gx, gy, gl, dk), want):
        scale = np.abs(ref).max() + 1e-30
        np.testing.assert_allclose(np.asarray(got, np.float64) / scale, ref / scale,
                                   atol=20 * tol)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("dim", [3, 64])
@pytest.mark.parametrize("offset", [0.0, 1000.0])
def test_rbf_kernel_close_points(rng, dtype, dim, offset):
    # Identical and nearly identical points, also far from the origin: the
    # |x|^2 + |y|^2 - 2 x.y form (dim > 8) must not lose K to cancellation (it works on
    # data centred at the mean of y), K stays in [0, 1] and K(x, x) = 1.
    x = offset + rng.normal(size=(20, dim))
    y = np.concatenate([x[:5], x[5:10] + 1e-3 * rng.normal(size=(5, dim)),
                        offset + rng.normal(size=(7, dim))])
    x, y = np.asarray(x, dtype), np.asarray(y, dtype)
    l = np.asarray(0.5 * np.sqrt(dim), dtype)
    k = np.asarray(ops.rbf_kernel(x, y, l))
    ref = np_rbf(x, y, l)
    assert np.all((k >= 0) & (k <= 1))
    tol = {np.float32: 1e-5, np.float64: 1e-13}[dtype]
    np.testing.assert_allclose(np.diag(k[:5, :5]), 1.0, atol=tol)
    np.testing.assert_allclose(k, ref, atol=tol)
    gx, gy, gl = jax.grad(lambda *a: ops.rbf_kernel(*a).sum(), argnums=(0, 1, 2))(x, y, l)
    want = np_rbf_derivatives(x, y, l, np.ones_like(ref), x, y, l)
    for got, w in zip((gx, gy, gl), want[:3]):
        scale = np.abs(w).max()
        np.testing.assert_allclose(np.asarray(got, np.float64) / scale, w / scale,
                                   atol=100 * tol)


# ----------------------------------------------------------------- gradients (float64 FD)
def test_softplus_grads(rng):
    x = rng.normal(size=(6,)) * 3
    check_grads(lambda x: ops.softplus(x, beta=1.5), (x,), order=1, modes=("fwd", "rev"))


def test_tridiagonal_grads(rng):
    args = tridiag_args(rng, (2, 6), np.float64)
    check_grads(ops.tridiagonal_solve, args, order=1, modes=("fwd", "rev"))
    # The ignored corner entries get zero gradients.
    g = jax.grad(lambda *a: ops.tridiagonal_solve(*a).sum(), argnums=(0, 2))(*args)
    assert np.all(g[0][..., 0] == 0) and np.all(g[1][..., -1] == 0)


def test_rbf_grads(rng):
    x, y, l = rbf_args(rng, (), 3, 4, 2, np.float64)
    check_grads(ops.rbf_kernel, (x, y, l), order=1, modes=("fwd", "rev"))
    xb, yb, lb = rbf_args(rng, (2,), 3, 2, 3, np.float64)
    check_grads(ops.rbf_kernel, (xb, yb, lb), order=1, modes=("fwd", "rev"))


def test_jacfwd_equals_jacrev(rng):
    args = tridiag_args(rng, (5,), np.float64)
    for i in range(4):
        np.testing.assert_allclose(jax.jacfwd(ops.tridiagonal_solve, i)(*args),
                                   jax.jacrev(ops.tridiagonal_solve, i)(*args), atol=1e-13)


# ----------------------------------------------------------------- eager / jit / vmap grid
CASES = {
    "softplus": (lambda rng: (rng.normal(size=(4, 5)),), ops.softplus),
    "tridiag": (lambda rng: tridiag_args(rng, (4, 6), np.float64), ops.tridiagonal_solve),
    "rbf": (lambda rng: rbf_args(rng, (4,), 3, 2, 2, np.float64), ops.rbf_kernel),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("mode", ["eager", "jit", "vmap", "jit_vmap", "vmap_grad"])
def test_transformation_grid(rng, case, mode):
    make, op = CASES[case]
    args = make(rng)

    def loss(*a):
        return (op(*a) ** 2).sum()

    per_example = [op(*(a[i] for a in args)) for i in range(4)]
    want = np.stack(per_example)
    if mode == "eager":
        np.testing.assert_allclose(op(*args), want, rtol=1e-12)
    elif mode == "jit":
        np.testing.assert_allclose(jax.jit(op)(*args), want, rtol=1e-12)
    elif mode == "vmap":
        np.testing.assert_allclose(jax.vmap(op)(*args), want, rtol=1e-12)
    elif mode == "jit_vmap":
        np.testing.assert_allclose(jax.jit(jax.vmap(op))(*args), want, rtol=1e-12)
    else:
        g = jax.jit(jax.vmap(jax.grad(loss, argnums=tuple(range(len(args))))))(*args)
        for i in range(4):
            gi = jax.grad(loss, argnums=tuple(range(len(args))))(*(a[i] for a in args))
            for a, b in zip(g, gi):
                np.testing.assert_allclose(a[i], b, rtol=1e-10, atol=1e-14)


def test_vmap_is_one_call(rng):
    dl, d, du, b = tridiag_args(rng, (3, 5), np.float64)
    jaxpr = jax.make_jaxpr(jax.vmap(ops.tridiagonal_solve, in_axes=(0, 0, 0, None)))(
        dl, d, du, b[0])
    prims = [e.primitive.name for e in jaxpr.jaxpr.eqns]
    assert prims.count("jaxbridge_kernel") == 1 and "while" not in prims and "scan" not in prims
    got = jax.vmap(ops.tridiagonal_solve, in_axes=(0, 0, 0, None))(dl, d, du, b[0])
    np.testing.assert_allclose(got, np_tridiag(dl, d, du, np.broadcast_to(b[0], d.shape)),
                               rtol=1e-12)


def test_grad_of_vmap_sums_unbatched(rng):
    x, y, l = rbf_args(rng, (), 3, 4, 2, np.float64)
    xs = np.stack([x, x + 1.0])
    g = jax.grad(lambda y: jax.vmap(lambda x: ops.rbf_kernel(x, y, l))(xs).sum())(y)
    g0 = sum(jax.grad(lambda y: ops.rbf_kernel(xi, y, l).sum())(y) for xi in xs)
    np.testing.assert_allclose(g, g0, rtol=1e-12)


def test_scan_and_fori_loop(rng):
    x0 = rng.normal(size=(8,))
    twin = lambda c: jnp.logaddexp(c, 0.0) - 0.5  # noqa: E731 - softplus in jnp

    def scan_of(sp):
        return lambda x: jax.lax.scan(lambda c, _: (sp(c), None), x, None, length=5)[0]

    def fori_of(sp):
        return lambda x: jax.lax.fori_loop(0, 5, lambda i, c: sp(c) * (1 + 0.1 * i), x)

    ours_step = lambda c: ops.softplus(c) - 0.5  # noqa: E731
    ref = x0
    for _ in range(5):
        ref = np_softplus(ref) - 0.5
    np.testing.assert_allclose(jax.jit(scan_of(ours_step))(x0), ref, rtol=1e-12)
    for loop in (scan_of, fori_of):
        ours, want = loop(ours_step), loop(twin)
        np.testing.assert_allclose(jax.jit(ours)(x0), want(x0), rtol=1e-12)
        # Gradients through the loop against JAX's autodiff of the jnp twin: reverse
        # (grad of a weighted sum) and forward (the full Jacobian).
        w = jnp.asarray(rng.normal(size=8))
        np.testing.assert_allclose(jax.jit(jax.grad(lambda x: ours(x) @ w))(x0),
                                   jax.grad(lambda x: want(x) @ w)(x0), rtol=1e-12)
        np.testing.assert_allclose(jax.jit(jax.jacfwd(ours))(x0), jax.jacfwd(want)(x0),
                                   rtol=1e-12, atol=1e-15)


def test_rbf_kernel_declares_its_batch_dims_in_the_lowering():
    """XLA may split the call along the shared leading dims (under sharding): the
    lowering must say how many (a mutant declaring 0 survived every numerical test)."""
    x, y, length = jnp.ones((3, 4, 2)), jnp.ones((3, 5, 2)), jnp.full(3, 0.5)
    batched = jax.jit(ops.rbf_kernel).lower(x, y, length).as_text()
    assert 'num_batch_dims = "1"' in batched
    scalar_length = jax.jit(ops.rbf_kernel).lower(x, y, 0.5).as_text()
    assert 'num_batch_dims = "1"' in scalar_length  # broadcast to the batch dims
    assert "num_batch_dims" not in jax.jit(ops.rbf_kernel).lower(x[0], y[0], 0.5).as_text()


def test_export_round_trip(rng):
    pytest.importorskip("flatbuffers")  # needed by jax.export serialization
    args = tridiag_args(rng, (2, 5), np.float64)

    def f(dl, d, du, b):
        x = ops.tridiagonal_solve(dl, d, du, b)
        return ops.softplus(x).sum(), jax.grad(lambda b: ops.rbf_kernel(
            x[..., None], b[..., None], 1.0).sum())(b)

    exp = jax.export.export(jax.jit(f), disabled_checks=ops.export_checks())(*args)
    restored = jax.export.deserialize(exp.serialize())
    for a, b in zip(restored.call(*args), f(*args)):
        np.testing.assert_allclose(a, b, rtol=1e-12)
    # Gradients through the deserialized function (vjp_order=1).
    exp1 = jax.export.export(jax.jit(lambda b: ops.softplus(b).sum()),
                             disabled_checks=ops.export_checks())(args[3])
    r1 = jax.export.deserialize(exp1.serialize(vjp_order=1))
    np.testing.assert_allclose(jax.grad(r1.call)(args[3]), jax.nn.sigmoid(args[3]), rtol=1e-12)


# ----------------------------------------------------------------- bad input
def test_bad_dtype_message():
    with pytest.raises(TypeError, match=r"softplus: argument 'x': expected dtype float32 or "
                                        r"float64, received int32"):
        ops.softplus(jnp.arange(3, dtype=jnp.int32))
    with pytest.raises(TypeError, match=r"tridiagonal_solve: argument 'b': expected dtype "
                                        r"float64 \(the dtype of 'd'\), received float32"):
        ops.tridiagonal_solve(*(np.ones(3),) * 3, np.ones(3, np.float32))
    # beta is keyword-only, so a second positional argument is refused, not taken as beta
    with pytest.raises(TypeError, match="positional"):
        ops.softplus(jnp.ones(3), 2.0)


def test_bad_shape_and_rank_messages():
    with pytest.raises(TypeError, match=r"tridiagonal_solve: argument 'du': expected shape "
                                        r"\(4,\) \(the shape of 'd'\), received \(3,\)"):
        ops.tridiagonal_solve(np.ones(4), np.ones(4), np.ones(3), np.ones(4))
    with pytest.raises(TypeError, match=r"argument 'd': expected rank >= 1"):
        ops.tridiagonal_solve(*(np.float64(1.0),) * 4)
    with pytest.raises(TypeError, match=r"rbf_kernel: argument 'x': expected rank >= 2"):
        ops.rbf_kernel(np.ones(3), np.ones((2, 3)), 1.0)
    with pytest.raises(TypeError, match=r"rbf_kernel: argument 'y': expected shape \(m, 3\)"):
        ops.rbf_kernel(np.ones((2, 3)), np.ones((2, 4)), 1.0)
    with pytest.raises(TypeError, match=r"'y': expected shape \(5, 2, m, 3\) \(batch dims"):
        ops.rbf_kernel(np.ones((5, 2, 4, 3)), np.ones((5, 3, 4, 3)), 1.0)
    with pytest.raises(TypeError, match=r"'length_scale': expected a scalar or shape \(2,\)"):
        ops.rbf_kernel(np.ones((2, 2, 3)), np.ones((2, 4, 3)), np.ones(3))
    with pytest.raises(TypeError, match=r"'beta': expected a positive"):
        ops.softplus(np.ones(2), beta=-1.0)


BAD_BETAS = [  # (beta, dtype of x, what the message says)
    (float("inf"), np.float64, r"number, received inf"),  # issue #13: NaNs
    (-float("inf"), np.float32, r"number, received -inf"),
    (float("nan"), np.float64, r"number, received nan"),
    (0.0, np.float32, r"number, received 0.0"),
    (-2, np.float64, r"number, received -2"),
    (10**400, np.float64, r"number, received 1000"),  # overflows float()
    # Finite, but beta or 1/beta is not a normal number of x's dtype: NaN or 0 * inf.
    (1e39, np.float32, r"number in \[1.18e-38, 8.51e\+37\] for x of dtype float32 \(beta "
                       r"and 1/beta must be normal float32 numbers\), received 1e\+39"),
    (1e-40, np.float32, r"number in \[1.18e-38, 8.51e\+37\] .* received 1e-40"),
    (5e-324, np.float64, r"number in \[2.23e-308, 4.49e\+307\] .* received 5e-324"),
    (True, np.float64, r"Python number \(static: .*received bool True"),
    ("2", np.float32, r"Python number \(static: .*received str '2'.*softplus\(beta \* x\)"),
    (jnp.float32(2.0), np.float32, r"Python number \(static: .*received ArrayImpl"),
]


@pytest.mark.parametrize("beta, dtype, message", BAD_BETAS,
                         ids=[f"{b!r:.12}-{np.dtype(d).name}" for b, d, _ in BAD_BETAS])
def test_softplus_bad_beta_is_an_error_not_nan(beta, dtype, message):
    x = jnp.zeros(3, dtype)
    match = r"jaxbridge.ops.softplus: argument 'beta': expected a positive, finite " + message
    with pytest.raises(jb.KernelError, match=match):
        ops.softplus(x, beta=beta)
    with pytest.raises(jb.KernelError, match=match):  # at trace time: nothing runs
        jax.jit(lambda x: ops.softplus(x, beta=beta)).trace(x)


@pytest.mark.parametrize("dtype", FLOATS)
def test_softplus_extreme_valid_beta_is_finite(dtype):
    # The ends of the accepted range still give finite values and gradients.
    lo = float(np.finfo(dtype).tiny)
    x = jnp.asarray([-1.0, 0.0, 1.0], dtype)
    for beta in (lo, 1 / lo, 3, np.float32(0.5)):
        y, g = jax.value_and_grad(lambda x: ops.softplus(x, beta=beta).sum())(x)
        assert np.isfinite(np.asarray(y)) and np.isfinite(np.asarray(g)).all(), beta


# beta x past the dtype's range (1e30 and 1e300 in float64, 1e30 and 1e38 in float32)
# while x itself is finite: the result is about x, never inf (the kernels used to
# scale max(beta x, 0) back by 1/beta, and beta x had overflowed).
HUGE_BETA_X = [(np.float64, 1e10, 1e20), (np.float64, 1e10, 1e290), (np.float64, 1e300, 1e300),
               (np.float32, 1e10, 1e20), (np.float32, 1e20, 1e30), (np.float32, 1e37, 1e30)]


def _huge_beta_x_case(dtype, beta, x):
    xs = np.array([x, -x, 1.0, -1.0, 0.0], dtype)
    want = np.array([x, 0.0, 1.0, 0.0, np.log(2.0) / beta])
    sigmoid = np.where(xs > 0, 1.0, np.where(xs < 0, 0.0, 0.5))  # exact at these |beta x|
    return xs, want, sigmoid


@pytest.mark.parametrize("dtype, beta, x", HUGE_BETA_X)
def test_softplus_does_not_overflow_for_huge_beta_x(dtype, beta, x):
    xs, want, sigmoid = _huge_beta_x_case(dtype, beta, x)

    @jax.jit
    def loss_and_grad(v):
        return jax.value_and_grad(lambda u: ops.softplus(u, beta=beta).sum())(v)

    y = jax.jit(lambda v: ops.softplus(v, beta=beta))(xs)
    np.testing.assert_allclose(y, want.astype(dtype), rtol=tol(dtype), atol=0)
    total, g = loss_and_grad(xs)
    assert np.isfinite(float(total))
    np.testing.assert_array_equal(g, sigmoid.astype(dtype))
    _, tangent = jax.jvp(lambda u: ops.softplus(u, beta=beta), (xs,), (np.ones_like(xs),))
    np.testing.assert_array_equal(tangent, sigmoid.astype(dtype))


def test_rbf_python_length_scale_takes_the_dtype_of_x_only_when_exact():
    x = jnp.ones((2, 3), jnp.float32)
    k = jax.jit(lambda x: ops.rbf_kernel(x, x, 2))(x)  # the literal 2 becomes float32
    assert k.dtype == jnp.float32 and np.allclose(k, 1.0)
    with pytest.raises(TypeError, match=r"rbf_kernel: argument 'length_scale': 1e\+40 "
                                        r"overflows float32"):
        ops.rbf_kernel(x, x, 1e40)  # was silently inf


def test_bad_input_raises_under_jit_at_trace_time():
    f = jax.jit(lambda a: ops.tridiagonal_solve(a, a, a[:2], a))
    with pytest.raises(TypeError, match="tridiagonal_solve"):
        f.trace(jnp.ones(3))


# ----------------------------------------------------------------- property-based
@settings(max_examples=25, deadline=None)
@given(shape=st.lists(st.integers(1, 5), min_size=0, max_size=3),
       dtype=st.sampled_from(FLOATS), seed=st.integers(0, 2**16), beta=st.floats(0.1, 5))
def test_property_softplus(shape, dtype, seed, beta):
    x = np.asarray(np.random.default_rng(seed).normal(size=shape) * 30, dtype)
    y = np.asarray(ops.softplus(x, beta=beta))
    assert y.shape == x.shape and y.dtype == dtype
    np.testing.assert_allclose(y, np_softplus(x, beta), rtol=20 * tol(dtype), atol=1e-6)


@settings(max_examples=25, deadline=None)
@given(batch=st.lists(st.integers(1, 3), max_size=2), n=st.integers(1, 40),
       dtype=st.sampled_from(FLOATS), seed=st.integers(0, 2**16))
def test_property_tridiag(batch, n, dtype, seed):
    args = tridiag_args(np.random.default_rng(seed), (*batch, n), dtype)
    np.testing.assert_allclose(ops.tridiagonal_solve(*args), np_tridiag(*args),
                               rtol=100 * tol(dtype), atol=1e-5)


@settings(max_examples=20, deadline=None)
@given(batch=st.lists(st.integers(1, 3), max_size=2), n=st.integers(1, 6), m=st.integers(1, 6),
       dim=st.integers(1, 4), dtype=st.sampled_from(FLOATS), seed=st.integers(0, 2**16))
def test_property_rbf(batch, n, m, dim, dtype, seed):
    x, y, l = rbf_args(np.random.default_rng(seed), tuple(batch), n, m, dim, dtype)
    np.testing.assert_allclose(ops.rbf_kernel(x, y, l), np_rbf(x, y, l),
                               rtol=50 * tol(dtype), atol=1e-6)
    g = jax.grad(lambda l: ops.rbf_kernel(x, y, l).sum())(l)
    assert g.shape == l.shape and np.all(np.isfinite(g))


# ----------------------------------------------------------------- GPU
# The CUDA kernels against the C++ CPU kernels (and NumPy), for values, adjoints,
# tangents and vmap, at sizes that take each GPU code path: PCR (n <= 1024, one block
# per system) and Thomas (one thread per system) for tridiagonal_solve, grid-stride
# loops past the launch cap for softplus.
def _on(dev, args):
    return [jax.device_put(a, dev) for a in args]


def _gpu_cases(rng, dtype):
    yield "softplus", ops.softplus, (np.asarray(rng.normal(size=(3, 333)) * 20, dtype),)
    for shape in [(5, 7), (3, 1024), (2, 1500), (1, 1)]:
        yield f"tridiag{shape}", ops.tridiagonal_solve, tridiag_args(rng, shape, dtype)
    yield "rbf(2,5,4,3)", ops.rbf_kernel, rbf_args(rng, (2,), 5, 4, 3, dtype)
    yield "rbf(300,200,7)", ops.rbf_kernel, rbf_args(rng, (), 300, 200, 7, dtype)
    # Several 16 x 16 tiles and 16-coordinate stages, none of them full, in a batch of 3
    # (the CUDA forward/tangent tiles and the per-row adjoint blocks' strides)...
    # (points scaled so that k is of order one, not underflowing at distances ~ sqrt(dim))
    yield "rbf(3,37,70,40)", ops.rbf_kernel, _scaled(rbf_args(rng, (3,), 37, 70, 40, dtype), 0.15)
    # ... and rows too long for shared memory (the adjoint's one-thread-per-row fallback).
    yield "rbf(1,3,5,6200)", ops.rbf_kernel, _scaled(rbf_args(rng, (1,), 3, 5, 6200, dtype), 0.01)


def _scaled(args, factor):
    x, y, l = args
    return x * x.dtype.type(factor), y * y.dtype.type(factor), l


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("mode", ["value", "vjp", "jvp", "vmap"])
def test_gpu_matches_cpu(gpu, rng, dtype, mode):
    cpu = jax.devices("cpu")[0]
    rtol = 50 * tol(dtype)
    for name, op, args in _gpu_cases(rng, dtype):
        if mode == "value":
            fn, extra = jax.jit(op), ()
        elif mode == "vjp":
            out = np.asarray(jax.eval_shape(op, *args).shape)
            extra = (np.asarray(rng.normal(size=tuple(out)), dtype),)
            fn = jax.jit(lambda *a: jax.vjp(op, *a[:-1])[1](a[-1]))
        elif mode == "jvp":
            extra = tuple(np.asarray(rng.normal(size=np.shape(a)), dtype) for a in args)
            k = len(args)
            fn = jax.jit(lambda *a: jax.jvp(op, a[:k], a[k:])[1])
        else:  # a batch of two through vmap: one call with a batch axis
            args = tuple(np.stack([a, a if a.ndim == 0 else np.flip(a, -1)]) for a in args)
            fn, extra = jax.jit(jax.vmap(op)), ()
        got = jax.tree.leaves(fn(*_on(gpu, (*args, *extra))))
        want = jax.tree.leaves(fn(*_on(cpu, (*args, *extra))))
        assert all(g.devices() == {gpu} for g in got), name
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=rtol, atol=rtol * np.abs(w).max(),
                                       err_msg=f"{name} {mode}")


@pytest.mark.gpu
def test_gpu_softplus_extremes_and_grid_stride(gpu):
    x = jax.device_put(np.array([-1e4, -100, -20, 0, 20, 100, 1e4, np.inf, -np.inf],
                                np.float32), gpu)
    y = ops.softplus(x)
    np.testing.assert_allclose(y[:7], np_softplus(np.asarray(x[:7])), rtol=1e-6, atol=1e-30)
    assert y[7] == np.inf and y[8] == 0
    g = jax.grad(lambda x: ops.softplus(x).sum())(x[:7])
    assert np.all(np.isfinite(g)) and g[0] == 0 and g[-1] == 1
    # more elements than one launch covers (65535 * 16 blocks of 256 threads)
    n = 65535 * 16 * 256 + 12345
    big = jax.device_put(jnp.linspace(-30, 30, n, dtype=jnp.float32), gpu)
    err = jax.jit(lambda v: jnp.max(jnp.abs(ops.softplus(v) - jax.nn.softplus(v))))(big)
    assert float(err) < 1e-5
    gerr = jax.jit(lambda v: jnp.max(jnp.abs(
        jax.grad(lambda u: ops.softplus(u).sum())(v) - jax.nn.sigmoid(v))))(big)
    assert float(gerr) < 1e-6


@pytest.mark.gpu
@pytest.mark.parametrize("dtype, beta, x", HUGE_BETA_X)
def test_gpu_softplus_does_not_overflow_for_huge_beta_x(gpu, dtype, beta, x):
    xs, want, sigmoid = _huge_beta_x_case(dtype, beta, x)
    xs = jax.device_put(xs, gpu)
    y = jax.jit(lambda v: ops.softplus(v, beta=beta))(xs)
    np.testing.assert_allclose(y, want.astype(dtype), rtol=tol(dtype), atol=0)
    g = jax.jit(jax.grad(lambda u: ops.softplus(u, beta=beta).sum()))(xs)
    np.testing.assert_array_equal(g, sigmoid.astype(dtype))


@pytest.mark.gpu
def test_gpu_aliased_cotangent_is_not_clobbered(gpu, rng):
    x, ct = (jax.device_put(a, gpu) for a in rng.normal(size=(2, 1000)))
    before = np.asarray(ct)
    gx, back = jax.jit(lambda x, c: (jax.vjp(ops.softplus, x)[1](c)[0], c))(x, ct)
    np.testing.assert_allclose(gx, before * jax.nn.sigmoid(np.asarray(x)), rtol=1e-12)
    np.testing.assert_array_equal(back, before)
    np.testing.assert_array_equal(ct, before)


@pytest.mark.gpu
def test_gpu_handlers_reject_bad_shapes_and_take_empty_inputs(gpu):
    k = jb.kernel("jaxbridge_tridiagonal_solve_fwd", name="tri_unchecked_gpu",
                  result=lambda dl, d, du, b: b, platforms=ops._register())
    bad = _on(gpu, (np.ones(4), np.ones(4), np.ones(3), np.ones(4)))
    with pytest.raises(Exception, match=r"jaxbridge_tridiagonal_solve_fwd.*argument 'du'"):
        k(*bad).block_until_ready()
    for op, args in [(ops.softplus, (np.zeros((0, 3)),)),
                     (ops.tridiagonal_solve, tridiag_args(np.random.default_rng(0), (0, 4),
                                                          np.float64)),
                     (ops.rbf_kernel, rbf_args(np.random.default_rng(0), (), 0, 3, 2,
                                               np.float64))]:
        out = op(*_on(gpu, args))
        assert out.size == 0
        assert all(g.size == 0 or np.all(np.isfinite(g)) for g in jax.tree.leaves(
            jax.grad(lambda *a: op(*a).sum(), argnums=tuple(range(len(args))))(*_on(gpu, args))))


def test_instruction_set_variable_warns_only_when_it_names_no_instruction_set(monkeypatch):
    """The check behind JAXBRIDGE_CPU_ISA (the fresh-interpreter test below covers the
    kernels' choice): silent when unset, empty or valid in any case, a RuntimeWarning
    naming the value otherwise."""
    import warnings
    for value in (None, "", "avx2", "AVX512", "baseline"):
        if value is None:
            monkeypatch.delenv("JAXBRIDGE_CPU_ISA", raising=False)
        else:
            monkeypatch.setenv("JAXBRIDGE_CPU_ISA", value)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            ops._check_isa_env()
    monkeypatch.setenv("JAXBRIDGE_CPU_ISA", "sse9")
    with pytest.warns(RuntimeWarning, match="JAXBRIDGE_CPU_ISA='sse9' is not one of"):
        ops._check_isa_env()


def test_cpu_isa_environment_variable(tmp_path):
    # Read once per process: check it in fresh interpreters (run outside the source
    # tree, which would shadow the installed package and its compiled modules).
    import os
    import subprocess
    import sys
    code = ("import warnings, jax.numpy as jnp; warnings.simplefilter('always'); "
            "from jaxbridge import ops, _builtin\n"
            "with warnings.catch_warnings(record=True) as w:\n"
            "    ops.softplus(jnp.ones(3)).block_until_ready()\n"
            "print(_builtin._cpu_isa(), '|'.join(str(x.message) for x in w))")

    def run(value):
        env = dict(os.environ, JAXBRIDGE_CPU_ISA=value)
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                             text=True, timeout=120, cwd=tmp_path)
        assert out.returncode == 0, out.stderr
        isa, _, warned = out.stdout.strip().partition(" ")
        return isa, warned

    from jaxbridge import _builtin
    assert run("BASELINE") == ("baseline", "")  # case-insensitive
    isa, warned = run("avx9")
    assert isa == _builtin._cpu_isa() and "JAXBRIDGE_CPU_ISA='avx9' is not one of" in warned
