#include "common/proto_yaml.h"

#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <limits>
#include <set>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"
#include "google/protobuf/reflection.h"

namespace tandem {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;

// Records where a document's first node starts; builds nothing.
class DocumentProbe final : public YAML::EventHandler {
 public:
  YAML::Mark first = YAML::Mark::null_mark();

  void OnDocumentStart(const YAML::Mark&) override {}
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark& mark, YAML::anchor_t) override { See(mark); }
  void OnAlias(const YAML::Mark& mark, YAML::anchor_t) override { See(mark); }
  void OnScalar(const YAML::Mark& mark, const std::string&, YAML::anchor_t,
                const std::string&) override {
    See(mark);
  }
  void OnSequenceStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t,
                       YAML::EmitterStyle::value) override {
    See(mark);
  }
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t,
                  YAML::EmitterStyle::value) override {
    See(mark);
  }
  void OnMapEnd() override {}

 private:
  void See(const YAML::Mark& mark) {
    if (first.is_null()) first = mark;
  }
};

// How a node reads in an error: its text for a scalar, its kind otherwise.
std::string Describe(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Scalar:
      return absl::StrCat("'", node.Scalar(), "'");
    case YAML::NodeType::Sequence:
      return "a list";
    case YAML::NodeType::Map:
      return "a map";
    default:
      return "nothing";
  }
}

// A quoted scalar ("50") is a string in YAML: it is not silently accepted as a number.
bool IsQuoted(const YAML::Node& node) { return node.Tag() == "!"; }

std::string FieldNames(const Descriptor* d) {
  std::vector<std::string> names;
  names.reserve(d->field_count());
  for (int i = 0; i < d->field_count(); ++i) names.push_back(d->field(i)->name());
  return absl::StrJoin(names, ", ");
}

size_t EditDistance(absl::string_view a, absl::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = up;
    }
  }
  return row[b.size()];
}

// The field name closest to a misspelt key, or "" if none is close.
std::string ClosestField(const Descriptor* d, absl::string_view key) {
  std::string best;
  size_t best_distance = std::max<size_t>(2, key.size() / 3) + 1;
  for (int i = 0; i < d->field_count(); ++i) {
    const std::string& name = d->field(i)->name();
    const size_t distance = EditDistance(absl::AsciiStrToLower(key), name);
    if (distance < best_distance) {
      best_distance = distance;
      best = name;
    }
  }
  return best;
}

// The scalar parsers below fail with INVALID_ARGUMENT whose message says what was wrong with
// the value alone; the walker adds the field's path and the value's place.
absl::Status Wrong(absl::string_view what) { return absl::InvalidArgumentError(what); }

template <typename T>
absl::StatusOr<T> ParseInteger(const YAML::Node& node) {
  constexpr T kMin = std::numeric_limits<T>::min();
  constexpr T kMax = std::numeric_limits<T>::max();
  const std::string range = absl::StrCat("an integer in [", kMin, ", ", kMax, "]");
  if (!node.IsScalar()) return Wrong(absl::StrCat("expected ", range, ", got ", Describe(node)));
  // A quoted 64-bit integer is the canonical JSON form of int64 (what `tandem validate -o json`
  // prints), so it is accepted; any other quoted number is a mistake worth naming.
  if (IsQuoted(node) && sizeof(T) < 8) {
    return Wrong(absl::StrCat("expected an integer, got the string ", Describe(node),
                              "; write the number without quotes"));
  }
  const std::string& text = node.Scalar();
  // Parse through the widest type of the same signedness, then check the range, so that
  // "3000000000" for an int32 says "out of range" rather than "not an integer".
  if constexpr (std::is_signed_v<T>) {
    int64_t wide;
    if (absl::SimpleAtoi(text, &wide)) {
      if (wide < kMin || wide > kMax) {
        return Wrong(absl::StrCat("expected ", range, ", got ", Describe(node)));
      }
      return static_cast<T>(wide);
    }
  } else {
    uint64_t wide;
    if (absl::SimpleAtoi(text, &wide)) {
      if (wide > kMax) return Wrong(absl::StrCat("expected ", range, ", got ", Describe(node)));
      return static_cast<T>(wide);
    }
  }
  // Integral values in float notation (1e6, 64.0) are accepted where they are exact.
  double d;
  if (absl::SimpleAtod(text, &d) && std::isfinite(d)) {
    if (d != std::floor(d)) {
      return Wrong(
          absl::StrCat("expected an integer, got ", Describe(node), " (not a whole number)"));
    }
    constexpr double kExact = 9007199254740992.0;  // 2^53: beyond it doubles skip integers.
    if (d < static_cast<double>(kMin) || d > static_cast<double>(kMax) || std::fabs(d) > kExact) {
      return Wrong(absl::StrCat("expected ", range, ", got ", Describe(node)));
    }
    return static_cast<T>(d);
  }
  if (!text.empty() && text[0] == '-' && !std::is_signed_v<T>) {
    return Wrong(absl::StrCat("expected ", range, ", got ", Describe(node)));
  }
  return Wrong(absl::StrCat("expected an integer, got ", Describe(node)));
}

