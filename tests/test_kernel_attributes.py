"""Typed attributes: a kernel's attribute types are declared once, in C++ (read from the
handlers' bindings by jaxbridge.cpp.load) or in Python (attrs=); a value of another
type, a traced value, or a declaration that contradicts the C++ is a KernelError naming
the kernel and the attribute before XLA decodes anything."""

import os
import shutil
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxbridge as jb
from jaxbridge._kernel.bindings import bound_attributes, typed_attrs
from jaxbridge.errors import KernelError

ROOT = Path(__file__).resolve().parents[1]
RMS_NORM_CC = ROOT / "examples" / "rms_norm.cc"

pytestmark = [pytest.mark.skipif(shutil.which(os.environ.get("CXX", "c++")) is None,
                                 reason="no C++ compiler"), pytest.mark.cpu]


# ------------------------------------------------------------------ reading the C++
def test_bound_attributes_reads_inline_bindings():
    source = '''
    // XLA_FFI_DEFINE_HANDLER_SYMBOL(Commented, Impl, ffi::Ffi::Bind().Attr<bool>("no"));
    XLA_FFI_DEFINE_HANDLER_SYMBOL(Norm, NormImpl<float>,
        ffi::Ffi::Bind()
            .Attr<float>("eps")          // the tutorial's
            .Arg<ffi::Buffer<ffi::F32>>()
            .Attr<std::int64_t>("axis")
            /* .Attr<double>("hidden") */
            .Attr<std::string_view>("mode")
            .Ret<ffi::Buffer<ffi::F32>>());
    XLA_FFI_DEFINE_HANDLER_SYMBOL(Shaped, ShapedImpl, ffi::Ffi::Bind()
        .Ctx<ffi::PlatformStream<cudaStream_t>>().Attr<ffi::Span<const int64_t>>("dims"));
    XLA_FFI_DEFINE_HANDLER_SYMBOL(Elsewhere, Impl, kBinding);
    XLA_FFI_DEFINE_HANDLER_SYMBOL(Dict, Impl, ffi::Ffi::Bind().Attrs<MyAttrs>());
    XLA_FFI_DEFINE_HANDLER_SYMBOL(NoAttrs, Impl, ffi::Ffi::Bind().Arg<ffi::AnyBuffer>());
    '''
    assert bound_attributes(source) == {
        "Norm": {"eps": np.float32, "axis": int, "mode": str},
        "Shaped": {"dims": "ffi::Span<const int64_t>"},  # not converted: untyped
        "Elsewhere": None, "Dict": None, "NoAttrs": {},
    }


def test_typed_attrs_merges_python_defaults_into_the_cpp_types():
    bindings = {"F": {"eps": np.float32, "n": int}, "A": {"eps": np.float32, "n": int}}
    roles = {"forward": "F", "vjp": "A"}
    assert typed_attrs("k", roles, bindings, None) == {"eps": np.float32, "n": int}
    typed = typed_attrs("k", roles, bindings, {"eps": 1e-5, "n": 3})
    assert type(typed["eps"]) is np.float32 and typed["eps"] == np.float32(1e-5)
    assert type(typed["n"]) is np.int64
    assert typed_attrs("k", roles, bindings, {"eps": np.float32, "n": np.int64}) == {
        "eps": np.float32, "n": int}
    # unknown bindings, or a type jaxbridge does not convert: attrs= as given
    assert typed_attrs("k", {"forward": "X"}, {"X": None}, {"eps": 1.0}) == {"eps": 1.0}
    assert typed_attrs("k", {"forward": "S"}, {"S": {"d": "ffi::Span<const int64_t>"}},
                       None) is None


