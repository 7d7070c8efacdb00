// NCCL point-to-point between two GPUs through NcclTransport (the workers' GPU data plane,
// headers and links included), beside the link itself measured in the same run:
// cudaMemcpyPeerAsync between the same two devices, which moves bytes with no protocol at all.
// Issue 6's target is NCCL at >= 90% of the link's bandwidth.
//
//   build/bin/bench_nccl_p2p [--devices 0,1] [--sizes-mib 1,16,64,256] [--repeats 20]
//
// Per size: `repeats` messages posted back to back (rank 0 on the first device sends, rank 1
// on the second receives), timed on the host from the first post to the last completion,
// after a warm-up round; then the same both ways at once (what 1F1B's steady state does: an
// activation down while a gradient comes up), reported per direction. The peer copy is
// `repeats` copies timed with CUDA events. Both in decimal GB/s. Without two usable GPUs the
// bench says so and exits 77. The last line is machine-readable:
// "RESULT impl=tandem-nccl bytes=... nccl_gbps=... both_ways_gbps=... peer_copy_gbps=... ratio=..."
// for the largest size (ratio = nccl_gbps / peer_copy_gbps).
#include <cuda_runtime_api.h>
#include <gloo/rendezvous/hash_store.h>

#include <algorithm>
#include <barrier>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"
#include "worker/backend/cuda/cuda_status.h"
#include "worker/backend/cuda/device.h"
#include "worker/backend/cuda/device_buffer.h"
#include "worker/backend/cuda/module_loading.h"
#include "worker/transport/nccl_transport.h"

namespace {

using tandem::worker::MakeTransferTag;
using tandem::worker::NcclTransport;
using tandem::worker::NcclTransportOptions;
using tandem::worker::Payload;
using tandem::worker::cuda::DeviceBuffer;
using Clock = std::chrono::steady_clock;

struct Flags {
  int devices[2] = {0, 1};
  std::vector<int64_t> sizes_mib = {1, 16, 64, 256};
  int repeats = 20;
};

bool ParseList(const char* text, std::vector<int64_t>* out) {
  out->clear();
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    int64_t v = 0;
    if (!absl::SimpleAtoi(part, &v) || v <= 0) return false;
    out->push_back(v);
  }
  return !out->empty();
}

bool ParseFlags(int argc, char** argv, Flags& f) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) return false;
    const char* v = argv[++i];
    std::vector<int64_t> list;
    if (a == "--devices") {
      if (!ParseList(v, &list) || list.size() != 2 || list[0] == list[1]) return false;
      f.devices[0] = static_cast<int>(list[0]);
      f.devices[1] = static_cast<int>(list[1]);
    } else if (a == "--sizes-mib") {
      if (!ParseList(v, &f.sizes_mib)) return false;
    } else if (a == "--repeats") {
      if (!absl::SimpleAtoi(v, &f.repeats) || f.repeats < 1 || f.repeats > 1000) return false;
    } else {
      return false;
    }
  }
  return true;
}

double Gbps(size_t bytes, int count, double seconds) {
  return static_cast<double>(bytes) * count / seconds / 1e9;
}

