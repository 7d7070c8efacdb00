// The unit of pipeline partitioning: one layer of the global sequence
// [embedding (0), block_0 .. block_{L-1}, head (L+1)].
//
// A stage runs its layers in order: Forward once per micro-batch, saving what Backward needs
// in that micro-batch's SavedContext; later Backward consumes the context, returns the input
// gradient and ADDS the parameter gradients into Parameter::grad (accumulating over the
// micro-batches of a step; the optimizer zeroes them). Several micro-batches may be in flight
// at once (1F1B, GPipe), so a layer keeps no per-micro-batch state of its own.
//
// Thread-safety: a layer is used by one thread at a time (its stage's executor).
#ifndef TANDEM_WORKER_MODEL_LAYER_H_
#define TANDEM_WORKER_MODEL_LAYER_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "worker/model/tensor.h"

namespace tandem::worker {

// A trainable tensor and its gradient.
struct Parameter {
  std::string name;  // e.g. "block_0.fc1.weight"
  Tensor value;
  Tensor grad;  // same shape as value
  // Decoupled weight decay applies (2-D weight matrices); not for biases and norm gains.
  bool decay = false;
  // One copy of a parameter that has another copy in another layer, possibly on another
  // stage, under the same name (gpt's wte, shared by the embedding and the head when
  // tie_embeddings). The copies start equal; the executor must add the copies' gradients
  // (all-reduce between the stages holding them) before the optimizer step so they stay so.
  bool tied = false;

  Parameter(std::string n, std::vector<int64_t> shape, bool weight_decay)
      : name(std::move(n)), value(shape), grad(shape), decay(weight_decay) {}
};

// What a layer's Forward leaves for its Backward, for one micro-batch. The layer decides
// what goes in (by position); the executor only measures and frees it.
struct SavedContext {
  std::vector<Tensor> tensors;
  std::vector<IntTensor> ints;

  size_t Bytes() const {
    size_t n = 0;
    for (const auto& t : tensors) n += t.bytes();
    for (const auto& t : ints) n += t.bytes();
    return n;
  }
  void Clear() {
    tensors.clear();
    ints.clear();
  }
};

// The data a micro-batch brings besides the activation flowing between layers.
struct MicroBatchData {
  // Input tokens, read by the embedding only: (B, T) for gpt, (B, K) for mlp_lm.
  const IntTensor* tokens = nullptr;
  // Next-token targets, read by the head only: (B, T) for gpt (tokens shifted by one), (B,)
  // for mlp_lm.
  const IntTensor* targets = nullptr;
  // Number of predictions in the GLOBAL batch (micro_batch_size x micro_batches x predictions
  // per sequence). The loss of a micro-batch is its summed cross-entropy divided by this, so
  // that the step loss (sum over micro-batches) is the mean over the global batch.
  int64_t loss_normalizer = 1;
};

class Layer {
 public:
  virtual ~Layer() = default;

  // "embedding", "block_3", "head".
  virtual const std::string& name() const = 0;
  virtual int global_index() const = 0;
  // True for the head: Forward outputs the micro-batch's loss as a (1,) tensor, and Backward
  // starts from d loss = grad_output[0] (1 when grad_output is empty).
  virtual bool is_loss() const { return false; }
  // True for the embedding: Forward ignores `input` and reads data.tokens; Backward returns
  // an empty grad_input.
  virtual bool reads_tokens() const { return false; }

