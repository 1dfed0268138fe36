// rms_norm_tutorial.cc -- JAX's FFI tutorial kernel as the tutorial writes it
// (docs.jax.dev, "Foreign function interface"; examples/ffi in JAX's repository): RMS
// normalization over the last axis, float32 and float64, with the residual returned by
// RmsNormFwd and taken by RmsNormBwd(res, x, ct_y). Registered by hand with jax.ffi in
// examples/rms_norm.py and benchmarks/rms_norm.py, next to examples/rms_norm.cc through
// jaxbridge.
#include <cmath>
#include <cstdint>
#include <utility>
#include "xla/ffi/api/ffi.h"
namespace ffi = xla::ffi;

template <typename T>
T ComputeRmsNorm(float eps, int64_t size, const T *x, T *y) {
  T sm = static_cast<T>(0);
  for (int64_t n = 0; n < size; ++n) sm += x[n] * x[n];
  T scale = static_cast<T>(1) / std::sqrt(sm / static_cast<T>(size) + static_cast<T>(eps));
  for (int64_t n = 0; n < size; ++n) y[n] = x[n] * scale;
  return scale;
}

template <typename T>
void ComputeRmsNormBwd(int64_t size, T res, const T *x, const T *ct_y, T *ct_x) {
  T ct_res = static_cast<T>(0);
  for (int64_t n = 0; n < size; ++n) ct_res += x[n] * ct_y[n];
  T factor = ct_res * res * res * res / static_cast<T>(size);
  for (int64_t n = 0; n < size; ++n) ct_x[n] = res * ct_y[n] - factor * x[n];
}

std::pair<int64_t, int64_t> GetDims(const ffi::AnyBuffer &buffer) {
  auto dims = buffer.dimensions();
  if (dims.size() == 0) return std::make_pair(0, 0);
  return std::make_pair(buffer.element_count(), dims.back());
}

template <typename T>
ffi::Error Fwd(float eps, ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> y, T *res) {
  auto [total, last] = GetDims(x);
  if (last == 0) return ffi::Error::InvalidArgument("RmsNorm input must be an array");
  const T *xd = x.typed_data<T>();
  T *yd = y->typed_data<T>();
  for (int64_t n = 0; n < total; n += last) {
    T r = ComputeRmsNorm(eps, last, &xd[n], &yd[n]);
    if (res) res[n / last] = r;
  }
  return ffi::Error::Success();
}

ffi::Error RmsNormImpl(float eps, ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> y) {
  if (x.element_type() == ffi::F32) return Fwd<float>(eps, x, y, nullptr);
  if (x.element_type() == ffi::F64) return Fwd<double>(eps, x, y, nullptr);
  return ffi::Error::InvalidArgument("Unsupported input data type");
}
XLA_FFI_DEFINE_HANDLER_SYMBOL(RmsNorm, RmsNormImpl,
    ffi::Ffi::Bind().Attr<float>("eps").Arg<ffi::AnyBuffer>().Ret<ffi::AnyBuffer>());

ffi::Error RmsNormFwdImpl(float eps, ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> y,
                          ffi::Result<ffi::AnyBuffer> res) {
  if (x.element_type() == ffi::F32) return Fwd<float>(eps, x, y, res->typed_data<float>());
  if (x.element_type() == ffi::F64) return Fwd<double>(eps, x, y, res->typed_data<double>());
  return ffi::Error::InvalidArgument("Unsupported input data type");
}
XLA_FFI_DEFINE_HANDLER_SYMBOL(RmsNormFwd, RmsNormFwdImpl,
    ffi::Ffi::Bind().Attr<float>("eps").Arg<ffi::AnyBuffer>().Ret<ffi::AnyBuffer>()
        .Ret<ffi::AnyBuffer>());

template <typename T>
ffi::Error Bwd(ffi::AnyBuffer res, ffi::AnyBuffer x, ffi::AnyBuffer ct_y,
               ffi::Result<ffi::AnyBuffer> ct_x) {
  auto [total, last] = GetDims(x);
  if (last == 0) return ffi::Error::InvalidArgument("RmsNormBwd inputs must be arrays");
  for (int64_t n = 0; n < total; n += last) {
    ComputeRmsNormBwd(last, res.typed_data<T>()[n / last], &x.typed_data<T>()[n],
                      &ct_y.typed_data<T>()[n], &ct_x->typed_data<T>()[n]);
  }
  return ffi::Error::Success();
}

ffi::Error RmsNormBwdImpl(ffi::AnyBuffer res, ffi::AnyBuffer x, ffi::AnyBuffer ct_y,
                          ffi::Result<ffi::AnyBuffer> ct_x) {
  if (x.element_type() == ffi::F32) return Bwd<float>(res, x, ct_y, ct_x);
  if (x.element_type() == ffi::F64) return Bwd<double>(res, x, ct_y, ct_x);
  return ffi::Error::InvalidArgument("Unsupported input data type");
}
XLA_FFI_DEFINE_HANDLER_SYMBOL(RmsNormBwd, RmsNormBwdImpl,
    ffi::Ffi::Bind().Arg<ffi::AnyBuffer>().Arg<ffi::AnyBuffer>().Arg<ffi::AnyBuffer>()
        .Ret<ffi::AnyBuffer>());
