// AdamW's hyper-parameters, as the CUDA backend's optimizer kernel (cuda_kernels.h AdamWStep)
// and GpuGpt take them. Plain data, no CUDA types.
#ifndef TANDEM_WORKER_BACKEND_CUDA_ADAMW_HYPER_H_
#define TANDEM_WORKER_BACKEND_CUDA_ADAMW_HYPER_H_

namespace tandem::worker::cuda {

struct AdamWHyper {
  float lr = 0.0f;
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;  // applied only where `decay`
};

}  // namespace tandem::worker::cuda

#endif  // TANDEM_WORKER_BACKEND_CUDA_ADAMW_HYPER_H_
