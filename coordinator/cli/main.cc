// tandem: the command-line client of tandem-coordinator. See `tandem help`.
#include <unistd.h>

#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_replace.h"
#include "common/flags.h"
#include "common/status_macros.h"
#include "common/tls.h"
#include "coordinator/cli/args.h"
#include "coordinator/cli/commands.h"
#include "coordinator/cli/coordinator_client.h"

namespace {

// Errors are one line, but for a job spec's errors from RunCommand, one per line (see
// commands.h, which makes the coordinator's text single-line before it reaches a message).
void PrintError(absl::string_view message, bool lines = false) {
  std::cerr << "tandem: " << absl::StrReplaceAll(message, {{"\r", " "}, {"\n", lines ? "\n" : " "}})
            << "\n";
}

// The channel's security from the options: TLS when --tls-ca is given, a client certificate
// and a bearer token on top. INVALID_ARGUMENT names the flag or file at fault.
absl::StatusOr<tandem::ChannelSecurity> Security(const tandem::cli::CliOptions& opts) {
  tandem::ChannelSecurity security;
  ASSIGN_OR_RETURN(security.tls,
                   tandem::LoadTls({opts.tls_cert, opts.tls_key, opts.tls_ca, opts.tls_server_name},
                                   tandem::TlsUse::kClient, tandem::Role::kClient));
  if (!opts.token_file.empty()) {
    ASSIGN_OR_RETURN(security.bearer_token, tandem::ReadTokenFile(opts.token_file));
  } else {
    security.bearer_token = std::string(absl::StripAsciiWhitespace(opts.token));
  }
  if (!security.bearer_token.empty() && !security.tls.has_value()) {
    return absl::InvalidArgumentError(
        "a bearer token (--token-file, $TANDEM_TOKEN_FILE, $TANDEM_TOKEN) is sent only over "
        "TLS: give --tls-ca FILE (or $TANDEM_TLS_CA)");
  }
  return security;
}

}  // namespace

int main(int argc, char** argv) {
  tandem::DisableDebugMutexChecksInRelease();
  using tandem::cli::CliOptions;
  using tandem::cli::Command;
  const std::vector<std::string> args(argv + 1, argv + argc);
  tandem::cli::CliEnvironment env;
  env.coordinator = std::getenv("TANDEM_COORDINATOR");
  env.tls_ca = std::getenv("TANDEM_TLS_CA");
  env.tls_cert = std::getenv("TANDEM_TLS_CERT");
  env.tls_key = std::getenv("TANDEM_TLS_KEY");
  env.tls_server_name = std::getenv("TANDEM_TLS_SERVER_NAME");
  env.token_file = std::getenv("TANDEM_TOKEN_FILE");
  env.token = std::getenv("TANDEM_TOKEN");
  absl::StatusOr<CliOptions> opts = tandem::cli::ParseArgs(args, env);
  if (!opts.ok()) {
    PrintError(opts.status().message());
    return 2;
  }
  // The commands that never call the coordinator do not read its credentials.
  tandem::ChannelSecurity security;
  if (opts->command != Command::kHelp && opts->command != Command::kVersion &&
      opts->command != Command::kValidate) {
    absl::StatusOr<tandem::ChannelSecurity> s = Security(*opts);
    if (!s.ok()) {
      PrintError(s.status().message());
      return 2;
    }
    security = *std::move(s);
  }
  std::unique_ptr<tandem::cli::CoordinatorClient> client = tandem::cli::NewGrpcCoordinatorClient(
      opts->coordinator, opts->timeout, tandem::cli::kWatchTimeout, security);
  const absl::Status status = tandem::cli::RunCommand(
      *opts, *client, {std::cout, std::cin, isatty(STDOUT_FILENO) == 1, &std::cerr});
  std::cout.flush();
  if (!status.ok()) {
    PrintError(status.message(), /*lines=*/true);
    return 1;
  }
  return 0;
}
