// CPU parallel-for over XLA's intra-op thread pool (header-only).
//
//   ffi::Error Handler(ffi::ThreadPool pool, ...) {
//     jaxbridge::ParallelFor(&pool, n, /*min_per_chunk=*/1024,
//                            [&](int64_t chunk, int64_t begin, int64_t end) { ... });
//   }
//   ... .Ctx<ffi::ThreadPool>()   // in the handler binding (see JAXBRIDGE_HAS_THREAD_POOL)
//
// Semantics: `body(chunk, begin, end)` is called once for every chunk
// [begin, end) of [0, n); chunk ids are 0..NumChunks()-1 (use them to index
// per-chunk scratch). The calling thread takes part in the work and returns only
// when every chunk is done, so this cannot deadlock even when the pool is busy or
// when the handler itself runs on a pool thread (it only ever waits for chunks
// that a helper has already started). `body` must not throw (it may
// run on a pool thread; record failures in an atomic flag instead). Without a pool
// (nullptr, headers without ffi::ThreadPool, or one thread) it runs serially.
#ifndef JAXBRIDGE_PARALLEL_H_
#define JAXBRIDGE_PARALLEL_H_

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>

#include "xla/ffi/api/ffi.h"

// ffi::ThreadPool appeared with XLA FFI API 0.1; define JAXBRIDGE_NO_THREAD_POOL to opt out.
#if !defined(JAXBRIDGE_NO_THREAD_POOL) && defined(XLA_FFI_API_MINOR) && \
    (XLA_FFI_API_MAJOR > 0 || XLA_FFI_API_MINOR >= 1)
#define JAXBRIDGE_HAS_THREAD_POOL 1
#else
#define JAXBRIDGE_HAS_THREAD_POOL 0
#endif

namespace jaxbridge {

#if JAXBRIDGE_HAS_THREAD_POOL
using ThreadPool = ::xla::ffi::ThreadPool;
#else
struct ThreadPool {  // serial stand-in
  int64_t num_threads() const { return 0; }
  template <typename F> void Schedule(F&& f) { f(); }
};
#endif

// Number of chunks ParallelFor will use for `n` items (>= 1 when n > 0).
template <typename Pool>
int64_t NumChunks(Pool* pool, int64_t n, int64_t min_per_chunk) {
  if (n <= 0) return 0;
  int64_t threads = pool ? pool->num_threads() : 0;
  if (threads <= 1) return 1;
  min_per_chunk = std::max<int64_t>(1, min_per_chunk);
  int64_t by_size = (n + min_per_chunk - 1) / min_per_chunk;
  return std::max<int64_t>(1, std::min<int64_t>(by_size, 4 * threads));
}

template <typename Pool, typename Body>
void ParallelFor(Pool* pool, int64_t n, int64_t min_per_chunk, Body&& body) {
  const int64_t chunks = NumChunks(pool, n, min_per_chunk);
  if (chunks == 0) return;
  const int64_t step = (n + chunks - 1) / chunks;
  auto range = [n, step](int64_t c, int64_t* b, int64_t* e) {
    *b = c * step;
    *e = std::min(n, *b + step);
  };
  if (chunks == 1) {
    body(int64_t{0}, int64_t{0}, n);
    return;
  }
  // Shared state outlives late-starting tasks (they find no work and exit).
  struct State {
    std::atomic<int64_t> next{0};
    std::atomic<int64_t> done{0};
    std::mutex mu;
    std::condition_variable cv;
  };
  auto state = std::make_shared<State>();
  using BodyT = std::remove_reference_t<Body>;
  BodyT* fn = &body;
  auto work = [state, fn, chunks, range]() {
    for (;;) {
      int64_t c = state->next.fetch_add(1, std::memory_order_relaxed);
      if (c >= chunks) return;
      int64_t b, e;
      range(c, &b, &e);
      if (b < e) (*fn)(c, b, e);
      if (state->done.fetch_add(1, std::memory_order_acq_rel) + 1 == chunks) {
        { std::lock_guard<std::mutex> lock(state->mu); }  // no lost wake-up
        state->cv.notify_all();
      }
    }
  };
  int64_t helpers = std::min<int64_t>(pool->num_threads(), chunks - 1);
  for (int64_t i = 0; i < helpers; ++i) pool->Schedule(decltype(work)(work));
  work();  // the caller works too
  // Only chunks that helpers already started are left. Spin briefly (they usually
  // finish soon), then sleep: when several XLA executions run at once on few cores,
  // a spinning caller takes the core a preempted helper needs (3x the CPU time per
  // call was measured in pipelined benchmarks).
  auto finished = [&] { return state->done.load(std::memory_order_acquire) >= chunks; };
  for (int i = 0; i < 64 && !finished(); ++i) std::this_thread::yield();
  if (!finished()) {
    std::unique_lock<std::mutex> lock(state->mu);
    state->cv.wait(lock, finished);
  }
}

}  // namespace jaxbridge

#endif  // JAXBRIDGE_PARALLEL_H_
