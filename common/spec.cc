#include "common/spec.h"

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

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/partitioner.h"
#include "common/pipeline_plan.h"
#include "common/schedule.h"
#include "common/schedule_check.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"
#include "google/protobuf/reflection.h"

namespace tandem {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;

// A job spec is a few hundred bytes; anything near this is a mistake (or an attack on the
// coordinator's memory), not a spec.
constexpr size_t kMaxSpecBytes = 1 << 20;

// At most this many (stage, micro-batch) pairs in one step's program (stages x chunks x
// micro-batches): 64 stages of 4096 micro-batches, far beyond any real pipeline, and a program
// the coordinator builds, validates and simulates in well under a second.
constexpr int64_t kMaxScheduleSlots = int64_t{1} << 18;

// ---------------------------------------------------------------------------------------------
// YAML -> JobSpec, generically through the descriptor.

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

std::string Where(const YAML::Node& node) {
  const YAML::Mark mark = node.Mark();
  if (mark.is_null()) return "";
  return absl::StrCat(" (line ", mark.line + 1, ", column ", mark.column + 1, ")");
}

absl::Status ErrorAt(absl::string_view path, const YAML::Node& node, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", what, Where(node)));
}

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

template <typename T>
absl::StatusOr<T> ParseInteger(absl::string_view path, const YAML::Node& node) {
  constexpr T kMin = std::numeric_limits<T>::min();
  constexpr T kMax = std::numeric_limits<T>::max();
  const std::string range = absl::StrCat("an integer in [", kMin, ", ", kMax, "]");
  if (!node.IsScalar())
    return ErrorAt(path, node, absl::StrCat("expected ", range, ", got ", Describe(node)));
  // A quoted 64-bit integer is the canonical JSON form of int64 (what `tandem validate -o json`
  // prints), so it is accepted; any other quoted number is a mistake worth naming.
  if (IsQuoted(node) && sizeof(T) < 8) {
    return ErrorAt(path, node,
                   absl::StrCat("expected an integer, got the string ", Describe(node),
                                "; write the number without quotes"));
  }
  const std::string& text = node.Scalar();
  // Parse through the widest type of the same signedness, then check the range, so that
  // "3000000000" for an int32 says "out of range" rather than "not an integer".
  if constexpr (std::is_signed_v<T>) {
    int64_t wide;
    if (absl::SimpleAtoi(text, &wide)) {
      if (wide < kMin || wide > kMax) {
        return ErrorAt(path, node, absl::StrCat("expected ", range, ", got ", Describe(node)));
      }
      return static_cast<T>(wide);
    }
  } else {
    uint64_t wide;
    if (absl::SimpleAtoi(text, &wide)) {
      if (wide > kMax) {
        return ErrorAt(path, node, absl::StrCat("expected ", range, ", got ", Describe(node)));
      }
      return static_cast<T>(wide);
    }
  }
  // Integral values in float notation (1e6, 64.0) are accepted where they are exact.
  double d;
  if (absl::SimpleAtod(text, &d) && std::isfinite(d)) {
    if (d != std::floor(d)) {
      return ErrorAt(
          path, node,
          absl::StrCat("expected an integer, got ", Describe(node), " (not a whole number)"));
    }
    constexpr double kExact = 9007199254740992.0;  // 2^53: beyond it doubles skip integers.
    if (d < static_cast<double>(kMin) || d > static_cast<double>(kMax) || std::fabs(d) > kExact) {
      return ErrorAt(path, node, absl::StrCat("expected ", range, ", got ", Describe(node)));
    }
    return static_cast<T>(d);
  }
  if (!text.empty() && text[0] == '-' && !std::is_signed_v<T>) {
    return ErrorAt(path, node, absl::StrCat("expected ", range, ", got ", Describe(node)));
  }
  return ErrorAt(path, node, absl::StrCat("expected an integer, got ", Describe(node)));
}

absl::StatusOr<double> ParseDouble(absl::string_view path, const YAML::Node& node) {
  if (!node.IsScalar() || IsQuoted(node)) {
    return ErrorAt(path, node,
                   absl::StrCat("expected a number, got ", IsQuoted(node) ? "the string " : "",
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
    return ErrorAt(path, node, absl::StrCat("expected a number, got ", Describe(node)));
  }
  return d;
}

absl::StatusOr<bool> ParseBool(absl::string_view path, const YAML::Node& node) {
  if (node.IsScalar() && !IsQuoted(node)) {
    const std::string& t = node.Scalar();
    if (t == "true" || t == "True" || t == "TRUE") return true;
    if (t == "false" || t == "False" || t == "FALSE") return false;
  }
  return ErrorAt(path, node, absl::StrCat("expected true or false, got ", Describe(node)));
}

absl::Status ParseMessage(const YAML::Node& node, const std::string& path, Message* msg);

// Sets (singular) or appends (repeated) one non-null value of `field`.
absl::Status StoreValue(const YAML::Node& node, const std::string& path, const FieldDescriptor* f,
                        Message* msg) {
  const Reflection* r = msg->GetReflection();
  const bool rep = f->is_repeated();
  switch (f->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32: {
      absl::StatusOr<int32_t> v = ParseInteger<int32_t>(path, node);
      if (!v.ok()) return v.status();
      rep ? r->AddInt32(msg, f, *v) : r->SetInt32(msg, f, *v);
      return absl::OkStatus();
    }
    case FieldDescriptor::CPPTYPE_INT64: {
      absl::StatusOr<int64_t> v = ParseInteger<int64_t>(path, node);
      if (!v.ok()) return v.status();
      rep ? r->AddInt64(msg, f, *v) : r->SetInt64(msg, f, *v);
      return absl::OkStatus();
    }
    case FieldDescriptor::CPPTYPE_UINT32: {
      absl::StatusOr<uint32_t> v = ParseInteger<uint32_t>(path, node);
      if (!v.ok()) return v.status();
      rep ? r->AddUInt32(msg, f, *v) : r->SetUInt32(msg, f, *v);
      return absl::OkStatus();
    }
    case FieldDescriptor::CPPTYPE_UINT64: {
      absl::StatusOr<uint64_t> v = ParseInteger<uint64_t>(path, node);
      if (!v.ok()) return v.status();
      rep ? r->AddUInt64(msg, f, *v) : r->SetUInt64(msg, f, *v);
      return absl::OkStatus();
    }
    case FieldDescriptor::CPPTYPE_DOUBLE: {
      absl::StatusOr<double> v = ParseDouble(path, node);
      if (!v.ok()) return v.status();
      rep ? r->AddDouble(msg, f, *v) : r->SetDouble(msg, f, *v);
      return absl::OkStatus();
    }
    case FieldDescriptor::CPPTYPE_FLOAT: {
      absl::StatusOr<double> v = ParseDouble(path, node);
      if (!v.ok()) return v.status();
      if (std::isfinite(*v) && std::fabs(*v) > FLT_MAX) {
        return ErrorAt(path, node,
                       absl::StrCat("expected a number within single-precision range (about "
                                    "3.4e38), got ",
                                    Describe(node)));
      }
      const float fv = static_cast<float>(*v);
      rep ? r->AddFloat(msg, f, fv) : r->SetFloat(msg, f, fv);
      return absl::OkStatus();
    }
    case FieldDescriptor::CPPTYPE_BOOL: {
      absl::StatusOr<bool> v = ParseBool(path, node);
      if (!v.ok()) return v.status();
      rep ? r->AddBool(msg, f, *v) : r->SetBool(msg, f, *v);
      return absl::OkStatus();
    }
    case FieldDescriptor::CPPTYPE_STRING: {
      if (!node.IsScalar()) {
        return ErrorAt(path, node, absl::StrCat("expected a string, got ", Describe(node)));
      }
      rep ? r->AddString(msg, f, node.Scalar()) : r->SetString(msg, f, node.Scalar());
      return absl::OkStatus();
    }
    case FieldDescriptor::CPPTYPE_ENUM: {
      const auto* value =
          node.IsScalar() ? f->enum_type()->FindValueByName(node.Scalar()) : nullptr;
      if (value == nullptr) {
        std::vector<std::string> names;
        for (int i = 0; i < f->enum_type()->value_count(); ++i) {
          names.push_back(f->enum_type()->value(i)->name());
        }
        return ErrorAt(
            path, node,
            absl::StrCat("expected one of ", absl::StrJoin(names, ", "), ", got ", Describe(node)));
      }
      rep ? r->AddEnum(msg, f, value) : r->SetEnum(msg, f, value);
      return absl::OkStatus();
    }
    case FieldDescriptor::CPPTYPE_MESSAGE: {
      Message* child = rep ? r->AddMessage(msg, f) : r->MutableMessage(msg, f);
      return ParseMessage(node, path, child);
    }
  }
  return ErrorAt(path, node, "field type not supported in job specs");
}

// A proto map field written as a YAML map: each key and value converted by the entry's
// key and value field types.
absl::Status StoreMap(const YAML::Node& node, const std::string& path, const FieldDescriptor* f,
                      Message* msg) {
  if (!node.IsMap()) {
    return ErrorAt(path, node, absl::StrCat("expected a map, got ", Describe(node)));
  }
  const Descriptor* entry_type = f->message_type();
  const FieldDescriptor* key_field = entry_type->map_key();
  const FieldDescriptor* value_field = entry_type->map_value();
  std::set<std::string> seen;
  for (const auto& kv : node) {
    const std::string key_path =
        absl::StrCat(path, "[", kv.first.IsScalar() ? kv.first.Scalar() : "?", "]");
    if (kv.first.IsScalar() && !seen.insert(kv.first.Scalar()).second) {
      return ErrorAt(key_path, kv.first, "duplicate key");
    }
    Message* entry = msg->GetReflection()->AddMessage(msg, f);
    if (absl::Status s = StoreValue(kv.first, key_path, key_field, entry); !s.ok()) return s;
    if (kv.second.IsNull()) return ErrorAt(key_path, kv.second, "expected a value, got nothing");
    if (absl::Status s = StoreValue(kv.second, key_path, value_field, entry); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status ParseField(const YAML::Node& node, const std::string& path, const FieldDescriptor* f,
                        Message* msg) {
  if (node.IsNull()) return absl::OkStatus();  // `key:` or `key: ~` leaves the field unset
  if (f->is_map()) return StoreMap(node, path, f, msg);
  if (!f->is_repeated()) return StoreValue(node, path, f, msg);
  if (!node.IsSequence()) {
    return ErrorAt(path, node, absl::StrCat("expected a list, got ", Describe(node)));
  }
  for (size_t i = 0; i < node.size(); ++i) {
    const std::string item_path = absl::StrCat(path, "[", i, "]");
    if (node[i].IsNull()) return ErrorAt(item_path, node[i], "expected a value, got nothing");
    if (absl::Status s = StoreValue(node[i], item_path, f, msg); !s.ok()) return s;
  }
  return absl::OkStatus();
}

// `path` is the path of `node` itself ("" for the document root).
absl::Status ParseMessage(const YAML::Node& node, const std::string& path, Message* msg) {
  const Descriptor* d = msg->GetDescriptor();
  if (!node.IsMap()) {
    return ErrorAt(
        path.empty() ? "job spec" : path, node,
        absl::StrCat("expected a map with fields ", FieldNames(d), "; got ", Describe(node)));
  }
  std::set<std::string> seen;
  for (const auto& kv : node) {
    const YAML::Node& key = kv.first;
    if (!key.IsScalar()) {
      return ErrorAt(path.empty() ? "job spec" : path, key,
                     absl::StrCat("keys must be field names, got ", Describe(key)));
    }
    const std::string& name = key.Scalar();
    const std::string field_path = path.empty() ? name : absl::StrCat(path, ".", name);
    // yaml-cpp keeps both pairs of a repeated key, so duplicates are visible here.
    if (!seen.insert(name).second) {
      return ErrorAt(field_path, key, "duplicate key; each field may appear once");
    }
    const FieldDescriptor* f = d->FindFieldByName(name);
    if (f == nullptr) {
      std::string hint;
      if (std::string closest = ClosestField(d, name); !closest.empty()) {
        hint = absl::StrCat(" (did you mean ", closest, "?)");
      }
      return ErrorAt(field_path, key,
                     absl::StrCat("unknown field", hint, "; expected one of: ", FieldNames(d)));
    }
    if (const auto* oneof = f->real_containing_oneof(); oneof != nullptr && !kv.second.IsNull()) {
      const FieldDescriptor* set = msg->GetReflection()->GetOneofFieldDescriptor(*msg, oneof);
      if (set != nullptr) {
        return ErrorAt(field_path, key,
                       absl::StrCat("conflicts with ", set->name(), ": set only one of the ",
                                    oneof->name(), " fields"));
      }
    }
    if (absl::Status s = ParseField(kv.second, field_path, f, msg); !s.ok()) return s;
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------
// Defaults.

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

// ---------------------------------------------------------------------------------------------
// Semantic validation. Each check names the field path first.

// Sets the model fields that a named preset defines and the spec leaves unset. An unknown
// preset is left for ValidateModel to reject.
void ApplyModelPreset(v1::ModelSpec* m) {
  struct Shape {
    const char* name;
    int n_layer, n_head, d_model, seq_len, vocab_size;
  };
  static constexpr Shape kPresets[] = {
      {"gpt2", 12, 12, 768, 1024, 50304},  // GPT-2 124M; vocab 50257 padded to 50304
      {"gpt2-tiny", 2, 2, 64, 32, 256},    // for tests and demos on bytes
  };
  for (const Shape& p : kPresets) {
    if (m->preset() != p.name) continue;
    if (!m->has_arch()) m->set_arch("gpt");
    if (!m->has_n_layer()) m->set_n_layer(p.n_layer);
    if (!m->has_n_head()) m->set_n_head(p.n_head);
    if (!m->has_d_model()) m->set_d_model(p.d_model);
    if (!m->has_seq_len()) m->set_seq_len(p.seq_len);
    if (!m->has_vocab_size()) m->set_vocab_size(p.vocab_size);
  }
}

absl::Status Invalid(absl::string_view path, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", what));
}

absl::Status CheckRange(absl::string_view path, int64_t v, int64_t lo, int64_t hi) {
  if (v >= lo && v <= hi) return absl::OkStatus();
  return Invalid(path, absl::StrCat("must be in [", lo, ", ", hi, "], got ", v));
}

absl::Status CheckOneOf(absl::string_view path, const std::string& v,
                        const std::vector<absl::string_view>& allowed) {
  if (std::find(allowed.begin(), allowed.end(), v) != allowed.end()) return absl::OkStatus();
  std::vector<std::string> quoted;
  for (absl::string_view a : allowed) quoted.push_back(absl::StrCat("\"", a, "\""));
  return Invalid(path,
                 absl::StrCat("expected ", absl::StrJoin(quoted, " or "), ", got \"", v, "\""));
}

// What a worker builds at most (worker/model/gpt.cc and mlp_lm.cc refuse more): no weight
// matrix over 2^31 - 1 elements, no model over 2^32 parameters (16 GiB of fp32 weights, 64 GiB
// with gradients and AdamW state). Checked here so that such a job is refused at submit,
// naming the fields, instead of failing on every worker at configure.
constexpr double kMaxTensorElements = 2147483647.0;
constexpr double kMaxModelParameters = 4294967296.0;

absl::Status CheckModelSize(const v1::ModelSpec& m) {
  const double d = m.d_model();
  const double h = m.d_hidden() == 0 ? 4.0 * d : m.d_hidden();
  const double v = m.vocab_size();
  struct Matrix {
    const char* what;
    double rows, cols;
  };
  std::vector<Matrix> matrices = {{"model.vocab_size x model.d_model (the token embedding)", v, d},
                                  {"model.d_hidden x model.d_model (a block's MLP)", h, d}};
  if (m.arch() == "gpt") {
    matrices.push_back({"model.seq_len x model.d_model (the position embedding)",
                        static_cast<double>(m.seq_len()), d});
    matrices.push_back({"3 model.d_model x model.d_model (a block's attention)", 3 * d, d});
  } else {
    matrices.push_back({"model.d_model x model.context x model.d_embed (the input projection)", d,
                        static_cast<double>(m.context()) * m.d_embed()});
  }
  for (const Matrix& x : matrices) {
    if (x.rows * x.cols > kMaxTensorElements) {
      return Invalid("model",
                     absl::StrCat("too large: ", x.what, " is ", x.rows * x.cols,
                                  " elements; a worker holds at most ",
                                  static_cast<int64_t>(kMaxTensorElements), " per weight matrix"));
    }
  }
  double total = 0;
  for (int64_t n : LayerParameterCounts(m)) total += static_cast<double>(n);
  if (total > kMaxModelParameters) {
    return Invalid("model", absl::StrCat("too large: ", total, " parameters (model.n_layer = ",
                                         m.n_layer(), ", model.d_model = ", m.d_model(),
                                         "); a worker builds at most 4294967296 (2^32)"));
  }
  return absl::OkStatus();
}

bool IsNameChar(char c) { return absl::ascii_isalnum(c) || c == '.' || c == '_' || c == '-'; }

absl::Status ValidateTop(const v1::JobSpec& spec) {
  const std::string& name = spec.name();
  if (name.empty() || name.size() > 63 || !std::all_of(name.begin(), name.end(), IsNameChar)) {
    return Invalid("name", absl::StrCat("must be 1 to 63 characters of A-Z a-z 0-9 . _ -, got \"",
                                        name, "\""));
  }
  if (absl::Status s = CheckRange("steps", spec.steps(), 1, 10'000'000); !s.ok()) return s;
  if (absl::Status s = CheckRange("max_restarts", spec.max_restarts(), 0, 1000); !s.ok()) return s;
  if (absl::Status s = CheckOneOf("device", spec.device(), {"cpu", "cuda"}); !s.ok()) return s;
  if (absl::Status s = CheckOneOf("precision", spec.precision(), {"", "fp32", "bf16"}); !s.ok()) {
    return s;
  }
  if (spec.precision() == "bf16" && spec.device() != "cuda") {
    return Invalid("precision",
                   "bf16 needs device: cuda (the CPU backend computes in fp32; use fp32 or leave "
                   "it empty)");
  }
  if (spec.device() == "cuda") {
    // The CUDA backend (worker/cuda_stage_compute.h) implements these only.
    if (spec.model().arch() != "gpt") {
      return Invalid("model.arch", absl::StrCat("device cuda runs gpt models only, got \"",
                                                spec.model().arch(), "\""));
    }
    if (absl::AsciiStrToLower(spec.optimizer().name()) != "adamw") {
      return Invalid("optimizer.name", absl::StrCat("device cuda supports adamw only, got \"",
                                                    spec.optimizer().name(), "\""));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateModel(const v1::JobSpec& spec) {
  const v1::ModelSpec& m = spec.model();
  if (absl::Status s = CheckOneOf("model.preset", m.preset(), {"", "gpt2", "gpt2-tiny"}); !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckOneOf("model.arch", m.arch(), {"gpt", "mlp_lm"}); !s.ok()) return s;
  if (absl::Status s = CheckRange("model.n_layer", m.n_layer(), 1, 1024); !s.ok()) return s;
  if (absl::Status s = CheckRange("model.d_model", m.d_model(), 1, 65536); !s.ok()) return s;
  if (absl::Status s = CheckRange("model.vocab_size", m.vocab_size(), 2, 1 << 20); !s.ok()) {
    return s;
  }
  if (m.arch() == "gpt") {
    if (absl::Status s = CheckRange("model.n_head", m.n_head(), 1, 1024); !s.ok()) return s;
    if (m.d_model() % m.n_head() != 0) {
      return Invalid("model.n_head", absl::StrCat("must divide model.d_model = ", m.d_model(),
                                                  ", got ", m.n_head()));
    }
    if (absl::Status s = CheckRange("model.seq_len", m.seq_len(), 1, 1 << 16); !s.ok()) return s;
  } else {
    if (absl::Status s = CheckRange("model.d_embed", m.d_embed(), 1, 65536); !s.ok()) return s;
    if (absl::Status s = CheckRange("model.context", m.context(), 1, 4096); !s.ok()) return s;
  }
  // Both architectures read d_hidden (the MLP's inner width).
  if (m.d_hidden() < 0) {
    return Invalid("model.d_hidden",
                   absl::StrCat("must be >= 0 (0 means 4 x d_model), got ", m.d_hidden()));
  }
  if (absl::Status s = CheckRange("model.d_hidden", m.d_hidden(), 0, 4 * 65536); !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckModelSize(m); !s.ok()) return s;
  // Byte data yields tokens 0..255; token files are checked against vocab_size when loaded.
  const bool bytes = spec.data().source() == "synthetic" || spec.data().format() == "bytes";
  if (bytes && m.vocab_size() < 256) {
    return Invalid("model.vocab_size",
                   absl::StrCat("must be at least 256 for byte data (data.format \"bytes\" or "
                                "data.source \"synthetic\" yields one token per byte), got ",
                                m.vocab_size()));
  }
  return absl::OkStatus();
}

// A path the spec names, relative to `root` (how the error names it): not empty, not
// absolute, no '..' component, no NUL; for data files (`pattern`), wildcards only in the last
// component. The side that opens the file resolves it again (realpath) against its root, which
// also refuses symlinks that lead outside.
absl::Status ValidateRelativePath(const std::string& field, const std::string& path,
                                  absl::string_view root, bool pattern) {
  if (path.empty()) {
    return Invalid(field,
                   absl::StrCat("required with data.source \"file\": a file relative to ", root));
  }
  if (path[0] == '/') {
    return Invalid(field, absl::StrCat("must be relative to ", root, ", got \"", path, "\""));
  }
  if (path.find('\0') != std::string::npos) {
    return Invalid(field, "must not contain NUL characters");
  }
  const std::vector<absl::string_view> parts = absl::StrSplit(path, absl::ByAnyChar("/\\"));
  for (size_t i = 0; i < parts.size(); ++i) {
    if (parts[i] == "..") {
      return Invalid(field, absl::StrCat("must stay inside ", root, "; '..' is not allowed, got \"",
                                         path, "\""));
    }
    if (pattern && i + 1 < parts.size() &&
        parts[i].find_first_of("*?") != absl::string_view::npos) {
      return Invalid(field, absl::StrCat("only the last path component may hold the wildcards '*' "
                                         "and '?', got \"",
                                         path, "\""));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateDataPath(const std::string& field, const std::string& path) {
  return ValidateRelativePath(field, path, "the worker's --data-root", /*pattern=*/true);
}

absl::Status ValidateData(const v1::JobSpec& spec) {
  const v1::DataSpec& d = spec.data();
  if (absl::Status s = CheckOneOf("data.source", d.source(), {"synthetic", "file"}); !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckOneOf("data.format", d.format(), {"bytes", "tokens"}); !s.ok()) {
    return s;
  }
  if (!std::isfinite(d.val_fraction()) || d.val_fraction() < 0 || d.val_fraction() > 0.5) {
    return Invalid("data.val_fraction",
                   absl::StrCat("must be in [0, 0.5], got ", d.val_fraction()));
  }
  if (d.source() == "file") {
    if (absl::Status s = ValidateDataPath("data.path", d.path()); !s.ok()) return s;
    if (!d.val_path().empty()) return ValidateDataPath("data.val_path", d.val_path());
    return absl::OkStatus();
  }
  for (const auto& [field, value] :
       {std::pair<const char*, const std::string&>{"data.path", d.path()},
        {"data.val_path", d.val_path()}}) {
    if (!value.empty()) {
      return Invalid(field, absl::StrCat("is set but data.source is \"", d.source(),
                                         "\"; set data.source: file to read it"));
    }
  }
  if (d.format() != "bytes") {
    return Invalid("data.format", "the synthetic source generates bytes; use format: bytes");
  }
  const int64_t min_bytes = TrainingWindow(spec.model());
  if (d.synthetic_bytes() < min_bytes || d.synthetic_bytes() > (int64_t{1} << 30)) {
    return Invalid("data.synthetic_bytes",
                   absl::StrCat("must be in [", min_bytes, ", ", int64_t{1} << 30,
                                "] (at least one training window of the model's context + 1 "
                                "tokens), got ",
                                d.synthetic_bytes()));
  }
  return absl::OkStatus();
}

absl::Status ValidateOptimizer(const v1::JobSpec& spec) {
  const v1::OptimizerSpec& o = spec.optimizer();
  if (absl::Status s = CheckOneOf("optimizer.name", o.name(), {"adamw", "sgd"}); !s.ok()) return s;
  if (!std::isfinite(o.lr()) || o.lr() <= 0 || o.lr() > 10) {
    return Invalid("optimizer.lr",
                   absl::StrCat("must be a finite number in (0, 10], got ", o.lr()));
  }
  if (!(o.beta1() >= 0 && o.beta1() < 1)) {
    return Invalid("optimizer.beta1", absl::StrCat("must be in [0, 1), got ", o.beta1()));
  }
  if (!(o.beta2() >= 0 && o.beta2() < 1)) {
    return Invalid("optimizer.beta2", absl::StrCat("must be in [0, 1), got ", o.beta2()));
  }
  if (!std::isfinite(o.eps()) || o.eps() <= 0) {
    return Invalid("optimizer.eps", absl::StrCat("must be a finite number > 0, got ", o.eps()));
  }
  if (!std::isfinite(o.weight_decay()) || o.weight_decay() < 0) {
    return Invalid("optimizer.weight_decay",
                   absl::StrCat("must be a finite number >= 0, got ", o.weight_decay()));
  }
  if (o.warmup_steps() < 0) {
    return Invalid("optimizer.warmup_steps", absl::StrCat("must be >= 0, got ", o.warmup_steps()));
  }
  if (absl::Status s = CheckOneOf("optimizer.lr_schedule", o.lr_schedule(), {"constant", "cosine"});
      !s.ok()) {
    return s;
  }
  if (!(o.min_lr_ratio() >= 0 && o.min_lr_ratio() <= 1)) {
    return Invalid("optimizer.min_lr_ratio",
                   absl::StrCat("must be in [0, 1], got ", o.min_lr_ratio()));
  }
  if (!std::isfinite(o.grad_clip()) || o.grad_clip() < 0) {
    return Invalid(
        "optimizer.grad_clip",
        absl::StrCat("must be a finite number >= 0 (0 disables clipping), got ", o.grad_clip()));
  }
  return absl::OkStatus();
}

absl::Status ValidateCheckpoint(const v1::JobSpec& spec) {
  const v1::CheckpointSpec& c = spec.checkpoint();
  if (c.every() < 0) {
    return Invalid(
        "checkpoint.every",
        absl::StrCat("must be >= 0 (0 saves after the last step only), got ", c.every()));
  }
  return CheckRange("checkpoint.keep", c.keep(), 1, 1000);
}

// A job id as the coordinator hands them out: "job-" and digits.
bool IsJobId(const std::string& id) {
  return id.size() > 4 && id.size() <= 24 && id.rfind("job-", 0) == 0 &&
         std::all_of(id.begin() + 4, id.end(), absl::ascii_isdigit);
}

absl::Status ValidateInit(const v1::JobSpec& spec) {
  const v1::InitSpec& init = spec.init();
  if (!init.from_job().empty() && !init.hf_file().empty()) {
    return Invalid("init", "set from_job (resume) or hf_file (fine-tune), not both");
  }
  if (!init.from_job().empty() && !IsJobId(init.from_job())) {
    return Invalid("init.from_job", absl::StrCat("must be a job id such as \"job-3\", got \"",
                                                 init.from_job(), "\""));
  }
  if (!init.hf_file().empty()) {
    if (spec.model().arch() != "gpt") {
      return Invalid("init.hf_file", "fine-tuning from a GPT-2 file needs model.arch gpt");
    }
    return ValidateRelativePath("init.hf_file", init.hf_file(),
                                "the coordinator's <data-root>/models", /*pattern=*/false);
  }
  return absl::OkStatus();
}

absl::Status ValidateEval(const v1::JobSpec& spec) {
  const v1::EvalSpec& e = spec.eval();
  if (e.every() < 0) {
    return Invalid("eval.every", absl::StrCat("must be >= 0 (0 never evaluates), got ", e.every()));
  }
  if (absl::Status s = CheckRange("eval.micro_batches", e.micro_batches(), 1, 1 << 16); !s.ok()) {
    return s;
  }
  if (e.every() > 0 && spec.data().source() == "synthetic" && spec.data().val_fraction() == 0) {
    return Invalid("eval.every",
                   "evaluation needs a validation split: set data.val_fraction > 0 or "
                   "data.val_path");
  }
  if (e.every() > 0 && spec.data().source() == "file" && spec.data().val_path().empty() &&
      spec.data().val_fraction() == 0) {
    return Invalid("eval.every",
                   "evaluation needs a validation split: set data.val_path or "
                   "data.val_fraction > 0");
  }
  return absl::OkStatus();
}

absl::Status ValidatePipeline(const v1::JobSpec& spec) {
  const v1::PipelineSpec& p = spec.pipeline();
  if (absl::Status s = CheckRange("pipeline.stages", p.stages(), 1, 4096); !s.ok()) return s;
  if (absl::Status s = CheckRange("pipeline.chunks", p.chunks(), 0, 64); !s.ok()) return s;
  if (absl::Status s = CheckRange("pipeline.micro_batch_size", p.micro_batch_size(), 1, 1 << 20);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckRange("pipeline.micro_batches", p.micro_batches(), 1, 1 << 16);
      !s.ok()) {
    return s;
  }
  if (p.schedule_csv().empty()) {
    const std::vector<std::string> names = ScheduleNames();
    if (absl::Status s = CheckOneOf("pipeline.schedule", absl::AsciiStrToLower(p.schedule()),
                                    {names.begin(), names.end()});
        !s.ok()) {
      return s;
    }
  }
  const int64_t num_layers = int64_t{spec.model().n_layer()} + 2;
  if (p.stages() > num_layers) {
    return Invalid("pipeline.stages",
                   absl::StrCat(p.stages(), " stages but the model has only ", num_layers,
                                " layers (embedding, ", spec.model().n_layer(),
                                " blocks, head); every stage needs at least one layer, so stages "
                                "must be <= model.n_layer + 2 = ",
                                num_layers));
  }
  // Bound the work of building, checking and simulating the step's program (and the
  // coordinator's memory for it) before generating it: a spec may not ask for millions of
  // actions. Chunks 0 counts as 2, the most any schedule picks by itself.
  const int64_t chunks = p.chunks() > 0 ? p.chunks() : 2;
  for (const auto& [field, m] :
       {std::pair<const char*, int64_t>{"pipeline.micro_batches", p.micro_batches()},
        {"eval.micro_batches", spec.eval().every() > 0 ? spec.eval().micro_batches() : 0}}) {
    if (const int64_t slots = p.stages() * chunks * m; slots > kMaxScheduleSlots) {
      return Invalid(field,
                     absl::StrCat("pipeline.stages x chunks x ", m, " micro-batches = ", slots,
                                  " (stage, micro-batch) pairs per step, over the "
                                  "limit of ",
                                  kMaxScheduleSlots));
    }
  }
  // The schedule's own constraints (1f1b: M >= P; interleaved: M a multiple of P; ...) and,
  // for a CSV, the whole program: complete and deadlock-free.
  absl::StatusOr<Schedule> schedule = ScheduleForSpec(spec);
  if (!schedule.ok()) {
    return Invalid(p.schedule_csv().empty() ? "pipeline.schedule" : "pipeline.schedule_csv",
                   schedule.status().message());
  }
  const int num_stages = schedule->placement.num_stages();
  if (num_stages > num_layers) {
    return Invalid(
        "pipeline.stages",
        absl::StrCat(num_stages == p.stages()
                         ? absl::StrCat(num_stages)
                         : absl::StrCat(p.stages(), " workers x ", num_stages / p.stages(),
                                        " chunks = ", num_stages),
                     " stages but the model has only ", num_layers, " layers (embedding, ",
                     spec.model().n_layer(),
                     " blocks, head); every stage needs at least one layer, so stages x chunks "
                     "must be <= model.n_layer + 2 = ",
                     num_layers));
  }
  if (!p.schedule_csv().empty()) {
    if (absl::Status s = ValidateSchedule(LowerWithTransfers(*schedule)); !s.ok()) {
      return Invalid("pipeline.schedule_csv", s.message());
    }
  }
  if (absl::Status s = CheckOneOf("pipeline.partition", p.partition(),
                                  {"uniform", "parameters", "profile", "manual"});
      !s.ok()) {
    return s;
  }
  if (absl::Status s =
          CheckRange("pipeline.memory_budget_mb", p.memory_budget_mb(), 0, int64_t{1} << 30);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckOneOf("pipeline.plan", p.plan(), {"", "auto"}); !s.ok()) return s;
  if (p.plan() == "auto" && !p.schedule_csv().empty()) {
    return Invalid("pipeline.plan",
                   "auto chooses the schedule, so it does not apply with pipeline.schedule_csv");
  }
  if (p.plan() == "auto" && p.partition() == "manual") {
    return Invalid("pipeline.plan",
                   "auto may change the stages per worker, so manual cut points do not carry "
                   "over: use partition: profile");
  }
  if (p.partition() == "manual") {
    absl::StatusOr<std::vector<LayerRange>> ranges = RangesFromCuts(
        {p.cuts().begin(), p.cuts().end()}, static_cast<int>(num_layers), num_stages);
    if (!ranges.ok()) return Invalid("pipeline.cuts", ranges.status().message());
  } else if (p.cuts_size() > 0) {
    return Invalid("pipeline.cuts", "cut points apply to partition: manual only");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<v1::JobSpec> ParseJobSpecYaml(absl::string_view yaml) {
  if (yaml.size() > kMaxSpecBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("job spec: ", yaml.size(), " bytes is over the limit of ", kMaxSpecBytes));
  }
  // YAML allows no C0 control character but tab, line feed and carriage return (nor DEL);
  // refuse them here, naming where, rather than leave them to yaml-cpp.
  int line = 1, column = 1;
  for (const char c : yaml) {
    const unsigned char u = static_cast<unsigned char>(c);
    if ((u < 0x20 && c != '\t' && c != '\n' && c != '\r') || u == 0x7f) {
      return absl::InvalidArgumentError(
          absl::StrCat("job spec: invalid YAML at line ", line, ", column ", column,
                       ": control character 0x", absl::Hex(u, absl::kZeroPad2), " is not allowed"));
    }
    if (c == '\n') {
      ++line;
      column = 1;
    } else {
      ++column;
    }
  }
  auto invalid_yaml = [](const YAML::Exception& e) {
    std::string where;
    if (!e.mark.is_null()) {
      where = absl::StrCat(" at line ", e.mark.line + 1, ", column ", e.mark.column + 1);
    }
    return absl::InvalidArgumentError(absl::StrCat("job spec: invalid YAML", where, ": ", e.msg));
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
        return absl::InvalidArgumentError(absl::StrCat(
            "job spec: invalid YAML at line ", probe.first.line + 1, ", column ",
            probe.first.column + 1, ": unexpected token (a ',' outside a [list] or {map}?)"));
      }
      previous = probe;
      ++num_docs;
    }
  } catch (const YAML::Exception& e) {
    return invalid_yaml(e);
  }
  if (num_docs > 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "job spec: expected one YAML document, got ", num_docs > 64 ? "more than 64" : "",
        num_docs > 64 ? "" : absl::StrCat(num_docs), " (remove the '---' lines)"));
  }
  YAML::Node root;
  try {
    root = YAML::Load(std::string(yaml));
  } catch (const YAML::Exception& e) {
    return invalid_yaml(e);
  }
  if (num_docs == 0 || root.IsNull()) {
    return absl::InvalidArgumentError(
        absl::StrCat("job spec: the document is empty; expected a map with fields ",
                     FieldNames(v1::JobSpec::descriptor())));
  }
  v1::JobSpec spec;
  try {
    if (absl::Status s = ParseMessage(root, "", &spec); !s.ok()) return s;
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("job spec: ", e.msg));
  }
  return spec;
}

v1::JobSpec WithDefaults(const v1::JobSpec& spec) {
  v1::JobSpec out = spec;
  ApplyModelPreset(out.mutable_model());
  FillDefaults(&out);
  return out;
}

absl::Status ValidateJobSpec(const v1::JobSpec& spec) {
  for (auto check : {ValidateTop, ValidateModel, ValidateData, ValidateOptimizer, ValidateEval,
                     ValidateCheckpoint, ValidateInit, ValidatePipeline}) {
    if (absl::Status s = check(spec); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::JobSpec> LoadJobSpecYaml(absl::string_view yaml) {
  absl::StatusOr<v1::JobSpec> parsed = ParseJobSpecYaml(yaml);
  if (!parsed.ok()) return parsed.status();
  v1::JobSpec spec = WithDefaults(*parsed);
  if (absl::Status s = ValidateJobSpec(spec); !s.ok()) return s;
  return spec;
}

int64_t EffectiveBatch(const v1::JobSpec& spec) {
  return int64_t{spec.pipeline().micro_batch_size()} * spec.pipeline().micro_batches();
}

int64_t TokensPerStep(const v1::JobSpec& spec) {
  return EffectiveBatch(spec) * (spec.model().arch() == "gpt" ? spec.model().seq_len() : 1);
}

std::string DeviceKind(const std::string& device) { return device.substr(0, device.find(':')); }

int64_t TrainingWindow(const v1::ModelSpec& m) {
  return (m.arch() == "gpt" ? int64_t{m.seq_len()} : int64_t{m.context()}) + 1;
}

}  // namespace tandem