// GB/s of `repeats` cudaMemcpyPeerAsync copies of `bytes` from src to dst (peer access on when
// the devices allow it, as NCCL's P2P transport uses it), timed with events on src.
absl::StatusOr<double> PeerCopyGbps(int src, int dst, void* to, const void* from, size_t bytes,
                                    int repeats) {
  TANDEM_CUDA_RETURN_IF_ERROR(cudaSetDevice(src));
  int can = 0;
  TANDEM_CUDA_RETURN_IF_ERROR(cudaDeviceCanAccessPeer(&can, src, dst));
  if (can) {
    const cudaError_t e = cudaDeviceEnablePeerAccess(dst, 0);
    if (e == cudaErrorPeerAccessAlreadyEnabled) {
      (void)cudaGetLastError();
    } else {
      TANDEM_CUDA_RETURN_IF_ERROR(e);
    }
  }
  cudaStream_t stream = nullptr;
  cudaEvent_t begin = nullptr, end = nullptr;
  TANDEM_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  TANDEM_CUDA_RETURN_IF_ERROR(cudaEventCreate(&begin));
  TANDEM_CUDA_RETURN_IF_ERROR(cudaEventCreate(&end));
  TANDEM_CUDA_RETURN_IF_ERROR(cudaMemcpyPeerAsync(to, dst, from, src, bytes, stream));  // warm-up
  TANDEM_CUDA_RETURN_IF_ERROR(cudaEventRecord(begin, stream));
  for (int k = 0; k < repeats; ++k) {
    TANDEM_CUDA_RETURN_IF_ERROR(cudaMemcpyPeerAsync(to, dst, from, src, bytes, stream));
  }
  TANDEM_CUDA_RETURN_IF_ERROR(cudaEventRecord(end, stream));
  TANDEM_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(end));
  float ms = 0.0f;
  TANDEM_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, begin, end));
  (void)cudaEventDestroy(begin);
  (void)cudaEventDestroy(end);
  (void)cudaStreamDestroy(stream);
  return Gbps(bytes, repeats, ms * 1e-3);
}

// One rank's buffers, on its device.
struct RankBuffers {
  DeviceBuffer<char> out, in;
};

// Seconds for `repeats` messages of `bytes` from rank 0 to rank 1 (and back at the same time
// when `both_ways`), the later of the two ranks' first-post-to-last-completion times. `round`
// keeps each round's tags apart.
absl::StatusOr<double> NcclSeconds(NcclTransport* t[2], const int devices[2], RankBuffers b[2],
                                   size_t bytes, int repeats, bool both_ways, int round) {
  std::barrier start(2);
  auto rank = [&](int r) -> absl::StatusOr<double> {
    TANDEM_CUDA_RETURN_IF_ERROR(cudaSetDevice(devices[r]));
    const int peer = 1 - r;
    const bool sends = r == 0 || both_ways;
    const bool receives = r == 1 || both_ways;
    auto tag = [&](int k) { return MakeTransferTag(Payload::kActivation, round, k); };
    start.arrive_and_wait();
    const Clock::time_point t0 = Clock::now();
    for (int k = 0; k < repeats; ++k) {
      if (receives) {
        RETURN_IF_ERROR(t[r]->PostRecv(peer, tag(k), b[r].in.data(), bytes));
      }
      if (sends) {
        RETURN_IF_ERROR(t[r]->PostSend(peer, tag(k), b[r].out.data(), bytes));
      }
    }
    for (int k = 0; receives && k < repeats; ++k) {
      RETURN_IF_ERROR(t[r]->WaitRecv(peer, tag(k)));
    }
    RETURN_IF_ERROR(t[r]->WaitSends());
    return std::chrono::duration<double>(Clock::now() - t0).count();
  };
  auto other = std::async(std::launch::async, rank, 1);
  absl::StatusOr<double> a = rank(0);
  absl::StatusOr<double> c = other.get();
  RETURN_IF_ERROR(a);
  RETURN_IF_ERROR(c);
  return std::max(*a, *c);
}