  // Computes output from input (and data), filling ctx (which arrives empty).
  // INVALID_ARGUMENT on a shape mismatch or an out-of-range token.
  virtual absl::Status Forward(const Tensor& input, const MicroBatchData& data, SavedContext& ctx,
                               Tensor& output) = 0;
  // Fills ctx as Forward does for the same input and data, without the output: the
  // recomputation of a layer just before its backward (pipeline.recompute full) needs only
  // the context. ctx ends bit for bit as Forward leaves it; a layer may skip the work only
  // the output needs (a block's last GEMM and residual add, about a quarter of its forward).
  // The default runs Forward and drops the output.
  virtual absl::Status RecomputeContext(const Tensor& input, const MicroBatchData& data,
                                        SavedContext& ctx) {
    Tensor output;
    return Forward(input, data, ctx, output);
  }
  // Computes output as Forward does, bit for bit, keeping nothing for a backward: the forward
  // of a micro-batch the program recomputes (pipeline.recompute full), which keeps only its
  // layers' inputs. Sets *peak_bytes to the most its intermediates held at once (besides input
  // and output). The default runs Forward into a context it drops (the context's bytes); a
  // layer may free each intermediate as soon as it is used, as a no-grad forward does.
  virtual absl::Status ForwardWithoutSaving(const Tensor& input, const MicroBatchData& data,
                                            Tensor& output, size_t* peak_bytes) {
    SavedContext scratch;
    absl::Status s = Forward(input, data, scratch, output);
    *peak_bytes = scratch.Bytes();
    return s;
  }
  // Given d loss / d output, writes d loss / d input into grad_input (reallocated) and adds
  // the parameter gradients. ctx must be the one Forward filled for the same micro-batch.
  virtual absl::Status Backward(const Tensor& grad_output, const SavedContext& ctx,
                                Tensor& grad_input) = 0;

  // The split backward of the zero-bubble schedules. BackwardInput writes grad_input (what
  // the previous stage waits for) and leaves in ctx what BackwardWeight needs, freeing what it
  // no longer does; BackwardWeight then adds the parameter gradients and empties ctx. The pair
  // computes exactly what Backward does (bit for bit per micro-batch). The default keeps all
  // the work in BackwardInput, for layers whose weight gradients are cheap or inseparable.
  virtual absl::Status BackwardInput(const Tensor& grad_output, SavedContext& ctx,
                                     Tensor& grad_input) {
    absl::Status s = Backward(grad_output, ctx, grad_input);
    ctx.Clear();
    return s;
  }
  virtual absl::Status BackwardWeight(SavedContext& ctx) {
    ctx.Clear();
    return absl::OkStatus();
  }

  // Stable order: the same layer always lists its parameters in the same order.
  virtual std::vector<Parameter*> Parameters() = 0;
};

// The layers [layer_begin, layer_end) of a model whose global layer sequence is
// [Embedding, Block x n_layer, Head]: layer 0 is Embedding(cfg, seed), layer i in 1..n_layer
// is Block(cfg, i - 1, seed), layer n_layer + 1 is Head(cfg, seed). INVALID_ARGUMENT for a
// range that is empty or outside the sequence.
template <typename Embedding, typename Block, typename Head, typename Config>
absl::StatusOr<std::vector<std::unique_ptr<Layer>>> BuildLayerRange(const Config& cfg,
                                                                    int64_t n_layer, uint64_t seed,
                                                                    int layer_begin,
                                                                    int layer_end) {
  const int num_layers = static_cast<int>(n_layer) + 2;
  if (layer_begin < 0 || layer_end > num_layers || layer_begin >= layer_end) {
    return absl::InvalidArgumentError(absl::StrCat("layer range [", layer_begin, ", ", layer_end,
                                                   ") is not a non-empty sub-range of [0, ",
                                                   num_layers, ")"));
  }
  std::vector<std::unique_ptr<Layer>> layers;
  for (int g = layer_begin; g < layer_end; ++g) {
    if (g == 0) {
      layers.push_back(std::make_unique<Embedding>(cfg, seed));
    } else if (g == num_layers - 1) {
      layers.push_back(std::make_unique<Head>(cfg, seed));
    } else {
      layers.push_back(std::make_unique<Block>(cfg, g - 1, seed));
    }
  }
  return layers;
}

}  // namespace tandem::worker

#endif  // TANDEM_WORKER_MODEL_LAYER_H_
