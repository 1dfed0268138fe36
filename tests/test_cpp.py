"""jaxbridge.cpp.load (run-time compilation, cache) and the examples/cpp_extension project."""

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxbridge.cpp as cpp

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "cpp_extension"
CUBE = EXAMPLE / "src" / "cube.cc"

pytestmark = pytest.mark.skipif(shutil.which(os.environ.get("CXX", "c++")) is None,
                                reason="no C++ compiler")


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    d = tmp_path_factory.mktemp("jbcache") / "cache"
    old = os.environ.get("JAXBRIDGE_CACHE_DIR")
    os.environ["JAXBRIDGE_CACHE_DIR"] = str(d)
    yield d
    if old is None:
        os.environ.pop("JAXBRIDGE_CACHE_DIR", None)
    else:
        os.environ["JAXBRIDGE_CACHE_DIR"] = old


@pytest.fixture(scope="module")
def cube_lib(cache):
    return cpp.load("cube", sources=[CUBE])


def test_load_and_differentiate(cube_lib, cache):
    assert sorted(cube_lib.handlers) == ["CubeAdjoint", "CubeForward", "CubeTangent"]
    cube = cube_lib.kernel(forward="CubeForward", adjoint="CubeAdjoint", tangent="CubeTangent",
                           result=lambda x, **_: x, attrs={"factor": 1.0}, vmap="batch")
    assert all(t.startswith("cpp.cube.Cube") for t in cube.targets())
    x = jnp.linspace(-2.0, 2.0, 5)
    np.testing.assert_allclose(cube(x, factor=2.0), 2 * x**3, rtol=1e-12)
    np.testing.assert_allclose(jax.jit(jax.grad(lambda x: cube(x, factor=2.0).sum()))(x),
                               6 * x**2, rtol=1e-12)
    np.testing.assert_allclose(jax.jacfwd(cube)(x), np.diag(3 * x**2), rtol=1e-12)
    np.testing.assert_allclose(jax.vmap(cube)(jnp.stack([x, x])), jnp.stack([x**3] * 2))


SQUARE_IN_PLACE = """
#include "jaxbridge/ffi_helpers.h"
namespace ffi = xla::ffi;
// y = x^2; its derivative needs only x and may overwrite v: out[i] = 2 x[i] v[i].
ffi::Error Fwd(ffi::Buffer<ffi::F64> x, ffi::ResultBuffer<ffi::F64> y) {
  JAXBRIDGE_RETURN_IF_ERROR(jaxbridge::CheckSameShape(x, *y, "square", "x", "result"));
  for (size_t i = 0; i < x.element_count(); ++i) y->typed_data()[i] = x.typed_data()[i] * x.typed_data()[i];
  return ffi::Error::Success();
}
ffi::Error Deriv(ffi::Buffer<ffi::F64> x, ffi::Buffer<ffi::F64> v, ffi::ResultBuffer<ffi::F64> out) {
  JAXBRIDGE_RETURN_IF_ERROR(jaxbridge::CheckSameShape(x, v, "square_deriv", "x", "v"));
  JAXBRIDGE_RETURN_IF_ERROR(jaxbridge::CheckSameShape(x, *out, "square_deriv", "x", "result"));
  for (size_t i = 0; i < x.element_count(); ++i)
    out->typed_data()[i] = 2 * x.typed_data()[i] * v.typed_data()[i];
  return ffi::Error::Success();
}
XLA_FFI_DEFINE_HANDLER_SYMBOL(SquareForward, Fwd, ffi::Ffi::Bind()
    .Arg<ffi::Buffer<ffi::F64>>().Ret<ffi::Buffer<ffi::F64>>());
XLA_FFI_DEFINE_HANDLER_SYMBOL(SquareDerivative, Deriv, ffi::Ffi::Bind()
    .Arg<ffi::Buffer<ffi::F64>>().Arg<ffi::Buffer<ffi::F64>>().Ret<ffi::Buffer<ffi::F64>>());
"""


def test_user_kernel_without_outputs_in_place(cache):
    lib = cpp.load("square_in_place", source=SQUARE_IN_PLACE)
    square = lib.kernel(forward="SquareForward", adjoint="SquareDerivative",
                        tangent="SquareDerivative", result=lambda x: x, dtypes=["float64"],
                        vmap="batch", pass_outputs=False,
                        aliases={"adjoint": {1: 0}, "tangent": {1: 0}})
    x = jnp.linspace(-2.0, 2.0, 5)
    ct = jnp.arange(5.0)
    np.testing.assert_allclose(square(x), x**2)
    grad = jax.jit(jax.grad(lambda x: (square(x) * ct).sum()))
    np.testing.assert_allclose(grad(x), 2 * x * ct)
    hlo = grad.lower(x).compile().as_text()
    assert square.target("adjoint", "cpu") in hlo
    assert square.target("forward", "cpu") not in hlo  # no outputs needed: XLA dropped it
    np.testing.assert_allclose(jax.jacfwd(square)(x), np.diag(2 * x))
    np.testing.assert_allclose(jax.jacrev(square)(x), np.diag(2 * x))
    np.testing.assert_allclose(jax.vmap(jax.grad(lambda x: square(x).sum()))(jnp.stack([x, -x])),
                               jnp.stack([2 * x, -2 * x]))
    gx, back = jax.jit(lambda x, c: (jax.vjp(square, x)[1](c)[0], c))(x, ct)
    np.testing.assert_allclose(gx, 2 * x * ct)
    np.testing.assert_array_equal(back, np.arange(5.0))


