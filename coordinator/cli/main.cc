// tandem: the command-line client of tandem-coordinator. See `tandem help`.
#include <unistd.h>

#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_replace.h"
#include "coordinator/cli/args.h"
#include "coordinator/cli/commands.h"
#include "coordinator/cli/coordinator_client.h"

namespace {

// Errors are one line: messages from the server are not trusted to be.
void PrintError(absl::string_view message) {
  std::cerr << "tandem: " << absl::StrReplaceAll(message, {{"\r", " "}, {"\n", " "}}) << "\n";
}

}  // namespace

int main(int argc, char** argv) {
  using tandem::cli::CliOptions;
  const std::vector<std::string> args(argv + 1, argv + argc);
  absl::StatusOr<CliOptions> opts = tandem::cli::ParseArgs(args, std::getenv("TANDEM_COORDINATOR"));
  if (!opts.ok()) {
    PrintError(opts.status().message());
    return 2;
  }
  std::unique_ptr<tandem::cli::CoordinatorClient> client = tandem::cli::NewGrpcCoordinatorClient(
      opts->coordinator, opts->timeout, tandem::cli::kWatchTimeout);
  const absl::Status status =
      tandem::cli::RunCommand(*opts, *client, {std::cout, std::cin, isatty(STDOUT_FILENO) == 1});
  std::cout.flush();
  if (!status.ok()) {
    PrintError(status.message());
    return 1;
  }
  return 0;
}
