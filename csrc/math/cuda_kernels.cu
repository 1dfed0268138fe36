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
// Forward and tangent from dim 16 on: one 16 x 16 tile of k per block, x's and y's rows
// staged through shared memory 16 coordinates at a time (each row is read once per tile,
// coalesced, instead of once per output element). Adjoints: one block per row of x (per row of y
// for gy), the cotangent weights g = ct * k of 128 columns at a time in shared memory,
// then the threads split the coordinates, so that reads of y (x) are coalesced and the
// row's gradient accumulates in shared memory, not by read-modify-write of global memory.
constexpr int kTile = 16;       // rows of x and of y per forward/tangent block
constexpr int kAdjThreads = 128;  // threads (and columns per stage) of an adjoint block
constexpr size_t kAdjSharedMax = 48 * 1024;  // larger dims take the per-row fallback
constexpr int64_t kTileMinDim = kTile;  // lower dims take one thread per element of k

template <typename T>
__device__ inline const T* RbfRow(const T* a, int64_t b, int64_t row, int64_t rows,
                                  int64_t dim) {
  return a + (b * rows + row) * dim;
}

template <typename T>
__device__ inline T BlockSum(T v, T* scratch) {  // scratch: kAdjThreads values
  scratch[threadIdx.x] = v;
  __syncthreads();
  for (int half = kAdjThreads / 2; half > 0; half >>= 1) {
    if (threadIdx.x < half) scratch[threadIdx.x] += scratch[threadIdx.x + half];
    __syncthreads();
  }
  T total = scratch[0];
  __syncthreads();
  return total;
}

// Tiles of k (and of dk with tangents): blocks stride over (batch, tile row of x, tile
// column of y) through gridDim.z, .y and .x, so any size is covered.
template <typename T, bool kTangent>
__global__ void RbfTileKernel(const T* x, const T* y, const T* l, const T* k, const T* tx,
                              const T* ty, const T* tl, T* out, int64_t batch, int64_t n,
                              int64_t m, int64_t dim) {
  __shared__ T xs[kTile][kTile + 1], ys[kTile][kTile + 1];
  __shared__ T txs[kTangent ? kTile : 1][kTile + 1], tys[kTangent ? kTile : 1][kTile + 1];
  const int row = threadIdx.y, col = threadIdx.x;
  const int64_t tiles_n = (n + kTile - 1) / kTile, tiles_m = (m + kTile - 1) / kTile;
  for (int64_t b = blockIdx.z; b < batch; b += gridDim.z) {
    for (int64_t ti = blockIdx.y; ti < tiles_n; ti += gridDim.y) {
      for (int64_t tj = blockIdx.x; tj < tiles_m; tj += gridDim.x) {
        const int64_t i0 = ti * kTile, j0 = tj * kTile;
        T s = T(0), dot = T(0);
        for (int64_t c0 = 0; c0 < dim; c0 += kTile) {
          // Thread (row, col) loads coordinate c0 + col of row `row` of each tile.
          const int64_t c = c0 + col, xi = i0 + row, yj = j0 + row;
          const bool cin = c < dim;
          xs[row][col] = (cin && xi < n) ? RbfRow(x, b, xi, n, dim)[c] : T(0);
          ys[row][col] = (cin && yj < m) ? RbfRow(y, b, yj, m, dim)[c] : T(0);
          if constexpr (kTangent) {
            txs[row][col] = (cin && xi < n) ? RbfRow(tx, b, xi, n, dim)[c] : T(0);
            tys[row][col] = (cin && yj < m) ? RbfRow(ty, b, yj, m, dim)[c] : T(0);
          }
          __syncthreads();
          const int count = static_cast<int>(dim - c0 < kTile ? dim - c0 : kTile);
          for (int cc = 0; cc < count; ++cc) {
            const T diff = xs[row][cc] - ys[col][cc];
            s += diff * diff;
            if constexpr (kTangent) dot += diff * (txs[row][cc] - tys[col][cc]);
          }
          __syncthreads();
        }
        const int64_t i = i0 + row, j = j0 + col;
        if (i < n && j < m) {
          const int64_t idx = (b * n + i) * m + j;
          const T lb = l[b];
          if constexpr (kTangent) {
            out[idx] = k[idx] * (-dot / (lb * lb) + s * tl[b] / (lb * lb * lb));
          } else {
            out[idx] = Exp(s * (T(-0.5) / (lb * lb)));
          }
        }
      }
    }
  }
}

