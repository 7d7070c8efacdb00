// Internals shared by the GPU stages' host halves (the memory plans) and device halves (the
// buffers themselves): a stage carves each allocation (an activation slot, the split
// backward's output gradients, the workspace) into typed sub-buffers with one Carver, written
// once over the element type of a bf16 buffer (`Half`): the device code carves device pointers
// with the device's bf16, the plan sizes the same carving with Bf16Bits (2 bytes, as bf16), so
// the plan is what Create allocates. Not a public API.
#ifndef TANDEM_WORKER_BACKEND_CUDA_GPU_STAGE_BUFFERS_H_
#define TANDEM_WORKER_BACKEND_CUDA_GPU_STAGE_BUFFERS_H_

#include <cstddef>
#include <cstdint>

namespace tandem::worker::cuda::gpu_stage_internal {

// A bf16 element for sizing only (the device's bf16 has the same size; gpu_stage.cc checks).
struct Bf16Bits {
  uint16_t bits;
};

constexpr size_t kAlign = 256;

// Carves typed sub-buffers out of one allocation (or, with base 0, only sizes them).
class Carver {
 public:
  explicit Carver(uintptr_t base) : base_(base) {}
  template <typename T>
  T* Take(size_t count) {
    used_ = (used_ + kAlign - 1) / kAlign * kAlign;
    T* p = reinterpret_cast<T*>(base_ + used_);
    used_ += count * sizeof(T);
    return p;
  }
  size_t used() const { return used_; }

 private:
  uintptr_t base_;
  size_t used_ = 0;
};

}  // namespace tandem::worker::cuda::gpu_stage_internal

#endif  // TANDEM_WORKER_BACKEND_CUDA_GPU_STAGE_BUFFERS_H_
