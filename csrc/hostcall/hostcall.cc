// jaxbridge._native: the host-call trampoline, an XLA FFI handler that runs a
// registered Python callable on NumPy views of XLA's buffers.
//
// Protocol: fill(inputs: tuple[np.ndarray], outputs: tuple[np.ndarray]) -> ignored.
// Inputs are read-only, outputs writable; the callable fills every output or raises.
// A callable registered with `direct` is called without `fill` (see CallDirect).
// All checking of what user code returns happens in Python (jaxbridge/_hostcall.py).
//
// What this file guarantees, each with a test in tests/test_hostcall_runtime.py:
//
// * Exceptions keep their identity. An exception raised on a thread that was running
//   Python when it called into XLA -- the main thread, or a threading.Thread calling
//   a jitted function (jaxbridge's programs run synchronously on the calling thread,
//   see jaxbridge/_hostcall.py) -- is re-raised on that thread, as the same object,
//   the moment the JAX call returns. That is how CPython itself delivers
//   KeyboardInterrupt: Py_AddPendingCall on the main thread, PyThreadState_SetAsyncExc
//   on others. XLA is told the call succeeded (outputs NaN-filled, see FailedFill)
//   so that the computation finishes normally; later host calls in the same
//   computation are skipped until the exception is delivered. Where this cannot work --
//   an XLA worker thread, or a computation still making host calls kMaxSkipSeconds
//   after the failure -- the failure becomes an XLA error whose message describes the
//   exception and carries a token. JAX raises that error on the launching thread as
//   its JaxRuntimeError, which jaxbridge has built as the exception object the token
//   names (jaxbridge/_foreign/hostcall.py; jaxbridge.errors.original_exception() maps
//   a token back where that is not possible). A worker cannot deliver it itself: no
//   FFI context names the Python thread waiting for the run (RunId is JAX's
//   per-executable launch counter), and that thread need not run any host call.
// * Views never dangle silently. Zero-copy views are valid only during the call.
//   Afterwards, reference counts tell whether the callable kept a view or a view
//   derived from one. After a call that returned, reference cycles are collected
//   first (not after one that raised: its traceback keeps them); what is still kept gets
//   a private copy of its data where it can (a view handed to the callable) and the
//   call fails with jaxbridge.errors.KeptViewError. A callable that kept something
//   once gets copies (memory of its own) from then on.
// * XLA's worker threads (one per device under sharding) get a Python thread state
//   once and keep it: creating one per call costs ~15 us.
// * Shutdown: once the interpreter starts exiting, no host call takes the GIL (that
//   would end the thread inside XLA and abort the process); an atexit hook waits for
//   the calls in flight to finish.

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "xla/ffi/api/ffi.h"
#include "dlpack_views.h"

#ifdef JAXBRIDGE_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace py = pybind11;
namespace ffi = xla::ffi;

namespace {

using Clock = std::chrono::steady_clock;
// A computation that keeps making host calls this long after one of them raised is
// aborted with an XLA error instead of waiting to deliver the exception (a loop whose
// exit condition depended on the failed call's output could otherwise spin for ever).
constexpr double kMaxSkipSeconds = 2.0;

// ------------------------------------------------------------------ registry
class CallViews;
struct Entry {
  PyObject* fill;     // borrowed: the owner unregisters from a weakref finalizer, and
  PyObject* handler;  // executables keep the owner alive (see jaxbridge/_hostcall.py)
  bool copy = false;  // give this callable copies instead of zero-copy views
  // The direct call (see CallDirect): the user's function itself, how its result is
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
};

// Never destroyed: XLA may call handlers during interpreter shutdown. GIL-protected.
std::unordered_map<int64_t, Entry>& Registry() {
  static auto* registry = new std::unordered_map<int64_t, Entry>();
  return *registry;
}

// Python objects handed over once by jaxbridge/_hostcall.py (owned, never freed).
struct Hooks {
  PyObject* delivery_class = nullptr;  // raising it re-raises the thread's pending exception
  PyObject* gc_collect = nullptr;      // gc.collect
  PyObject* clear_frames = nullptr;    // traceback.clear_frames
  unsigned long main_thread = 0;       // threading.main_thread().ident
};
Hooks& TheHooks() {
  static auto* hooks = new Hooks();
  return *hooks;
}

// ------------------------------------------------------------------ shutdown
std::atomic<bool> g_exiting{false};
std::atomic<int> g_in_flight{0};
std::mutex g_in_flight_mu;
std::condition_variable g_in_flight_cv;

bool PythonIsExiting() {
  if (g_exiting.load(std::memory_order_acquire) || !Py_IsInitialized()) return true;
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing();
#else
  return _Py_IsFinalizing();
#endif
}

// Counts a host call in flight for the atexit hook; `entered` is false once exiting.
class InFlight {
 public:
  InFlight() {
    g_in_flight.fetch_add(1, std::memory_order_acq_rel);
    entered_ = !PythonIsExiting();
  }
  ~InFlight() { Leave(); }
  bool entered() const { return entered_; }
  void Leave() {
    if (left_) return;
    left_ = true;
    if (g_in_flight.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      std::lock_guard<std::mutex> lock(g_in_flight_mu);
      g_in_flight_cv.notify_all();
    }
  }

