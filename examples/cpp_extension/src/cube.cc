// An example user kernel: y = factor * x^3, with its VJP and JVP.
// Built two ways: by this project's CMakeLists.txt (a pybind11 module that hands
// the capsules to Python) and, in the tests, by jaxbridge.cpp.load at run time.
#include <cstdint>

#include "jaxbridge/ffi_helpers.h"
#include "jaxbridge/parallel.h"

namespace ffi = xla::ffi;

namespace {

template <typename T>
void Cube(const T* x, T* y, int64_t b, int64_t e, T factor) {
  for (int64_t i = b; i < e; ++i) y[i] = factor * x[i] * x[i] * x[i];
}
// The VJP and the JVP coincide (diagonal Jacobian): out = v * 3 factor x^2.
template <typename T>
void CubeDeriv(const T* x, const T* v, T* out, int64_t b, int64_t e, T factor) {
  for (int64_t i = b; i < e; ++i) out[i] = v[i] * T(3) * factor * x[i] * x[i];
}

ffi::Error CubeFwd(ffi::ThreadPool pool, ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> y,
                   double factor) {
  JAXBRIDGE_RETURN_IF_ERROR(jaxbridge::CheckSameShape(x, *y, "cube", "x", "result"));
  const int64_t n = static_cast<int64_t>(x.element_count());
  JAXBRIDGE_DISPATCH_FLOAT(x.element_type(), "cube", T, {
    const T* xp = static_cast<const T*>(x.untyped_data());
    T* yp = static_cast<T*>(y->untyped_data());
    jaxbridge::ParallelFor(&pool, n, 1 << 14, [&](int64_t, int64_t b, int64_t e) {
      Cube<T>(xp, yp, b, e, static_cast<T>(factor));
    });
    return ffi::Error::Success();
  });
}

// vjp(x, y, ct) -> gx ; jvp(x, y, tx) -> ty
ffi::Error CubeDerivative(ffi::AnyBuffer x, ffi::AnyBuffer y, ffi::AnyBuffer v,
                          ffi::Result<ffi::AnyBuffer> out, double factor) {
  JAXBRIDGE_RETURN_IF_ERROR(jaxbridge::CheckSameShape(x, v, "cube_derivative", "x", "v"));
  JAXBRIDGE_RETURN_IF_ERROR(jaxbridge::CheckSameShape(x, *out, "cube_derivative", "x", "result"));
  const int64_t n = static_cast<int64_t>(x.element_count());
  JAXBRIDGE_DISPATCH_FLOAT(x.element_type(), "cube_derivative", T, {
    CubeDeriv<T>(static_cast<const T*>(x.untyped_data()), static_cast<const T*>(v.untyped_data()),
                 static_cast<T*>(out->untyped_data()), 0, n, static_cast<T>(factor));
    return ffi::Error::Success();
  });
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(CubeForward, CubeFwd,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<double>("factor"));
XLA_FFI_DEFINE_HANDLER_SYMBOL(CubeVjp, CubeDerivative,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<double>("factor"));
XLA_FFI_DEFINE_HANDLER_SYMBOL(CubeJvp, CubeDerivative,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<double>("factor"));
