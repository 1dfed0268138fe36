// AddressSanitizer/UBSan driver for the pure-math CPU kernels (no XLA needed).
// Built and run by benchmarks/asan_kernels.sh. Every buffer is an exact-size heap
// allocation, so any out-of-bounds read or write is reported by ASan. Checks:
// residuals of the tridiagonal solve, the adjoint/tangent dot-product identity
// <ct, J t> == <J^T ct, t> for all three kernels, and finiteness of softplus.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <random>

#include "cpu_kernels.h"

namespace k = jaxbridge::kernels;

namespace {
std::mt19937_64 gen(42);

template <typename T>
std::unique_ptr<T[]> Rand(int64_t n, double lo = -1, double hi = 1) {
  std::uniform_real_distribution<double> u(lo, hi);
  std::unique_ptr<T[]> p(new T[n > 0 ? n : 1]);
  for (int64_t i = 0; i < n; ++i) p[i] = static_cast<T>(u(gen));
  return p;
}
template <typename T>
std::unique_ptr<T[]> Buf(int64_t n) {
  return std::unique_ptr<T[]>(new T[n > 0 ? n : 1]());
}
template <typename T>
double Dot(const T* a, const T* b, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += double(a[i]) * double(b[i]);
  return s;
}
int failures = 0;
void Expect(bool ok, const char* what, double a, double b) {
  if (!ok) {
    ++failures;
    std::printf("FAIL %s: %.17g vs %.17g\n", what, a, b);
  }
}

template <typename T>
void Softplus(int64_t n, double tol) {
  auto x = Rand<T>(n, -1e4, 1e4), y = Buf<T>(n), ct = Rand<T>(n), g = Buf<T>(n);
  k::SoftplusForward<T>(x.get(), y.get(), 0, n, T(1));
  k::SoftplusDerivative<T>(x.get(), ct.get(), g.get(), 0, n, T(1));
  for (int64_t i = 0; i < n; ++i) {
    Expect(std::isfinite(double(y[i])) && std::isfinite(double(g[i])), "softplus finite", y[i],
           g[i]);
    double ref = std::max(double(x[i]), 0.0) + std::log1p(std::exp(-std::abs(double(x[i]))));
    Expect(std::abs(y[i] - ref) <= tol * (1 + std::abs(ref)), "softplus value", y[i], ref);
  }
}

template <typename T>
void Tridiag(int64_t batch, int64_t n, double tol) {
  const int64_t N = batch * n;
  auto dl = Rand<T>(N), du = Rand<T>(N), d = Rand<T>(N, 3, 4), b = Rand<T>(N);
  auto x = Buf<T>(N), scratch = Buf<T>(n);
  k::TridiagSolve<T>(dl.get(), d.get(), du.get(), b.get(), x.get(), n, 0, batch, scratch.get());
  for (int64_t s = 0; s < batch; ++s) {
    for (int64_t i = 0; i < n; ++i) {
      const int64_t o = s * n + i;
      double r = double(d[o]) * x[o];
      if (i > 0) r += double(dl[o]) * x[o - 1];
      if (i + 1 < n) r += double(du[o]) * x[o + 1];
      Expect(std::abs(r - b[o]) <= tol, "tridiag residual", r, b[o]);
    }
  }
  // Dot-product test of tangent vs adjoint.
  auto t0 = Rand<T>(N), t1 = Rand<T>(N), t2 = Rand<T>(N), t3 = Rand<T>(N), ct = Rand<T>(N);
  auto dx = Buf<T>(N), g0 = Buf<T>(N), g1 = Buf<T>(N), g2 = Buf<T>(N), g3 = Buf<T>(N);
  k::TridiagTangent<T>(dl.get(), d.get(), du.get(), x.get(), t0.get(), t1.get(), t2.get(),
                       t3.get(), dx.get(), n, 0, batch, scratch.get());
  k::TridiagAdjoint<T>(dl.get(), d.get(), du.get(), x.get(), ct.get(), g0.get(), g1.get(),
                       g2.get(), g3.get(), n, 0, batch);
  double lhs = Dot(ct.get(), dx.get(), N);
  double rhs = Dot(g0.get(), t0.get(), N) + Dot(g1.get(), t1.get(), N) +
               Dot(g2.get(), t2.get(), N) + Dot(g3.get(), t3.get(), N);
  Expect(std::abs(lhs - rhs) <= tol * (1 + std::abs(lhs)), "tridiag <ct,Jt> == <J^T ct,t>", lhs,
         rhs);
}

template <typename T>
void Rbf(int64_t batch, int64_t n, int64_t m, int64_t dim, double tol) {
  auto x = Rand<T>(batch * n * dim), y = Rand<T>(batch * m * dim), l = Rand<T>(batch, 0.5, 2);
  auto kk = Buf<T>(batch * n * m);
  k::RbfForward<T>(x.get(), y.get(), l.get(), kk.get(), n, m, dim, 0, batch * n);
  auto tx = Rand<T>(batch * n * dim), ty = Rand<T>(batch * m * dim), tl = Rand<T>(batch);
  auto ct = Rand<T>(batch * n * m), dk = Buf<T>(batch * n * m);
  auto gx = Buf<T>(batch * n * dim), gy = Buf<T>(batch * m * dim), lpart = Buf<T>(batch * n);
  k::RbfTangent<T>(x.get(), y.get(), l.get(), kk.get(), tx.get(), ty.get(), tl.get(), dk.get(),
                   n, m, dim, 0, batch * n);
  k::RbfAdjointX<T>(x.get(), y.get(), l.get(), kk.get(), ct.get(), gx.get(), lpart.get(), n, m,
                    dim, 0, batch * n);
  k::RbfAdjointY<T>(x.get(), y.get(), l.get(), kk.get(), ct.get(), gy.get(), n, m, dim, 0,
                    batch * m);
  double lhs = Dot(ct.get(), dk.get(), batch * n * m);
  double rhs = Dot(gx.get(), tx.get(), batch * n * dim) + Dot(gy.get(), ty.get(), batch * m * dim);
  for (int64_t b = 0; b < batch; ++b) {
    double s = 0;
    for (int64_t i = 0; i < n; ++i) s += lpart[b * n + i];
    rhs += s / (double(l[b]) * l[b] * l[b]) * tl[b];
  }
  Expect(std::abs(lhs - rhs) <= tol * (1 + std::abs(lhs)), "rbf <ct,Jt> == <J^T ct,t>", lhs, rhs);
}
}  // namespace

int main() {
  for (int64_t n : {0, 1, 2, 3, 17, 1000}) {
    Softplus<float>(n, 1e-6);
    Softplus<double>(n, 1e-14);
  }
  for (int64_t batch : {1, 3})
    for (int64_t n : {1, 2, 5, 64}) {
      Tridiag<float>(batch, n, 1e-4);
      Tridiag<double>(batch, n, 1e-12);
    }
  for (int64_t batch : {1, 2})
    for (int64_t n : {1, 4})
      for (int64_t m : {1, 3})
        for (int64_t dim : {1, 5}) {
          Rbf<float>(batch, n, m, dim, 1e-4);
          Rbf<double>(batch, n, m, dim, 1e-12);
        }
  std::printf("%s (%d failures)\n", failures ? "FAILED" : "OK", failures);
  return failures ? 1 : 0;
}
