// The rules a job spec must satisfy beyond its schema: ranges, allowed names, and what the
// fields require of each other. ValidateJobSpec runs the named validators below in order, one
// per section of the spec, and reports every broken rule, not only the first, so that a spec
// with three mistakes is fixed in one round trip.
//
// Errors are in the text form of common/field_errors.h: INVALID_ARGUMENT, one error per line,
// each starting with the field path and saying what was expected, in spec order (the sections
// in the order below, the rules of each section in a fixed order), e.g.
//
//   steps: must be in [1, 10000000], got 0 (line 2)
//   model.n_head: must divide model.d_model = 100, got 3 (line 6)
//   optimizer.lr: must be a finite number in (0, 10], got -1 (line 10)
//
// with " (line L)" where the spec came from YAML and the field is written in it (not for a
// default or a preset). The first line is the first error, so a reader that keeps one line
// keeps the most important. Independent fields each report; a rule that reads a field which is
// wrong does not run (n_head divides d_model only once both are in range; the schedule is built
// only from a pipeline shape that is right), so that one mistake is reported once.
//
// Every validator expects a spec with defaults filled in (WithDefaults, common/spec.h) and
// reads nothing but the spec. Thread-safety: pure functions.
#ifndef TANDEM_COMMON_SPEC_VALIDATION_H_
#define TANDEM_COMMON_SPEC_VALIDATION_H_

#include "absl/status/status.h"
#include "common/field_errors.h"
#include "tandem/v1/spec.pb.h"

namespace tandem {

// Every error of the validators below, in their order; empty when all pass.
FieldErrors JobSpecErrors(const v1::JobSpec& spec);

// JobSpecErrors as a status: OK, or INVALID_ARGUMENT listing every error. With `lines` (where
// ParseJobSpecYaml found each field), each error names the line of its field.
absl::Status ValidateJobSpec(const v1::JobSpec& spec);
absl::Status ValidateJobSpec(const v1::JobSpec& spec, const FieldLines& lines);

// The validators append their errors to `errors`. A rule that reads an earlier section's field
// skips when `errors` holds an error for that field: run them in this order, into one
// FieldErrors, as JobSpecErrors does.

// name, steps, max_restarts, device, precision.
void ValidateTop(const v1::JobSpec& spec, FieldErrors* errors);
// model.*: preset, arch (and that device cuda runs gpt), each dimension's range, and the size
// of the largest weight matrix and of the whole model against what a worker builds
// (common/limits.h).
void ValidateModel(const v1::JobSpec& spec, FieldErrors* errors);
// data.*: source, format, the split, and the file paths (relative, inside the data root).
void ValidateData(const v1::JobSpec& spec, FieldErrors* errors);
// optimizer.*: name (and that device cuda runs adamw), learning rate and its schedule, betas,
// eps, weight decay, clipping.
void ValidateOptimizer(const v1::JobSpec& spec, FieldErrors* errors);
// eval.*: its interval, micro-batches, and that a validation split exists when it runs.
void ValidateEval(const v1::JobSpec& spec, FieldErrors* errors);
// checkpoint.*: interval and how many to keep.
void ValidateCheckpoint(const v1::JobSpec& spec, FieldErrors* errors);
// init.*: resume from a job id or fine-tune from a GPT-2 file, not both.
void ValidateInit(const v1::JobSpec& spec, FieldErrors* errors);
// pipeline.*: stages, chunks and micro-batches, the schedule (by name, or a CSV program that
// must be complete and deadlock-free), the partition and its cut points, the plan.
void ValidatePipeline(const v1::JobSpec& spec, FieldErrors* errors);

}  // namespace tandem

#endif  // TANDEM_COMMON_SPEC_VALIDATION_H_
