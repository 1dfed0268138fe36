// Branch-free scalar math that compilers auto-vectorize (no libm calls, no branches:
// every `c ? a : b` here becomes a vector blend; GCC needs -fno-trapping-math for
// that, see csrc/builtin/CMakeLists.txt). Used by the CPU kernels in cpu_kernels.h; no
// XLA headers. Algorithms: Cephes-style exp (Cody-Waite range reduction +
// polynomial, 2^n built from exponent bits) and fdlibm's log1p (s = f/(2+f) with a
// minimax polynomial in s^2). Accuracy over the whole input range, float32 and
// float64: exp and log1p < 1 ulp, softplus < 2 ulp, sigmoid < 3 ulp (checked by
// benchmarks/asan_kernels.sh against long double).
#ifndef JAXBRIDGE_KERNELS_CPU_MATH_H_
#define JAXBRIDGE_KERNELS_CPU_MATH_H_

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__GNUC__) || defined(__clang__)
#define JB_INLINE inline __attribute__((always_inline))
// For lambdas, after the parameter list: `[&](int i) JB_LAMBDA_INLINE { ... }`.
#define JB_LAMBDA_INLINE __attribute__((always_inline))
#else
#define JB_INLINE inline
#define JB_LAMBDA_INLINE
#endif

namespace jaxbridge::kernels::math {

JB_INLINE uint32_t Bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}
JB_INLINE uint64_t Bits(double x) {
  uint64_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}
