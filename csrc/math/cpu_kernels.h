// Built-in kernels, CPU math only: no XLA headers, no allocation, no exceptions.
// Every function works on one contiguous index range (or takes a parallel-for, see
// the RBF kernel) so the FFI glue can split the work over a thread pool, and the
// AddressSanitizer driver can call it directly.
//
// Layouts (row-major, leading batch dims flattened into `batch`):
//   softplus:  x, y: [size]
//   tridiag:   dl, d, du, b, x: [batch, n]; dl[.,0] and du[.,n-1] are ignored
//              (treated as 0), like jax.lax.linalg.tridiagonal_solve
//   rbf:       x: [batch, n, dim], y: [batch, m, dim], l: [batch], K: [batch, n, m]
//
// The element-wise and RBF loops are written to be auto-vectorized (see cpu_math.h:
// no libm calls, no branches) and are compiled once per instruction set
// (cpu_isa.h: baseline, AVX2, AVX-512), picked at run time.
#ifndef JAXBRIDGE_KERNELS_CPU_KERNELS_H_
#define JAXBRIDGE_KERNELS_CPU_KERNELS_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "cpu_isa.h"
#include "cpu_math.h"
#include "cpu_simd.h"

namespace jaxbridge::kernels {

// ------------------------------------------------------------------ softplus
// softplus_beta(x) = log(1 + exp(beta x)) / beta, computed as
// max(x, 0) + log1p(exp(-|z|)) / beta with z = beta x (beta > 0): finite for any finite
// x, even where z overflows (beta x = inf: the log1p term is 0 and the result is x;
// scaling max(z, 0) back by 1/beta gave inf there). (Multiplying by 1/beta, exact for
// beta = 1 or any power of 2, costs at most an ulp elsewhere; a vector division is
// several times slower and these loops are compute-bound in cache.)
template <typename T>
void SoftplusForward(const T* x, T* y, int64_t begin, int64_t end, T beta) {
  const T inv_beta = T(1) / beta;
  DispatchIsa(ActiveIsa(), [&](auto) {
    for (int64_t i = begin; i < end; ++i) y[i] = math::SoftplusScaled(x[i], beta, inv_beta);
  });
}

// Adjoint (and, being diagonal, also the tangent): out = v * sigmoid(beta x).
template <typename T>
void SoftplusDerivative(const T* x, const T* v, T* out, int64_t begin, int64_t end, T beta) {
  DispatchIsa(ActiveIsa(), [&](auto) {
    for (int64_t i = begin; i < end; ++i) out[i] = v[i] * math::Sigmoid(beta * x[i]);
  });
}

// ------------------------------------------------------------------ tridiagonal
// Thomas algorithm for one system of size n. `lower(i)`, `diag(i)`, `upper(i)`
// give A[i,i-1], A[i,i], A[i,i+1]. `x` may alias `rhs`. `scratch` holds n values.
// No pivoting: meant for diagonally dominant or symmetric positive definite systems
// (a zero pivot gives inf/nan, never an out-of-bounds access).
template <typename T, typename Lo, typename Di, typename Up>
void ThomasSolve(int64_t n, Lo lower, Di diag, Up upper, const T* rhs, T* x, T* scratch) {
  if (n <= 0) return;
  T denom = diag(0);
  scratch[0] = n > 1 ? upper(0) / denom : T(0);
  x[0] = rhs[0] / denom;
  for (int64_t i = 1; i < n; ++i) {
    T li = lower(i);
    T m = diag(i) - li * scratch[i - 1];
    scratch[i] = i + 1 < n ? upper(i) / m : T(0);
    x[i] = (rhs[i] - li * x[i - 1]) / m;
  }
  for (int64_t i = n - 2; i >= 0; --i) x[i] -= scratch[i] * x[i + 1];
}

// x = A^{-1} b for systems [begin, end). scratch: n values.
template <typename T>
void TridiagSolve(const T* dl, const T* d, const T* du, const T* b, T* x, int64_t n,
                  int64_t begin, int64_t end, T* scratch) {
  for (int64_t s = begin; s < end; ++s) {
    const int64_t o = s * n;
    ThomasSolve<T>(
        n, [&](int64_t i) { return dl[o + i]; }, [&](int64_t i) { return d[o + i]; },
        [&](int64_t i) { return du[o + i]; }, b + o, x + o, scratch);
  }
}

// Adjoint of x = A^{-1} b given the cotangent ct of x:
//   gb = A^{-T} ct,  gd[i] = -gb[i] x[i],  gdl[i] = -gb[i] x[i-1],  gdu[i] = -gb[i] x[i+1]
// (gdl[0] = gdu[n-1] = 0). `gd` doubles as the Thomas scratch, so no extra memory.
template <typename T>
void TridiagAdjoint(const T* dl, const T* d, const T* du, const T* x, const T* ct, T* gdl,
                    T* gd, T* gdu, T* gb, int64_t n, int64_t begin, int64_t end) {
  for (int64_t s = begin; s < end; ++s) {
    const int64_t o = s * n;
    // A^T: lower(i) = du[i-1], upper(i) = dl[i+1].
    ThomasSolve<T>(
        n, [&](int64_t i) { return i > 0 ? du[o + i - 1] : T(0); },
        [&](int64_t i) { return d[o + i]; },
        [&](int64_t i) { return i + 1 < n ? dl[o + i + 1] : T(0); }, ct + o, gb + o, gd + o);
    for (int64_t i = 0; i < n; ++i) {
      const T lam = gb[o + i];
      gd[o + i] = -lam * x[o + i];
      gdl[o + i] = i > 0 ? -lam * x[o + i - 1] : T(0);
      gdu[o + i] = i + 1 < n ? -lam * x[o + i + 1] : T(0);
    }
  }
}

// Tangent: dx = A^{-1} (db - dA x). scratch: n values.
template <typename T>
void TridiagTangent(const T* dl, const T* d, const T* du, const T* x, const T* tdl,
                    const T* td, const T* tdu, const T* tb, T* dx, int64_t n, int64_t begin,
                    int64_t end, T* scratch) {
  for (int64_t s = begin; s < end; ++s) {
    const int64_t o = s * n;
    for (int64_t i = 0; i < n; ++i) {
      T r = tb[o + i] - td[o + i] * x[o + i];
      if (i > 0) r -= tdl[o + i] * x[o + i - 1];
      if (i + 1 < n) r -= tdu[o + i] * x[o + i + 1];
      dx[o + i] = r;
    }
    ThomasSolve<T>(
        n, [&](int64_t i) { return dl[o + i]; }, [&](int64_t i) { return d[o + i]; },
        [&](int64_t i) { return du[o + i]; }, dx + o, dx + o, scratch);
  }
}

// ------------------------------------------------------------------ RBF kernel
// K[b,i,j] = exp(-|x[b,i] - y[b,j]|^2 / (2 l[b]^2)) and its adjoint and tangent.
//
// Blocked like a GEMM (XLA computes this as a GEMM, a per-element libm loop is
// several times slower): y is packed, per batch, into panels of kW columns,
// panel-major [panel][row][kW] and zero-padded past m, so that the inner loops run
// over kW contiguous columns (one or two SIMD registers) while a register tile of
// R rows of x reuses every panel load. Two forms of the distance:
//   * direct (dim <= kDirectMaxDim): sum_c (x_c - y_c)^2, exact like a plain loop;
//   * gemm (larger dim): |x|^2 + |y|^2 - 2 x.y, half the flops, on data centred at
//     the mean of y (the distance is translation invariant) so that the float32
//     cancellation stays small (points at 1000 + N(0, 1) keep full accuracy, see
//     tests/test_ops.py); clamped at 0.
// The register tiles use explicit SIMD vectors (cpu_simd.h); the element-wise
// epilogues (exp) are left to the auto-vectorizer.
// The drivers take a parallel-for `pf(count, grain, body)` that calls
// body(chunk, begin, end) over disjoint ranges covering [0, count) (the FFI glue
// passes jaxbridge::ParallelFor over XLA's pool) and caller-owned scratch memory.
namespace rbf {

template <typename T>
constexpr int64_t kW = 128 / sizeof(T);  // panel width: 2 AVX-512 registers per row
constexpr int64_t kDirectMaxDim = 8;

inline bool UseGemm(int64_t dim) { return dim > kDirectMaxDim; }

template <typename T>
int64_t PaddedCols(int64_t m) {
  return (m + kW<T> - 1) / kW<T> * kW<T>;
}

// SIMD shape of a panel row for one ISA: kNV vectors V of kL lanes, and kR rows of
// x per register tile so that the kR x kNV accumulators fill half the registers
// (AVX-512: 8 rows x 2 zmm, AVX2: 2 x 4 ymm, SSE2/baseline: 1 x 8 xmm).
template <typename T, typename IsaT>
struct Shape {
  static constexpr int kL = IsaT::kVectorBytes / static_cast<int>(sizeof(T));
  static constexpr int kNV = static_cast<int>(kW<T>) / kL;
  static constexpr int kR = std::max(1, IsaT::kVectorRegisters / 2 / kNV);
  using V = typename simd::VecOf<T, IsaT::kVectorBytes>::type;
  static JB_INLINE void Load(V& v, const T* p) { simd::Load<T, IsaT::kVectorBytes>(v, p); }
  static JB_INLINE void Store(T* p, const V& v) { simd::Store<T, IsaT::kVectorBytes>(p, v); }
};

// A panel row of vectors, and R of them (register tiles).
template <typename T, typename IsaT>
using VecRow = typename Shape<T, IsaT>::V[Shape<T, IsaT>::kNV];
template <typename T, typename IsaT, int R>
using VecTile = typename Shape<T, IsaT>::V[R][Shape<T, IsaT>::kNV];

// Packed y of one batch: `rows` x mp values (zero-padded past m), then a column
// vector [mp] and the centre [dim]. Panel-major ([panel][rows][kW], each panel
// contiguous) for the forward and tangent, which sweep all rows of one panel;
// row-major ([rows][mp]) for the adjoint, which sweeps one row over all columns
// (with panel-major rows dim * kW apart, the hardware prefetcher does not follow).
template <typename T>
int64_t PackSize(int64_t m, int64_t dim, int64_t rows) {
  return PaddedCols<T>(m) * (rows + 1) + dim;
}

template <typename T>
struct Pack {
  const T* panels;  // see PackSize
  const T* col;     // [mp]
  const T* mu;      // [dim]
  int64_t ld;       // distance between two rows of a panel: kW or mp
  int64_t pstride;  // distance between two panels: rows kW or kW
  const T* Panel(int64_t p) const { return panels + p * pstride; }
};

template <typename T>
Pack<T> PackOf(const T* packed, int64_t b, int64_t m, int64_t dim, int64_t rows,
               bool row_major = false) {
  const int64_t mp = PaddedCols<T>(m);
  const T* base = packed + b * PackSize<T>(m, dim, rows);
  return {base, base + mp * rows, base + mp * (rows + 1), row_major ? mp : kW<T>,
          row_major ? kW<T> : rows * kW<T>};
}

// Centre of y[b] (its mean, or 0), into mu[dim]; summed in double.
template <typename T>
void Centre(const T* yb, int64_t m, int64_t dim, bool center, T* mu) {
  for (int64_t c = 0; c < dim; ++c) {
    double s = 0;
    if (center)
      for (int64_t j = 0; j < m; ++j) s += yb[j * dim + c];
    mu[c] = center && m > 0 ? static_cast<T>(s / static_cast<double>(m)) : T(0);
  }
}

// Row row0 + c, column j of the packed values = src[j, c] - mu[c] (0 for j >= m).
template <typename T>
void PackRows(const T* src, const T* mu, int64_t m, int64_t dim, int64_t rows, int64_t row0,
              T* panels, bool row_major = false) {
  const int64_t mp = PaddedCols<T>(m), np = mp / kW<T>;
  for (int64_t p = 0; p < np; ++p)
    for (int64_t c = 0; c < dim; ++c) {
      T* dst = row_major ? panels + (row0 + c) * mp + p * kW<T>
                         : panels + (p * rows + row0 + c) * kW<T>;
      for (int64_t jj = 0; jj < kW<T>; ++jj) {
        const int64_t j = p * kW<T> + jj;
        dst[jj] = j < m ? src[j * dim + c] - (mu ? mu[c] : T(0)) : T(0);
      }
    }
}

// acc[r] += sum_c a_rc P[c]  (kDirect: += (a_rc - P[c])^2) for R rows of x,
// a_rc = xrow[r dim + c] (- mu[c] if kCentre), and a panel P (row c at P + c ld).
template <typename T, typename IsaT, int R, bool kDirect, bool kCentre>
JB_INLINE void Accumulate(const T* xrow, int64_t dim, const T* mu, const T* P, int64_t ld,
                          VecTile<T, IsaT, R>& acc) {
  using S = Shape<T, IsaT>;
  using V = typename S::V;
  for (int64_t c = 0; c < dim; ++c) {
    V p[S::kNV];
    for (int v = 0; v < S::kNV; ++v) S::Load(p[v], P + c * ld + v * S::kL);
    for (int r = 0; r < R; ++r) {
      const T a = kCentre ? xrow[r * dim + c] - mu[c] : xrow[r * dim + c];
      for (int v = 0; v < S::kNV; ++v) {
        if constexpr (kDirect) {
          const V d = a - p[v];
          acc[r][v] += d * d;
        } else {
          acc[r][v] += a * p[v];
        }
      }
    }
  }
}

template <typename T, typename IsaT, int R>
JB_INLINE void Zero(VecTile<T, IsaT, R>& acc) {
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < Shape<T, IsaT>::kNV; ++v) simd::SetZero(acc[r][v]);
}

// out[v] = src[v kL ...] for a panel row of which only the first wn <= kW columns
// exist; never reads src past wn.
template <typename T, typename IsaT>
JB_INLINE void LoadRow(const T* src, int64_t wn, VecRow<T, IsaT>& out) {
  using S = Shape<T, IsaT>;
  if (wn == kW<T>) {
    for (int v = 0; v < S::kNV; ++v) S::Load(out[v], src + v * S::kL);
  } else {
    T tmp[kW<T>] = {};
    for (int64_t jj = 0; jj < wn; ++jj) tmp[jj] = src[jj];
    for (int v = 0; v < S::kNV; ++v) S::Load(out[v], tmp + v * S::kL);
  }
}

// dst[0, wn) = the first wn columns of a panel row.
template <typename T, typename IsaT>
JB_INLINE void StoreRow(T* dst, int64_t wn, const VecRow<T, IsaT>& in) {
  using S = Shape<T, IsaT>;
  if (wn == kW<T>) {
    for (int v = 0; v < S::kNV; ++v) S::Store(dst + v * S::kL, in[v]);
  } else {
    T tmp[kW<T>];
    for (int v = 0; v < S::kNV; ++v) S::Store(tmp + v * S::kL, in[v]);
    for (int64_t jj = 0; jj < wn; ++jj) dst[jj] = tmp[jj];
  }
}

// Squared distances of R rows of x to the kW columns of panel p, into d2[r][0, kW).
// The gemm form needs pk.col = |y_j - mu|^2, pk.mu and xn[r] = |x_r - mu|^2.
template <typename T, typename IsaT, int R, bool kGemm>
JB_INLINE void SquaredDistances(const T* xrow, int64_t dim, const Pack<T>& pk, int64_t p,
                                const T* xn, T (&d2)[R][kW<T>]) {
  using S = Shape<T, IsaT>;
  typename S::V acc[R][S::kNV];
  Zero<T, IsaT, R>(acc);
  Accumulate<T, IsaT, R, !kGemm, false>(xrow, dim, nullptr, pk.Panel(p), pk.ld, acc);
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < S::kNV; ++v) S::Store(d2[r] + v * S::kL, acc[r][v]);
  if constexpr (kGemm) {  // xrow is centred already
    const T* yn = pk.col + p * kW<T>;
    for (int r = 0; r < R; ++r) {
      for (int64_t jj = 0; jj < kW<T>; ++jj) {
        const T v = xn[r] + yn[jj] - T(2) * d2[r][jj];
        d2[r][jj] = v < T(0) ? T(0) : v;  // rounding can make it negative; NaN stays NaN
      }
    }
  }
}

