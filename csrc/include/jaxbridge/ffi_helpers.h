// jaxbridge kernel-author helpers over the XLA FFI C++ API (header-only).
//
//   #include "jaxbridge/ffi_helpers.h"   // needs jax.ffi.include_dir() on the path
//
// Everything here returns `ffi::Error` instead of throwing, so handlers never throw
// across the FFI boundary:
//   * dtype dispatch:     JAXBRIDGE_DISPATCH_FLOAT(buf.element_type(), "fn", T, { ... })
//   * shape/rank checks:  CheckDtype / CheckRank / CheckRankAtLeast / CheckSameShape /
//                         CheckDim / CheckBatchDims, each with a message naming the
//                         function, the argument, what was expected and what was received
//   * JAXBRIDGE_RETURN_IF_ERROR(expr) to chain them
//   * Guard(fn, "name")   turns a C++ exception (e.g. std::bad_alloc) into ffi::Error
//   * CPU parallel-for over XLA's intra-op thread pool: see jaxbridge/parallel.h
//   * CUDA helpers (stream, launch checks):                 see jaxbridge/cuda.h
#ifndef JAXBRIDGE_FFI_HELPERS_H_
#define JAXBRIDGE_FFI_HELPERS_H_

#include <cstdint>
#include <exception>
#include <string>
#include <utility>

#include "xla/ffi/api/ffi.h"

namespace jaxbridge {

namespace ffi = ::xla::ffi;

// Human-readable name of an XLA element type ("float32", ...).
inline const char* DataTypeName(ffi::DataType type) {
  switch (type) {
    case ffi::DataType::PRED: return "bool";
    case ffi::DataType::S8: return "int8";
    case ffi::DataType::S16: return "int16";
    case ffi::DataType::S32: return "int32";
    case ffi::DataType::S64: return "int64";
    case ffi::DataType::U8: return "uint8";
    case ffi::DataType::U16: return "uint16";
    case ffi::DataType::U32: return "uint32";
    case ffi::DataType::U64: return "uint64";
    case ffi::DataType::F16: return "float16";
    case ffi::DataType::BF16: return "bfloat16";
    case ffi::DataType::F32: return "float32";
    case ffi::DataType::F64: return "float64";
    case ffi::DataType::C64: return "complex64";
    case ffi::DataType::C128: return "complex128";
    default: return "unsupported";
  }
}

// "(3, 4, 5)"
inline std::string ShapeString(ffi::Span<const int64_t> dims) {
  std::string s = "(";
  for (size_t i = 0; i < dims.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(dims[i]);
  }
  if (dims.size() == 1) s += ",";
  return s + ")";
}

inline ffi::Error ArgError(const char* fn, const char* arg, const std::string& expected,
                           const std::string& received) {
  return ffi::Error::InvalidArgument(std::string(fn) + ": argument '" + arg + "': expected " +
                                     expected + ", received " + received);
}

#define JAXBRIDGE_RETURN_IF_ERROR(expr)            \
  do {                                             \
    ::xla::ffi::Error _jb_err = (expr);            \
    if (_jb_err.failure()) return _jb_err;         \
  } while (0)

template <typename Buffer>
ffi::Error CheckDtype(const Buffer& b, ffi::DataType expected, const char* fn, const char* arg) {
  if (b.element_type() == expected) return ffi::Error::Success();
  return ArgError(fn, arg, std::string("dtype ") + DataTypeName(expected),
                  std::string("dtype ") + DataTypeName(b.element_type()));
}

template <typename Buffer>
ffi::Error CheckRank(const Buffer& b, size_t rank, const char* fn, const char* arg) {
  if (b.dimensions().size() == rank) return ffi::Error::Success();
  return ArgError(fn, arg, "rank " + std::to_string(rank),
                  "rank " + std::to_string(b.dimensions().size()) + " with shape " +
                      ShapeString(b.dimensions()));
}

template <typename Buffer>
ffi::Error CheckRankAtLeast(const Buffer& b, size_t rank, const char* fn, const char* arg) {
  if (b.dimensions().size() >= rank) return ffi::Error::Success();
  return ArgError(fn, arg, "rank >= " + std::to_string(rank),
                  "rank " + std::to_string(b.dimensions().size()) + " with shape " +
                      ShapeString(b.dimensions()));
}

template <typename A, typename B>
ffi::Error CheckSameShape(const A& a, const B& b, const char* fn, const char* arg_a,
                          const char* arg_b) {
  auto da = a.dimensions(), db = b.dimensions();
  bool same = da.size() == db.size();
  for (size_t i = 0; same && i < da.size(); ++i) same = da[i] == db[i];
  if (same && a.element_type() == b.element_type()) return ffi::Error::Success();
  return ArgError(fn, arg_b,
                  std::string("the shape and dtype of '") + arg_a + "', " + ShapeString(da) +
                      " " + DataTypeName(a.element_type()),
                  ShapeString(db) + " " + DataTypeName(b.element_type()));
}

// Dimension `axis` (negative counts from the end) must equal `expected`.
template <typename Buffer>
ffi::Error CheckDim(const Buffer& b, int64_t axis, int64_t expected, const char* fn,
                    const char* arg) {
  auto dims = b.dimensions();
  int64_t rank = static_cast<int64_t>(dims.size());
  int64_t ax = axis < 0 ? axis + rank : axis;
  if (ax < 0 || ax >= rank) {
    return ArgError(fn, arg, "an axis " + std::to_string(axis),
                    "shape " + ShapeString(dims));
  }
  if (dims[ax] == expected) return ffi::Error::Success();
  return ArgError(fn, arg, "size " + std::to_string(expected) + " along axis " +
                               std::to_string(axis),
                  "shape " + ShapeString(dims));
}

// The first `n` dims of `b` must equal the first `n` dims of `ref`.
template <typename A, typename B>
ffi::Error CheckBatchDims(const A& ref, const B& b, size_t n, const char* fn,
                          const char* arg_ref, const char* arg) {
  auto dr = ref.dimensions(), db = b.dimensions();
  bool ok = dr.size() >= n && db.size() >= n;
  for (size_t i = 0; ok && i < n; ++i) ok = dr[i] == db[i];
  if (ok) return ffi::Error::Success();
  return ArgError(fn, arg,
                  std::to_string(n) + " leading (batch) dims equal to those of '" + arg_ref +
                      "' " + ShapeString(dr),
                  "shape " + ShapeString(db));
}

// Product of dims [begin, end).
inline int64_t Product(ffi::Span<const int64_t> dims, size_t begin, size_t end) {
  int64_t p = 1;
  for (size_t i = begin; i < end && i < dims.size(); ++i) p *= dims[i];
  return p;
}

// Runs `body()` (returning ffi::Error), converting any C++ exception to an error.
template <typename F>
ffi::Error Guard(const char* fn, F&& body) noexcept {
  try {
    return body();
  } catch (const std::exception& e) {
    return ffi::Error::Internal(std::string(fn) + ": " + e.what());
  } catch (...) {
    return ffi::Error::Internal(std::string(fn) + ": unknown C++ exception");
  }
}

}  // namespace jaxbridge

