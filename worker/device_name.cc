#include "worker/device_name.h"

#include <cblas.h>

#include <cstdlib>
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

}  // namespace

std::string OpenBlasCoreName() {
  const char* core = openblas_get_corename();
  return core != nullptr ? std::string(absl::StripAsciiWhitespace(core)) : "unknown";
}

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
  return RegisteredDeviceName(
      absl::StrCat(CpuModelName(CpuInfo()), " / OpenBLAS ", OpenBlasCoreName()));
}

std::string BetterBlasCoreType(absl::string_view cpuinfo, absl::string_view core) {
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
  if (has({"avx512f", "avx512bw", "avx512dq", "avx512vl"}) &&
      !absl::c_linear_search(avx512, kernels)) {
    return "SkylakeX";
  }
  if (has({"avx2", "fma"}) && !absl::c_linear_search(avx2, kernels)) return "Haswell";
  return "";
}

std::string BetterBlasCoreType() { return BetterBlasCoreType(CpuInfo(), OpenBlasCoreName()); }

std::string BlasCoreAdvice(absl::string_view cpuinfo, absl::string_view core,
                           const char* env_coretype) {
  const std::string want = BetterBlasCoreType(cpuinfo, core);
  if (want.empty()) return "";
  const char* what = want == "SkylakeX" ? "AVX-512" : "AVX2";
  std::string why = ": it did not recognise the model";
  if (env_coretype != nullptr) {
    why = absl::EqualsIgnoreCase(env_coretype, core)
              ? absl::StrCat(", as OPENBLAS_CORETYPE=", env_coretype, " asks")
              : absl::StrCat(", although OPENBLAS_CORETYPE=", env_coretype,
                             " asks for others (it has none of that name for this processor, "
                             "or was built without DYNAMIC_ARCH)");
  }
  return absl::StrCat("OpenBLAS runs its ", core, " GEMM kernels on a processor with ", what, " (",
                      CpuModelName(cpuinfo), ")", why, ". Its ", what,
                      " kernels run several times faster: OPENBLAS_CORETYPE=", want,
                      env_coretype == nullptr ? " or --blas_core=auto" : "",
                      " selects them; the layer profiles of the two are kept apart (the core is "
                      "part of the worker's device name)");
}

std::string BlasCoreAdvice() {
  return BlasCoreAdvice(CpuInfo(), OpenBlasCoreName(), std::getenv("OPENBLAS_CORETYPE"));
}

}  // namespace tandem::worker
