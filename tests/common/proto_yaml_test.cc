// The generic YAML-to-proto walker, on messages other than the job spec: the well-known
// Struct (a map of Values, whose kind is a oneof, with an enum member and a nested list) and
// the wrapper types (one scalar `value` field of each type). The job spec's own cases are in
// spec_test.cc.
#include "common/proto_yaml.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/wrappers.pb.h"
#include "gtest/gtest.h"
#include "tandem/v1/spec.pb.h"

namespace tandem {
namespace {

using ::google::protobuf::BoolValue;
using ::google::protobuf::DoubleValue;
using ::google::protobuf::FloatValue;
using ::google::protobuf::Int32Value;
using ::google::protobuf::Int64Value;
using ::google::protobuf::ListValue;
using ::google::protobuf::StringValue;
using ::google::protobuf::Struct;
using ::google::protobuf::UInt32Value;
using ::google::protobuf::UInt64Value;
using ::google::protobuf::Value;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

// The message of a text that must be refused as INVALID_ARGUMENT, parsed into a fresh `M`.
template <typename M>
std::string Error(const std::string& yaml) {
  M msg;
  const absl::Status s = ParseYamlMessage(yaml, "config", &msg);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s << "\nfor:\n" << yaml;
  return std::string(s.message());
}

template <typename M>
M Parse(const std::string& yaml) {
  M msg;
  const absl::Status s = ParseYamlMessage(yaml, "config", &msg);
  EXPECT_TRUE(s.ok()) << s << "\nfor:\n" << yaml;
  return msg;
}

TEST(ParseYamlMessageTest, MapsOneofsEnumsAndNestedMessages) {
  const Struct s = Parse<Struct>(R"(
fields:
  n: {number_value: 2.5}
  s: {string_value: hello}
  b: {bool_value: true}
  z: {null_value: NULL_VALUE}
  l:
    list_value:
      values:
        - {number_value: 1}
        - {struct_value: {fields: {inner: {string_value: x}}}}
)");
  ASSERT_EQ(s.fields_size(), 5);
  EXPECT_EQ(s.fields().at("n").number_value(), 2.5);
  EXPECT_EQ(s.fields().at("s").string_value(), "hello");
  EXPECT_TRUE(s.fields().at("b").bool_value());
  EXPECT_EQ(s.fields().at("z").kind_case(), Value::kNullValue);
  const ListValue& l = s.fields().at("l").list_value();
  ASSERT_EQ(l.values_size(), 2);
  EXPECT_EQ(l.values(0).number_value(), 1.0);
  EXPECT_EQ(l.values(1).struct_value().fields().at("inner").string_value(), "x");
}

TEST(ParseYamlMessageTest, NullLeavesAFieldUnset) {
  EXPECT_EQ(Parse<Value>("number_value: ~\n").kind_case(), Value::KIND_NOT_SET);
  EXPECT_EQ(Parse<Value>("string_value:\n").kind_case(), Value::KIND_NOT_SET);
  // A null for one member of a oneof does not conflict with another.
  EXPECT_EQ(Parse<Value>("number_value: ~\nstring_value: a\n").string_value(), "a");
}

TEST(ParseYamlMessageTest, OneMemberOfAOneof) {
  EXPECT_EQ(Error<Value>("number_value: 1\nstring_value: a\n"),
            "string_value: conflicts with number_value: set only one of the kind fields (line 2, "
            "column 1)");
}

TEST(ParseYamlMessageTest, EnumsByValueName) {
  EXPECT_THAT(Error<Value>("null_value: NOTHING\n"),
              StartsWith("null_value: expected one of NULL_VALUE, got 'NOTHING'"));
  EXPECT_THAT(Error<Value>("null_value: [NULL_VALUE]\n"),
              StartsWith("null_value: expected one of NULL_VALUE, got a list"));
}

TEST(ParseYamlMessageTest, RepeatedFieldsAreLists) {
  EXPECT_THAT(Error<ListValue>("values: {number_value: 1}\n"),
              StartsWith("values: expected a list, got a map"));
  EXPECT_THAT(Error<ListValue>("values:\n  - {number_value: 1}\n  - ~\n"),
              StartsWith("values[1]: expected a value, got nothing"));
  EXPECT_THAT(Error<ListValue>("values:\n  - {number_value: x}\n"),
              StartsWith("values[0].number_value: expected a number, got 'x'"));
}

TEST(ParseYamlMessageTest, MapFieldsAreMaps) {
  EXPECT_THAT(Error<Struct>("fields: [a, b]\n"), StartsWith("fields: expected a map, got a list"));
  EXPECT_THAT(Error<Struct>("fields:\n  a: {}\n  a: {}\n"), StartsWith("fields[a]: duplicate key"));
  EXPECT_THAT(Error<Struct>("fields:\n  a:\n"),
              StartsWith("fields[a]: expected a value, got nothing"));
  EXPECT_THAT(Error<Struct>("fields:\n  a: 4\n"),
              StartsWith("fields[a]: expected a map with fields null_value, number_value, "
                         "string_value, bool_value, struct_value, list_value; got '4'"));
  EXPECT_THAT(Error<Struct>("fields:\n  a: {bool_value: maybe}\n"),
              StartsWith("fields[a].bool_value: expected true or false, got 'maybe'"));
}

TEST(ParseYamlMessageTest, IntegersInTheFieldsRange) {
  EXPECT_EQ(Parse<Int32Value>("value: -2147483648\n").value(), -2147483648);
  EXPECT_EQ(Parse<Int32Value>("value: +8\n").value(), 8);
  EXPECT_EQ(Parse<Int64Value>("value: 1e6\n").value(), 1000000);
  EXPECT_EQ(Parse<Int32Value>("value: 16.0\n").value(), 16);
  EXPECT_EQ(Parse<UInt64Value>("value: 18446744073709551615\n").value(), 18446744073709551615u);
  EXPECT_EQ(Parse<UInt32Value>("value: 4294967295\n").value(), 4294967295u);
  EXPECT_THAT(Error<Int32Value>("value: 3000000000\n"),
              StartsWith("value: expected an integer in [-2147483648, 2147483647], got "
                         "'3000000000'"));
  EXPECT_THAT(Error<UInt64Value>("value: -1\n"),
              StartsWith("value: expected an integer in [0, 18446744073709551615], got '-1'"));
  EXPECT_THAT(Error<UInt64Value>("value: 18446744073709551616\n"),
              StartsWith("value: expected an integer"));
  EXPECT_THAT(Error<UInt32Value>("value: 4294967296\n"),
              StartsWith("value: expected an integer in [0, 4294967295], got '4294967296'"));
  EXPECT_THAT(Error<Int32Value>("value: 2.5\n"),
              StartsWith("value: expected an integer, got '2.5' (not a whole number)"));
  EXPECT_THAT(Error<Int32Value>("value: four\n"),
              StartsWith("value: expected an integer, got 'four'"));
  EXPECT_THAT(Error<Int32Value>("value: [1, 2]\n"), StartsWith("value: expected an integer"));
  // 2^53 + 2 is beyond the integers a double holds exactly.
  EXPECT_THAT(Error<Int64Value>("value: 9.007199254740994e15\n"),
              StartsWith("value: expected an integer in"));
}

// A quoted 64-bit integer is canonical proto JSON; any other quoted number is a mistake.
TEST(ParseYamlMessageTest, QuotedNumbers) {
  EXPECT_EQ(Parse<Int64Value>("value: \"5\"\n").value(), 5);
  EXPECT_EQ(Parse<UInt64Value>("value: \"7\"\n").value(), 7u);
  EXPECT_THAT(Error<Int32Value>("value: \"5\"\n"),
              StartsWith("value: expected an integer, got the string '5'; write the number "
                         "without quotes"));
  EXPECT_THAT(Error<DoubleValue>("value: \"1.5\"\n"),
              StartsWith("value: expected a number, got the string '1.5'"));
  EXPECT_THAT(Error<BoolValue>("value: \"true\"\n"),
              StartsWith("value: expected true or false, got 'true'"));
}

TEST(ParseYamlMessageTest, FloatingPoint) {
  EXPECT_EQ(Parse<DoubleValue>("value: 1.0e-6\n").value(), 1e-6);
  EXPECT_TRUE(std::isinf(Parse<DoubleValue>("value: .inf\n").value()));
  EXPECT_LT(Parse<DoubleValue>("value: -.Inf\n").value(), 0);
  EXPECT_TRUE(std::isnan(Parse<DoubleValue>("value: .nan\n").value()));
  EXPECT_FLOAT_EQ(Parse<FloatValue>("value: 3e38\n").value(), 3e38f);
  EXPECT_THAT(Error<FloatValue>("value: 1e39\n"),
              StartsWith("value: expected a number within single-precision range (about "
                         "3.4e38), got '1e39'"));
  EXPECT_THAT(Error<DoubleValue>("value: fast\n"),
              StartsWith("value: expected a number, got 'fast'"));
}

TEST(ParseYamlMessageTest, BooleansAndStrings) {
  EXPECT_TRUE(Parse<BoolValue>("value: True\n").value());
  EXPECT_FALSE(Parse<BoolValue>("value: FALSE\n").value());
  EXPECT_THAT(Error<BoolValue>("value: yes\n"),
              StartsWith("value: expected true or false, got 'yes'"));
  // Any scalar is a string, numbers included.
  EXPECT_EQ(Parse<StringValue>("value: 12\n").value(), "12");
  EXPECT_THAT(Error<StringValue>("value: {a: 1}\n"),
              StartsWith("value: expected a string, got a map"));
}

TEST(ParseYamlMessageTest, UnknownFieldsNameTheClosestField) {
  EXPECT_EQ(Error<Int32Value>("valeu: 3\n"),
            "valeu: unknown field (did you mean value?); expected one of: value (line 1, "
            "column 1)");
  EXPECT_THAT(Error<Value>("xyzzy_plugh: 1\n"),
              AllOf(StartsWith("xyzzy_plugh: unknown field; expected one of: null_value, "
                               "number_value, string_value, bool_value, struct_value, "
                               "list_value"),
                    Not(HasSubstr("did you mean"))));
  // Nested paths join with '.'.
  EXPECT_THAT(Error<Struct>("fields:\n  a:\n    numbr_value: 1\n"),
              StartsWith("fields[a].numbr_value: unknown field (did you mean number_value?)"));
}

TEST(ParseYamlMessageTest, DuplicateKeys) {
  EXPECT_THAT(Error<Int32Value>("value: 3\nvalue: 4\n"),
              StartsWith("value: duplicate key; each field may appear once"));
}

// Errors about the whole text start with the document's name.
TEST(ParseYamlMessageTest, TheDocumentMustBeOneMap) {
  EXPECT_THAT(Error<Int32Value>("- a\n- b\n"),
              AllOf(StartsWith("config: expected a map with fields value; got a list")));
  EXPECT_THAT(Error<Int32Value>("just a string\n"),
              StartsWith("config: expected a map with fields value; got 'just a string'"));
  EXPECT_EQ(Error<Struct>(""), "config: the document is empty; expected a map with fields fields");
  EXPECT_THAT(Error<Struct>("# only a comment\n"), StartsWith("config: the document is empty"));
  EXPECT_THAT(Error<Int32Value>("value: 1\n---\nvalue: 2\n"),
              StartsWith("config: expected one YAML document, got 2 (remove the '---' lines)"));
  EXPECT_THAT(Error<Int32Value>("? [a, b]\n: 1\n"),
              StartsWith("config: keys must be field names, got a list"));
}

TEST(ParseYamlMessageTest, InvalidYamlNamesLineAndColumn) {
  EXPECT_THAT(Error<ListValue>("values:\n  - [1, 2\n"),
              AllOf(StartsWith("config: invalid YAML: "), HasSubstr("(line ")));
  EXPECT_THAT(Error<Int32Value>("value: 1\n  x: 3\n bad\n"), StartsWith("config: invalid YAML"));
  EXPECT_EQ(Error<Int32Value>("value: 1\nva\x01lue: 2\n"),
            "config: invalid YAML: control character 0x01 is not allowed (line 2, column 3)");
  // A stray ',' (yaml-cpp 0.7 would loop forever on it: jbeder/yaml-cpp#1040).
  EXPECT_THAT(Error<Int32Value>(", b"), StartsWith("config: invalid YAML"));
  // Field errors carry the place of the value.
  EXPECT_THAT(Error<Int32Value>("\n\nvalue:   x\n"), HasSubstr("(line 3, column 10)"));
}

// One pass reports the error of every field, in the order written, each with its place; the
// fields that are right are still read.
TEST(ParseYamlMessageTest, ReportsEveryWrongFieldInOnePass) {
  Struct msg;
  const absl::Status s = ParseYamlMessage(R"(fields:
  a: {number_value: x}
  b: {string_value: fine}
  c: {bool_value: maybe, numbr_value: 1}
  a: {}
)",
                                          "config", &msg);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(s.message()),
            "fields[a].number_value: expected a number, got 'x' (line 2, column 21)\n"
            "fields[c].bool_value: expected true or false, got 'maybe' (line 4, column 19)\n"
            "fields[c].numbr_value: unknown field (did you mean number_value?); expected one of: "
            "null_value, number_value, string_value, bool_value, struct_value, list_value (line "
            "4, column 26)\n"
            "fields[a]: duplicate key (line 5, column 3)");
  EXPECT_EQ(msg.fields().at("b").string_value(), "fine");
  // List items each report too.
  EXPECT_EQ(Error<ListValue>("values:\n  - {number_value: x}\n  - ~\n  - {bool_value: 2}\n"),
            "values[0].number_value: expected a number, got 'x' (line 2, column 20)\n"
            "values[1]: expected a value, got nothing (line 3, column 5)\n"
            "values[2].bool_value: expected true or false, got '2' (line 4, column 18)");
}

