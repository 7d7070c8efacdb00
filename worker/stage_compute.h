// StageCompute: the compute backend of a stage executor. The executor (worker/executor.h) owns
// the stage program, the data, the transport and the step's bookkeeping; a StageCompute owns
// what lives on the compute device: the layers of every stage (chunk) the worker holds, their
// parameters, gradients and optimizer state, and what each micro-batch's forward saved for its
// backward. The CPU backend (worker/cpu_stage_compute.h) runs the layers of worker/model; a
// CUDA backend implements the same interface on a device, so that the executor, the schedules
// and the coordinator do not care which one runs.
//
// Buffers: activations and gradients cross the interface as StageBuffers in the backend's
// memory (host memory for the CPU, device memory for CUDA), moved, never copied: the executor
// hands a received buffer to Forward, a Forward's output to the next stage's Forward (same
// worker) or to the transport (whose data pointers are then the backend's), and so on. When a
// call returns, its outputs are complete (a device backend has synchronised its stream), so the
// transport may read them at once.
//
// Chunks are numbered as the program lists them (program.chunks(i) is chunk i); micro-batches
// as in the schedule, in [0, slots) where slots is what Create was given.
//
// Thread-safety: one thread at a time (the executor's).
#ifndef TANDEM_WORKER_STAGE_COMPUTE_H_
#define TANDEM_WORKER_STAGE_COMPUTE_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "common/shard_range.h"
#include "tandem/v1/common.pb.h"
#include "worker/model/layer.h"

namespace tandem::worker {

// An activation or gradient tensor of (B, T, D) or (B, D) floats in the backend's memory.
class StageBuffer {
 public:
  virtual ~StageBuffer() = default;
  virtual void* data() = 0;
  virtual size_t bytes() const = 0;
};
using StageBufferPtr = std::unique_ptr<StageBuffer>;

// `bytes` zeroed bytes of host memory (pages touched) as a StageBuffer, for what is not a
// backend's tensor (a link probe's messages). RESOURCE_EXHAUSTED when they cannot be allocated.
absl::StatusOr<StageBufferPtr> NewHostBuffer(size_t bytes);

// One tensor of the stage's state for a checkpoint, in host memory, viewed in place (valid
// until the next call that changes the state).
struct StateTensor {
  std::string name;
  std::string dtype;  // "F32" or "I64"
  std::vector<int64_t> shape;
  const void* data = nullptr;
  size_t bytes = 0;
  // Sharded optimizer state (optimizer.shard_state): data holds only the float elements
  // [shard->begin, shard->end) of the tensor of `shape`, this replica's segment; the executor
  // gathers the whole tensor from the data-parallel group before it is written.
  std::optional<ElementRange> shard;
};

// name -> the tensor's bytes, for Restore.
using TensorLookup =
    std::function<absl::StatusOr<absl::Span<const uint8_t>>(const std::string& name)>;

// Copies the `bytes` bytes of tensor `name` from `lookup` into host memory at `dst`: the
// lookup's error, or INVALID_ARGUMENT when its size differs, both prefixed by `where`.
absl::Status CopyRestoredTensor(const TensorLookup& lookup, const std::string& name, void* dst,
                                size_t bytes, absl::string_view where);
// The same for bytes [offset, offset + bytes) of a tensor that must have `tensor_bytes` bytes
// (a replica's segment of sharded optimizer state).
absl::Status CopyRestoredRange(const TensorLookup& lookup, const std::string& name,
                               size_t tensor_bytes, size_t offset, void* dst, size_t bytes,
                               absl::string_view where);

// One copy of a tied parameter's gradient held by this worker (see Parameter::tied).
struct TiedGradient {
  std::string name;
  void* data = nullptr;  // the backend's memory
  size_t bytes = 0;
};

class StageCompute;

// Builds the compute backend of a validated program on a worker's device.
using ComputeFactory =
    std::function<absl::StatusOr<std::unique_ptr<StageCompute>>(const v1::StageProgram& program)>;

class StageCompute {
 public:
  virtual ~StageCompute() = default;

  // "cpu" or "cuda:N": where the buffers live.
  virtual std::string device() const = 0;

  // A float tensor of `shape` (contents undefined), for a receive.
  virtual absl::StatusOr<StageBufferPtr> NewBuffer(const std::vector<int64_t>& shape) = 0;

