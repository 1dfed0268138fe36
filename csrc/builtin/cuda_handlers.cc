// XLA FFI handlers (CUDA) of the built-in kernels: validation + dispatch; the
// kernels run on XLA's stream (csrc/math/cuda_kernels.cu). Same calling
// conventions as cpu_handlers.cc.
#include <cstdint>

#include "handlers.h"
#include "jaxbridge/cuda.h"
#include "jaxbridge/ffi_helpers.h"
#include "math/cuda_kernels.h"
#include "validate.h"

namespace jaxbridge::builtin {
namespace {

// "<target> (CUDA)" for error messages.
#define JAXBRIDGE_CUDA_NAME(op, role, Symbol, name) \
  inline constexpr char kCuda##Symbol[] = name " (CUDA)";
JAXBRIDGE_BUILTIN_TARGETS(JAXBRIDGE_CUDA_NAME)
#undef JAXBRIDGE_CUDA_NAME


namespace kc = ::jaxbridge::kernels::cuda;
using ffi::AnyBuffer;
using ffi::Result;

#define JB_CUDA_RETURN(fn, expr) \
  do {                           \
    cudaError_t _s = (expr);     \
    if (_s != cudaSuccess) return ::jaxbridge::CudaError(fn, _s); \
    return ffi::Error::Success(); \
  } while (0)

ffi::Error SoftplusFwd(cudaStream_t stream, AnyBuffer x, Result<AnyBuffer> y, double beta) {
  const char* fn = kCudaSoftplusFwd;
  JAXBRIDGE_RETURN_IF_ERROR(CheckSoftplusFwd(fn, beta, x, *y));
  const int64_t n = static_cast<int64_t>(x.element_count());
  JAXBRIDGE_DISPATCH_FLOAT(x.element_type(), fn, T, {
    JB_CUDA_RETURN(fn, kc::SoftplusForward<T>(stream, Ptr<const T>(x), Ptr<T>(y), n,
                                              static_cast<T>(beta)));
  });
}

// adjoint(x, ct) -> gx and tangent(x, tx) -> ty; in place (out aliasing v) is safe.
ffi::Error SoftplusDeriv(const char* fn, cudaStream_t stream, AnyBuffer x, AnyBuffer v,
                         Result<AnyBuffer>& out, double beta) {
  JAXBRIDGE_RETURN_IF_ERROR(CheckSoftplusDeriv(fn, beta, x, v, *out));
  const int64_t n = static_cast<int64_t>(x.element_count());
  JAXBRIDGE_DISPATCH_FLOAT(x.element_type(), fn, T, {
    JB_CUDA_RETURN(fn, kc::SoftplusDerivative<T>(stream, Ptr<const T>(x), Ptr<const T>(v),
                                                 Ptr<T>(out), n, static_cast<T>(beta)));
  });
}

ffi::Error SoftplusAdj(cudaStream_t stream, AnyBuffer x, AnyBuffer ct, Result<AnyBuffer> gx,
                       double beta) {
  return SoftplusDeriv(kCudaSoftplusAdj, stream, x, ct, gx, beta);
}
ffi::Error SoftplusTan(cudaStream_t stream, AnyBuffer x, AnyBuffer tx, Result<AnyBuffer> ty,
                       double beta) {
  return SoftplusDeriv(kCudaSoftplusTan, stream, x, tx, ty, beta);
}

template <typename T>
ffi::Error Scratch(ffi::ScratchAllocator& alloc, int64_t elems, T** out, const char* fn) {
  *out = nullptr;
  if (elems <= 0) return ffi::Error::Success();
  auto mem = alloc.Allocate(static_cast<size_t>(elems) * sizeof(T), alignof(T));
  if (!mem.has_value()) {
    return ffi::Error(ffi::ErrorCode::kResourceExhausted,
                      std::string(fn) + ": could not allocate scratch memory");
  }
  *out = static_cast<T*>(*mem);
  return ffi::Error::Success();
}

ffi::Error TridiagFwd(cudaStream_t stream, ffi::ScratchAllocator alloc, AnyBuffer dl,
                      AnyBuffer d, AnyBuffer du, AnyBuffer b, Result<AnyBuffer> x) {
  const char* fn = kCudaTridiagFwd;
  TridiagDims td;
  JAXBRIDGE_RETURN_IF_ERROR(CheckTridiagFwd(fn, &td, dl, d, du, b, *x));
  JAXBRIDGE_DISPATCH_FLOAT(d.element_type(), fn, T, {
    T* scratch;
    JAXBRIDGE_RETURN_IF_ERROR(Scratch(alloc, kc::TridiagScratchElems(td.batch, td.n), &scratch, fn));
    JB_CUDA_RETURN(fn, kc::TridiagSolve<T>(stream, Ptr<const T>(dl), Ptr<const T>(d),
                                           Ptr<const T>(du), Ptr<const T>(b), Ptr<T>(x),
                                           td.batch, td.n, false, scratch));
  });
}

ffi::Error TridiagAdj(cudaStream_t stream, AnyBuffer dl,
                      AnyBuffer d, AnyBuffer du, AnyBuffer b, AnyBuffer x, AnyBuffer ct,
                      Result<AnyBuffer> gdl, Result<AnyBuffer> gd, Result<AnyBuffer> gdu,
                      Result<AnyBuffer> gb) {
  const char* fn = kCudaTridiagAdj;
  TridiagDims td;
  JAXBRIDGE_RETURN_IF_ERROR(CheckTridiagAdj(fn, &td, dl, d, du, b, x, ct, *gdl, *gd, *gdu, *gb));
  JAXBRIDGE_DISPATCH_FLOAT(d.element_type(), fn, T, {
    // gd doubles as the Thomas scratch (it is overwritten by the finish kernel).
    T* scratch = kc::TridiagScratchElems(td.batch, td.n) ? Ptr<T>(gd) : nullptr;
    JAXBRIDGE_RETURN_IF_ERROR(
        [&]() -> ffi::Error {
          cudaError_t s = kc::TridiagSolve<T>(stream, Ptr<const T>(dl), Ptr<const T>(d),
                                              Ptr<const T>(du), Ptr<const T>(ct), Ptr<T>(gb),
                                              td.batch, td.n, true, scratch);
          return s == cudaSuccess ? ffi::Error::Success() : CudaError(fn, s);
        }());
    JB_CUDA_RETURN(fn, kc::TridiagAdjointFinish<T>(stream, Ptr<const T>(x), Ptr<const T>(gb),
                                                   Ptr<T>(gdl), Ptr<T>(gd), Ptr<T>(gdu),
                                                   td.batch, td.n));
  });
}

ffi::Error TridiagTan(cudaStream_t stream, ffi::ScratchAllocator alloc, AnyBuffer dl,
                      AnyBuffer d, AnyBuffer du, AnyBuffer b, AnyBuffer x, AnyBuffer tdl,
                      AnyBuffer tdd, AnyBuffer tdu, AnyBuffer tb, Result<AnyBuffer> dx) {
  const char* fn = kCudaTridiagTan;
  TridiagDims td;
  JAXBRIDGE_RETURN_IF_ERROR(CheckTridiagTan(fn, &td, dl, d, du, b, x, tdl, tdd, tdu, tb, *dx));
  JAXBRIDGE_DISPATCH_FLOAT(d.element_type(), fn, T, {
    T* scratch;
    JAXBRIDGE_RETURN_IF_ERROR(Scratch(alloc, kc::TridiagScratchElems(td.batch, td.n), &scratch, fn));
    JAXBRIDGE_RETURN_IF_ERROR(
        [&]() -> ffi::Error {
          cudaError_t s = kc::TridiagTangentRhs<T>(stream, Ptr<const T>(x), Ptr<const T>(tdl),
                                                   Ptr<const T>(tdd), Ptr<const T>(tdu),
                                                   Ptr<const T>(tb), Ptr<T>(dx), td.batch, td.n);
          return s == cudaSuccess ? ffi::Error::Success() : CudaError(fn, s);
        }());
    JB_CUDA_RETURN(fn, kc::TridiagSolve<T>(stream, Ptr<const T>(dl), Ptr<const T>(d),
                                           Ptr<const T>(du), Ptr<const T>(dx), Ptr<T>(dx),
                                           td.batch, td.n, false, scratch));
  });
}

ffi::Error RbfFwd(cudaStream_t stream, AnyBuffer x, AnyBuffer y, AnyBuffer l,
                  Result<AnyBuffer> kout) {
  const char* fn = kCudaRbfFwd;
  RbfDims r;
  JAXBRIDGE_RETURN_IF_ERROR(CheckRbfFwd(fn, &r, x, y, l, *kout));
  JAXBRIDGE_DISPATCH_FLOAT(x.element_type(), fn, T, {
    JB_CUDA_RETURN(fn, kc::RbfForward<T>(stream, Ptr<const T>(x), Ptr<const T>(y),
                                         Ptr<const T>(l), Ptr<T>(kout), r.batch, r.n, r.m,
                                         r.dim));
  });
}

ffi::Error RbfAdj(cudaStream_t stream, AnyBuffer x, AnyBuffer y, AnyBuffer l, AnyBuffer kmat,
                  AnyBuffer ct, Result<AnyBuffer> gx, Result<AnyBuffer> gy,
                  Result<AnyBuffer> gl) {
  const char* fn = kCudaRbfAdj;
  RbfDims r;
  JAXBRIDGE_RETURN_IF_ERROR(CheckRbfAdj(fn, &r, x, y, l, kmat, ct, *gx, *gy, *gl));
  const auto dt = x.element_type();
  JAXBRIDGE_DISPATCH_FLOAT(dt, fn, T, {
    JB_CUDA_RETURN(fn, kc::RbfAdjoint<T>(stream, Ptr<const T>(x), Ptr<const T>(y),
                                         Ptr<const T>(l), Ptr<const T>(kmat), Ptr<const T>(ct),
                                         Ptr<T>(gx), Ptr<T>(gy), Ptr<T>(gl), r.batch, r.n, r.m,
                                         r.dim));
  });
}

ffi::Error RbfTan(cudaStream_t stream, AnyBuffer x, AnyBuffer y, AnyBuffer l, AnyBuffer kmat,
                  AnyBuffer tx, AnyBuffer ty, AnyBuffer tl, Result<AnyBuffer> dk) {
  const char* fn = kCudaRbfTan;
  RbfDims r;
  JAXBRIDGE_RETURN_IF_ERROR(CheckRbfTan(fn, &r, x, y, l, kmat, tx, ty, tl, *dk));
  const auto dt = x.element_type();
  JAXBRIDGE_DISPATCH_FLOAT(dt, fn, T, {
    JB_CUDA_RETURN(fn, kc::RbfTangent<T>(stream, Ptr<const T>(x), Ptr<const T>(y),
                                         Ptr<const T>(l), Ptr<const T>(kmat), Ptr<const T>(tx),
                                         Ptr<const T>(ty), Ptr<const T>(tl), Ptr<T>(dk), r.batch,
                                         r.n, r.m, r.dim));
  });
}

}  // namespace
}  // namespace jaxbridge::builtin

