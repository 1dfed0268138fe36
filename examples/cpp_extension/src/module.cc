// pybind11 module handing the example's FFI handlers to Python.
#include <pybind11/pybind11.h>

#include "xla/ffi/api/api.h"

XLA_FFI_DECLARE_HANDLER_SYMBOL(CubeForward);
XLA_FFI_DECLARE_HANDLER_SYMBOL(CubeAdjoint);
XLA_FFI_DECLARE_HANDLER_SYMBOL(CubeTangent);

namespace py = pybind11;

PYBIND11_MODULE(_cube, m) {
  m.def("handlers", []() {
    py::dict d;
    d["forward"] = py::capsule(reinterpret_cast<void*>(CubeForward));
    d["adjoint"] = py::capsule(reinterpret_cast<void*>(CubeAdjoint));
    d["tangent"] = py::capsule(reinterpret_cast<void*>(CubeTangent));
    return d;
  });
}
