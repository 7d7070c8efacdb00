#include <string>
#include <vector>

#include "coordinator/cli/args.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem::cli {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

CliOptions Parse(const std::vector<std::string>& args, const char* env = nullptr) {
  absl::StatusOr<CliOptions> opts = ParseArgs(args, env);
  EXPECT_TRUE(opts.ok()) << opts.status();
  return opts.ok() ? *opts : CliOptions{};
}

std::string UsageError(const std::vector<std::string>& args, const char* env = nullptr) {
  absl::StatusOr<CliOptions> opts = ParseArgs(args, env);
  EXPECT_FALSE(opts.ok());
  if (opts.ok()) return "";
  EXPECT_EQ(opts.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(opts.status().message());
}

TEST(ParseArgs, Defaults) {
  const CliOptions opts = Parse({"list"});
  EXPECT_EQ(opts.command, Command::kList);
  EXPECT_THAT(opts.args, IsEmpty());
  EXPECT_EQ(opts.coordinator, "127.0.0.1:7070");
  EXPECT_EQ(opts.output, OutputFormat::kTable);
  EXPECT_EQ(opts.timeout, absl::Seconds(10));
  EXPECT_FALSE(opts.watch);
}

TEST(ParseArgs, AutoAndNoSearch) {
  EXPECT_TRUE(Parse({"submit", "--auto", "job.yaml"}).auto_plan);
  EXPECT_TRUE(Parse({"plan", "--auto", "job.yaml"}).auto_plan);
  EXPECT_TRUE(Parse({"plan", "--no-search", "job.yaml"}).no_search);
  EXPECT_EQ(Parse({"plan", "--workers", "8", "job.yaml"}).workers, 8);
  EXPECT_THAT(UsageError({"plan", "--workers", "0", "job.yaml"}),
              HasSubstr("--workers: expected a number of workers in [1, 4096]"));
  EXPECT_THAT(UsageError({"submit", "--workers", "2", "j.yaml"}), HasSubstr("--workers"));
  EXPECT_THAT(UsageError({"list", "--auto"}), HasSubstr("--auto apply to plan, submit"));
  EXPECT_THAT(UsageError({"submit", "--no-search", "j.yaml"}), HasSubstr("--no-search"));
}

TEST(ParseArgs, CoordinatorFromEnvironmentThenFlag) {
  EXPECT_EQ(Parse({"list"}, "coord:9000").coordinator, "coord:9000");
  EXPECT_EQ(Parse({"list"}, "").coordinator, "127.0.0.1:7070");
  EXPECT_EQ(Parse({"--coordinator", "a:1", "list"}, "coord:9000").coordinator, "a:1");
  EXPECT_EQ(Parse({"list", "--coordinator=b:2"}, "coord:9000").coordinator, "b:2");
  EXPECT_THAT(UsageError({"list"}, "has space:1"), HasSubstr("$TANDEM_COORDINATOR"));
}

TEST(ParseArgs, CommandsAndArguments) {
  CliOptions opts = Parse({"submit", "job.yaml"});
  EXPECT_EQ(opts.command, Command::kSubmit);
  EXPECT_THAT(opts.args, ElementsAre("job.yaml"));
  EXPECT_FALSE(opts.watch);

  opts = Parse({"submit", "--watch", "job.yaml"});
  EXPECT_TRUE(opts.watch);
  EXPECT_THAT(opts.args, ElementsAre("job.yaml"));
  EXPECT_TRUE(Parse({"-w", "submit", "-"}).watch);

  EXPECT_THAT(Parse({"status"}).args, IsEmpty());
  EXPECT_THAT(Parse({"status", "job-1"}).args, ElementsAre("job-1"));
  EXPECT_EQ(Parse({"watch", "job-1"}).command, Command::kWatch);
  EXPECT_EQ(Parse({"cancel", "job-1"}).command, Command::kCancel);
  EXPECT_EQ(Parse({"workers"}).command, Command::kWorkers);
  EXPECT_EQ(Parse({"validate", "x.yaml"}).command, Command::kValidate);
  EXPECT_EQ(Parse({"version"}).command, Command::kVersion);
  EXPECT_EQ(Parse({"--version"}).command, Command::kVersion);
}

TEST(ParseArgs, OutputFormatSpellings) {
  EXPECT_EQ(Parse({"list", "-o", "json"}).output, OutputFormat::kJson);
  EXPECT_EQ(Parse({"-ojson", "list"}).output, OutputFormat::kJson);
  EXPECT_EQ(Parse({"-o=json", "list"}).output, OutputFormat::kJson);
  EXPECT_EQ(Parse({"list", "--output", "JSON"}).output, OutputFormat::kJson);
  EXPECT_EQ(Parse({"list", "--output=table"}).output, OutputFormat::kTable);
  EXPECT_EQ(Parse({"status", "job-1", "-o", "json"}).output, OutputFormat::kJson);
  EXPECT_THAT(UsageError({"list", "-o", "yaml"}),
              HasSubstr("-o/--output: expected json or table, got 'yaml'"));
}

TEST(ParseArgs, Timeout) {
  EXPECT_EQ(Parse({"list", "--timeout", "2.5"}).timeout, absl::Milliseconds(2500));
  EXPECT_EQ(Parse({"--timeout=30", "list"}).timeout, absl::Seconds(30));
  for (const char* bad : {"0", "-1", "abc", "inf", "100000"}) {
    EXPECT_THAT(UsageError({"list", "--timeout", bad}), HasSubstr("--timeout")) << bad;
  }
}

TEST(ParseArgs, Help) {
  CliOptions opts = Parse({"--help"});
  EXPECT_EQ(opts.command, Command::kHelp);
  EXPECT_THAT(opts.args, IsEmpty());
  EXPECT_EQ(Parse({"-h"}).command, Command::kHelp);
  EXPECT_EQ(Parse({"help"}).command, Command::kHelp);
  EXPECT_THAT(Parse({"help", "watch"}).args, ElementsAre("watch"));
  // `tandem submit --help` asks about submit, even without its arguments.
  opts = Parse({"submit", "--help"});
  EXPECT_EQ(opts.command, Command::kHelp);
  EXPECT_THAT(opts.args, ElementsAre("submit"));
  EXPECT_THAT(UsageError({"help", "frob"}), HasSubstr("help: unknown command 'frob'"));
}

TEST(ParseArgs, DoubleDashEndsFlags) {
  EXPECT_THAT(Parse({"cancel", "--", "-odd-id"}).args, ElementsAre("-odd-id"));
}

TEST(ParseArgs, UsageErrors) {
  EXPECT_THAT(UsageError({}), HasSubstr("missing command"));
  EXPECT_THAT(UsageError({"frob"}), HasSubstr("unknown command 'frob'"));
  EXPECT_THAT(UsageError({"list", "--frob"}), HasSubstr("unknown flag '--frob'"));
  EXPECT_THAT(UsageError({"list", "-x"}), HasSubstr("unknown flag '-x'"));
  EXPECT_THAT(UsageError({"list", "-o"}), HasSubstr("-o: missing value"));
  EXPECT_THAT(UsageError({"list", "--coordinator"}), HasSubstr("--coordinator: missing value"));
  EXPECT_THAT(UsageError({"list", "--coordinator="}), HasSubstr("expected HOST:PORT"));
  EXPECT_THAT(UsageError({"submit"}),
              HasSubstr("missing argument; usage: tandem submit JOB.yaml [--watch]"));
  EXPECT_THAT(UsageError({"submit", "a.yaml", "b.yaml"}), HasSubstr("too many arguments"));
  EXPECT_THAT(UsageError({"watch"}), HasSubstr("usage: tandem watch JOB"));
  EXPECT_THAT(UsageError({"cancel"}), HasSubstr("usage: tandem cancel JOB"));
  EXPECT_THAT(UsageError({"list", "extra"}), HasSubstr("too many arguments; usage: tandem list"));
  EXPECT_THAT(UsageError({"status", "a", "b"}), HasSubstr("too many arguments"));
  EXPECT_THAT(UsageError({"status", "--watch"}), HasSubstr("--watch applies to submit only"));
  EXPECT_THAT(UsageError({"list", "--help=yes"}), HasSubstr("--help: takes no value"));
  EXPECT_THAT(UsageError({"frob"}), HasSubstr("see 'tandem help'"));
}

TEST(ParseArgs, PlanAndScheduleOverrides) {
  CliOptions opts = Parse({"plan", "job.yaml", "--print-actions", "--schedule", "zb_h1",
                           "--chunks=2", "--csv", "out.csv"});
  EXPECT_EQ(opts.command, Command::kPlan);
  EXPECT_THAT(opts.args, ElementsAre("job.yaml"));
  EXPECT_TRUE(opts.print_actions);
  EXPECT_FALSE(opts.compare);
  EXPECT_EQ(opts.schedule, "zb_h1");
  EXPECT_EQ(opts.chunks, 2);
  EXPECT_EQ(opts.csv_out, "out.csv");
  opts = Parse({"plan", "job.yaml", "--compare", "--schedule-csv", "s.csv"});
  EXPECT_TRUE(opts.compare);
  EXPECT_EQ(opts.schedule_csv, "s.csv");
  EXPECT_EQ(opts.chunks, -1);
  opts = Parse({"submit", "job.yaml", "--schedule", "gpipe"});
  EXPECT_EQ(opts.schedule, "gpipe");
  EXPECT_THAT(UsageError({"plan"}), HasSubstr("usage: tandem plan JOB.yaml"));
  EXPECT_THAT(UsageError({"plan", "j", "--schedule", "a", "--schedule-csv", "b"}),
              HasSubstr("not both"));
  EXPECT_THAT(UsageError({"plan", "j", "--chunks", "x"}), HasSubstr("--chunks: expected"));
  EXPECT_THAT(UsageError({"list", "--schedule", "gpipe"}), HasSubstr("apply to plan, submit"));
  EXPECT_THAT(UsageError({"validate", "j", "--compare"}), HasSubstr("apply to plan only"));
  EXPECT_THAT(UsageError({"plan", "j", "--print-actions=1"}), HasSubstr("takes no value"));
}

TEST(ParseArgs, Trace) {
  CliOptions opts = Parse({"trace", "job-3", "-o", "t.json"});
  EXPECT_EQ(opts.command, Command::kTrace);
  EXPECT_THAT(opts.args, ElementsAre("job-3"));
  EXPECT_EQ(opts.output_path, "t.json");  // a file, not a format
  EXPECT_EQ(opts.trace_step, -1);
  EXPECT_FALSE(opts.svg);
  opts = Parse({"trace", "job-3", "--step", "7", "--svg", "-o", "t.svg"});
  EXPECT_EQ(opts.trace_step, 7);
  EXPECT_TRUE(opts.svg);
  opts = Parse({"trace", "job-3", "--steps=2..9", "-o", "-"});
  EXPECT_EQ(opts.trace_first, 2);
  EXPECT_EQ(opts.trace_last, 9);
  EXPECT_EQ(opts.output_path, "-");

  EXPECT_THAT(UsageError({"trace", "job-3"}),
              HasSubstr("give the file to write with -o FILE.json"));
  EXPECT_THAT(UsageError({"trace", "job-3", "--svg"}), HasSubstr("-o FILE.svg"));
  EXPECT_THAT(UsageError({"trace", "-o", "t.json"}), HasSubstr("usage: tandem trace JOB"));
  EXPECT_THAT(UsageError({"trace", "job-3", "--step", "-1", "-o", "t"}),
              HasSubstr("--step: expected a step number (1 for the first step)"));
  EXPECT_THAT(UsageError({"trace", "job-3", "--step", "0", "-o", "t"}),
              HasSubstr("--step: expected a step number"));
  EXPECT_THAT(UsageError({"trace", "job-3", "--steps", "9..2", "-o", "t"}), HasSubstr("is empty"));
  EXPECT_THAT(UsageError({"trace", "job-3", "--steps", "4", "-o", "t"}), HasSubstr("A..B"));
  EXPECT_THAT(UsageError({"trace", "job-3", "--step", "1", "--steps", "1..2", "-o", "t"}),
              HasSubstr("not both"));
  EXPECT_THAT(UsageError({"trace", "job-3", "--steps", "1..2", "--svg", "-o", "t"}),
              HasSubstr("--svg draws one step"));
  EXPECT_THAT(UsageError({"status", "job-3", "--svg"}), HasSubstr("apply to trace only"));
}

TEST(ParseArgs, TlsFlagsAndTheirEnvironment) {
  CliOptions none = Parse({"list"});
  EXPECT_EQ(none.tls_ca, "");
  EXPECT_EQ(none.token_file, "");
  CliOptions flags = Parse({"--tls-ca", "ca.crt", "--tls-cert=c.crt", "--tls-key", "c.key",
                            "--tls-server-name", "tandem-coordinator", "--token-file=t", "list"});
  EXPECT_EQ(flags.tls_ca, "ca.crt");
  EXPECT_EQ(flags.tls_cert, "c.crt");
  EXPECT_EQ(flags.tls_key, "c.key");
  EXPECT_EQ(flags.tls_server_name, "tandem-coordinator");
  EXPECT_EQ(flags.token_file, "t");
  CliEnvironment env;
  env.coordinator = "coord:7070";
  env.tls_ca = "env-ca.crt";
  env.token_file = "env-token";
  env.token = "secret-token-from-env";
  absl::StatusOr<CliOptions> from_env = ParseArgs({"list", "--token-file", "flag-token"}, env);
  ASSERT_TRUE(from_env.ok()) << from_env.status();
  EXPECT_EQ(from_env->coordinator, "coord:7070");
  EXPECT_EQ(from_env->tls_ca, "env-ca.crt");
  EXPECT_EQ(from_env->token_file, "flag-token");  // the flag wins
  EXPECT_EQ(from_env->token, "secret-token-from-env");
  EXPECT_THAT(UsageError({"list", "--tls-ca"}), HasSubstr("--tls-ca: missing value"));
  EXPECT_THAT(UsageError({"list", "--token-file="}), HasSubstr("--token-file: missing value"));
}

TEST(Usage, ListsEveryCommandAndFlag) {
  const std::string usage = Usage();
  for (const char* word :
       {"submit",         "status",         "watch",           "list",
        "cancel",         "workers",        "validate",        "plan",
        "--schedule",     "--schedule-csv", "--print-actions", "--compare",
        "--coordinator",  "--output",       "--timeout",       "TANDEM_COORDINATOR",
        "127.0.0.1:7070", "trace",          "--step",          "--steps",
        "--svg"}) {
    EXPECT_THAT(usage, HasSubstr(word));
  }
  for (const char* word : {"--tls-ca", "--tls-cert", "--tls-key", "--tls-server-name",
                           "--token-file", "TANDEM_TOKEN", "TANDEM_TLS_CA"}) {
    EXPECT_THAT(usage, HasSubstr(word));
  }
  EXPECT_THAT(CommandUsage(Command::kWatch), HasSubstr("Usage: tandem watch JOB"));
}

}  // namespace
}  // namespace tandem::cli
