// Built-in kernels, CUDA implementations (math only; the FFI glue is in
// csrc/builtin/cuda_handlers.cc). Grid-stride loops keep every launch in bounds for
// any size; empty inputs launch nothing.
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda_kernels.h"

namespace jaxbridge::kernels::cuda {
namespace {

constexpr int kThreads = 256;

unsigned int Blocks(int64_t n) {
  int64_t b = (n + kThreads - 1) / kThreads;
  if (b < 1) b = 1;
  if (b > 65535LL * 16) b = 65535LL * 16;  // grid-stride loops cover the rest
  return static_cast<unsigned int>(b);
}

#define JB_GRID_LOOP(i, n)                                                            \
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < (n); \
       i += static_cast<int64_t>(blockDim.x) * gridDim.x)

__device__ inline float Exp(float v) { return expf(v); }
__device__ inline double Exp(double v) { return exp(v); }
__device__ inline float Log1p(float v) { return log1pf(v); }
__device__ inline double Log1p(double v) { return log1p(v); }

template <typename T>
__device__ inline T Sigmoid(T z) {
  if (z >= T(0)) return T(1) / (T(1) + Exp(-z));
  T e = Exp(z);
  return e / (T(1) + e);
}

// ------------------------------------------------------------------ softplus
template <typename T>
__global__ void SoftplusFwdKernel(const T* x, T* y, int64_t size, T beta) {
  JB_GRID_LOOP(i, size) {
    // max(x, 0) + log1p(exp(-|z|)) / beta: the large term never goes through z = beta x,
    // which overflows for huge beta x (x = 1e300, beta = 1e10) where the result is ~x.
    T z = beta * x[i];
    T a = z < T(0) ? -z : z;
    y[i] = (z > T(0) ? x[i] : T(0)) + Log1p(Exp(-a)) / beta;
  }
}

template <typename T>
__global__ void SoftplusDerivKernel(const T* x, const T* v, T* out, int64_t size, T beta) {
  JB_GRID_LOOP(i, size) out[i] = v[i] * Sigmoid(beta * x[i]);
}

// ------------------------------------------------------------------ tridiagonal
template <typename T>
__device__ inline T Lower(const T* dl, const T* du, int64_t o, int64_t i, int64_t n, bool tr) {
  if (i <= 0 || i >= n) return T(0);
  return tr ? du[o + i - 1] : dl[o + i];
}
template <typename T>
__device__ inline T Upper(const T* dl, const T* du, int64_t o, int64_t i, int64_t n, bool tr) {
  if (i < 0 || i + 1 >= n) return T(0);
  return tr ? dl[o + i + 1] : du[o + i];
}

// Parallel cyclic reduction: one block per system, one thread per row, all in
// shared memory; after ceil(log2 n) steps every row is decoupled.
template <typename T>
__global__ void PcrKernel(const T* dl, const T* d, const T* du, const T* rhs, T* x, int64_t n,
                          bool tr) {
  extern __shared__ unsigned char smem_raw[];
  T* sa = reinterpret_cast<T*>(smem_raw);
  T* sb = sa + n;
  T* sc = sb + n;
  T* sd = sc + n;
  const int64_t o = static_cast<int64_t>(blockIdx.x) * n;
  const int64_t i = threadIdx.x;
  if (i < n) {
    sa[i] = Lower(dl, du, o, i, n, tr);
    sb[i] = d[o + i];
    sc[i] = Upper(dl, du, o, i, n, tr);
    sd[i] = rhs[o + i];
  }
  __syncthreads();
  for (int64_t s = 1; s < n; s <<= 1) {
    T na = T(0), nb = T(1), nc = T(0), nd = T(0);
    if (i < n) {
      T a = sa[i], b = sb[i], c = sc[i], dd = sd[i];
      nb = b;
      nd = dd;
      if (i - s >= 0) {
        T alpha = -a / sb[i - s];
        na = alpha * sa[i - s];
        nb += alpha * sc[i - s];
        nd += alpha * sd[i - s];
      }
      if (i + s < n) {
        T gamma = -c / sb[i + s];
        nc = gamma * sc[i + s];
        nb += gamma * sa[i + s];
        nd += gamma * sd[i + s];
      }
    }
    __syncthreads();
    if (i < n) {
      sa[i] = na;
      sb[i] = nb;
      sc[i] = nc;
      sd[i] = nd;
    }
    __syncthreads();
  }
  if (i < n) x[o + i] = sd[i] / sb[i];
}

// One thread per system (large n): Thomas with a global scratch row.
template <typename T>
__global__ void ThomasKernel(const T* dl, const T* d, const T* du, const T* rhs, T* x,
                             T* scratch, int64_t batch, int64_t n, bool tr) {
  JB_GRID_LOOP(s, batch) {
    const int64_t o = s * n;
    T* cp = scratch + o;
    T denom = d[o];
    cp[0] = Upper(dl, du, o, 0, n, tr) / denom;
    x[o] = rhs[o] / denom;
    for (int64_t i = 1; i < n; ++i) {
      T li = Lower(dl, du, o, i, n, tr);
      T m = d[o + i] - li * cp[i - 1];
      cp[i] = Upper(dl, du, o, i, n, tr) / m;
      x[o + i] = (rhs[o + i] - li * x[o + i - 1]) / m;
    }
    for (int64_t i = n - 2; i >= 0; --i) x[o + i] -= cp[i] * x[o + i + 1];
  }
}

template <typename T>
__global__ void TridiagAdjointFinishKernel(const T* x, const T* lam, T* gdl, T* gd, T* gdu,
                                           int64_t batch, int64_t n) {
  JB_GRID_LOOP(idx, batch * n) {
    const int64_t i = idx % n;
    const T l = lam[idx];
    gd[idx] = -l * x[idx];
    gdl[idx] = i > 0 ? -l * x[idx - 1] : T(0);
    gdu[idx] = i + 1 < n ? -l * x[idx + 1] : T(0);
  }
}

template <typename T>
__global__ void TridiagTangentRhsKernel(const T* x, const T* tdl, const T* td, const T* tdu,
                                        const T* tb, T* out, int64_t batch, int64_t n) {
  JB_GRID_LOOP(idx, batch * n) {
    const int64_t i = idx % n;
    T r = tb[idx] - td[idx] * x[idx];
    if (i > 0) r -= tdl[idx] * x[idx - 1];
    if (i + 1 < n) r -= tdu[idx] * x[idx + 1];
    out[idx] = r;
  }
}

// ------------------------------------------------------------------ RBF
template <typename T>
__global__ void RbfFwdKernel(const T* x, const T* y, const T* l, T* k, int64_t batch, int64_t n,
                             int64_t m, int64_t dim) {
  JB_GRID_LOOP(idx, batch * n * m) {
    const int64_t j = idx % m, r = idx / m, b = r / n;
    const T* xi = x + r * dim;
    const T* yj = y + (b * m + j) * dim;
    T s = T(0);
    for (int64_t c = 0; c < dim; ++c) {
      T diff = xi[c] - yj[c];
      s += diff * diff;
    }
    k[idx] = Exp(s * (T(-0.5) / (l[b] * l[b])));
  }
}

template <typename T>
__global__ void RbfAdjXKernel(const T* x, const T* y, const T* l, const T* k, const T* ct,
                              T* gx, T* gl, int64_t batch, int64_t n, int64_t m, int64_t dim) {
  JB_GRID_LOOP(r, batch * n) {
    const int64_t b = r / n;
    const T lb = l[b];
    const T* xi = x + r * dim;
    T* gxi = gx + r * dim;
    for (int64_t c = 0; c < dim; ++c) gxi[c] = T(0);
    T lsum = T(0);
    for (int64_t j = 0; j < m; ++j) {
      const T g = ct[r * m + j] * k[r * m + j];
      const T* yj = y + (b * m + j) * dim;
      T s = T(0);
      for (int64_t c = 0; c < dim; ++c) {
        T diff = xi[c] - yj[c];
        s += diff * diff;
        gxi[c] -= g * diff;
      }
      lsum += g * s;
    }
    for (int64_t c = 0; c < dim; ++c) gxi[c] /= lb * lb;
    atomicAdd(gl + b, lsum / (lb * lb * lb));
  }
}

template <typename T>
__global__ void RbfAdjYKernel(const T* x, const T* y, const T* l, const T* k, const T* ct,
                              T* gy, int64_t batch, int64_t n, int64_t m, int64_t dim) {
  JB_GRID_LOOP(q, batch * m) {
    const int64_t b = q / m, j = q % m;
    const T lb = l[b];
    const T* yj = y + q * dim;
    T* gyj = gy + q * dim;
    for (int64_t c = 0; c < dim; ++c) gyj[c] = T(0);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t idx = (b * n + i) * m + j;
      const T g = ct[idx] * k[idx];
      const T* xi = x + (b * n + i) * dim;
      for (int64_t c = 0; c < dim; ++c) gyj[c] += g * (xi[c] - yj[c]);
    }
    for (int64_t c = 0; c < dim; ++c) gyj[c] /= lb * lb;
  }
}

