#include "worker/blas_core_restart.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <optional>
#include <string>

namespace tandem::worker {
namespace {

using ::testing::HasSubstr;

// Unsets a variable for the test's life and puts back what it held.
class UnsetEnv {
 public:
  explicit UnsetEnv(const char* name) : name_(name) {
    if (const char* v = std::getenv(name); v != nullptr) saved_ = v;
    unsetenv(name);
  }
  ~UnsetEnv() {
    if (saved_.has_value()) {
      setenv(name_, saved_->c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::optional<std::string> saved_;
};

TEST(BlasCoreToRestartWithTest, AutoRestartsOnlyWhenTheKernelsAreOlderAndNothingIsSet) {
  EXPECT_EQ(*BlasCoreToRestartWith("auto", nullptr, "SkylakeX"), "SkylakeX");
  EXPECT_EQ(*BlasCoreToRestartWith("auto", nullptr, ""), "");
  // The user's OPENBLAS_CORETYPE, or the one a restart set, is never overridden: no loop.
  EXPECT_EQ(*BlasCoreToRestartWith("auto", "Haswell", "SkylakeX"), "");
  EXPECT_EQ(*BlasCoreToRestartWith("auto", "SkylakeX", "SkylakeX"), "");
  EXPECT_EQ(*BlasCoreToRestartWith("keep", nullptr, "SkylakeX"), "");
}

TEST(BlasCoreToRestartWithTest, ACoreTypeRestartsUnlessTheEnvironmentNamesItAlready) {
  EXPECT_EQ(*BlasCoreToRestartWith("Haswell", nullptr, ""), "Haswell");
  EXPECT_EQ(*BlasCoreToRestartWith("Haswell", "SkylakeX", ""), "Haswell");
  EXPECT_EQ(*BlasCoreToRestartWith("Haswell", "HASWELL", "SkylakeX"), "");  // after the restart
  EXPECT_EQ(*BlasCoreToRestartWith("NEOVERSEN1", nullptr, ""), "NEOVERSEN1");
}

TEST(BlasCoreToRestartWithTest, AnythingElseIsRefusedNamingTheFlag) {
  for (const char* bad : {"", "Sky lake", "SkylakeX;rm", "-", "x/../y"}) {
    absl::StatusOr<std::string> r = BlasCoreToRestartWith(bad, nullptr, "SkylakeX");
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(r.status().message(),
                HasSubstr(std::string("--blas_core=") + bad + ": expected auto"));
  }
  EXPECT_FALSE(
      BlasCoreToRestartWith(std::string(kMaxBlasCoreTypeBytes + 1, 'a'), nullptr, "").ok());
}

TEST(RestartWithBlasCoreTest, AFailedStartLeavesTheEnvironmentAsItWas) {
  UnsetEnv coretype("OPENBLAS_CORETYPE");
  UnsetEnv before(kBlasCoreBeforeRestartEnv);
  EXPECT_EQ(RestartWithBlasCore({}, "SkylakeX", "Prescott").code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::getenv("OPENBLAS_CORETYPE"), nullptr);
  EXPECT_EQ(std::getenv(kBlasCoreBeforeRestartEnv), nullptr);
}

TEST(TakeBlasCoreRestartNoteTest, SaysWhatRanBeforeAndNowOnceAfterARestart) {
  UnsetEnv coretype("OPENBLAS_CORETYPE");
  UnsetEnv before(kBlasCoreBeforeRestartEnv);
  EXPECT_EQ(TakeBlasCoreRestartNote("SkylakeX"), "");
  setenv("OPENBLAS_CORETYPE", "SkylakeX", 1);
  setenv(kBlasCoreBeforeRestartEnv, "Prescott", 1);
  const std::string note = TakeBlasCoreRestartNote("SkylakeX");
  EXPECT_EQ(note,
            "started again with OPENBLAS_CORETYPE=SkylakeX (OpenBLAS had chosen its Prescott GEMM "
            "kernels): OpenBLAS now runs its SkylakeX kernels; --blas_core=keep keeps OpenBLAS's "
            "own choice");
  EXPECT_EQ(std::getenv(kBlasCoreBeforeRestartEnv), nullptr);
  EXPECT_EQ(TakeBlasCoreRestartNote("SkylakeX"), "");  // said once
}

TEST(TakeBlasCoreRestartNoteTest, SaysSoWhenOpenBlasDidNotTakeTheCoreType) {
  UnsetEnv coretype("OPENBLAS_CORETYPE");
  UnsetEnv before(kBlasCoreBeforeRestartEnv);
  setenv("OPENBLAS_CORETYPE", "Zen9", 1);
  setenv(kBlasCoreBeforeRestartEnv, "Haswell", 1);
  EXPECT_THAT(TakeBlasCoreRestartNote("Haswell"),
              HasSubstr("now runs its Haswell kernels, not Zen9 (it has none of that name"));
}

}  // namespace
}  // namespace tandem::worker