namespace jb = ::jaxbridge::builtin;
using ::xla::ffi::AnyBuffer;
using ::xla::ffi::Ffi;

#define JB_ARGS2 .Arg<AnyBuffer>().Arg<AnyBuffer>()
#define JB_ARGS3 JB_ARGS2.Arg<AnyBuffer>()

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxbridgeSoftplusFwdCuda, jb::SoftplusFwd,
                              Ffi::Bind().Ctx<jaxbridge::CudaStream>().Arg<AnyBuffer>()
                                  .Ret<AnyBuffer>().Attr<double>("beta"));
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxbridgeSoftplusAdjCuda, jb::SoftplusAdj,
                              Ffi::Bind().Ctx<jaxbridge::CudaStream>() JB_ARGS2  // x, ct
                                  .Ret<AnyBuffer>().Attr<double>("beta"));
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxbridgeSoftplusTanCuda, jb::SoftplusTan,
                              Ffi::Bind().Ctx<jaxbridge::CudaStream>() JB_ARGS2  // x, tx
                                  .Ret<AnyBuffer>().Attr<double>("beta"));
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxbridgeTridiagFwdCuda, jb::TridiagFwd,
                              Ffi::Bind().Ctx<jaxbridge::CudaStream>()
                                  .Ctx<::xla::ffi::ScratchAllocator>() JB_ARGS2 JB_ARGS2
                                  .Ret<AnyBuffer>());
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxbridgeTridiagAdjCuda, jb::TridiagAdj,
                              Ffi::Bind().Ctx<jaxbridge::CudaStream>() JB_ARGS3 JB_ARGS3
                                  .Ret<AnyBuffer>().Ret<AnyBuffer>().Ret<AnyBuffer>()
                                  .Ret<AnyBuffer>());
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxbridgeTridiagTanCuda, jb::TridiagTan,
                              Ffi::Bind().Ctx<jaxbridge::CudaStream>()
                                  .Ctx<::xla::ffi::ScratchAllocator>() JB_ARGS3 JB_ARGS3
                                  JB_ARGS3.Ret<AnyBuffer>());
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxbridgeRbfFwdCuda, jb::RbfFwd,
                              Ffi::Bind().Ctx<jaxbridge::CudaStream>() JB_ARGS3
                                  .Ret<AnyBuffer>());
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxbridgeRbfAdjCuda, jb::RbfAdj,
                              Ffi::Bind().Ctx<jaxbridge::CudaStream>() JB_ARGS3 JB_ARGS2
                                  .Ret<AnyBuffer>().Ret<AnyBuffer>().Ret<AnyBuffer>());
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxbridgeRbfTanCuda, jb::RbfTan,
                              Ffi::Bind().Ctx<jaxbridge::CudaStream>() JB_ARGS3 JB_ARGS3
                                  .Arg<AnyBuffer>().Ret<AnyBuffer>());
