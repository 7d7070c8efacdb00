#include "coordinator/transport_choice.h"

#include <optional>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/spec.h"

namespace tandem::coordinator {
namespace {

// The first two workers of `gang` that share a device, in rank order.
std::optional<std::pair<const WorkerRecord*, const WorkerRecord*>> FirstSharedPair(
    const std::vector<WorkerRecord>& gang) {
  for (size_t i = 0; i < gang.size(); ++i) {
    for (size_t j = i + 1; j < gang.size(); ++j) {
      if (ShareDevice(gang[i], gang[j])) return std::make_pair(&gang[i], &gang[j]);
    }
  }
  return std::nullopt;
}

// "GPU-... (cuda:0 on host h)", or "cuda:0 on host h" without a uuid.
std::string DeviceName(const WorkerRecord& w) {
  const std::string where = absl::StrCat(w.device, " on host ", w.hostname);
  if (w.device_uuid.empty()) return where;
  return absl::StrCat(w.device_uuid, " (", where, ")");
}

}  // namespace

bool ShareDevice(const WorkerRecord& a, const WorkerRecord& b) {
  if (DeviceKind(a.device) != "cuda" || DeviceKind(b.device) != "cuda") return false;
  if (!a.device_uuid.empty() && !b.device_uuid.empty()) return a.device_uuid == b.device_uuid;
  return !a.hostname.empty() && a.hostname == b.hostname && a.device == b.device;
}

absl::StatusOr<std::string> ChooseTransport(const v1::JobSpec& spec,
                                            const std::vector<WorkerRecord>& gang) {
  const std::string& asked = spec.pipeline().transport();
  if (asked != "auto" && asked != "nccl" && asked != "gloo") {
    return absl::InvalidArgumentError(absl::StrCat(
        "pipeline.transport: expected \"auto\" or \"nccl\" or \"gloo\", got \"", asked, "\""));
  }
  if (spec.device() != "cuda" || asked == "gloo") return std::string("gloo");
  const auto shared = FirstSharedPair(gang);
  if (!shared.has_value()) return std::string("nccl");
  if (asked == "auto") return std::string("gloo");
  const auto [a, b] = *shared;
  return absl::FailedPreconditionError(absl::StrCat(
      "pipeline.transport: nccl: workers ", a->id, " and ", b->id, " share ", DeviceName(*a),
      "; NCCL cannot put two ranks on one device: use pipeline.transport: gloo or "
      "auto"));
}

}  // namespace tandem::coordinator