  // F of `chunk` for micro-batch `mb`: `input` is null on the first stage (which reads
  // data.tokens). On the last stage `output` stays null and the micro-batch's loss (its
  // summed cross-entropy / data.loss_normalizer) is returned; elsewhere 0 and *output is set.
  // With `save` false (evaluation) nothing is kept for a backward.
  virtual absl::StatusOr<double> Forward(int chunk, int mb, StageBufferPtr input,
                                         const MicroBatchData& data, bool save,
                                         StageBufferPtr* output) = 0;

  // Activation recomputation (an R action in the program). Whether this backend implements
  // ForwardKeepingInput and Recompute; the executor refuses a program with R's otherwise.
  virtual bool recomputes() const { return false; }
  // F of a micro-batch the program recomputes: as Forward with `save` (the same output and
  // loss), but all that stays for `mb` afterwards is each layer's input (a checkpoint per
  // layer, as Megatron's and DeepSpeed's per-layer checkpointing keep; nothing for a first
  // layer that reads tokens, which the caller keeps), counted in SavedBytes, until Recompute.
  // The forward itself holds one layer's working set at a time. (A backend may keep the
  // stage's input alone and recompute the stage at once, as CUDA does: cuda_stage_compute.h.)
  virtual absl::StatusOr<double> ForwardKeepingInput(int chunk, int mb, StageBufferPtr input,
                                                     const MicroBatchData& data,
                                                     StageBufferPtr* output) {
    return absl::UnimplementedError(
        absl::StrCat("the ", device(), " backend cannot recompute activations"));
  }
  // R of `chunk` for `mb`: re-runs its forward from the checkpoints ForwardKeepingInput kept,
  // with the same `data`, saving what the backward needs exactly as Forward with `save` does
  // (the same arithmetic, so the backward computes the same bits as without recomputation).
  // With `at_backward` false it does so now, layer by layer, and releases the checkpoints
  // (an R placed ahead of its backward, in an idle slot: the whole working set is held from
  // here to the backward). With `at_backward` true (the R right before its B or I) it only
  // arms the micro-batch: its backward then recomputes one layer at a time just before that
  // layer's backward, so at most one layer's working set beyond the checkpoints is ever held;
  // `data` must stay valid until that backward. INTERNAL when nothing is kept.
  virtual absl::Status Recompute(int chunk, int mb, const MicroBatchData& data, bool at_backward) {
    return absl::UnimplementedError(
        absl::StrCat("the ", device(), " backend cannot recompute activations"));
  }
  // The most bytes SavedBytes(chunk, mb) reached inside the last ForwardKeepingInput,
  // Recompute or Backward call of `chunk`, for the micro-batch it ran (its transient peak, which
  // the sizes before and after the call do not show: a backward that recomputes layer by layer); 0
  // where a backend keeps no such record.
  virtual size_t LastCallPeakSavedBytes(int chunk) const { return 0; }

  // B (input and weight gradients), I (input gradient only, leaving what W needs) or W (the
  // weight gradients of a micro-batch whose I ran) of `chunk` for `mb`, ADDING the parameter
  // gradients. `grad_output` is null on the last stage (d loss = 1) and for W; *grad_input is
  // set except on the first stage and for W. INTERNAL when no saved forward is there.
  virtual absl::Status Backward(int chunk, int mb, v1::ActionKind kind, StageBufferPtr grad_output,
                                StageBufferPtr* grad_input) = 0;

  // The device time of the latest Forward or Backward of `chunk`, by the device's own clock
  // (events on its compute stream), in microseconds; 0 for a backend without one (the CPU,
  // where the host's interval around the call is the compute).
  virtual int64_t last_device_us(int chunk) const { return 0; }

  // Whether the compute calls (Forward, Recompute, Backward, and the figures above) of two
  // DIFFERENT chunks may run at the same time from two threads: the executor then runs an
  // overlapped pair of the program (DualPipe's F;B, Action.overlap_with_next) at once. The
  // CUDA backend can (each chunk is its own GpuStage, with its own stream, cuBLAS handle and
  // workspace, so the two run side by side on the device); the CPU backend only when told to
  // (AllowConcurrentChunks: its one thread per worker is the worker's budget).
  virtual bool runs_chunks_concurrently() const { return false; }

  // Bytes saved by `mb`'s forward of `chunk` (or the input kept for its recomputation) and
  // not yet released by its backward.
  virtual size_t SavedBytes(int chunk, int mb) const = 0;
  // Drops every micro-batch's saved state (end of a step, or after a failure).
  virtual void DropSaved() = 0;