absl::StatusOr<double> ParseDouble(const YAML::Node& node) {
  if (!node.IsScalar() || IsQuoted(node)) {
    return Wrong(absl::StrCat("expected a number, got ", IsQuoted(node) ? "the string " : "",
                              Describe(node)));
  }
  const std::string text = node.Scalar();
  // YAML spells the special values .inf, -.inf and .nan; validation decides whether a
  // field may hold them.
  const std::string lower = absl::AsciiStrToLower(text);
  if (lower == ".inf" || lower == "+.inf") return std::numeric_limits<double>::infinity();
  if (lower == "-.inf") return -std::numeric_limits<double>::infinity();
  if (lower == ".nan") return std::numeric_limits<double>::quiet_NaN();
  double d;
  if (!absl::SimpleAtod(text, &d)) {
    return Wrong(absl::StrCat("expected a number, got ", Describe(node)));
  }
  return d;
}

absl::StatusOr<bool> ParseBool(const YAML::Node& node) {
  if (node.IsScalar() && !IsQuoted(node)) {
    const std::string& t = node.Scalar();
    if (t == "true" || t == "True" || t == "TRUE") return true;
    if (t == "false" || t == "False" || t == "FALSE") return false;
  }
  return Wrong(absl::StrCat("expected true or false, got ", Describe(node)));
}

// Walks a YAML tree against a message's descriptor, filling the message. Every error goes to
// `errors` and the walk goes on with the next field, list item or map entry, so that one pass
// finds the mistakes of every field; a field whose value is wrong is left unset or partly set.
// The walk visits each node once: its work is bounded by the document's size.
class Walker {
 public:
  Walker(absl::string_view document, FieldErrors* errors, FieldLines* lines)
      : document_(document), errors_(errors), lines_(lines) {}

  // `path` is the path of `node` itself ("" for the document root).
  void ParseMessage(const YAML::Node& node, const std::string& path, Message* msg) {
    const Descriptor* d = msg->GetDescriptor();
    if (!node.IsMap()) {
      Error(path.empty() ? document_ : path, node,
            absl::StrCat("expected a map with fields ", FieldNames(d), "; got ", Describe(node)));
      return;
    }
    std::set<std::string> seen;
    for (const auto& kv : node) {
      const YAML::Node& key = kv.first;
      if (!key.IsScalar()) {
        Error(path.empty() ? document_ : path, key,
              absl::StrCat("keys must be field names, got ", Describe(key)));
        continue;
      }
      const std::string& name = key.Scalar();
      const std::string field_path = path.empty() ? name : absl::StrCat(path, ".", name);
      Written(field_path, key);
      // yaml-cpp keeps both pairs of a repeated key, so duplicates are visible here.
      if (!seen.insert(name).second) {
        Error(field_path, key, "duplicate key; each field may appear once");
        continue;
      }
      const FieldDescriptor* f = d->FindFieldByName(name);
      if (f == nullptr) {
        std::string hint;
        if (std::string closest = ClosestField(d, name); !closest.empty()) {
          hint = absl::StrCat(" (did you mean ", closest, "?)");
        }
        Error(field_path, key,
              absl::StrCat("unknown field", hint, "; expected one of: ", FieldNames(d)));
        continue;
      }
      if (const auto* oneof = f->real_containing_oneof(); oneof != nullptr && !kv.second.IsNull()) {
        const FieldDescriptor* set = msg->GetReflection()->GetOneofFieldDescriptor(*msg, oneof);
        if (set != nullptr) {
          Error(field_path, key,
                absl::StrCat("conflicts with ", set->name(), ": set only one of the ",
                             oneof->name(), " fields"));
          continue;
        }
      }
      ParseField(kv.second, field_path, f, msg);
    }
  }

