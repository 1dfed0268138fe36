// Shape/dtype validation shared by the CPU and CUDA handlers of the built-in kernels.
// The Python wrappers (jaxbridge/ops.py) check the same things at trace time with
// friendlier messages; these re-checks make the handlers safe on their own (a
// handler never reads or writes out of bounds, whatever it is called with).
#ifndef JAXBRIDGE_FFI_VALIDATE_H_
#define JAXBRIDGE_FFI_VALIDATE_H_

#include <cstdint>

#include "jaxbridge/ffi_helpers.h"

namespace jaxbridge::builtin {

// Typed data pointers of the handlers' buffers (CPU and CUDA alike).
template <typename T>
T* Ptr(ffi::AnyBuffer b) {
  return static_cast<T*>(b.untyped_data());
}
template <typename T>
T* Ptr(ffi::Result<ffi::AnyBuffer>& b) {
  return static_cast<T*>(b->untyped_data());
}

struct TridiagDims {
  int64_t batch = 0, n = 0;
};

// All of (dl, d, du, b, extra...) share one shape (..., n) and dtype.
inline ffi::Error CheckTridiag(const char* fn, TridiagDims* out, const ffi::AnyBuffer& dl,
                        const ffi::AnyBuffer& d, const ffi::AnyBuffer& du,
                        const ffi::AnyBuffer& b) {
  JAXBRIDGE_RETURN_IF_ERROR(CheckRankAtLeast(d, 1, fn, "d"));
  JAXBRIDGE_RETURN_IF_ERROR(CheckSameShape(d, dl, fn, "d", "dl"));
  JAXBRIDGE_RETURN_IF_ERROR(CheckSameShape(d, du, fn, "d", "du"));
  JAXBRIDGE_RETURN_IF_ERROR(CheckSameShape(d, b, fn, "d", "b"));
  auto dims = d.dimensions();
  out->n = dims.back();
  out->batch = Product(dims, 0, dims.size() - 1);
  return ffi::Error::Success();
}

struct RbfDims {
  int64_t batch = 0, n = 0, m = 0, dim = 0;
};

inline ffi::Error CheckRbf(const char* fn, RbfDims* out, const ffi::AnyBuffer& x,
                           const ffi::AnyBuffer& y, const ffi::AnyBuffer& l) {
  JAXBRIDGE_RETURN_IF_ERROR(CheckRankAtLeast(x, 2, fn, "x"));
  const size_t rank = x.dimensions().size();
  JAXBRIDGE_RETURN_IF_ERROR(CheckRank(y, rank, fn, "y"));
  JAXBRIDGE_RETURN_IF_ERROR(CheckRank(l, rank - 2, fn, "length_scale"));
  JAXBRIDGE_RETURN_IF_ERROR(CheckBatchDims(x, y, rank - 2, fn, "x", "y"));
  JAXBRIDGE_RETURN_IF_ERROR(CheckBatchDims(x, l, rank - 2, fn, "x", "length_scale"));
  JAXBRIDGE_RETURN_IF_ERROR(CheckDim(y, -1, x.dimensions()[rank - 1], fn, "y"));
  JAXBRIDGE_RETURN_IF_ERROR(CheckDtype(y, x.element_type(), fn, "y"));
  JAXBRIDGE_RETURN_IF_ERROR(CheckDtype(l, x.element_type(), fn, "length_scale"));
  auto dx = x.dimensions();
  out->batch = Product(dx, 0, rank - 2);
  out->n = dx[rank - 2];
  out->dim = dx[rank - 1];
  out->m = y.dimensions()[rank - 2];
  return ffi::Error::Success();
}

// `buf` must have exactly `dims` (leading batch dims of `ref` + trailing `tail`).
inline ffi::Error CheckShapeIs(const ffi::AnyBuffer& ref, size_t nbatch,
                               std::initializer_list<int64_t> tail, ffi::DataType dtype,
                               const ffi::AnyBuffer& buf, const char* fn, const char* arg) {
  auto rd = ref.dimensions(), bd = buf.dimensions();
  bool ok = bd.size() == nbatch + tail.size() && buf.element_type() == dtype;
  for (size_t i = 0; ok && i < nbatch; ++i) ok = bd[i] == rd[i];
  size_t k = nbatch;
  for (int64_t t : tail) {
    if (!ok) break;
    ok = bd[k++] == t;
  }
  if (ok) return ffi::Error::Success();
  std::string expected = "batch dims of " + ShapeString(rd) + " followed by (";
  for (int64_t t : tail) expected += std::to_string(t) + ",";
  expected += ") in " + std::string(DataTypeName(dtype));
  return ArgError(fn, arg, expected,
                  ShapeString(bd) + " " + DataTypeName(buf.element_type()));
}

inline ffi::Error CheckPositive(double v, const char* fn, const char* attr) {
  if (v > 0) return ffi::Error::Success();
  return ffi::Error::InvalidArgument(std::string(fn) + ": attribute '" + attr +
                                     "' must be > 0, received " + std::to_string(v));
}

// ---- Complete argument checks of each handler, one per role, so the CPU and CUDA
// handlers of an op cannot drift apart. Results are passed dereferenced (*result).
using ffi::AnyBuffer;

inline ffi::Error CheckSoftplusFwd(const char* fn, double beta, const AnyBuffer& x,
                                   const AnyBuffer& y) {
  JAXBRIDGE_RETURN_IF_ERROR(CheckPositive(beta, fn, "beta"));
  return CheckSameShape(x, y, fn, "x", "result");
}

// adjoint(x, ct) -> gx and tangent(x, tx) -> ty share one signature (the forward
// output is not needed: the kernel is registered with pass_outputs=False).
inline ffi::Error CheckSoftplusDeriv(const char* fn, double beta, const AnyBuffer& x,
                                     const AnyBuffer& v, const AnyBuffer& out) {
  JAXBRIDGE_RETURN_IF_ERROR(CheckPositive(beta, fn, "beta"));
  JAXBRIDGE_RETURN_IF_ERROR(CheckSameShape(x, v, fn, "x", "cotangent/tangent"));
  return CheckSameShape(x, out, fn, "x", "result");
}

inline ffi::Error CheckTridiagFwd(const char* fn, TridiagDims* td, const AnyBuffer& dl,
                                  const AnyBuffer& d, const AnyBuffer& du, const AnyBuffer& b,
                                  const AnyBuffer& x) {
  JAXBRIDGE_RETURN_IF_ERROR(CheckTridiag(fn, td, dl, d, du, b));
  return CheckSameShape(d, x, fn, "d", "result");
}

inline ffi::Error CheckTridiagAdj(const char* fn, TridiagDims* td, const AnyBuffer& dl,
                                  const AnyBuffer& d, const AnyBuffer& du, const AnyBuffer& b,
                                  const AnyBuffer& x, const AnyBuffer& ct, const AnyBuffer& gdl,
                                  const AnyBuffer& gd, const AnyBuffer& gdu,
                                  const AnyBuffer& gb) {
  JAXBRIDGE_RETURN_IF_ERROR(CheckTridiag(fn, td, dl, d, du, b));
  JAXBRIDGE_RETURN_IF_ERROR(CheckSameShape(d, x, fn, "d", "x"));
  JAXBRIDGE_RETURN_IF_ERROR(CheckSameShape(d, ct, fn, "d", "cotangent"));
  JAXBRIDGE_RETURN_IF_ERROR(CheckSameShape(d, gdl, fn, "d", "result 0"));
  JAXBRIDGE_RETURN_IF_ERROR(CheckSameShape(d, gd, fn, "d", "result 1"));
  JAXBRIDGE_RETURN_IF_ERROR(CheckSameShape(d, gdu, fn, "d", "result 2"));
  return CheckSameShape(d, gb, fn, "d", "result 3");
}

inline ffi::Error CheckTridiagTan(const char* fn, TridiagDims* td, const AnyBuffer& dl,
                                  const AnyBuffer& d, const AnyBuffer& du, const AnyBuffer& b,
                                  const AnyBuffer& x, const AnyBuffer& tdl, const AnyBuffer& tdd,
                                  const AnyBuffer& tdu, const AnyBuffer& tb,
                                  const AnyBuffer& dx) {
  JAXBRIDGE_RETURN_IF_ERROR(CheckTridiag(fn, td, dl, d, du, b));
  JAXBRIDGE_RETURN_IF_ERROR(CheckSameShape(d, x, fn, "d", "x"));
  JAXBRIDGE_RETURN_IF_ERROR(CheckSameShape(d, tdl, fn, "d", "tangent dl"));
  JAXBRIDGE_RETURN_IF_ERROR(CheckSameShape(d, tdd, fn, "d", "tangent d"));
  JAXBRIDGE_RETURN_IF_ERROR(CheckSameShape(d, tdu, fn, "d", "tangent du"));
  JAXBRIDGE_RETURN_IF_ERROR(CheckSameShape(d, tb, fn, "d", "tangent b"));
  return CheckSameShape(d, dx, fn, "d", "result");
}

// `buf` is a kernel matrix (batch dims of x, n, m) in x's dtype.
inline ffi::Error CheckRbfMatrix(const char* fn, const RbfDims& r, const AnyBuffer& x,
                                 const AnyBuffer& buf, const char* arg) {
  return CheckShapeIs(x, x.dimensions().size() - 2, {r.n, r.m}, x.element_type(), buf, fn, arg);
}

inline ffi::Error CheckRbfFwd(const char* fn, RbfDims* r, const AnyBuffer& x,
                              const AnyBuffer& y, const AnyBuffer& l, const AnyBuffer& k) {
  JAXBRIDGE_RETURN_IF_ERROR(CheckRbf(fn, r, x, y, l));
  return CheckRbfMatrix(fn, *r, x, k, "result");
}

inline ffi::Error CheckRbfAdj(const char* fn, RbfDims* r, const AnyBuffer& x,
                              const AnyBuffer& y, const AnyBuffer& l, const AnyBuffer& kmat,
                              const AnyBuffer& ct, const AnyBuffer& gx, const AnyBuffer& gy,
                              const AnyBuffer& gl) {
  JAXBRIDGE_RETURN_IF_ERROR(CheckRbf(fn, r, x, y, l));
  JAXBRIDGE_RETURN_IF_ERROR(CheckRbfMatrix(fn, *r, x, kmat, "K"));
  JAXBRIDGE_RETURN_IF_ERROR(CheckRbfMatrix(fn, *r, x, ct, "cotangent"));
  JAXBRIDGE_RETURN_IF_ERROR(CheckSameShape(x, gx, fn, "x", "result 0"));
  JAXBRIDGE_RETURN_IF_ERROR(CheckSameShape(y, gy, fn, "y", "result 1"));
  return CheckSameShape(l, gl, fn, "length_scale", "result 2");
}

inline ffi::Error CheckRbfTan(const char* fn, RbfDims* r, const AnyBuffer& x,
                              const AnyBuffer& y, const AnyBuffer& l, const AnyBuffer& kmat,
                              const AnyBuffer& tx, const AnyBuffer& ty, const AnyBuffer& tl,
                              const AnyBuffer& dk) {
  JAXBRIDGE_RETURN_IF_ERROR(CheckRbf(fn, r, x, y, l));
  JAXBRIDGE_RETURN_IF_ERROR(CheckRbfMatrix(fn, *r, x, kmat, "K"));
  JAXBRIDGE_RETURN_IF_ERROR(CheckSameShape(x, tx, fn, "x", "tangent x"));
  JAXBRIDGE_RETURN_IF_ERROR(CheckSameShape(y, ty, fn, "y", "tangent y"));
  JAXBRIDGE_RETURN_IF_ERROR(CheckSameShape(l, tl, fn, "length_scale", "tangent length_scale"));
  return CheckRbfMatrix(fn, *r, x, dk, "result");
}

}  // namespace jaxbridge::builtin

#endif  // JAXBRIDGE_FFI_VALIDATE_H_