template <typename T>
__global__ void RbfTanKernel(const T* x, const T* y, const T* l, const T* k, const T* tx,
                             const T* ty, const T* tl, T* dk, int64_t batch, int64_t n,
                             int64_t m, int64_t dim) {
  JB_GRID_LOOP(idx, batch * n * m) {
    const int64_t j = idx % m, r = idx / m, b = r / n;
    const T lb = l[b];
    const T* xi = x + r * dim;
    const T* txi = tx + r * dim;
    const T* yj = y + (b * m + j) * dim;
    const T* tyj = ty + (b * m + j) * dim;
    T s = T(0), dot = T(0);
    for (int64_t c = 0; c < dim; ++c) {
      T diff = xi[c] - yj[c];
      s += diff * diff;
      dot += diff * (txi[c] - tyj[c]);
    }
    dk[idx] = k[idx] * (-dot / (lb * lb) + s * tl[b] / (lb * lb * lb));
  }
}

}  // namespace

// ------------------------------------------------------------------ launchers
template <typename T>
cudaError_t SoftplusForward(cudaStream_t stream, const T* x, T* y, int64_t size, T beta) {
  if (size <= 0) return cudaSuccess;
  SoftplusFwdKernel<T><<<Blocks(size), kThreads, 0, stream>>>(x, y, size, beta);
  return cudaGetLastError();
}

