// The `tandem` commands: each talks to the coordinator through a CoordinatorClient and
// writes its result to an output stream, so that they run against a fake in tests.
#ifndef TANDEM_COORDINATOR_CLI_COMMANDS_H_
#define TANDEM_COORDINATOR_CLI_COMMANDS_H_

#include <istream>
#include <ostream>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "coordinator/cli/args.h"
#include "coordinator/cli/coordinator_client.h"

namespace tandem::cli {

// The watch stream's deadline: long, because a job may train for days, but never infinite.
inline constexpr absl::Duration kWatchTimeout = absl::Hours(24 * 7);

struct CommandIo {
  std::ostream& out;  // results (a job id, tables, JSON)
  std::istream& in;   // the job spec for `submit -`
  bool live = false;  // `out` is a terminal: redraw the watch line in place
  // Where a command says what it is waiting for while that may take minutes (`plan`, whose
  // search may have the coordinator measure a profile per micro-batch size): stderr in the
  // CLI, so that `out` stays the result alone; nowhere when null.
  std::ostream* progress = nullptr;
};

// Runs `opts.command`. On failure the status message is what to print after "tandem: ": one
// line, e.g. "cannot reach coordinator at 127.0.0.1:7070: ...", or for a job spec's errors
// (validate, plan, submit) one line per error, as compilers print them, the first after the
// command's prefix:
//
//   submit: INVALID_ARGUMENT: job.yaml:2: steps: must be in [1, 10000000], got 0
//   job.yaml:6: model.n_head: must divide model.d_model = 100, got 3
//   job.yaml: data.path: required with data.source "file": ...   (a default: no line)
//
// Text from the coordinator is made single-line before it goes into a message, so every line
// break in it is one of these. A watched job that ends FAILED or CANCELLED is an ABORTED
// error naming the job, its final state and the reason.
absl::Status RunCommand(const CliOptions& opts, CoordinatorClient& client, CommandIo io);

// The contents of `path`, or an error saying why it cannot be read.
absl::StatusOr<std::string> ReadJobFile(const std::string& path);

// {"a": 1} + {"b": 2} -> {"a": 1, "b": 2}, for JSON objects as ToJson prints them.
absl::StatusOr<std::string> MergeJsonObjects(const std::string& a, const std::string& b);

}  // namespace tandem::cli

#endif  // TANDEM_COORDINATOR_CLI_COMMANDS_H_
