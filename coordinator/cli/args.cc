#include "coordinator/cli/args.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <iterator>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "common/limits.h"
#include "common/status_macros.h"

// The command line is a CLI11 app: one subcommand per command, every flag on the root app (the
// subcommands fall through to it, so a flag may come before or after the command), value
// checks as CLI11 validators, the exclusive flags as CLI11 `excludes`, the environment as
// option defaults, and the help text generated from the app by UsageFormatter. CLI11 stays in
// this file: it is heavy to compile.
//
// Two things are kept from the hand-written parser because people script against them, and
// CLI11 does them differently:
// - Spelling (Tokenize): "-ovalue" and "-o=value", "--name=" as an empty value, "-5" as a
//   flag, a flag given a value, and a command right after "--". Tokenize rewrites the line into
//   words CLI11 reads the same way, and stops at the first malformed word.
// - Messages: the first error from left to right wins, worded as before; the checks between
//   flags and commands run in the order they always did (FinishOptions).

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
     "Check a job file locally and print it with every default filled in, or every error as "
     "FILE:LINE",
     1, 1},
    {Command::kExport, "export", "JOB -o FILE",
     "Write the job's latest checkpoint as a Hugging Face safetensors file (GPT2LMHeadModel "
     "for gpt, LlamaForCausalLM for llama) and its config.json in FILE's directory (name "
     "FILE model.safetensors for from_pretrained(directory))",
     1, 1},
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

absl::Status ParseChunks(absl::string_view v, int* out) {
  if (!absl::SimpleAtoi(v, out) || *out < 0 || *out > 64) {
    return UsageError(
        absl::StrCat("--chunks: expected stages per worker in [0, 64], got '", v, "'"));
  }
  return absl::OkStatus();
}

