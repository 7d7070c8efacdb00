// Test-only fault injection (tandem-worker --test-fail-at): one action of one training step
// fails with INTERNAL, as a failed kernel would, so that tests can follow a worker's error to
// the CLI. The executor (worker/executor.h) checks the armed fault before each action.
#ifndef TANDEM_WORKER_FAULT_INJECTION_H_
#define TANDEM_WORKER_FAULT_INJECTION_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "tandem/v1/common.pb.h"

namespace tandem::worker {

// The action of `kind` on micro-batch `micro_batch` (-1: any) in training step `step` fails.
struct InjectedFault {
  int64_t step = -1;  // the step's index (0-based); -1: none
  v1::ActionKind kind = v1::ACTION_F;
  int micro_batch = -1;
  bool Matches(int64_t s, const v1::Action& a) const {
    return step >= 0 && s == step && a.kind() == kind &&
           (micro_batch < 0 || a.micro_batch() == micro_batch);
  }
};

// "STEP:KIND" or "STEP:KIND:MB": STEP numbered from 1 as users see steps (common/step_number.h),
// KIND as in the schedule notation (F, B, I, W, SEND_F, ...), MB a micro-batch index.
// INVALID_ARGUMENT naming the part that is wrong.
absl::StatusOr<InjectedFault> ParseInjectedFault(absl::string_view text);

// The error a matching action returns instead of running.
absl::Status InjectedFaultError();

}  // namespace tandem::worker

#endif  // TANDEM_WORKER_FAULT_INJECTION_H_