 private:
  bool entered_;
  bool left_ = false;
};

// A daemon thread that calls a host function while the interpreter exits. Returning an
// error would send it back into jaxlib, which takes the GIL to raise it: a thread that
// takes the GIL during finalization is ended with pthread_exit, whose forced unwinding
// through XLA's noexcept frames aborts the process. Parked here, it never touches Python
// again, and the process exits around it (what Python 3.14 does with such threads).
[[noreturn]] void Park() {
  for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
}

// atexit: refuse new host calls, wait (without the GIL) for those in flight, then give
// threads that just returned from one a moment to get back into Python or park.
void BeginShutdown(double timeout_seconds) {
  g_exiting.store(true, std::memory_order_release);
  py::gil_scoped_release release;
  {
    std::unique_lock<std::mutex> lock(g_in_flight_mu);
    g_in_flight_cv.wait_for(lock, std::chrono::duration<double>(timeout_seconds),
                            [] { return g_in_flight.load(std::memory_order_acquire) == 0; });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
}

// ------------------------------------------------------------------ BLAS threads
// NumPy's BLAS runs its own thread pool; inside a host call it competes with XLA's
// threads for the same cores (a 256x256 matmul in a rule ran ~80x slower on 2 cores,
// benchmarks/hostcall.py). While any host call runs, the process-wide BLAS thread
// count is capped (default 1; JAXBRIDGE_HOST_BLAS_THREADS), then restored.
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

class BlasCap {
 public:
  BlasCap() {
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
  ~BlasCap() {
    if (!engaged_) return;
    BlasLimiter& b = Blas();
    std::lock_guard<std::mutex> lock(b.mu);
    if (--b.active == 0) {
      for (BlasLibrary& lib : b.libraries) {
        if (lib.saved > b.limit) lib.set(lib.saved);
      }
    }
  }

 private:
  bool engaged_ = false;
};

// ------------------------------------------------------------------ the GIL
// Threads Python knows (the main thread, threading.Thread) use their own thread state.
// On XLA's worker threads PyGILState_Ensure would create and delete a state on every
// call; one extra Ensure, never released, keeps the first state for the thread's life.
thread_local bool t_state_kept = false;

// A thread that was running Python when it called into XLA (not a worker thread whose
// state we created). Safe without the GIL.
bool OnPythonThread() {
  return !t_state_kept && PyGILState_GetThisThreadState() != nullptr;
}

class Gil {
 public:
  Gil() {
    python_thread_ = OnPythonThread();
    state_ = PyGILState_Ensure();
    if (!python_thread_ && !t_state_kept) {
      PyGILState_Ensure();
      t_state_kept = true;
    }
  }
  ~Gil() { PyGILState_Release(state_); }
  Gil(const Gil&) = delete;
  Gil& operator=(const Gil&) = delete;
  // True on a thread that was running Python when it called into XLA.
  bool python_thread() const { return python_thread_; }

 private:
  PyGILState_STATE state_;
  bool python_thread_;
};

// ------------------------------------------------------------------ pending exceptions
// The exception a host call on this thread raised and that is not yet delivered. Owned;
// touched only with the GIL. While set, this thread's host calls are skipped.
thread_local PyObject* t_pending = nullptr;
thread_local Clock::time_point t_pending_since;

PyObject* TakePending() {
  PyObject* exc = t_pending;
  t_pending = nullptr;
  return exc;
}

void RaiseObject(PyObject* exc) {  // steals `exc`
#if PY_VERSION_HEX >= 0x030C0000
  PyErr_SetRaisedException(exc);
#else
  PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc)), exc);
  Py_DECREF(exc);
#endif
}

// The exception being raised (new reference), clearing it; nullptr if none.
PyObject* PyErr_GetRaisedExceptionCompat() {
#if PY_VERSION_HEX >= 0x030C0000
  return PyErr_GetRaisedException();
#else
  PyObject *type, *value, *tb;
  PyErr_Fetch(&type, &value, &tb);
  PyErr_NormalizeException(&type, &value, &tb);
  if (tb != nullptr && value != nullptr) PyException_SetTraceback(value, tb);
  Py_XDECREF(type);
  Py_XDECREF(tb);
  return value;
#endif
}

// Py_AddPendingCall callback: runs on the main thread, with the GIL, between bytecodes.
int DeliverOnMainThread(void*) {
  PyObject* exc = TakePending();
  if (exc == nullptr) return 0;  // cancelled (the computation was aborted instead)
  RaiseObject(exc);
  return -1;
}

// Arrange for `exc` (borrowed) to be raised on this Python thread when it resumes
// running bytecode. False if that cannot be scheduled.
bool SchedulePending(PyObject* exc) {
  Py_XDECREF(TakePending());
  unsigned long me = PyThread_get_thread_ident();
  Py_INCREF(exc);
  t_pending = exc;
  t_pending_since = Clock::now();
  if (me == TheHooks().main_thread) {
    if (Py_AddPendingCall(DeliverOnMainThread, nullptr) == 0) return true;
  } else if (TheHooks().delivery_class != nullptr &&
             PyThreadState_SetAsyncExc(me, TheHooks().delivery_class) == 1) {
    return true;
  }
  Py_DECREF(TakePending());
  return false;
}

// Undo SchedulePending: the exception will be reported through XLA instead. Returns
// the exception (new reference).
PyObject* CancelPending() {
  unsigned long me = PyThread_get_thread_ident();
  if (me != TheHooks().main_thread) PyThreadState_SetAsyncExc(me, nullptr);
  return TakePending();  // the main thread's pending call then finds nothing
}

// ------------------------------------------------------------------ NumPy views
PyObject* NumpyDtype(ffi::DataType type) {  // built once, under the GIL
  static std::array<PyObject*, 64>* table = [] {
    auto* t = new std::array<PyObject*, 64>();
    t->fill(nullptr);
    py::module_ np = py::module_::import("numpy");
    auto set = [&](ffi::DataType dt, py::object dtype) {
      (*t)[static_cast<size_t>(dt)] = np.attr("dtype")(dtype).release().ptr();
    };
    set(ffi::DataType::PRED, py::str("bool"));
    set(ffi::DataType::S8, py::str("int8"));
    set(ffi::DataType::S16, py::str("int16"));
    set(ffi::DataType::S32, py::str("int32"));
    set(ffi::DataType::S64, py::str("int64"));
    set(ffi::DataType::U8, py::str("uint8"));
    set(ffi::DataType::U16, py::str("uint16"));
    set(ffi::DataType::U32, py::str("uint32"));
    set(ffi::DataType::U64, py::str("uint64"));
    set(ffi::DataType::F16, py::str("float16"));
    set(ffi::DataType::F32, py::str("float32"));
    set(ffi::DataType::F64, py::str("float64"));
    set(ffi::DataType::C64, py::str("complex64"));
    set(ffi::DataType::C128, py::str("complex128"));
    try {
      set(ffi::DataType::BF16, py::module_::import("ml_dtypes").attr("bfloat16"));
    } catch (const py::error_already_set&) {
      PyErr_Clear();  // bfloat16 stays unsupported without ml_dtypes
    }
    return t;
  }();
  size_t index = static_cast<size_t>(type);
  return index < table->size() ? (*table)[index] : nullptr;
}

