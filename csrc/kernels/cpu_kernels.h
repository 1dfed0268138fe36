// Built-in kernels, CPU math only: no XLA headers, no allocation, no exceptions.
// Every function works on one contiguous index range so the FFI glue can split the
// work over a thread pool, and the AddressSanitizer driver can call it directly.
//
// Layouts (row-major, leading batch dims flattened into `batch`):
//   softplus:  x, y: [size]
//   tridiag:   dl, d, du, b, x: [batch, n]; dl[.,0] and du[.,n-1] are ignored
//              (treated as 0), like jax.lax.linalg.tridiagonal_solve
//   rbf:       x: [batch, n, dim], y: [batch, m, dim], l: [batch], K: [batch, n, m]
#ifndef JAXBRIDGE_KERNELS_CPU_KERNELS_H_
#define JAXBRIDGE_KERNELS_CPU_KERNELS_H_

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace jaxbridge::kernels {

// ------------------------------------------------------------------ softplus
// softplus_beta(x) = log(1 + exp(beta x)) / beta, computed as
// (max(z, 0) + log1p(exp(-|z|))) / beta with z = beta x: finite for any finite x.
template <typename T>
inline T Softplus(T x, T beta) {
  T z = beta * x;
  return (std::max(z, T(0)) + std::log1p(std::exp(-std::abs(z)))) / beta;
}

template <typename T>
inline T Sigmoid(T z) {
  if (z >= T(0)) return T(1) / (T(1) + std::exp(-z));
  T e = std::exp(z);
  return e / (T(1) + e);
}

template <typename T>
void SoftplusForward(const T* x, T* y, int64_t begin, int64_t end, T beta) {
  for (int64_t i = begin; i < end; ++i) y[i] = Softplus(x[i], beta);
}

// Adjoint (and, being diagonal, also the tangent): out = v * sigmoid(beta x).
template <typename T>
void SoftplusDerivative(const T* x, const T* v, T* out, int64_t begin, int64_t end, T beta) {
  for (int64_t i = begin; i < end; ++i) out[i] = v[i] * Sigmoid(beta * x[i]);
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
// K[b,i,j] = exp(-|x[b,i] - y[b,j]|^2 / (2 l[b]^2)) for rows r = b*n + i in [begin, end).
template <typename T>
void RbfForward(const T* x, const T* y, const T* l, T* k, int64_t n, int64_t m, int64_t dim,
                int64_t begin, int64_t end) {
  for (int64_t r = begin; r < end; ++r) {
    const int64_t b = r / n;
    const T scale = T(-0.5) / (l[b] * l[b]);
    const T* xi = x + r * dim;
    const T* yb = y + b * m * dim;
    T* kr = k + r * m;
    for (int64_t j = 0; j < m; ++j) {
      const T* yj = yb + j * dim;
      T s = T(0);
      for (int64_t c = 0; c < dim; ++c) {
        T diff = xi[c] - yj[c];
        s += diff * diff;
      }
      kr[j] = std::exp(s * scale);
    }
  }
}

// Adjoint, x part, rows r = b*n + i in [begin, end): with G = ct * K,
//   gx[b,i] = -(1/l^2) sum_j G_ij (x_i - y_j),   lpart[r] = sum_j G_ij |x_i - y_j|^2
// (gl[b] = sum_i lpart[b*n+i] / l^3, reduced by the caller).
template <typename T>
void RbfAdjointX(const T* x, const T* y, const T* l, const T* k, const T* ct, T* gx, T* lpart,
                 int64_t n, int64_t m, int64_t dim, int64_t begin, int64_t end) {
  for (int64_t r = begin; r < end; ++r) {
    const int64_t b = r / n;
    const T inv_l2 = T(1) / (l[b] * l[b]);
    const T* xi = x + r * dim;
    const T* yb = y + b * m * dim;
    T* gxi = gx + r * dim;
    for (int64_t c = 0; c < dim; ++c) gxi[c] = T(0);
    T lsum = T(0);
    for (int64_t j = 0; j < m; ++j) {
      const T g = ct[r * m + j] * k[r * m + j];
      if (g == T(0)) continue;
      const T* yj = yb + j * dim;
      T s = T(0);
      for (int64_t c = 0; c < dim; ++c) {
        T diff = xi[c] - yj[c];
        s += diff * diff;
        gxi[c] -= g * diff;
      }
      lsum += g * s;
    }
    for (int64_t c = 0; c < dim; ++c) gxi[c] *= inv_l2;
    lpart[r] = lsum;
  }
}

// Adjoint, y part, rows q = b*m + j in [begin, end): gy[b,j] = (1/l^2) sum_i G_ij (x_i - y_j).
template <typename T>
void RbfAdjointY(const T* x, const T* y, const T* l, const T* k, const T* ct, T* gy,
                 int64_t n, int64_t m, int64_t dim, int64_t begin, int64_t end) {
  for (int64_t q = begin; q < end; ++q) {
    const int64_t b = q / m, j = q % m;
    const T inv_l2 = T(1) / (l[b] * l[b]);
    const T* yj = y + q * dim;
    T* gyj = gy + q * dim;
    for (int64_t c = 0; c < dim; ++c) gyj[c] = T(0);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t idx = (b * n + i) * m + j;
      const T g = ct[idx] * k[idx];
      if (g == T(0)) continue;
      const T* xi = x + (b * n + i) * dim;
      for (int64_t c = 0; c < dim; ++c) gyj[c] += g * (xi[c] - yj[c]);
    }
    for (int64_t c = 0; c < dim; ++c) gyj[c] *= inv_l2;
  }
}

// Tangent, rows r = b*n + i in [begin, end):
//   dK_ij = K_ij ( -(x_i - y_j).(dx_i - dy_j) / l^2 + |x_i - y_j|^2 dl / l^3 ).
template <typename T>
void RbfTangent(const T* x, const T* y, const T* l, const T* k, const T* tx, const T* ty,
                const T* tl, T* dk, int64_t n, int64_t m, int64_t dim, int64_t begin,
                int64_t end) {
  for (int64_t r = begin; r < end; ++r) {
    const int64_t b = r / n;
    const T lb = l[b];
    const T inv_l2 = T(1) / (lb * lb);
    const T dl_l3 = tl[b] / (lb * lb * lb);
    const T* xi = x + r * dim;
    const T* txi = tx + r * dim;
    for (int64_t j = 0; j < m; ++j) {
      const T* yj = y + (b * m + j) * dim;
      const T* tyj = ty + (b * m + j) * dim;
      T s = T(0), dot = T(0);
      for (int64_t c = 0; c < dim; ++c) {
        T diff = xi[c] - yj[c];
        s += diff * diff;
        dot += diff * (txi[c] - tyj[c]);
      }
      dk[r * m + j] = k[r * m + j] * (-dot * inv_l2 + s * dl_l3);
    }
  }
}

}  // namespace jaxbridge::kernels

#endif  // JAXBRIDGE_KERNELS_CPU_KERNELS_H_