// Calls tile(integral_constant<int, R>, i) for row blocks of R rows of [s, e), then
// for the rest with R/2, R/4, ..., 1 rows (R is a power of 2).
template <int R, typename Tile>
JB_INLINE void ForRowBlocks(int64_t s, int64_t e, const Tile& tile) {
  int64_t i = s;
  for (; i + R <= e; i += R) tile(std::integral_constant<int, R>(), i);
  if constexpr (R > 1) ForRowBlocks<R / 2>(i, e, tile);
}

// Rows per register tile of the ISA that will run (see Shape).
template <typename T>
int64_t TileRows(Isa isa) {
  switch (isa) {
    case Isa::kAvx512: return Shape<T, IsaTag<Isa::kAvx512>>::kR;
    case Isa::kAvx2: return Shape<T, IsaTag<Isa::kAvx2>>::kR;
    default: return Shape<T, IsaTag<Isa::kBaseline>>::kR;
  }
}

// The parallel work items: tiles of `tile` rows within each batch, so that chunk
// boundaries never split a register tile (a split leaves rows for the slower
// smaller tiles). Item t starts at row Row(t); items [t0, t1) are rows [Row(t0), Row(t1)).
struct RowTiles {
  int64_t n, tile, per_batch;
  RowTiles(int64_t n_, int64_t tile_) : n(n_), tile(tile_), per_batch((n_ + tile_ - 1) / tile_) {}
  int64_t Count(int64_t batch) const { return batch * per_batch; }
  int64_t Row(int64_t t) const {
    return per_batch ? t / per_batch * n + std::min(n, t % per_batch * tile) : 0;
  }
};

