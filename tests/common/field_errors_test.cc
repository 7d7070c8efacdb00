// The collector of a document's errors and their text form: one error per line, in order, the
// place as a suffix, continuation lines indented; and the text read back the same.
#include "common/field_errors.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

using ::testing::EndsWith;
using ::testing::StartsWith;

TEST(FieldErrorsTest, EmptyIsOk) {
  FieldErrors errors;
  EXPECT_TRUE(errors.empty());
  EXPECT_TRUE(errors.ToStatus().ok());
}

TEST(FieldErrorsTest, OneLinePerErrorInTheOrderAdded) {
  FieldErrors errors;
  errors.Add("steps", "must be in [1, 10000000], got 0", 2);
  errors.Add("pipeline.micro_batches", "expected an integer, got 'four'", 3, 18);
  errors.Add("data.path", "required with data.source \"file\"");
  const absl::Status s = errors.ToStatus();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(),
            "steps: must be in [1, 10000000], got 0 (line 2)\n"
            "pipeline.micro_batches: expected an integer, got 'four' (line 3, column 18)\n"
            "data.path: required with data.source \"file\"");
  EXPECT_TRUE(errors.Has("data.path"));
  EXPECT_FALSE(errors.Has("data"));
}

TEST(FieldErrorsTest, AttachLinesGivesEachErrorItsFieldsLine) {
  FieldErrors errors;
  errors.Add("model.n_head", "must divide model.d_model = 100, got 3");
  errors.Add("data.path", "required");  // not written: a default
  errors.Add("steps", "bad", 9, 4);     // already placed: kept
  errors.AttachLines({{"model.n_head", 6}, {"steps", 2}});
  ASSERT_EQ(errors.size(), 3);
  EXPECT_EQ(errors.errors()[0].line, 6);
  EXPECT_EQ(errors.errors()[1].line, 0);
  EXPECT_EQ(errors.errors()[2].line, 9);
}

TEST(FieldErrorsTest, FurtherLinesOfAnErrorAreIndentedContinuations) {
  FieldErrors errors;
  errors.Add("pipeline.schedule_csv", "deadlock:\n  rank 0: F0 [B0]\nrank 1: F0\r\n", 7);
  errors.Add("steps", "bad");
  EXPECT_EQ(errors.ToStatus().message(),
            "pipeline.schedule_csv: deadlock: (line 7)\n  rank 0: F0 [B0]\n  rank 1: F0\n"
            "steps: bad");
}

// A bound on an answer built from untrusted or huge input: the rest is counted, not listed.
TEST(FieldErrorsTest, KeepsAtMostTheLimitAndCountsTheRest) {
  FieldErrors errors;
  for (int i = 0; i < kMaxFieldErrors + 3; ++i) errors.Add(absl::StrCat("f", i), "bad");
  EXPECT_EQ(errors.size(), kMaxFieldErrors);
  const std::string text(errors.ToStatus().message());
  EXPECT_THAT(text, StartsWith("f0: bad\nf1: bad\n"));
  EXPECT_THAT(text, EndsWith(absl::StrCat("\nand 3 more errors (only the first ", kMaxFieldErrors,
                                          " are listed)")));
  // The paths of the errors not kept are unknown: a rule that reads a field must not trust it.
  EXPECT_TRUE(errors.Has("any.field"));
}

TEST(ParseFieldErrorsTest, ReadsBackTheTextForm) {
  FieldErrors errors;
  errors.Add("steps", "must be in [1, 10000000], got 0", 2);
  errors.Add("pipeline.micro_batches", "expected an integer, got 'four'", 3, 18);
  errors.Add("fields[a: b].x", "bad: very");
  errors.Add("pipeline.schedule_csv", "deadlock:\n  rank 0: F0", 5);
  errors.Add("job spec", "invalid YAML: end of map not found", 1, 9);
  const std::vector<FieldError> back = ParseFieldErrors(errors.ToStatus().message());
  ASSERT_EQ(back.size(), 5u);
  for (size_t i = 0; i < back.size(); ++i) {
    EXPECT_EQ(back[i].path, errors.errors()[i].path) << i;
    EXPECT_EQ(back[i].what, errors.errors()[i].what) << i;
    EXPECT_EQ(back[i].line, errors.errors()[i].line) << i;
    EXPECT_EQ(back[i].column, errors.errors()[i].column) << i;
  }
}

TEST(ParseFieldErrorsTest, TextThatNamesNoPathIsKeptWhole) {
  const std::vector<FieldError> back = ParseFieldErrors("spec_yaml is 9 bytes; at most 8\n");
  ASSERT_EQ(back.size(), 1u);
  EXPECT_EQ(back[0].path, "");
  EXPECT_EQ(back[0].what, "spec_yaml is 9 bytes; at most 8");
  EXPECT_EQ(back[0].line, 0);
}

TEST(ParseFieldErrorsTest, BoundsErrorsAndContinuationLines) {
  std::string text;
  for (int i = 0; i < 10; ++i) absl::StrAppend(&text, "f", i, ": bad\n  more\n  more\n  more\n");
  const std::vector<FieldError> back = ParseFieldErrors(text, /*max_errors=*/4,
                                                        /*max_lines_per_error=*/2);
  ASSERT_EQ(back.size(), 4u);
  EXPECT_EQ(back[3].what, "bad\n  more\n  more");
}

}  // namespace
}  // namespace tandem
