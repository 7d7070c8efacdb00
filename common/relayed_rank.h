// The rank a failure is attributed to when the step relay (RunStepRequest.relay) carried it: a
// relaying worker whose forwarded call failed fails its own call with that status and names the
// rank that failed (common/rpc.h's kRelayedRankKey trailer), and the caller's status carries the
// rank as a payload, so that the failure is attributed to the worker that failed rather than to
// the one that relayed it. Header-only, no gRPC: the coordinator's core reads it.
#ifndef TANDEM_COMMON_RELAYED_RANK_H_
#define TANDEM_COMMON_RELAYED_RANK_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace tandem {

inline constexpr char kRelayedRankPayload[] = "type.tandem.dev/relayed_rank";

// `s` (not OK) with `rank` (>= 0) attached as the relayed rank; OK or a negative rank: `s`.
inline absl::Status WithRelayedRank(absl::Status s, int rank) {
  if (!s.ok() && rank >= 0) s.SetPayload(kRelayedRankPayload, absl::Cord(absl::StrCat(rank)));
  return s;
}

// The relayed rank attached to `s`, or -1.
inline int RelayedRank(const absl::Status& s) {
  const auto payload = s.GetPayload(kRelayedRankPayload);
  int rank = -1;
  if (!payload.has_value() || !absl::SimpleAtoi(std::string(*payload), &rank) || rank < 0) {
    return -1;
  }
  return rank;
}

}  // namespace tandem

#endif  // TANDEM_COMMON_RELAYED_RANK_H_