void SetWritable(PyObject* a, bool writable) {
  auto& flags = py::detail::array_proxy(a)->flags;
  if (writable) {
    flags |= py::detail::npy_api::NPY_ARRAY_WRITEABLE_;
  } else {
    flags &= ~py::detail::npy_api::NPY_ARRAY_WRITEABLE_;
  }
}

// One XLA buffer as the callable sees it.
// Trivially constructible (no initializers): CollectSlots sets every field, and a call
// does not pay for zeroing Slots' inline storage.
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

// The views of one call. Every zero-copy view has `owner_` as its NumPy base: an
// empty array that owns its (empty) data, where NumPy stops collapsing base chains. A
// view derived from one of ours (slice, reshape, transpose) therefore also refers to
// `owner_`, not to our view, so after the call Py_REFCNT(view) > 1 means "kept
// directly" and Py_REFCNT(owner_) counts the derived views still alive. The views live
// only in the two tuples handed to the callable.
//
// Reuse: building two tuples and a NumPy array per buffer costs about as much as the
// rest of a call at small sizes. After a call that kept nothing, the views go back to
// their callable's registry entry, and the next call with the same shapes and dtypes
// (every call of one compiled program) only points them at the new buffers.
class CallViews {
 public:
  CallViews(const Slots& ins, const Slots& outs, bool copy)
      : copy_(copy) {
    if (!copy_) owner_ = Owner();
    ins_ = Tuple(ins);
    outs_ = Tuple(outs);
  }
  bool ok() const { return error_.empty(); }
  const std::string& error() const { return error_; }
  const py::tuple& ins() const { return ins_; }
  const py::tuple& outs() const { return outs_; }

  // Point the views of an earlier call at this call's buffers; false (nothing changed)
  // unless every view still has the slot's dtype and shape and is ours, contiguous.
  bool Rebind(const Slots& ins, const Slots& outs) {
    if (copy_ || !Fits(ins_, ins) || !Fits(outs_, outs)) return false;
    Point(ins_, ins);
    Point(outs_, outs);
    return true;
  }

  // Copy mode: the callable filled arrays of its own; write them to XLA's buffers.
  void CopyOutputsBack(const Slots& outs) const {
    if (!copy_) return;
    for (size_t i = 0; i < outs.size(); ++i) {
      if (outs[i].bytes) std::memcpy(outs[i].data, View(outs_, i).data(), outs[i].bytes);
    }
  }

  // Which views outlive the call (beyond our own references), and how many views
  // derived from them are alive. Call after the callable returned.
  struct Kept {
    std::vector<int> ins, outs;  // indices of kept views
    Py_ssize_t derived = 0;
    bool any() const { return !ins.empty() || !outs.empty() || derived > 0; }
  };
  Kept Check() const {
    Kept kept;
    if (copy_) return kept;
    Py_ssize_t based = 0;
    auto scan = [&](const py::tuple& views, std::vector<int>* out) {
      bool tuple_kept = Py_REFCNT(views.ptr()) > 1;  // the callable kept the tuple itself
      for (Py_ssize_t i = 0, n = PyTuple_GET_SIZE(views.ptr()); i < n; ++i) {
        PyObject* view = PyTuple_GET_ITEM(views.ptr(), i);
        if (py::detail::array_proxy(view)->base == owner_.ptr()) ++based;
        if (tuple_kept || Py_REFCNT(view) > 1) out->push_back(static_cast<int>(i));
      }
    };
    scan(ins_, &kept.ins);
    scan(outs_, &kept.outs);
    kept.derived = Py_REFCNT(owner_.ptr()) - 1 - based;  // minus ours
    return kept;
  }

  // Give kept top-level views a private copy of their data (NumPy code holding them
  // keeps working). Views derived from them cannot be found, hence KeptViewError.
  void Detach(const Kept& kept) {
    for (int i : kept.ins) DetachOne(PyTuple_GET_ITEM(ins_.ptr(), i));
    for (int i : kept.outs) DetachOne(PyTuple_GET_ITEM(outs_.ptr(), i));
  }

 private:
  static py::array View(const py::tuple& views, size_t i) {
    return py::reinterpret_borrow<py::array>(PyTuple_GET_ITEM(views.ptr(), i));
  }

  bool Fits(const py::tuple& views, const Slots& slots) const {
    if (static_cast<size_t>(PyTuple_GET_SIZE(views.ptr())) != slots.size()) return false;
    for (size_t i = 0; i < slots.size(); ++i) {
      auto* fields = py::detail::array_proxy(PyTuple_GET_ITEM(views.ptr(), i));
      const Slot& s = slots[i];
      if (fields->base != owner_.ptr() || fields->descr != NumpyDtype(s.type) ||
          fields->nd != static_cast<int>(s.rank) ||
          !(fields->flags & py::detail::npy_api::NPY_ARRAY_C_CONTIGUOUS_)) {
        return false;
      }
      for (size_t d = 0; d < s.rank; ++d) {
        if (fields->dimensions[d] != s.dims[d]) return false;
      }
    }
    return true;
  }

  static void Point(const py::tuple& views, const Slots& slots) {
    for (size_t i = 0; i < slots.size(); ++i) {
      PyObject* view = PyTuple_GET_ITEM(views.ptr(), i);
      py::detail::array_proxy(view)->data = static_cast<char*>(slots[i].data);
      SetWritable(view, slots[i].writable);
    }
  }

