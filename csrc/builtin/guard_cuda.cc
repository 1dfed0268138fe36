// Guarded outputs (guard.h) on CUDA: the guards are filled and read back on XLA's
// stream, around the kernel's own handler (which launches on the same stream), and the
// guarded call waits for the stream before it reads them.
#include <cuda_runtime_api.h>

#include <string>

#include "guard.h"

namespace jaxbridge::builtin::guard {
namespace {

std::string Status(const char* what, cudaError_t status) {
  if (status == cudaSuccess) return "";
  return std::string(what) + " failed with CUDA error " + cudaGetErrorName(status) + " (" +
         cudaGetErrorString(status) + ")";
}

class CudaMemory final : public Memory {
 public:
  explicit CudaMemory(cudaStream_t stream) : stream_(stream) {}
  std::string Fill(void* device, size_t bytes) override {
    return Status("cudaMemsetAsync (guard)", cudaMemsetAsync(device, kCanary, bytes, stream_));
  }
  std::string Copy(void* dst, const void* src, size_t bytes) override {
    if (dst == src) return "";
    return Status("cudaMemcpyAsync (aliased operand)",
                  cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_));
  }
  std::string Fetch(unsigned char* host, const void* device, size_t bytes) override {
    return Status("cudaMemcpyAsync (guard)",
                  cudaMemcpyAsync(host, device, bytes, cudaMemcpyDeviceToHost, stream_));
  }
  std::string Wait() override {
    return Status("cudaStreamSynchronize", cudaStreamSynchronize(stream_));
  }

 private:
  cudaStream_t stream_;
};

}  // namespace
}  // namespace jaxbridge::builtin::guard

extern "C" XLA_FFI_Error* JaxbridgeGuardedCuda(XLA_FFI_CallFrame* frame) {
  namespace g = ::jaxbridge::builtin::guard;
  if (g::AnswerMetadataQuery(frame)) return nullptr;
  XLA_FFI_Stream_Get_Args args{XLA_FFI_Stream_Get_Args_STRUCT_SIZE, nullptr, frame->ctx,
                               nullptr};
  if (XLA_FFI_Error* error = frame->api->XLA_FFI_Stream_Get(&args)) return error;
  g::CudaMemory memory(static_cast<cudaStream_t>(args.stream));
  return g::Call(frame, g::Platform::kCuda, memory);
}