 private:
  void Error(absl::string_view path, const YAML::Node& node, absl::string_view what) {
    const YAML::Mark mark = node.Mark();
    if (mark.is_null()) {
      errors_->Add(path, what);
    } else {
      errors_->Add(path, what, mark.line + 1, mark.column + 1);
    }
  }

  // Records where `path` is written: the first place, if a key repeats.
  void Written(const std::string& path, const YAML::Node& node) {
    const YAML::Mark mark = node.Mark();
    if (lines_ != nullptr && !mark.is_null()) lines_->emplace(path, mark.line + 1);
  }

  // Records the error of a scalar parser; true if `v` holds a value.
  template <typename T>
  bool Check(const absl::StatusOr<T>& v, const std::string& path, const YAML::Node& node) {
    if (!v.ok()) Error(path, node, v.status().message());
    return v.ok();
  }

  // Sets (singular) or appends (repeated) one non-null value of `field`.
  void StoreValue(const YAML::Node& node, const std::string& path, const FieldDescriptor* f,
                  Message* msg) {
    const Reflection* r = msg->GetReflection();
    const bool rep = f->is_repeated();
    switch (f->cpp_type()) {
      case FieldDescriptor::CPPTYPE_INT32: {
        const absl::StatusOr<int32_t> v = ParseInteger<int32_t>(node);
        if (Check(v, path, node)) rep ? r->AddInt32(msg, f, *v) : r->SetInt32(msg, f, *v);
        return;
      }
      case FieldDescriptor::CPPTYPE_INT64: {
        const absl::StatusOr<int64_t> v = ParseInteger<int64_t>(node);
        if (Check(v, path, node)) rep ? r->AddInt64(msg, f, *v) : r->SetInt64(msg, f, *v);
        return;
      }
      case FieldDescriptor::CPPTYPE_UINT32: {
        const absl::StatusOr<uint32_t> v = ParseInteger<uint32_t>(node);
        if (Check(v, path, node)) rep ? r->AddUInt32(msg, f, *v) : r->SetUInt32(msg, f, *v);
        return;
      }
      case FieldDescriptor::CPPTYPE_UINT64: {
        const absl::StatusOr<uint64_t> v = ParseInteger<uint64_t>(node);
        if (Check(v, path, node)) rep ? r->AddUInt64(msg, f, *v) : r->SetUInt64(msg, f, *v);
        return;
      }
      case FieldDescriptor::CPPTYPE_DOUBLE: {
        const absl::StatusOr<double> v = ParseDouble(node);
        if (Check(v, path, node)) rep ? r->AddDouble(msg, f, *v) : r->SetDouble(msg, f, *v);
        return;
      }
      case FieldDescriptor::CPPTYPE_FLOAT: {
        const absl::StatusOr<double> v = ParseDouble(node);
        if (!Check(v, path, node)) return;
        if (std::isfinite(*v) && std::fabs(*v) > FLT_MAX) {
          Error(path, node,
                absl::StrCat("expected a number within single-precision range (about 3.4e38), "
                             "got ",
                             Describe(node)));
          return;
        }
        const float fv = static_cast<float>(*v);
        rep ? r->AddFloat(msg, f, fv) : r->SetFloat(msg, f, fv);
        return;
      }
      case FieldDescriptor::CPPTYPE_BOOL: {
        const absl::StatusOr<bool> v = ParseBool(node);
        if (Check(v, path, node)) rep ? r->AddBool(msg, f, *v) : r->SetBool(msg, f, *v);
        return;
      }
      case FieldDescriptor::CPPTYPE_STRING: {
        if (!node.IsScalar()) {
          Error(path, node, absl::StrCat("expected a string, got ", Describe(node)));
          return;
        }
        rep ? r->AddString(msg, f, node.Scalar()) : r->SetString(msg, f, node.Scalar());
        return;
      }
      case FieldDescriptor::CPPTYPE_ENUM: {
        const auto* value =
            node.IsScalar() ? f->enum_type()->FindValueByName(node.Scalar()) : nullptr;
        if (value == nullptr) {
          std::vector<std::string> names;
          for (int i = 0; i < f->enum_type()->value_count(); ++i) {
            names.push_back(f->enum_type()->value(i)->name());
          }
          Error(path, node,
                absl::StrCat("expected one of ", absl::StrJoin(names, ", "), ", got ",
                             Describe(node)));
          return;
        }
        rep ? r->AddEnum(msg, f, value) : r->SetEnum(msg, f, value);
        return;
      }
      case FieldDescriptor::CPPTYPE_MESSAGE: {
        Message* child = rep ? r->AddMessage(msg, f) : r->MutableMessage(msg, f);
        ParseMessage(node, path, child);
        return;
      }
    }
    Error(path, node, absl::StrCat("field type not supported in ", document_));
  }