  py::tuple Tuple(const Slots& slots) {
    py::tuple t(slots.size());
    for (size_t i = 0; i < slots.size(); ++i) t[i] = Make(slots[i]);
    // Holds only arrays, which cannot form reference cycles: keep it out of the cyclic
    // collector, which otherwise runs every few hundred host calls.
    PyObject_GC_UnTrack(t.ptr());
    return t;
  }

  py::array Make(const Slot& s) {
    PyObject* dtype = NumpyDtype(s.type);
    if (dtype == nullptr) {
      error_ = "jaxbridge host call: unsupported element type code " +
               std::to_string(static_cast<int>(s.type));
      return py::array();
    }
    auto descr = py::reinterpret_borrow<py::dtype>(dtype);
    py::array a;
    if (copy_) {
      a = py::array(descr, s.shape());
      if (s.bytes) std::memcpy(a.mutable_data(), s.data, s.bytes);
    } else {
      a = py::array(descr, s.shape(), s.data, owner_);
    }
    SetWritable(a.ptr(), s.writable);
    return a;
  }

  static void DetachOne(PyObject* view_ptr) {
    auto view = py::reinterpret_borrow<py::array>(view_ptr);
    auto* fields = py::detail::array_proxy(view.ptr());
    bool writable = fields->flags & py::detail::npy_api::NPY_ARRAY_WRITEABLE_;
    py::array copy(view.dtype(), std::vector<py::ssize_t>(view.shape(),
                                                          view.shape() + view.ndim()));
    if (view.nbytes()) std::memcpy(copy.mutable_data(), view.data(), view.nbytes());
    fields->data = static_cast<char*>(copy.mutable_data());
    PyObject* old_base = fields->base;
    fields->base = copy.release().ptr();
    Py_XDECREF(old_base);
    SetWritable(view.ptr(), writable);
  }

  // A fresh owner per set of views (reused sets keep theirs).
  static py::object Owner() {
    return py::array(py::reinterpret_borrow<py::dtype>(NumpyDtype(ffi::DataType::U8)),
                     std::vector<py::ssize_t>{0});
  }

  bool copy_;
  py::object owner_;
  py::tuple ins_, outs_;
  std::string error_;
};

// ------------------------------------------------------------------ one host call
std::string PythonErrorText() {
  py::error_already_set err;  // fetches and clears
  return std::string("jaxbridge host call: ") + err.what();
}

// The outputs of a failed or skipped call: NaN in floating-point results (so that a
// loop testing convergence, `while err > tol` or `while x < limit`, ends at once
// instead of spinning on zeros), zeros elsewhere. Nobody sees these values: the
// exception is raised when the computation returns.
template <typename Bits>
void FillBits(void* data, size_t bytes, Bits bits) {
  Bits* p = static_cast<Bits*>(data);
  for (size_t i = 0, n = bytes / sizeof(Bits); i < n; ++i) p[i] = bits;
}

void FailedFill(const Slots& outs) {
  for (const Slot& s : outs) {
    if (!s.bytes) continue;
    switch (s.type) {
      case ffi::DataType::F16:
        FillBits<uint16_t>(s.data, s.bytes, 0x7e00);
        break;
      case ffi::DataType::BF16:
        FillBits<uint16_t>(s.data, s.bytes, 0x7fc0);
        break;
      case ffi::DataType::F32:
      case ffi::DataType::C64:
        FillBits<uint32_t>(s.data, s.bytes, 0x7fc00000u);
        break;
      case ffi::DataType::F64:
      case ffi::DataType::C128:
        FillBits<uint64_t>(s.data, s.bytes, 0x7ff8000000000000ull);
        break;
      default:
        std::memset(s.data, 0, s.bytes);
    }
  }
}

ffi::Error Failure(const std::string& message) {
  return ffi::Error(ffi::ErrorCode::kUnknown, message);
}

// The failure `exc` (stolen) of a call on this thread: delivered to the calling Python
// thread, or reported through XLA with a message from the handler.
ffi::Error Report(PyObject* exc, PyObject* handler, bool python_thread,
                  const Slots& outs) {
  bool base_only = !PyErr_GivenExceptionMatches(exc, PyExc_Exception);
  PyObject* noted = PyObject_CallMethod(handler, "annotate", "O", exc);
  if (noted == nullptr) PyErr_Clear();
  Py_XDECREF(noted);
  if (python_thread && SchedulePending(exc)) {
    Py_DECREF(exc);
    FailedFill(outs);
    return ffi::Error::Success();
  }
  if (!python_thread && base_only &&
      PyThread_get_thread_ident() != TheHooks().main_thread) {
    // KeyboardInterrupt / SystemExit in a worker: also surface it in the main thread,
    // so that `except Exception` retry loops there cannot swallow it.
    Py_INCREF(exc);
    PyObject* keep = exc;
    if (Py_AddPendingCall(
            [](void* e) -> int {
              RaiseObject(static_cast<PyObject*>(e));
              return -1;
            },
            keep) != 0) {
      Py_DECREF(keep);
    }
  }
  std::string message;
  PyObject* text = PyObject_CallMethod(handler, "failure_message", "O", exc);
  if (text != nullptr && PyUnicode_Check(text)) {
    const char* utf8 = PyUnicode_AsUTF8(text);
    message = utf8 ? utf8 : "";
  }
  if (text == nullptr || message.empty()) {
    PyErr_Clear();
    message = "jaxbridge host call failed (the error message could not be formatted)";
  }
  Py_XDECREF(text);
  Py_DECREF(exc);
  return Failure(message);
}

