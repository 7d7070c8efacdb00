// Optimizers over a stage's parameters: AdamW (decoupled weight decay, bias correction) and
// SGD. The learning rate comes with every step (the coordinator owns the schedule).
//
// Step() reads each Parameter::grad (times the step's gradient scale, clipping's factor, folded
// into the same pass), updates Parameter::value, then zeroes the grad. State
// (moments, step counts) is kept per parameter, keyed by position in the list given to the
// constructor, which must stay the same for the optimizer's lifetime.
// Thread-safety: not thread-safe; one owner (the executor).
#ifndef TANDEM_WORKER_MODEL_OPTIMIZER_H_
#define TANDEM_WORKER_MODEL_OPTIMIZER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/shard_range.h"
#include "tandem/v1/spec.pb.h"
#include "worker/model/layer.h"

namespace tandem::worker {

// One piece of optimizer state for checkpoints: the parameter it belongs to (index into the
// list given to the constructor), a key ("adam_m"), and its storage (f32 values of the
// parameter's shape, or a single int64 counter). A sharded optimizer's f32 slot holds only the
// elements [offset, offset + f32->size()) of the parameter's.
struct OptimizerSlot {
  size_t param = 0;
  std::string key;
  std::vector<float>* f32 = nullptr;
  int64_t* i64 = nullptr;
  size_t offset = 0;
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  // The state to save and restore, in a fixed order (empty for stateless optimizers).
  virtual std::vector<OptimizerSlot> Slots() { return {}; }
  // Applies one update with learning rate `lr` to the gradients times `grad_scale` and zeroes
  // them. The scale is applied inside the update's pass, element by element as `g * grad_scale`
  // (so the result is, bit for bit, that of scaling the gradients first), which saves a read and
  // a write of every gradient when clipping acts.
  virtual void Step(float lr, float grad_scale) = 0;
  void Step(float lr) { Step(lr, 1.0f); }
  // Bytes of optimizer state (moments).
  virtual size_t StateBytes() const = 0;
};

struct AdamWOptions {
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
};

// p -= lr * (mhat / (sqrt(vhat) + eps) + wd * p)   [wd only where Parameter::decay]
// with m, v the biased moments of g * grad_scale and mhat = m / (1 - beta1^t), vhat = v / (1 -
// beta2^t).
//
// Sharded (ZeRO stage 1, optimizer.shard_state): with `shard` (one range per parameter) it keeps
// the moments of those elements only and updates only them (the rest of the parameter is
// another replica's, copied in by the all-gather); every gradient is still zeroed. Element for
// element the arithmetic is the unsharded one's, so a sharded run's parameters are bit-for-bit
// those of an unsharded run given the same gradients.
class AdamW final : public Optimizer {
 public:
  AdamW(std::vector<Parameter*> params, const AdamWOptions& options,
        std::vector<ElementRange> shard = {});
  using Optimizer::Step;
  void Step(float lr, float grad_scale) override;
  std::vector<OptimizerSlot> Slots() override;
  size_t StateBytes() const override;

 private:
  struct State {
    std::vector<float> m;  // same size as the parameter
    std::vector<float> v;  // same size as the parameter
    int64_t step = 0;
  };
  std::vector<Parameter*> params_;
  std::vector<State> state_;          // parallel to params_
  std::vector<ElementRange> ranges_;  // parallel to params_: the elements updated
  AdamWOptions options_;
};

// p -= lr * (g * grad_scale + wd * p)   [wd only where Parameter::decay]
class Sgd final : public Optimizer {
 public:
  Sgd(std::vector<Parameter*> params, float weight_decay);
  using Optimizer::Step;
  void Step(float lr, float grad_scale) override;
  size_t StateBytes() const override { return 0; }

 private:
  std::vector<Parameter*> params_;
  float weight_decay_;
};

// From OptimizerSpec.name ("adamw" or "sgd"); INVALID_ARGUMENT names optimizer.name or the
// bad hyper-parameter. `shard`: as AdamW's (sgd keeps no state and ignores it).
absl::StatusOr<std::unique_ptr<Optimizer>> MakeOptimizer(const v1::OptimizerSpec& spec,
                                                         std::vector<Parameter*> params,
                                                         std::vector<ElementRange> shard = {});

}  // namespace tandem::worker

#endif  // TANDEM_WORKER_MODEL_OPTIMIZER_H_