// The adjoint for each row of one side ("own": x for gx, y for gy) against every row
// of the other side: with g = ct * k at (batch, own row, other row) through the two
// strides, the gradient is -sum over the other rows of g * (own - other) / l^2, and
// with `gl` the length scale's share sum g * |own - other|^2 / l^3 is added.
template <typename T>
__global__ void RbfAdjRowsKernel(const T* own, const T* other, const T* l, const T* k,
                                 const T* ct, T* grad, T* gl, int64_t batch, int64_t rows,
                                 int64_t others, int64_t dim, int64_t ct_row_stride,
                                 int64_t ct_col_stride) {
  extern __shared__ unsigned char shared_bytes[];
  T* own_row = reinterpret_cast<T*>(shared_bytes);  // dim
  T* acc = own_row + dim;                           // dim
  T* gs = acc + dim;                                // kAdjThreads
  T* scratch = gs + kAdjThreads;                    // kAdjThreads
  for (int64_t r = blockIdx.x; r < batch * rows; r += gridDim.x) {  // (batch, row)
    const int64_t b = r / rows, row = r % rows;
    const T* o = own + r * dim;
    for (int64_t c = threadIdx.x; c < dim; c += kAdjThreads) {
      own_row[c] = o[c];
      acc[c] = T(0);
    }
    __syncthreads();
    T lsum = T(0);
    const T* base_other = other + b * others * dim;
    const int64_t ct_base = b * rows * others + row * ct_row_stride;
    for (int64_t q0 = 0; q0 < others; q0 += kAdjThreads) {
      const int64_t q = q0 + threadIdx.x;
      T g = T(0);
      if (q < others) {
        const int64_t at = ct_base + q * ct_col_stride;
        g = ct[at] * k[at];
        if (gl != nullptr) {
          const T* oq = base_other + q * dim;
          T s = T(0);
          for (int64_t c = 0; c < dim; ++c) {
            const T diff = own_row[c] - oq[c];
            s += diff * diff;
          }
          lsum += g * s;
        }
      }
      gs[threadIdx.x] = g;
      __syncthreads();
      const int count =
          static_cast<int>(others - q0 < kAdjThreads ? others - q0 : kAdjThreads);
      for (int64_t c = threadIdx.x; c < dim; c += kAdjThreads) {
        const T* column = base_other + q0 * dim + c;
        T a = T(0);
        for (int qq = 0; qq < count; ++qq) a += gs[qq] * (own_row[c] - column[qq * dim]);
        acc[c] += a;
      }
      __syncthreads();
    }
    const T lb = l[b];
    T* gr = grad + r * dim;
    for (int64_t c = threadIdx.x; c < dim; c += kAdjThreads) gr[c] = -acc[c] / (lb * lb);
    if (gl != nullptr) {
      const T total = BlockSum(lsum, scratch);
      if (threadIdx.x == 0) atomicAdd(gl + b, total / (lb * lb * lb));
    }
    __syncthreads();  // own_row and acc are reused by the next row
  }
}

// Low dims: one thread per element of k (or dk). Measured on an H200 (benchmarks/
// RESULTS.md): at dim 3 this beat the tiles (423 against 572 us at 8000 x 8000), at dim
// 64 the tiles won tenfold.
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

// Fallback for dims whose rows do not fit in shared memory: one thread per row.
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

// Forward and tangent tiles: 16 x 16 threads a block; the kernel strides over what the
// grid's limits leave out.
static dim3 RbfTileGrid(int64_t batch, int64_t n, int64_t m) {
  auto cap = [](int64_t v, int64_t most) {
    return static_cast<unsigned int>(v < 1 ? 1 : (v > most ? most : v));
  };
  return dim3(cap((m + kTile - 1) / kTile, 2147483647LL), cap((n + kTile - 1) / kTile, 65535),
              cap(batch, 65535));
}

static unsigned int AdjBlocks(int64_t rows) {
  return static_cast<unsigned int>(rows > 2147483647LL ? 2147483647LL : rows);
}

template <typename T>
cudaError_t RbfForward(cudaStream_t stream, const T* x, const T* y, const T* l, T* k,
                       int64_t batch, int64_t n, int64_t m, int64_t dim) {
  const int64_t total = batch * n * m;
  if (total <= 0) return cudaSuccess;
  if (dim < kTileMinDim) {
    RbfFwdKernel<T><<<Blocks(total), kThreads, 0, stream>>>(x, y, l, k, batch, n, m, dim);
    return cudaGetLastError();
  }
  RbfTileKernel<T, false><<<RbfTileGrid(batch, n, m), dim3(kTile, kTile), 0, stream>>>(
      x, y, l, nullptr, nullptr, nullptr, nullptr, k, batch, n, m, dim);
  return cudaGetLastError();
}

template <typename T>
cudaError_t RbfAdjoint(cudaStream_t stream, const T* x, const T* y, const T* l, const T* k,
                       const T* ct, T* gx, T* gy, T* gl, int64_t batch, int64_t n, int64_t m,
                       int64_t dim) {
  if (batch <= 0) return cudaSuccess;
  cudaError_t s = cudaMemsetAsync(gl, 0, static_cast<size_t>(batch) * sizeof(T), stream);
  if (s != cudaSuccess) return s;
  const size_t shared = (2 * static_cast<size_t>(dim) + 2 * kAdjThreads) * sizeof(T);
  const bool tiled = shared <= kAdjSharedMax;
  if (batch * n > 0) {
    if (tiled) {  // gx and gl: own rows are x's; ct and k at (b, row, q): stride m, 1
      RbfAdjRowsKernel<T><<<AdjBlocks(batch * n), kAdjThreads, shared, stream>>>(
          x, y, l, k, ct, gx, gl, batch, n, m, dim, m, 1);
    } else {
      RbfAdjXKernel<T><<<Blocks(batch * n), kThreads, 0, stream>>>(x, y, l, k, ct, gx, gl,
                                                                   batch, n, m, dim);
    }
    if ((s = cudaGetLastError()) != cudaSuccess) return s;
  }
  if (batch * m > 0) {
    if (tiled) {  // gy: own rows are y's; ct and k at (b, q, row): stride 1, m
      RbfAdjRowsKernel<T><<<AdjBlocks(batch * m), kAdjThreads, shared, stream>>>(
          y, x, l, k, ct, gy, nullptr, batch, m, n, dim, 1, m);
    } else {
      RbfAdjYKernel<T><<<Blocks(batch * m), kThreads, 0, stream>>>(x, y, l, k, ct, gy, batch,
                                                                   n, m, dim);
    }
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
  if (dim < kTileMinDim) {
    RbfTanKernel<T><<<Blocks(total), kThreads, 0, stream>>>(x, y, l, k, tx, ty, tl, dk, batch,
                                                             n, m, dim);
    return cudaGetLastError();
  }
  RbfTileKernel<T, true><<<RbfTileGrid(batch, n, m), dim3(kTile, kTile), 0, stream>>>(
      x, y, l, k, tx, ty, tl, dk, batch, n, m, dim);
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
