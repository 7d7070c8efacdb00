// The host-only half shared by the GPU stages of every architecture (GpuGpt, GpuLlama): the
// precision, one parameter tensor of a stage's flat buffers, the device-memory categories,
// which layers of [embedding, block_0 .. block_{L-1}, head] a stage holds, and the building of
// a layout (offsets into the fp32 buffers and the bf16 compute copies). Plain C++ with no CUDA:
// every build compiles it, and its users' tests run without a GPU.
// Thread-safety: the functions are pure (thread-safe); LayoutBuilder is thread-compatible.
#ifndef TANDEM_WORKER_BACKEND_CUDA_GPU_STAGE_LAYOUT_H_
#define TANDEM_WORKER_BACKEND_CUDA_GPU_STAGE_LAYOUT_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "worker/model/random.h"

namespace tandem::worker::cuda {

enum class GpuPrecision { kFp32, kBf16 };

// One parameter tensor in the flat buffers.
struct GpuTensor {
  std::string name;            // the CPU layer's Parameter name
  std::vector<int64_t> shape;  // as the CPU Parameter's
  size_t offset = 0;           // into the fp32 parameter / gradient / moment buffers
  size_t count = 0;            // elements
  bool decay = false;          // weight decay applies (2-D weights), as Parameter::decay
  bool compute_copy = false;   // has a bf16 compute copy (GEMM weights, in kBf16 only)
  size_t compute_offset = 0;   // into the bf16 buffer, when compute_copy
  // One copy of a parameter another stage holds too (a tied token embedding, on a stage that
  // has only one of embedding and head): its gradient must be summed with the other copy's.
  bool tied = false;
  bool tied_copy = false;  // the head's copy (a tied embedding on a stage without the embedding)
};

// Device memory, in bytes, by purpose.
struct GpuStageMemory {
  size_t parameters = 0;       // fp32 master weights
  size_t compute_weights = 0;  // bf16 copies of the GEMM weights (0 in kFp32)
  size_t gradients = 0;        // fp32, one per parameter
  size_t optimizer_state = 0;  // AdamW m and v, fp32
  size_t activations = 0;      // saved for backward, one micro-batch (one slot), all layers
  size_t workspace = 0;        // scratch reused by every layer, token ids, loss, norm
  // The split backward's, one micro-batch between its I and W: the output gradients W needs
  // (allocated with a slot at its first I; not in total(), which 1F1B and GPipe never use).
  size_t weight_grad_inputs = 0;
  size_t total() const {
    return parameters + compute_weights + gradients + optimizer_state + activations + workspace;
  }
};

// Which layers a stage [layer_begin, layer_end) of a model with n_layer blocks holds (global
// indices: embedding 0, block_i i + 1, head n_layer + 1): blocks [b0, b1) by block index.
struct GpuStageShape {
  bool embedding = false;
  bool head = false;
  int64_t b0 = 0;
  int64_t b1 = 0;
  int64_t blocks() const { return b1 - b0; }
};
GpuStageShape StageShapeOf(int64_t n_layer, int64_t layer_begin, int64_t layer_end);

// Resolves layer_end -1 (the end) and checks that [layer_begin, layer_end) is a non-empty range
// within the n_layer + 2 layers; INVALID_ARGUMENT otherwise.
absl::Status ResolveLayerRange(int64_t n_layer, int64_t* layer_begin, int64_t* layer_end);

// Appends tensors to a layout in order, assigning their offsets; in kBf16 a GEMM weight also
// gets a place in the compute-copy buffer.
class LayoutBuilder {
 public:
  explicit LayoutBuilder(GpuPrecision precision) : bf16_(precision == GpuPrecision::kBf16) {}
  // Adds one tensor and returns it (valid until the next Add).
  GpuTensor& Add(std::string name, std::vector<int64_t> shape, bool decay, bool gemm);
  std::vector<GpuTensor> Take() { return std::move(layout_); }

 private:
  bool bf16_;
  std::vector<GpuTensor> layout_;
  size_t offset_ = 0;
  size_t compute_offset_ = 0;
};

// Elements of the fp32 parameter buffer, and of the bf16 compute-copy buffer.
size_t ParameterElements(const std::vector<GpuTensor>& layout);
size_t ComputeCopyElements(const std::vector<GpuTensor>& layout);

// The parameter-dependent categories of a layout's memory (parameters, compute copies,
// gradients, AdamW moments); the activations and workspace are the architecture's.
GpuStageMemory ParameterMemory(const std::vector<GpuTensor>& layout);

// out[i] = float(rng.Normal() * stddev), as the CPU layers' InitNormal draws.
void FillNormal(Rng& rng, float stddev, float* out, size_t count);

// The CPU layers' init standard deviation (worker/model/layer_init.h), and the residual
// projections' kInitStd / sqrt(2 n_layer).
inline constexpr float kGpuInitStd = 0.02f;
float ResidualProjectionStd(int64_t n_layer);

}  // namespace tandem::worker::cuda

#endif  // TANDEM_WORKER_BACKEND_CUDA_GPU_STAGE_LAYOUT_H_
