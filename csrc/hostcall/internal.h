// The host-call runtime's internal interface: what the files of csrc/hostcall/ share.
//
// jaxbridge._hostcall runs registered Python callables on NumPy views of XLA's buffers.
// Each file has one job:
//   registry.cc      callables by id, and the Python hooks handed over at import
//   shutdown.cc      interpreter exit: refuse new calls, wait for (or abandon) running ones
//   threads.cc       thread budgets: how many BLAS threads a call may use
//   delivery.cc      a failed call's exception: delivered to its Python thread or via XLA
//   views.cc         zero-copy NumPy views of XLA's buffers, and what a call kept of them
//   direct_call.cc   the common host functions called without their Python wrapper
//   invoke.cc        one host call, and the XLA FFI handlers that make it
//   device_call.cc   the CUDA device path: DLPack views of device buffers
//   cuda_staging.cc  the CUDA staged path: operands through pinned host memory
//   module.cc        the pybind11 module (the Python side: jaxbridge/_foreign/hostcall.py,
//                    delivery.py, threads.py, shutdown.py)
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace jaxbridge::hostcall {

namespace py = pybind11;
namespace ffi = xla::ffi;
using Clock = std::chrono::steady_clock;

// ------------------------------------------------------------------ buffers (views.cc)
// One XLA buffer as the callable sees it. Trivially constructible (no initializers):
// CollectSlots sets every field, and a call does not pay for zeroing Slots' storage.
struct Slot {
  ffi::DataType type;
  const int64_t* dims;  // XLA's dimensions, valid during the call
  size_t rank;
  void* data;           // XLA's memory (or pinned staging on GPU)
  size_t bytes;
  bool writable;        // outputs
  std::vector<py::ssize_t> shape() const { return {dims, dims + rank}; }
};

// The buffers of one call: a few are kept inline, so that a call allocates nothing.
class Slots {
 public:
  Slots() = default;
  Slots(const Slots& other) {
    for (const Slot& s : other) push_back(s);
  }
  Slots& operator=(const Slots&) = delete;
  void push_back(const Slot& s) {
    if (n_ < kInline) {
      inline_[n_++] = s;
      return;
    }
    if (n_ == kInline) heap_.assign(inline_.begin(), inline_.end());
    heap_.push_back(s);
    ++n_;
  }
  size_t size() const { return n_; }
  bool empty() const { return n_ == 0; }
  Slot* begin() { return n_ > kInline ? heap_.data() : inline_.data(); }
  Slot* end() { return begin() + n_; }
  const Slot* begin() const { return n_ > kInline ? heap_.data() : inline_.data(); }
  const Slot* end() const { return begin() + n_; }
  Slot& operator[](size_t i) { return begin()[i]; }
  const Slot& operator[](size_t i) const { return begin()[i]; }

 private:
  static constexpr size_t kInline = 8;
  std::array<Slot, kInline> inline_;  // uninitialized beyond n_
  std::vector<Slot> heap_;
  size_t n_ = 0;
};

// The NumPy dtype of an XLA element type (borrowed, built once), or nullptr.
PyObject* NumpyDtype(ffi::DataType type);

// The views of one call (see views.cc).
class CallViews {
 public:
  CallViews(const Slots& ins, const Slots& outs, bool copy);
  bool ok() const { return error_.empty(); }
  const std::string& error() const { return error_; }
  const py::tuple& ins() const { return ins_; }
  const py::tuple& outs() const { return outs_; }
  // Point the views of an earlier call at this call's buffers; false (nothing changed)
  // unless every view still has the slot's dtype and shape and is ours, contiguous.
  bool Rebind(const Slots& ins, const Slots& outs);
  // Copy mode: the callable filled arrays of its own; write them to XLA's buffers.
  void CopyOutputsBack(const Slots& outs) const;
  // Which views outlive the call (beyond our own references), and how many views
  // derived from them are alive. Call after the callable returned.
  struct Kept {
    std::vector<int> ins, outs;  // indices of kept views
    Py_ssize_t derived = 0;
    bool any() const { return !ins.empty() || !outs.empty() || derived > 0; }
  };
  Kept Check() const;
  // Give kept top-level views a private copy of their data.
  void Detach(const Kept& kept);

 private:
  bool Fits(const py::tuple& views, const Slots& slots) const;
  py::tuple Tuple(const Slots& slots);
  py::array Make(const Slot& s);

  bool copy_;
  py::object owner_;
  py::tuple ins_, outs_;
  std::string error_;
};

// ------------------------------------------------------------------ threads.cc
enum class ThreadPolicy { kAuto, kFixed, kLeave };

// Whether a host function runs faster alone with one thread or with every thread
// (threads.cc). Touched with the GIL held.
class ThreadTuner {
 public:
  // The budget of the next call that runs alone, out of `share` threads.
  int Choose(int share);
  // That call took `seconds`.
  void Record(double seconds);
  py::dict State() const;  // for tests: {"phase": ..., "chosen": ...}

 private:
  enum class Phase { kExplore, kExploit, kProbe };
  static constexpr int kOne = 0, kShare = 1;
  static constexpr int kSamples = 5;  // per choice when exploring, the most kept
  Phase phase_ = Phase::kExplore;
  int arm_ = -1;  // the choice of the call running now (-1: none, or not measured)
  int chosen_ = kShare;
  int measured_ = 0;  // calls measured in this exploration or probe
  int doubts_ = 0;    // probes in a row that found the other choice faster
  bool warm_ = false;  // the first call (caches, first-touch memory) is not a sample
  std::array<std::array<double, kSamples>, 2> samples_{};  // per choice, the latest
  std::array<int, 2> next_{};  // samples taken since the round began (a ring's count)
  Clock::time_point decided_at_;

  void StartRound(Phase phase);
};

// ------------------------------------------------------------------ registry.cc
struct Entry {
  // Borrowed: the owner (`handler`, which holds `fill`) unregisters from a weakref
  // finalizer, executables keep it alive, and a call holds it while it runs
  // (jaxbridge/_foreign/hostcall.py).
  PyObject* fill = nullptr;
  PyObject* handler = nullptr;
  bool copy = false;  // give this callable copies instead of zero-copy views
  // The direct call (direct_call.cc): the user's function itself, how its result is
  // delivered, and the Python function that checks a result the fast path did not take.
  // Borrowed like `fill` (the handler holds them); kind 0: no direct call, use `fill`.
  PyObject* direct_fun = nullptr;
  int direct_kind = 0;
  PyObject* direct_finish = nullptr;
  Py_ssize_t direct_n_in = 0;      // kDirectAdjoint: primal inputs,
  std::vector<int> direct_live;    // and the cotangents that are outputs, in order
  // The views of its last call that kept nothing, for the next call (see CallViews).
  // Released with the GIL held (unregister_callback is called from Python).
  std::unique_ptr<CallViews> spare;
  // How many of its calls a compiled program runs at once (its devices), and how many
  // threads it runs fastest with when it runs alone (threads.cc).
  int concurrency = 1;
  ThreadTuner tuner;
  // How many calls of it have started (GIL-protected): a failure carries its call's
  // ordinal, so that the failures of the shards of one run are recognised as one.
  int64_t started = 0;
};

// Never destroyed: XLA may call handlers during interpreter shutdown. GIL-protected.
// Entries are shared: a call holds its entry while it runs, so that unregistering the
// callable meanwhile (its owner collected, or finalized at exit) frees nothing in use.
std::unordered_map<int64_t, std::shared_ptr<Entry>>& Registry();
// The entry registered under `callback_id`, or nullptr. With the GIL held.
std::shared_ptr<Entry> FindEntry(int64_t callback_id);

// Python objects handed over once by jaxbridge/_foreign/delivery.py (owned, never freed).
struct Hooks {
  PyObject* delivery_class = nullptr;  // raising it re-raises the thread's pending exception
  PyObject* gc_collect = nullptr;      // gc.collect
  PyObject* clear_frames = nullptr;    // traceback.clear_frames
  PyObject* release_deferred = nullptr;  // drops the references JAX defers (or None)
  unsigned long main_thread = 0;       // threading.main_thread().ident
};
Hooks& TheHooks();

// ------------------------------------------------------------------ shutdown.cc
bool PythonIsExiting();

// Counts a host call in flight for the atexit hook; `entered` is false once exiting.
class InFlight {
 public:
  InFlight();
  ~InFlight() { Leave(); }
  InFlight(const InFlight&) = delete;
  InFlight& operator=(const InFlight&) = delete;
  bool entered() const { return entered_; }
  void Leave();

 private:
  bool entered_;
  bool left_ = false;
};

// Never returns: where a daemon thread that called a host function waits out exit.
[[noreturn]] void Park();

// atexit: refuse new host calls and wait for those in flight (see shutdown.cc); returns
// how many are still running after `timeout_seconds`.
int BeginShutdown(double timeout_seconds);

// ------------------------------------------------------------------ the GIL (invoke.cc)
// A thread that was running Python when it called into XLA (not a worker thread whose
// state we created). Safe without the GIL.
bool OnPythonThread();

// Holds the GIL. On XLA's worker threads PyGILState_Ensure would create and delete a
// thread state on every call; the first one is kept for the thread's life.
class Gil {
 public:
  // `worker`: treat this thread as a worker even if it has a Python thread state (XLA's
  // buffer-callback handler gives its threads one).
  explicit Gil(bool worker = false);
  ~Gil();
  Gil(const Gil&) = delete;
  Gil& operator=(const Gil&) = delete;
  // True on a thread that was running Python when it called into XLA.
  bool python_thread() const { return python_thread_; }

 private:
  PyGILState_STATE state_;
  // The thread's floating-point control state before the call. XLA runs its programs
  // with denormals flushed to zero; Python code (NumPy, SciPy) runs with IEEE's
  // default, as it does outside jit, so the Gil clears the flush for the call and puts
  // XLA's state back after it (without this, SciPy's iv(1, 700) was 0.14% off and
  // 1e-310 became 0 inside a jitted host call).
  uint64_t fp_state_ = 0;
  bool python_thread_;
};

// ------------------------------------------------------------------ delivery.cc
// A computation that keeps making host calls this long after one of them raised is
// aborted with an XLA error instead of waiting to deliver the exception (a loop whose
// exit condition depended on the failed call's output could otherwise spin for ever).
constexpr double kMaxSkipSeconds = 2.0;
// Whether an earlier call on this thread raised an exception not yet delivered (its
// later host calls are then skipped), and for how long.
bool HasPending();
double PendingSeconds();
// Undo the scheduled delivery: the exception will be reported through XLA instead.
// Returns it (new reference).
PyObject* CancelPending();
// The undelivered exception of this thread (new reference), or nullptr.
PyObject* TakePending();
// Raise `exc` (stolen) as the current Python exception.
void RaiseObject(PyObject* exc);
// The exception being raised (new reference), clearing it; nullptr if none.
PyObject* FetchRaisedException();
// The text of the Python error being raised, clearing it.
std::string PythonErrorText();
// An XLA error for a failed host call.
ffi::Error Failure(const std::string& message);
// The outputs of a failed or skipped call: NaN in floating-point results, zeros
// elsewhere (nobody sees them: the exception is raised when the computation returns).
void FailedFill(const Slots& outs);
// The failure `exc` (stolen) of a call on this thread: delivered to the calling Python
// thread, or reported through XLA with a message from `handler`.
// `started`: the failed call's ordinal among its callable's calls (-1: not known).
ffi::Error Report(PyObject* exc, PyObject* handler, bool python_thread, const Slots& outs,
                  int64_t started = -1);

// ------------------------------------------------------------------ views.cc
// The kept-view policy after a call. Returns the exception to report (new reference),
// `exc` itself (stolen) when the call had already failed, or nullptr when all is well.
PyObject* ResolveKept(CallViews& views, Entry& entry, PyObject* exc);

// ------------------------------------------------------------------ direct_call.cc
constexpr int kDirectReturns = 1;
constexpr int kDirectOut = 2;
constexpr int kDirectAdjoint = 3;
constexpr int kDirectAdjointOut = 4;
// Whether this call's operands and results fit the direct call of `entry`.
bool CanCallDirect(const Entry& entry, const Slots& ins, const Slots& outs);
// The callable's result (a new reference; nullptr with the exception set).
PyObject* CallDirect(const Entry& entry, const CallViews& views, const Slots& out_slots);

// ------------------------------------------------------------------ threads.cc
// (see threads.cc)
int CurrentThreadBudget();  // this thread's host call's budget; 0: the libraries' own
bool SetThreadPolicy(ThreadPolicy policy, int limit,
                     const std::vector<std::pair<uintptr_t, uintptr_t>>& fns);

// Sets the thread budget of one host call for its duration (construct and destroy it
// with the GIL held: it records the call's time in its entry's tuner).
class ThreadBudget {
 public:
  explicit ThreadBudget(Entry* entry);
  ~ThreadBudget();
  ThreadBudget(const ThreadBudget&) = delete;
  ThreadBudget& operator=(const ThreadBudget&) = delete;

 private:
  bool engaged_ = false;
  Entry* tuner_ = nullptr;
  Clock::time_point started_;
};

// ------------------------------------------------------------------ invoke.cc
// Runs the callable registered under `callback_id` on `ins`/`outs`. `worker`: the call
// runs on a thread that no Python caller waits on (see Gil), whatever its thread state.
ffi::Error InvokeOnHost(int64_t callback_id, const Slots& ins, const Slots& outs,
                        bool worker = false);
// The callable XLA's buffer-callback handler runs for a host call in a program that
// spans several devices (see invoke.cc): (exec_ctx, outputs, *inputs) -> None.
py::cpp_function BufferCallbackEntry(int64_t callback_id);
// The operands and results of an FFI call as Slots.
ffi::Error CollectSlots(ffi::RemainingArgs args, ffi::RemainingRets rets, Slots* ins,
                        Slots* outs);

// ------------------------------------------------------------------ device_call.cc
bool HasDeviceFill(int64_t callback_id);
void ForgetDeviceFill(int64_t callback_id);
void DefineDeviceCall(py::module_& m);
#ifdef JAXBRIDGE_WITH_CUDA
ffi::Error InvokeOnDevice(int64_t callback_id, const Slots& ins, const Slots& outs,
                          void* stream, int32_t device);
#endif

}  // namespace jaxbridge::hostcall

// The XLA FFI handlers (invoke.cc, cuda_staging.cc), registered by module.cc.
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxbridgeHostCallCpu);
#ifdef JAXBRIDGE_WITH_CUDA
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxbridgeHostCallCuda);
#endif
