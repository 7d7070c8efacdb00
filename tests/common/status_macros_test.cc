#include "common/status_macros.h"

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

int calls = 0;

absl::Status Fails(absl::StatusCode code) {
  ++calls;
  return absl::Status(code, "it broke");
}
absl::Status Succeeds() {
  ++calls;
  return absl::OkStatus();
}
absl::StatusOr<std::unique_ptr<int>> MakeInt(bool ok, int v) {
  ++calls;
  if (!ok) return absl::NotFoundError("no int");
  return std::make_unique<int>(v);
}

absl::Status Chain(bool first_ok, bool second_ok, std::string* trail) {
  RETURN_IF_ERROR(first_ok ? Succeeds() : Fails(absl::StatusCode::kUnavailable));
  *trail += "a";
  RETURN_IF_ERROR(second_ok ? Succeeds() : Fails(absl::StatusCode::kInvalidArgument));
  *trail += "b";
  return absl::OkStatus();
}

absl::StatusOr<int> Sum(bool ok) {
  ASSIGN_OR_RETURN(std::unique_ptr<int> a, MakeInt(true, 2));  // move-only values move out
  ASSIGN_OR_RETURN(auto b, MakeInt(ok, 3));
  int c = 0;
  ASSIGN_OR_RETURN(c, absl::StatusOr<int>(4));  // an existing variable
  return *a + *b + c;
}

absl::Status StatusOrThroughReturnIfError(bool ok) {
  RETURN_IF_ERROR(MakeInt(ok, 1));  // a StatusOr's status
  return absl::OkStatus();
}

TEST(StatusMacrosTest, ReturnIfErrorReturnsTheFirstErrorAndStops) {
  std::string trail;
  calls = 0;
  EXPECT_TRUE(Chain(true, true, &trail).ok());
  EXPECT_EQ(trail, "ab");
  EXPECT_EQ(calls, 2);  // each expression evaluated once

  trail.clear();
  calls = 0;
  absl::Status s = Chain(false, true, &trail);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(s.message(), "it broke");
  EXPECT_EQ(trail, "");
  EXPECT_EQ(calls, 1);

  trail.clear();
  EXPECT_EQ(Chain(true, false, &trail).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(trail, "a");
}

TEST(StatusMacrosTest, AssignOrReturnDeclaresAssignsAndPropagates) {
  calls = 0;
  absl::StatusOr<int> ok = Sum(true);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(*ok, 9);
  EXPECT_EQ(calls, 2);

  absl::StatusOr<int> bad = Sum(false);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(bad.status().message(), "no int");
}

TEST(StatusMacrosTest, ReturnIfErrorTakesAStatusOr) {
  EXPECT_TRUE(StatusOrThroughReturnIfError(true).ok());
  EXPECT_EQ(StatusOrThroughReturnIfError(false).code(), absl::StatusCode::kNotFound);
}

TEST(StatusMacrosTest, WithPrefixKeepsCodeAndPayloads) {
  absl::Status s = absl::ResourceExhaustedError("no cut fits 100 MB");
  s.SetPayload("tandem.dev/min_budget_mb", absl::Cord("340"));
  absl::Status p = WithPrefix(s, "stage 2");
  EXPECT_EQ(p.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(p.message(), "stage 2: no cut fits 100 MB");
  ASSERT_TRUE(p.GetPayload("tandem.dev/min_budget_mb").has_value());
  EXPECT_EQ(std::string(*p.GetPayload("tandem.dev/min_budget_mb")), "340");
  EXPECT_TRUE(WithPrefix(absl::OkStatus(), "stage 2").ok());
}

}  // namespace
}  // namespace tandem
