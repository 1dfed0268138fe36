// Interpreter exit: once it starts, no host call takes the GIL (that would end the
// thread inside XLA and abort the process); an atexit hook waits for calls in flight.
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "internal.h"

namespace jaxbridge::hostcall {
namespace {

std::atomic<bool> g_exiting{false};
std::atomic<int> g_in_flight{0};
std::mutex g_in_flight_mu;
std::condition_variable g_in_flight_cv;

}  // namespace

bool PythonIsExiting() {
  if (g_exiting.load(std::memory_order_acquire) || !Py_IsInitialized()) return true;
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing();
#else
  return _Py_IsFinalizing();
#endif
}

InFlight::InFlight() {
  g_in_flight.fetch_add(1, std::memory_order_acq_rel);
  entered_ = !PythonIsExiting();
}

void InFlight::Leave() {
  if (left_) return;
  left_ = true;
  if (g_in_flight.fetch_sub(1, std::memory_order_acq_rel) == 1) {
    std::lock_guard<std::mutex> lock(g_in_flight_mu);
    g_in_flight_cv.notify_all();
  }
}

// A daemon thread that calls a host function while the interpreter exits. Returning an
// error would send it back into jaxlib, which takes the GIL to raise it: a thread that
// takes the GIL during finalization is ended with pthread_exit, whose forced unwinding
// through XLA's noexcept frames aborts the process. Parked here, it never touches Python
// again, and the process exits around it (what Python 3.14 does with such threads).
void Park() {
  for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
}

// atexit: refuse new host calls, wait (without the GIL) for those in flight, then give
// threads that just returned from one a moment to get back into Python or park. Returns
// how many calls are still running (the caller then exits without waiting for them).
int BeginShutdown(double timeout_seconds) {
  g_exiting.store(true, std::memory_order_release);
  py::gil_scoped_release release;
  bool done;
  {
    std::unique_lock<std::mutex> lock(g_in_flight_mu);
    done = g_in_flight_cv.wait_for(
        lock, std::chrono::duration<double>(timeout_seconds),
        [] { return g_in_flight.load(std::memory_order_acquire) == 0; });
  }
  if (done) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  return g_in_flight.load(std::memory_order_acquire);
}

}  // namespace jaxbridge::hostcall
