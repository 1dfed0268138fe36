// One host call: the GIL, the registry entry, the views, the callable, the checks after
// it; and the XLA FFI handler that makes it on the CPU.
#include "internal.h"

#if defined(__x86_64__) || defined(__i386__) || defined(_M_X64)
#include <xmmintrin.h>
#endif

namespace jaxbridge::hostcall {
namespace {

// IEEE's default floating point for Python code (see Gil::fp_state_): on x86 the MXCSR
// bits flush-to-zero (15) and denormals-are-zero (6), on AArch64 FPCR's FZ (24).
uint64_t ClearFlushToZero() {
#if defined(__x86_64__) || defined(__i386__) || defined(_M_X64)
  unsigned int csr = _mm_getcsr();
  if (csr & 0x8040u) _mm_setcsr(csr & ~0x8040u);
  return csr;
#elif defined(__aarch64__)
  uint64_t fpcr;
  __asm__ __volatile__("mrs %0, fpcr" : "=r"(fpcr));
  if (fpcr & (1ull << 24)) {
    uint64_t cleared = fpcr & ~(1ull << 24);
    __asm__ __volatile__("msr fpcr, %0" : : "r"(cleared));
  }
  return fpcr;
#else
  return 0;
#endif
}

void RestoreFloatingPoint(uint64_t state) {
#if defined(__x86_64__) || defined(__i386__) || defined(_M_X64)
  if (static_cast<unsigned int>(state) != _mm_getcsr()) {
    _mm_setcsr(static_cast<unsigned int>(state));
  }
#elif defined(__aarch64__)
  __asm__ __volatile__("msr fpcr, %0" : : "r"(state));
#else
  (void)state;
#endif
}

// Threads Python knows (the main thread, threading.Thread) use their own thread state.
// On XLA's worker threads PyGILState_Ensure would create and delete a state on every
// call (~15 us); one extra Ensure, never released, keeps the first state for the
// thread's life.
thread_local bool t_state_kept = false;

}  // namespace

bool OnPythonThread() {
  return !t_state_kept && PyGILState_GetThisThreadState() != nullptr;
}

Gil::Gil(bool worker) {
  python_thread_ = !worker && OnPythonThread();
  state_ = PyGILState_Ensure();
  if (!python_thread_ && !t_state_kept) {
    PyGILState_Ensure();
    t_state_kept = true;
  }
  fp_state_ = ClearFlushToZero();
}

Gil::~Gil() {
  RestoreFloatingPoint(fp_state_);
  PyGILState_Release(state_);
}

ffi::Error InvokeOnHost(int64_t callback_id, const Slots& ins, const Slots& outs,
                        bool worker) {
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
  Gil gil(worker);
  if (HasPending()) {  // an earlier call on this thread raised: skip
    if (PendingSeconds() <= kMaxSkipSeconds) {
      FailedFill(outs);
      return ffi::Error::Success();
    }
    PyObject* exc = CancelPending();
    std::shared_ptr<Entry> entry = FindEntry(callback_id);
    if (entry == nullptr) {
      Py_DECREF(exc);
      return Failure("jaxbridge host call: aborted after an earlier host call raised");
    }
    return Report(exc, entry->handler, /*python_thread=*/false, outs);
  }
  std::shared_ptr<Entry> held = FindEntry(callback_id);  // held until the call is done
  if (held == nullptr) {
    return ffi::Error(ffi::ErrorCode::kFailedPrecondition,
                      "jaxbridge host call: callback " + std::to_string(callback_id) +
                          " is no longer registered (its function was garbage collected "
                          "while a compiled program still used it)");
  }
  Entry& entry = *held;
  const int64_t started = entry.started++;
  py::object handler = py::reinterpret_borrow<py::object>(entry.handler);
  ThreadBudget threads(&entry);
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
      exc = FetchRaisedException();
    } else {
      Py_DECREF(result);
    }
    bool clean = exc == nullptr && !entry.copy && !views->Check().any();
    exc = ResolveKept(*views, entry, exc);
    if (exc != nullptr) {
      return Report(exc, entry.handler, gil.python_thread(), outs, started);
    }
    views->CopyOutputsBack(outs);
    if (clean && entry.spare == nullptr) {
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

namespace {

// The XLA element type of a NumPy dtype (a descr seen before is found by identity).
bool ElementType(PyObject* descr, ffi::DataType* out) {
  static auto* seen = new std::unordered_map<PyObject*, ffi::DataType>();
  auto found = seen->find(descr);
  if (found != seen->end()) {
    *out = found->second;
    return true;
  }
  for (int code = 0; code < 64; ++code) {
    auto type = static_cast<ffi::DataType>(code);
    PyObject* dtype = NumpyDtype(type);
    if (dtype == nullptr) continue;
    int equal = PyObject_RichCompareBool(descr, dtype, Py_EQ);
    if (equal < 0) PyErr_Clear();
    if (equal == 1) {
      Py_INCREF(descr);  // the cache's key stays valid
      (*seen)[descr] = type;
      *out = type;
      return true;
    }
  }
  return false;
}

// XLA's buffer-callback handler hands the callable its buffers as objects with the NumPy
// array interface (`__array__()`: a view, no copy): their memory, shape and dtype.
// Slot::dims point into `dims`, which is reserved up front and never reallocated.
struct BufferArgs {
  Slots ins, outs;
  std::vector<std::vector<int64_t>> dims;  // Slot::dims point here
  std::string error;
};

bool AddBuffer(py::handle buffer, bool writable, BufferArgs* into, Slots* slots) {
  py::array a = buffer.attr("__array__")();
  auto* fields = py::detail::array_proxy(a.ptr());
  Slot s;
  if (!ElementType(reinterpret_cast<PyObject*>(fields->descr), &s.type)) {
    into->error = "jaxbridge host call: unsupported element type " +
                  std::string(py::str(a.dtype()));
    return false;
  }
  into->dims.emplace_back(a.shape(), a.shape() + a.ndim());
  s.dims = into->dims.back().data();
  s.rank = static_cast<size_t>(a.ndim());
  s.data = fields->data;
  s.bytes = static_cast<size_t>(a.nbytes());
  s.writable = writable;
  slots->push_back(s);
  return true;
}

// (exec_ctx, outputs, *inputs), as jax.experimental.buffer_callback calls its callback.
bool CollectBuffers(const py::args& args, BufferArgs* into) {
  if (args.size() < 2) {
    into->error = "jaxbridge host call: expected (exec_ctx, outputs, *inputs)";
    return false;
  }
  py::sequence outs = py::reinterpret_borrow<py::sequence>(args[1]);
  into->dims.reserve(args.size() - 2 + outs.size());  // Slot::dims point into it
  for (size_t i = 2; i < args.size(); ++i) {
    if (!AddBuffer(args[i], false, into, &into->ins)) return false;
  }
  for (py::handle out : outs) {
    if (!AddBuffer(out, true, into, &into->outs)) return false;
  }
  return true;
}

ffi::Error HostCallCpu(ffi::RemainingArgs args, ffi::RemainingRets rets,
                       int64_t callback_id) {
  Slots ins, outs;
  if (ffi::Error e = CollectSlots(args, rets, &ins, &outs); e.failure()) return e;
  return InvokeOnHost(callback_id, ins, outs);
}

}  // namespace

// A host call in a program that spans several devices runs inside XLA's own buffer
// callback (jaxbridge/_core/jaxapi.py, lower_buffer_callback). Each device runs its
// part of such a program on a thread of its own, one part at a time; a host function
// that calls JAX (every jaxbridge.scipy solver does) would queue its computation behind
// the part that is waiting for it, for ever. XLA's handler marks its thread as inside a
// host callback, so that JAX work started there runs inline on that thread instead. The
// exception of a failed call crosses XLA as an error whose text carries its token.
py::cpp_function BufferCallbackEntry(int64_t callback_id) {
  return py::cpp_function([callback_id](py::args args) {
    BufferArgs buffers;
    if (!CollectBuffers(args, &buffers)) throw py::value_error(buffers.error);
    ffi::Error status;
    {
      py::gil_scoped_release release;
      status = InvokeOnHost(callback_id, buffers.ins, buffers.outs, /*worker=*/true);
    }
    if (status.failure()) {
      PyErr_SetString(PyExc_RuntimeError, status.message().c_str());
      throw py::error_already_set();
    }
  });
}

}  // namespace jaxbridge::hostcall

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxbridgeHostCallCpu, jaxbridge::hostcall::HostCallCpu,
                              xla::ffi::Ffi::Bind()
                                  .RemainingArgs()                 // operands, any dtype
                                  .RemainingRets()                 // results, any dtype
                                  .Attr<int64_t>("callback_id"));  // registry key