  // A proto map field written as a YAML map: each key and value converted by the entry's
  // key and value field types.
  void StoreMap(const YAML::Node& node, const std::string& path, const FieldDescriptor* f,
                Message* msg) {
    if (!node.IsMap()) {
      Error(path, node, absl::StrCat("expected a map, got ", Describe(node)));
      return;
    }
    const Descriptor* entry_type = f->message_type();
    const FieldDescriptor* key_field = entry_type->map_key();
    const FieldDescriptor* value_field = entry_type->map_value();
    std::set<std::string> seen;
    for (const auto& kv : node) {
      const std::string key_path =
          absl::StrCat(path, "[", kv.first.IsScalar() ? kv.first.Scalar() : "?", "]");
      Written(key_path, kv.first);
      if (kv.first.IsScalar() && !seen.insert(kv.first.Scalar()).second) {
        Error(key_path, kv.first, "duplicate key");
        continue;
      }
      if (kv.second.IsNull()) {
        Error(key_path, kv.second, "expected a value, got nothing");
        continue;
      }
      Message* entry = msg->GetReflection()->AddMessage(msg, f);
      StoreValue(kv.first, key_path, key_field, entry);
      StoreValue(kv.second, key_path, value_field, entry);
    }
  }

  void ParseField(const YAML::Node& node, const std::string& path, const FieldDescriptor* f,
                  Message* msg) {
    if (node.IsNull()) return;  // `key:` or `key: ~` leaves the field unset
    if (f->is_map()) return StoreMap(node, path, f, msg);
    if (!f->is_repeated()) return StoreValue(node, path, f, msg);
    if (!node.IsSequence()) {
      Error(path, node, absl::StrCat("expected a list, got ", Describe(node)));
      return;
    }
    for (size_t i = 0; i < node.size(); ++i) {
      const std::string item_path = absl::StrCat(path, "[", i, "]");
      Written(item_path, node[i]);
      if (node[i].IsNull()) {
        Error(item_path, node[i], "expected a value, got nothing");
        continue;
      }
      StoreValue(node[i], item_path, f, msg);
    }
  }

  const std::string document_;
  FieldErrors* errors_;
  FieldLines* lines_;  // may be null
};

