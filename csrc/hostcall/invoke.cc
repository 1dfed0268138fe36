// One host call: the GIL, the registry entry, the views, the callable, the checks after
// it; and the XLA FFI handler that makes it on the CPU.
#include "internal.h"

namespace jaxbridge::hostcall {
namespace {

// Threads Python knows (the main thread, threading.Thread) use their own thread state.
// On XLA's worker threads PyGILState_Ensure would create and delete a state on every
// call (~15 us); one extra Ensure, never released, keeps the first state for the
// thread's life.
thread_local bool t_state_kept = false;

}  // namespace

bool OnPythonThread() {
  return !t_state_kept && PyGILState_GetThisThreadState() != nullptr;
}

Gil::Gil() {
  python_thread_ = OnPythonThread();
  state_ = PyGILState_Ensure();
  if (!python_thread_ && !t_state_kept) {
    PyGILState_Ensure();
    t_state_kept = true;
  }
}

ffi::Error InvokeOnHost(int64_t callback_id, const Slots& ins, const Slots& outs) {
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
  if (HasPending()) {  // an earlier call on this thread raised: skip
    if (PendingSeconds() <= kMaxSkipSeconds) {
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
      exc = FetchRaisedException();
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

namespace {

ffi::Error HostCallCpu(ffi::RemainingArgs args, ffi::RemainingRets rets,
                       int64_t callback_id) {
  Slots ins, outs;
  if (ffi::Error e = CollectSlots(args, rets, &ins, &outs); e.failure()) return e;
  return InvokeOnHost(callback_id, ins, outs);
}

}  // namespace
}  // namespace jaxbridge::hostcall

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxbridgeHostCallCpu, jaxbridge::hostcall::HostCallCpu,
                              xla::ffi::Ffi::Bind()
                                  .RemainingArgs()                 // operands, any dtype
                                  .RemainingRets()                 // results, any dtype
                                  .Attr<int64_t>("callback_id"));  // registry key
