// The log context on every line: job, stage and step, nesting, and per-thread state.
#include "common/log_context.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <sstream>
#include <string>
#include <thread>

#include "spdlog/sinks/ostream_sink.h"
#include "spdlog/spdlog.h"

namespace tandem {
namespace {

using ::testing::EndsWith;
using ::testing::HasSubstr;
using ::testing::MatchesRegex;

TEST(LogContext, FormatsUnsetFieldsAsDashesAndStepsFromOne) {
  EXPECT_EQ(FormatLogContext({}), "job=- stage=- step=-");
  EXPECT_EQ(FormatLogContext({.job = "job-3", .stage = "0,2", .step = 0}),
            "job=job-3 stage=0,2 step=1");
}

TEST(LogContext, ScopesNestAndRestore) {
  EXPECT_EQ(FormatLogContext(CurrentLogContext()), "job=- stage=- step=-");
  {
    ScopedLogContext job({.job = "job-1", .stage = "1"});
    {
      ScopedLogContext step({.step = 4});
      EXPECT_EQ(FormatLogContext(CurrentLogContext()), "job=job-1 stage=1 step=5");
      ScopedLogContext other({.job = "job-2"});
      EXPECT_EQ(FormatLogContext(CurrentLogContext()), "job=job-2 stage=1 step=5");
    }
    EXPECT_EQ(FormatLogContext(CurrentLogContext()), "job=job-1 stage=1 step=-");
    // Another thread starts with no context.
    std::string seen;
    std::thread([&] { seen = FormatLogContext(CurrentLogContext()); }).join();
    EXPECT_EQ(seen, "job=- stage=- step=-");
  }
  EXPECT_EQ(FormatLogContext(CurrentLogContext()), "job=- stage=- step=-");
}

TEST(LogContext, EveryLineCarriesTheContext) {
  std::ostringstream out;
  auto logger = std::make_shared<spdlog::logger>(
      "test", std::make_shared<spdlog::sinks::ostream_sink_mt>(out));
  auto previous = spdlog::default_logger();
  spdlog::set_default_logger(logger);
  InstallLogFormat();
  spdlog::info("idle");
  {
    ScopedLogContext ctx({.job = "job-7", .stage = "3", .step = 11});
    spdlog::warn("step failed: boom");
  }
  spdlog::set_default_logger(previous);
  const std::string text = out.str();
  std::istringstream lines(text);
  std::string first, second;
  std::getline(lines, first);
  std::getline(lines, second);
  EXPECT_THAT(first,
              MatchesRegex(R"(\[[0-9-]+ [0-9:.]+\] \[info\] \[job=- stage=- step=-\] idle)"));
  EXPECT_THAT(second, HasSubstr("[warning] [job=job-7 stage=3 step=12] "));
  EXPECT_THAT(second, EndsWith("step failed: boom"));
}

}  // namespace
}  // namespace tandem
