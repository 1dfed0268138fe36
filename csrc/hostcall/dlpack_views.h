// DLPack views of XLA's buffers: legacy "dltensor" capsules (DLPack 0.x ABI, which
// torch.from_dlpack, CuPy and NumPy all accept) that point at memory XLA owns.
//
// Used by the host-call trampoline's device path (device_call.cc, reached from cuda_staging.cc): on the
// CUDA platform a host function that accepts device buffers (a wrapped torch function)
// gets capsules with kDLCUDA pointing at XLA's device buffers instead of staged host
// copies. Nothing is copied and nothing is freed: the deleter only releases the
// capsule's own bookkeeping and counts down `ViewCount`, so the trampoline can tell
// after the call whether the callable kept a tensor that views XLA's memory.
//
// The structs below are the DLPack 0.x ABI (dlpack/dlpack.h, Apache-2.0), declared here
// so that the build needs no DLPack header.
#pragma once

#include <Python.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

namespace jaxbridge::dlpack {

enum DeviceType : int32_t { kDLCPU = 1, kDLCUDA = 2 };
enum TypeCode : uint8_t {
  kDLInt = 0, kDLUInt = 1, kDLFloat = 2, kDLBfloat = 4, kDLComplex = 5, kDLBool = 6
};

struct DLDevice {
  int32_t device_type;
  int32_t device_id;
};
struct DLDataType {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
};
struct DLTensor {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;
  uint64_t byte_offset;
};
struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensor* self);
};

// How many views of one call (or of all calls, `Total`) are still alive: a consumer
// (torch) calls the deleter when the last tensor sharing the memory dies.
struct ViewCount {
  std::atomic<int64_t> alive{0};
  static std::atomic<int64_t>& Total() {
    static std::atomic<int64_t> total{0};
    return total;
  }
};

namespace detail {
struct Context {
  DLManagedTensor managed;
  std::vector<int64_t> shape, strides;
  std::shared_ptr<ViewCount> count;
};

inline void Delete(DLManagedTensor* self) {
  auto* ctx = static_cast<Context*>(self->manager_ctx);
  ctx->count->alive.fetch_sub(1, std::memory_order_acq_rel);
  ViewCount::Total().fetch_sub(1, std::memory_order_acq_rel);
  delete ctx;
}

// A capsule nobody consumed still owns its DLManagedTensor (the DLPack protocol: the
// consumer renames it "used_dltensor" and takes over).
inline void CapsuleDestructor(PyObject* capsule) {
  if (!PyCapsule_IsValid(capsule, "dltensor")) return;
  auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, "dltensor"));
  if (managed != nullptr && managed->deleter != nullptr) managed->deleter(managed);
}
}  // namespace detail

// The DLPack dtype of kind 'b' (bool), 'i', 'u', 'f', 'B' (bfloat16) or 'c' (complex)
// and `bits`.
inline DLDataType DataType(char kind, int bits) {
  uint8_t code = kind == 'b' ? kDLBool : kind == 'i' ? kDLInt : kind == 'u' ? kDLUInt
               : kind == 'f' ? kDLFloat : kind == 'B' ? kDLBfloat : kDLComplex;
  return DLDataType{code, static_cast<uint8_t>(bits), 1};
}

// A new "dltensor" capsule viewing `data` (row-major, `shape`) on the given device;
// counted in `count` until its consumer releases it. Returns nullptr with a Python
// error set on failure. Needs the GIL.
inline PyObject* Capsule(void* data, const std::vector<int64_t>& shape, DLDataType dtype,
                         int32_t device_type, int32_t device_id,
                         const std::shared_ptr<ViewCount>& count) {
  auto* ctx = new detail::Context();
  ctx->shape = shape;
  ctx->strides.assign(shape.size(), 1);
  for (size_t d = shape.size(); d-- > 1;) ctx->strides[d - 1] = ctx->strides[d] * shape[d];
  ctx->count = count;
  DLTensor& t = ctx->managed.dl_tensor;
  t.data = data;
  t.device = DLDevice{device_type, device_id};
  t.ndim = static_cast<int32_t>(shape.size());
  t.dtype = dtype;
  t.shape = ctx->shape.data();
  t.strides = ctx->strides.data();
  t.byte_offset = 0;
  ctx->managed.manager_ctx = ctx;
  ctx->managed.deleter = detail::Delete;
  count->alive.fetch_add(1, std::memory_order_acq_rel);
  ViewCount::Total().fetch_add(1, std::memory_order_acq_rel);
  PyObject* capsule = PyCapsule_New(&ctx->managed, "dltensor", detail::CapsuleDestructor);
  if (capsule == nullptr) detail::Delete(&ctx->managed);
  return capsule;
}

}  // namespace jaxbridge::dlpack
