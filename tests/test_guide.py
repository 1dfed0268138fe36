"""The kernel authors' guides, docs/guides/kernels.md and docs/guides/ffi-tutorial.md: their
code compiles and runs as written, and what their prose and tables claim is what
jaxbridge does."""

import importlib.util
import os
import re
import shutil
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxbridge as jb
from jaxbridge.errors import KernelError, MissingRuleError
from jaxbridge.testing import RuleCheckError, check_rules

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "guides" / "kernels.md"
TUTORIAL = ROOT / "docs" / "guides" / "ffi-tutorial.md"
_FENCE = re.compile(r"^```(\w+)\n(.*?)^```$", re.MULTILINE | re.DOTALL)

# The guide's kernels are compiled for the CPU only: on JAX's CPU device (mark `cpu`)
# even where a GPU is JAX's default.
pytestmark = [pytest.mark.skipif(shutil.which(os.environ.get("CXX", "c++")) is None,
                                 reason="no C++ compiler"), pytest.mark.cpu]


def blocks(lang: str, page: Path = GUIDE) -> list[tuple[int, str]]:
    """(line number, code) of the page's fenced blocks in `lang`, in order."""
    text = page.read_text()
    return [(text.count("\n", 0, m.start(2)) + 1, m.group(2)) for m in _FENCE.finditer(text)
            if m.group(1) == lang]


def prose(page: Path = GUIDE) -> str:
    """The page's text with whitespace collapsed (inline code may wrap lines)."""
    return " ".join(page.read_text().split())


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    d = tmp_path_factory.mktemp("guide")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("JAXBRIDGE_CACHE_DIR", str(d / "cache"))
        mp.chdir(d)
        yield d


def run_page(page: Path, workdir: Path) -> dict:
    """Write the page's C++ files (named by their first comment line), then run its
    Python blocks in order in one namespace, which is returned."""
    for line, code in blocks("cpp", page):
        name = re.match(r"// (\w+\.cc)", code)
        assert name, f"{page}:{line}: a cpp block must start with '// <file>.cc'"
        (workdir / name.group(1)).write_text(code)
    namespace: dict = {"__name__": "guide"}
    for line, code in blocks("python", page):
        # blank lines in front keep tracebacks' line numbers those of the page
        exec(compile("\n" * (line - 1) + code, str(page), "exec"), namespace)
    return namespace


@pytest.fixture(scope="module")
def guide(workdir):
    return run_page(GUIDE, workdir)


@pytest.fixture(scope="module")
def tutorial(workdir):
    return run_page(TUTORIAL, workdir)


def test_the_guide_has_its_example(guide):
    assert "wave.cc" in os.listdir(".")
    assert len(blocks("python")) >= 3
    assert isinstance(guide["wave"], jb.Kernel) and guide["report"].passed


def test_grad_does_not_run_the_forward_kernel_with_pass_outputs_false(guide):
    wave, a, x = guide["wave"], guide["a"], guide["x"]
    grad = jax.jit(jax.grad(lambda x: wave(a, x, w=3.0).sum()))
    hlo = grad.lower(x).compile().as_text()
    assert wave.target("vjp", "cpu") in hlo
    assert wave.target("forward", "cpu") not in hlo


def test_the_guides_error_section(guide):
    wave, a, x = guide["wave"], guide["a"], guide["x"]
    with pytest.raises(KernelError, match="dtype"):  # outside dtypes=: trace time
        wave(a.astype(jnp.float16), x.astype(jnp.float16), w=3.0)
    with pytest.raises(KernelError, match="'w'"):  # an attribute of the wrong type
        wave(a, x, w="three")
    with pytest.raises(KernelError, match="aliases"):  # aliased buffers of different shapes
        wave(a[:3], x, w=3.0)
    # a shape the handler rejects: its ffi::Error reaches Python with its message
    forward_only = guide["lib"].kernel(forward="WaveForward", name="wave_forward_only",
                                       result=lambda a, x, **_: x, attrs={"w": 1.0})
    with pytest.raises(jax.errors.JaxRuntimeError, match="wave: argument 'a': expected the "
                       "shape and dtype of 'x'"):
        forward_only(a[:3], x, w=3.0).block_until_ready()


NO_DERIVATIVE = r"needs a VJP or JVP kernel.*Pass vjp=\.\.\. and/or jvp="


def test_a_missing_derivative_kernel_is_a_missing_rule_error(guide):
    lib, a, x = guide["lib"], guide["a"], guide["x"]
    forward_only = lib.kernel(forward="WaveForward", name="wave_forward_only",
                              result=lambda a, x, **_: x, attrs={"w": 1.0})
    with pytest.raises(MissingRuleError, match=NO_DERIVATIVE):
        jax.grad(lambda x: forward_only(a, x).sum())(x)
    with pytest.raises(MissingRuleError, match=NO_DERIVATIVE):
        jax.jvp(lambda x: forward_only(a, x), (x,), (x,))