# ------------------------------------------------------------------ on compiled kernels
@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("JAXBRIDGE_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
        yield jb.cpp.load("rms_norm", sources=[RMS_NORM_CC])


def test_the_types_come_from_the_cpp(lib):
    """The issue's case: eps bound as C++ float. Without attrs= the kernel knows it; a
    Python float, an int or a NumPy float64 are converted; a string is refused."""
    assert lib.bindings["RmsNorm"] == {"eps": np.float32}
    k = lib.kernel("RmsNorm", name="rms_typed", result=lambda x, **_: x)
    assert k.attrs == {"eps": np.float32}
    x = jnp.ones((2, 4), jnp.float32)
    for eps in (1e-5, np.float64(1e-5), np.float32(1e-5)):
        np.testing.assert_allclose(k(x, eps=eps), np.ones((2, 4)), rtol=1e-5)
    np.testing.assert_allclose(k(3 * x, eps=0), np.ones((2, 4)), rtol=1e-6)
    with pytest.raises(KernelError, match=r"jaxbridge kernel 'rms_typed': attribute 'eps' is "
                                          r"declared float \(float32\); received str '1e-5'"):
        k(x, eps="1e-5")
    with pytest.raises(KernelError, match=r"attribute\(s\) \['eps'\] are required"):
        k(x)
    with pytest.raises(KernelError, match=r"unknown attribute 'epsilon'"):
        k(x, eps=1e-5, epsilon=1e-5)


def test_defaults_in_python_types_in_cpp(lib):
    k = lib.kernel("RmsNorm", name="rms_default", result=lambda x, **_: x,
                   attrs={"eps": 1e-5})
    assert type(k.attrs["eps"]) is np.float32
    x = jnp.ones((2, 4), jnp.float64)
    np.testing.assert_allclose(k(x), np.ones((2, 4)), rtol=1e-5)


def test_declarations_that_contradict_the_cpp_are_refused(lib):
    with pytest.raises(KernelError, match=r"kernel 'rms_d': attrs\['eps'\] is declared double, "
                                          r"but handler 'RmsNorm' binds \.Attr<float>\(\"eps\"\)"):
        lib.kernel("RmsNorm", name="rms_d", result=lambda x, **_: x, attrs={"eps": float})
    with pytest.raises(KernelError, match=r"kernel 'rms_n': attrs= declares \['eps', 'n'\], but "
                                          r"its handlers bind \['eps'\]"):
        lib.kernel("RmsNorm", name="rms_n", result=lambda x, **_: x, attrs={"eps": 0.1, "n": 1})
    with pytest.raises(KernelError, match=r"kernel 'rms_s' \(a default in attrs=\): attribute "
                                          r"'eps' is declared float \(float32\); received str"):
        lib.kernel("RmsNorm", name="rms_s", result=lambda x, **_: x, attrs={"eps": "small"})


def test_handlers_that_bind_different_attributes_are_refused_when_declared():
    bindings = {"F": {"eps": np.float32}, "A": {"eps": float}, "T": {}}
    with pytest.raises(KernelError, match=r"kernel 'k': handler 'F' \(forward\) binds "
                                          r"\.Attr<float>\(\"eps\"\) and handler 'A' "
                                          r"\(vjp\) binds \.Attr<double>\(\"eps\"\)"):
        typed_attrs("k", {"forward": "F", "vjp": "A"}, bindings, None)
    with pytest.raises(KernelError, match=r"handler 'T' \(jvp\) binds no attribute 'eps'"):
        typed_attrs("k", {"forward": "F", "jvp": "T"}, bindings, None)


@pytest.mark.slow  # a C++ build of its own (10-20 s); the test above has the logic
def test_handlers_that_bind_different_attributes_are_refused(tmp_path):
    source = RMS_NORM_CC.read_text().replace(
        'XLA_FFI_DEFINE_HANDLER_SYMBOL(RmsNormDerivative, DerivativeImpl,\n'
        '                              ffi::Ffi::Bind()\n'
        '                                  .Attr<float>("eps")',
        'XLA_FFI_DEFINE_HANDLER_SYMBOL(RmsNormDerivative, DerivativeImpl,\n'
        '                              ffi::Ffi::Bind()\n'
        '                                  .Attr<double>("eps")')
    assert '.Attr<double>("eps")' in source
    (tmp_path / "rms_double.cc").write_text(source.replace("DerivativeImpl(float eps",
                                                           "DerivativeImpl(double eps"))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("JAXBRIDGE_CACHE_DIR", str(tmp_path / "cache"))
        lib = jb.cpp.load("rms_double", sources=[tmp_path / "rms_double.cc"])
    with pytest.raises(KernelError, match=r"kernel 'rms_mixed': handler 'RmsNorm' \(forward\) "
                                          r"binds \.Attr<float>\(\"eps\"\) and handler "
                                          r"'RmsNormDerivative' \(vjp\) binds "
                                          r"\.Attr<double>\(\"eps\"\)"):
        lib.kernel("RmsNorm", vjp="RmsNormDerivative", name="rms_mixed",
                   result=lambda x, **_: x)


# ------------------------------------------------------------------ static, not traced
@pytest.mark.parametrize("declared", [True, False])
def test_a_traced_attribute_says_it_must_be_an_array_argument(lib, declared):
    """Typed from C++, or a kernel over capsules with no declaration at all."""
    if declared:
        k = lib.kernel("RmsNorm", name="rms_traced", result=lambda x, **_: x)
        what = r"\(declared float \(float32\)\)"
    else:
        k = jb.kernel(lib.handlers["RmsNorm"], name="rms_untyped", namespace="tests.attrs",
                      result=lambda x, **_: x)
        what = r"\(an FFI attribute\)"
    x = jnp.ones((2, 4), jnp.float32)
    with pytest.raises(KernelError, match=rf"kernel '{k.name}': attribute 'eps' {what} "
                                          rf"received a traced value \(float32\[\], inside jit"):
        jax.jit(lambda x, eps: k(x, eps=eps))(x, np.float32(1e-5))
    with pytest.raises(KernelError, match=r"make it an array argument of the kernel instead"):
        jax.grad(lambda eps: k(x, eps=eps).sum())(1e-5)
    with pytest.raises(KernelError, match=r"received a JAX array \(float32\[\]\)"):
        k(x, eps=jnp.float32(1e-5))