// Calls f(b, s, e) for the batch-aligned pieces of the row range [begin, end).
template <typename F>
JB_INLINE void ForBatchPieces(int64_t begin, int64_t end, int64_t n, const F& f) {
  for (int64_t s = begin; s < end;) {
    const int64_t b = s / n, e = std::min(end, (b + 1) * n);
    f(b, s, e);
    s = e;
  }
}

// ---- forward
// Per-row scalars, computed once per row (not per tile: a dim-long scalar chain).
template <typename T>
JB_INLINE T CentredNorm2(const T* xr, const T* mu, int64_t dim) {
  T s = T(0);
  for (int64_t c = 0; c < dim; ++c) {
    const T a = xr[c] - mu[c];
    s += a * a;
  }
  return s;
}

// Rows [begin, end) of K. Gemm form: xc [batch n dim] and xn [batch n] are scratch
// for the centred rows of x and their squared norms (centring up front keeps the
// tile loop to loads and FMAs: the x values enter as broadcast memory operands).
template <typename T, typename IsaT, bool kGemm>
JB_INLINE void ForwardRows(const T* x, const T* l, const T* packed, T* xc, T* xn, T* k,
                           int64_t n, int64_t m, int64_t dim, int64_t begin, int64_t end) {
  constexpr int64_t W = kW<T>;
  const int64_t np = PaddedCols<T>(m) / W;
  ForBatchPieces(begin, end, n, [&](int64_t b, int64_t s, int64_t e) JB_LAMBDA_INLINE {
    const Pack<T> pk = PackOf(packed, b, m, dim, dim);
    const T scale = T(-0.5) / (l[b] * l[b]);
    if constexpr (kGemm) {
      for (int64_t i = s; i < e; ++i) {
        T s2 = T(0);
        for (int64_t c = 0; c < dim; ++c) {
          const T a = x[i * dim + c] - pk.mu[c];
          xc[i * dim + c] = a;
          s2 += a * a;
        }
        xn[i] = s2;
      }
    }
    const T* xs = kGemm ? xc : x;  // the tiles read the centred copy
    for (int64_t p = 0; p < np; ++p) {  // panel outer: it stays in L1 for all rows
      const int64_t wn = std::min(W, m - p * W);
      ForRowBlocks<Shape<T, IsaT>::kR>(s, e, [&](auto rows, int64_t i) JB_LAMBDA_INLINE {
        constexpr int R = decltype(rows)::value;
        T d2[R][W];
        SquaredDistances<T, IsaT, R, kGemm>(xs + i * dim, dim, pk, p, xn + i, d2);
        for (int r = 0; r < R; ++r) {
          for (int64_t jj = 0; jj < W; ++jj) d2[r][jj] = math::ExpNonPositive(scale * d2[r][jj]);
          T* kr = k + (i + r) * m + p * W;
          if (wn == W) {
            for (int64_t jj = 0; jj < W; ++jj) kr[jj] = d2[r][jj];
          } else {
            for (int64_t jj = 0; jj < wn; ++jj) kr[jj] = d2[r][jj];
          }
        }
      });
    }
  });
}

