// BLAS threads during host calls. NumPy's BLAS runs its own thread pool; inside a host
// call it competes with XLA's threads for the same cores (a 256x256 matmul in a rule ran
// ~80x slower on 2 cores, benchmarks/hostcall.py). While any host call runs, the
// process-wide BLAS thread count is capped (default 1; JAXBRIDGE_HOST_BLAS_THREADS),
// then restored.
#include <mutex>

#include "internal.h"

namespace jaxbridge::hostcall {
namespace {

struct BlasLibrary {
  int (*get)() = nullptr;
  void (*set)(int) = nullptr;
  int saved = 0;
};
struct BlasLimiter {
  std::mutex mu;
  int limit = 0;  // 0: leave BLAS alone
  int active = 0;
  std::vector<BlasLibrary> libraries;
};
BlasLimiter& Blas() {
  static auto* blas = new BlasLimiter();
  return *blas;
}

}  // namespace

BlasCap::BlasCap() {
  BlasLimiter& b = Blas();
  if (b.limit <= 0) return;
  std::lock_guard<std::mutex> lock(b.mu);
  if (b.active++ == 0) {
    for (BlasLibrary& lib : b.libraries) {
      lib.saved = lib.get();
      if (lib.saved > b.limit) lib.set(b.limit);
    }
  }
  engaged_ = true;
}

BlasCap::~BlasCap() {
  if (!engaged_) return;
  BlasLimiter& b = Blas();
  std::lock_guard<std::mutex> lock(b.mu);
  if (--b.active == 0) {
    for (BlasLibrary& lib : b.libraries) {
      if (lib.saved > b.limit) lib.set(lib.saved);
    }
  }
}

bool SetBlasLimit(int limit, const std::vector<std::pair<uintptr_t, uintptr_t>>& fns) {
  BlasLimiter& b = Blas();
  std::lock_guard<std::mutex> lock(b.mu);
  if (b.active != 0) return false;  // host calls are running: try again later
  b.limit = limit;
  b.libraries.clear();
  for (const auto& [get, set] : fns) {
    BlasLibrary lib;
    lib.get = reinterpret_cast<int (*)()>(get);
    lib.set = reinterpret_cast<void (*)(int)>(set);
    b.libraries.push_back(lib);
  }
  return true;
}

}  // namespace jaxbridge::hostcall
