// Run-time instruction-set dispatch for the CPU kernels (no XLA headers).
//
// The package is built on the user's machine but must stay portable (no
// -march=native), so the hot loops are compiled several times: for the baseline
// ISA of the build (SSE2 on x86-64) and, on x86-64 with GCC or Clang, for AVX2+FMA
// and AVX-512 through function `target` attributes. DispatchIsa picks the best one
// the CPU (and OS) supports, once per call:
//
//   DispatchIsa(ActiveIsa(), [&](auto isa) { /* loop, compiled for decltype(isa) */ });
//
// The lambda body is inlined (flatten) into a function compiled for that ISA, so
// the compiler auto-vectorizes it with that ISA's vector width; `isa` carries the
// ISA as a type (IsaTag) for code that tunes block sizes to the register file.
// Everything the lambda calls must be force-inlined too (JB_INLINE, and
// JB_LAMBDA_INLINE on nested lambdas): Clang's flatten covers direct calls only,
// and a helper left out of line is compiled for the baseline ISA (Clang ran 3-9x
// slower before the nested lambdas were marked).
//
// JAXBRIDGE_CPU_ISA=baseline|avx2|avx512 (environment) caps the ISA, for tests and
// benchmarks; SetIsaLimit does the same from C++.
#ifndef JAXBRIDGE_KERNELS_CPU_ISA_H_
#define JAXBRIDGE_KERNELS_CPU_ISA_H_

#include <atomic>
#include <cstdlib>
#include <cstring>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && \
    !defined(JAXBRIDGE_NO_ISA_DISPATCH)
#define JB_X86_DISPATCH 1
#else
#define JB_X86_DISPATCH 0
#endif

#if defined(__GNUC__) || defined(__clang__)
#define JB_FLATTEN __attribute__((flatten))
#else
#define JB_FLATTEN
#endif

namespace jaxbridge::kernels {

enum class Isa : int { kBaseline = 0, kAvx2 = 1, kAvx512 = 2 };

template <Isa kIsa>
struct IsaTag {
  static constexpr Isa value = kIsa;
  // Bytes per SIMD register (the baseline assumes 16: SSE2, NEON, ...).
  static constexpr int kVectorBytes = kIsa == Isa::kAvx512 ? 64 : kIsa == Isa::kAvx2 ? 32 : 16;
  // Architectural SIMD registers (x86-64 SSE/AVX2: 16, AVX-512: 32; NEON also 32,
  // but 16 is a safe lower bound for the baseline).
  static constexpr int kVectorRegisters = kIsa == Isa::kAvx512 ? 32 : 16;
};

inline const char* IsaName(Isa isa) {
  switch (isa) {
    case Isa::kAvx512: return "avx512";
    case Isa::kAvx2: return "avx2";
    default: return "baseline";
  }
}

// Best ISA this CPU and OS support (__builtin_cpu_supports checks the OS enabled
// the AVX / AVX-512 register state too).
inline Isa DetectedIsa() {
#if JB_X86_DISPATCH
  static const Isa detected = [] {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
        __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
      return Isa::kAvx512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return Isa::kAvx2;
    return Isa::kBaseline;
  }();
  return detected;
#else
  return Isa::kBaseline;
#endif
}

namespace isa_detail {
inline bool EqualsIgnoreCase(const char* a, const char* lower) {
  for (; *a != '\0' && *lower != '\0'; ++a, ++lower) {
    const char c = (*a >= 'A' && *a <= 'Z') ? static_cast<char>(*a - 'A' + 'a') : *a;
    if (c != *lower) return false;
  }
  return *a == *lower;
}
}  // namespace isa_detail

inline std::atomic<int>& IsaLimitStorage() {
  static std::atomic<int> limit{[] {
    const char* env = std::getenv("JAXBRIDGE_CPU_ISA");
    if (env == nullptr || *env == '\0') return static_cast<int>(Isa::kAvx512);
    // Case-insensitive; anything else means no cap (jaxbridge.ops warns about it).
    if (isa_detail::EqualsIgnoreCase(env, "baseline")) return static_cast<int>(Isa::kBaseline);
    if (isa_detail::EqualsIgnoreCase(env, "avx2")) return static_cast<int>(Isa::kAvx2);
    return static_cast<int>(Isa::kAvx512);
  }()};
  return limit;
}

// Caps the ISA used by later kernel calls (tests, benchmarks). Never raises it above
// what the CPU supports.
inline void SetIsaLimit(Isa limit) {
  IsaLimitStorage().store(static_cast<int>(limit), std::memory_order_relaxed);
}

inline Isa ActiveIsa() {
  const int limit = IsaLimitStorage().load(std::memory_order_relaxed);
  const int detected = static_cast<int>(DetectedIsa());
  return static_cast<Isa>(limit < detected ? limit : detected);
}

namespace isa_detail {
#if JB_X86_DISPATCH
template <typename F>
__attribute__((target("avx512f,avx512vl,avx512dq,avx512bw,avx2,fma"))) JB_FLATTEN void RunAvx512(
    const F& f) {
  f(IsaTag<Isa::kAvx512>());
}
template <typename F>
__attribute__((target("avx2,fma"))) JB_FLATTEN void RunAvx2(const F& f) {
  f(IsaTag<Isa::kAvx2>());
}
#endif
template <typename F>
JB_FLATTEN void RunBaseline(const F& f) {
  f(IsaTag<Isa::kBaseline>());
}
}  // namespace isa_detail

// Calls f(IsaTag<isa>()) from a function compiled for `isa` (see the top of the file).
template <typename F>
void DispatchIsa(Isa isa, const F& f) {
#if JB_X86_DISPATCH
  if (isa == Isa::kAvx512) return isa_detail::RunAvx512(f);
  if (isa == Isa::kAvx2) return isa_detail::RunAvx2(f);
#endif
  (void)isa;
  isa_detail::RunBaseline(f);
}

}  // namespace jaxbridge::kernels

#endif  // JAXBRIDGE_KERNELS_CPU_ISA_H_
