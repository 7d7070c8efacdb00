// How steps are numbered. RPCs, the job store and the worker count steps by their 0-based
// index (StepSummary.step, RunStepRequest.step, checkpoint_step). Everything a person reads or
// types — CLI output and flags, error messages, log lines, traces, the dashboard — numbers
// them from 1: "step N" is the N-th step, after which N steps are done, so the checkpoint
// "after step N" holds the state of steps_done == N.
#ifndef TANDEM_COMMON_STEP_NUMBER_H_
#define TANDEM_COMMON_STEP_NUMBER_H_

#include <cstdint>

namespace tandem {

// The number a person sees for the step at `index` (1 for the first step).
constexpr int64_t StepNumber(int64_t index) { return index + 1; }
// The index of the step a person calls `number`.
constexpr int64_t StepIndex(int64_t number) { return number - 1; }

}  // namespace tandem

#endif  // TANDEM_COMMON_STEP_NUMBER_H_