// ---- adjoint
// With G = ct * K (elementwise), for rows i and columns j of one batch:
//   gx_i = -(1/l^2) sum_j G_ij (x_i - y_j),   gy_j = (1/l^2) sum_i G_ij (x_i - y_j),
//   gl   = (1/l^3) sum_ij G_ij |x_i - y_j|^2.
// A task owns rows [s, e) of batch b: it writes their gx and accumulates, into its
// own partial buffers, py [dim][mp] and pcs [mp] (for gy) and *plsum. Direct
// form: py = sum_i G (x_i - y_j), the gl sum uses the exact distances. Gemm form
// (centred data, mu): py = sum_i G (x_i - mu), pcs = sum_i G, and
//   sum_j G_ij (x_i - y_j) = rs_i (x_i - mu) - sum_j G_ij (y_j - mu),
//   sum_ij G |x_i - y_j|^2 = sum_i [rs_i |x_i - mu|^2 - 2 (x_i - mu).(sum_j G_ij (y_j - mu))]
//                            + sum_j cs_j |y_j - mu|^2   (the last term in Finish).
template <typename T, typename IsaT, int R, bool kGemm, int64_t kJB>
JB_INLINE void AdjointBlock(const T* xrow, const T* krow, const T* crow, T* gxrow,
                            const Pack<T>& pk, T* py, T* pcs, int64_t m, int64_t dim,
                            T inv_l2, double* plsum) {
  using S = Shape<T, IsaT>;
  using V = typename S::V;
  constexpr int64_t W = kW<T>;
  constexpr int NV = S::kNV, L = S::kL;
  const int64_t mp = PaddedCols<T>(m);
  alignas(64) T G[R][kJB];  // G for R rows and one block of columns
  V rs[R][NV], ls[R][NV];   // lane-wise row sums of G and of G d2 (direct form)
  Zero<T, IsaT, R>(rs);
  Zero<T, IsaT, R>(ls);
  // gxrow accumulates sum_j G (x - y) (direct) or sum_j G (y - mu) (gemm).
  for (int r = 0; r < R; ++r)
    for (int64_t c = 0; c < dim; ++c) gxrow[r * dim + c] = T(0);
  for (int64_t j0 = 0; j0 < mp; j0 += kJB) {
    const int64_t jn = std::min(kJB, mp - j0);
    // Phase 1: G (zero past m), row and column sums; d2 for gl (direct form).
    for (int64_t q = 0; q < jn; q += W) {
      const int64_t j = j0 + q, p = j / W, wn = std::min(W, m - j);
      V d2[R][NV];
      if constexpr (!kGemm) {
        Zero<T, IsaT, R>(d2);
        Accumulate<T, IsaT, R, true, false>(xrow, dim, nullptr, pk.Panel(p), pk.ld, d2);
      }
      V cs[NV];
      for (int v = 0; v < NV; ++v) simd::SetZero(cs[v]);
      for (int r = 0; r < R; ++r) {
        V kv[NV], cv[NV];
        LoadRow<T, IsaT>(krow + r * m + j, wn, kv);
        LoadRow<T, IsaT>(crow + r * m + j, wn, cv);
        for (int v = 0; v < NV; ++v) {
          const V g = cv[v] * kv[v];
          S::Store(G[r] + q + v * L, g);
          rs[r][v] += g;
          cs[v] += g;
          if constexpr (!kGemm) ls[r][v] += g * d2[r][v];
        }
      }
      if constexpr (kGemm) {
        for (int v = 0; v < NV; ++v) {
          V t;
          S::Load(t, pcs + j + v * L);
          t += cs[v];
          S::Store(pcs + j + v * L, t);
        }
      }
    }
    // Phase 2: both products with G, one pass over the block per coordinate c.
    for (int64_t c = 0; c < dim; ++c) {
      T a[R];
      V acc[R][NV];
      for (int r = 0; r < R; ++r) a[r] = xrow[r * dim + c] - (kGemm ? pk.mu[c] : T(0));
      Zero<T, IsaT, R>(acc);
      const T* yc = pk.panels + c * mp + j0;  // row-major pack: contiguous in j
      T* gc = py + c * mp + j0;
      for (int64_t q = 0; q < jn; q += W) {
        for (int v = 0; v < NV; ++v) {
          V yv, s[2];  // two partial sums: halves the FMA dependency chain over r
          S::Load(yv, yc + q + v * L);
          S::Load(s[0], gc + q + v * L);
          simd::SetZero(s[1]);
          for (int r = 0; r < R; ++r) {
            V g;
            S::Load(g, G[r] + q + v * L);
            if constexpr (kGemm) {
              acc[r][v] += g * yv;
              s[r & 1] += a[r] * g;
            } else {
              const V t = g * (a[r] - yv);
              acc[r][v] += t;
              s[r & 1] += t;
            }
          }
          S::Store(gc + q + v * L, s[0] + s[1]);
        }
      }
      for (int r = 0; r < R; ++r) {
        T s = T(0);
        for (int v = 0; v < NV; ++v) s += simd::HorizontalSum<T>(acc[r][v]);
        gxrow[r * dim + c] += s;
      }
    }
  }
  // Phase 3: gx (final) and this block's part of sum G d2.
  double lsum = 0;
  for (int r = 0; r < R; ++r) {
    T rsum = T(0), lrow = T(0);
    for (int v = 0; v < NV; ++v) {
      rsum += simd::HorizontalSum<T>(rs[r][v]);
      lrow += simd::HorizontalSum<T>(ls[r][v]);
    }
    lsum += lrow;
    for (int64_t c = 0; c < dim; ++c) {
      const T s = gxrow[r * dim + c];
      if constexpr (kGemm) {
        const T a = xrow[r * dim + c] - pk.mu[c];
        lsum += static_cast<double>(a) * (static_cast<double>(rsum) * a - 2.0 * s);
        gxrow[r * dim + c] = -(rsum * a - s) * inv_l2;
      } else {
        gxrow[r * dim + c] = -s * inv_l2;
      }
    }
  }
  *plsum += lsum;
}

