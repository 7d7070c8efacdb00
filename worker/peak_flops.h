// A worker's peak FLOP/s: the denominator of every model-FLOPs utilisation (MFU) figure it
// reports. Measured once at start, in a way that does not depend on what else starts at the
// same moment: workers started together on one host used to measure their peaks at the same
// time, each against the others' GEMMs, and registered peaks up to 2x too low (so every MFU of
// theirs read 2x too high).
//
// Two guards:
//   1. Serialised per host: a measurement holds an exclusive flock(2) on a lock file
//      (`tandem-worker --peak-lock`, default /tmp/tandem-peak-flops.lock) while it runs, so
//      workers of one host (one /tmp) measure one at a time. Waiting is bounded; a worker that
//      cannot have the lock in time (or cannot open it) measures anyway and says so.
//   2. Duty-cycled samples, best taken: short samples with idle gaps between them, the
//      fastest kept. A neighbour the lock does not reach (a pod with its own /tmp, a training
//      job already running) slows some samples; the best is the one it did not.
// The result says how and when it was measured; the worker registers that with its peak and
// `tandem workers WORKER` shows it.
//
// Thread-safety: MeasurePeak may run on several threads or processes at once (that is what the
// lock is for); each call has its own lock descriptor.
#ifndef TANDEM_WORKER_PEAK_FLOPS_H_
#define TANDEM_WORKER_PEAK_FLOPS_H_

#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace tandem::worker {

// One sample of a GEMM: the FLOP/s it ran at.
using PeakSample = std::function<absl::StatusOr<double>()>;

struct PeakOptions {
  std::string lock_path = "/tmp/tandem-peak-flops.lock";  // empty: no lock
  absl::Duration lock_wait = absl::Seconds(30);           // then measure without it
  int warmup = 1;                                         // samples discarded first
  int samples = 8;                                        // kept; the best is the peak
  absl::Duration gap = absl::Milliseconds(20);            // idle between samples
  std::string what;  // the kernel, for the method text ("fp32 SGEMM 768^3 on 2 threads")
};

struct PeakFlops {
  double flops = 0.0;       // the best sample's FLOP/s
  int samples = 0;          // samples kept
  bool serialized = false;  // the host lock was held while measuring
  absl::Time measured_at;   // when the measurement ended
  // How, in words: the kernel, the samples, and whether (and why not) it was serialised.
  std::string method;
};

// Holds the lock (when it can), runs options.warmup then options.samples samples with
// options.gap between them, and returns the best. INVALID_ARGUMENT for samples < 1 or a
// negative warm-up or gap; a sample's error is returned as is; a sample that is not a positive
// finite FLOP/s figure is INTERNAL.
absl::StatusOr<PeakFlops> MeasurePeak(const PeakSample& sample, const PeakOptions& options);

// One fp32 SGEMM of n x n x n on this process's BLAS threads, timed: a CPU worker's sample.
PeakSample CpuSgemmSample(int n = 768);

}  // namespace tandem::worker

#endif  // TANDEM_WORKER_PEAK_FLOPS_H_
