// pybind11 module handing the example's FFI handlers to Python.
#include <pybind11/pybind11.h>

#include "xla/ffi/api/api.h"

XLA_FFI_DECLARE_HANDLER_SYMBOL(CubeForward);
XLA_FFI_DECLARE_HANDLER_SYMBOL(CubeVjp);
XLA_FFI_DECLARE_HANDLER_SYMBOL(CubeJvp);

namespace py = pybind11;

PYBIND11_MODULE(_cube, m) {
  m.def("handlers", []() {
    py::dict d;
    d["forward"] = py::capsule(reinterpret_cast<void*>(CubeForward));
    d["vjp"] = py::capsule(reinterpret_cast<void*>(CubeVjp));
    d["jvp"] = py::capsule(reinterpret_cast<void*>(CubeJvp));
    return d;
  });
}