template <typename T, typename IsaT, bool kGemm>
JB_INLINE void AdjointTask(const T* x, const T* l, const T* packed, const T* kmat, const T* ct,
                           T* gx, T* py, T* pcs, double* plsum, int64_t b, int64_t s, int64_t e,
                           int64_t m, int64_t dim) {
  constexpr int R = Shape<T, IsaT>::kR;
  // Column block: G[R][kJB] takes 16 KiB, so it stays in L1 through phase 2.
  constexpr int64_t kJB = std::max<int64_t>(kW<T>, 16384 / (R * sizeof(T)) / kW<T> * kW<T>);
  const int64_t mp = PaddedCols<T>(m);
  std::fill(py, py + mp * dim, T(0));
  std::fill(pcs, pcs + mp, T(0));
  *plsum = 0;
  const Pack<T> pk = PackOf(packed, b, m, dim, dim, /*row_major=*/true);
  const T inv_l2 = T(1) / (l[b] * l[b]);
  ForRowBlocks<R>(s, e, [&](auto rows, int64_t i) JB_LAMBDA_INLINE {
    constexpr int RR = decltype(rows)::value;
    AdjointBlock<T, IsaT, RR, kGemm, kJB>(x + i * dim, kmat + i * m, ct + i * m, gx + i * dim,
                                          pk, py, pcs, m, dim, inv_l2, plsum);
  });
}

