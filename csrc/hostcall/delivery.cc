// A failed host call's exception, kept as itself.
//
// An exception raised on a thread that was running Python when it called into XLA (the
// main thread, or a threading.Thread calling a jitted function: jaxbridge's single-device
// programs run synchronously on the calling thread, see jaxbridge/_foreign/hostcall.py)
// is re-raised on that thread, as the same object, the moment the JAX call returns. That
// is how CPython itself delivers KeyboardInterrupt: Py_AddPendingCall on the main thread,
// PyThreadState_SetAsyncExc on others. XLA is told the call succeeded (outputs NaN-filled,
// see FailedFill) so that the computation finishes normally; later host calls in the
// same computation are skipped until the exception is delivered. Where this cannot work
// -- an XLA worker thread, or a computation still making host calls kMaxSkipSeconds after
// the failure -- the failure becomes an XLA error whose message describes the exception
// and carries a token. JAX raises that error on the launching thread as its
// JaxRuntimeError, which jaxbridge builds as the exception object the token names
// (jaxbridge/_foreign/delivery.py; jaxbridge.errors.original_exception() maps a token
// back where that is not possible). A worker cannot deliver it itself: no FFI context
// names the Python thread waiting for the run, and that thread need not run any host call.
#include <cstring>

#include "internal.h"

namespace jaxbridge::hostcall {
namespace {

// The exception a host call on this thread raised and that is not yet delivered. Owned;
// touched only with the GIL. While set, this thread's host calls are skipped.
thread_local PyObject* t_pending = nullptr;
thread_local Clock::time_point t_pending_since;

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

template <typename Bits>
void FillBits(void* data, size_t bytes, Bits bits) {
  Bits* p = static_cast<Bits*>(data);
  for (size_t i = 0, n = bytes / sizeof(Bits); i < n; ++i) p[i] = bits;
}

}  // namespace

bool HasPending() { return t_pending != nullptr; }

double PendingSeconds() {
  return std::chrono::duration<double>(Clock::now() - t_pending_since).count();
}

PyObject* TakePending() {
  PyObject* exc = t_pending;
  t_pending = nullptr;
  return exc;
}

PyObject* CancelPending() {
  unsigned long me = PyThread_get_thread_ident();
  if (me != TheHooks().main_thread) PyThreadState_SetAsyncExc(me, nullptr);
  return TakePending();  // the main thread's pending call then finds nothing
}

void RaiseObject(PyObject* exc) {  // steals `exc`
#if PY_VERSION_HEX >= 0x030C0000
  PyErr_SetRaisedException(exc);
#else
  PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc)), exc);
  Py_DECREF(exc);
#endif
}

PyObject* FetchRaisedException() {
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

std::string PythonErrorText() {
  if (!PyErr_Occurred()) return "jaxbridge host call: a Python C-API call failed";
  py::error_already_set err;  // fetches and clears
  return std::string("jaxbridge host call: ") + err.what();
}

ffi::Error Failure(const std::string& message) {
  return ffi::Error(ffi::ErrorCode::kUnknown, message);
}

// NaN in floating-point results (so that a loop testing convergence, `while err > tol`
// or `while x < limit`, ends at once instead of spinning on zeros), zeros elsewhere.
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

// A KeyboardInterrupt or SystemExit raised where no caller waits crosses XLA like any
// other exception: JAX's error at the call site becomes it, once per failed run (not
// once per shard), and `except Exception` there cannot swallow it.
ffi::Error Report(PyObject* exc, PyObject* handler, bool python_thread, const Slots& outs,
                  int64_t started) {
  PyObject* noted = PyObject_CallMethod(handler, "annotate", "O", exc);
  if (noted == nullptr) PyErr_Clear();
  Py_XDECREF(noted);
  if (python_thread && SchedulePending(exc)) {
    Py_DECREF(exc);
    FailedFill(outs);
    return ffi::Error::Success();
  }
  std::string message;
  PyObject* text = PyObject_CallMethod(handler, "failure_message", "OL", exc,
                                       static_cast<long long>(started));
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

}  // namespace jaxbridge::hostcall