BUG = ("gx[i] = c * a[i] * w * std::cos(w * x[i]);", "gx[i] = c * a[i] * std::cos(w * x[i]);")


def test_the_failure_shown_in_the_guide_is_what_check_rules_reports(guide, workdir):
    right, wrong = BUG
    assert f"(`{wrong}`)" in prose()
    (_, code), = blocks("cpp")
    assert right in code
    (workdir / "wave_bug.cc").write_text(code.replace(right, wrong))
    lib = jb.cpp.load("wave_bug", sources=["wave_bug.cc"])
    buggy = lib.kernel(forward="WaveForward", vjp="WaveVjp", jvp="WaveJvp",
                       name="wave", result=lambda a, x, **_: x, arg_names=("a", "x"),
                       attrs={"w": 1.0}, vmap="vectorized", pass_outputs=False,
                       aliases={"vjp": {2: 0}, "jvp": {2: 0}})
    with pytest.raises(RuleCheckError) as info:
        check_rules(buggy, guide["a"], guide["x"], w=3.0)
    (_, shown), = blocks("text")

    def failures(text: str) -> set[tuple[str, str]]:  # (check and where, hint)
        rows = [line.strip().split(" -- ") for line in text.splitlines()
                if line.strip().startswith("FAIL")]
        return {(r[0], next(p for p in r if p.startswith("hint:"))) for r in rows}

    assert failures(str(info.value)) == failures(shown)
    assert shown.startswith("check_rules(wave): 3 of ")


# ------------------------------------------------------------------ the attribute table
# C++ type -> (handler, declarations as in the table, values accepted, the value added)
TABLE = {
    "bool": ("AttrBool", (False, bool), (True, np.bool_(True)), 1.0),
    "int64_t": ("AttrInt64", (0, int), (7, np.int32(7), np.uint8(7)), 7.0),
    "double": ("AttrDouble", (0.0, float), (2.5, np.float32(2.5), 2, np.int16(2)), None),
    "std::string_view": ("AttrString", ("", str), ("three",), 5.0),
    "float": ("AttrFloat", (np.float32(0), np.float32), (2.5, 2, np.float64(2.5), np.int8(2)),
              None),
    "int32_t": ("AttrInt32", (np.int32(0), np.int32), (7, np.int64(7)), 7.0),
    "int8_t": ("AttrInt8", (np.int8,), (7,), 7.0),
    "int16_t": ("AttrInt16", (np.int16,), (7,), 7.0),
    "uint8_t": ("AttrUint8", (np.uint8,), (7,), 7.0),
    "uint16_t": ("AttrUint16", (np.uint16,), (7,), 7.0),
    "uint32_t": ("AttrUint32", (np.uint32,), (7,), 7.0),
    "uint64_t": ("AttrUint64", (np.uint64,), (7,), 7.0),
}

_ATTRS_HEADER = """
#include <cstdint>
#include <string_view>
#include "jaxbridge/ffi_helpers.h"
namespace ffi = xla::ffi;
using F64 = ffi::Buffer<ffi::F64>;
// y = x + value of the attribute (a string counts its characters)
template <typename A> double Value(A v) { return static_cast<double>(v); }
template <> double Value(std::string_view v) { return static_cast<double>(v.size()); }
template <typename A>
ffi::Error AddAttr(ffi::Buffer<ffi::F64> x, ffi::ResultBuffer<ffi::F64> y, A v) {
  for (size_t i = 0; i < x.element_count(); ++i) y->typed_data()[i] = x.typed_data()[i] + Value(v);
  return ffi::Error::Success();
}
"""
ATTRS_CC = _ATTRS_HEADER + "".join(
    f'XLA_FFI_DEFINE_HANDLER_SYMBOL({handler}, AddAttr<{cpp}>, ffi::Ffi::Bind()'
    f'.Arg<F64>().Ret<F64>().Attr<{cpp}>("v"));\n' for cpp, (handler, *_) in TABLE.items())


@pytest.fixture(scope="module")
def attrs_lib(workdir):
    return jb.cpp.load("guide_attrs", source=ATTRS_CC)


