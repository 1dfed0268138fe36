// rms_norm.cc -- RMS normalization over the last axis (JAX's FFI tutorial kernel):
//   y = x * r,  r = 1 / sqrt(mean(x^2) + eps)  per row,
// with r kept as the residual for the derivatives. Float32 or float64, any leading dims.
#include <cmath>
#include <cstdint>

#include "jaxbridge/ffi_helpers.h"

namespace ffi = xla::ffi;

namespace {

// ---- The math, on raw pointers: one row of n elements. ----
template <typename T>
T Normalize(int64_t n, float eps, const T* x, T* y) {
  T sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += x[i] * x[i];
  const T r = T(1) / std::sqrt(sum / T(n) + T(eps));
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * r;
  return r;
}

// The Jacobian r I - r^3 x x^T / n is symmetric: the VJP and the JVP are the same map,
// v -> r v - r^3 (x . v) / n x. `out` may be `v`'s buffer (each v[i] is read first).
template <typename T>
void Derivative(int64_t n, T r, const T* x, const T* v, T* out) {
  T dot = 0;
  for (int64_t i = 0; i < n; ++i) dot += x[i] * v[i];
  const T c = r * r * r * dot / T(n);
  for (int64_t i = 0; i < n; ++i) out[i] = r * v[i] - c * x[i];
}

template <typename T>
const T* In(const ffi::AnyBuffer& b) { return static_cast<const T*>(b.untyped_data()); }
template <typename T>
T* Out(ffi::Result<ffi::AnyBuffer>& b) { return static_cast<T*>(b->untyped_data()); }

// Rows of the last axis: (count, length); an error for a scalar.
ffi::Error Rows(const ffi::AnyBuffer& x, int64_t* rows, int64_t* n) {
  auto dims = x.dimensions();
  if (dims.size() == 0) return ffi::Error::InvalidArgument("rms_norm: x must have an axis");
  *n = dims.back();
  *rows = *n == 0 ? 0 : static_cast<int64_t>(x.element_count()) / *n;
  return ffi::Error::Success();
}

// ---- The handlers: the forward with and without the residual, the derivative. ----
ffi::Error Forward(float eps, ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> y,
                   ffi::Result<ffi::AnyBuffer>* res) {
  int64_t rows, n;
  JAXBRIDGE_RETURN_IF_ERROR(Rows(x, &rows, &n));
  JAXBRIDGE_DISPATCH_FLOAT(x.element_type(), "rms_norm", T, {
    for (int64_t k = 0; k < rows; ++k) {
      const T r = Normalize<T>(n, eps, In<T>(x) + k * n, Out<T>(y) + k * n);
      if (res) Out<T>(*res)[k] = r;
    }
    return ffi::Error::Success();
  });
}

ffi::Error RmsNormImpl(float eps, ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> y) {
  return Forward(eps, x, y, nullptr);
}

ffi::Error RmsNormWithResidualsImpl(float eps, ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> y,
                                    ffi::Result<ffi::AnyBuffer> r) {
  return Forward(eps, x, y, &r);
}

// vjp(x, r, ct) -> ct_x and jvp(x, r, tx) -> ty: the same map.
ffi::Error DerivativeImpl(float eps, ffi::AnyBuffer x, ffi::AnyBuffer r, ffi::AnyBuffer v,
                          ffi::Result<ffi::AnyBuffer> out) {
  int64_t rows, n;
  JAXBRIDGE_RETURN_IF_ERROR(Rows(x, &rows, &n));
  JAXBRIDGE_DISPATCH_FLOAT(x.element_type(), "rms_norm derivative", T, {
    for (int64_t k = 0; k < rows; ++k) {
      Derivative<T>(n, In<T>(r)[k], In<T>(x) + k * n, In<T>(v) + k * n, Out<T>(out) + k * n);
    }
    return ffi::Error::Success();
  });
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(RmsNorm, RmsNormImpl,
                              ffi::Ffi::Bind()
                                  .Attr<float>("eps")
                                  .Arg<ffi::AnyBuffer>()   // x
                                  .Ret<ffi::AnyBuffer>());  // y
XLA_FFI_DEFINE_HANDLER_SYMBOL(RmsNormWithResiduals, RmsNormWithResidualsImpl,
                              ffi::Ffi::Bind()
                                  .Attr<float>("eps")
                                  .Arg<ffi::AnyBuffer>()   // x
                                  .Ret<ffi::AnyBuffer>()   // y
                                  .Ret<ffi::AnyBuffer>());  // r, the residual
XLA_FFI_DEFINE_HANDLER_SYMBOL(RmsNormDerivative, DerivativeImpl,
                              ffi::Ffi::Bind()
                                  .Attr<float>("eps")
                                  .Arg<ffi::AnyBuffer>()   // x
                                  .Arg<ffi::AnyBuffer>()   // r (residual)
                                  .Arg<ffi::AnyBuffer>()   // ct (vjp) or tx (jvp)
                                  .Ret<ffi::AnyBuffer>());  // ct_x or ty
