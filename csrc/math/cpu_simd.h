// Fixed-width SIMD vectors for the register tiles of the CPU kernels (no XLA
// headers, no intrinsics). GCC/Clang `vector_size` types compile to the vector
// instructions of the function they are inlined into (cpu_isa.h compiles the hot
// loops per ISA), so one source gives SSE2, AVX2 and AVX-512 code. The
// auto-vectorizer handles the simple element-wise loops, but it gives up on
// register-blocked tiles inside large functions (it left the RBF tile scalar with
// its accumulators on the stack: ~10x slower), hence explicit vectors there.
//
// Vectors are only ever local variables, passed by reference to always-inline
// helpers: never by value across a call, whose ABI would depend on the ISA.
#ifndef JAXBRIDGE_KERNELS_CPU_SIMD_H_
#define JAXBRIDGE_KERNELS_CPU_SIMD_H_

#include <cstring>

#include "cpu_math.h"  // JB_INLINE

namespace jaxbridge::kernels::simd {

#if (defined(__GNUC__) || defined(__clang__)) && !defined(JAXBRIDGE_SIMD_FALLBACK)
template <typename T, int kBytes>
struct VecOf {
  typedef T type __attribute__((vector_size(kBytes)));
  // Same vector, element-aligned and allowed to alias T: the usual idiom for
  // unaligned loads/stores (memcpy into a vector was not always folded into one
  // load, which left the tile's vectors on the stack).
  typedef T unaligned __attribute__((vector_size(kBytes), aligned(alignof(T)), may_alias));
};

template <typename T, int kBytes>
JB_INLINE void Load(typename VecOf<T, kBytes>::type& v, const T* p) {
  v = *reinterpret_cast<const typename VecOf<T, kBytes>::unaligned*>(p);
}
template <typename T, int kBytes>
JB_INLINE void Store(T* p, const typename VecOf<T, kBytes>::type& v) {
  *reinterpret_cast<typename VecOf<T, kBytes>::unaligned*>(p) = v;
}
#else
// Portable stand-in with the few operations the kernels use.
template <typename T, int kBytes>
struct VecOf {
  struct type {
    static constexpr int kN = kBytes / static_cast<int>(sizeof(T));
    T v[kN];
    T& operator[](int i) { return v[i]; }
    T operator[](int i) const { return v[i]; }
    static type Splat(T s) {
      type r;
      for (int i = 0; i < kN; ++i) r.v[i] = s;
      return r;
    }
    friend type operator+(type a, const type& b) {
      for (int i = 0; i < kN; ++i) a.v[i] += b.v[i];
      return a;
    }
    friend type operator-(type a, const type& b) {
      for (int i = 0; i < kN; ++i) a.v[i] -= b.v[i];
      return a;
    }
    friend type operator*(type a, const type& b) {
      for (int i = 0; i < kN; ++i) a.v[i] *= b.v[i];
      return a;
    }
    friend type operator+(const type& a, T s) { return a + Splat(s); }
    friend type operator-(T s, const type& a) { return Splat(s) - a; }
    friend type operator*(T s, const type& a) { return Splat(s) * a; }
    friend type operator*(const type& a, T s) { return a * Splat(s); }
    type& operator+=(const type& b) { return *this = *this + b; }
  };
};

template <typename T, int kBytes>
JB_INLINE void Load(typename VecOf<T, kBytes>::type& v, const T* p) {
  std::memcpy(&v, p, sizeof(v));
}
template <typename T, int kBytes>
JB_INLINE void Store(T* p, const typename VecOf<T, kBytes>::type& v) {
  std::memcpy(p, &v, sizeof(v));
}
#endif

template <typename V>
JB_INLINE void SetZero(V& v) {
  v = V{};
}
template <typename T, typename V>
JB_INLINE T HorizontalSum(const V& v) {
  T s = T(0);
  for (int i = 0; i < static_cast<int>(sizeof(V) / sizeof(T)); ++i) s += v[i];
  return s;
}

}  // namespace jaxbridge::kernels::simd

#endif  // JAXBRIDGE_KERNELS_CPU_SIMD_H_
