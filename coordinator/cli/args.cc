#include "coordinator/cli/args.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace tandem::cli {
namespace {

struct CommandInfo {
  Command command;
  const char* name;
  const char* synopsis;  // arguments after the name
  const char* summary;
  int min_args;
  int max_args;
};

constexpr CommandInfo kCommands[] = {
    {Command::kSubmit, "submit", "JOB.yaml [--watch]",
     "Submit a job; print its id (then follow it with --watch)", 1, 1},
    {Command::kStatus, "status", "[JOB]", "Show all jobs and workers, or one job in detail", 0, 1},
    {Command::kWatch, "watch", "JOB",
     "Follow a job step by step until it ends (exit 0 only if it succeeds)", 1, 1},
    {Command::kList, "list", "", "List jobs", 0, 0},
    {Command::kCancel, "cancel", "JOB", "Cancel a queued or running job", 1, 1},
    {Command::kWorkers, "workers", "[WORKER]", "List registered workers, or show one", 0, 1},
    {Command::kValidate, "validate", "JOB.yaml",
     "Check a job file locally and print it with every default filled in", 1, 1},
    {Command::kExport, "export", "JOB -o FILE",
     "Write the job's latest checkpoint as a Hugging Face GPT-2 safetensors file", 1, 1},
    {Command::kPlan, "plan", "JOB.yaml",
     "Show, without running anything, the job's schedule: per-rank actions, timestep grid "
     "and predicted bubble and memory",
     1, 1},
    {Command::kTrace, "trace", "JOB -o FILE",
     "Write a step's measured timeline as trace-event JSON for ui.perfetto.dev (--step N, "
     "default the latest; --steps A..B), or as an SVG Gantt chart (--svg)",
     1, 1},
    {Command::kVersion, "version", "", "Print the client version", 0, 0},
    {Command::kHelp, "help", "[COMMAND]", "Show this help, or a command's usage", 0, 1},
};

const CommandInfo* FindCommand(absl::string_view name) {
  for (const CommandInfo& c : kCommands) {
    if (name == c.name) return &c;
  }
  return nullptr;
}

const CommandInfo& Info(Command command) {
  for (const CommandInfo& c : kCommands) {
    if (c.command == command) return c;
  }
  return kCommands[std::size(kCommands) - 1];  // help
}

absl::Status UsageError(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(what, " (see 'tandem help')"));
}

absl::Status ParseOutput(absl::string_view v, OutputFormat* out) {
  const std::string lower = absl::AsciiStrToLower(v);
  if (lower == "table") {
    *out = OutputFormat::kTable;
  } else if (lower == "json") {
    *out = OutputFormat::kJson;
  } else {
    return UsageError(absl::StrCat("-o/--output: expected json or table, got '", v, "'"));
  }
  return absl::OkStatus();
}

absl::Status ParseTimeout(absl::string_view v, absl::Duration* out) {
  double seconds;
  if (!absl::SimpleAtod(v, &seconds) || !std::isfinite(seconds) || seconds <= 0 ||
      seconds > 86400) {
    return UsageError(
        absl::StrCat("--timeout: expected a number of seconds in (0, 86400], got '", v, "'"));
  }
  *out = absl::Seconds(seconds);
  return absl::OkStatus();
}

absl::Status ParseStep(absl::string_view flag, absl::string_view v, int64_t* out) {
  if (!absl::SimpleAtoi(v, out) || *out < 1) {
    return UsageError(
        absl::StrCat(flag, ": expected a step number (1 for the first step), got '", v, "'"));
  }
  return absl::OkStatus();
}

// "A..B" with A <= B.
absl::Status ParseStepRange(absl::string_view v, int64_t* first, int64_t* last) {
  const size_t dots = v.find("..");
  if (dots == absl::string_view::npos) {
    return UsageError(absl::StrCat("--steps: expected A..B (step numbers, from 1), got '", v, "'"));
  }
  if (absl::Status s = ParseStep("--steps", v.substr(0, dots), first); !s.ok()) return s;
  if (absl::Status s = ParseStep("--steps", v.substr(dots + 2), last); !s.ok()) return s;
  if (*first > *last) {
    return UsageError(absl::StrCat("--steps: the range ", v, " is empty; give A..B with A <= B"));
  }
  return absl::OkStatus();
}

