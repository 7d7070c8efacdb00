// The test-only fault (worker/fault_injection.h): its flag syntax and what it matches.
#include "worker/fault_injection.h"

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"

namespace tandem::worker {
namespace {

TEST(InjectedFaultTest, ParsesStepKindAndMicroBatchAndNamesWhatIsWrong) {
  // Steps count from 1 as users see them: "3" is the step at index 2.
  absl::StatusOr<InjectedFault> f = ParseInjectedFault("3:B:1");
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->step, 2);
  EXPECT_EQ(f->kind, v1::ACTION_B);
  EXPECT_EQ(f->micro_batch, 1);
  v1::Action a;
  a.set_kind(v1::ACTION_B);
  a.set_micro_batch(1);
  EXPECT_TRUE(f->Matches(2, a));
  EXPECT_FALSE(f->Matches(1, a));
  a.set_micro_batch(0);
  EXPECT_FALSE(f->Matches(2, a));
  f = ParseInjectedFault("1:SEND_F");
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->micro_batch, -1);
  a.set_kind(v1::ACTION_SEND_F);
  EXPECT_TRUE(f->Matches(0, a));
  EXPECT_FALSE(InjectedFault{}.Matches(0, a));
  for (const char* bad : {"", "2", "x:B", "0:B", "-1:B", "2:Q", "2:B:x", "2:B:1:0"}) {
    absl::StatusOr<InjectedFault> b = ParseInjectedFault(bad);
    EXPECT_EQ(b.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(b.status().message().find(absl::StrCat("fault '", bad, "'")), std::string::npos)
        << b.status();
  }
}

TEST(InjectedFaultTest, FailsAsAKernelWould) {
  const absl::Status s = InjectedFaultError();
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_EQ(s.message(), "injected fault (tandem-worker --test-fail-at)");
}

}  // namespace
}  // namespace tandem::worker