// Finds the errors of the text as a whole (a control character, invalid YAML, not one
// document), each under the document's name; returns the document's root, or a null node.
YAML::Node LoadOneDocument(absl::string_view yaml, absl::string_view document,
                           FieldErrors* errors) {
  // YAML allows no C0 control character but tab, line feed and carriage return (nor DEL);
  // refuse them here, naming where, rather than leave them to yaml-cpp.
  int line = 1, column = 1;
  for (const char c : yaml) {
    const unsigned char u = static_cast<unsigned char>(c);
    if ((u < 0x20 && c != '\t' && c != '\n' && c != '\r') || u == 0x7f) {
      errors->Add(document,
                  absl::StrCat("invalid YAML: control character 0x", absl::Hex(u, absl::kZeroPad2),
                               " is not allowed"),
                  line, column);
      return YAML::Node();
    }
    if (c == '\n') {
      ++line;
      column = 1;
    } else {
      ++column;
    }
  }
  auto invalid_yaml = [&](const YAML::Exception& e) {
    if (e.mark.is_null()) {
      errors->Add(document, absl::StrCat("invalid YAML: ", e.msg));
    } else {
      errors->Add(document, absl::StrCat("invalid YAML: ", e.msg), e.mark.line + 1,
                  e.mark.column + 1);
    }
    return YAML::Node();
  };
  // Count the documents first, without YAML::LoadAll: in yaml-cpp 0.7 it loops forever,
  // allocating, on a token its parser leaves unconsumed (a stray ',': ", b" or "# c\n, b"),
  // because each pass yields another empty document at the same place (jbeder/yaml-cpp#1040,
  // fixed upstream after 0.8; found here by tests/fuzz/spec_fuzz). A document that starts
  // where the previous one did is that loop, and is refused.
  int num_docs = 0;
  try {
    std::istringstream in{std::string(yaml)};
    YAML::Parser parser(in);
    DocumentProbe previous;
    constexpr int kMaxDocuments = 64;
    while (num_docs <= kMaxDocuments) {
      DocumentProbe probe;
      if (!parser.HandleNextDocument(probe)) break;
      if (num_docs > 0 && !probe.first.is_null() && probe.first.pos == previous.first.pos) {
        errors->Add(document, "invalid YAML: unexpected token (a ',' outside a [list] or {map}?)",
                    probe.first.line + 1, probe.first.column + 1);
        return YAML::Node();
      }
      previous = probe;
      ++num_docs;
    }
  } catch (const YAML::Exception& e) {
    return invalid_yaml(e);
  }
  if (num_docs > 1) {
    errors->Add(document, absl::StrCat("expected one YAML document, got ",
                                       num_docs > 64 ? "more than 64" : absl::StrCat(num_docs),
                                       " (remove the '---' lines)"));
    return YAML::Node();
  }
  YAML::Node root;
  try {
    root = YAML::Load(std::string(yaml));
  } catch (const YAML::Exception& e) {
    return invalid_yaml(e);
  }
  return num_docs == 0 ? YAML::Node() : root;
}

}  // namespace

absl::Status ParseYamlMessage(absl::string_view yaml, absl::string_view document, Message* msg,
                              FieldLines* lines) {
  FieldErrors errors;
  const YAML::Node root = LoadOneDocument(yaml, document, &errors);
  if (!errors.empty()) return errors.ToStatus();
  if (root.IsNull()) {
    return absl::InvalidArgumentError(
        absl::StrCat(document, ": the document is empty; expected a map with fields ",
                     FieldNames(msg->GetDescriptor())));
  }
  try {
    Walker(document, &errors, lines).ParseMessage(root, "", msg);
  } catch (const YAML::Exception& e) {
    errors.Add(document, e.msg);
  }
  return errors.ToStatus();
}

void FillDefaults(Message* msg) {
  const Descriptor* d = msg->GetDescriptor();
  const Reflection* r = msg->GetReflection();
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* f = d->field(i);
    if (f->is_repeated()) {
      if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE && !f->is_map()) {
        for (int j = 0; j < r->FieldSize(*msg, f); ++j)
          FillDefaults(r->MutableRepeatedMessage(msg, f, j));
      }
      continue;
    }
    // Setting a member of a oneof would choose it; leave the choice to the user.
    if (f->real_containing_oneof() != nullptr) continue;
    if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
      FillDefaults(r->MutableMessage(msg, f));
      continue;
    }
    if (r->HasField(*msg, f) || !f->has_presence()) continue;
    switch (f->cpp_type()) {
      case FieldDescriptor::CPPTYPE_INT32:
        r->SetInt32(msg, f, f->default_value_int32());
        break;
      case FieldDescriptor::CPPTYPE_INT64:
        r->SetInt64(msg, f, f->default_value_int64());
        break;
      case FieldDescriptor::CPPTYPE_UINT32:
        r->SetUInt32(msg, f, f->default_value_uint32());
        break;
      case FieldDescriptor::CPPTYPE_UINT64:
        r->SetUInt64(msg, f, f->default_value_uint64());
        break;
      case FieldDescriptor::CPPTYPE_DOUBLE:
        r->SetDouble(msg, f, f->default_value_double());
        break;
      case FieldDescriptor::CPPTYPE_FLOAT:
        r->SetFloat(msg, f, f->default_value_float());
        break;
      case FieldDescriptor::CPPTYPE_BOOL:
        r->SetBool(msg, f, f->default_value_bool());
        break;
      case FieldDescriptor::CPPTYPE_STRING:
        r->SetString(msg, f, f->default_value_string());
        break;
      case FieldDescriptor::CPPTYPE_ENUM:
        r->SetEnum(msg, f, f->default_value_enum());
        break;
      case FieldDescriptor::CPPTYPE_MESSAGE:
        break;
    }
  }
}

}  // namespace tandem
