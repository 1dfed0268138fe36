// XLA FFI handlers (CPU) of the built-in kernels: validation + dispatch + threading.
// The math lives in csrc/math/cpu_kernels.h. Calling conventions (shared with
// jaxbridge/_kernel/signature.py): forward(primals) -> outputs; adjoint(primals, outputs,
// cotangents) -> input cotangents; tangent(primals, outputs, tangents) -> output
// tangents. Static parameters arrive as FFI attributes.
#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "handlers.h"
#include "jaxbridge/ffi_helpers.h"
#include "jaxbridge/parallel.h"
#include "math/cpu_kernels.h"
#include "validate.h"

namespace jaxbridge::builtin {
namespace {

namespace k = ::jaxbridge::kernels;
using ffi::AnyBuffer;
using ffi::Result;

#if JAXBRIDGE_HAS_THREAD_POOL
#define JB_POOL_CTX .Ctx<::xla::ffi::ThreadPool>()
#define JB_POOL_PARAM ::xla::ffi::ThreadPool pool_value,
#define JB_POOL (&pool_value)
#else
#define JB_POOL_CTX
#define JB_POOL_PARAM
#define JB_POOL (static_cast<::jaxbridge::ThreadPool*>(nullptr))
#endif

// ---------------------------------------------------------------- softplus
constexpr int64_t kElemGrain = 1 << 14;

ffi::Error SoftplusFwd(JB_POOL_PARAM AnyBuffer x, Result<AnyBuffer> y, double beta) {
  const char* fn = target::SoftplusFwd;
  JAXBRIDGE_RETURN_IF_ERROR(CheckSoftplusFwd(fn, beta, x, *y));
  const int64_t n = static_cast<int64_t>(x.element_count());
  JAXBRIDGE_DISPATCH_FLOAT(x.element_type(), fn, T, {
    const T* xp = Ptr<const T>(x);
    T* yp = Ptr<T>(y);
    ParallelFor(JB_POOL, n, kElemGrain, [&](int64_t, int64_t b, int64_t e) {
      k::SoftplusForward<T>(xp, yp, b, e, static_cast<T>(beta));
    });
    return ffi::Error::Success();
  });
}

// adjoint(x, ct) -> gx   and   tangent(x, tx) -> ty  (the same diagonal map). Both
// may run in place (out aliasing v): each element is read before it is written.

template <typename Pool>
ffi::Error SoftplusDerivImpl(const char* fn, Pool* pool, AnyBuffer x, AnyBuffer v,
                             Result<AnyBuffer>& out, double beta) {
  JAXBRIDGE_RETURN_IF_ERROR(CheckSoftplusDeriv(fn, beta, x, v, *out));
  const int64_t n = static_cast<int64_t>(x.element_count());
  JAXBRIDGE_DISPATCH_FLOAT(x.element_type(), fn, T, {
    const T* xp = Ptr<const T>(x);
    const T* vp = Ptr<const T>(v);
    T* op = Ptr<T>(out);
    ParallelFor(pool, n, kElemGrain, [&](int64_t, int64_t b, int64_t e) {
      k::SoftplusDerivative<T>(xp, vp, op, b, e, static_cast<T>(beta));
    });
    return ffi::Error::Success();
  });
}

ffi::Error SoftplusAdj(JB_POOL_PARAM AnyBuffer x, AnyBuffer ct, Result<AnyBuffer> gx,
                       double beta) {
  return SoftplusDerivImpl(target::SoftplusAdj, JB_POOL, x, ct, gx, beta);
}

ffi::Error SoftplusTan(JB_POOL_PARAM AnyBuffer x, AnyBuffer tx, Result<AnyBuffer> ty,
                       double beta) {
  return SoftplusDerivImpl(target::SoftplusTan, JB_POOL, x, tx, ty, beta);
}

// ---------------------------------------------------------------- tridiagonal
int64_t SystemGrain(int64_t n) { return std::max<int64_t>(1, 8192 / std::max<int64_t>(n, 1)); }

ffi::Error TridiagFwd(JB_POOL_PARAM AnyBuffer dl, AnyBuffer d, AnyBuffer du, AnyBuffer b,
                      Result<AnyBuffer> x) {
  const char* fn = target::TridiagFwd;
  TridiagDims td;
  JAXBRIDGE_RETURN_IF_ERROR(CheckTridiagFwd(fn, &td, dl, d, du, b, *x));
  return Guard(fn, [&]() -> ffi::Error {
    JAXBRIDGE_DISPATCH_FLOAT(d.element_type(), fn, T, {
      const int64_t chunks = NumChunks(JB_POOL, td.batch, SystemGrain(td.n));
      std::vector<T> scratch(static_cast<size_t>(std::max<int64_t>(chunks, 1) * td.n));
      ParallelFor(JB_POOL, td.batch, SystemGrain(td.n), [&](int64_t c, int64_t s, int64_t e) {
        k::TridiagSolve<T>(Ptr<const T>(dl), Ptr<const T>(d), Ptr<const T>(du), Ptr<const T>(b),
                           Ptr<T>(x), td.n, s, e, scratch.data() + c * td.n);
      });
      return ffi::Error::Success();
    });
  });
}

ffi::Error TridiagAdj(JB_POOL_PARAM AnyBuffer dl, AnyBuffer d, AnyBuffer du, AnyBuffer b,
                      AnyBuffer x, AnyBuffer ct, Result<AnyBuffer> gdl, Result<AnyBuffer> gd,
                      Result<AnyBuffer> gdu, Result<AnyBuffer> gb) {
  const char* fn = target::TridiagAdj;
  TridiagDims td;
  JAXBRIDGE_RETURN_IF_ERROR(CheckTridiagAdj(fn, &td, dl, d, du, b, x, ct, *gdl, *gd, *gdu, *gb));
  JAXBRIDGE_DISPATCH_FLOAT(d.element_type(), fn, T, {
    ParallelFor(JB_POOL, td.batch, SystemGrain(td.n), [&](int64_t, int64_t s, int64_t e) {
      k::TridiagAdjoint<T>(Ptr<const T>(dl), Ptr<const T>(d), Ptr<const T>(du), Ptr<const T>(x),
                           Ptr<const T>(ct), Ptr<T>(gdl), Ptr<T>(gd), Ptr<T>(gdu), Ptr<T>(gb),
                           td.n, s, e);
    });
    return ffi::Error::Success();
  });
}

ffi::Error TridiagTan(JB_POOL_PARAM AnyBuffer dl, AnyBuffer d, AnyBuffer du, AnyBuffer b,
                      AnyBuffer x, AnyBuffer tdl, AnyBuffer tdd, AnyBuffer tdu, AnyBuffer tb,
                      Result<AnyBuffer> dx) {
  const char* fn = target::TridiagTan;
  TridiagDims td;
  JAXBRIDGE_RETURN_IF_ERROR(CheckTridiagTan(fn, &td, dl, d, du, b, x, tdl, tdd, tdu, tb, *dx));
  return Guard(fn, [&]() -> ffi::Error {
    JAXBRIDGE_DISPATCH_FLOAT(d.element_type(), fn, T, {
      const int64_t chunks = NumChunks(JB_POOL, td.batch, SystemGrain(td.n));
      std::vector<T> scratch(static_cast<size_t>(std::max<int64_t>(chunks, 1) * td.n));
      ParallelFor(JB_POOL, td.batch, SystemGrain(td.n), [&](int64_t c, int64_t s, int64_t e) {
        k::TridiagTangent<T>(Ptr<const T>(dl), Ptr<const T>(d), Ptr<const T>(du),
                             Ptr<const T>(x), Ptr<const T>(tdl), Ptr<const T>(tdd),
                             Ptr<const T>(tdu), Ptr<const T>(tb), Ptr<T>(dx), td.n, s, e,
                             scratch.data() + c * td.n);
      });
      return ffi::Error::Success();
    });
  });
}

// ---------------------------------------------------------------- RBF kernel matrix
// The kernels (csrc/math/cpu_kernels.h) pack y into scratch and split the rows
// over the pool themselves; PoolFor adapts ParallelFor to their `pf` argument.
template <typename Pool>
struct PoolFor {
  Pool* pool;
  template <typename Body>
  void operator()(int64_t count, int64_t grain, Body&& body) const {
    ParallelFor(pool, count, grain, body);
  }
};

template <typename Pool>
PoolFor<Pool> MakePoolFor(Pool* pool) {
  return {pool};
}

// Scratch the kernels overwrite before reading: no zero fill (std::vector would
// write megabytes of zeros per call).
template <typename T>
std::unique_ptr<T[]> Scratch(int64_t n) {
  return std::unique_ptr<T[]>(new T[static_cast<size_t>(std::max<int64_t>(n, 1))]);
}

template <typename Pool>
int64_t Threads(Pool* pool) {
  return pool ? std::max<int64_t>(1, static_cast<int64_t>(pool->num_threads())) : 1;
}

ffi::Error RbfFwd(JB_POOL_PARAM AnyBuffer x, AnyBuffer y, AnyBuffer l, Result<AnyBuffer> kout) {
  const char* fn = target::RbfFwd;
  RbfDims r;
  JAXBRIDGE_RETURN_IF_ERROR(CheckRbfFwd(fn, &r, x, y, l, *kout));
  return Guard(fn, [&]() -> ffi::Error {
    JAXBRIDGE_DISPATCH_FLOAT(x.element_type(), fn, T, {
      auto scratch = Scratch<T>(k::RbfForwardScratch<T>(r.batch, r.n, r.m, r.dim));
      k::RbfForward<T>(MakePoolFor(JB_POOL), Ptr<const T>(x), Ptr<const T>(y), Ptr<const T>(l),
                       Ptr<T>(kout), r.batch, r.n, r.m, r.dim, scratch.get());
      return ffi::Error::Success();
    });
  });
}

ffi::Error RbfAdj(JB_POOL_PARAM AnyBuffer x, AnyBuffer y, AnyBuffer l, AnyBuffer kmat,
                  AnyBuffer ct, Result<AnyBuffer> gx, Result<AnyBuffer> gy,
                  Result<AnyBuffer> gl) {
  const char* fn = target::RbfAdj;
  RbfDims r;
  JAXBRIDGE_RETURN_IF_ERROR(CheckRbfAdj(fn, &r, x, y, l, kmat, ct, *gx, *gy, *gl));
  const auto dt = x.element_type();
  return Guard(fn, [&]() -> ffi::Error {
    JAXBRIDGE_DISPATCH_FLOAT(dt, fn, T, {
      const auto plan = k::RbfAdjointPlanFor<T>(r.batch, r.n, r.m, r.dim, Threads(JB_POOL));
      auto scratch = Scratch<T>(plan.scratch);
      auto lsums = Scratch<double>(plan.lsums);
      k::RbfAdjoint<T>(MakePoolFor(JB_POOL), plan, Ptr<const T>(x), Ptr<const T>(y),
                       Ptr<const T>(l), Ptr<const T>(kmat), Ptr<const T>(ct), Ptr<T>(gx),
                       Ptr<T>(gy), Ptr<T>(gl), r.batch, r.n, r.m, r.dim, scratch.get(),
                       lsums.get());
      return ffi::Error::Success();
    });
  });
}

ffi::Error RbfTan(JB_POOL_PARAM AnyBuffer x, AnyBuffer y, AnyBuffer l, AnyBuffer kmat,
                  AnyBuffer tx, AnyBuffer ty, AnyBuffer tl, Result<AnyBuffer> dk) {
  const char* fn = target::RbfTan;
  RbfDims r;
  JAXBRIDGE_RETURN_IF_ERROR(CheckRbfTan(fn, &r, x, y, l, kmat, tx, ty, tl, *dk));
  const auto dt = x.element_type();
  return Guard(fn, [&]() -> ffi::Error {
    JAXBRIDGE_DISPATCH_FLOAT(dt, fn, T, {
      auto scratch = Scratch<T>(k::RbfTangentScratch<T>(r.batch, r.n, r.m, r.dim));
      k::RbfTangent<T>(MakePoolFor(JB_POOL), Ptr<const T>(x), Ptr<const T>(y), Ptr<const T>(l),
                       Ptr<const T>(kmat), Ptr<const T>(tx), Ptr<const T>(ty), Ptr<const T>(tl),
                       Ptr<T>(dk), r.batch, r.n, r.m, r.dim, scratch.get());
      return ffi::Error::Success();
    });
  });
}

}  // namespace
}  // namespace jaxbridge::builtin

