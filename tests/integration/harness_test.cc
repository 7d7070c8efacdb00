// The harness's RunCommand: a command's own helpers do not outlive it (a headless browser's
// renderers once kept a test waiting for minutes), and a command past its time is killed with
// everything it started.
#include "tests/integration/harness.h"

#include <signal.h>
#include <sys/types.h>

#include <chrono>
#include <filesystem>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/strip.h"
#include "gtest/gtest.h"

namespace tandem::testing {
namespace {

using namespace std::chrono_literals;

// Whether `pid` is still a live process (a zombie, waiting for a reaper, counts as gone).
bool Alive(pid_t pid) {
  const std::string stat = ReadFile("/proc/" + std::to_string(pid) + "/stat");
  if (stat.empty()) return false;
  const size_t paren = stat.rfind(')');
  return paren != std::string::npos && paren + 2 < stat.size() && stat[paren + 2] != 'Z';
}

pid_t PidIn(const std::string& path) {
  int pid = 0;
  EXPECT_TRUE(absl::SimpleAtoi(absl::StripAsciiWhitespace(ReadFile(path)), &pid)) << path;
  return pid;
}

std::string TempPath(const std::string& name) {
  return (std::filesystem::temp_directory_path() /
          ("tandem-harness-" + std::to_string(getpid()) + "-" + name))
      .string();
}

TEST(HarnessTest, WhatACommandStartedDiesWithIt) {
  const std::string pid_file = TempPath("bg.pid");
  CommandResult r =
      RunCommand({"/bin/sh", "-c", "sleep 60 & echo $! > " + pid_file + "; echo done"}, 30s);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "done\n");
  const pid_t bg = PidIn(pid_file);
  ASSERT_GT(bg, 0);
  EXPECT_TRUE(WaitFor([&] { return !Alive(bg); }, 5s)) << "the background sleep outlived sh";
  if (Alive(bg)) kill(bg, SIGKILL);
  std::filesystem::remove(pid_file);
}

TEST(HarnessTest, ACommandPastItsTimeIsKilledWithItsChildren) {
  const std::string pid_file = TempPath("slow.pid");
  const auto start = std::chrono::steady_clock::now();
  CommandResult r =
      RunCommand({"/bin/sh", "-c", "sleep 60 & echo $! > " + pid_file + "; wait"}, 1s);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 20s);
  EXPECT_EQ(r.exit_code, 128 + SIGKILL);
  EXPECT_EQ(r.err.rfind("timed out", 0), 0u) << r.err;
  const pid_t bg = PidIn(pid_file);
  ASSERT_GT(bg, 0);
  EXPECT_TRUE(WaitFor([&] { return !Alive(bg); }, 5s)) << "the child outlived the timeout";
  if (Alive(bg)) kill(bg, SIGKILL);
  std::filesystem::remove(pid_file);
}

}  // namespace
}  // namespace tandem::testing
