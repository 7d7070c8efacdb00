// libFuzzer target: arbitrary bytes as a job spec, through everything the coordinator does
// with a submitted spec before it stores it (ParseJobSpecYaml, WithDefaults, ValidateJobSpec)
// and, for a spec that validates, what the runner and `tandem plan` do next (PlanPipeline,
// the batch figures). Bad input must come back as INVALID_ARGUMENT (or, from planning,
// RESOURCE_EXHAUSTED for a budget no cut fits): any crash, sanitizer report, other status code,
// or a spec that validates once but not after a second WithDefaults is a bug.
//
// Built by scripts/fuzz.sh (clang, -fsanitize=fuzzer,address,undefined); seeds in
// tests/fuzz/corpus/spec_fuzz/.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "absl/strings/string_view.h"
#include "common/pipeline_plan.h"
#include "common/spec.h"

namespace {

void Die(const char* what, const absl::Status& s) {
  std::fprintf(stderr, "spec_fuzz: %s: %s\n", what, s.ToString().c_str());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view yaml(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<tandem::v1::JobSpec> parsed = tandem::ParseJobSpecYaml(yaml);
  if (!parsed.ok()) {
    if (parsed.status().code() != absl::StatusCode::kInvalidArgument) {
      Die("ParseJobSpecYaml", parsed.status());
    }
    return 0;
  }
  const tandem::v1::JobSpec full = tandem::WithDefaults(*parsed);
  if (tandem::WithDefaults(full).SerializeAsString() != full.SerializeAsString()) {
    Die("WithDefaults is not idempotent", absl::OkStatus());
  }
  const absl::Status valid = tandem::ValidateJobSpec(full);
  if (!valid.ok()) {
    if (valid.code() != absl::StatusCode::kInvalidArgument) Die("ValidateJobSpec", valid);
    if (valid.message().empty()) Die("ValidateJobSpec gave no message", valid);
    return 0;
  }
  // A valid spec: the coordinator plans it (without a profile, as `tandem validate` does).
  (void)tandem::EffectiveBatch(full);
  (void)tandem::TokensPerStep(full);
  absl::StatusOr<tandem::PipelinePlan> plan = tandem::PlanPipeline(full);
  if (!plan.ok()) {
    const absl::StatusCode code = plan.status().code();
    if (code != absl::StatusCode::kInvalidArgument &&
        code != absl::StatusCode::kResourceExhausted) {
      Die("PlanPipeline", plan.status());
    }
    return 0;
  }
  // The programs the coordinator would send.
  for (int r = 0; r < plan->num_ranks(); ++r) {
    (void)tandem::StageProgramFor(*plan, full, r, "job-1", "job-1/");
  }
  return 0;
}
