// The device path: DLPack views of XLA's device buffers for callables that take them.
//
// On the CUDA platform the handler normally stages operands through pinned host memory
// and hands the callable NumPy views. A callable registered with a *device fill*
// (`_hostcall.set_device_fill(id, fn)`; jaxbridge.torch registers one when torch has
// CUDA) gets XLA's device buffers instead:
//
//     device_fill(inputs: tuple[capsule], outputs: tuple[capsule], stream: int, device: int)
//
// where each capsule is a DLPack "dltensor" (kDLCUDA, `device`) viewing XLA's buffer
// (no copy) and `stream` is XLA's cudaStream_t for this call. The callable must enqueue
// its work on that stream (torch: torch.cuda.ExternalStream) and must not synchronize
// what it does not own; the handler returns as soon as the callable does, and XLA's
// next operations on the stream run after the callable's kernels.
//
// Kept views: the capsules' deleters count down a per-call ViewCount. A callable that
// still holds a tensor viewing XLA's memory after returning gets KeptViewError (the
// memory is XLA's and cannot be moved to the host behind the tensor's back).
//
// STATUS: compiled and lowered in CI, never run on a GPU (see docs/guides/torch.md).
// Everything but CUDA itself runs on CPU in tests/test_torch_device.py, through
// _hostcall._invoke_device_fill_for_testing (host arrays as kDLCPU views).
#include <pybind11/stl.h>

#include <cstring>
#include <mutex>

#include "dlpack_views.h"
#include "internal.h"