def test_the_attribute_table_lists_exactly_the_tested_types():
    section = GUIDE.read_text().split("## Attributes")[1].split("\n## ")[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    assert set(re.findall(r"\.Attr<([\w:]+)>", "".join(rows))) == set(TABLE)


@pytest.mark.parametrize("cpp_type", sorted(TABLE))
def test_each_row_of_the_attribute_table(attrs_lib, cpp_type):
    handler, declarations, values, added = TABLE[cpp_type]
    x = jnp.arange(3.0)
    for declared in declarations:
        k = attrs_lib.kernel(forward=handler, name=f"attr_{handler}", result=lambda x, **_: x,
                             attrs={"v": declared}, dtypes=["float64"])
        for value in values:
            want = float(value) if added is None else added
            np.testing.assert_array_equal(k(x, v=value), x + want)
        if isinstance(declared, type):  # declared without a default: required
            with pytest.raises(KernelError, match="required"):
                k(x)
        else:
            np.testing.assert_array_equal(k(x), x + float(len(declared) if isinstance(
                declared, str) else declared))
    # without attrs=, the C++ binding types the attribute: the same values are accepted
    k = attrs_lib.kernel(forward=handler, name=f"attr_cpp_{handler}", result=lambda x, **_: x,
                         dtypes=["float64"])
    for value in values:
        want = float(value) if added is None else added
        np.testing.assert_array_equal(k(x, v=value), x + want)
    with pytest.raises(KernelError, match=rf"kernel 'attr_cpp_{handler}': attribute 'v' is "
                                          rf"declared {re.escape(cpp_type)} .*received tuple"):
        k(x, v=(1, 2))


def test_attributes_without_attrs_take_their_cpp_types(attrs_lib):
    """What the guide says: the handler's .Attr<double>("v") types v, so an int is
    converted and an extra keyword is refused, both before anything runs."""
    x = jnp.arange(3.0)
    k = attrs_lib.kernel(forward="AttrDouble", name="attr_undeclared",
                         result=lambda x, **_: x, dtypes=["float64"])
    assert k.attrs == {"v": float}
    np.testing.assert_array_equal(k(x, v=2.5), x + 2.5)
    np.testing.assert_array_equal(k(x, v=7), x + 7.0)
    np.testing.assert_array_equal(k(x, v=np.float32(2.5)), x + 2.5)  # F32 for an F64 binding
    with pytest.raises(KernelError, match="unknown attribute 'extra'"):
        k(x, v=2.5, extra=1.0)


def test_undeclared_attributes_of_capsule_kernels_take_their_python_type(attrs_lib):
    """A kernel over capsules (an ahead-of-time build: no source to read) without
    attrs=: each keyword is an attribute of its own Python type, checked only by XLA."""
    x = jnp.arange(3.0)
    k = jb.kernel(attrs_lib.handlers["AttrDouble"], name="attr_capsule",
                  namespace="tests.guide", result=lambda x, **_: x, dtypes=["float64"])
    np.testing.assert_array_equal(k(x, v=2.5), x + 2.5)
    with pytest.raises(jax.errors.JaxRuntimeError, match="expected F64 but got S64"):
        k(x, v=7).block_until_ready()
    with pytest.raises(jax.errors.JaxRuntimeError, match="Wrong number of attributes"):
        k(x, v=2.5, extra=1.0).block_until_ready()
    k = jb.kernel(attrs_lib.handlers["AttrBool"], name="attr_np_bool",
                  namespace="tests.guide", result=lambda x, **_: x, dtypes=["float64"])
    np.testing.assert_array_equal(k(x, v=np.bool_(True)), x + 1)


# ------------------------------------------------------------------ the FFI tutorial page
def test_the_tutorial_page_runs_and_its_cpp_is_the_example(tutorial):
    (_, code), = blocks("cpp", TUTORIAL)
    assert code == (ROOT / "examples" / "rms_norm.cc").read_text()
    assert isinstance(tutorial["rms_norm"], jb.Kernel) and tutorial["report"].passed


def _custom_calls_and_copies(f, *args) -> tuple[int, int]:
    """Custom calls, and copies as instructions of their own (not inside a fusion), in
    the compiled program."""
    text = jax.jit(f).lower(*args).compile().as_text()
    entry = text[text.index("ENTRY"):]
    return entry.count("custom-call("), len(re.findall(r"= \S+ copy\(", entry))


def test_the_tutorial_and_jaxbridge_compile_to_the_same_program(tutorial, workdir):
    """What the page's side-by-side says: one custom call for a plain call, the forward
    with its residual and the derivative for a gradient, no copy; a cotangent that is
    an argument is copied for jaxbridge's aliased adjoint."""
    spec = importlib.util.spec_from_file_location("rms_norm_example",
                                                  ROOT / "examples" / "rms_norm.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    theirs, ours = example.tutorial_rms_norm(), tutorial["rms_norm"]
    x, w = tutorial["x"], tutorial["w"]

    def loss(f):
        return jax.grad(lambda x, w: 0.5 * jnp.sum((f(x) - w) ** 2))

    def vjp(f):
        return lambda x, w: jax.vjp(f, x)[1](w)[0]

    assert _custom_calls_and_copies(ours, x) == _custom_calls_and_copies(theirs, x) == (1, 0)
    assert _custom_calls_and_copies(loss(ours), x, w) == \
        _custom_calls_and_copies(loss(theirs), x, w) == (2, 0)
    assert _custom_calls_and_copies(vjp(ours), x, w) == (2, 1)
    assert _custom_calls_and_copies(vjp(theirs), x, w) == (2, 0)
    np.testing.assert_allclose(jax.jit(loss(ours))(x, w), jax.jit(loss(theirs))(x, w),
                               rtol=1e-6, atol=1e-7)
