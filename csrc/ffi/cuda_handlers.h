// Handler symbols of the built-in CUDA kernels (defined in cuda_handlers.cc).
#ifndef JAXBRIDGE_FFI_CUDA_HANDLERS_H_
#define JAXBRIDGE_FFI_CUDA_HANDLERS_H_

#include "xla/ffi/api/api.h"

XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxbridgeSoftplusFwdCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxbridgeSoftplusAdjCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxbridgeSoftplusTanCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxbridgeTridiagFwdCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxbridgeTridiagAdjCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxbridgeTridiagTanCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxbridgeRbfFwdCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxbridgeRbfAdjCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxbridgeRbfTanCuda);

#endif  // JAXBRIDGE_FFI_CUDA_HANDLERS_H_
