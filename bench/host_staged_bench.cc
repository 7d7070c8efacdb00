// The host-staged transport (device -> pinned host -> Gloo over loopback -> pinned host ->
// device) between two ranks on ONE GPU, the data plane of a pipeline whose stages share a
// device, beside what bounds it, measured in the same run: the device-to-host plus
// host-to-device copy of the same bytes with cudaMemcpy on pinned memory (the two copies the
// transport makes, with no network in between).
//
//   build/bin/bench_host_staged [--device 0] [--sizes-mib 1,16,64] [--repeats 10]
//
// Per size: `repeats` messages from rank 0 to rank 1 (two threads of this process, each with its
// own HostStagedTransport over a GlooTransport on 127.0.0.1 and its own copier), timed from the
// first post to the last completed receive after a warm-up message; and the copy pair timed the
// same way. Decimal GB/s. Without a usable GPU it says so and exits 77. The last line is
// machine-readable, for the largest size:
// "RESULT impl=tandem-host-staged bytes=... staged_gbps=... copy_gbps=... ratio=..."
#include <gloo/rendezvous/hash_store.h>

#include <barrier>
#include <chrono>
#include <cstdio>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"
#include "worker/backend/cuda/cuda_device_copier.h"
#include "worker/backend/cuda/device.h"
#include "worker/backend/cuda/module_loading.h"
#include "worker/transport/gloo_transport.h"
#include "worker/transport/host_staged_transport.h"
#include "worker/transport/transport.h"

namespace {

using tandem::worker::DeviceCopier;
using tandem::worker::GlooTransport;
using tandem::worker::GlooTransportOptions;
using tandem::worker::HostBuffer;
using tandem::worker::HostStagedTransport;
using tandem::worker::Transport;
using tandem::worker::cuda::DeviceMemory;
using Clock = std::chrono::steady_clock;

struct Flags {
  int device = 0;
  std::vector<int64_t> sizes_mib = {1, 16, 64};
  int repeats = 10;
};

bool ParseFlags(int argc, char** argv, Flags& f) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) return false;
    const char* v = argv[++i];
    if (a == "--device") {
      if (!absl::SimpleAtoi(v, &f.device) || f.device < 0) return false;
    } else if (a == "--sizes-mib") {
      f.sizes_mib.clear();
      for (absl::string_view part : absl::StrSplit(v, ',')) {
        int64_t mib = 0;
        if (!absl::SimpleAtoi(part, &mib) || mib <= 0 || mib > 4096) return false;
        f.sizes_mib.push_back(mib);
      }
    } else if (a == "--repeats") {
      if (!absl::SimpleAtoi(v, &f.repeats) || f.repeats < 1 || f.repeats > 1000) return false;
    } else {
      return false;
    }
  }
  return true;
}

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

struct Rank {
  std::unique_ptr<Transport> transport;
  DeviceMemory buffer;
};

// Two ranks on `device`, connected through an in-process store.
absl::StatusOr<std::vector<Rank>> ConnectRanks(int device, size_t bytes) {
  gloo::rendezvous::HashStore store;
  std::vector<std::future<absl::StatusOr<std::unique_ptr<GlooTransport>>>> gloo;
  for (int r = 0; r < 2; ++r) {
    gloo.push_back(std::async(std::launch::async, [&store, r] {
      GlooTransportOptions o;
      o.rank = r;
      o.size = 2;
      return GlooTransport::Connect(o, store);
    }));
  }
  std::vector<Rank> ranks(2);
  for (int r = 0; r < 2; ++r) {
    ASSIGN_OR_RETURN(std::unique_ptr<GlooTransport> inner, gloo[r].get());
    ASSIGN_OR_RETURN(std::unique_ptr<DeviceCopier> copier,
                     tandem::worker::cuda::NewCudaDeviceCopier(device));
    ranks[r].transport = std::make_unique<HostStagedTransport>(std::move(inner), std::move(copier));
    RETURN_IF_ERROR(tandem::worker::cuda::SetDevice(device));
    ASSIGN_OR_RETURN(ranks[r].buffer, DeviceMemory::Allocate(bytes));
    RETURN_IF_ERROR(ranks[r].buffer.Zero());
  }
  return ranks;
}