// Dtype dispatch over the floating types float32/float64: binds `T` to the C++
// type and runs `BODY` (which must `return` an ffi::Error); any other dtype returns
// ffi::Error::InvalidArgument naming `FN`.
#define JAXBRIDGE_DISPATCH_FLOAT(DTYPE, FN, T, ...)                                       \
  do {                                                                                    \
    switch (DTYPE) {                                                                      \
      case ::xla::ffi::DataType::F32: {                                                   \
        using T = float;                                                                  \
        __VA_ARGS__                                                                       \
      }                                                                                   \
      case ::xla::ffi::DataType::F64: {                                                   \
        using T = double;                                                                 \
        __VA_ARGS__                                                                       \
      }                                                                                   \
      default:                                                                            \
        return ::xla::ffi::Error::InvalidArgument(                                        \
            std::string(FN) + ": unsupported dtype " + ::jaxbridge::DataTypeName(DTYPE) + \
            " (expected float32 or float64)");                                            \
    }                                                                                     \
  } while (0)

namespace jaxbridge {
// Function form of the dispatch: `f` is called with a value of the C++ type
// (`f(float{})` / `f(double{})`) and returns ffi::Error.
template <typename F>
ffi::Error DispatchFloat(ffi::DataType dtype, const char* fn, F&& f) {
  JAXBRIDGE_DISPATCH_FLOAT(dtype, fn, T, return f(T{}););
}
}  // namespace jaxbridge

#endif  // JAXBRIDGE_FFI_HELPERS_H_