// Adds the partials of tasks 1.. of batch b into task 0's, for rows [r0, r1) of
// the [dim + 1][mp] partial layout (contiguous rows: vectorizes).
template <typename T>
void AdjointReduce(T* parts, int64_t b, int64_t tasks, int64_t m, int64_t dim, int64_t r0,
                   int64_t r1) {
  const int64_t mp = PaddedCols<T>(m), part = mp * (dim + 1);
  T* first = parts + b * tasks * part;
  for (int64_t t = 1; t < tasks; ++t) {
    const T* src = first + t * part;
    for (int64_t i = r0 * mp; i < r1 * mp; ++i) first[i] += src[i];
  }
}

// gy and gl of batch b from the reduced partials (task 0's buffer).
template <typename T, bool kGemm>
void AdjointFinish(const T* l, const T* packed, const T* parts, const double* lsums, T* gy,
                   T* gl, int64_t b, int64_t tasks, int64_t m, int64_t dim) {
  const int64_t mp = PaddedCols<T>(m), part = mp * (dim + 1);
  const Pack<T> pk = PackOf(packed, b, m, dim, dim, /*row_major=*/true);
  const T inv_l2 = T(1) / (l[b] * l[b]);
  const T* py = parts + b * tasks * part;
  const T* pcs = py + mp * dim;
  double lsum = 0;
  for (int64_t t = 0; t < tasks; ++t) lsum += lsums[b * tasks + t];
  for (int64_t j = 0; j < m; ++j) {
    if constexpr (kGemm) lsum += static_cast<double>(pcs[j]) * pk.col[j];
    for (int64_t c = 0; c < dim; ++c) {
      T s = py[c * mp + j];
      if constexpr (kGemm) s -= pcs[j] * pk.panels[c * mp + j];
      gy[(b * m + j) * dim + c] = s * inv_l2;
    }
  }
  const double lb = l[b];
  gl[b] = static_cast<T>(lsum / (lb * lb * lb));
}

// ---- tangent
// dK_ij = K_ij (-(x_i - y_j).(tx_i - ty_j) / l^2 + |x_i - y_j|^2 tl / l^3).
// Direct form: panels hold [y; ty] (2 dim rows). Gemm form (centred x, y):
//   dK_ij / K_ij = rowterm_i + colterm_j + sum_c (x_ic - mu_c) A_jc + tx_ic B_jc,
//   A = ty / l^2 - 2 (tl / l^3) (y - mu),  B = (y - mu) / l^2,
//   rowterm = -(x - mu).tx / l^2 + |x - mu|^2 tl / l^3, colterm likewise with y, ty;
// the panels hold [A; B] and the column vector colterm.
// rowterm: [batch n] scratch (gemm form).
template <typename T, typename IsaT, bool kGemm>
JB_INLINE void TangentRows(const T* x, const T* tx, const T* l, const T* tl, const T* packed,
                           T* rowterm, const T* kmat, T* dk, int64_t n, int64_t m, int64_t dim,
                           int64_t begin, int64_t end) {
  using S = Shape<T, IsaT>;
  using V = typename S::V;
  constexpr int64_t W = kW<T>;
  constexpr int NV = S::kNV, L = S::kL;
  // Direct form: two accumulators per element, so half the rows.
  constexpr int R = kGemm ? S::kR : std::max(1, S::kR / 2);
  const int64_t np = PaddedCols<T>(m) / W;
  ForBatchPieces(begin, end, n, [&](int64_t b, int64_t s, int64_t e) JB_LAMBDA_INLINE {
    const Pack<T> pk = PackOf(packed, b, m, dim, 2 * dim);
    const T lb = l[b], inv_l2 = T(1) / (lb * lb), dl_l3 = tl[b] / (lb * lb * lb);
    if constexpr (kGemm)
      for (int64_t i = s; i < e; ++i) {
        T xt = T(0);
        for (int64_t c = 0; c < dim; ++c) xt += (x[i * dim + c] - pk.mu[c]) * tx[i * dim + c];
        rowterm[i] = -xt * inv_l2 + CentredNorm2(x + i * dim, pk.mu, dim) * dl_l3;
      }
    for (int64_t p = 0; p < np; ++p) {
      const int64_t wn = std::min(W, m - p * W);
      const T* P = pk.Panel(p);
      ForRowBlocks<R>(s, e, [&](auto rows, int64_t i) JB_LAMBDA_INLINE {
        constexpr int RR = decltype(rows)::value;
        const T* xrow = x + i * dim;
        const T* txrow = tx + i * dim;
        V acc[RR][NV];
        Zero<T, IsaT, RR>(acc);
        if constexpr (kGemm) {
          Accumulate<T, IsaT, RR, false, true>(xrow, dim, pk.mu, P, W, acc);
          Accumulate<T, IsaT, RR, false, false>(txrow, dim, nullptr, P + dim * W, W, acc);
          V col[NV];
          for (int v = 0; v < NV; ++v) S::Load(col[v], pk.col + p * W + v * L);
          for (int r = 0; r < RR; ++r) {
            V kv[NV], out[NV];
            LoadRow<T, IsaT>(kmat + (i + r) * m + p * W, wn, kv);
            for (int v = 0; v < NV; ++v) out[v] = kv[v] * (col[v] + rowterm[i + r] + acc[r][v]);
            StoreRow<T, IsaT>(dk + (i + r) * m + p * W, wn, out);
          }
        } else {
          V dot[RR][NV];
          Zero<T, IsaT, RR>(dot);
          for (int64_t c = 0; c < dim; ++c) {
            V yv[NV], tyv[NV];
            for (int v = 0; v < NV; ++v) {
              S::Load(yv[v], P + c * W + v * L);
              S::Load(tyv[v], P + (dim + c) * W + v * L);
            }
            for (int r = 0; r < RR; ++r) {
              const T a = xrow[r * dim + c], ta = txrow[r * dim + c];
              for (int v = 0; v < NV; ++v) {
                const V d = a - yv[v];
                acc[r][v] += d * d;
                dot[r][v] += d * (ta - tyv[v]);
              }
            }
          }
          for (int r = 0; r < RR; ++r) {
            V kv[NV], out[NV];
            LoadRow<T, IsaT>(kmat + (i + r) * m + p * W, wn, kv);
            for (int v = 0; v < NV; ++v)
              out[v] = kv[v] * (dl_l3 * acc[r][v] - inv_l2 * dot[r][v]);
            StoreRow<T, IsaT>(dk + (i + r) * m + p * W, wn, out);
          }
        }
      });
    }
  });
}