// Seconds for `repeats` messages of `bytes` from rank 0 to rank 1, after one warm-up message.
absl::StatusOr<double> StagedSeconds(std::vector<Rank>& ranks, int device, size_t bytes,
                                     int repeats) {
  std::barrier start(2);
  auto run = [&](int r) -> absl::StatusOr<double> {
    RETURN_IF_ERROR(tandem::worker::cuda::SetDevice(device));
    Transport& t = *ranks[r].transport;
    void* data = ranks[r].buffer.data();
    auto round = [&](int first_tag, int count) -> absl::Status {
      for (int k = 0; k < count; ++k) {
        const uint64_t tag = static_cast<uint64_t>(first_tag + k);
        if (r == 0) {
          RETURN_IF_ERROR(t.PostSend(1, tag, data, bytes));
        } else {
          RETURN_IF_ERROR(t.PostRecv(0, tag, data, bytes));
        }
      }
      if (r == 0) return t.WaitSends();
      for (int k = 0; k < count; ++k) RETURN_IF_ERROR(t.WaitRecv(0, first_tag + k));
      return absl::OkStatus();
    };
    RETURN_IF_ERROR(round(0, 1));  // warm-up: connections and staging buffers
    start.arrive_and_wait();
    const Clock::time_point t0 = Clock::now();
    RETURN_IF_ERROR(round(1, repeats));
    return Seconds(t0, Clock::now());
  };
  std::future<absl::StatusOr<double>> sender = std::async(std::launch::async, run, 0);
  absl::StatusOr<double> receiver = run(1);
  absl::StatusOr<double> sent = sender.get();
  RETURN_IF_ERROR(sent.status());
  RETURN_IF_ERROR(receiver.status());
  return std::max(*sent, *receiver);
}

// Seconds for `repeats` device -> pinned host -> device copy pairs of `bytes` through the same
// kind of copier the transport uses.
absl::StatusOr<double> CopySeconds(int device, void* dev, size_t bytes, int repeats) {
  ASSIGN_OR_RETURN(std::unique_ptr<DeviceCopier> copier,
                   tandem::worker::cuda::NewCudaDeviceCopier(device));
  ASSIGN_OR_RETURN(std::unique_ptr<HostBuffer> host, copier->AllocateHost(bytes));
  RETURN_IF_ERROR(copier->CopyToHost(host->data(), dev, bytes));  // warm-up
  const Clock::time_point t0 = Clock::now();
  for (int k = 0; k < repeats; ++k) {
    RETURN_IF_ERROR(copier->CopyToHost(host->data(), dev, bytes));
    RETURN_IF_ERROR(copier->CopyToDevice(dev, host->data(), bytes));
  }
  return Seconds(t0, Clock::now());
}

int Run(const Flags& f) {
  if (absl::Status s = tandem::worker::cuda::OpenDevice(f.device).status(); !s.ok()) {
    std::printf("bench_host_staged: no usable CUDA device %d (%s); nothing to measure\n", f.device,
                s.ToString().c_str());
    return 77;
  }
  int64_t largest = 0;
  for (int64_t mib : f.sizes_mib) largest = std::max(largest, mib);
  const size_t max_bytes = static_cast<size_t>(largest) << 20;
  absl::StatusOr<std::vector<Rank>> ranks = ConnectRanks(f.device, max_bytes);
  if (!ranks.ok()) {
    std::fprintf(stderr, "bench_host_staged: %s\n", ranks.status().ToString().c_str());
    return 1;
  }
  std::printf("host-staged transport, two ranks on cuda:%d, %d messages per size\n", f.device,
              f.repeats);
  std::printf("%10s %14s %14s %8s\n", "MiB", "staged GB/s", "copies GB/s", "ratio");
  double staged_gbps = 0, copy_gbps = 0;
  for (int64_t mib : f.sizes_mib) {
    const size_t bytes = static_cast<size_t>(mib) << 20;
    absl::StatusOr<double> staged = StagedSeconds(*ranks, f.device, bytes, f.repeats);
    absl::StatusOr<double> copies =
        CopySeconds(f.device, (*ranks)[0].buffer.data(), bytes, f.repeats);
    if (!staged.ok() || !copies.ok()) {
      std::fprintf(stderr, "bench_host_staged: %lld MiB: %s\n", static_cast<long long>(mib),
                   (!staged.ok() ? staged.status() : copies.status()).ToString().c_str());
      return 1;
    }
    staged_gbps = static_cast<double>(bytes) * f.repeats / *staged / 1e9;
    copy_gbps = static_cast<double>(bytes) * f.repeats / *copies / 1e9;
    std::printf("%10lld %14.2f %14.2f %8.3f\n", static_cast<long long>(mib), staged_gbps, copy_gbps,
                staged_gbps / copy_gbps);
  }
  std::printf(
      "RESULT impl=tandem-host-staged bytes=%zu staged_gbps=%.3f copy_gbps=%.3f ratio=%.3f\n",
      max_bytes, staged_gbps, copy_gbps, staged_gbps / copy_gbps);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  tandem::worker::cuda::UseEagerModuleLoading();  // before any CUDA call
  Flags f;
  if (!ParseFlags(argc, argv, f)) {
    std::fprintf(stderr,
                 "usage: bench_host_staged [--device N] [--sizes-mib 1,16,64] [--repeats N]\n");
    return 2;
  }
  return Run(f);
}
