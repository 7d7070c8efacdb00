// The coordinator's priorities (coordinator/priority.h): a lowered thread's later threads
// inherit its nice value, and a PriorityLauncher made before the lowering starts threads at
// the original priority (the scheduler and job runners), while everything else runs lowered.
#include "coordinator/priority.h"

#include <gtest/gtest.h>

#include <thread>

namespace tandem::coordinator {
namespace {

TEST(PriorityTest, ALoweredThreadsNewThreadsInheritAndTheLauncherKeepsTheOriginal) {
  std::thread([] {
    const int original = CallingThreadNice();
    if (original >= 7) GTEST_SKIP() << "this process already runs at nice " << original;
    PriorityLauncher launcher;  // before the lowering, as main makes it
    ASSERT_TRUE(LowerCallingThread(7).ok());
    EXPECT_EQ(CallingThreadNice(), 7);
    int inherited = -100;
    std::thread([&] { inherited = CallingThreadNice(); }).join();
    EXPECT_EQ(inherited, 7);
    int on_launcher = -100, started_by_launcher = -100;
    launcher.Run([&] {
      on_launcher = CallingThreadNice();
      std::thread([&] { started_by_launcher = CallingThreadNice(); }).join();
    });
    EXPECT_EQ(on_launcher, original);
    EXPECT_EQ(started_by_launcher, original);
    // Runs one after another, each waited for.
    int runs = 0;
    for (int i = 0; i < 3; ++i) launcher.Run([&] { ++runs; });
    EXPECT_EQ(runs, 3);
  }).join();
}

TEST(PriorityTest, LoweringNeverRaisesAndRejectsValuesOutsideTheRange) {
  std::thread([] {
    ASSERT_TRUE(LowerCallingThread(std::max(CallingThreadNice(), 4)).ok());
    const int now = CallingThreadNice();
    EXPECT_TRUE(LowerCallingThread(0).ok());  // already above: nothing to do
    EXPECT_EQ(CallingThreadNice(), now);
    EXPECT_EQ(LowerCallingThread(20).code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(LowerCallingThread(-1).code(), absl::StatusCode::kInvalidArgument);
  }).join();
}

}  // namespace
}  // namespace tandem::coordinator
