// XLA FFI handlers (CPU) of MINPACK's hybrj in reverse communication
// (csrc/math/minpack_hybrj.h): jaxbridge.scipy.optimize.root(method="hybr") runs its
// loop as a JAX while loop that evaluates the user's function and Jacobian itself and
// hands each value to one of these. Not differentiable ops: the targets live outside
// the kernel table (targets.h) and are registered by jaxbridge/scipy/optimize/_hybrj.py.
//
//   jaxbridge_hybrj_after_fun(state, istate, fun) -> (state, istate)
//   jaxbridge_hybrj_after_jac(state, istate, jac) -> (state, istate)
//
// state: float64[HybrjLayout(n).size()], istate: int32[kIntSlots], fun: float64[n],
// jac: float64[n, n] (row-major, rows the residuals'). The outputs alias the state
// inputs (input_output_aliases), so each call updates the state in place.
#include <algorithm>
#include <cstdint>
#include <string>

#include "jaxbridge/ffi_helpers.h"
#include "math/minpack_hybrj.h"
#include "xla/ffi/api/ffi.h"

namespace jaxbridge::builtin {
namespace {

namespace mp = ::jaxbridge::minpack;
using ffi::AnyBuffer;
using ffi::Result;

constexpr char kAfterFun[] = "jaxbridge_hybrj_after_fun";
constexpr char kAfterJac[] = "jaxbridge_hybrj_after_jac";

// Checks every buffer's dtype and size against the layout for `value`'s n; copies the
// state inputs into the outputs where XLA did not alias them.
ffi::Error Prepare(const char* fn, AnyBuffer state, AnyBuffer istate, AnyBuffer value,
                   int64_t value_size_per_n, Result<AnyBuffer>& state_out,
                   Result<AnyBuffer>& istate_out, mp::HybrjLayout* layout) {
  for (auto [name, buf] : {std::pair{"state", &state}, std::pair{"value", &value}}) {
    if (buf->element_type() != ffi::DataType::F64) {
      return ArgError(fn, name, "float64", DataTypeName(buf->element_type()));
    }
  }
  if (istate.element_type() != ffi::DataType::S32) {
    return ArgError(fn, "istate", "int32", DataTypeName(istate.element_type()));
  }
  const int64_t count = static_cast<int64_t>(value.element_count());
  const int64_t n = value_size_per_n == 1 ? count
                                          : static_cast<int64_t>(std::llround(std::sqrt(
                                                static_cast<double>(count))));
  if (n < 1 || n * (value_size_per_n == 1 ? 1 : n) != count) {
    return ArgError(fn, "value", value_size_per_n == 1 ? "n >= 1 residuals" : "an n x n Jacobian",
                    std::to_string(count) + " elements");
  }
  *layout = mp::HybrjLayout{n};
  if (static_cast<int64_t>(state.element_count()) != layout->size() ||
      state_out->element_count() != state.element_count()) {
    return ArgError(fn, "state", std::to_string(layout->size()) + " elements for n = " +
                    std::to_string(n), std::to_string(state.element_count()));
  }
  if (istate.element_count() != mp::kIntSlots ||
      istate_out->element_count() != istate.element_count()) {
    return ArgError(fn, "istate", std::to_string(mp::kIntSlots) + " elements",
                    std::to_string(istate.element_count()));
  }
  const auto* s = static_cast<const double*>(state.untyped_data());
  auto* so = static_cast<double*>(state_out->untyped_data());
  if (so != s) std::copy(s, s + layout->size(), so);
  const auto* k = static_cast<const int32_t*>(istate.untyped_data());
  auto* ko = static_cast<int32_t*>(istate_out->untyped_data());
  if (ko != k) std::copy(k, k + mp::kIntSlots, ko);
  return ffi::Error::Success();
}

// One step: `value` (the residual, or the n x n Jacobian when `jacobian`) into hybrj.
template <bool jacobian>
ffi::Error Step(AnyBuffer state, AnyBuffer istate, AnyBuffer value,
                Result<AnyBuffer> state_out, Result<AnyBuffer> istate_out) {
  const char* fn = jacobian ? kAfterJac : kAfterFun;
  return Guard(fn, [&]() -> ffi::Error {
    mp::HybrjLayout layout{0};
    JAXBRIDGE_RETURN_IF_ERROR(Prepare(fn, state, istate, value, jacobian ? 2 : 1,
                                      state_out, istate_out, &layout));
    const auto* v = static_cast<const double*>(value.untyped_data());
    auto* f = static_cast<double*>(state_out->untyped_data());
    auto* k = static_cast<int32_t*>(istate_out->untyped_data());
    if (jacobian) {
      mp::HybrjAfterJac(layout, v, f, k);
    } else {
      mp::HybrjAfterFun(layout, v, f, k);
    }
    return ffi::Error::Success();
  });
}

}  // namespace
}  // namespace jaxbridge::builtin

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxbridgeHybrjAfterFunCpu, ::jaxbridge::builtin::Step<false>,
                              ::xla::ffi::Ffi::Bind()
                                  .Arg<::xla::ffi::AnyBuffer>()   // state (float64)
                                  .Arg<::xla::ffi::AnyBuffer>()   // istate (int32)
                                  .Arg<::xla::ffi::AnyBuffer>()   // fun at the trial point
                                  .Ret<::xla::ffi::AnyBuffer>()   // state
                                  .Ret<::xla::ffi::AnyBuffer>());  // istate
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxbridgeHybrjAfterJacCpu, ::jaxbridge::builtin::Step<true>,
                              ::xla::ffi::Ffi::Bind()
                                  .Arg<::xla::ffi::AnyBuffer>()   // state (float64)
                                  .Arg<::xla::ffi::AnyBuffer>()   // istate (int32)
                                  .Arg<::xla::ffi::AnyBuffer>()   // Jacobian at x (n, n)
                                  .Ret<::xla::ffi::AnyBuffer>()   // state
                                  .Ret<::xla::ffi::AnyBuffer>());  // istate