def test_cache_dir_is_private_and_reused(cube_lib, cache):
    assert stat.S_IMODE(cache.stat().st_mode) == 0o700
    assert cube_lib.path.parent.parent == cache
    assert (cube_lib.path.parent / (cube_lib.path.name + ".sha256")).is_file()
    cpp._loaded.clear()
    again = cpp.load("cube", sources=[CUBE])
    assert again.path == cube_lib.path


def test_source_text_and_compile_error(cache):
    src = CUBE.read_text()
    lib = cpp.load("cube_text", source=src)
    assert "CubeForward" in lib.handlers
    with pytest.raises(cpp.CompileError, match=r"(?s)compilation failed.*not_a_type"):
        cpp.load("broken", source=src + "\nnot_a_type x = 1;\n")


def test_corrupted_cache_entry_is_rebuilt(cube_lib, cache):
    so = cube_lib.path
    before = so.stat().st_mtime_ns
    data = bytearray(so.read_bytes())
    data[100:200] = b"\0" * 100
    # Replace (new inode): writing in place would corrupt the copy this process has mapped.
    tmp = so.with_suffix(".corrupt")
    tmp.write_bytes(bytes(data))
    os.replace(tmp, so)
    cpp._loaded.clear()
    lib = cpp.load("cube", sources=[CUBE])
    assert lib.path == so
    assert cpp._file_sha(so) == (so.parent / (so.name + ".sha256")).read_text().strip()
    assert so.stat().st_mtime_ns != before or so.read_bytes() != bytes(data)
    # A missing checksum also forces a rebuild.
    (so.parent / (so.name + ".sha256")).unlink()
    cpp._loaded.clear()
    assert cpp.load("cube", sources=[CUBE]).path == so
    assert (so.parent / (so.name + ".sha256")).is_file()


def test_no_handler_is_an_error(cache):
    with pytest.raises(ValueError, match="no handler found"):
        cpp.load("empty", source="int f() { return 1; }\n")


@pytest.mark.gpu
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_cuda_compile(cache):
    # Compile-only where there is no GPU; loading needs the CUDA runtime.
    src = """
    #include "jaxbridge/cuda.h"
    namespace ffi = xla::ffi;
    __global__ void Twice(const float* x, float* y, int64_t n) {
      int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
      if (i < n) y[i] = 2 * x[i];
    }
    ffi::Error Impl(cudaStream_t s, ffi::Buffer<ffi::F32> x, ffi::ResultBuffer<ffi::F32> y) {
      int64_t n = x.element_count();
      if (n == 0) return ffi::Error::Success();
      Twice<<<jaxbridge::Blocks(n, 256), 256, 0, s>>>(x.typed_data(), y->typed_data(), n);
      JAXBRIDGE_CUDA_CHECK_LAUNCH("Twice");
      return ffi::Error::Success();
    }
    XLA_FFI_DEFINE_HANDLER_SYMBOL(TwiceCuda, Impl, ffi::Ffi::Bind()
        .Ctx<jaxbridge::CudaStream>().Arg<ffi::Buffer<ffi::F32>>().Ret<ffi::Buffer<ffi::F32>>());
    """
    lib = cpp.load("twice_cuda", source=src, cuda=True, extra_cuda_cflags=["-arch=sm_80"])
    assert "TwiceCuda" in lib.handlers


def test_example_extension_builds_with_cmake(tmp_path):
    if shutil.which("cmake") is None:
        pytest.skip("needs cmake")
    pybind11 = pytest.importorskip("pybind11")
    build = tmp_path / "build"
    env = dict(os.environ)  # jaxbridge as installed (the source tree lacks the built extensions)
    gen = ["-G", "Ninja"] if shutil.which("ninja") else []
    subprocess.run(["cmake", "-S", str(EXAMPLE), "-B", str(build), *gen,
                    f"-DPython_EXECUTABLE={sys.executable}",
                    f"-Dpybind11_DIR={pybind11.get_cmake_dir()}", "-DCMAKE_BUILD_TYPE=Release"],
                   check=True, capture_output=True, env=env, timeout=120)
    proc = subprocess.run(["cmake", "--build", str(build), "-j2"], capture_output=True, text=True,
                          env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    so = next(build.glob("_cube*.so"))
    pkg = tmp_path / "site" / "jb_cube"
    shutil.copytree(EXAMPLE / "jb_cube", pkg)
    shutil.copy(so, pkg)
    code = ("import jax, jax.numpy as jnp, jb_cube;"
            "g = jax.grad(lambda x: jb_cube.cube(x, factor=2.0).sum())(jnp.arange(3.0));"
            "print(g.tolist())")
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(tmp_path / "site"), env.get("PYTHONPATH")) if p)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[0.0, 6.0, 24.0]"