template <typename T>
cudaError_t SoftplusDerivative(cudaStream_t stream, const T* x, const T* v, T* out,
                               int64_t size, T beta) {
  if (size <= 0) return cudaSuccess;
  SoftplusDerivKernel<T><<<Blocks(size), kThreads, 0, stream>>>(x, v, out, size, beta);
  return cudaGetLastError();
}

template <typename T>
cudaError_t TridiagSolve(cudaStream_t stream, const T* dl, const T* d, const T* du,
                         const T* rhs, T* x, int64_t batch, int64_t n, bool transpose,
                         T* scratch) {
  if (batch <= 0 || n <= 0) return cudaSuccess;
  if (n <= kPcrMaxN && batch <= 2147483647LL) {
    int threads = 32;
    while (threads < n) threads <<= 1;
    size_t smem = 4 * static_cast<size_t>(n) * sizeof(T);
    PcrKernel<T><<<static_cast<unsigned int>(batch), threads, smem, stream>>>(dl, d, du, rhs, x,
                                                                              n, transpose);
    return cudaGetLastError();
  }
  if (scratch == nullptr) return cudaErrorInvalidValue;
  ThomasKernel<T><<<Blocks(batch), kThreads, 0, stream>>>(dl, d, du, rhs, x, scratch, batch, n,
                                                          transpose);
  return cudaGetLastError();
}

template <typename T>
cudaError_t TridiagAdjointFinish(cudaStream_t stream, const T* x, const T* lam, T* gdl, T* gd,
                                 T* gdu, int64_t batch, int64_t n) {
  if (batch * n <= 0) return cudaSuccess;
  TridiagAdjointFinishKernel<T><<<Blocks(batch * n), kThreads, 0, stream>>>(x, lam, gdl, gd, gdu,
                                                                            batch, n);
  return cudaGetLastError();
}