int Run(const Flags& f) {
  absl::StatusOr<int> count = tandem::worker::cuda::CudaDeviceCount();
  if (!count.ok() || *count < 2 || std::max(f.devices[0], f.devices[1]) >= *count) {
    std::printf("bench_nccl_p2p: needs two CUDA devices (NCCL wants one per rank); %s\n",
                count.ok() ? absl::StrCat(*count, " visible").c_str()
                           : std::string(count.status().message()).c_str());
    return 77;
  }
  const size_t max_bytes =
      static_cast<size_t>(*std::max_element(f.sizes_mib.begin(), f.sizes_mib.end())) << 20;
  RankBuffers b[2];
  for (int r = 0; r < 2; ++r) {
    if (cudaSetDevice(f.devices[r]) != cudaSuccess) return 1;
    auto out = DeviceBuffer<char>::Create(max_bytes);
    auto in = DeviceBuffer<char>::Create(max_bytes);
    if (!out.ok() || !in.ok()) {
      std::printf("bench_nccl_p2p: %s\n",
                  (out.ok() ? in.status() : out.status()).ToString().c_str());
      return 1;
    }
    b[r].out = *std::move(out);
    b[r].in = *std::move(in);
  }
  gloo::rendezvous::HashStore store;
  auto connect = [&](int r) {
    NcclTransportOptions o;
    o.rank = r;
    o.size = 2;
    o.device = f.devices[r];
    o.connect_timeout = std::chrono::seconds(60);
    o.op_timeout = std::chrono::seconds(60);
    return NcclTransport::Connect(o, store);
  };
  auto f1 = std::async(std::launch::async, connect, 1);
  auto t0 = connect(0);
  auto t1 = f1.get();
  if (!t0.ok() || !t1.ok()) {
    std::printf("bench_nccl_p2p: connect: %s\n",
                (t0.ok() ? t1.status() : t0.status()).ToString().c_str());
    return 1;
  }
  NcclTransport* t[2] = {t0->get(), t1->get()};
  cudaDeviceProp prop[2];
  for (int r = 0; r < 2; ++r) (void)cudaGetDeviceProperties(&prop[r], f.devices[r]);
  std::printf(
      "NCCL %d.%d.%d point-to-point through NcclTransport: cuda:%d (%s) -> cuda:%d (%s), "
      "%d messages per size\n",
      NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH, f.devices[0], prop[0].name, f.devices[1], prop[1].name,
      f.repeats);
  std::printf("%10s %16s %18s %8s %26s\n", "size MiB", "peer copy GB/s", "NCCL one-way GB/s",
              "ratio", "NCCL both ways GB/s/dir");
  std::string result;
  int round = 0;
  for (int64_t mib : f.sizes_mib) {
    const size_t bytes = static_cast<size_t>(mib) << 20;
    absl::StatusOr<double> copy =
        PeerCopyGbps(f.devices[0], f.devices[1], b[1].in.data(), b[0].out.data(), bytes, f.repeats);
    // A warm-up round, then the timed ones.
    absl::StatusOr<double> warm = NcclSeconds(t, f.devices, b, bytes, 2, true, round++);
    absl::StatusOr<double> one = NcclSeconds(t, f.devices, b, bytes, f.repeats, false, round++);
    absl::StatusOr<double> both = NcclSeconds(t, f.devices, b, bytes, f.repeats, true, round++);
    for (const absl::Status& s : {copy.status(), warm.status(), one.status(), both.status()}) {
      if (!s.ok()) {
        std::printf("bench_nccl_p2p: %lld MiB: %s\n", static_cast<long long>(mib),
                    s.ToString().c_str());
        return 1;
      }
    }
    const double nccl = Gbps(bytes, f.repeats, *one);
    const double duplex = Gbps(bytes, f.repeats, *both);
    std::printf("%10lld %16.1f %18.1f %8.3f %26.1f\n", static_cast<long long>(mib), *copy, nccl,
                nccl / *copy, duplex);
    if (bytes == max_bytes) {
      result = absl::StrCat("RESULT impl=tandem-nccl bytes=", bytes, " nccl_gbps=", nccl,
                            " both_ways_gbps=", duplex, " peer_copy_gbps=", *copy,
                            " ratio=", nccl / *copy);
    }
  }
  std::printf("%s\n", result.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  tandem::worker::cuda::UseEagerModuleLoading();  // before any CUDA call
  Flags f;
  if (!ParseFlags(argc, argv, f)) {
    std::fprintf(stderr,
                 "usage: bench_nccl_p2p [--devices A,B] [--sizes-mib 1,16,64,256] "
                 "[--repeats 20]\n");
    return 2;
  }
  return Run(f);
}