JB_INLINE float FromBits(uint32_t u) {
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}
JB_INLINE double FromBits(uint64_t u) {
  double x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

// exp(x) for x in [-inf, 0] (NaN in, NaN out). Precondition x <= 0 (every caller
// passes -|z| or a non-positive scale times a squared distance): x > 0 gives a wrong
// value, though nothing undefined (hence no clamp there, the loops are port-bound).
// Results down to the smallest subnormal are right: 2^n is applied as
// 2^(n+K) * 2^-K so that the exponent field never underflows; only the last
// multiply rounds.
JB_INLINE float ExpNonPositive(float x) {
  x = x < -104.0f ? -104.0f : x;  // exp(-104) < half the smallest subnormal: rounds to 0
  const float kMagic = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const float shifted = x * 1.44269504088896341f + kMagic;
  const float n = shifted - kMagic;
  // Cody-Waite: ln 2 = C1 + C2 with C1 exact in a few bits, so n*C1 is exact.
  float r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.0f;
  // Low mantissa bits of `shifted` hold n (in [-150, 0]); unsigned math cannot overflow UB.
  const uint32_t e = Bits(shifted) - Bits(kMagic) + uint32_t{32 + 127};
  return p * FromBits(e << 23) * 2.3283064365386963e-10f;  // * 2^(n+32) * 2^-32
}

JB_INLINE double ExpNonPositive(double x) {
  x = x < -746.0 ? -746.0 : x;  // exp(-746) < half the smallest subnormal: rounds to 0
  const double kMagic = 6755399441055744.0;  // 1.5 * 2^52
  const double shifted = x * 1.4426950408889634074 + kMagic;
  const double n = shifted - kMagic;
  double r = x - n * 6.93145751953125e-1;
  r = r - n * 1.42860682030941723212e-6;
  // Taylor series to degree 13: the remainder is < 5e-18 for |r| <= ln(2)/2.
  double p = 1.0 / 6227020800.0;
  p = p * r + 1.0 / 479001600.0;
  p = p * r + 1.0 / 39916800.0;
  p = p * r + 1.0 / 3628800.0;
  p = p * r + 1.0 / 362880.0;
  p = p * r + 1.0 / 40320.0;
  p = p * r + 1.0 / 5040.0;
  p = p * r + 1.0 / 720.0;
  p = p * r + 1.0 / 120.0;
  p = p * r + 1.0 / 24.0;
  p = p * r + 1.0 / 6.0;
  p = p * r + 0.5;
  p = p * (r * r) + r + 1.0;
  const uint64_t e = Bits(shifted) - Bits(kMagic) + uint64_t{64 + 1023};
  return p * FromBits(e << 52) * 5.421010862427522170e-20;  // * 2^(n+64) * 2^-64
}

// log1p(t) for t in [0, 1] (NaN in, NaN out), after fdlibm's s_log1p: with u = 1+t
// rounded, f = u - 1 or u/2 - 1 (exact), and c the rounding error of u,
// log1p(t) = k ln2 + log(1+f) + c/u, log(1+f) = f - f^2/2 + s (f^2/2 + R(s^2)).
template <typename T>
struct Log1pConst;
template <>
struct Log1pConst<float> {  // musl/fdlibm e_logf.c: |R - log| < 2^-34.24
  static constexpr float kLn2Hi = 6.9313812256e-01f, kLn2Lo = 9.0580006145e-06f;
  static constexpr float kLg1 = 0.66666662693f, kLg2 = 0.40000972152f, kLg3 = 0.28498786688f,
                         kLg4 = 0.24279078841f, kLg5 = 0, kLg6 = 0, kLg7 = 0;
};
template <>
struct Log1pConst<double> {  // fdlibm s_log1p.c: |R - log| < 2^-58.45
  static constexpr double kLn2Hi = 6.93147180369123816490e-01,
                          kLn2Lo = 1.90821492927058770002e-10;
  static constexpr double kLg1 = 6.666666666666735130e-01, kLg2 = 3.999999999940941908e-01,
                          kLg3 = 2.857142874366239149e-01, kLg4 = 2.222219843214978396e-01,
                          kLg5 = 1.818357216161805012e-01, kLg6 = 1.531383769920937332e-01,
                          kLg7 = 1.479819860511658591e-01;
};

template <typename T>
JB_INLINE T Log1pUnit(T t) {
  using C = Log1pConst<T>;
  const bool big = t > T(0.41421356237309504880);  // 1 + t > sqrt(2): use u/2
  const T u = T(1) + t;
  const T f = big ? T(0.5) * u - T(1) : t;
  const T k = big ? T(1) : T(0);
  // c/u with 1/u = 0.5/(1+f) ~ 0.5 (1 - f + f^2): c is below half an ulp of u, so a
  // few % error on 1/u is far below the result's ulp (saves a second division).
  const T c = big ? (t - (u - T(1))) * (T(0.5) * (T(1) - f + f * f)) : T(0);
  const T hfsq = T(0.5) * f * f;
  const T s = f / (T(2) + f);
  const T z = s * s, w = z * z;
  T R;
  if constexpr (sizeof(T) == 4) {
    R = z * (C::kLg1 + w * C::kLg3) + w * (C::kLg2 + w * C::kLg4);
  } else {
    R = z * (C::kLg1 + w * (C::kLg3 + w * (C::kLg5 + w * C::kLg7))) +
        w * (C::kLg2 + w * (C::kLg4 + w * C::kLg6));
  }
  return k * C::kLn2Hi - ((hfsq - (s * (hfsq + R) + (k * C::kLn2Lo + c))) - f);
}

// softplus(beta x) / beta for beta > 0 = max(x, 0) + log1p(exp(-|beta x|)) / beta: the
// large term never goes through beta x, which overflows for huge beta x (x = 1e300,
// beta = 1e10) although the result, about x, is finite. = x for large beta x, inf for
// x = +inf, 0 for -inf, NaN for NaN (the NaN travels through exp and log1p).
template <typename T>
JB_INLINE T SoftplusScaled(T x, T beta, T inv_beta) {
  const T z = beta * x;
  // std::fabs is a compiler builtin (one and-not), not a libm call.
  return (z > T(0) ? x : T(0)) + Log1pUnit(ExpNonPositive(-std::fabs(z))) * inv_beta;
}

// sigmoid(z) = 1 / (1 + exp(-z)), from e = exp(-|z|) so that nothing overflows.
template <typename T>
JB_INLINE T Sigmoid(T z) {
  const T e = ExpNonPositive(-std::fabs(z));
  const T r = T(1) / (T(1) + e);
  return z >= T(0) ? r : e * r;
}

}  // namespace jaxbridge::kernels::math

#endif  // JAXBRIDGE_KERNELS_CPU_MATH_H_