// The kept-view policy after a call (see the file comment). Returns the exception to
// report (new reference), `exc` itself (stolen) when the call had already failed, or
// nullptr when all is well.
PyObject* ResolveKept(CallViews& views, Entry& entry, PyObject* exc) {
  CallViews::Kept kept = views.Check();
  if (!kept.any()) return exc;
  // A call that raised keeps its views through its traceback's frames, which the
  // exception we hold keeps alive: no collection frees them, and a full one costs
  // ~0.3 s in a process of a few million objects, once per failing call. So collect
  // only after a call that returned.
  if (exc == nullptr) {
    PyObject* collected = PyObject_CallNoArgs(TheHooks().gc_collect);
    if (collected == nullptr) PyErr_Clear();
    Py_XDECREF(collected);
    kept = views.Check();
    // It kept views (or made reference cycles holding them): copies from now on.
    entry.copy = true;
    PyObject* r = PyObject_CallMethod(entry.handler, "started_copying", nullptr);
    if (r == nullptr) PyErr_Clear();
    Py_XDECREF(r);
  }
  if (!kept.any()) return exc;
  views.Detach(kept);
  if (exc != nullptr) {
    // The callable raised and its traceback holds views. Detached ones are safe to
    // inspect; derived ones cannot be fixed, so the frames' locals are cleared.
    if (views.Check().derived > 0) {
      PyObject* tb = PyException_GetTraceback(exc);
      if (tb != nullptr) {
        PyObject* r = PyObject_CallOneArg(TheHooks().clear_frames, tb);
        if (r == nullptr) PyErr_Clear();
        Py_XDECREF(r);
        Py_DECREF(tb);
      }
    }
    return exc;
  }
  py::list ins, outs;
  for (int i : kept.ins) ins.append(i);
  for (int i : kept.outs) outs.append(i);
  PyObject* err = PyObject_CallMethod(entry.handler, "kept_view_error", "OOn", ins.ptr(),
                                      outs.ptr(), kept.derived);
  if (err == nullptr) {  // building the error failed: report that error instead
    err = PyErr_GetRaisedExceptionCompat();
  }
  return err;
}

// ------------------------------------------------------------------ the direct call
// The common host functions -- plain array arguments, one result, no keyword arguments
// -- are called here without their Python `fill` wrapper (one Python frame, a keyword
// dict and a NumPy assignment less per call; see runners.direct in
// jaxbridge/_foreign/runners.py):
//   kDirectReturns  value = fun(*ins); a C-contiguous ndarray of the output's dtype
//                   and shape is copied into the output here, anything else goes to
//                   finish(value, outs), which checks it and fills the output or raises;
//   kDirectOut      value = fun(*ins, out=outs[0]); None is done, anything else goes to
//                   finish(value, outs), which raises;
//   kDirectAdjoint  a VJP rule: value = fun(ins[:n_in], ins[n_in], ins[n_in + 1]), a
//                   tuple of n_in cotangents of which those at `live` are the outputs;
//                   exact ndarrays are copied here, anything else goes to finish;
//   kDirectAdjointOut  a VJP rule with out=True: fun(ins[:n_in], ins[n_in], ins[n_in + 1],
//                   out=target), target[live[j]] = outs[j] and None elsewhere; None
//                   is done, anything else goes to finish (which raises).
constexpr int kDirectReturns = 1;
constexpr int kDirectOut = 2;
constexpr int kDirectAdjoint = 3;
constexpr int kDirectAdjointOut = 4;

// Whether this call's operands and results fit the direct call of `entry`.
bool CanCallDirect(const Entry& entry, const Slots& ins, const Slots& outs) {
  switch (entry.direct_kind) {
    case kDirectReturns:
    case kDirectOut:
      return outs.size() == 1;
    case kDirectAdjoint:
    case kDirectAdjointOut:
      return static_cast<Py_ssize_t>(ins.size()) == entry.direct_n_in + 2 &&
             outs.size() == entry.direct_live.size();
    default:
      return false;
  }
}

// ("out",), built once under the GIL, never freed. Interned, like the parameter names
// of compiled code, so that CPython matches the keyword by identity.
PyObject* OutKeyword() {
  static PyObject* names = [] {
    PyObject* out = PyUnicode_InternFromString("out");
    PyObject* tuple = PyTuple_Pack(1, out);
    Py_DECREF(out);
    return tuple;
  }();
  return names;
}

// Copy `value` into the output view `out` (of `bytes` bytes) if it is exactly what was
// declared.
bool TakeResult(PyObject* value, PyObject* out, size_t bytes) {
  if (Py_TYPE(value) != py::detail::npy_api::get().PyArray_Type_) return false;
  auto* got = py::detail::array_proxy(value);
  auto* want = py::detail::array_proxy(out);
  if (got->descr != want->descr || got->nd != want->nd ||
      !(got->flags & py::detail::npy_api::NPY_ARRAY_C_CONTIGUOUS_)) {
    return false;
  }
  for (int d = 0; d < want->nd; ++d) {
    if (got->dimensions[d] != want->dimensions[d]) return false;
  }
  // memmove: a function that returns its (aliased) input gives the output's own memory.
  if (bytes != 0 && got->data != want->data) std::memmove(want->data, got->data, bytes);
  return true;
}

