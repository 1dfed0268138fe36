// Built-in kernels, CUDA math only (no XLA headers). Each launcher enqueues its
// kernels on `stream` and returns cudaGetLastError() after every launch.
// Layouts as in cpu_kernels.h.
#ifndef JAXBRIDGE_KERNELS_CUDA_KERNELS_H_
#define JAXBRIDGE_KERNELS_CUDA_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace jaxbridge::kernels::cuda {

template <typename T>
cudaError_t SoftplusForward(cudaStream_t stream, const T* x, T* y, int64_t size, T beta);
// out = v * sigmoid(beta x): the adjoint and the tangent.
template <typename T>
cudaError_t SoftplusDerivative(cudaStream_t stream, const T* x, const T* v, T* out,
                               int64_t size, T beta);

// Largest system solved by parallel cyclic reduction in shared memory (one block
// per system); larger systems use one thread per system (Thomas) with scratch.
constexpr int64_t kPcrMaxN = 1024;
inline int64_t TridiagScratchElems(int64_t batch, int64_t n) {
  return n <= kPcrMaxN ? 0 : batch * n;
}
// x = A^{-1} rhs (or A^{-T} rhs when transpose); x may alias rhs.
template <typename T>
cudaError_t TridiagSolve(cudaStream_t stream, const T* dl, const T* d, const T* du,
                         const T* rhs, T* x, int64_t batch, int64_t n, bool transpose,
                         T* scratch);
// gd = -lam x, gdl = -lam x[i-1], gdu = -lam x[i+1].
template <typename T>
cudaError_t TridiagAdjointFinish(cudaStream_t stream, const T* x, const T* lam, T* gdl, T* gd,
                                 T* gdu, int64_t batch, int64_t n);
// out = tb - dA x.
template <typename T>
cudaError_t TridiagTangentRhs(cudaStream_t stream, const T* x, const T* tdl, const T* td,
                              const T* tdu, const T* tb, T* out, int64_t batch, int64_t n);

template <typename T>
cudaError_t RbfForward(cudaStream_t stream, const T* x, const T* y, const T* l, T* k,
                       int64_t batch, int64_t n, int64_t m, int64_t dim);
template <typename T>
cudaError_t RbfAdjoint(cudaStream_t stream, const T* x, const T* y, const T* l, const T* k,
                       const T* ct, T* gx, T* gy, T* gl, int64_t batch, int64_t n, int64_t m,
                       int64_t dim);
template <typename T>
cudaError_t RbfTangent(cudaStream_t stream, const T* x, const T* y, const T* l, const T* k,
                       const T* tx, const T* ty, const T* tl, T* dk, int64_t batch, int64_t n,
                       int64_t m, int64_t dim);

}  // namespace jaxbridge::kernels::cuda

#endif  // JAXBRIDGE_KERNELS_CUDA_KERNELS_H_
