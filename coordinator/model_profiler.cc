#include "coordinator/model_profiler.h"

#include <atomic>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/pipeline_plan.h"
#include "spdlog/spdlog.h"

namespace tandem::coordinator {

absl::StatusOr<v1::ModelProfile> MeasureProfile(const v1::JobSpec& spec, const WorkerRecord& worker,
                                                StageWorkerClient& client, absl::Duration timeout,
                                                ProfileStore* store) {
  v1::ProfileLayersRequest req;
  *req.mutable_spec() = spec;
  for (int g : LayersToProfile(spec.model())) req.add_layers(g);
  const auto t0 = std::chrono::steady_clock::now();
  absl::StatusOr<v1::ProfileLayersResponse> resp = client.ProfileLayers(req, timeout);
  if (!resp.ok()) {
    return absl::Status(resp.status().code(),
                        absl::StrCat("profiling on worker ", worker.id, " at ", worker.address,
                                     ": ", resp.status().message()));
  }
  absl::StatusOr<v1::ModelProfile> profile =
      ExpandProfile(spec.model(), {resp->layers().begin(), resp->layers().end()});
  if (!profile.ok()) return profile.status();
  profile->set_key(ProfileKey(spec, DeviceKind(worker.device), worker.threads));
  profile->set_device(DeviceKind(worker.device));
  profile->set_threads(worker.threads);
  profile->set_created_unix_ms(UnixMicros() / 1000);
  spdlog::info("profiled {} layer kinds on {} in {:.2f} s ({})", resp->layers_size(), worker.id,
               std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
               profile->key());
  if (store != nullptr) {
    if (absl::Status s = store->Put(*profile); !s.ok()) {
      spdlog::warn("profile not persisted: {}", s.ToString());
    }
  }
  return profile;
}

absl::StatusOr<v1::ModelProfile> ProfileModel(const v1::JobSpec& spec, WorkerRegistry& registry,
                                              StageWorkerClientFactory& clients,
                                              ProfileStore& store, absl::Duration timeout,
                                              bool refresh) {
  const std::string kind = DeviceKind(spec.device());
  bool any = false;
  for (const WorkerRecord& w : registry.List()) {
    if (DeviceKind(w.device) != kind || w.state == v1::LOST) continue;
    any = true;
    if (refresh) continue;
    if (auto cached = store.Find(ProfileKey(spec, kind, w.threads)); cached.has_value()) {
      return *cached;
    }
  }
  if (!any) {
    return absl::FailedPreconditionError(
        absl::StrCat("no ", kind, " worker is registered to profile the model on"));
  }
  static std::atomic<int> counter{0};
  const std::string holder = absl::StrCat("profile-", ++counter);
  absl::StatusOr<std::vector<WorkerRecord>> held = registry.Allocate(kind, 1, holder);
  if (!held.ok()) {
    return absl::UnavailableError(absl::StrCat("no idle ", kind,
                                               " worker to profile the model on (",
                                               held.status().message(), "); try again later"));
  }
  const WorkerRecord w = (*held)[0];
  std::unique_ptr<StageWorkerClient> client = clients.Connect(w.address);
  absl::StatusOr<v1::ModelProfile> profile = MeasureProfile(spec, w, *client, timeout, &store);
  registry.Release(holder);
  return profile;
}

}  // namespace tandem::coordinator
