#include "worker/device_name.h"

#include <cblas.h>

#include <fstream>
#include <initializer_list>
#include <sstream>
#include <vector>

#include "absl/algorithm/container.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace tandem::worker {
namespace {

// The value of the first "key : value" line whose key is `key` (case-insensitive), blanks
// collapsed; empty when there is none.
std::string Field(absl::string_view cpuinfo, absl::string_view key) {
  for (absl::string_view line : absl::StrSplit(cpuinfo, '\n')) {
    const size_t colon = line.find(':');
    if (colon == absl::string_view::npos) continue;
    if (!absl::EqualsIgnoreCase(absl::StripAsciiWhitespace(line.substr(0, colon)), key)) continue;
    std::string value(absl::StripAsciiWhitespace(line.substr(colon + 1)));
    absl::RemoveExtraAsciiWhitespace(&value);
    if (!value.empty()) return value;
  }
  return "";
}

std::string CpuInfo() {
  std::ifstream in("/proc/cpuinfo");
  std::stringstream text;
  if (in) text << in.rdbuf();
  return text.str();
}

std::string BlasCore() {
  const char* core = openblas_get_corename();
  return core != nullptr ? std::string(absl::StripAsciiWhitespace(core)) : "unknown";
}

}  // namespace

std::string CpuModelName(absl::string_view cpuinfo) {
  if (std::string name = Field(cpuinfo, "model name"); !name.empty()) return name;
  if (std::string name = Field(cpuinfo, "Hardware"); !name.empty()) return name;
  const std::string implementer = Field(cpuinfo, "CPU implementer");
  const std::string part = Field(cpuinfo, "CPU part");
  if (!implementer.empty() && !part.empty()) {
    return absl::StrCat("CPU implementer ", implementer, " part ", part);
  }
  return "unknown processor";
}

std::string RegisteredDeviceName(absl::string_view name) {
  std::string out(name);
  for (char& c : out) {
    if (absl::ascii_iscntrl(static_cast<unsigned char>(c))) c = ' ';
  }
  absl::RemoveExtraAsciiWhitespace(&out);
  if (out.size() > kMaxDeviceNameBytes) out.resize(kMaxDeviceNameBytes);
  return out;
}

std::string CpuDeviceName() {
  return RegisteredDeviceName(absl::StrCat(CpuModelName(CpuInfo()), " / OpenBLAS ", BlasCore()));
}

std::string BlasCoreAdvice(absl::string_view cpuinfo, absl::string_view core) {
  const std::string flag_text = Field(cpuinfo, "flags");
  if (flag_text.empty()) return "";
  const std::vector<absl::string_view> flags = absl::StrSplit(flag_text, ' ', absl::SkipEmpty());
  const auto has = [&](std::initializer_list<absl::string_view> all) {
    return absl::c_all_of(all,
                          [&](absl::string_view f) { return absl::c_linear_search(flags, f); });
  };
  const std::string kernels = absl::AsciiStrToLower(core);
  // OpenBLAS's AVX-512 SGEMM kernels, and those of AVX2 and FMA (or better).
  const std::vector<absl::string_view> avx512 = {"skylakex", "cooperlake", "sapphirerapids"};
  const std::vector<absl::string_view> avx2 = {
      "haswell", "zen", "skylakex", "cooperlake", "sapphirerapids", "excavator"};
  std::string want, what;
  if (has({"avx512f", "avx512bw", "avx512dq", "avx512vl"}) &&
      !absl::c_linear_search(avx512, kernels)) {
    want = "SkylakeX";
    what = "AVX-512";
  } else if (has({"avx2", "fma"}) && !absl::c_linear_search(avx2, kernels)) {
    want = "Haswell";
    what = "AVX2";
  } else {
    return "";
  }
  return absl::StrCat("OpenBLAS runs its ", core, " GEMM kernels on a processor with ", what, " (",
                      CpuModelName(cpuinfo),
                      "): it did not recognise the model. OPENBLAS_CORETYPE=", want,
                      " in tandem-worker's environment selects its ", what,
                      " kernels, several times faster; the layer profiles of the two are kept "
                      "apart (the core is part of the worker's device name)");
}

std::string BlasCoreAdvice() { return BlasCoreAdvice(CpuInfo(), BlasCore()); }

}  // namespace tandem::worker
