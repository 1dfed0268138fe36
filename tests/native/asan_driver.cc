// AddressSanitizer/UBSan driver for the pure-math CPU kernels (no XLA needed).
// Built and run by benchmarks/asan_kernels.sh. Every buffer is an exact-size heap
// allocation, so any out-of-bounds read or write is reported by ASan. Checks:
// residuals of the tridiagonal solve, the adjoint/tangent dot-product identity
// <ct, J t> == <J^T ct, t> for all three kernels, softplus/sigmoid against long
// double references (ulp errors, special values), and the blocked RBF kernels
// against plain loops. Every check runs at each instruction set the CPU supports
// (cpu_isa.h), with sizes that are not multiples of the vector or panel width.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <memory>
#include <random>
#include <vector>

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
const char* isa_name = "";
void Expect(bool ok, const char* what, double a, double b) {
  if (!ok) {
    ++failures;
    if (failures < 50) std::printf("FAIL [%s] %s: %.17g vs %.17g\n", isa_name, what, a, b);
  }
}

// A serial stand-in for jaxbridge::ParallelFor that still splits the range into a
// few uneven chunks, so the kernels' chunk boundaries get exercised.
struct SerialFor {
  template <typename Body>
  void operator()(int64_t count, int64_t grain, Body&& body) const {
    int64_t chunk = 0;
    for (int64_t b = 0; b < count; ++chunk) {
      const int64_t e = std::min(count, b + std::max<int64_t>(grain, 1 + (count - b) / 3));
      body(chunk, b, e);
      b = e;
    }
  }
};

// Error of `got` in units in the last place of T at the reference value.
template <typename T>
double Ulps(T got, long double ref) {
  if (std::isnan(double(ref))) return std::isnan(got) ? 0 : 1e30;
  if (std::isinf(double(ref))) return double(got) == double(ref) ? 0 : 1e30;
  const T r = static_cast<T>(ref);
  T ulp = std::nextafter(std::fabs(r), std::numeric_limits<T>::infinity()) - std::fabs(r);
  ulp = std::max(ulp, std::numeric_limits<T>::denorm_min());
  return double(std::fabs(static_cast<long double>(got) - ref) / ulp);
}

template <typename T>
void Softplus(int64_t n, double lo, double hi, double max_ulps) {
  auto x = Rand<T>(n, lo, hi), y = Buf<T>(n), ct = Rand<T>(n), g = Buf<T>(n);
  for (T beta : {T(1), T(2.5)}) {
    k::SoftplusForward<T>(x.get(), y.get(), 0, n, beta);
    k::SoftplusDerivative<T>(x.get(), ct.get(), g.get(), 0, n, beta);
    for (int64_t i = 0; i < n; ++i) {
      const long double z = static_cast<long double>(beta * x[i]);  // the kernel rounds beta x too
      const long double sp = (std::max(z, 0.0L) + std::log1p(std::exp(-std::fabs(z)))) /
                             static_cast<long double>(beta);
      const long double sig = 1.0L / (1.0L + std::exp(-z));
      Expect(std::isfinite(double(y[i])) && std::isfinite(double(g[i])), "softplus finite", y[i],
             g[i]);
      Expect(Ulps(y[i], sp) <= max_ulps, "softplus ulps", double(y[i]), double(sp));
      Expect(Ulps(g[i], ct[i] * sig) <= max_ulps + 1, "sigmoid ulps", double(g[i]),
             double(ct[i] * sig));
    }
  }
}