template <typename T>
cudaError_t TridiagTangentRhs(cudaStream_t stream, const T* x, const T* tdl, const T* td,
                              const T* tdu, const T* tb, T* out, int64_t batch, int64_t n) {
  if (batch * n <= 0) return cudaSuccess;
  TridiagTangentRhsKernel<T><<<Blocks(batch * n), kThreads, 0, stream>>>(x, tdl, td, tdu, tb,
                                                                         out, batch, n);
  return cudaGetLastError();
}

template <typename T>
cudaError_t RbfForward(cudaStream_t stream, const T* x, const T* y, const T* l, T* k,
                       int64_t batch, int64_t n, int64_t m, int64_t dim) {
  const int64_t total = batch * n * m;
  if (total <= 0) return cudaSuccess;
  RbfFwdKernel<T><<<Blocks(total), kThreads, 0, stream>>>(x, y, l, k, batch, n, m, dim);
  return cudaGetLastError();
}

template <typename T>
cudaError_t RbfAdjoint(cudaStream_t stream, const T* x, const T* y, const T* l, const T* k,
                       const T* ct, T* gx, T* gy, T* gl, int64_t batch, int64_t n, int64_t m,
                       int64_t dim) {
  if (batch <= 0) return cudaSuccess;
  cudaError_t s = cudaMemsetAsync(gl, 0, static_cast<size_t>(batch) * sizeof(T), stream);
  if (s != cudaSuccess) return s;
  if (batch * n > 0) {
    RbfAdjXKernel<T><<<Blocks(batch * n), kThreads, 0, stream>>>(x, y, l, k, ct, gx, gl, batch,
                                                                 n, m, dim);
    if ((s = cudaGetLastError()) != cudaSuccess) return s;
  }
  if (batch * m > 0) {
    RbfAdjYKernel<T><<<Blocks(batch * m), kThreads, 0, stream>>>(x, y, l, k, ct, gy, batch, n,
                                                                 m, dim);
    if ((s = cudaGetLastError()) != cudaSuccess) return s;
  }
  return cudaSuccess;
}

template <typename T>
cudaError_t RbfTangent(cudaStream_t stream, const T* x, const T* y, const T* l, const T* k,
                       const T* tx, const T* ty, const T* tl, T* dk, int64_t batch, int64_t n,
                       int64_t m, int64_t dim) {
  const int64_t total = batch * n * m;
  if (total <= 0) return cudaSuccess;
  RbfTanKernel<T><<<Blocks(total), kThreads, 0, stream>>>(x, y, l, k, tx, ty, tl, dk, batch, n,
                                                           m, dim);
  return cudaGetLastError();
}

#define JB_INSTANTIATE(T)                                                                      \
  template cudaError_t SoftplusForward<T>(cudaStream_t, const T*, T*, int64_t, T);             \
  template cudaError_t SoftplusDerivative<T>(cudaStream_t, const T*, const T*, T*, int64_t, T); \
  template cudaError_t TridiagSolve<T>(cudaStream_t, const T*, const T*, const T*, const T*,  \
                                       T*, int64_t, int64_t, bool, T*);                        \
  template cudaError_t TridiagAdjointFinish<T>(cudaStream_t, const T*, const T*, T*, T*, T*,   \
                                               int64_t, int64_t);                              \
  template cudaError_t TridiagTangentRhs<T>(cudaStream_t, const T*, const T*, const T*,        \
                                            const T*, const T*, T*, int64_t, int64_t);         \
  template cudaError_t RbfForward<T>(cudaStream_t, const T*, const T*, const T*, T*, int64_t,  \
                                     int64_t, int64_t, int64_t);                               \
  template cudaError_t RbfAdjoint<T>(cudaStream_t, const T*, const T*, const T*, const T*,     \
                                     const T*, T*, T*, T*, int64_t, int64_t, int64_t, int64_t); \
  template cudaError_t RbfTangent<T>(cudaStream_t, const T*, const T*, const T*, const T*,     \
                                     const T*, const T*, const T*, T*, int64_t, int64_t,       \
                                     int64_t, int64_t);

JB_INSTANTIATE(float)
JB_INSTANTIATE(double)

}  // namespace jaxbridge::kernels::cuda