namespace jb = ::jaxbridge::builtin;
using ::xla::ffi::AnyBuffer;
using ::xla::ffi::Ffi;

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxbridgeSoftplusFwdCpu, jb::SoftplusFwd,
                              Ffi::Bind() JB_POOL_CTX.Arg<AnyBuffer>()
                                  .Ret<AnyBuffer>()
                                  .Attr<double>("beta"));
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxbridgeSoftplusAdjCpu, jb::SoftplusAdj,
                              Ffi::Bind() JB_POOL_CTX.Arg<AnyBuffer>()  // x
                                  .Arg<AnyBuffer>()                     // cotangent
                                  .Ret<AnyBuffer>()                     // grad x
                                  .Attr<double>("beta"));
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxbridgeSoftplusTanCpu, jb::SoftplusTan,
                              Ffi::Bind() JB_POOL_CTX.Arg<AnyBuffer>()  // x
                                  .Arg<AnyBuffer>()                     // tangent of x
                                  .Ret<AnyBuffer>()                     // tangent of y
                                  .Attr<double>("beta"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxbridgeTridiagFwdCpu, jb::TridiagFwd,
                              Ffi::Bind() JB_POOL_CTX.Arg<AnyBuffer>()
                                  .Arg<AnyBuffer>()
                                  .Arg<AnyBuffer>()
                                  .Arg<AnyBuffer>()
                                  .Ret<AnyBuffer>());
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxbridgeTridiagAdjCpu, jb::TridiagAdj,
                              Ffi::Bind() JB_POOL_CTX.Arg<AnyBuffer>()
                                  .Arg<AnyBuffer>()
                                  .Arg<AnyBuffer>()
                                  .Arg<AnyBuffer>()
                                  .Arg<AnyBuffer>()
                                  .Arg<AnyBuffer>()
                                  .Ret<AnyBuffer>()
                                  .Ret<AnyBuffer>()
                                  .Ret<AnyBuffer>()
                                  .Ret<AnyBuffer>());
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxbridgeTridiagTanCpu, jb::TridiagTan,
                              Ffi::Bind() JB_POOL_CTX.Arg<AnyBuffer>()
                                  .Arg<AnyBuffer>()
                                  .Arg<AnyBuffer>()
                                  .Arg<AnyBuffer>()
                                  .Arg<AnyBuffer>()
                                  .Arg<AnyBuffer>()
                                  .Arg<AnyBuffer>()
                                  .Arg<AnyBuffer>()
                                  .Arg<AnyBuffer>()
                                  .Ret<AnyBuffer>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxbridgeRbfFwdCpu, jb::RbfFwd,
                              Ffi::Bind() JB_POOL_CTX.Arg<AnyBuffer>()
                                  .Arg<AnyBuffer>()
                                  .Arg<AnyBuffer>()
                                  .Ret<AnyBuffer>());
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxbridgeRbfAdjCpu, jb::RbfAdj,
                              Ffi::Bind() JB_POOL_CTX.Arg<AnyBuffer>()
                                  .Arg<AnyBuffer>()
                                  .Arg<AnyBuffer>()
                                  .Arg<AnyBuffer>()
                                  .Arg<AnyBuffer>()
                                  .Ret<AnyBuffer>()
                                  .Ret<AnyBuffer>()
                                  .Ret<AnyBuffer>());
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxbridgeRbfTanCpu, jb::RbfTan,
                              Ffi::Bind() JB_POOL_CTX.Arg<AnyBuffer>()
                                  .Arg<AnyBuffer>()
                                  .Arg<AnyBuffer>()
                                  .Arg<AnyBuffer>()
                                  .Arg<AnyBuffer>()
                                  .Arg<AnyBuffer>()
                                  .Arg<AnyBuffer>()
                                  .Ret<AnyBuffer>());
