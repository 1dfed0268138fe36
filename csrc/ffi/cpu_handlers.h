// Handler symbols of the built-in CPU kernels (defined in cpu_handlers.cc).
#ifndef JAXBRIDGE_FFI_CPU_HANDLERS_H_
#define JAXBRIDGE_FFI_CPU_HANDLERS_H_

#include "xla/ffi/api/api.h"

XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxbridgeSoftplusFwdCpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxbridgeSoftplusAdjCpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxbridgeSoftplusTanCpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxbridgeTridiagFwdCpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxbridgeTridiagAdjCpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxbridgeTridiagTanCpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxbridgeRbfFwdCpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxbridgeRbfAdjCpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxbridgeRbfTanCpu);

#endif  // JAXBRIDGE_FFI_CPU_HANDLERS_H_