absl::Status ParseWorkers(absl::string_view v, int* out) {
  if (!absl::SimpleAtoi(v, out) || *out < 1 || *out > kMaxGangWorkers) {
    return UsageError(absl::StrCat("--workers: expected a number of workers in [1, ",
                                   kMaxGangWorkers, "], got '", v, "'"));
  }
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
  RETURN_IF_ERROR(ParseStep("--steps", v.substr(0, dots), first));
  RETURN_IF_ERROR(ParseStep("--steps", v.substr(dots + 2), last));
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

// A value that must not be empty (a file or a name).
absl::Status NonEmpty(absl::string_view flag, absl::string_view v, std::string* out) {
  if (v.empty()) return UsageError(absl::StrCat(flag, ": missing value"));
  *out = std::string(v);
  return absl::OkStatus();
}

// What the CLI11 app writes while it parses.
struct ParseState {
  CliOptions opts;
  std::vector<std::string> positional;      // the command's arguments
  std::optional<std::string> output_value;  // -o: a format, or a file (export, trace)
  bool help = false;
  bool version = false;
  // The first failing value check. CLI11 sees only its message; this keeps the status.
  absl::Status check_error;
};

// A CLI11 validator that parses the option's value with `parse` (which stores it) and keeps a
// failure's status in `state`.
CLI::Validator Parses(ParseState* state, std::function<absl::Status(const std::string&)> parse) {
  return CLI::Validator(
      [state, parse = std::move(parse)](std::string& value) -> std::string {
        absl::Status s = parse(value);
        if (s.ok()) return "";
        if (state->check_error.ok()) state->check_error = s;
        return std::string(s.message());
      },
      "");
}

// Renders the app as the `tandem help` text: two-column rows whose descriptions start at
// column 31 and keep their own line breaks.
class UsageFormatter : public CLI::Formatter {
 public:
  std::string make_help(const CLI::App* app, std::string /*name*/,
                        CLI::AppFormatMode /*mode*/) const override {
    if (app->get_parent() != nullptr) return CommandHelp(app);
    std::string out = absl::StrCat("Usage: ", app->get_name(), " [flags] COMMAND [args]\n\n",
                                   app->get_description(), "\n\nCommands:\n");
    const auto all = [](const CLI::App*) { return true; };
    for (const CLI::App* sub : app->get_subcommands(all)) {
      absl::StrAppend(&out, Row(Invocation(sub), sub->get_description()));
    }
    absl::StrAppend(&out, "\nFlags (anywhere on the line):\n");
    // An option without a description shares the row above (--tls-cert FILE --tls-key FILE).
    std::vector<std::pair<std::string, std::string>> rows;
    for (const CLI::Option* opt : app->get_options()) {
      std::string left = Names(opt);
      if (opt->get_expected_max() != 0) absl::StrAppend(&left, " ", opt->get_type_name());
      if (opt->get_description().empty() && !rows.empty()) {
        absl::StrAppend(&rows.back().first, " ", left);
      } else {
        rows.emplace_back(std::move(left), opt->get_description());
      }
    }
    for (const auto& [left, description] : rows) absl::StrAppend(&out, Row(left, description));
    absl::StrAppend(&out, "\n", app->get_footer());
    return out;
  }

 private:
  static constexpr size_t kLeftWidth = 29;

  // "submit JOB.yaml [--watch]": the positional's type name is the command's synopsis.
  static std::string Invocation(const CLI::App* sub) {
    std::string synopsis;
    for (const CLI::Option* opt : sub->get_options()) {
      if (opt->get_positional()) synopsis = opt->get_type_name();
    }
    return absl::StrCat(sub->get_name(), synopsis.empty() ? "" : " ", synopsis);
  }

  static std::string CommandHelp(const CLI::App* sub) {
    return absl::StrCat("Usage: ", sub->get_parent()->get_name(), " ", Invocation(sub),
                        " [flags]\n\n", sub->get_description(),
                        ".\nRun 'tandem help' for the flags.\n");
  }

  // "-o, --output".
  static std::string Names(const CLI::Option* opt) {
    std::vector<std::string> names;
    for (const std::string& s : opt->get_snames()) names.push_back("-" + s);
    for (const std::string& l : opt->get_lnames()) names.push_back("--" + l);
    return absl::StrJoin(names, ", ");
  }

  static std::string Row(const std::string& left, const std::string& description) {
    std::string row = absl::StrCat("  ", left);
    row.append(left.size() + 2 <= kLeftWidth ? kLeftWidth - left.size() : 2, ' ');
    absl::StrAppend(
        &row, absl::StrReplaceAll(description, {{"\n", "\n" + std::string(kLeftWidth + 2, ' ')}}),
        "\n");
    return row;
  }
};

constexpr char kFooter[] =
    "Examples:\n"
    "  JOB=$(tandem submit examples/quickstart.yaml)\n"
    "  tandem watch $JOB\n"
    "  tandem status $JOB -o json\n"
    "  tandem plan examples/quickstart.yaml --compare\n"
    "  tandem trace $JOB -o trace.json   # open it at https://ui.perfetto.dev\n"
    "\n"
    "Exit status: 0 on success, 1 on an error (or a watched job that failed or was\n"
    "cancelled), 2 on a usage error.\n";

// The commands some flags apply to, and the message when one is given to another command.
struct FlagScope {
  std::vector<const char*> flags;
  std::vector<Command> commands;
  const char* message;
};

// The flags that exclude one another (CLI11 `excludes`) and their message.
struct Exclusion {
  const char* flag;
  const char* message;
};

// The app over `state`: parsing it fills state->opts.
class TandemApp {
 public:
  static constexpr int kMaxWords = 1 << 20;

  explicit TandemApp(ParseState* state) : state_(state) {
    app_.name("tandem");
    app_.description("Tandem client: submit and follow pipeline-parallel training jobs.");
    app_.footer(kFooter);
    app_.formatter(std::make_shared<UsageFormatter>());  // before the subcommands copy it
    app_.set_help_flag();  // -h is an ordinary flag: `tandem submit -h` is `tandem help submit`
    app_.require_subcommand(0, 1);  // once the command is known, words are its arguments
    for (const CommandInfo& c : kCommands) {
      CLI::App* sub = app_.add_subcommand(c.name, c.summary);
      sub->fallthrough();  // the flags live on the root app
      // The command's arguments, as typed: every word (no CLI11 "[a,b]" lists), counted by
      // FinishOptions so that a wrong count gets the command's usage line.
      sub->add_option("ARGS")
          ->type_name(c.synopsis)
          ->expected(kMaxWords)
          ->allow_extra_args(false)
          ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
    }
    AddFlags();
  }

  // The environment's values become the flags' defaults (checked as the flags are); a flag on
  // the line wins. An unset or empty variable is no default. CLI11's own envname() is not
  // used: it reads the process environment, and ParseArgs takes its environment as an argument.
  absl::Status SetDefaults(const CliEnvironment& env) {
    struct Default {
      const char* flag;
      const char* variable;
      const char* value;
    };
    const Default defaults[] = {
        {"--coordinator", "TANDEM_COORDINATOR", env.coordinator},
        {"--tls-ca", "TANDEM_TLS_CA", env.tls_ca},
        {"--tls-cert", "TANDEM_TLS_CERT", env.tls_cert},
        {"--tls-key", "TANDEM_TLS_KEY", env.tls_key},
        {"--tls-server-name", "TANDEM_TLS_SERVER_NAME", env.tls_server_name},
        {"--token-file", "TANDEM_TOKEN_FILE", env.token_file},
    };
    for (const Default& d : defaults) {
      if (d.value == nullptr || *d.value == '\0') continue;
      try {
        app_.get_option(d.flag)->default_val(d.value);
      } catch (const CLI::ValidationError&) {
        return WithPrefix(state_->check_error, absl::StrCat("$", d.variable));
      }
    }
    // $TANDEM_TOKEN has no flag: the token itself is not put on command lines.
    if (env.token != nullptr && *env.token != '\0') state_->opts.token = env.token;
    return absl::OkStatus();
  }

  CLI::App& app() { return app_; }

  // The arguments of the command given (none without one).
  std::vector<std::string> Arguments() const {
    for (const CLI::App* sub : app_.get_subcommands()) return sub->get_option("ARGS")->results();
    return {};
  }

  bool Given(const char* flag) const { return app_.get_option(flag)->count() > 0; }

  // The scope and exclusion checks, in the order the messages always came.
  absl::Status CheckFlags(Command command) const {
    const FlagScope overrides = {{"--schedule", "--schedule-csv", "--chunks", "--auto"},
                                 {Command::kPlan, Command::kSubmit, Command::kValidate},
                                 "--schedule, --schedule-csv, --chunks and --auto apply to plan, "
                                 "submit and validate"};
    const FlagScope plan_only = {
        {"--print-actions", "--compare", "--csv", "--no-search", "--no-profile", "--workers"},
        {Command::kPlan},
        "--print-actions, --compare, --csv, --no-search, --no-profile and --workers apply to plan "
        "only"};
    const FlagScope trace_only = {{"--step", "--steps", "--svg"},
                                  {Command::kTrace},
                                  "--step, --steps and --svg apply to trace only"};
    const FlagScope watch = {
        {"--watch"},
        {Command::kSubmit},
        "--watch applies to submit only; to follow a job use 'tandem watch JOB'"};
    RETURN_IF_ERROR(CheckScope(overrides, command));
    RETURN_IF_ERROR(CheckExclusion({"--schedule", "give --schedule or --schedule-csv, not both"}));
    RETURN_IF_ERROR(CheckScope(plan_only, command));
    RETURN_IF_ERROR(CheckScope(trace_only, command));
    RETURN_IF_ERROR(CheckExclusion({"--step", "give --step N or --steps A..B, not both"}));
    RETURN_IF_ERROR(CheckExclusion(
        {"--svg",
         "--svg draws one step: give --step N (or none for the latest), or write the steps "
         "as JSON"}));
    return CheckScope(watch, command);
  }

 private:
  // The options, in the order of the help text.
  void AddFlags() {
    CliOptions& o = state_->opts;
    Value("--coordinator", "HOST:PORT",
          absl::StrCat("Coordinator address (default $TANDEM_COORDINATOR,\nelse ",
                       kDefaultCoordinator, ")"),
          [&o](const std::string& v) {
            RETURN_IF_ERROR(CheckAddress(v));
            o.coordinator = v;
            return absl::OkStatus();
          });
    Value("-o,--output", "json|table",
          "Output of status, list, workers, watch, plan (default table;\nplan -o json: the "
          "coordinator's planner search);\nwith export and trace: the file to write",
          [this](const std::string& v) {
            state_->output_value = v;  // a format or a file: decided once the command is known
            return absl::OkStatus();
          });
    Value("--timeout", "SECONDS", "Deadline of each request (default 10)",
          [&o](const std::string& v) { return ParseTimeout(v, &o.timeout); });
    NonEmptyValue("--tls-ca", "FILE",
                  "TLS: the CA that signs the coordinator's certificate\n(default $TANDEM_TLS_CA; "
                  "without it: plaintext)",
                  &o.tls_ca);
    NonEmptyValue("--token-file", "FILE",
                  "TLS: send the bearer token in FILE (default\n$TANDEM_TOKEN_FILE, else the "
                  "token in $TANDEM_TOKEN)",
                  &o.token_file);
    NonEmptyValue("--tls-cert", "FILE",
                  "TLS: authenticate with a client certificate\n(CN=tandem-client; default "
                  "$TANDEM_TLS_CERT, _KEY)",
                  &o.tls_cert);
    NonEmptyValue("--tls-key", "FILE", "", &o.tls_key);  // shares --tls-cert's help row
    NonEmptyValue("--tls-server-name", "NAME",
                  "TLS: the name the coordinator's certificate carries, if\nnot the host dialled "
                  "($TANDEM_TLS_SERVER_NAME)",
                  &o.tls_server_name);
    app_.add_flag("-w,--watch", o.watch, "With submit: follow the job after submitting it");
    CLI::Option* schedule = NonEmptyValue(
        "--schedule", "NAME",
        "With plan, submit, validate: use this schedule (gpipe,\n1f1b, interleaved_1f1b, zb_h1, "
        "zb_v, looped_bfs,\ninterleaved_zb, zb_h2, v_half, v_min, dualpipe_v)",
        &o.schedule);
    NonEmptyValue("--schedule-csv", "FILE",
                  "... or this one, in torch.distributed.pipelining's CSV", &o.schedule_csv)
        ->excludes(schedule);
    Value("--chunks", "N", "... with N stages per worker (interleaved_1f1b)",
          [&o](const std::string& v) { return ParseChunks(v, &o.chunks); });
    app_.add_flag("--auto", o.auto_plan,
                  "With plan, submit, validate: pipeline.plan: auto (the\ncoordinator runs the "
                  "planner's fastest schedule, chunks\nand split of the global batch)");
    app_.add_flag("--print-actions", o.print_actions,
                  "With plan: print every rank's lowered action list");
    app_.add_flag("--compare", o.compare,
                  "With plan: predicted figures of every schedule that fits");
    NonEmptyValue("--csv", "FILE", "With plan: write the schedule as CSV (re-importable)",
                  &o.csv_out);
    app_.add_flag("--no-profile", o.no_profile,
                  "With plan: do not ask the coordinator for measured layer\ncosts (plan with "
                  "unit costs)");
    Value("--workers", "N",
          "With plan: how to split N workers: every stages x replicas\nthat multiplies to N, "
          "at the spec's global batch",
          [&o](const std::string& v) { return ParseWorkers(v, &o.workers); });
    app_.add_flag("--no-search", o.no_search,
                  "With plan: skip the planner's search over schedules and\nsplits of the global "
                  "batch (one profile only)");
    CLI::Option* step =
        Value("--step", "N",
              "With trace: the step number (from 1, as watch and status\nshow "
              "it; default the latest kept)",
              [&o](const std::string& v) { return ParseStep("--step", v, &o.trace_step); });
    CLI::Option* steps = Value(
        "--steps", "A..B", "With trace: every kept step from A to B, in one JSON file",
        [&o](const std::string& v) { return ParseStepRange(v, &o.trace_first, &o.trace_last); });
    step->excludes(steps);
    app_.add_flag("--svg", state_->opts.svg, "With trace: an SVG Gantt chart (one row per stage)")
        ->excludes(steps);
    app_.add_flag("-h,--help", state_->help, "Show help");
    app_.add_flag("--version", state_->version, "Print the client version");
  }

  // An option with one value, checked (and stored) by `parse` as soon as it is read, so that
  // the first bad value on the line is the one reported.
  CLI::Option* Value(const char* names, const char* type, const std::string& description,
                     std::function<absl::Status(const std::string&)> parse) {
    return app_.add_option(names, description)
        ->type_name(type)
        ->trigger_on_parse()
        ->check(Parses(state_, std::move(parse)));
  }

  CLI::Option* NonEmptyValue(const char* name, const char* type, const std::string& description,
                             std::string* out) {
    return Value(name, type, description,
                 [name, out](const std::string& v) { return NonEmpty(name, v, out); });
  }

  absl::Status CheckScope(const FlagScope& scope, Command command) const {
    if (std::find(scope.commands.begin(), scope.commands.end(), command) != scope.commands.end()) {
      return absl::OkStatus();
    }
    for (const char* flag : scope.flags) {
      if (Given(flag)) return UsageError(scope.message);
    }
    return absl::OkStatus();
  }

  absl::Status CheckExclusion(const Exclusion& exclusion) const {
    const CLI::Option* opt = app_.get_option(exclusion.flag);
    if (opt->count() == 0) return absl::OkStatus();
    for (const CLI::Option* other : opt->get_excludes()) {
      if (other->count() > 0) return UsageError(exclusion.message);
    }
    return absl::OkStatus();
  }

  ParseState* state_;
  CLI::App app_;
};

// The line as CLI11 reads it: the flags with each value its own word, in their order; then
// the command; then "--" and the command's arguments. `error` is the first malformed word (an
// unknown command or flag, a missing value, a value given to a flag), where the line was cut.
struct Words {
  std::vector<std::string> words;
  absl::Status error;
};

// Today's spelling, read with the app's options: flags may come anywhere until "--"; the first
// other word is the command; "--name=value", "-ovalue" and "-o=value" give a value inline.
Words Tokenize(const CLI::App& app, const std::vector<std::string>& args) {
  Words out;
  std::vector<std::string> flags;
  std::optional<std::string> command;
  std::vector<std::string> positional;
  bool flags_done = false;
  for (size_t i = 0; i < args.size() && out.error.ok(); ++i) {
    const std::string& arg = args[i];
    if (flags_done || arg.size() <= 1 || arg[0] != '-') {
      if (command.has_value()) {
        positional.push_back(arg);
      } else if (FindCommand(arg) == nullptr) {
        out.error = UsageError(absl::StrCat("unknown command '", arg, "'"));
      } else {
        command = arg;
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
    const CLI::Option* opt = app.get_option_no_throw(name);
    if (opt == nullptr) {
      out.error = UsageError(absl::StrCat("unknown flag '", arg, "'"));
    } else if (opt->get_expected_max() == 0) {  // a flag
      if (inline_value.has_value()) {
        out.error = UsageError(absl::StrCat(name, ": takes no value"));
      } else {
        flags.push_back(name);
      }
    } else if (inline_value.has_value()) {
      flags.push_back(name);
      flags.push_back(*inline_value);
    } else if (i + 1 < args.size()) {
      flags.push_back(name);
      flags.push_back(args[++i]);
    } else {
      out.error = UsageError(absl::StrCat(name, ": missing value"));
    }
  }
  out.words = std::move(flags);
  if (command.has_value()) out.words.push_back(*command);
  if (!positional.empty()) {
    out.words.push_back("--");
    out.words.insert(out.words.end(), positional.begin(), positional.end());
  }
  return out;
}

// The checks that need the whole line, in their original order.
absl::StatusOr<CliOptions> FinishOptions(const TandemApp& tandem, ParseState& state,
                                         std::optional<Command> command) {
  CliOptions& opts = state.opts;
  if (state.help) {
    // `tandem submit --help` is `tandem help submit`.
    opts.command = Command::kHelp;
    if (command.has_value() && *command != Command::kHelp) {
      opts.args = {Info(*command).name};
    } else if (command.has_value()) {
      opts.args = state.positional;
    }
    return opts;
  }
  if (state.version && !command.has_value()) command = Command::kVersion;
  if (!command.has_value()) return UsageError("missing command");
  opts.command = *command;
  if (opts.command == Command::kExport) {
    if (!state.output_value.has_value() || state.output_value->empty()) {
      return UsageError("export: give the file to write with -o FILE.safetensors");
    }
    opts.output_path = *state.output_value;
  } else if (opts.command == Command::kTrace) {
    if (!state.output_value.has_value() || state.output_value->empty()) {
      return UsageError(absl::StrCat("trace: give the file to write with -o ",
                                     opts.svg ? "FILE.svg" : "FILE.json", " (- for stdout)"));
    }
    opts.output_path = *state.output_value;
  } else if (state.output_value.has_value()) {
    RETURN_IF_ERROR(ParseOutput(*state.output_value, &opts.output));
  }
  opts.args = std::move(state.positional);

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
  RETURN_IF_ERROR(tandem.CheckFlags(opts.command));
  return opts;
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
  ParseState state;
  TandemApp tandem(&state);
  RETURN_IF_ERROR(tandem.SetDefaults(env));
  Words line = Tokenize(tandem.app(), args);
  std::reverse(line.words.begin(), line.words.end());  // CLI11 reads the vector from its end
  try {
    tandem.app().parse(line.words);
  } catch (const CLI::ValidationError&) {
    return state.check_error;  // a bad value before any malformed word
  } catch (const CLI::ExcludesError&) {
    // Reported by CheckFlags, after the errors that always came first.
  } catch (const CLI::Error& e) {
    return UsageError(e.what());  // not expected: Tokenize leaves CLI11 nothing else to reject
  }
  RETURN_IF_ERROR(line.error);
  state.positional = tandem.Arguments();
  std::optional<Command> command;
  for (const CLI::App* sub : tandem.app().get_subcommands()) {
    command = FindCommand(sub->get_name())->command;
  }
  return FinishOptions(tandem, state, command);
}

absl::string_view CommandName(Command command) { return Info(command).name; }

std::string Usage() {
  ParseState state;
  TandemApp tandem(&state);
  return tandem.app().help();
}

std::string CommandUsage(Command command) {
  ParseState state;
  TandemApp tandem(&state);
  return tandem.app().get_subcommand(Info(command).name)->help();
}

}  // namespace tandem::cli