  // Parameter elements of this worker (every copy of a tied parameter counted).
  virtual int64_t parameter_count() const = 0;
  // What the chunk holds for the whole run, in bytes of the device's memory: its parameters
  // (with a device's compute copies), their gradients, its share of the optimizer state, and a
  // device backend's workspace. Saved activations are SavedBytes.
  struct StaticMemory {
    int64_t parameters = 0;
    int64_t gradients = 0;
    int64_t optimizer = 0;
    int64_t workspace = 0;
    int64_t total() const { return parameters + gradients + optimizer + workspace; }
  };
  virtual StaticMemory static_memory(int chunk) const = 0;
  int64_t static_bytes(int chunk) const { return static_memory(chunk).total(); }

  // Tied parameters: this worker's copies of their gradients, by name, then by copy (the
  // embedding's before the head's).
  virtual std::vector<TiedGradient> TiedGradients() = 0;
  // Makes both local copies of every tied gradient their sum (both stages on this worker).
  virtual absl::Status SumLocalTiedGradients() = 0;
  // Adds `other` (a buffer of this backend, from NewBuffer) into the copy `index` of
  // TiedGradients().
  virtual absl::Status AddToTiedGradient(size_t index, StageBuffer& other) = 0;

  // The squared L2 norm of the gradients (in double) and whether every element is finite.
  // With `count_tied` false the copies of tied parameters are left out; with it true each
  // tied parameter counts once. With sharded optimizer state only this replica's segment of
  // each parameter counts (the rest is another replica's after the reduce-scatter), so the
  // group's norms add up to the whole.
  struct GradStats {
    double sum_sq = 0.0;
    bool finite = true;
  };
  virtual absl::StatusOr<GradStats> GradientStats(bool count_tied) = 0;

  // Scales the gradients by `grad_scale`, runs the optimizer with `learning_rate` and zeroes
  // them; with `skip` only zeroes them. With sharded optimizer state only this replica's
  // segment of each parameter changes; the caller all-gathers the rest (LayerParameters).
  virtual absl::Status Apply(float learning_rate, float grad_scale, bool skip) = 0;

  // The state for a checkpoint, with global names ("<parameter>" then "<parameter>.<key>" of
  // the optimizer); with `list_tied` false the copies of tied parameters are left out, with
  // it true one copy of each is listed.
  virtual absl::StatusOr<std::vector<StateTensor>> CheckpointTensors(bool list_tied) = 0;
  // The names Restore reads (every parameter, a tied one once, and unless weights_only their
  // optimizer state).
  virtual std::vector<std::string> RestoreNames(bool weights_only) = 0;
  // Loads the state by name (every copy of a tied parameter from the same tensor), zeroing
  // the gradients; INVALID_ARGUMENT (prefixed by `where`) naming a tensor whose size differs.
  virtual absl::Status Restore(const TensorLookup& lookup, bool weights_only,
                               absl::string_view where) = 0;

  // Data parallelism (worker/grad_reducer.h). The layers of `chunk`, and the gradients of its
  // `layer`-th (0-based within the chunk) as host float spans, valid until the next Apply or
  // Restore; UNIMPLEMENTED where the gradients are not in host memory (a device backend).
  virtual int num_layers(int chunk) const { return 0; }
  virtual absl::StatusOr<std::vector<absl::Span<float>>> LayerGradients(int chunk, int layer) {
    return absl::UnimplementedError(
        absl::StrCat("the ", device(), " backend cannot reduce gradients across replicas"));
  }
  // The parameter values of `chunk`'s `layer`-th layer as host float spans, in the order of
  // LayerGradients (what the all-gather of sharded optimizer state fills in); as LayerGradients.
  virtual absl::StatusOr<std::vector<absl::Span<float>>> LayerParameters(int chunk, int layer) {
    return absl::UnimplementedError(
        absl::StrCat("the ", device(), " backend cannot shard optimizer state across replicas"));
  }
  // Called by a B or W after it has added the weight gradients of `layer` (0-based within the
  // chunk), in the backward's order (the last layer first), so that a caller can start
  // reducing them while the rest of the backward runs. Null: none. A backend without host
  // gradients never calls it.
  using LayerDoneHook = std::function<void(int chunk, int layer)>;
  virtual void set_layer_done_hook(LayerDoneHook hook) {}

  // The host-side parameters, in layer order, where the backend keeps them on the host (the
  // CPU's; empty for a device backend). For tests.
  virtual std::vector<Parameter*> HostParameters() { return {}; }
};

}  // namespace tandem::worker

#endif  // TANDEM_WORKER_STAGE_COMPUTE_H_