template <typename T>
void SoftplusSpecial() {
  const T inf = std::numeric_limits<T>::infinity(), nan = std::numeric_limits<T>::quiet_NaN();
  const T big = std::numeric_limits<T>::max();
  const T x[] = {-inf, inf, nan, T(0), T(-0.0), T(1e4), T(-1e4), big, -big, T(-100), T(-20)};
  const int64_t n = sizeof(x) / sizeof(x[0]);
  auto y = Buf<T>(n), g = Buf<T>(n), ones = Buf<T>(n);
  for (int64_t i = 0; i < n; ++i) ones[i] = T(1);
  k::SoftplusForward<T>(x, y.get(), 0, n, T(1));
  k::SoftplusDerivative<T>(x, ones.get(), g.get(), 0, n, T(1));
  Expect(y[0] == 0 && g[0] == 0, "softplus(-inf)", y[0], g[0]);
  Expect(y[1] == inf && g[1] == 1, "softplus(inf)", y[1], g[1]);
  Expect(std::isnan(y[2]) && std::isnan(g[2]), "softplus(nan)", y[2], g[2]);
  Expect(y[5] == T(1e4) && g[5] == 1, "softplus(1e4)", y[5], g[5]);
  Expect(y[6] == 0 && g[6] == 0, "softplus(-1e4)", y[6], g[6]);
  Expect(y[7] == big && y[8] == 0, "softplus(+-max)", y[7], y[8]);
  Expect(y[9] > 0 && y[9] < T(1e-40), "softplus(-100) tiny", y[9], 0);
  Expect(std::fabs(y[10] - T(2.0611536e-9)) < T(1e-15), "softplus(-20)", y[10], 2.0611536e-9);
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

// ---- RBF: plain-loop references in long double (the pre-blocking kernels).
struct RbfRef {
  std::vector<long double> k, dk, gx, gy, gl;
  long double gl_scale = 0;  // sum |G| d2 / l^3: gl is a sum of terms of both signs
};
template <typename T>
RbfRef RbfReference(const T* x, const T* y, const T* l, const T* tx, const T* ty, const T* tl,
                    const T* ct, int64_t batch, int64_t n, int64_t m, int64_t dim) {
  RbfRef r;
  r.k.assign(batch * n * m, 0);
  r.dk.assign(batch * n * m, 0);
  r.gx.assign(batch * n * dim, 0);
  r.gy.assign(batch * m * dim, 0);
  r.gl.assign(batch, 0);
  for (int64_t b = 0; b < batch; ++b) {
    const long double lb = l[b];
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < m; ++j) {
        const T* xi = x + (b * n + i) * dim;
        const T* yj = y + (b * m + j) * dim;
        long double s = 0, dot = 0;
        for (int64_t c = 0; c < dim; ++c) {
          const long double d = (long double)xi[c] - yj[c];
          s += d * d;
          dot += d * ((long double)tx[(b * n + i) * dim + c] - ty[(b * m + j) * dim + c]);
        }
        const int64_t o = (b * n + i) * m + j;
        const long double kij = std::exp(-s / (2 * lb * lb));
        r.k[o] = kij;
        r.dk[o] = kij * (-dot / (lb * lb) + s * tl[b] / (lb * lb * lb));
        const long double g = ct[o] * kij;
        for (int64_t c = 0; c < dim; ++c) {
          const long double d = (long double)xi[c] - yj[c];
          r.gx[(b * n + i) * dim + c] -= g * d / (lb * lb);
          r.gy[(b * m + j) * dim + c] += g * d / (lb * lb);
        }
        r.gl[b] += g * s / (lb * lb * lb);
        r.gl_scale += std::fabs(g) * s / (lb * lb * lb);
      }
  }
  return r;
}

// max |got - ref| / (atol + max |ref|) over an array.
template <typename T>
double RelErr(const T* got, const std::vector<long double>& ref) {
  long double scale = 0, err = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    scale = std::max(scale, std::fabs(ref[i]));
    err = std::max(err, std::fabs(got[i] - ref[i]));
  }
  return double(err / (scale + 1e-30L));
}