absl::Status CheckAddress(absl::string_view v) {
  if (v.empty() || std::any_of(v.begin(), v.end(), absl::ascii_isspace)) {
    return UsageError(absl::StrCat("--coordinator: expected HOST:PORT, got '", v, "'"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<CliOptions> ParseArgs(const std::vector<std::string>& args,
                                     const char* env_coordinator) {
  CliEnvironment env;
  env.coordinator = env_coordinator;
  return ParseArgs(args, env);
}

absl::StatusOr<CliOptions> ParseArgs(const std::vector<std::string>& args,
                                     const CliEnvironment& env) {
  CliOptions opts;
  const auto from_env = [](const char* value, std::string* out) {
    if (value != nullptr && *value != '\0') *out = value;
  };
  from_env(env.tls_ca, &opts.tls_ca);
  from_env(env.tls_cert, &opts.tls_cert);
  from_env(env.tls_key, &opts.tls_key);
  from_env(env.tls_server_name, &opts.tls_server_name);
  from_env(env.token_file, &opts.token_file);
  from_env(env.token, &opts.token);
  if (env.coordinator != nullptr && *env.coordinator != '\0') {
    opts.coordinator = env.coordinator;
    if (absl::Status s = CheckAddress(opts.coordinator); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("$TANDEM_COORDINATOR: ", s.message()));
    }
  }
  bool help = false;
  bool version = false;
  std::optional<Command> command;
  std::optional<std::string> output_value;  // -o, interpreted once the command is known
  std::vector<std::string> positional;
  bool flags_done = false;

  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    const bool is_flag = !flags_done && arg.size() > 1 && arg[0] == '-';
    if (!is_flag) {
      if (!command.has_value()) {
        const CommandInfo* info = FindCommand(arg);
        if (info == nullptr) return UsageError(absl::StrCat("unknown command '", arg, "'"));
        command = info->command;
      } else {
        positional.push_back(arg);
      }
      continue;
    }
    if (arg == "--") {
      flags_done = true;
      continue;
    }
    // Split "--name=value" and "-ovalue".
    std::string name = arg;
    std::optional<std::string> inline_value;
    if (absl::StartsWith(arg, "--")) {
      if (size_t eq = arg.find('='); eq != std::string::npos) {
        name = arg.substr(0, eq);
        inline_value = arg.substr(eq + 1);
      }
    } else if (arg.size() > 2) {
      name = arg.substr(0, 2);
      inline_value = arg.substr(arg[2] == '=' ? 3 : 2);
    }
    auto value = [&]() -> absl::StatusOr<std::string> {
      if (inline_value.has_value()) return *inline_value;
      if (i + 1 >= args.size()) return UsageError(absl::StrCat(name, ": missing value"));
      return args[++i];
    };
    auto no_value = [&]() -> absl::Status {
      if (inline_value.has_value()) {
        return UsageError(absl::StrCat(name, ": takes no value"));
      }
      return absl::OkStatus();
    };

    if (name == "--coordinator") {
      absl::StatusOr<std::string> v = value();
      if (!v.ok()) return v.status();
      if (absl::Status s = CheckAddress(*v); !s.ok()) return s;
      opts.coordinator = *v;
    } else if (name == "-o" || name == "--output") {
      absl::StatusOr<std::string> v = value();
      if (!v.ok()) return v.status();
      output_value = *v;  // a format, or export's file: decided once the command is known
    } else if (name == "--timeout") {
      absl::StatusOr<std::string> v = value();
      if (!v.ok()) return v.status();
      if (absl::Status s = ParseTimeout(*v, &opts.timeout); !s.ok()) return s;
    } else if (name == "-w" || name == "--watch") {
      if (absl::Status s = no_value(); !s.ok()) return s;
      opts.watch = true;
    } else if (name == "--schedule" || name == "--schedule-csv" || name == "--csv") {
      absl::StatusOr<std::string> v = value();
      if (!v.ok()) return v.status();
      if (v->empty()) return UsageError(absl::StrCat(name, ": missing value"));
      (name == "--schedule" ? opts.schedule
       : name == "--csv"    ? opts.csv_out
                            : opts.schedule_csv) = *v;
    } else if (name == "--tls-ca" || name == "--tls-cert" || name == "--tls-key" ||
               name == "--tls-server-name" || name == "--token-file") {
      absl::StatusOr<std::string> v = value();
      if (!v.ok()) return v.status();
      if (v->empty()) return UsageError(absl::StrCat(name, ": missing value"));
      (name == "--tls-ca"            ? opts.tls_ca
       : name == "--tls-cert"        ? opts.tls_cert
       : name == "--tls-key"         ? opts.tls_key
       : name == "--tls-server-name" ? opts.tls_server_name
                                     : opts.token_file) = *v;
    } else if (name == "--chunks") {
      absl::StatusOr<std::string> v = value();
      if (!v.ok()) return v.status();
      if (!absl::SimpleAtoi(*v, &opts.chunks) || opts.chunks < 0 || opts.chunks > 64) {
        return UsageError(
            absl::StrCat("--chunks: expected stages per worker in [0, 64], got '", *v, "'"));
      }
    } else if (name == "--step") {
      absl::StatusOr<std::string> v = value();
      if (!v.ok()) return v.status();
      if (absl::Status s = ParseStep(name, *v, &opts.trace_step); !s.ok()) return s;
    } else if (name == "--steps") {
      absl::StatusOr<std::string> v = value();
      if (!v.ok()) return v.status();
      if (absl::Status s = ParseStepRange(*v, &opts.trace_first, &opts.trace_last); !s.ok()) {
        return s;
      }
    } else if (name == "--svg") {
      if (absl::Status s = no_value(); !s.ok()) return s;
      opts.svg = true;
    } else if (name == "--print-actions") {
      if (absl::Status s = no_value(); !s.ok()) return s;
      opts.print_actions = true;
    } else if (name == "--auto") {
      if (absl::Status s = no_value(); !s.ok()) return s;
      opts.auto_plan = true;
    } else if (name == "--no-search") {
      if (absl::Status s = no_value(); !s.ok()) return s;
      opts.no_search = true;
    } else if (name == "--no-profile") {
      if (absl::Status s = no_value(); !s.ok()) return s;
      opts.no_profile = true;
    } else if (name == "--compare") {
      if (absl::Status s = no_value(); !s.ok()) return s;
      opts.compare = true;
    } else if (name == "-h" || name == "--help") {
      if (absl::Status s = no_value(); !s.ok()) return s;
      help = true;
    } else if (name == "--version") {
      if (absl::Status s = no_value(); !s.ok()) return s;
      version = true;
    } else {
      return UsageError(absl::StrCat("unknown flag '", arg, "'"));
    }
  }

  if (help) {
    // `tandem submit --help` is `tandem help submit`.
    opts.command = Command::kHelp;
    if (command.has_value() && *command != Command::kHelp) {
      opts.args = {Info(*command).name};
    } else if (command.has_value()) {
      opts.args = positional;
    }
    return opts;
  }
  if (version && !command.has_value()) command = Command::kVersion;
  if (!command.has_value()) return UsageError("missing command");
  opts.command = *command;
  if (opts.command == Command::kExport) {
    if (!output_value.has_value() || output_value->empty()) {
      return UsageError("export: give the file to write with -o FILE.safetensors");
    }
    opts.output_path = *output_value;
  } else if (opts.command == Command::kTrace) {
    if (!output_value.has_value() || output_value->empty()) {
      return UsageError(absl::StrCat("trace: give the file to write with -o ",
                                     opts.svg ? "FILE.svg" : "FILE.json", " (- for stdout)"));
    }
    opts.output_path = *output_value;
  } else if (output_value.has_value()) {
    if (absl::Status s = ParseOutput(*output_value, &opts.output); !s.ok()) return s;
  }
  opts.args = std::move(positional);

  const CommandInfo& info = Info(opts.command);
  const int n = static_cast<int>(opts.args.size());
  if (n < info.min_args || n > info.max_args) {
    return UsageError(absl::StrCat(n < info.min_args ? "missing argument" : "too many arguments",
                                   "; usage: tandem ", info.name,
                                   info.synopsis[0] != '\0' ? " " : "", info.synopsis));
  }
  if (opts.command == Command::kHelp && n == 1 && FindCommand(opts.args[0]) == nullptr) {
    return UsageError(absl::StrCat("help: unknown command '", opts.args[0], "'"));
  }
  const bool overrides =
      !opts.schedule.empty() || !opts.schedule_csv.empty() || opts.chunks >= 0 || opts.auto_plan;
  if (overrides && opts.command != Command::kPlan && opts.command != Command::kSubmit &&
      opts.command != Command::kValidate) {
    return UsageError(
        "--schedule, --schedule-csv, --chunks and --auto apply to plan, submit and validate");
  }
  if (!opts.schedule.empty() && !opts.schedule_csv.empty()) {
    return UsageError("give --schedule or --schedule-csv, not both");
  }
  if ((opts.print_actions || opts.compare || !opts.csv_out.empty() || opts.no_profile ||
       opts.no_search) &&
      opts.command != Command::kPlan) {
    return UsageError(
        "--print-actions, --compare, --csv, --no-search and --no-profile apply to plan only");
  }
  if ((opts.trace_step >= 0 || opts.trace_first >= 0 || opts.svg) &&
      opts.command != Command::kTrace) {
    return UsageError("--step, --steps and --svg apply to trace only");
  }
  if (opts.trace_step >= 0 && opts.trace_first >= 0) {
    return UsageError("give --step N or --steps A..B, not both");
  }
  if (opts.svg && opts.trace_first >= 0) {
    return UsageError(
        "--svg draws one step: give --step N (or none for the latest), or write "
        "the steps as JSON");
  }
  if (opts.watch && opts.command != Command::kSubmit) {
    return UsageError("--watch applies to submit only; to follow a job use 'tandem watch JOB'");
  }
  return opts;
}

absl::string_view CommandName(Command command) { return Info(command).name; }

std::string Usage() {
  std::string out =
      "Usage: tandem [flags] COMMAND [args]\n"
      "\n"
      "Tandem client: submit and follow pipeline-parallel training jobs.\n"
      "\n"
      "Commands:\n";
  for (const CommandInfo& c : kCommands) {
    std::string left = absl::StrCat(c.name, c.synopsis[0] != '\0' ? " " : "", c.synopsis);
    if (left.size() < 28) left.resize(28, ' ');
    absl::StrAppend(&out, "  ", left, " ", c.summary, "\n");
  }
  absl::StrAppend(
      &out,
      "\n"
      "Flags (anywhere on the line):\n"
      "  --coordinator HOST:PORT      Coordinator address (default $TANDEM_COORDINATOR,\n"
      "                               else ",
      kDefaultCoordinator,
      ")\n"
      "  -o, --output json|table      Output of status, list, workers, watch (default table);\n"
      "                               with export and trace: the file to write\n"
      "  --timeout SECONDS            Deadline of each request (default 10)\n"
      "  --tls-ca FILE                TLS: the CA that signs the coordinator's certificate\n"
      "                               (default $TANDEM_TLS_CA; without it: plaintext)\n"
      "  --token-file FILE            TLS: send the bearer token in FILE (default\n"
      "                               $TANDEM_TOKEN_FILE, else the token in $TANDEM_TOKEN)\n"
      "  --tls-cert FILE --tls-key FILE  TLS: authenticate with a client certificate\n"
      "                               (CN=tandem-client; default $TANDEM_TLS_CERT, _KEY)\n"
      "  --tls-server-name NAME       TLS: the name the coordinator's certificate carries, if\n"
      "                               not the host dialled ($TANDEM_TLS_SERVER_NAME)\n"
      "  -w, --watch                  With submit: follow the job after submitting it\n"
      "  --schedule NAME              With plan, submit, validate: use this schedule (gpipe,\n"
      "                               1f1b, interleaved_1f1b, zb_h1, zb_v)\n"
      "  --schedule-csv FILE          ... or this one, in torch.distributed.pipelining's CSV\n"
      "  --chunks N                   ... with N stages per worker (interleaved_1f1b)\n"
      "  --auto                       With plan, submit, validate: pipeline.plan: auto (the\n"
      "                               coordinator runs the planner's fastest schedule, chunks\n"
      "                               and split of the global batch)\n"
      "  --print-actions              With plan: print every rank's lowered action list\n"
      "  --compare                    With plan: predicted figures of every schedule that fits\n"
      "  --csv FILE                   With plan: write the schedule as CSV (re-importable)\n"
      "  --no-profile                 With plan: do not ask the coordinator for measured layer\n"
      "                               costs (plan with unit costs)\n"
      "  --no-search                  With plan: skip the planner's search over schedules and\n"
      "                               splits of the global batch (one profile only)\n"
      "  --step N                     With trace: the step (its index from 0, as in the trace\n"
      "                               and status -o json; default the latest kept)\n"
      "  --steps A..B                 With trace: every kept step from A to B, in one JSON file\n"
      "  --svg                        With trace: an SVG Gantt chart (one row per stage)\n"
      "  -h, --help                   Show help\n"
      "  --version                    Print the client version\n"
      "\n"
      "Examples:\n"
      "  JOB=$(tandem submit examples/quickstart.yaml)\n"
      "  tandem watch $JOB\n"
      "  tandem status $JOB -o json\n"
      "  tandem plan examples/quickstart.yaml --compare\n"
      "  tandem trace $JOB -o trace.json   # open it at https://ui.perfetto.dev\n"
      "\n"
      "Exit status: 0 on success, 1 on an error (or a watched job that failed or was\n"
      "cancelled), 2 on a usage error.\n");
  return out;
}

std::string CommandUsage(Command command) {
  const CommandInfo& c = Info(command);
  return absl::StrCat("Usage: tandem ", c.name, c.synopsis[0] != '\0' ? " " : "", c.synopsis,
                      " [flags]\n\n", c.summary, ".\nRun 'tandem help' for the flags.\n");
}

}  // namespace tandem::cli
