// The rules a job spec must satisfy beyond its schema: ranges, allowed names, and what the
// fields require of each other. ValidateJobSpec runs the named validators below in order, one
// per section of the spec; each returns INVALID_ARGUMENT whose message starts with the field
// path ("pipeline.micro_batches: must be in [1, 65536], got 0") and says what was expected.
//
// Every validator expects a spec with defaults filled in (WithDefaults, common/spec.h) and
// reads nothing but the spec. Thread-safety: pure functions.
#ifndef TANDEM_COMMON_SPEC_VALIDATION_H_
#define TANDEM_COMMON_SPEC_VALIDATION_H_

#include "absl/status/status.h"
#include "tandem/v1/spec.pb.h"

namespace tandem {

// The first error of the validators below, in their order; OK when all pass.
absl::Status ValidateJobSpec(const v1::JobSpec& spec);

// name, steps, max_restarts, device, precision, and what device cuda supports.
absl::Status ValidateTop(const v1::JobSpec& spec);
// model.*: preset, arch, each dimension's range, and the size of the largest weight matrix and
// of the whole model against what a worker builds (common/limits.h).
absl::Status ValidateModel(const v1::JobSpec& spec);
// data.*: source, format, the split, and the file paths (relative, inside the data root).
absl::Status ValidateData(const v1::JobSpec& spec);
// optimizer.*: name, learning rate and its schedule, betas, eps, weight decay, clipping.
absl::Status ValidateOptimizer(const v1::JobSpec& spec);
// eval.*: its interval, micro-batches, and that a validation split exists when it runs.
absl::Status ValidateEval(const v1::JobSpec& spec);
// checkpoint.*: interval and how many to keep.
absl::Status ValidateCheckpoint(const v1::JobSpec& spec);
// init.*: resume from a job id or fine-tune from a GPT-2 file, not both.
absl::Status ValidateInit(const v1::JobSpec& spec);
// pipeline.*: stages, chunks and micro-batches, the schedule (by name, or a CSV program that
// must be complete and deadlock-free), the partition and its cut points, the plan.
absl::Status ValidatePipeline(const v1::JobSpec& spec);

}  // namespace tandem

#endif  // TANDEM_COMMON_SPEC_VALIDATION_H_