// The callable's result (a new reference; nullptr with the exception set).
PyObject* CallDirect(const Entry& entry, const CallViews& views, const Slots& out_slots) {
  PyObject* fun = entry.direct_fun;
  PyObject* finish = entry.direct_finish;
  int kind = entry.direct_kind;
  PyObject* ins = views.ins().ptr();
  PyObject* outs = views.outs().ptr();
  Py_ssize_t n = PyTuple_GET_SIZE(ins);
  constexpr Py_ssize_t kStack = 8;
  PyObject* stack[kStack + 2];
  std::vector<PyObject*> heap;
  PyObject** args = stack;
  if (n > kStack) {
    heap.resize(static_cast<size_t>(n) + 2);
    args = heap.data();
  }
  args[0] = nullptr;  // PY_VECTORCALL_ARGUMENTS_OFFSET: the callee may use this slot
  PyObject* keywords = nullptr;
  PyObject* primals = nullptr;
  PyObject* target = nullptr;
  Py_ssize_t nargs = n;
  if (kind == kDirectAdjoint || kind == kDirectAdjointOut) {  // (primals, out, cotangent)
    primals = PyTuple_GetSlice(ins, 0, entry.direct_n_in);
    if (primals == nullptr) return nullptr;
    args[1] = primals;
    args[2] = PyTuple_GET_ITEM(ins, entry.direct_n_in);
    args[3] = PyTuple_GET_ITEM(ins, entry.direct_n_in + 1);
    nargs = 3;
    if (kind == kDirectAdjointOut) {  // out=: one entry per input, None where not needed
      target = PyTuple_New(entry.direct_n_in);
      if (target == nullptr) {
        Py_DECREF(primals);
        return nullptr;
      }
      std::vector<PyObject*> items(static_cast<size_t>(entry.direct_n_in), Py_None);
      for (size_t j = 0; j < entry.direct_live.size(); ++j) {
        items[static_cast<size_t>(entry.direct_live[j])] = PyTuple_GET_ITEM(outs, j);
      }
      for (Py_ssize_t i = 0; i < entry.direct_n_in; ++i) {
        Py_INCREF(items[i]);
        PyTuple_SET_ITEM(target, i, items[i]);
      }
      args[4] = target;
      keywords = OutKeyword();
    }
  } else {
    for (Py_ssize_t i = 0; i < n; ++i) args[i + 1] = PyTuple_GET_ITEM(ins, i);
    if (kind == kDirectOut) {
      args[n + 1] = PyTuple_GET_ITEM(outs, 0);
      keywords = OutKeyword();
    }
  }
  Py_INCREF(fun);  // the callable may drop its registration while it runs
  Py_INCREF(finish);
  PyObject* value = PyObject_Vectorcall(
      fun, args + 1, static_cast<size_t>(nargs) | PY_VECTORCALL_ARGUMENTS_OFFSET, keywords);
  Py_XDECREF(primals);  // before the kept-view check, like the value below
  Py_XDECREF(target);
  PyObject* result = value;
  if (value != nullptr) {
    bool done;
    if (kind == kDirectOut || kind == kDirectAdjointOut) {
      done = value == Py_None;
    } else if (kind == kDirectReturns) {
      done = TakeResult(value, PyTuple_GET_ITEM(outs, 0), out_slots[0].bytes);
    } else {
      done = PyTuple_CheckExact(value) && PyTuple_GET_SIZE(value) == entry.direct_n_in;
      for (size_t j = 0; done && j < entry.direct_live.size(); ++j) {
        done = TakeResult(PyTuple_GET_ITEM(value, entry.direct_live[j]),
                          PyTuple_GET_ITEM(outs, j), out_slots[j].bytes);
      }  // a partial copy is harmless: finish writes every output
    }
    if (done) {
      Py_INCREF(Py_None);
      result = Py_None;
    } else {
      PyObject* pair[2] = {value, outs};
      result = PyObject_Vectorcall(finish, pair, 2, nullptr);
    }
    Py_DECREF(value);  // before the kept-view check: a returned view is not kept
  }
  Py_DECREF(finish);
  Py_DECREF(fun);
  return result;
}

// Runs the callable registered under `callback_id` on `ins`/`outs`.
ffi::Error InvokeOnHost(int64_t callback_id, const Slots& ins,
                        const Slots& outs) {
  InFlight in_flight;
  if (!in_flight.entered()) {
    if (OnPythonThread() && PyThread_get_thread_ident() != TheHooks().main_thread) {
      in_flight.Leave();
      Park();
    }
    return Failure(
        "jaxbridge host call: the Python interpreter is shutting down, so the host "
        "function was not called");
  }
  BlasCap blas;  // its own lock, not the GIL: less time holding the GIL under sharding
  Gil gil;
  if (t_pending != nullptr) {  // an earlier call on this thread raised: skip
    double waited = std::chrono::duration<double>(Clock::now() - t_pending_since).count();
    if (waited <= kMaxSkipSeconds) {
      FailedFill(outs);
      return ffi::Error::Success();
    }
    PyObject* exc = CancelPending();
    auto it = Registry().find(callback_id);
    if (it == Registry().end()) {
      Py_DECREF(exc);
      return Failure("jaxbridge host call: aborted after an earlier host call raised");
    }
    return Report(exc, it->second.handler, /*python_thread=*/false, outs);
  }
  auto it = Registry().find(callback_id);
  if (it == Registry().end()) {
    return ffi::Error(ffi::ErrorCode::kFailedPrecondition,
                      "jaxbridge host call: callback " + std::to_string(callback_id) +
                          " is no longer registered (its function was garbage collected "
                          "while a compiled program still used it)");
  }
  Entry& entry = it->second;
  py::object handler = py::reinterpret_borrow<py::object>(entry.handler);  // keep alive
  try {
    // The spare views of an earlier call if they fit (taken: a call on another thread,
    // while this one releases the GIL, builds its own), else new ones.
    std::unique_ptr<CallViews> views;
    if (!entry.copy) views = std::move(entry.spare);
    if (views == nullptr || !views->Rebind(ins, outs)) {
      views = std::make_unique<CallViews>(ins, outs, entry.copy);
    }
    if (!views->ok()) return ffi::Error::InvalidArgument(views->error());
    PyObject* exc = nullptr;
    PyObject* result;
    if (CanCallDirect(entry, ins, outs)) {
      result = CallDirect(entry, *views, outs);
    } else {
      PyObject* args[2] = {views->ins().ptr(), views->outs().ptr()};
      result = PyObject_Vectorcall(entry.fill, args, 2, nullptr);
    }
    if (result == nullptr) {
      exc = PyErr_GetRaisedExceptionCompat();
    } else {
      Py_DECREF(result);
    }
    bool clean = exc == nullptr && !entry.copy && !views->Check().any();
    exc = ResolveKept(*views, entry, exc);
    if (exc != nullptr) return Report(exc, entry.handler, gil.python_thread(), outs);
    views->CopyOutputsBack(outs);
    if (clean && Registry().count(callback_id) && entry.spare == nullptr) {
      entry.spare = std::move(views);
    }
  } catch (const py::error_already_set&) {
    return Failure(PythonErrorText());
  } catch (const std::exception& e) {
    return Failure(std::string("jaxbridge host call: ") + e.what());
  }
  return ffi::Error::Success();
}

