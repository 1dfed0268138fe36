// jaxbridge._builtin: hands the built-in kernels' FFI handler capsules to Python.
//   registrations() -> {"cpu": {target: capsule}, "CUDA": {...}}   (CUDA when built)
//   targets()       -> {op: {role: target}}                         (targets.h)
//   guarded_call()  -> {"cpu": capsule, "CUDA": capsule}             (guard.h)
//   guard_register(platform, target, capsule): a handler the guarded call may run
//   minpack()       -> {target: capsule}   CPU handlers of root(method="hybr")'s loop
#include <pybind11/pybind11.h>

#include <string>

#include "guard.h"
#include "handlers.h"
#include "math/cpu_isa.h"

extern "C" XLA_FFI_Error* JaxbridgeGuardedCpu(XLA_FFI_CallFrame* frame);
// minpack_handlers.cc: MINPACK's hybrj in reverse communication (not kernel-table ops)
extern "C" XLA_FFI_Error* JaxbridgeHybrjAfterFunCpu(XLA_FFI_CallFrame* frame);
extern "C" XLA_FFI_Error* JaxbridgeHybrjAfterJacCpu(XLA_FFI_CallFrame* frame);
#ifdef JAXBRIDGE_WITH_CUDA
extern "C" XLA_FFI_Error* JaxbridgeGuardedCuda(XLA_FFI_CallFrame* frame);
#endif

namespace py = pybind11;
namespace jk = ::jaxbridge::kernels;

namespace {
template <typename T>
py::capsule Capsule(T* fn) {
  return py::capsule(reinterpret_cast<void*>(fn));
}
}  // namespace

PYBIND11_MODULE(_builtin, m) {
  m.doc() = "jaxbridge built-in kernels (XLA FFI handlers)";
  m.def(
      "registrations",
      []() {
        py::dict cpu;
#define JAXBRIDGE_CPU_CAPSULE(op, role, Symbol, name) \
  cpu[name] = Capsule(Jaxbridge##Symbol##Cpu);
        JAXBRIDGE_BUILTIN_TARGETS(JAXBRIDGE_CPU_CAPSULE)
#undef JAXBRIDGE_CPU_CAPSULE
        py::dict out;
        out["cpu"] = cpu;
#ifdef JAXBRIDGE_WITH_CUDA
        py::dict cuda;
#define JAXBRIDGE_CUDA_CAPSULE(op, role, Symbol, name) \
  cuda[name] = Capsule(Jaxbridge##Symbol##Cuda);
        JAXBRIDGE_BUILTIN_TARGETS(JAXBRIDGE_CUDA_CAPSULE)
#undef JAXBRIDGE_CUDA_CAPSULE
        out["CUDA"] = cuda;
#endif
        return out;
      },
      "FFI handler capsules by platform: {platform: {target_name: capsule}}.");
  m.def(
      "targets",
      []() {
        py::dict ops;
#define JAXBRIDGE_TARGET_ENTRY(op, role, Symbol, name)           \
  if (!ops.contains(#op)) ops[#op] = py::dict();                 \
  ops[#op].cast<py::dict>()[#role] = py::str(name);
        JAXBRIDGE_BUILTIN_TARGETS(JAXBRIDGE_TARGET_ENTRY)
#undef JAXBRIDGE_TARGET_ENTRY
        return ops;
      },
      "The built-in kernels' targets: {op: {'forward'|'vjp'|'jvp': target name}}.");
  // Guarded outputs (guard.h): the checked call, and the handlers it may run.
  m.def(
      "guarded_call",
      []() {
        py::dict out;
        out["cpu"] = Capsule(JaxbridgeGuardedCpu);
#ifdef JAXBRIDGE_WITH_CUDA
        out["CUDA"] = Capsule(JaxbridgeGuardedCuda);
#endif
        return out;
      },
      "The guarded call's FFI handler capsules: {platform: capsule}.");
  m.def(
      "guard_register",
      [](const std::string& platform, std::string target, py::capsule handler) {
        namespace g = ::jaxbridge::builtin::guard;
        g::Platform p;
        if (platform == "cpu") {
          p = g::Platform::kCpu;
        } else if (platform == "cuda") {
          p = g::Platform::kCuda;
        } else {
          throw py::value_error("guard_register: platform must be 'cpu' or 'cuda', got '" +
                                platform + "'");
        }
        g::Register(p, std::move(target),
                    reinterpret_cast<XLA_FFI_Handler*>(handler.get_pointer()));
      },
      "Records the handler registered with XLA under `target`, for the guarded call.");
  m.def(
      "minpack",
      []() {
        py::dict cpu;
        cpu["jaxbridge_hybrj_after_fun"] = Capsule(JaxbridgeHybrjAfterFunCpu);
        cpu["jaxbridge_hybrj_after_jac"] = Capsule(JaxbridgeHybrjAfterJacCpu);
        return cpu;
      },
      "CPU handler capsules of MINPACK's hybrj steps: {target_name: capsule}.");
  // CPU instruction-set dispatch of the kernels (csrc/math/cpu_isa.h), for tests
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
