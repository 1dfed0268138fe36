"""jaxbridge.kernel: FFI targets -> differentiable functions (API, errors, batching)."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import extension_missing

import jaxbridge as jb
import jaxbridge.ops as ops
from jaxbridge import get_include, kernel, register_target
from jaxbridge._kernel import registry
from jaxbridge.errors import AliasError, KernelError, MissingRuleError

if not ops.available():  # pragma: no cover - only with JAXBRIDGE_TESTS_WITHOUT_EXTENSIONS=1
    pytest.skip(f"jaxbridge._builtin not built: {extension_missing('_builtin')}",
                allow_module_level=True)
ops._register()
# The kernels compiled here are CPU-only: on JAX's CPU device even where a GPU is JAX's
# default (the CUDA kernels' tests are test_ops.py's `gpu` tests).
pytestmark = pytest.mark.cpu

ROOT = Path(__file__).resolve().parents[1]


def softplus_kernel(**kw):
    # The built-in softplus derivatives take (x, v): no forward output.
    kw.setdefault("pass_outputs", False)
    kw.setdefault("vjp", "jaxbridge_softplus_adj")
    kw.setdefault("result", lambda x, **_: x)
    kw.setdefault("attrs", {"beta": 1.0})
    return kernel("jaxbridge_softplus_fwd", **kw)


def test_get_include_has_headers():
    inc = Path(get_include())
    for h in ("ffi_helpers.h", "parallel.h", "cuda.h"):
        assert (inc / "jaxbridge" / h).is_file()


def test_register_target_validation():
    cap = ops._builtin_ext.registrations()["cpu"]["jaxbridge_softplus_fwd"]
    with pytest.raises(KernelError, match="invalid FFI target name"):
        register_target("bad name!", cap)
    with pytest.raises(KernelError, match="reserved"):
        register_target("jaxbridge_mine", cap)
    with pytest.raises(KernelError, match="PyCapsule"):
        register_target("ok_name", lambda: None)
    full = register_target("sp", cap, namespace="tests.kernel")
    assert full == "tests.kernel.sp"
    assert register_target("sp", cap, namespace="tests.kernel") == full  # idempotent
    other = ops._builtin_ext.registrations()["cpu"]["jaxbridge_softplus_adj"]
    with pytest.raises(KernelError, match="already registered with a different handler"):
        register_target("sp", other, namespace="tests.kernel")
    with pytest.raises(KernelError, match="unknown platform"):
        register_target("sp2", cap, platform="tpu9")


def test_capsule_targets_are_namespaced():
    regs = ops._builtin_ext.registrations()["cpu"]
    k = kernel(regs["jaxbridge_softplus_fwd"], regs["jaxbridge_softplus_adj"],
               name="mysoftplus", namespace="tests.ns", result=lambda x, **_: x,
               attrs={"beta": 1.0}, pass_outputs=False)
    assert k.targets() == ["tests.ns.mysoftplus_forward", "tests.ns.mysoftplus_vjp"]
    x = jnp.linspace(-3, 3, 5)
    np.testing.assert_allclose(jax.grad(lambda x: k(x).sum())(x), jax.nn.sigmoid(x), rtol=1e-12)


def test_old_role_spellings_warn_and_still_work():
    """adjoint=/tangent=, Kernel.adjoint/.tangent and aliases={"adjoint"/"tangent": ...}
    (before JAX's words vjp/jvp) keep working for one release, each warning with the new
    word; a keyword given both ways is an error."""
    adj, tan = "jaxbridge_softplus_adj", "jaxbridge_softplus_tan"
    with pytest.warns(DeprecationWarning, match=r"adjoint= is deprecated; write vjp="):
        with pytest.warns(DeprecationWarning, match=r"tangent= is deprecated; write jvp="):
            with pytest.warns(DeprecationWarning, match=r"role 'adjoint' is deprecated; "
                                                        r"write 'vjp'"):
                old = kernel("jaxbridge_softplus_fwd", adjoint=adj, tangent=tan,
                             name="sp_old_words", result=lambda x, **_: x,
                             attrs={"beta": 1.0}, pass_outputs=False,
                             aliases={"adjoint": {1: 0}})
    new = kernel("jaxbridge_softplus_fwd", vjp=adj, jvp=tan, name="sp_new_words",
                 result=lambda x, **_: x, attrs={"beta": 1.0}, pass_outputs=False,
                 aliases={"vjp": {1: 0}})
    assert (old.vjp, old.jvp, old.aliases) == (new.vjp, new.jvp, new.aliases)
    with pytest.warns(DeprecationWarning, match=r"Kernel\.adjoint is deprecated; read \.vjp"):
        assert old.adjoint == {"cpu": adj}
    with pytest.warns(DeprecationWarning, match=r"Kernel\.tangent is deprecated; read \.jvp"):
        assert old.tangent == {"cpu": tan}
    x = jnp.linspace(-2.0, 2.0, 5)
    np.testing.assert_allclose(jax.jit(jax.grad(lambda x: old(x).sum()))(x),
                               jax.nn.sigmoid(x), rtol=1e-12)
    np.testing.assert_allclose(jax.jvp(old, (x,), (jnp.ones_like(x),))[1],
                               jax.nn.sigmoid(x), rtol=1e-12)
    with pytest.warns(DeprecationWarning, match=r"role 'tangent' is deprecated; write 'jvp'"):
        tan_alias = softplus_kernel(jvp=tan, name="sp_old_tan_alias",
                                    aliases={"tangent": {1: 0}})
    assert tan_alias.aliases == {"jvp": ((1, 0),)}
    with pytest.raises(TypeError, match=r"both vjp= and its deprecated spelling adjoint="):
        kernel("jaxbridge_softplus_fwd", adj, adjoint=adj, result=lambda x, **_: x)


def test_missing_tangent_is_a_clear_error():
    k = softplus_kernel(name="sp_no_tangent")
    x = jnp.linspace(-2, 2, 4)
    np.testing.assert_allclose(jax.jit(jax.grad(lambda x: k(x).sum()))(x), jax.nn.sigmoid(x),
                               rtol=1e-12)
    np.testing.assert_allclose(jax.jacrev(k)(x), np.diag(jax.nn.sigmoid(x)), rtol=1e-12)
    for transform in (lambda: jax.jvp(k, (x,), (x,)), lambda: jax.jacfwd(k)(x),
                      lambda: jax.jit(jax.jacfwd(k))(x)):
        with pytest.raises(MissingRuleError,
                           match=r"kernel 'sp_no_tangent' needs a JVP kernel"):
            transform()


def test_missing_adjoint_is_a_clear_error():
    k = kernel("jaxbridge_softplus_fwd", jvp="jaxbridge_softplus_tan", name="sp_no_adj",
               result=lambda x, **_: x, attrs={"beta": 1.0}, pass_outputs=False)
    x = jnp.ones(3)
    jax.jvp(k, (x,), (x,))
    with pytest.raises(MissingRuleError, match=r"kernel 'sp_no_adj' needs a VJP kernel"):
        jax.grad(lambda x: k(x).sum())(x)


def test_static_attributes():
    k = softplus_kernel(jvp="jaxbridge_softplus_tan", name="sp_attr")
    x = jnp.linspace(-2, 2, 5)
    np.testing.assert_allclose(k(x, beta=3.0), jnp.logaddexp(0, 3 * x) / 3, rtol=1e-12)
    with pytest.raises(KernelError, match="unknown attribute 'gamma'"):
        k(x, gamma=1.0)
    with pytest.raises(KernelError, match=r"'beta' is declared double \(float\); received list"):
        k(x, beta=[1.0])
    np.testing.assert_allclose(k(x, beta=3), k(x, beta=3.0))  # an int for a float is fine
    # The C++ side re-checks: beta <= 0 is an FFI error at run time.
    with pytest.raises(Exception, match="attribute 'beta' must be > 0"):
        k(x, beta=-1.0).block_until_ready()


def test_dtype_check_names_kernel_and_argument():
    k = softplus_kernel(name="sp_dtype", arg_names=("x",))
    with pytest.raises(KernelError, match=r"kernel 'sp_dtype': argument 'x': expected dtype "
                                          r"float32 or float64, received int32"):
        k(jnp.arange(3, dtype=jnp.int32))


def test_ffi_side_rejects_bad_shapes():
    # Bypass the Python checks: the handler's own validation returns an ffi::Error.
    k = kernel("jaxbridge_tridiagonal_solve_fwd", name="tri_unchecked",
               result=lambda dl, d, du, b: b)
    with pytest.raises(Exception, match=r"jaxbridge_tridiagonal_solve_fwd: argument 'du'"):
        k(jnp.ones(4), jnp.ones(4), jnp.ones(3), jnp.ones(4)).block_until_ready()


@pytest.mark.parametrize("vmap", ["vectorized", "loop"])
def test_vmap_modes_agree(vmap):
    k = softplus_kernel(jvp="jaxbridge_softplus_tan", name=f"sp_{vmap}", vmap=vmap)
    x = jnp.linspace(-3, 3, 12).reshape(3, 4)
    f = jax.vmap(jax.vmap(lambda x: k(x).sum()))
    np.testing.assert_allclose(f(x[..., None]), jnp.logaddexp(0, x), rtol=1e-12)
    g = jax.vmap(jax.grad(lambda x: k(x).sum()))(x)
    np.testing.assert_allclose(g, jax.nn.sigmoid(x), rtol=1e-12)
    prims = [e.primitive.name for e in jax.make_jaxpr(jax.vmap(k))(x).jaxpr.eqns]
    assert ("while" in prims or "scan" in prims) == (vmap == "loop")


def test_vmap_batch_is_the_deprecated_spelling_of_vectorized():
    # "batch" was the kernel's word and "vectorized" jb.foreign's; one word now.
    with pytest.warns(DeprecationWarning, match=r"vmap='batch' is deprecated; write "
                                                r"vmap='vectorized'") as record:
        k = softplus_kernel(name="sp_old_spelling", vmap="batch")
    assert record[0].filename == __file__  # the warning points at the caller's line
    assert k.vmap == "vectorized"
    x = jnp.linspace(-3, 3, 12).reshape(3, 4, 1)
    prims = [e.primitive.name for e in jax.make_jaxpr(jax.vmap(k))(x).jaxpr.eqns]
    assert "while" not in prims and "scan" not in prims  # still one call
    np.testing.assert_allclose(jax.jit(jax.vmap(k))(x), jnp.logaddexp(0, x), rtol=1e-12)
    with pytest.raises(KernelError, match=r"vmap must be one of \('loop', 'vectorized'\), "
                                          r"got 'batched'"):
        softplus_kernel(name="sp_bad_vmap", vmap="batched")


def _rbf(name, **kw):
    def result(x, y, l):
        return jax.ShapeDtypeStruct((*x.shape[:-1], y.shape[-2]), x.dtype)
    return kernel("jaxbridge_rbf_kernel_fwd", "jaxbridge_rbf_kernel_adj", name=name,
                  arg_names=("x", "y", "length_scale"), result=result, **kw)


def test_python_scalar_arguments_take_the_dtype_of_the_arrays():
    # JAX's weak typing: the literal 2 becomes a float32 length scale beside float32 x
    # (without it, jnp.asarray(2) is int64 and is refused, or 2.0 float64 and the
    # handler sees mixed dtypes).
    k = _rbf("rbf_weak")
    x, y = jnp.ones((2, 3), jnp.float32), jnp.zeros((4, 3), jnp.float32)
    want = np.exp(-3.0 / 8.0) * np.ones((2, 4), np.float32)
    for length_scale in (2, 2.0, np.float32(2.0)):
        got = jax.jit(lambda x, y, l=length_scale: k(x, y, l))(x, y)
        assert got.dtype == jnp.float32
        np.testing.assert_allclose(got, want, rtol=1e-6)
    g = jax.grad(lambda x: k(x, y, 2).sum())(x)
    assert g.dtype == jnp.float32
    np.testing.assert_allclose(g, jax.grad(
        lambda x: jnp.exp(-jnp.sum((x[:, None] - y[None]) ** 2, -1) / 8).sum())(x), rtol=1e-5)


@pytest.mark.parametrize("value, why", [
    (1e40, r"1e\+40 overflows float32"),
    (np.float64(1e300), r"1e\+300 overflows float32"),
])
def test_lossy_scalar_argument_is_an_error_naming_kernel_and_argument(value, why):
    k = _rbf("rbf_lossy", dtypes=("float32",))
    x, y = jnp.ones((2, 3), jnp.float32), jnp.zeros((4, 3), jnp.float32)
    with pytest.raises(KernelError, match=rf"kernel 'rbf_lossy': argument 'length_scale': "
                                          rf"{why} .*; the kernel computes in float32"):
        jax.jit(lambda x, y: k(x, y, value))(x, y)


def test_integer_scalar_for_a_float_kernel_must_be_exact():
    k = _rbf("rbf_int", dtypes=("float32",))
    x, y = jnp.ones((1, 2), jnp.float32), jnp.ones((1, 2), jnp.float32)
    assert float(k(x, y, np.int64(3))[0, 0]) == 1.0  # exactly 3.0f
    with pytest.raises(KernelError, match=r"argument 'length_scale': 340282366920938463463"
                                          r"374607431768211456 overflows float32 "):
        k(x, y, 2**128)


def test_pytree_results_and_export_checks():
    k = kernel("jaxbridge_rbf_kernel_fwd", "jaxbridge_rbf_kernel_adj", name="rbf_dict",
               result=lambda x, y, l: {"K": jax.ShapeDtypeStruct((*x.shape[:-1], y.shape[-2]),
                                                                x.dtype)})
    x, y = jnp.ones((2, 3)), jnp.zeros((4, 3))
    out = k(x, y, jnp.float64(1.0))
    assert set(out) == {"K"} and out["K"].shape == (2, 4)
    assert {c.__class__.__name__ for c in k.export_checks()} == {"DisabledSafetyCheck"}
    with pytest.raises(KernelError, match="pytree of jax.ShapeDtypeStruct"):
        kernel("jaxbridge_softplus_fwd", result=lambda x, **_: 3, attrs={"beta": 1.0})(x)


def test_second_order_is_a_clear_error():
    k = softplus_kernel(jvp="jaxbridge_softplus_tan", name="sp_hess")
    with pytest.raises(MissingRuleError, match="second-order derivative of kernel 'sp_hess'"):
        jax.hessian(lambda x: k(x).sum())(jnp.ones(3))


def test_platform_without_implementation():
    k = kernel({"cuda": "tests.kernel.cuda_only_fwd"}, name="cuda_only",
               result=lambda x, **_: x, attrs={"beta": 1.0})
    with pytest.raises(KernelError, match="no forward implementation for platform 'cpu'"):
        jax.jit(k).lower(jnp.ones(3))


def test_parallel_for_large_inputs_match():
    # Exercises the thread-pool path (many chunks) of every kernel.
    x = np.random.default_rng(1).normal(size=(1 << 18,))
    np.testing.assert_allclose(ops.softplus(x), np.logaddexp(0, x), rtol=1e-12)


@pytest.mark.slow  # ~4 minutes on 2 cores (tests/native/asan_driver.cc, asan_guard.cc)
@pytest.mark.skipif(shutil.which(os.environ.get("CXX", "c++")) is None, reason="no C++ compiler")
def test_asan_driver():
    """The kernels' math, and the guarded call around a kernel with residuals and around
    kernels that write outside their outputs, under AddressSanitizer: no report."""
    proc = subprocess.run(["bash", str(ROOT / "benchmarks" / "asan_kernels.sh")],
                          capture_output=True, text=True, timeout=1200,
                          env={**os.environ, "PYTHON": sys.executable})
    if proc.returncode != 0 and "sanitize" in proc.stderr and "unrecognized" in proc.stderr:
        pytest.skip("compiler without AddressSanitizer")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "OK (0 failures)" in proc.stdout
    assert "guarded call: OK (0 failures)" in proc.stdout
    assert "AddressSanitizer" not in proc.stderr


def test_registry_is_process_wide():
    assert registry.is_registered("jaxbridge_softplus_fwd", "cpu")


# ----------------------------------------------------------------- pass_outputs / aliases
def _hlo(f, *args):
    return jax.jit(f).lower(*args).compile().as_text()


def test_grad_without_outputs_drops_the_forward_kernel():
    x = jnp.linspace(-3, 3, 7)
    k = softplus_kernel(name="sp_noout")
    hlo = _hlo(jax.grad(lambda x: k(x).sum()), x)
    assert "jaxbridge_softplus_adj" in hlo and "jaxbridge_softplus_fwd" not in hlo
    # value_and_grad still needs the forward, and gets the right value.
    v, g = jax.value_and_grad(lambda x: k(x).sum())(x)
    np.testing.assert_allclose(v, jnp.logaddexp(0, x).sum(), rtol=1e-12)
    np.testing.assert_allclose(g, jax.nn.sigmoid(x), rtol=1e-12)


def test_wrong_pass_outputs_is_caught_by_the_handler():
    # XLA FFI's arity check turns a calling-convention mismatch into an error.
    k = softplus_kernel(name="sp_wrong_convention", pass_outputs=True)
    with pytest.raises(Exception, match="Wrong number of arguments: expected 2 but got 3"):
        jax.grad(lambda x: k(x).sum())(jnp.ones(3)).block_until_ready()


def test_builtin_softplus_adjoint_runs_in_place():
    x = jnp.linspace(-3, 3, 7)
    hlo = _hlo(jax.grad(lambda x: ops.softplus(x).sum()), x)
    assert "output_to_operand_aliasing" in hlo


def test_aliased_cotangent_and_tangent_are_not_clobbered():
    # XLA must copy an aliased operand that is still live: the caller's cotangent,
    # a jit parameter returned again, or one used by a second adjoint.
    rng = np.random.default_rng(0)
    x, ct = rng.normal(size=(2, 33))
    ct_before = ct.copy()
    want = ct * jax.nn.sigmoid(x)
    _, vjp = jax.vjp(ops.softplus, x)
    np.testing.assert_allclose(vjp(ct)[0], want, rtol=1e-12)
    gx, ct_back = jax.jit(lambda x, c: (jax.vjp(ops.softplus, x)[1](c)[0], c))(x, ct)
    np.testing.assert_allclose(gx, want, rtol=1e-12)
    np.testing.assert_array_equal(ct_back, ct_before)

    def two_uses(x, c):
        g1 = jax.vjp(ops.softplus, x)[1](c)[0]
        g2 = jax.vjp(lambda x: ops.softplus(x, beta=2.0), x)[1](c)[0]
        return g1, g2, c * 1.0

    g1, g2, c = jax.jit(two_uses)(x, ct)
    np.testing.assert_allclose(g1, want, rtol=1e-12)
    np.testing.assert_allclose(g2, ct * jax.nn.sigmoid(2 * x), rtol=1e-12)
    np.testing.assert_array_equal(c, ct_before)
    k = softplus_kernel(jvp="jaxbridge_softplus_tan", name="sp_tan_alias",
                        aliases={"jvp": {1: 0}})
    tx = jnp.asarray(ct)
    _, ty = jax.jit(lambda x, t: jax.jvp(k, (x,), (t,)))(x, tx)
    np.testing.assert_allclose(ty, want, rtol=1e-12)
    np.testing.assert_array_equal(tx, ct_before)
    assert "output_to_operand_aliasing" in _hlo(lambda x, t: jax.jvp(k, (x,), (t,))[1], x, tx)
    # under vmap="vectorized" the aliased buffers gain the same batch axis
    gb = jax.vmap(lambda x, c: jax.vjp(ops.softplus, x)[1](c)[0])(x.reshape(3, 11),
                                                                   ct.reshape(3, 11))
    np.testing.assert_allclose(gb.reshape(-1), want, rtol=1e-12)


@pytest.mark.parametrize("aliases, match", [
    ([1, 0], "expected a dict"),
    ({"backward": {1: 0}}, "unknown role 'backward'"),
    ({"vjp": {1: -1}}, "non-negative ints"),
    ({"vjp": {True: 0}}, "non-negative ints"),
    ({"vjp": [(1, 0)]}, "must map operand indices"),
    ({"vjp": {0: 0, 1: 0}}, "same result"),
])
def test_bad_aliases_argument(aliases, match):
    with pytest.raises(KernelError, match=match):
        softplus_kernel(name="sp_bad_alias", aliases=aliases)


def test_aliases_checked_against_each_call():
    k = softplus_kernel(name="sp_alias_range", aliases={"vjp": {5: 0}})
    with pytest.raises(KernelError, match=r"aliases\['vjp'\] maps operand 5 to result 0, "
                                          r"but the vjp kernel has 2 array operand\(s\)"):
        k(jnp.ones(3))
    rbf = kernel("jaxbridge_rbf_kernel_fwd", "jaxbridge_rbf_kernel_adj", name="rbf_alias",
                 result=lambda x, y, l: jax.ShapeDtypeStruct((*x.shape[:-1], y.shape[-2]),
                                                             x.dtype),
                 aliases={"vjp": {4: 0}})  # ct (n, m) -> gx (n, d)
    with pytest.raises(KernelError, match=r"operand 4 \(float64\[2, 4\]\) to result 0 "
                                          r"\(float64\[2, 3\]\).*same shape and dtype"):
        rbf(jnp.ones((2, 3)), jnp.zeros((4, 3)), jnp.float64(1.0))


def _alias_error(make, call=None):
    """The AliasError that `make()` (or `call(made)`) raises, past its 'who' prefix."""
    with pytest.raises(AliasError) as info:
        made = make()
        if call is not None:
            call(made)
    who, _, rest = str(info.value).partition(": ")
    return who, rest


@pytest.mark.parametrize("aliases", [{"forward": {0: -1}}, {"forward": {0: 0, 1: 0}},
                                     {"forward": [(0, 0)]}])
def test_kernels_and_host_functions_refuse_bad_aliases_alike(aliases):
    # One check serves both: the same exception type (caught as KernelError or as
    # ValueError, what each raised before) and the same message after the name.
    kernel_who, kernel_says = _alias_error(
        lambda: softplus_kernel(name="sp_same_alias", aliases=aliases))
    host_who, host_says = _alias_error(
        lambda: jb.foreign(lambda x: x, aliases=aliases)(np.negative))
    assert kernel_who == "jaxbridge.kernel 'sp_same_alias'"
    assert host_who == "jaxbridge.foreign 'negative'"
    assert kernel_says == host_says and kernel_says.startswith("argument 'aliases': ")
    with pytest.raises(KernelError):
        jb.foreign(lambda x: x, aliases=aliases)(np.negative)
    with pytest.raises(ValueError):
        softplus_kernel(name="sp_same_alias", aliases=aliases)


def test_aliases_that_do_not_fit_a_call_are_refused_alike():
    x = jnp.ones(3)
    _, kernel_says = _alias_error(
        lambda: softplus_kernel(name="sp_alias_fit", aliases={"forward": {1: 0}}),
        lambda k: jax.jit(k)(x))
    _, host_says = _alias_error(
        lambda: jb.foreign(lambda x: x, aliases={"forward": {1: 0}})(np.negative),
        lambda f: jax.jit(f)(x))
    assert kernel_says == ("aliases['forward'] maps operand 1 to result 0, but the forward "
                           "kernel has 1 array operand(s) and 1 result(s)")
    assert host_says == kernel_says.replace("the forward kernel", "this call")


# ----------------------------------------------------------------- mistakes name the kernel
def test_attribute_of_the_wrong_type_names_kernel_attribute_expected_and_received():
    k = softplus_kernel(name="sp_types")
    with pytest.raises(KernelError, match=r"kernel 'sp_types': attribute 'beta' is declared "
                                          r"double \(float\); received str 'big'"):
        k(jnp.ones(2), beta="big")
    ints = kernel("jaxbridge_softplus_fwd", name="sp_int_attr", result=lambda x, **_: x,
                  attrs={"beta": int})
    with pytest.raises(KernelError, match=r"'sp_int_attr': attribute 'beta' is declared "
                                          r"int64_t \(int\); received float 1.5"):
        ints(jnp.ones(2), beta=1.5)
    with pytest.raises(KernelError, match=r"attribute\(s\) \['beta'\] are required"):
        ints(jnp.ones(2))
    with pytest.raises(KernelError, match=r"attrs\['beta'\] must be a default value"):
        kernel("jaxbridge_softplus_fwd", name="sp_bad_decl", result=lambda x, **_: x,
               attrs={"beta": [1.0]})


def test_attribute_passed_positionally_is_named():
    k = softplus_kernel(name="sp_positional", arg_names=("x",))
    with pytest.raises(KernelError, match=r"'sp_positional': expected 1 array argument\(s\) "
                                          r"\(x\), received 2; attributes \(beta\) are "
                                          r"keyword-only"):
        k(jnp.ones(2), 2.0)
    unnamed = softplus_kernel(name="sp_positional2")
    with pytest.raises(KernelError, match=r"argument '#1' is a Python float.*keyword-only.*"
                                          r"sp_positional2\(x, beta=...\)"):
        unnamed(jnp.ones(2), 2.0)


def test_negative_result_size_names_the_kernel():
    k = kernel("jaxbridge_softplus_fwd", name="sp_negative", attrs={"beta": 1.0},
               result=lambda x, **_: jax.ShapeDtypeStruct((-1,), x.dtype))
    with pytest.raises(KernelError, match=r"kernel 'sp_negative': the result spec declares "
                                          r"shape \(-1,\)"):
        k(jnp.ones(2))


def test_kernel_docstring_states_the_conventions_and_hides_private_parameters():
    import inspect
    doc = kernel.__doc__
    assert "vjp(*primals, *outputs, *cotangents" in doc
    assert "jvp(*primals, *outputs, *tangents" in doc
    assert "_builtin" not in inspect.signature(kernel).parameters and "_builtin" not in doc


def test_batch_dims_need_the_same_leading_dimensions():
    k = _rbf("rbf_batched", batch_dims=1)
    x, y, l = jnp.ones((2, 3, 4)), jnp.ones((2, 5, 4)), jnp.ones(2)
    assert jax.jit(k)(x, y, l).shape == (2, 3, 5)
    with pytest.raises(KernelError, match=r"kernel 'rbf_batched': batch_dims=1, so every array "
                                          r"argument and result must share the same 1 leading "
                                          r"dimension\(s\); got shapes \[\[2, 3, 4\], "
                                          r"\[3, 5, 4\]"):
        k(x, jnp.ones((3, 5, 4)), l)
    with pytest.raises(KernelError, match=r"batch_dims must be an int >= 0"):
        _rbf("rbf_bad_batch", batch_dims=lambda x, y, l: -1)(x, y, l)