ffi::Error CollectSlots(ffi::RemainingArgs args, ffi::RemainingRets rets, Slots* ins,
                        Slots* outs) {
  for (size_t i = 0; i < args.size(); ++i) {
    auto buffer = args.get<ffi::AnyBuffer>(i);
    if (buffer.has_error()) return buffer.error();
    auto dims = buffer->dimensions();
    Slot s;
    s.type = buffer->element_type();
    s.dims = dims.begin();
    s.rank = dims.size();
    s.data = buffer->untyped_data();
    s.bytes = buffer->size_bytes();
    s.writable = false;
    ins->push_back(s);
  }
  for (size_t i = 0; i < rets.size(); ++i) {
    auto buffer = rets.get<ffi::AnyBuffer>(i);
    if (buffer.has_error()) return buffer.error();
    auto dims = (*buffer)->dimensions();
    Slot s;
    s.type = (*buffer)->element_type();
    s.dims = dims.begin();
    s.rank = dims.size();
    s.data = (*buffer)->untyped_data();
    s.bytes = (*buffer)->size_bytes();
    s.writable = true;
    outs->push_back(s);
  }
  return ffi::Error::Success();
}

ffi::Error HostCallCpu(ffi::RemainingArgs args, ffi::RemainingRets rets, int64_t callback_id) {
  Slots ins, outs;
  if (ffi::Error e = CollectSlots(args, rets, &ins, &outs); e.failure()) return e;
  return InvokeOnHost(callback_id, ins, outs);
}

// Device buffers as DLPack capsules for callables that take them (jaxbridge.torch).
#include "device_call.inc"

#ifdef JAXBRIDGE_WITH_CUDA
// GPU: stage through pinned host memory on XLA's stream. One staging block per call
// covers every operand and result (aligned to 256 bytes); the stream is synchronized
// once before the Python call and once after the copies back, because the staging
// memory is reused by the next call on this thread.
struct PinnedStaging {
  void* data = nullptr;
  size_t capacity = 0;
  ~PinnedStaging() {
    if (data != nullptr) cudaFreeHost(data);
  }
  cudaError_t Reserve(size_t bytes) {
    if (bytes <= capacity) return cudaSuccess;
    if (data != nullptr) cudaFreeHost(data);
    data = nullptr;
    capacity = 0;
    cudaError_t status = cudaMallocHost(&data, bytes);
    if (status == cudaSuccess) capacity = bytes;
    return status;
  }
};

ffi::Error CudaError(const char* what, cudaError_t status) {
  return ffi::Error::Internal(std::string("jaxbridge host call (CUDA): ") + what +
                              " failed: " + cudaGetErrorString(status));
}

size_t Aligned(size_t bytes) { return (bytes + 255) & ~size_t{255}; }

ffi::Error HostCallCuda(cudaStream_t stream, int32_t device, ffi::RemainingArgs args,
                        ffi::RemainingRets rets, int64_t callback_id) {
  thread_local PinnedStaging staging;
  Slots device_ins, device_outs;
  if (ffi::Error e = CollectSlots(args, rets, &device_ins, &device_outs); e.failure()) {
    return e;
  }
  if (HasDeviceFill(callback_id)) {  // no staging: see device_call.inc
    return InvokeOnDevice(callback_id, device_ins, device_outs, stream, device);
  }
  // A result XLA writes into an operand's buffer (aliases=) shares that operand's
  // staging too: the callable sees the same in-place memory as on the CPU, and the
  // staging block holds one copy of it.
  size_t total = 0;
  for (const Slot& s : device_ins) total += Aligned(s.bytes);
  std::vector<int> staged_with(device_outs.size(), -1);
  for (size_t j = 0; j < device_outs.size(); ++j) {
    for (size_t i = 0; i < device_ins.size() && staged_with[j] < 0; ++i) {
      if (device_outs[j].bytes > 0 && device_ins[i].data == device_outs[j].data &&
          device_ins[i].bytes == device_outs[j].bytes) {
        staged_with[j] = static_cast<int>(i);
      }
    }
    if (staged_with[j] < 0) total += Aligned(device_outs[j].bytes);
  }
  if (cudaError_t s = staging.Reserve(total > 0 ? total : 1); s != cudaSuccess) {
    return CudaError("cudaMallocHost", s);
  }
  Slots ins = device_ins, outs = device_outs;
  char* cursor = static_cast<char*>(staging.data);
  for (size_t i = 0; i < ins.size(); ++i) {
    ins[i].data = cursor;
    if (ins[i].bytes > 0) {
      cudaError_t s = cudaMemcpyAsync(cursor, device_ins[i].data, ins[i].bytes,
                                      cudaMemcpyDeviceToHost, stream);
      if (s != cudaSuccess) return CudaError("cudaMemcpyAsync (device to host)", s);
    }
    cursor += Aligned(ins[i].bytes);
  }
  for (size_t j = 0; j < outs.size(); ++j) {
    if (staged_with[j] >= 0) {
      outs[j].data = ins[staged_with[j]].data;
      continue;
    }
    outs[j].data = cursor;
    cursor += Aligned(outs[j].bytes);
  }
  if (cudaError_t s = cudaStreamSynchronize(stream); s != cudaSuccess) {
    return CudaError("cudaStreamSynchronize", s);
  }
  ffi::Error status = InvokeOnHost(callback_id, ins, outs);
  if (status.failure()) return status;
  for (size_t i = 0; i < outs.size(); ++i) {
    if (outs[i].bytes == 0) continue;
    cudaError_t s = cudaMemcpyAsync(device_outs[i].data, outs[i].data, outs[i].bytes,
                                    cudaMemcpyHostToDevice, stream);
    if (s != cudaSuccess) return CudaError("cudaMemcpyAsync (host to device)", s);
  }
  if (cudaError_t s = cudaStreamSynchronize(stream); s != cudaSuccess) {
    return CudaError("cudaStreamSynchronize", s);
  }
  return ffi::Error::Success();
}
#endif  // JAXBRIDGE_WITH_CUDA

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(kJaxbridgeHostCallCpu, HostCallCpu,
                              ffi::Ffi::Bind()
                                  .RemainingArgs()                 // operands, any dtype
                                  .RemainingRets()                 // results, any dtype
                                  .Attr<int64_t>("callback_id"));  // registry key