// Row tiles per parallel chunk: about 64K multiply-adds.
inline int64_t TileGrain(int64_t tile, int64_t m, int64_t dim) {
  return std::max<int64_t>(
      1, 65536 / std::max<int64_t>(1, tile * m * std::max<int64_t>(dim, 4)));
}

}  // namespace rbf

// Scratch (elements of T) for RbfForward.
template <typename T>
int64_t RbfForwardScratch(int64_t batch, int64_t n, int64_t m, int64_t dim) {
  return batch * rbf::PackSize<T>(m, dim, dim) + batch * n * (dim + 1);
}

template <typename T, typename ParallelFor>
void RbfForward(ParallelFor&& pf, const T* x, const T* y, const T* l, T* k, int64_t batch,
                int64_t n, int64_t m, int64_t dim, T* scratch) {
  const Isa isa = ActiveIsa();
  const bool gemm = rbf::UseGemm(dim);
  const int64_t mp = rbf::PaddedCols<T>(m);
  pf(batch, 1, [&](int64_t, int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      T* base = scratch + b * rbf::PackSize<T>(m, dim, dim);
      T *yn = base + mp * dim, *mu = yn + mp;
      rbf::Centre(y + b * m * dim, m, dim, gemm, mu);
      rbf::PackRows(y + b * m * dim, mu, m, dim, dim, 0, base);
      for (int64_t j = 0; j < mp; ++j) {  // |y_j - mu|^2 from the packed (rounded) values
        T s = T(0);
        for (int64_t c = 0; c < dim; ++c) {
          const T v = base[(j / rbf::kW<T> * dim + c) * rbf::kW<T> + j % rbf::kW<T>];
          s += v * v;
        }
        yn[j] = s;
      }
    }
  });
  const rbf::RowTiles tiles(n, rbf::TileRows<T>(isa));
  pf(tiles.Count(batch), rbf::TileGrain(tiles.tile, m, dim), [&](int64_t, int64_t t0,
                                                                  int64_t t1) {
    const int64_t s = tiles.Row(t0), e = tiles.Row(t1);
    DispatchIsa(isa, [&](auto tag) {
      using IsaT = decltype(tag);
      T* xn = scratch + batch * rbf::PackSize<T>(m, dim, dim);
      T* xc = xn + batch * n;
      if (gemm)
        rbf::ForwardRows<T, IsaT, true>(x, l, scratch, xc, xn, k, n, m, dim, s, e);
      else
        rbf::ForwardRows<T, IsaT, false>(x, l, scratch, xc, xn, k, n, m, dim, s, e);
    });
  });
}

// Work split of RbfAdjoint: `tasks` row ranges per batch (each with partial sums for
// gy, combined at the end), enough for `parallelism` threads; scratch sizes in
// elements of T and of double.
struct RbfAdjointPlan {
  int64_t tasks = 1, scratch = 0, lsums = 0;
};

template <typename T>
RbfAdjointPlan RbfAdjointPlanFor(int64_t batch, int64_t n, int64_t m, int64_t dim,
                                 int64_t parallelism) {
  RbfAdjointPlan plan;
  const int64_t want = 4 * std::max<int64_t>(parallelism, 1);
  const int64_t mp = rbf::PaddedCols<T>(m), part = mp * (dim + 1);
  if (batch < want) {
    // Split rows, but keep >= 16 rows per task (each task's partials cost O(m dim)
    // to clear and add up) and the extra partials under 2^24 elements in all.
    plan.tasks = std::min((want + batch - 1) / std::max<int64_t>(batch, 1), (n + 15) / 16);
    plan.tasks = std::min(plan.tasks, (int64_t{1} << 24) / std::max<int64_t>(batch * part, 1));
    plan.tasks = std::max<int64_t>(plan.tasks, 1);
  }
  plan.scratch = batch * rbf::PackSize<T>(m, dim, dim) + batch * plan.tasks * part;
  plan.lsums = batch * plan.tasks;
  return plan;
}

