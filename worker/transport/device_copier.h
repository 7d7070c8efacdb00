// Copies between a device's memory and host memory, for HostStagedTransport
// (host_staged_transport.h): the one thing that transport needs from a device, as an interface
// with no device type in it, so that the transport builds and is tested without CUDA (the tests
// fake the device; worker/backend/cuda/cuda_device_copier.h is the CUDA one).
//
// Header-only (every member is pure or inline), so that a backend can implement it without
// linking the transport library.
//
// Thread-safety: a copier is used by one thread at a time (the executor's); implementations need
// not be thread-safe. A HostBuffer may be destroyed from any thread.
#ifndef TANDEM_WORKER_TRANSPORT_DEVICE_COPIER_H_
#define TANDEM_WORKER_TRANSPORT_DEVICE_COPIER_H_

#include <cstddef>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tandem::worker {

// Host memory a transfer is staged in: page-locked (pinned) where the device has it, so that
// copies to and from the device run at full speed. Frees its memory when destroyed.
class HostBuffer {
 public:
  virtual ~HostBuffer() = default;
  // Never null, also for a zero-byte buffer.
  virtual void* data() = 0;
  virtual size_t bytes() const = 0;
};

class DeviceCopier {
 public:
  virtual ~DeviceCopier() = default;

  // `bytes` bytes of host memory for staging (`bytes` may be 0). RESOURCE_EXHAUSTED when the
  // host has none left; the device's error otherwise. The buffer may outlive the copier.
  virtual absl::StatusOr<std::unique_ptr<HostBuffer>> AllocateHost(size_t bytes) = 0;

  // Copies `bytes` bytes from device memory at `src` to host memory at `dst` and returns once
  // `dst` holds them. `src` must hold its data when the call is made (the compute that wrote it
  // has finished). The device's error (a Status naming the failed call) otherwise.
  virtual absl::Status CopyToHost(void* dst, const void* src, size_t bytes) = 0;

  // Copies `bytes` bytes from host memory at `src` to device memory at `dst` and returns once
  // the device holds them (a later compute may read `dst`). The device's error otherwise.
  virtual absl::Status CopyToDevice(void* dst, const void* src, size_t bytes) = 0;
};

}  // namespace tandem::worker

#endif  // TANDEM_WORKER_TRANSPORT_DEVICE_COPIER_H_