// A document with a thousand wrong fields is answered with the first kMaxFieldErrors and a count.
TEST(ParseYamlMessageTest, ListsAtMostTheLimitOfErrors) {
  std::string yaml = "fields:\n";
  for (int i = 0; i < 1000; ++i) absl::StrAppend(&yaml, "  k", i, ": 1\n");
  const std::string message = Error<Struct>(yaml);
  EXPECT_EQ(std::count(message.begin(), message.end(), '\n'), kMaxFieldErrors);
  EXPECT_THAT(message, HasSubstr(absl::StrCat("\nand ", 1000 - kMaxFieldErrors, " more errors")));
}

// Where each field is written, for the errors that validation finds later: the line of the key
// (of the item in a list), also when the document has errors.
TEST(ParseYamlMessageTest, RecordsTheLineOfEveryField) {
  v1::JobSpec spec;
  FieldLines lines;
  const absl::Status s = ParseYamlMessage(R"(# a comment
name: a
model:
  n_layer: 2

  n_head: four
pipeline:
  cuts:
    - 1
    - 3
)",
                                          "job spec", &spec, &lines);
  EXPECT_THAT(std::string(s.message()), StartsWith("model.n_head: expected an integer"));
  EXPECT_EQ(lines, (FieldLines{{"name", 2},
                               {"model", 3},
                               {"model.n_layer", 4},
                               {"model.n_head", 6},
                               {"pipeline", 7},
                               {"pipeline.cuts", 8},
                               {"pipeline.cuts[0]", 9},
                               {"pipeline.cuts[1]", 10}}));
}

TEST(FillDefaultsTest, SetsDeclaredDefaultsAndKeepsExplicitValues) {
  v1::JobSpec spec;
  spec.mutable_model()->set_n_layer(7);
  FillDefaults(&spec);
  EXPECT_EQ(spec.model().n_layer(), 7);
  ASSERT_TRUE(spec.model().has_tie_embeddings());
  EXPECT_TRUE(spec.model().tie_embeddings());
  // Every field with presence is now set, recursively.
  ASSERT_TRUE(spec.has_optimizer());
  EXPECT_TRUE(spec.optimizer().has_lr());
  EXPECT_TRUE(spec.has_steps());
}

TEST(FillDefaultsTest, LeavesOneofsAndMapValuesAlone) {
  Value v;
  FillDefaults(&v);
  EXPECT_EQ(v.kind_case(), Value::KIND_NOT_SET);
  Struct s;
  (*s.mutable_fields())["a"];  // an empty Value
  FillDefaults(&s);
  EXPECT_EQ(s.fields().at("a").kind_case(), Value::KIND_NOT_SET);
}

}  // namespace
}  // namespace tandem