#ifdef JAXBRIDGE_WITH_CUDA
XLA_FFI_DEFINE_HANDLER_SYMBOL(kJaxbridgeHostCallCuda, HostCallCuda,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()  // XLA's stream
                                  .Ctx<ffi::DeviceOrdinal>()       // its device
                                  .RemainingArgs()                 // device operands
                                  .RemainingRets()                 // device results
                                  .Attr<int64_t>("callback_id"));  // registry key
#endif

template <typename T>
py::capsule EncapsulateFfiHandler(T* fn) {
  return py::capsule(reinterpret_cast<void*>(fn));
}

PYBIND11_MODULE(_native, m) {
  m.doc() = "jaxbridge native host-call trampoline (XLA FFI)";
  m.def("registrations", []() {
    py::dict cpu;
    cpu["jaxbridge_host_call"] = EncapsulateFfiHandler(kJaxbridgeHostCallCpu);
    py::dict out;
    out["cpu"] = cpu;
#ifdef JAXBRIDGE_WITH_CUDA
    py::dict cuda;
    cuda["jaxbridge_host_call"] = EncapsulateFfiHandler(kJaxbridgeHostCallCuda);
    out["CUDA"] = cuda;
#endif
    return out;
  }, "FFI handler capsules by platform: {platform: {target_name: capsule}}.");
  m.def("install_hooks", [](py::object delivery_class, py::object gc_collect,
                            py::object clear_frames, unsigned long main_thread) {
    Hooks& hooks = TheHooks();
    hooks.delivery_class = delivery_class.release().ptr();
    hooks.gc_collect = gc_collect.release().ptr();
    hooks.clear_frames = clear_frames.release().ptr();
    hooks.main_thread = main_thread;
  }, "Called once by jaxbridge._hostcall with the Python objects the handler needs.");
  m.def("register_callback", [](int64_t callback_id, py::handle fill, py::handle handler,
                                py::object direct) {
    Entry entry{fill.ptr(), handler.ptr(), false};  // borrowed
    if (!direct.is_none()) {  // (fun, kind, finish[, n_in, live]): see CallDirect
      auto parts = direct.cast<py::tuple>();
      int kind = parts.size() >= 3 ? parts[1].cast<int>() : 0;
      bool ok = (parts.size() == 3 && (kind == kDirectReturns || kind == kDirectOut)) ||
                (parts.size() == 5 && (kind == kDirectAdjoint || kind == kDirectAdjointOut));
      if (!ok) {
        throw py::value_error(
            "register_callback: direct must be (fun, 1 or 2, finish) or "
            "(fun, 3 or 4, finish, n_in, live)");
      }
      entry.direct_fun = parts[0].ptr();
      entry.direct_kind = kind;
      entry.direct_finish = parts[2].ptr();
      if (kind == kDirectAdjoint || kind == kDirectAdjointOut) {
        entry.direct_n_in = parts[3].cast<Py_ssize_t>();
        entry.direct_live = parts[4].cast<std::vector<int>>();
        for (int i : entry.direct_live) {
          if (i < 0 || i >= entry.direct_n_in) throw py::value_error("register_callback: live");
        }
      }
    }
    Registry()[callback_id] = std::move(entry);
  }, py::arg("callback_id"), py::arg("fill"), py::arg("handler"),
     py::arg("direct") = py::none(),
     "Register `fill` under `callback_id`; `direct` = (fun, kind, finish[, n_in, live]) "
     "lets the handler call `fun` itself (kind 1: fun(*ins) returns the one result; kind "
     "2: fun(*ins, out=outs[0]) returns None; kind 3: a VJP rule, fun(ins[:n_in], "
     "ins[n_in], ins[n_in + 1]) returns n_in cotangents, those at `live` are the outputs; "
     "kind 4: the same rule called with out=, a tuple of the outputs at `live`, None "
     "elsewhere, returns None) "
     "and hand anything else to finish(value, outs). All are borrowed: `handler` must "
     "keep them alive.");
  m.def("unregister_callback", [](int64_t callback_id) {
    Registry().erase(callback_id);
    ForgetDeviceFill(callback_id);
  },
        py::arg("callback_id"));
  m.def("num_registered", []() { return Registry().size(); });
  m.def("copies_inputs", [](int64_t callback_id) {
    auto it = Registry().find(callback_id);
    return it != Registry().end() && it->second.copy;
  }, "Whether the callable gets copies (it kept a view once) instead of zero-copy views.");
  m.def("set_copies_inputs", [](int64_t callback_id, bool copy) {
    auto it = Registry().find(callback_id);
    if (it != Registry().end()) it->second.copy = copy;
  });
  m.def("take_pending", []() -> py::object {
    PyObject* exc = TakePending();
    if (exc == nullptr) return py::none();
    return py::reinterpret_steal<py::object>(exc);
  }, "The undelivered exception of this thread (used by the delivery class).");
  m.def("set_blas_limit", [](int limit, const std::vector<std::pair<uintptr_t, uintptr_t>>& fns) {
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
  }, py::arg("limit"), py::arg("functions"),
     "Cap BLAS threads at `limit` during host calls (0: never); `functions` are the "
     "(get_num_threads, set_num_threads) addresses of each loaded BLAS library.");
  DefineDeviceCall(m);
  m.def("begin_shutdown", &BeginShutdown, py::arg("timeout_seconds"),
        "atexit: refuse new host calls and wait for those in flight.");
#ifdef JAXBRIDGE_WITH_CUDA
  m.attr("with_cuda") = true;
#else
  m.attr("with_cuda") = false;
#endif
  m.attr("__version__") = JAXBRIDGE_VERSION;
}