#ifdef JAXBRIDGE_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace jaxbridge::hostcall {
namespace {

// ---- device fills, by callback id (a mutex, not the GIL: the CUDA handler picks its
// path before taking the GIL). Borrowed: the HostCallable holds the callable and
// unregisters at finalization.
std::mutex& DeviceFillMutex() {
  static auto* mu = new std::mutex();
  return *mu;
}
std::unordered_map<int64_t, PyObject*>& DeviceFills() {
  static auto* fills = new std::unordered_map<int64_t, PyObject*>();
  return *fills;
}
// The DLPack dtype of an XLA element type; false if DLPack (or torch) has none.
bool DlpackType(ffi::DataType type, jaxbridge::dlpack::DLDataType* out) {
  using jaxbridge::dlpack::DataType;
  switch (type) {
    case ffi::DataType::PRED: *out = DataType('b', 8); return true;
    case ffi::DataType::S8: *out = DataType('i', 8); return true;
    case ffi::DataType::S16: *out = DataType('i', 16); return true;
    case ffi::DataType::S32: *out = DataType('i', 32); return true;
    case ffi::DataType::S64: *out = DataType('i', 64); return true;
    case ffi::DataType::U8: *out = DataType('u', 8); return true;
    case ffi::DataType::U16: *out = DataType('u', 16); return true;
    case ffi::DataType::U32: *out = DataType('u', 32); return true;
    case ffi::DataType::U64: *out = DataType('u', 64); return true;
    case ffi::DataType::F16: *out = DataType('f', 16); return true;
    case ffi::DataType::F32: *out = DataType('f', 32); return true;
    case ffi::DataType::F64: *out = DataType('f', 64); return true;
    case ffi::DataType::BF16: *out = DataType('B', 16); return true;
    case ffi::DataType::C64: *out = DataType('c', 64); return true;
    case ffi::DataType::C128: *out = DataType('c', 128); return true;
    default: return false;
  }
}

// A tuple of capsules viewing `slots` on (device_type, device_id); nullptr with a
// Python error set, or an empty `error`, on failure.
PyObject* DlpackTuple(const Slots& slots, int32_t device_type, int32_t device_id,
                      const std::shared_ptr<jaxbridge::dlpack::ViewCount>& count,
                      std::string* error) {
  PyObject* tuple = PyTuple_New(static_cast<Py_ssize_t>(slots.size()));
  if (tuple == nullptr) return nullptr;
  for (size_t i = 0; i < slots.size(); ++i) {
    jaxbridge::dlpack::DLDataType dtype;
    if (!DlpackType(slots[i].type, &dtype)) {
      *error = "jaxbridge device call: element type code " +
               std::to_string(static_cast<int>(slots[i].type)) + " has no DLPack equivalent";
      Py_DECREF(tuple);
      return nullptr;
    }
    std::vector<int64_t> shape(slots[i].dims, slots[i].dims + slots[i].rank);
    PyObject* capsule = jaxbridge::dlpack::Capsule(slots[i].data, shape, dtype, device_type,
                                                   device_id, count);
    if (capsule == nullptr) {
      Py_DECREF(tuple);
      return nullptr;
    }
    PyTuple_SET_ITEM(tuple, static_cast<Py_ssize_t>(i), capsule);  // steals
  }
  return tuple;
}

// Runs the device fill registered under `callback_id` on buffers of (device_type,
// device) -- XLA's device buffers on CUDA; host arrays in the CPU test hook below --
// with `stream` (XLA's cudaStream_t, or null). `fail_fill` fills the outputs of a call
// that failed or was skipped (cf. FailedFill).
template <typename FailFill>
ffi::Error InvokeDeviceFill(int64_t callback_id, const Slots& ins,
                            const Slots& outs, int32_t device_type,
                            int32_t device, void* stream, FailFill fail_fill) {
  InFlight in_flight;
  if (!in_flight.entered()) {
    if (OnPythonThread() && PyThread_get_thread_ident() != TheHooks().main_thread) {
      in_flight.Leave();
      Park();
    }
    return Failure(
        "jaxbridge device call: the Python interpreter is shutting down, so the host "
        "function was not called");
  }
  Gil gil;
  std::shared_ptr<Entry> entry = FindEntry(callback_id);
  if (entry == nullptr) {
    return ffi::Error(ffi::ErrorCode::kFailedPrecondition,
                      "jaxbridge device call: callback " + std::to_string(callback_id) +
                          " is no longer registered");
  }
  py::object handler = py::reinterpret_borrow<py::object>(entry->handler);
  if (HasPending()) {  // an earlier call on this thread raised: skip
    if (PendingSeconds() <= kMaxSkipSeconds) {
      fail_fill(outs);
      return ffi::Error::Success();
    }
    return Report(CancelPending(), handler.ptr(), /*python_thread=*/false, {});
  }
  py::object fill;
  {
    std::lock_guard<std::mutex> lock(DeviceFillMutex());
    auto found = DeviceFills().find(callback_id);
    if (found != DeviceFills().end()) fill = py::reinterpret_borrow<py::object>(found->second);
  }
  if (!fill) return Failure("jaxbridge device call: the device fill was unregistered");
  auto count = std::make_shared<jaxbridge::dlpack::ViewCount>();
  std::string error;
  PyObject* exc = nullptr;
  PyObject* in_tuple = DlpackTuple(ins, device_type, device, count, &error);
  PyObject* out_tuple =
      in_tuple == nullptr ? nullptr : DlpackTuple(outs, device_type, device, count, &error);
  if (out_tuple == nullptr) {
    Py_XDECREF(in_tuple);
    if (!error.empty()) return ffi::Error::InvalidArgument(error);
    return Failure(PythonErrorText());
  }
  PyObject* stream_int = PyLong_FromVoidPtr(stream);
  PyObject* device_int = PyLong_FromLong(device);
  PyObject* result = (stream_int && device_int)
      ? PyObject_CallFunctionObjArgs(fill.ptr(), in_tuple, out_tuple, stream_int, device_int,
                                     nullptr)
      : nullptr;
  Py_XDECREF(stream_int);
  Py_XDECREF(device_int);
  Py_DECREF(in_tuple);
  Py_DECREF(out_tuple);
  if (result == nullptr) {
    exc = FetchRaisedException();
  } else {
    Py_DECREF(result);
  }
  if (count->alive.load() > 0) {  // tensors viewing XLA's memory outlive the call?
    PyObject* collected = PyObject_CallNoArgs(TheHooks().gc_collect);
    if (collected == nullptr) PyErr_Clear();
    Py_XDECREF(collected);
  }
  int64_t kept = count->alive.load();
  if (kept > 0 && exc == nullptr) {
    py::list none;
    exc = PyObject_CallMethod(handler.ptr(), "kept_view_error", "OOn", none.ptr(), none.ptr(),
                              static_cast<Py_ssize_t>(kept));
    if (exc == nullptr) exc = FetchRaisedException();
  }
  if (exc != nullptr) {
    ffi::Error status = Report(exc, handler.ptr(), gil.python_thread(), {});
    if (status.success()) fail_fill(outs);  // delivered on return
    return status;
  }
  return ffi::Error::Success();
}

#ifdef JAXBRIDGE_WITH_CUDA
// The outputs of a failed or skipped device call (cf. FailedFill): all bits set, NaN in
// every floating-point type, -1 in integers. Nobody sees them (see FailedFill).
void DeviceFailedFill(const Slots& outs, cudaStream_t stream) {
  for (const Slot& s : outs) {
    if (s.bytes) cudaMemsetAsync(s.data, 0xFF, s.bytes, stream);
  }
}

#endif  // JAXBRIDGE_WITH_CUDA

// Element types by NumPy name (the CPU test hooks below).
ffi::DataType TypeFromName(const std::string& name) {
  static const std::unordered_map<std::string, ffi::DataType> types = {
      {"bool", ffi::DataType::PRED}, {"int8", ffi::DataType::S8},
      {"int16", ffi::DataType::S16}, {"int32", ffi::DataType::S32},
      {"int64", ffi::DataType::S64}, {"uint8", ffi::DataType::U8},
      {"float16", ffi::DataType::F16}, {"bfloat16", ffi::DataType::BF16},
      {"float32", ffi::DataType::F32}, {"float64", ffi::DataType::F64},
      {"complex64", ffi::DataType::C64}, {"complex128", ffi::DataType::C128}};
  auto found = types.find(name);
  if (found == types.end()) throw py::value_error("unsupported dtype " + name);
  return found->second;
}

}  // namespace

