// Handler symbols of the built-in kernels, declared from the target table
// (defined in cpu_handlers.cc and, when built with CUDA, cuda_handlers.cc).
#ifndef JAXBRIDGE_BUILTIN_HANDLERS_H_
#define JAXBRIDGE_BUILTIN_HANDLERS_H_

#include "targets.h"
#include "xla/ffi/api/api.h"

#define JAXBRIDGE_DECLARE_CPU(op, role, Symbol, name) \
  XLA_FFI_DECLARE_HANDLER_SYMBOL(Jaxbridge##Symbol##Cpu);
JAXBRIDGE_BUILTIN_TARGETS(JAXBRIDGE_DECLARE_CPU)
#undef JAXBRIDGE_DECLARE_CPU

#ifdef JAXBRIDGE_WITH_CUDA
#define JAXBRIDGE_DECLARE_CUDA(op, role, Symbol, name) \
  XLA_FFI_DECLARE_HANDLER_SYMBOL(Jaxbridge##Symbol##Cuda);
JAXBRIDGE_BUILTIN_TARGETS(JAXBRIDGE_DECLARE_CUDA)
#undef JAXBRIDGE_DECLARE_CUDA
#endif

#endif  // JAXBRIDGE_BUILTIN_HANDLERS_H_
