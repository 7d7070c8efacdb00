// The DeviceCopier (worker/transport/device_copier.h) of a CUDA device, for the host-staged
// transport: staging buffers in pinned host memory (cudaMallocHost), copies with cudaMemcpyAsync
// on the copier's own non-blocking stream followed by a synchronisation of that stream, so each
// copy has finished when the call returns.
//
// The copier's stream does not order itself after the compute's streams: data to send must be
// complete on the device when CopyToHost is called, as NcclTransport requires of its sends (the
// CUDA StageCompute's calls return when the device is done), and received data is on the device
// when CopyToDevice returns. Every call makes the copier's device current on the calling thread.
//
// No CUDA type or header here (the .cc has them), so that main.cc can include it.
// Thread-safety: as DeviceCopier (one thread at a time).
#ifndef TANDEM_WORKER_BACKEND_CUDA_CUDA_DEVICE_COPIER_H_
#define TANDEM_WORKER_BACKEND_CUDA_CUDA_DEVICE_COPIER_H_

#include <memory>

#include "absl/status/statusor.h"
#include "worker/transport/device_copier.h"

namespace tandem::worker::cuda {

// A copier for CUDA device `device`. FAILED_PRECONDITION (or the runtime's error) when the device
// cannot be used or its stream cannot be created.
absl::StatusOr<std::unique_ptr<DeviceCopier>> NewCudaDeviceCopier(int device);

}  // namespace tandem::worker::cuda

#endif  // TANDEM_WORKER_BACKEND_CUDA_CUDA_DEVICE_COPIER_H_
