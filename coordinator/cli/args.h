// Command-line parsing for the `tandem` CLI: argv -> a validated CliOptions, without side
// effects, so that it is tested without a process.
#ifndef TANDEM_COORDINATOR_CLI_ARGS_H_
#define TANDEM_COORDINATOR_CLI_ARGS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace tandem::cli {

inline constexpr char kDefaultCoordinator[] = "127.0.0.1:7070";

enum class OutputFormat { kTable, kJson };

enum class Command {
  kHelp,
  kVersion,
  kSubmit,    // submit JOB.yaml [--watch]
  kStatus,    // status [JOB]
  kWatch,     // watch JOB
  kList,      // list
  kCancel,    // cancel JOB
  kWorkers,   // workers
  kValidate,  // validate JOB.yaml (local: parse, fill defaults, validate)
  kExport,    // export JOB -o FILE.safetensors
  kPlan,      // plan JOB.yaml (local: the schedule, its grid and predicted figures)
  kTrace,     // trace JOB [--step N | --steps A..B] [--svg] -o FILE
};

struct CliOptions {
  Command command = Command::kHelp;
  // Positional arguments after the command (JOB.yaml, JOB id, or the command `help` is about).
  std::vector<std::string> args;
  std::string coordinator = kDefaultCoordinator;
  OutputFormat output = OutputFormat::kTable;
  // Deadline of each unary call; the watch stream has its own long deadline.
  absl::Duration timeout = absl::Seconds(10);
  bool watch = false;  // submit --watch
  // export, trace: the file to write (-o FILE; trace: - for stdout); for the other commands
  // -o is the output format.
  std::string output_path;
  // trace only: the step index (from 0, as the trace and `status -o json` number steps; -1:
  // the latest kept), or every kept step in [trace_first, trace_last] (--steps A..B, JSON
  // only); --svg for an SVG Gantt chart instead of trace-event JSON.
  int64_t trace_step = -1;
  int64_t trace_first = -1;
  int64_t trace_last = -1;
  bool svg = false;
  // Schedule overrides of the job file (plan, submit, validate).
  std::string schedule;      // --schedule NAME
  std::string schedule_csv;  // --schedule-csv FILE (a path; the command reads it)
  int chunks = -1;           // --chunks N (stages per worker); -1 = the file's
  // plan only.
  bool print_actions = false;  // --print-actions: the lowered per-rank action lists
  bool compare = false;        // --compare: the figures of every schedule that fits
  std::string csv_out;         // --csv FILE: write the lowered program as schedule CSV
  bool auto_plan = false;      // --auto: pipeline.plan = auto (plan, submit, validate)
  bool no_search = false;      // --no-search: plan without searching the batch's splits
  int workers = 0;          // --workers N: plan for N workers (stages x replicas); 0 = the file's
  bool no_profile = false;  // --no-profile: do not ask the coordinator for a profile
  // Transport security (files; main.cc reads them). TLS is on when tls_ca is set; a token is
  // sent only over TLS. Each flag defaults to its environment variable (CliEnvironment).
  std::string tls_ca;           // --tls-ca FILE: the CA that signs the coordinator's cert
  std::string tls_cert;         // --tls-cert FILE: a client certificate (CN=tandem-client)
  std::string tls_key;          // --tls-key FILE: its key
  std::string tls_server_name;  // --tls-server-name NAME: expected in the server's certificate
  std::string token_file;       // --token-file FILE: a bearer token
  std::string token;            // $TANDEM_TOKEN: a bearer token itself (the file wins)
};

// The environment variables the CLI reads (nullptr or empty: unset). Flags win over them.
struct CliEnvironment {
  const char* coordinator = nullptr;      // $TANDEM_COORDINATOR
  const char* tls_ca = nullptr;           // $TANDEM_TLS_CA
  const char* tls_cert = nullptr;         // $TANDEM_TLS_CERT
  const char* tls_key = nullptr;          // $TANDEM_TLS_KEY
  const char* tls_server_name = nullptr;  // $TANDEM_TLS_SERVER_NAME
  const char* token_file = nullptr;       // $TANDEM_TOKEN_FILE
  const char* token = nullptr;            // $TANDEM_TOKEN
};

// Parses argv[1..] (without the program name). Flags may come before or after the command;
// `--flag value` and `--flag=value` are both accepted, and `--` ends the flags.
// `env_coordinator` is $TANDEM_COORDINATOR (nullptr or empty when unset); --coordinator wins.
// INVALID_ARGUMENT (a usage error: exit 2) names the bad flag, command or argument.
absl::StatusOr<CliOptions> ParseArgs(const std::vector<std::string>& args,
                                     const char* env_coordinator);
absl::StatusOr<CliOptions> ParseArgs(const std::vector<std::string>& args,
                                     const CliEnvironment& env);

// The command's name as typed ("submit"), for error messages.
absl::string_view CommandName(Command command);

// Usage text: the overview, or one command's usage when `command` names one.
std::string Usage();
std::string CommandUsage(Command command);

}  // namespace tandem::cli

#endif  // TANDEM_COORDINATOR_CLI_ARGS_H_