template <typename T>
void Rbf(int64_t batch, int64_t n, int64_t m, int64_t dim, double tol, double offset = 0) {
  const int64_t nx = batch * n * dim, ny = batch * m * dim, nk = batch * n * m;
  auto x = Rand<T>(nx, offset - 1, offset + 1), y = Rand<T>(ny, offset - 1, offset + 1);
  auto l = Rand<T>(batch, 0.5, 2);
  if (nx > 0 && ny > 0) y[0] = x[0];  // an identical pair of coordinates
  auto kk = Buf<T>(nk);
  SerialFor pf;
  // Scratch poisoned with NaN: the FFI glue does not zero it, so reading a value
  // the kernel did not write first shows up in the comparisons below.
  const T poison = std::numeric_limits<T>::quiet_NaN();
  std::vector<T> scratch(k::RbfForwardScratch<T>(batch, n, m, dim), poison);
  k::RbfForward<T>(pf, x.get(), y.get(), l.get(), kk.get(), batch, n, m, dim, scratch.data());
  auto tx = Rand<T>(nx), ty = Rand<T>(ny), tl = Rand<T>(batch);
  auto ct = Rand<T>(nk), dk = Buf<T>(nk);
  auto gx = Buf<T>(nx), gy = Buf<T>(ny), gl = Buf<T>(batch);
  std::vector<T> tscratch(k::RbfTangentScratch<T>(batch, n, m, dim), poison);
  k::RbfTangent<T>(pf, x.get(), y.get(), l.get(), kk.get(), tx.get(), ty.get(), tl.get(),
                   dk.get(), batch, n, m, dim, tscratch.data());
  for (int64_t par : {1, 3}) {
    const auto plan = k::RbfAdjointPlanFor<T>(batch, n, m, dim, par);
    std::vector<T> ascratch(plan.scratch, poison);
    std::vector<double> lsums(plan.lsums, std::numeric_limits<double>::quiet_NaN());
    k::RbfAdjoint<T>(pf, plan, x.get(), y.get(), l.get(), kk.get(), ct.get(), gx.get(), gy.get(),
                     gl.get(), batch, n, m, dim, ascratch.data(), lsums.data());
  }
  const RbfRef ref = RbfReference<T>(x.get(), y.get(), l.get(), tx.get(), ty.get(), tl.get(),
                                     ct.get(), batch, n, m, dim);
  // Relative to the largest entry; the gemm form (dim > 8) loses ~eps |x - mu|^2 to
  // cancellation (~1e-6 in float32 at dim 64, within tol).
  const double t = tol;
  Expect(RelErr(kk.get(), ref.k) <= t, "rbf K vs reference", RelErr(kk.get(), ref.k), t);
  Expect(RelErr(dk.get(), ref.dk) <= t, "rbf tangent vs reference", RelErr(dk.get(), ref.dk), t);
  Expect(RelErr(gx.get(), ref.gx) <= t, "rbf gx vs reference", RelErr(gx.get(), ref.gx), t);
  Expect(RelErr(gy.get(), ref.gy) <= t, "rbf gy vs reference", RelErr(gy.get(), ref.gy), t);
  long double gl_err = 0;
  for (int64_t b = 0; b < batch; ++b) gl_err = std::max(gl_err, std::fabs(gl[b] - ref.gl[b]));
  Expect(gl_err <= t * (ref.gl_scale + 1e-30L), "rbf gl vs reference", double(gl_err),
         double(t * ref.gl_scale));
  for (int64_t i = 0; i < nk; ++i)
    Expect(kk[i] >= 0 && kk[i] <= 1, "rbf 0 <= K <= 1", kk[i], 0);
  double lhs = Dot(ct.get(), dk.get(), nk);
  double rhs = Dot(gx.get(), tx.get(), nx) + Dot(gy.get(), ty.get(), ny) +
               Dot(gl.get(), tl.get(), batch);
  Expect(std::abs(lhs - rhs) <= t * (1 + std::abs(lhs)), "rbf <ct,Jt> == <J^T ct,t>", lhs, rhs);
}

void RunAll() {
  for (int64_t n : {0, 1, 2, 3, 17, 1000}) {
    Softplus<float>(n, -1e4, 1e4, 3);
    Softplus<double>(n, -1e4, 1e4, 3);
    Softplus<float>(n, -30, 30, 3);
    Softplus<double>(n, -50, 50, 3);
  }
  Softplus<float>(4099, -110, 5, 3);  // down to the subnormal range
  Softplus<double>(4099, -760, 5, 3);
  SoftplusSpecial<float>();
  SoftplusSpecial<double>();
  for (int64_t batch : {1, 3})
    for (int64_t n : {1, 2, 5, 64}) {
      Tridiag<float>(batch, n, 1e-4);
      Tridiag<double>(batch, n, 1e-12);
    }
  // Sizes around the row tile (1..8) and the panel width (32 floats / 16 doubles),
  // both distance forms (dim <= 8 direct, larger gemm), empty dimensions.
  for (int64_t batch : {1, 2})
    for (int64_t n : {1, 4, 9, 17})
      for (int64_t m : {1, 3, 16, 33})
        for (int64_t dim : {1, 5, 9, 64}) {
          Rbf<float>(batch, n, m, dim, 2e-5);
          Rbf<double>(batch, n, m, dim, 1e-12);
        }
  for (int64_t dim : {0, 3, 12}) {
    Rbf<float>(2, 0, 5, dim, 2e-5);
    Rbf<float>(2, 5, 0, dim, 2e-5);
    Rbf<double>(1, 3, 4, dim, 1e-12);
  }
  Rbf<float>(1, 70, 200, 3, 2e-5);   // several row tiles and column blocks
  Rbf<double>(1, 40, 600, 20, 1e-12);
  Rbf<float>(1, 30, 40, 3, 2e-5, 100.0);  // far from the origin (cancellation)
  Rbf<float>(1, 30, 40, 16, 2e-5, 100.0);
}
}  // namespace

int main() {
  const k::Isa best = k::DetectedIsa();
  for (int level = 0; level <= static_cast<int>(best); ++level) {
    const auto isa = static_cast<k::Isa>(level);
    k::SetIsaLimit(isa);
    isa_name = k::IsaName(isa);
    const int before = failures;
    RunAll();
    std::printf("%-8s %s\n", isa_name, failures == before ? "OK" : "FAILED");
  }
  std::printf("%s (%d failures)\n", failures ? "FAILED" : "OK", failures);
  return failures ? 1 : 0;
}