bool HasDeviceFill(int64_t callback_id) {
  std::lock_guard<std::mutex> lock(DeviceFillMutex());
  return DeviceFills().count(callback_id) > 0;
}
void ForgetDeviceFill(int64_t callback_id) {
  std::lock_guard<std::mutex> lock(DeviceFillMutex());
  DeviceFills().erase(callback_id);
}

#ifdef JAXBRIDGE_WITH_CUDA
ffi::Error InvokeOnDevice(int64_t callback_id, const Slots& ins, const Slots& outs,
                          void* stream_ptr, int32_t device) {
  auto stream = static_cast<cudaStream_t>(stream_ptr);
  return InvokeDeviceFill(callback_id, ins, outs, jaxbridge::dlpack::kDLCUDA, device,
                          stream_ptr,
                          [stream](const Slots& o) { DeviceFailedFill(o, stream); });
}
#endif  // JAXBRIDGE_WITH_CUDA

// The Python side of the device path (bound in PYBIND11_MODULE).
void DefineDeviceCall(py::module_& m) {
  m.def("set_device_fill", [](int64_t callback_id, py::handle fill) {
    std::lock_guard<std::mutex> lock(DeviceFillMutex());
    if (fill.is_none()) {
      DeviceFills().erase(callback_id);
    } else {
      DeviceFills()[callback_id] = fill.ptr();  // borrowed (see DeviceFills)
    }
  }, py::arg("callback_id"), py::arg("fill"),
     "On CUDA, call `fill(inputs, outputs, stream, device)` with DLPack capsules of "
     "XLA's device buffers instead of staging them through host memory (None: stop).");
  m.def("dlpack_views_alive", []() {
    return jaxbridge::dlpack::ViewCount::Total().load();
  }, "How many DLPack views made by the device path are still held by their consumers.");
  m.def("_dlpack_capsule_for_testing", [](uintptr_t address, std::vector<int64_t> shape,
                                          std::string dtype, int32_t device_type,
                                          int32_t device_id) {
    // Tests only: the caller keeps the memory at `address` alive while the view lives.
    Slots slots;
    slots.push_back({TypeFromName(dtype), shape.data(), shape.size(),
                     reinterpret_cast<void*>(address), 0, false});
    std::string error;
    PyObject* tuple = DlpackTuple(slots, device_type, device_id,
                                  std::make_shared<jaxbridge::dlpack::ViewCount>(), &error);
    if (tuple == nullptr) {
      if (!error.empty()) throw py::value_error(error);
      throw py::error_already_set();
    }
    py::tuple t = py::reinterpret_steal<py::tuple>(tuple);
    return py::object(t[0]);
  }, py::arg("address"), py::arg("shape"), py::arg("dtype"), py::arg("device_type"),
     py::arg("device_id"),
     "A DLPack capsule viewing `address` as the device path builds them (tests only).");
  m.def("_invoke_device_fill_for_testing", [](int64_t callback_id, py::tuple ins,
                                             py::tuple outs) -> py::object {
    // The device path's whole host side (registry, capsules, the call, kept views,
    // exceptions) on NumPy arrays as kDLCPU buffers: what the CUDA handler runs, minus
    // CUDA. Returns None, or the text of the error XLA would get. Tests only.
    // Slot.dims points into `dims`, which outlives the call (XLA's dims do on CUDA).
    std::vector<std::vector<int64_t>> dims;
    dims.reserve(ins.size() + outs.size());
    auto slots = [&dims](const py::tuple& arrays, bool writable, Slots* out) {
      for (py::handle h : arrays) {
        auto a = py::reinterpret_borrow<py::array>(h);
        dims.emplace_back(a.shape(), a.shape() + a.ndim());
        std::string name = py::str(a.dtype().attr("name"));
        out->push_back({TypeFromName(name), dims.back().data(), dims.back().size(),
                        const_cast<void*>(a.data()), static_cast<size_t>(a.nbytes()),
                        writable});
      }
    };
    Slots in_slots, out_slots;
    slots(ins, false, &in_slots);
    slots(outs, true, &out_slots);
    ffi::Error status = InvokeDeviceFill(
        callback_id, in_slots, out_slots, jaxbridge::dlpack::kDLCPU, 0, nullptr,
        [](const Slots& o) {
          for (const Slot& s : o) std::memset(s.data, 0xFF, s.bytes);
        });
    if (status.success()) return py::none();
    return py::str(status.message());
  }, py::arg("callback_id"), py::arg("inputs"), py::arg("outputs"),
     "Run a registered device fill on host arrays as the CUDA handler would (tests only).");
}

}  // namespace jaxbridge::hostcall
