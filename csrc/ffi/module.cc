// jaxbridge._kernels: hands the built-in kernels' FFI handler capsules to Python.
//   registrations() -> {"cpu": {target: capsule}, "CUDA": {...}}   (CUDA when built)
#include <pybind11/pybind11.h>

#include <string>

#include "cpu_handlers.h"
#include "kernels/cpu_isa.h"
#ifdef JAXBRIDGE_WITH_CUDA
#include "cuda_handlers.h"
#endif

namespace py = pybind11;
namespace jk = ::jaxbridge::kernels;

namespace {
template <typename T>
py::capsule Capsule(T* fn) {
  return py::capsule(reinterpret_cast<void*>(fn));
}
}  // namespace

PYBIND11_MODULE(_kernels, m) {
  m.doc() = "jaxbridge built-in kernels (XLA FFI handlers)";
  m.def(
      "registrations",
      []() {
        py::dict cpu;
        cpu["jaxbridge_softplus_fwd"] = Capsule(JaxbridgeSoftplusFwdCpu);
        cpu["jaxbridge_softplus_adj"] = Capsule(JaxbridgeSoftplusAdjCpu);
        cpu["jaxbridge_softplus_tan"] = Capsule(JaxbridgeSoftplusTanCpu);
        cpu["jaxbridge_tridiagonal_solve_fwd"] = Capsule(JaxbridgeTridiagFwdCpu);
        cpu["jaxbridge_tridiagonal_solve_adj"] = Capsule(JaxbridgeTridiagAdjCpu);
        cpu["jaxbridge_tridiagonal_solve_tan"] = Capsule(JaxbridgeTridiagTanCpu);
        cpu["jaxbridge_rbf_kernel_fwd"] = Capsule(JaxbridgeRbfFwdCpu);
        cpu["jaxbridge_rbf_kernel_adj"] = Capsule(JaxbridgeRbfAdjCpu);
        cpu["jaxbridge_rbf_kernel_tan"] = Capsule(JaxbridgeRbfTanCpu);
        py::dict out;
        out["cpu"] = cpu;
#ifdef JAXBRIDGE_WITH_CUDA
        py::dict cuda;
        cuda["jaxbridge_softplus_fwd"] = Capsule(JaxbridgeSoftplusFwdCuda);
        cuda["jaxbridge_softplus_adj"] = Capsule(JaxbridgeSoftplusAdjCuda);
        cuda["jaxbridge_softplus_tan"] = Capsule(JaxbridgeSoftplusTanCuda);
        cuda["jaxbridge_tridiagonal_solve_fwd"] = Capsule(JaxbridgeTridiagFwdCuda);
        cuda["jaxbridge_tridiagonal_solve_adj"] = Capsule(JaxbridgeTridiagAdjCuda);
        cuda["jaxbridge_tridiagonal_solve_tan"] = Capsule(JaxbridgeTridiagTanCuda);
        cuda["jaxbridge_rbf_kernel_fwd"] = Capsule(JaxbridgeRbfFwdCuda);
        cuda["jaxbridge_rbf_kernel_adj"] = Capsule(JaxbridgeRbfAdjCuda);
        cuda["jaxbridge_rbf_kernel_tan"] = Capsule(JaxbridgeRbfTanCuda);
        out["CUDA"] = cuda;
#endif
        return out;
      },
      "FFI handler capsules by platform: {platform: {target_name: capsule}}.");
  // CPU instruction-set dispatch of the kernels (csrc/kernels/cpu_isa.h), for tests
  // and benchmarks: run the baseline / AVX2 code paths on an AVX-512 machine.
  m.def(
      "_cpu_isa", []() { return std::string(jk::IsaName(jk::ActiveIsa())); },
      "Instruction set the CPU kernels use now: 'baseline', 'avx2' or 'avx512'.");
  m.def(
      "_set_cpu_isa_limit",
      [](const std::string& name) {
        if (name == "baseline") {
          jk::SetIsaLimit(jk::Isa::kBaseline);
        } else if (name == "avx2") {
          jk::SetIsaLimit(jk::Isa::kAvx2);
        } else if (name == "avx512") {
          jk::SetIsaLimit(jk::Isa::kAvx512);
        } else {
          throw py::value_error("expected 'baseline', 'avx2' or 'avx512', got '" + name + "'");
        }
        return std::string(jk::IsaName(jk::ActiveIsa()));
      },
      "Caps the CPU kernels' instruction set (never above what the CPU has); returns the "
      "one now in use. Process-wide: for tests and benchmarks only.");
#ifdef JAXBRIDGE_WITH_CUDA
  m.attr("with_cuda") = true;
#else
  m.attr("with_cuda") = false;
#endif
}
