// CUDA helpers for jaxbridge kernel handlers (header-only; include from code that
// is compiled with the CUDA toolkit on the include path).
//
//   ffi::Error Fwd(cudaStream_t stream, ffi::AnyBuffer x, ...) {
//     my_kernel<<<jaxbridge::Blocks(n, 256), 256, 0, stream>>>(...);
//     JAXBRIDGE_CUDA_CHECK_LAUNCH("my_kernel");   // cudaGetLastError after every launch
//     return ffi::Error::Success();
//   }
//   XLA_FFI_DEFINE_HANDLER_SYMBOL(MyFwd, Fwd,
//       ffi::Ffi::Bind().Ctx<jaxbridge::CudaStream>().Arg<ffi::AnyBuffer>() ...);
#ifndef JAXBRIDGE_CUDA_H_
#define JAXBRIDGE_CUDA_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "jaxbridge/ffi_helpers.h"

namespace jaxbridge {

// XLA's CUDA stream for this call: bind with .Ctx<jaxbridge::CudaStream>().
using CudaStream = ffi::PlatformStream<cudaStream_t>;

inline ffi::Error CudaError(const char* what, cudaError_t status) {
  return ffi::Error::Internal(std::string(what) + " failed with CUDA error " +
                              std::to_string(static_cast<int>(status)) + " (" +
                              cudaGetErrorName(status) + ": " + cudaGetErrorString(status) +
                              ")");
}

// Grid size for n work items (at least 1 block; capped to the 1-D grid limit).
inline unsigned int Blocks(int64_t n, int threads) {
  int64_t b = (n + threads - 1) / threads;
  if (b < 1) b = 1;
  if (b > 2147483647LL) b = 2147483647LL;
  return static_cast<unsigned int>(b);
}

}  // namespace jaxbridge

// Return ffi::Error::Internal (with the CUDA error code) if `expr` fails.
#define JAXBRIDGE_CUDA_CHECK(expr)                                       \
  do {                                                                   \
    cudaError_t _jb_status = (expr);                                     \
    if (_jb_status != cudaSuccess) return ::jaxbridge::CudaError(#expr, _jb_status); \
  } while (0)

// Call after every kernel launch.
#define JAXBRIDGE_CUDA_CHECK_LAUNCH(kernel_name)                                    \
  do {                                                                              \
    cudaError_t _jb_status = cudaGetLastError();                                    \
    if (_jb_status != cudaSuccess)                                                  \
      return ::jaxbridge::CudaError("launch of " kernel_name, _jb_status);          \
  } while (0)

#endif  // JAXBRIDGE_CUDA_H_
