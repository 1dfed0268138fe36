// The CUDA platform's host call: operands and results staged through pinned host memory.
#ifdef JAXBRIDGE_WITH_CUDA
#include <cuda_runtime_api.h>

#include "internal.h"

namespace jaxbridge::hostcall {
namespace {

// Stage through pinned host memory on XLA's stream. One staging block per call
// covers every operand and result (aligned to 256 bytes); the stream is synchronized
// once before the Python call and once after the copies back, because the staging
// memory is reused by the next call on this thread.
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

ffi::Error HostCallCuda(cudaStream_t stream, int32_t device, ffi::RemainingArgs args,
                        ffi::RemainingRets rets, int64_t callback_id) {
  thread_local PinnedStaging staging;
  Slots device_ins, device_outs;
  if (ffi::Error e = CollectSlots(args, rets, &device_ins, &device_outs); e.failure()) {
    return e;
  }
  if (HasDeviceFill(callback_id)) {  // no staging: see device_call.cc
    return InvokeOnDevice(callback_id, device_ins, device_outs, stream, device);
  }
  // A result XLA writes into an operand's buffer (aliases=) shares that operand's
  // staging too: the callable sees the same in-place memory as on the CPU, and the
  // staging block holds one copy of it.
  size_t total = 0;
  for (const Slot& s : device_ins) total += Aligned(s.bytes);
  std::vector<int> staged_with(device_outs.size(), -1);
  for (size_t j = 0; j < device_outs.size(); ++j) {
    for (size_t i = 0; i < device_ins.size() && staged_with[j] < 0; ++i) {
      if (device_outs[j].bytes > 0 && device_ins[i].data == device_outs[j].data &&
          device_ins[i].bytes == device_outs[j].bytes) {
        staged_with[j] = static_cast<int>(i);
      }
    }
    if (staged_with[j] < 0) total += Aligned(device_outs[j].bytes);
  }
  if (cudaError_t s = staging.Reserve(total > 0 ? total : 1); s != cudaSuccess) {
    return CudaError("cudaMallocHost", s);
  }
  Slots ins = device_ins, outs = device_outs;
  char* cursor = static_cast<char*>(staging.data);
  for (size_t i = 0; i < ins.size(); ++i) {
    ins[i].data = cursor;
    if (ins[i].bytes > 0) {
      cudaError_t s = cudaMemcpyAsync(cursor, device_ins[i].data, ins[i].bytes,
                                      cudaMemcpyDeviceToHost, stream);
      if (s != cudaSuccess) return CudaError("cudaMemcpyAsync (device to host)", s);
    }
    cursor += Aligned(ins[i].bytes);
  }
  for (size_t j = 0; j < outs.size(); ++j) {
    if (staged_with[j] >= 0) {
      outs[j].data = ins[staged_with[j]].data;
      continue;
    }
    outs[j].data = cursor;
    cursor += Aligned(outs[j].bytes);
  }
  if (cudaError_t s = cudaStreamSynchronize(stream); s != cudaSuccess) {
    return CudaError("cudaStreamSynchronize", s);
  }
  ffi::Error status = InvokeOnHost(callback_id, ins, outs);
  if (status.failure()) return status;
  for (size_t i = 0; i < outs.size(); ++i) {
    if (outs[i].bytes == 0) continue;
    cudaError_t s = cudaMemcpyAsync(device_outs[i].data, outs[i].data, outs[i].bytes,
                                    cudaMemcpyHostToDevice, stream);
    if (s != cudaSuccess) return CudaError("cudaMemcpyAsync (host to device)", s);
  }
  if (cudaError_t s = cudaStreamSynchronize(stream); s != cudaSuccess) {
    return CudaError("cudaStreamSynchronize", s);
  }
  return ffi::Error::Success();
}

}  // namespace
}  // namespace jaxbridge::hostcall

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxbridgeHostCallCuda, jaxbridge::hostcall::HostCallCuda,
                              xla::ffi::Ffi::Bind()
                                  .Ctx<xla::ffi::PlatformStream<cudaStream_t>>()  // stream
                                  .Ctx<xla::ffi::DeviceOrdinal>()  // its device
                                  .RemainingArgs()                 // device operands
                                  .RemainingRets()                 // device results
                                  .Attr<int64_t>("callback_id"));  // registry key
#endif  // JAXBRIDGE_WITH_CUDA
