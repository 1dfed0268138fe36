// XLA FFI handlers (CPU) of the built-in kernels: validation + dispatch + threading.
// The math lives in csrc/kernels/cpu_kernels.h. Calling conventions (shared with
// jaxbridge/_kernel.py): forward(primals) -> outputs; adjoint(primals, outputs,
// cotangents) -> input cotangents; tangent(primals, outputs, tangents) -> output
// tangents. Static parameters arrive as FFI attributes.
#include <cstdint>
#include <vector>

#include "cpu_handlers.h"
#include "jaxbridge/ffi_helpers.h"
#include "jaxbridge/parallel.h"
#include "kernels/cpu_kernels.h"
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

template <typename T>
T* Ptr(AnyBuffer b) {
  return static_cast<T*>(b.untyped_data());
}
template <typename T>
T* Ptr(Result<AnyBuffer>& b) {
  return static_cast<T*>(b->untyped_data());
}

// ---------------------------------------------------------------- softplus
constexpr int64_t kElemGrain = 1 << 14;

ffi::Error SoftplusFwd(JB_POOL_PARAM AnyBuffer x, Result<AnyBuffer> y, double beta) {
  const char* fn = "jaxbridge_softplus_fwd";
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

// adjoint(x, y, ct) -> gx   and   tangent(x, y, tx) -> ty  (the same diagonal map)

template <typename Pool>
ffi::Error SoftplusDerivImpl(const char* fn, Pool* pool, AnyBuffer x, AnyBuffer y, AnyBuffer v,
                             Result<AnyBuffer>& out, double beta) {
  JAXBRIDGE_RETURN_IF_ERROR(CheckSoftplusDeriv(fn, beta, x, y, v, *out));
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

ffi::Error SoftplusAdj(JB_POOL_PARAM AnyBuffer x, AnyBuffer y, AnyBuffer ct,
                       Result<AnyBuffer> gx, double beta) {
  return SoftplusDerivImpl("jaxbridge_softplus_adj", JB_POOL, x, y, ct, gx, beta);
}

ffi::Error SoftplusTan(JB_POOL_PARAM AnyBuffer x, AnyBuffer y, AnyBuffer tx,
                       Result<AnyBuffer> ty, double beta) {
  return SoftplusDerivImpl("jaxbridge_softplus_tan", JB_POOL, x, y, tx, ty, beta);
}

// ---------------------------------------------------------------- tridiagonal
int64_t SystemGrain(int64_t n) { return std::max<int64_t>(1, 8192 / std::max<int64_t>(n, 1)); }

ffi::Error TridiagFwd(JB_POOL_PARAM AnyBuffer dl, AnyBuffer d, AnyBuffer du, AnyBuffer b,
                      Result<AnyBuffer> x) {
  const char* fn = "jaxbridge_tridiagonal_solve_fwd";
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
  const char* fn = "jaxbridge_tridiagonal_solve_adj";
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
  const char* fn = "jaxbridge_tridiagonal_solve_tan";
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
int64_t RowGrain(const RbfDims& r) {
  return std::max<int64_t>(1, 16384 / std::max<int64_t>(r.m * std::max<int64_t>(r.dim, 1), 1));
}

ffi::Error RbfFwd(JB_POOL_PARAM AnyBuffer x, AnyBuffer y, AnyBuffer l, Result<AnyBuffer> kout) {
  const char* fn = "jaxbridge_rbf_kernel_fwd";
  RbfDims r;
  JAXBRIDGE_RETURN_IF_ERROR(CheckRbfFwd(fn, &r, x, y, l, *kout));
  JAXBRIDGE_DISPATCH_FLOAT(x.element_type(), fn, T, {
    ParallelFor(JB_POOL, r.batch * r.n, RowGrain(r), [&](int64_t, int64_t s, int64_t e) {
      k::RbfForward<T>(Ptr<const T>(x), Ptr<const T>(y), Ptr<const T>(l), Ptr<T>(kout), r.n,
                       r.m, r.dim, s, e);
    });
    return ffi::Error::Success();
  });
}

ffi::Error RbfAdj(JB_POOL_PARAM AnyBuffer x, AnyBuffer y, AnyBuffer l, AnyBuffer kmat,
                  AnyBuffer ct, Result<AnyBuffer> gx, Result<AnyBuffer> gy,
                  Result<AnyBuffer> gl) {
  const char* fn = "jaxbridge_rbf_kernel_adj";
  RbfDims r;
  JAXBRIDGE_RETURN_IF_ERROR(CheckRbfAdj(fn, &r, x, y, l, kmat, ct, *gx, *gy, *gl));
  const auto dt = x.element_type();
  return Guard(fn, [&]() -> ffi::Error {
    JAXBRIDGE_DISPATCH_FLOAT(dt, fn, T, {
      std::vector<T> lpart(static_cast<size_t>(r.batch * r.n));
      const T* xp = Ptr<const T>(x);
      const T* yp = Ptr<const T>(y);
      const T* lp = Ptr<const T>(l);
      const T* kp = Ptr<const T>(kmat);
      const T* cp = Ptr<const T>(ct);
      ParallelFor(JB_POOL, r.batch * r.n, RowGrain(r), [&](int64_t, int64_t s, int64_t e) {
        k::RbfAdjointX<T>(xp, yp, lp, kp, cp, Ptr<T>(gx), lpart.data(), r.n, r.m, r.dim, s, e);
      });
      ParallelFor(JB_POOL, r.batch * r.m, RowGrain(r), [&](int64_t, int64_t s, int64_t e) {
        k::RbfAdjointY<T>(xp, yp, lp, kp, cp, Ptr<T>(gy), r.n, r.m, r.dim, s, e);
      });
      T* glp = Ptr<T>(gl);
      for (int64_t b = 0; b < r.batch; ++b) {
        T s = T(0);
        for (int64_t i = 0; i < r.n; ++i) s += lpart[b * r.n + i];
        glp[b] = s / (lp[b] * lp[b] * lp[b]);
      }
      return ffi::Error::Success();
    });
  });
}

ffi::Error RbfTan(JB_POOL_PARAM AnyBuffer x, AnyBuffer y, AnyBuffer l, AnyBuffer kmat,
                  AnyBuffer tx, AnyBuffer ty, AnyBuffer tl, Result<AnyBuffer> dk) {
  const char* fn = "jaxbridge_rbf_kernel_tan";
  RbfDims r;
  JAXBRIDGE_RETURN_IF_ERROR(CheckRbfTan(fn, &r, x, y, l, kmat, tx, ty, tl, *dk));
  const auto dt = x.element_type();
  JAXBRIDGE_DISPATCH_FLOAT(dt, fn, T, {
    ParallelFor(JB_POOL, r.batch * r.n, RowGrain(r), [&](int64_t, int64_t s, int64_t e) {
      k::RbfTangent<T>(Ptr<const T>(x), Ptr<const T>(y), Ptr<const T>(l), Ptr<const T>(kmat),
                       Ptr<const T>(tx), Ptr<const T>(ty), Ptr<const T>(tl), Ptr<T>(dk), r.n,
                       r.m, r.dim, s, e);
    });
    return ffi::Error::Success();
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
                              Ffi::Bind() JB_POOL_CTX.Arg<AnyBuffer>()
                                  .Arg<AnyBuffer>()
                                  .Arg<AnyBuffer>()
                                  .Ret<AnyBuffer>()
                                  .Attr<double>("beta"));
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxbridgeSoftplusTanCpu, jb::SoftplusTan,
                              Ffi::Bind() JB_POOL_CTX.Arg<AnyBuffer>()
                                  .Arg<AnyBuffer>()
                                  .Arg<AnyBuffer>()
                                  .Ret<AnyBuffer>()
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
