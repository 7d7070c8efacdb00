#include "worker/fault_injection.h"

#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/schedule.h"
#include "common/step_number.h"

namespace tandem::worker {

absl::StatusOr<InjectedFault> ParseInjectedFault(absl::string_view text) {
  const std::vector<std::string> parts = absl::StrSplit(text, ':');
  InjectedFault f;
  if (parts.size() < 2 || parts.size() > 3) {
    return absl::InvalidArgumentError(
        absl::StrCat("fault '", text, "': expected STEP:KIND or STEP:KIND:MICRO_BATCH"));
  }
  int64_t number = 0;
  if (!absl::SimpleAtoi(parts[0], &number) || number < 1) {
    return absl::InvalidArgumentError(absl::StrCat("fault '", text, "': step '", parts[0],
                                                   "' is not a step number >= 1 (the first is 1)"));
  }
  f.step = StepIndex(number);
  bool known = false;
  for (int k = v1::ActionKind_MIN; k <= v1::ActionKind_MAX; ++k) {
    if (!v1::ActionKind_IsValid(k)) continue;
    const auto kind = static_cast<v1::ActionKind>(k);
    if (parts[1] == ActionKindName(kind)) {
      f.kind = kind;
      known = true;
    }
  }
  if (!known) {
    return absl::InvalidArgumentError(
        absl::StrCat("fault '", text, "': action kind '", parts[1],
                     "' is not one of F, B, I, W, SEND_F, RECV_F, SEND_B, RECV_B"));
  }
  if (parts.size() == 3 && (!absl::SimpleAtoi(parts[2], &f.micro_batch) || f.micro_batch < 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("fault '", text, "': micro-batch '", parts[2], "' is not an index >= 0"));
  }
  return f;
}

absl::Status InjectedFaultError() {
  return absl::InternalError("injected fault (tandem-worker --test-fail-at)");
}

}  // namespace tandem::worker
