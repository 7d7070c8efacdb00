// libFuzzer target: a schedule CSV (torch.distributed.pipelining's format, what `tandem submit
// --schedule-csv FILE` puts in pipeline.schedule_csv and the coordinator reads) through what
// the coordinator does with it: ScheduleFromCsv, ValidateSchedule, SimulateSchedule. The input
// is a first line "P M" (ranks 1..16, micro-batches 1..64), then the CSV. Any crash, hang or
// sanitizer report is a bug, and so is any of these:
//   - ScheduleFromCsv failing with a status other than INVALID_ARGUMENT, or with no message;
//   - ValidateSchedule failing with another status than INVALID_ARGUMENT;
//   - a valid schedule that SimulateSchedule refuses;
//   - a valid schedule whose export (ProgramToCsv) does not read back as the same program.
//
// Built by scripts/fuzz.sh (clang, -fsanitize=fuzzer,address,undefined); seeds in
// tests/fuzz/corpus/schedule_csv_fuzz/ (torch's exports from tests/common/testdata and
// Tandem's own, with their "P M" line).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "common/schedule.h"
#include "common/schedule_check.h"

namespace {

void Die(const char* what, const absl::Status& s) {
  std::fprintf(stderr, "schedule_csv_fuzz: %s: %s\n", what, s.ToString().c_str());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view input(reinterpret_cast<const char*>(data), size);
  const size_t eol = input.find('\n');
  if (eol == absl::string_view::npos) return 0;
  const std::vector<absl::string_view> sizes =
      absl::StrSplit(input.substr(0, eol), ' ', absl::SkipEmpty());
  int ranks = 0, micro_batches = 0;
  if (sizes.size() != 2 || !absl::SimpleAtoi(sizes[0], &ranks) ||
      !absl::SimpleAtoi(sizes[1], &micro_batches) || ranks < 1 || ranks > 16 || micro_batches < 1 ||
      micro_batches > 64) {
    return 0;
  }
  const absl::string_view csv = input.substr(eol + 1);

  absl::StatusOr<tandem::Schedule> read = tandem::ScheduleFromCsv(csv, ranks, micro_batches);
  if (!read.ok()) {
    if (read.status().code() != absl::StatusCode::kInvalidArgument) {
      Die("ScheduleFromCsv", read.status());
    }
    if (read.status().message().empty()) Die("ScheduleFromCsv gave no message", read.status());
    return 0;
  }
  const absl::Status valid = tandem::ValidateSchedule(*read);
  if (!valid.ok()) {
    if (valid.code() != absl::StatusCode::kInvalidArgument) Die("ValidateSchedule", valid);
    return 0;
  }
  // A valid schedule: the coordinator prices it and runs it.
  absl::StatusOr<tandem::SimulationResult> sim = tandem::SimulateSchedule(*read);
  if (!sim.ok()) Die("SimulateSchedule refused a valid schedule", sim.status());
  // `tandem plan --csv` writes it back out; reading that must give the same program.
  absl::StatusOr<tandem::Schedule> again =
      tandem::ScheduleFromCsv(tandem::ProgramToCsv(read->program), ranks, micro_batches);
  if (!again.ok()) Die("its own export does not read back", again.status());
  if (again->program != read->program || !(again->placement == read->placement)) {
    Die("its export reads back as another program or placement", absl::OkStatus());
  }
  return 0;
}
