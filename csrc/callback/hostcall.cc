// The native host-call trampoline: an XLA FFI handler that calls a registered
// Python callable with zero-copy NumPy views of XLA's buffers.
//
// Protocol (kept deliberately tiny; all checking lives in Python):
//   callable(inputs: tuple[np.ndarray], outputs: tuple[np.ndarray]) -> None | str
// Inputs are read-only views of XLA's operand buffers, outputs are writable views
// of XLA's result buffers that the callable fills exactly once. A returned string
// is an error message; it becomes an ffi::Error, which JAX raises at the call site.
//
// Lifetime: the registry holds *borrowed* references. The Python object that owns
// an id unregisters itself from a weakref finalizer, and the executables that use
// it keep it alive (see jaxbridge/_hostcall.py), so a stale id is an error, never
// a dangling pointer. All registry access happens with the GIL held.

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <array>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "xla/ffi/api/ffi.h"

#ifdef JAXBRIDGE_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace py = pybind11;
namespace ffi = xla::ffi;

namespace {

// Never destroyed: XLA may call handlers during interpreter shutdown.
std::unordered_map<int64_t, PyObject*>& Registry() {
  static auto* registry = new std::unordered_map<int64_t, PyObject*>();
  return *registry;
}

// NumPy dtype objects for XLA element types, built once under the GIL.
PyObject* NumpyDtype(ffi::DataType type) {
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

// A NumPy array viewing `data` (C-contiguous) without copying. `owner` keeps
// nothing alive: the view is only valid during the call, which the Python side
// documents and enforces by never storing the views.
py::array View(ffi::DataType type, ffi::Span<const int64_t> dims, void* data,
               bool writable, const py::handle& owner, std::string* error) {
  PyObject* dtype = NumpyDtype(type);
  if (dtype == nullptr) {
    *error = "jaxbridge host call: unsupported element type code " +
             std::to_string(static_cast<int>(type));
    return py::array();
  }
  std::vector<py::ssize_t> shape(dims.begin(), dims.end());
  py::array array(py::reinterpret_borrow<py::dtype>(dtype), shape, data, owner);
  if (!writable) {
    py::detail::array_proxy(array.ptr())->flags &=
        ~py::detail::npy_api::NPY_ARRAY_WRITEABLE_;
  }
  return array;
}

std::string FormatPythonError() {
  py::error_already_set err;  // fetches and clears the Python error
  return std::string(py::str(err.type().attr("__name__"))) + ": " +
         std::string(py::str(err.value()));
}

// Calls the registered callable on views of the given host buffers.
ffi::Error InvokeOnHost(int64_t callback_id,
                        const std::vector<ffi::AnyBuffer>& inputs,
                        const std::vector<ffi::AnyBuffer>& outputs,
                        const std::vector<void*>& input_data,
                        const std::vector<void*>& output_data) {
  if (!Py_IsInitialized()) {
    return ffi::Error::Internal("jaxbridge host call: Python is not running");
  }
  py::gil_scoped_acquire gil;
  auto it = Registry().find(callback_id);
  if (it == Registry().end()) {
    return ffi::Error(ffi::ErrorCode::kFailedPrecondition,
                      "jaxbridge host call: callback " + std::to_string(callback_id) +
                          " is no longer registered (its function was garbage "
                          "collected while a compiled program still used it)");
  }
  py::handle callable(it->second);
  py::object keep = py::reinterpret_borrow<py::object>(callable);
  static py::handle owner = py::none().release();  // views own nothing
  std::string error;
  try {
    py::tuple ins(inputs.size());
    for (size_t i = 0; i < inputs.size(); ++i) {
      py::array view = View(inputs[i].element_type(), inputs[i].dimensions(),
                            input_data[i], /*writable=*/false, owner, &error);
      if (!error.empty()) return ffi::Error::InvalidArgument(error);
      PyTuple_SET_ITEM(ins.ptr(), i, view.release().ptr());
    }
    py::tuple outs(outputs.size());
    for (size_t i = 0; i < outputs.size(); ++i) {
      py::array view = View(outputs[i].element_type(), outputs[i].dimensions(),
                            output_data[i], /*writable=*/true, owner, &error);
      if (!error.empty()) return ffi::Error::InvalidArgument(error);
      PyTuple_SET_ITEM(outs.ptr(), i, view.release().ptr());
    }
    PyObject* result = PyObject_CallFunctionObjArgs(keep.ptr(), ins.ptr(), outs.ptr(), nullptr);
    if (result == nullptr) return ffi::Error::Internal(FormatPythonError());
    py::object result_obj = py::reinterpret_steal<py::object>(result);
    if (!result_obj.is_none()) {
      return ffi::Error::Internal(std::string(py::str(result_obj)));
    }
  } catch (const py::error_already_set& e) {
    return ffi::Error::Internal(std::string("jaxbridge host call: ") + e.what());
  } catch (const std::exception& e) {
    return ffi::Error::Internal(std::string("jaxbridge host call: ") + e.what());
  }
  return ffi::Error::Success();
}

ffi::Error HostCallCpu(ffi::RemainingArgs args, ffi::RemainingRets rets, int64_t callback_id) {
  std::vector<ffi::AnyBuffer> inputs, outputs;
  std::vector<void*> input_data, output_data;
  inputs.reserve(args.size());
  input_data.reserve(args.size());
  for (size_t i = 0; i < args.size(); ++i) {
    auto buffer = args.get<ffi::AnyBuffer>(i);
    if (buffer.has_error()) return buffer.error();
    inputs.push_back(*buffer);
    input_data.push_back(buffer->untyped_data());
  }
  outputs.reserve(rets.size());
  output_data.reserve(rets.size());
  for (size_t i = 0; i < rets.size(); ++i) {
    auto buffer = rets.get<ffi::AnyBuffer>(i);
    if (buffer.has_error()) return buffer.error();
    outputs.push_back(**buffer);
    output_data.push_back((*buffer)->untyped_data());
  }
  return InvokeOnHost(callback_id, inputs, outputs, input_data, output_data);
}

#ifdef JAXBRIDGE_WITH_CUDA
// GPU: stage through pinned host memory on XLA's stream. One staging block per
// call covers every operand and result (aligned to 256 bytes); the stream is
// synchronized once before the Python call and once after the copies back,
// because the staging memory is reused by the next call.
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

ffi::Error HostCallCuda(cudaStream_t stream, ffi::RemainingArgs args, ffi::RemainingRets rets,
                        int64_t callback_id) {
  thread_local PinnedStaging staging;
  std::vector<ffi::AnyBuffer> inputs, outputs;
  size_t total = 0;
  for (size_t i = 0; i < args.size(); ++i) {
    auto buffer = args.get<ffi::AnyBuffer>(i);
    if (buffer.has_error()) return buffer.error();
    inputs.push_back(*buffer);
    total += Aligned(buffer->size_bytes());
  }
  for (size_t i = 0; i < rets.size(); ++i) {
    auto buffer = rets.get<ffi::AnyBuffer>(i);
    if (buffer.has_error()) return buffer.error();
    outputs.push_back(**buffer);
    total += Aligned((*buffer)->size_bytes());
  }
  if (cudaError_t s = staging.Reserve(total > 0 ? total : 1); s != cudaSuccess) {
    return CudaError("cudaMallocHost", s);
  }
  std::vector<void*> input_data, output_data;
  char* cursor = static_cast<char*>(staging.data);
  for (auto& in : inputs) {
    input_data.push_back(cursor);
    if (in.size_bytes() > 0) {
      cudaError_t s = cudaMemcpyAsync(cursor, in.untyped_data(), in.size_bytes(),
                                      cudaMemcpyDeviceToHost, stream);
      if (s != cudaSuccess) return CudaError("cudaMemcpyAsync (device to host)", s);
    }
    cursor += Aligned(in.size_bytes());
  }
  for (auto& out : outputs) {
    output_data.push_back(cursor);
    cursor += Aligned(out.size_bytes());
  }
  if (cudaError_t s = cudaStreamSynchronize(stream); s != cudaSuccess) {
    return CudaError("cudaStreamSynchronize", s);
  }
  ffi::Error status = InvokeOnHost(callback_id, inputs, outputs, input_data, output_data);
  if (status.failure()) return status;
  for (size_t i = 0; i < outputs.size(); ++i) {
    if (outputs[i].size_bytes() == 0) continue;
    cudaError_t s = cudaMemcpyAsync(outputs[i].untyped_data(), output_data[i],
                                    outputs[i].size_bytes(), cudaMemcpyHostToDevice, stream);
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
  m.def("register_callback", [](int64_t callback_id, py::handle callable) {
    Registry()[callback_id] = callable.ptr();  // borrowed; see file comment
  }, py::arg("callback_id"), py::arg("callable"));
  m.def("unregister_callback", [](int64_t callback_id) { Registry().erase(callback_id); },
        py::arg("callback_id"));
  m.def("num_registered", []() { return Registry().size(); });
#ifdef JAXBRIDGE_WITH_CUDA
  m.attr("with_cuda") = true;
#else
  m.attr("with_cuda") = false;
#endif
  m.attr("__version__") = JAXBRIDGE_VERSION;
}