// gx: [batch, n, dim], gy: [batch, m, dim], gl: [batch]; scratch/lsums sized by `plan`.
template <typename T, typename ParallelFor>
void RbfAdjoint(ParallelFor&& pf, const RbfAdjointPlan& plan, const T* x, const T* y,
                const T* l, const T* kmat, const T* ct, T* gx, T* gy, T* gl, int64_t batch,
                int64_t n, int64_t m, int64_t dim, T* scratch, double* lsums) {
  const Isa isa = ActiveIsa();
  const bool gemm = rbf::UseGemm(dim);
  const int64_t mp = rbf::PaddedCols<T>(m), tasks = plan.tasks;
  const int64_t part = mp * (dim + 1);
  T* packed = scratch;
  T* parts = scratch + batch * rbf::PackSize<T>(m, dim, dim);
  pf(batch, 1, [&](int64_t, int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      T* base = packed + b * rbf::PackSize<T>(m, dim, dim);
      T *yn = base + mp * dim, *mu = yn + mp;
      rbf::Centre(y + b * m * dim, m, dim, gemm, mu);
      rbf::PackRows(y + b * m * dim, mu, m, dim, dim, 0, base, /*row_major=*/true);
      for (int64_t j = 0; j < mp; ++j) yn[j] = T(0);
      for (int64_t c = 0; c < dim; ++c)
        for (int64_t j = 0; j < mp; ++j) yn[j] += base[c * mp + j] * base[c * mp + j];
    }
  });
  const int64_t tile = rbf::TileRows<T>(isa);  // whole register tiles per task
  const int64_t rows_per_task = ((n + tasks - 1) / tasks + tile - 1) / tile * tile;
  pf(batch * tasks, 1, [&](int64_t, int64_t t0, int64_t t1) {
    DispatchIsa(isa, [&](auto tag) {
      using IsaT = decltype(tag);
      for (int64_t t = t0; t < t1; ++t) {
        const int64_t b = t / tasks, q = t % tasks;
        const int64_t s = b * n + std::min(n, q * rows_per_task);
        const int64_t e = b * n + std::min(n, (q + 1) * rows_per_task);
        T* py = parts + t * part;
        if (gemm)
          rbf::AdjointTask<T, IsaT, true>(x, l, packed, kmat, ct, gx, py, py + mp * dim,
                                          lsums + t, b, s, e, m, dim);
        else
          rbf::AdjointTask<T, IsaT, false>(x, l, packed, kmat, ct, gx, py, py + mp * dim,
                                           lsums + t, b, s, e, m, dim);
      }
    });
  });
  if (tasks > 1) {  // rows of the partials, in parallel: (batch, row) items
    pf(batch * (dim + 1), std::max<int64_t>(1, 16384 / std::max<int64_t>(mp * tasks, 1)),
       [&](int64_t, int64_t i0, int64_t i1) {
         for (int64_t i = i0; i < i1; ++i)
           rbf::AdjointReduce(parts, i / (dim + 1), tasks, m, dim, i % (dim + 1),
                              i % (dim + 1) + 1);
       });
  }
  pf(batch, 1, [&](int64_t, int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      if (gemm)
        rbf::AdjointFinish<T, true>(l, packed, parts, lsums, gy, gl, b, tasks, m, dim);
      else
        rbf::AdjointFinish<T, false>(l, packed, parts, lsums, gy, gl, b, tasks, m, dim);
    }
  });
}

// Scratch (elements of T) for RbfTangent.
template <typename T>
int64_t RbfTangentScratch(int64_t batch, int64_t n, int64_t m, int64_t dim) {
  return batch * rbf::PackSize<T>(m, dim, 2 * dim) + batch * n;
}

template <typename T, typename ParallelFor>
void RbfTangent(ParallelFor&& pf, const T* x, const T* y, const T* l, const T* kmat,
                const T* tx, const T* ty, const T* tl, T* dk, int64_t batch, int64_t n,
                int64_t m, int64_t dim, T* scratch) {
  const Isa isa = ActiveIsa();
  const bool gemm = rbf::UseGemm(dim);
  const int64_t mp = rbf::PaddedCols<T>(m), W = rbf::kW<T>;
  pf(batch, 1, [&](int64_t, int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      T* base = scratch + b * rbf::PackSize<T>(m, dim, 2 * dim);
      T *col = base + mp * 2 * dim, *mu = col + mp;
      const T* yb = y + b * m * dim;
      const T* tyb = ty + b * m * dim;
      rbf::Centre(yb, m, dim, gemm, mu);
      rbf::PackRows(yb, mu, m, dim, 2 * dim, 0, base);  // y - mu
      rbf::PackRows(tyb, static_cast<const T*>(nullptr), m, dim, 2 * dim, dim, base);  // ty
      const T lb = l[b], inv_l2 = T(1) / (lb * lb), dl_l3 = tl[b] / (lb * lb * lb);
      for (int64_t j = 0; j < mp; ++j) {
        T* ycol = base + (j / W) * 2 * dim * W + j % W;  // ycol[c * W]: (y - mu)_jc
        T yt = T(0), yn = T(0);
        for (int64_t c = 0; c < dim; ++c) {
          const T a = ycol[c * W], t = ycol[(dim + c) * W];
          yt += a * t;
          yn += a * a;
          if (gemm) {  // [y - mu; ty] -> [A; B], see rbf::TangentRows
            ycol[c * W] = t * inv_l2 - T(2) * dl_l3 * a;
            ycol[(dim + c) * W] = a * inv_l2;
          }
        }
        col[j] = -yt * inv_l2 + yn * dl_l3;
      }
    }
  });
  const rbf::RowTiles tiles(n, rbf::TileRows<T>(isa));
  pf(tiles.Count(batch), rbf::TileGrain(tiles.tile, m, 2 * dim), [&](int64_t, int64_t t0,
                                                                      int64_t t1) {
    const int64_t s = tiles.Row(t0), e = tiles.Row(t1);
    DispatchIsa(isa, [&](auto tag) {
      using IsaT = decltype(tag);
      T* rowterm = scratch + batch * rbf::PackSize<T>(m, dim, 2 * dim);
      if (gemm)
        rbf::TangentRows<T, IsaT, true>(x, tx, l, tl, scratch, rowterm, kmat, dk, n, m, dim, s,
                                        e);
      else
        rbf::TangentRows<T, IsaT, false>(x, tx, l, tl, scratch, rowterm, kmat, dk, n, m, dim, s,
                                         e);
    });
  });
}

}  // namespace jaxbridge::kernels

#endif  // JAXBRIDGE_KERNELS_CPU_KERNELS_H_
