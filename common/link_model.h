// The cost of moving one message between two workers, as the planner sees it: one_way =
// latency + bytes x seconds_per_byte, fitted to what StageWorker.ProbeLink measured (a
// v1::LinkProfile in the model's profile). Pure code, no I/O.
#ifndef TANDEM_COMMON_LINK_MODEL_H_
#define TANDEM_COMMON_LINK_MODEL_H_

#include <cstdint>

#include "absl/status/status.h"
#include "tandem/v1/common.pb.h"

namespace tandem {

// Seconds to move `bytes` bytes one way over `link`: latency + bytes x seconds_per_byte.
// 0 for bytes <= 0, and for an empty (unmeasured) link, so that a profile without a link
// plans transfers as free, as before links were measured.
double TransferSeconds(const v1::LinkProfile& link, int64_t bytes);

// Seconds to sum `bytes` bytes across `ranks` workers with a ring all-reduce over such links:
// 2 (R - 1) steps, each moving a 1/R piece one way (latency + piece x per-byte cost). The
// per-byte cost is the measured all-reduce's where the link has one (allreduce_seconds over
// allreduce_bytes, less its two latencies: the ring's copies and sums, and on CPU workers the
// cores the transfers take, are in it), else the fit's seconds_per_byte. 0 for R < 2,
// bytes <= 0 or an empty link.
double AllReduceSeconds(const v1::LinkProfile& link, int64_t bytes, int ranks);

// Sets link->latency_seconds and link->seconds_per_byte to the least-squares fit of
// one_way_seconds = latency + bytes x seconds_per_byte over link->samples(), with both terms
// constrained to >= 0 (the best fit on the boundary when the free fit has a negative term).
// With a single distinct size the time is all latency (seconds_per_byte = 0).
// INVALID_ARGUMENT, leaving the link unchanged, when there are no samples, a size is <= 0 or
// a time is negative or not finite.
absl::Status FitLink(v1::LinkProfile* link);

}  // namespace tandem

#endif  // TANDEM_COMMON_LINK_MODEL_H_
