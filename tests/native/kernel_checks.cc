// kernel_checks.cc -- FFI handlers for tests/test_kernel_residuals.py and
// tests/test_kernel_guard.py (compiled with jaxbridge.cpp.load). float64 only.
//
// ExpPair: outputs (y = exp(x), k = the number of x > 0, int32 scalar); residuals
// (r = 2 exp(x), n = x's size as an int64 scalar). The derivatives take every
// operand of jaxbridge's convention with pass_outputs=True and check each one, so an
// operand out of order is an error, not a wrong number.
//
// Scale: y = 2 x (forward, adjoint and tangent), each writing `extra` elements past
// the end of its result, or `before` elements before its start, when `role` names it:
// the guarded call must report it. DoubleInPlace: an adjoint that reads its result
// buffer, correct only where it aliases the cotangent (aliases={"vjp": {1: 0}}).
#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;
using F64 = ffi::Buffer<ffi::F64>;
using R64 = ffi::ResultBuffer<ffi::F64>;

namespace {

ffi::Error Mismatch(const char* what) {
  return ffi::Error::InvalidArgument(std::string("exp_pair: ") + what);
}

ffi::Error ExpForward(F64 x, R64 y, ffi::ResultBuffer<ffi::S32> k, R64* r,
                      ffi::ResultBuffer<ffi::S64>* n) {
  const size_t size = x.element_count();
  int32_t positive = 0;
  for (size_t i = 0; i < size; ++i) {
    y->typed_data()[i] = std::exp(x.typed_data()[i]);
    positive += x.typed_data()[i] > 0;
    if (r) (*r)->typed_data()[i] = 2 * y->typed_data()[i];
  }
  k->typed_data()[0] = positive;
  if (n) (*n)->typed_data()[0] = static_cast<int64_t>(size);
  return ffi::Error::Success();
}

ffi::Error ExpPlain(F64 x, R64 y, ffi::ResultBuffer<ffi::S32> k) {
  return ExpForward(x, y, k, nullptr, nullptr);
}

ffi::Error ExpWithResiduals(F64 x, R64 y, ffi::ResultBuffer<ffi::S32> k, R64 r,
                            ffi::ResultBuffer<ffi::S64> n) {
  return ExpForward(x, y, k, &r, &n);
}

// (x, y, k, r, n, v) -> v * r / 2 = v exp(x), after checking every operand.
ffi::Error ExpDerivative(F64 x, F64 y, ffi::Buffer<ffi::S32> k, F64 r, ffi::Buffer<ffi::S64> n,
                         F64 v, R64 out) {
  const size_t size = x.element_count();
  int32_t positive = 0;
  for (size_t i = 0; i < size; ++i) positive += x.typed_data()[i] > 0;
  if (k.typed_data()[0] != positive) return Mismatch("operand 2 is not k");
  if (n.typed_data()[0] != static_cast<int64_t>(size)) return Mismatch("operand 4 is not n");
  for (size_t i = 0; i < size; ++i) {
    if (std::abs(y.typed_data()[i] - std::exp(x.typed_data()[i])) > 1e-12 * y.typed_data()[i])
      return Mismatch("operand 1 is not y");
    if (r.typed_data()[i] != 2 * y.typed_data()[i]) return Mismatch("operand 3 is not r");
    out->typed_data()[i] = v.typed_data()[i] * r.typed_data()[i] / 2;
  }
  return ffi::Error::Success();
}

// y = 2 x, misbehaving as the attributes say when `role` is `me`.
ffi::Error ScaleImpl(std::string_view me, F64 x, R64 y, int64_t extra, int64_t before,
                     std::string_view role) {
  double* out = y->typed_data();
  const int64_t size = static_cast<int64_t>(x.element_count());
  for (int64_t i = 0; i < size; ++i) out[i] = 2 * x.typed_data()[i];
  if (role != me) return ffi::Error::Success();
  for (int64_t i = 0; i < extra; ++i) out[size + i] = 1.0;  // past the end
  for (int64_t i = 1; i <= before; ++i) out[-i] = 1.0;      // before the start
  return ffi::Error::Success();
}

ffi::Error ScaleForward(F64 x, R64 y, int64_t extra, int64_t before, std::string_view role) {
  return ScaleImpl("forward", x, y, extra, before, role);
}
ffi::Error ScaleAdjoint(F64 x, F64 y, F64 ct, R64 gx, int64_t extra, int64_t before,
                        std::string_view role) {
  return ScaleImpl("vjp", ct, gx, extra, before, role);
}
ffi::Error ScaleTangent(F64 x, F64 y, F64 tx, R64 ty, int64_t extra, int64_t before,
                        std::string_view role) {
  return ScaleImpl("jvp", tx, ty, extra, before, role);
}

// (x, ct) -> gx = 2 ct, read from gx's own buffer: right only where gx is ct's buffer.
ffi::Error DoubleInPlaceImpl(F64 x, F64 ct, R64 gx, int64_t, int64_t, std::string_view) {
  for (size_t i = 0; i < x.element_count(); ++i) gx->typed_data()[i] *= 2;
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(ExpPairForward, ExpPlain,
                              ffi::Ffi::Bind().Arg<F64>().Ret<F64>().Ret<ffi::Buffer<ffi::S32>>());
XLA_FFI_DEFINE_HANDLER_SYMBOL(ExpPairWithResiduals, ExpWithResiduals,
                              ffi::Ffi::Bind()
                                  .Arg<F64>()                       // x
                                  .Ret<F64>()                       // y
                                  .Ret<ffi::Buffer<ffi::S32>>()     // k
                                  .Ret<F64>()                       // r (residual)
                                  .Ret<ffi::Buffer<ffi::S64>>());   // n (residual)
XLA_FFI_DEFINE_HANDLER_SYMBOL(ExpPairDerivative, ExpDerivative,
                              ffi::Ffi::Bind()
                                  .Arg<F64>()                       // x
                                  .Arg<F64>()                       // y
                                  .Arg<ffi::Buffer<ffi::S32>>()     // k
                                  .Arg<F64>()                       // r
                                  .Arg<ffi::Buffer<ffi::S64>>()     // n
                                  .Arg<F64>()                       // ct of y, or tx
                                  .Ret<F64>());                     // ct of x, or ty
// Scale's attributes, in a macro: jaxbridge cannot read these bindings, so the tests
// declare them in Python (attrs=).
#define SCALE_ATTRS .Attr<int64_t>("extra").Attr<int64_t>("before").Attr<std::string_view>("role")
XLA_FFI_DEFINE_HANDLER_SYMBOL(ScaleFwd, ScaleForward,
                              ffi::Ffi::Bind().Arg<F64>().Ret<F64>() SCALE_ATTRS);
XLA_FFI_DEFINE_HANDLER_SYMBOL(ScaleAdj, ScaleAdjoint,
                              ffi::Ffi::Bind().Arg<F64>().Arg<F64>().Arg<F64>().Ret<F64>()
                                  SCALE_ATTRS);
XLA_FFI_DEFINE_HANDLER_SYMBOL(ScaleTan, ScaleTangent,
                              ffi::Ffi::Bind().Arg<F64>().Arg<F64>().Arg<F64>().Ret<F64>()
                                  SCALE_ATTRS);
XLA_FFI_DEFINE_HANDLER_SYMBOL(DoubleInPlace, DoubleInPlaceImpl,
                              ffi::Ffi::Bind().Arg<F64>().Arg<F64>().Ret<F64>() SCALE_ATTRS);
