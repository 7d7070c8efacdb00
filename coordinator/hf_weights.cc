#include "coordinator/hf_weights.h"

#include <cmath>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/confined_path.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"

namespace tandem::coordinator {
namespace {

constexpr char kField[] = "init.hf_file";
// A real index is tens of kilobytes (one line per tensor); this bounds what is parsed.
constexpr int64_t kMaxIndexBytes = int64_t{64} << 20;

float FromBits(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> OpenFile(const std::string& path) {
  auto file = SafetensorsFile::Open(path);
  RETURN_IF_ERROR(WithPrefix(file.status(), kField));
  return std::move(*file);
}

// The shard index's weight_map: tensor name -> shard file name.
absl::StatusOr<std::map<std::string, std::string>> ReadWeightMap(const std::string& path,
                                                                 const std::string& name) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(kField, ": cannot read ", name));
  in.seekg(0, std::ios::end);
  const int64_t size = static_cast<int64_t>(in.tellg());
  if (size < 0 || size > kMaxIndexBytes) {
    return absl::InvalidArgumentError(absl::StrCat(kField, ": the shard index ", name, " is ", size,
                                                   " bytes; at most ", kMaxIndexBytes));
  }
  in.seekg(0);
  std::string text(static_cast<size_t>(size), '\0');
  in.read(text.data(), size);
  const nlohmann::json index = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (index.is_discarded() || !index.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(kField, ": the shard index ", name, " is not a JSON object"));
  }
  auto map = index.find("weight_map");
  if (map == index.end() || !map->is_object() || map->empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        kField, ": the shard index ", name, " has no \"weight_map\" of tensor names to shards"));
  }
  std::map<std::string, std::string> out;
  for (auto it = map->begin(); it != map->end(); ++it) {
    if (!it->is_string()) {
      return absl::InvalidArgumentError(
          absl::StrCat(kField, ": the shard index ", name, " maps ", it.key(), " to a non-string"));
    }
    const std::string shard = it->get<std::string>();
    // Shards live beside the index: a plain file name, nothing that could lead elsewhere.
    if (shard.empty() || shard == "." || shard == ".." ||
        shard.find_first_of(std::string("/\0", 2)) != std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat(kField, ": the shard index ", name, " maps ", it.key(), " to \"", shard,
                       "\", not a file name in the index's directory"));
    }
    out.emplace(it.key(), shard);
  }
  return out;
}

}  // namespace

float Bf16ToFloat(uint16_t bits) { return FromBits(uint32_t{bits} << 16); }

float F16ToFloat(uint16_t bits) {
  const uint32_t sign = uint32_t{bits & 0x8000u} << 16;
  const uint32_t exponent = (bits >> 10) & 0x1f;
  const uint32_t mantissa = bits & 0x3ff;
  if (exponent == 0) {  // zero or subnormal: mantissa x 2^-24, exact in fp32
    const float magnitude = std::ldexp(static_cast<float>(mantissa), -24);
    return sign != 0 ? -magnitude : magnitude;
  }
  if (exponent == 0x1f) return FromBits(sign | 0x7f800000u | (mantissa << 13));  // inf, NaN
  return FromBits(sign | ((exponent + 127 - 15) << 23) | (mantissa << 13));
}

absl::StatusOr<std::unique_ptr<HfWeights>> HfWeights::Open(const std::string& root,
                                                           const std::string& relative,
                                                           const std::string& root_name) {
  ASSIGN_OR_RETURN(const std::string path, ResolveConfined(root, relative, kField, root_name));
  std::unique_ptr<HfWeights> w(new HfWeights());
  w->name_ = relative;
  if (!absl::EndsWith(relative, ".json")) {
    ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> file, OpenFile(path));
    for (const TensorInfo& t : file->tensors()) w->by_name_[t.name] = file.get();
    w->files_.push_back(std::move(file));
    return w;
  }
  ASSIGN_OR_RETURN(const auto weight_map, ReadWeightMap(path, relative));
  // Shards are named relative to the index, and resolved under the root like it.
  const size_t slash = relative.rfind('/');
  const std::string dir = slash == std::string::npos ? "" : relative.substr(0, slash + 1);
  std::map<std::string, const SafetensorsFile*> shards;
  for (const auto& [tensor, shard] : weight_map) {
    auto it = shards.find(shard);
    if (it == shards.end()) {
      ASSIGN_OR_RETURN(const std::string shard_path,
                       ResolveConfined(root, dir + shard, kField, root_name));
      ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> file, OpenFile(shard_path));
      it = shards.emplace(shard, file.get()).first;
      w->files_.push_back(std::move(file));
    }
    if (it->second->Find(tensor) == nullptr) {
      return absl::DataLossError(absl::StrCat(kField, ": the shard index ", relative, " maps ",
                                              tensor, " to ", shard, ", which has no such tensor"));
    }
    w->by_name_[tensor] = it->second;
  }
  return w;
}

const TensorInfo* HfWeights::Find(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : it->second->Find(name);
}

std::vector<std::string> HfWeights::Names() const {
  std::vector<std::string> names;
  names.reserve(by_name_.size());
  for (const auto& [name, file] : by_name_) names.push_back(name);
  return names;
}

absl::StatusOr<std::vector<float>> HfWeights::ReadF32(const std::string& name) const {
  auto it = by_name_.find(name);
  if (it == by_name_.end()) {
    return absl::NotFoundError(absl::StrCat(kField, ": ", name_, " has no tensor ", name));
  }
  const TensorInfo* info = it->second->Find(name);
  ASSIGN_OR_RETURN(absl::Span<const uint8_t> data, it->second->Data(name));
  const size_t elem = DtypeSize(info->dtype);
  if (info->dtype != "F32" && info->dtype != "BF16" && info->dtype != "F16") {
    return absl::InvalidArgumentError(
        absl::StrCat(kField, ": tensor ", name, " is ", info->dtype, "; F32, BF16 and F16 import"));
  }
  std::vector<float> out(data.size() / elem);
  if (info->dtype == "F32") {
    std::memcpy(out.data(), data.data(), out.size() * sizeof(float));
    return out;
  }
  const bool bf16 = info->dtype == "BF16";
  for (size_t i = 0; i < out.size(); ++i) {
    uint16_t bits;  // little-endian on disk, as on every host Tandem builds for
    std::memcpy(&bits, data.data() + 2 * i, sizeof(bits));
    out[i] = bf16 ? Bf16ToFloat(bits) : F16ToFloat(bits);
  }
  return out;
}

}  // namespace tandem::coordinator
