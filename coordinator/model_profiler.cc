#include "coordinator/model_profiler.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "common/link_model.h"
#include "common/pipeline_plan.h"
#include "common/spec.h"
#include "common/status_macros.h"
#include "coordinator/transport_choice.h"
#include "spdlog/spdlog.h"

namespace tandem::coordinator {
namespace {

constexpr int64_t kSmallMessageBytes = 4096;
constexpr int64_t kMaxProbeBytes = int64_t{1} << 30;  // what a worker accepts per message
// The calls' deadline beyond the probe's own timeout: the workers answer DEADLINE_EXCEEDED
// themselves, shortly after it.
constexpr absl::Duration kProbeCallSlack = absl::Seconds(10);

std::string Named(const WorkerRecord& w) {
  return absl::StrCat("worker ", w.id, " at ", w.address);
}

}  // namespace

int64_t AllReduceProbeBytes(const v1::ModelProfile& profile) {
  int64_t parameters = 0;
  for (const v1::LayerProfile& l : profile.layers()) parameters += l.parameter_count();
  return std::clamp<int64_t>(parameters * 4, kSmallMessageBytes, kMaxAllReduceProbeBytes);
}

std::vector<int64_t> LinkProbeSizes(const v1::ModelProfile& profile) {
  int64_t activation = profile.layers_size() > 0 ? profile.layers(0).output_bytes() : 0;
  if (activation <= 0) activation = kSmallMessageBytes;
  activation = std::min(activation, kMaxProbeBytes);
  return {kSmallMessageBytes, activation, std::min(4 * activation, kMaxProbeBytes)};
}

absl::StatusOr<v1::LinkProfile> MeasureLink(const WorkerRecord& a, StageWorkerClient& a_client,
                                            const WorkerRecord& b, StageWorkerClient& b_client,
                                            const std::vector<int64_t>& sizes, int repeats,
                                            const std::string& rendezvous_prefix,
                                            absl::Duration timeout, RendezvousStore* rendezvous,
                                            const std::string& transport, int64_t allreduce_bytes) {
  const WorkerRecord* workers[2] = {&a, &b};
  StageWorkerClient* clients[2] = {&a_client, &b_client};
  v1::ProbeLinkResponse responses[2];
  absl::Status results[2];
  absl::Mutex mu;
  int pending = 2;
  const auto t0 = std::chrono::steady_clock::now();
  // The data plane a job on these two workers would use: NCCL between two cuda workers, Gloo
  // otherwise (a job never mixes device kinds).
  const std::string device =
      DeviceKind(a.device) == "cuda" && DeviceKind(b.device) == "cuda" ? "cuda" : "cpu";
  // Between cuda workers, NCCL or the host-staged transport: as the job resolves it (two
  // workers on one GPU cannot use NCCL).
  std::string cuda_transport;
  if (device == "cuda") {
    cuda_transport = transport == "nccl" || transport == "gloo" ? transport
                     : ShareDevice(a, b)                        ? "gloo"
                                                                : "nccl";
  }
  const char* plane = device != "cuda"           ? "Gloo"
                      : cuda_transport == "gloo" ? "host-staged Gloo"
                                                 : "NCCL";
  // Both at once: each end waits for the other at the rendezvous.
  for (int r = 0; r < 2; ++r) {
    v1::ProbeLinkRequest req;
    req.set_device(device);
    req.set_transport(cuda_transport);
    req.set_rendezvous_prefix(rendezvous_prefix);
    req.set_rank(r);
    for (int64_t bytes : sizes) req.add_sizes(bytes);
    req.set_repeats(repeats);
    req.set_timeout_ms(absl::ToInt64Milliseconds(timeout));
    // The data-parallel ring runs on host buffers: timed between cpu workers.
    if (device == "cpu") req.set_allreduce_bytes(allreduce_bytes);
    clients[r]->ProbeLink(req, &responses[r], timeout + kProbeCallSlack,
                          [&mu, &pending, &results, r](absl::Status s) {
                            absl::MutexLock lock(&mu);
                            results[r] = std::move(s);
                            --pending;
                          });
  }
  {
    absl::MutexLock lock(&mu);
    auto done = [&pending]() { return pending == 0; };
    mu.Await(absl::Condition(&done));
  }
  if (rendezvous != nullptr) rendezvous->ErasePrefix(rendezvous_prefix);
  const std::string link = absl::StrCat("link probe between ", Named(a), " and ", Named(b));
  // The cause, rather than the peer that timed out waiting for it.
  int failed = -1;
  for (int r = 1; r >= 0; --r) {
    if (results[r].ok()) continue;
    if (failed < 0 || results[r].code() != absl::StatusCode::kDeadlineExceeded) failed = r;
  }
  if (failed >= 0) {
    return WithPrefix(results[failed], absl::StrCat(link, ": ", Named(*workers[failed])));
  }
  v1::LinkProfile out;
  out.set_worker_a(a.id);
  out.set_worker_b(b.id);
  for (int r = 0; r < 2; ++r) {
    if (responses[r].samples_size() != static_cast<int>(sizes.size())) {
      return absl::UnknownError(absl::StrCat(link, ": ", Named(*workers[r]), " answered ",
                                             responses[r].samples_size(), " samples for ",
                                             sizes.size(), " sizes"));
    }
    for (const v1::LinkSample& sample : responses[r].samples()) {
      v1::LinkSample* s = out.add_samples();
      *s = sample;
      s->set_rank(r);
    }
  }
  if (absl::Status s = FitLink(&out); !s.ok()) {
    return absl::UnknownError(absl::StrCat(link, ": ", s.message()));
  }
  std::vector<double> runs;
  for (const v1::ProbeLinkResponse& r : responses) {
    runs.insert(runs.end(), r.allreduce_seconds().begin(), r.allreduce_seconds().end());
  }
  if (!runs.empty()) {
    std::sort(runs.begin(), runs.end());
    out.set_allreduce_bytes(allreduce_bytes / 4 * 4);
    out.set_allreduce_seconds(runs[runs.size() / 2]);
  }
  spdlog::info("measured the {} link {} <-> {} in {:.2f} s: {:.1f} us + {:.3f} ns/B{}", plane, a.id,
               b.id, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
               out.latency_seconds() * 1e6, out.seconds_per_byte() * 1e9,
               out.allreduce_bytes() > 0 ? absl::StrCat("; all-reduce of ", out.allreduce_bytes(),
                                                        " B in ", out.allreduce_seconds(), " s")
                                         : std::string());
  return out;
}

absl::StatusOr<v1::ModelProfile> MeasureProfile(const v1::JobSpec& spec, const WorkerRecord& worker,
                                                StageWorkerClient& client, absl::Duration timeout,
                                                ProfileStore* store, const LinkPeer* peer) {
  v1::ProfileLayersRequest req;
  *req.mutable_spec() = spec;
  for (int g : LayersToProfile(spec.model())) req.add_layers(g);
  const auto t0 = std::chrono::steady_clock::now();
  absl::StatusOr<v1::ProfileLayersResponse> resp = client.ProfileLayers(req, timeout);
  RETURN_IF_ERROR(WithPrefix(
      resp.status(), absl::StrCat("profiling on worker ", worker.id, " at ", worker.address)));
  ASSIGN_OR_RETURN(v1::ModelProfile profile,
                   ExpandProfile(spec.model(), {resp->layers().begin(), resp->layers().end()}));
  profile.set_key(ProfileKey(spec, DeviceKind(worker.device), worker.threads));
  profile.set_device(DeviceKind(worker.device));
  profile.set_threads(worker.threads);
  profile.set_created_unix_ms(UnixMicros() / 1000);
  spdlog::info("profiled {} layer kinds on {} in {:.2f} s ({})", resp->layers_size(), worker.id,
               std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
               profile.key());
  if (peer != nullptr && peer->worker != nullptr && peer->client != nullptr) {
    absl::StatusOr<v1::LinkProfile> link = MeasureLink(
        worker, client, *peer->worker, *peer->client, LinkProbeSizes(profile), kLinkProbeRepeats,
        peer->rendezvous_prefix, std::min(timeout, kLinkProbeTimeout), peer->rendezvous,
        peer->transport, AllReduceProbeBytes(profile));
    if (link.ok()) {
      *profile.mutable_link() = *std::move(link);
    } else {
      spdlog::warn("profile {} has no link: {}", profile.key(), link.status().ToString());
    }
  }
  if (store != nullptr) {
    if (absl::Status s = store->Put(profile); !s.ok()) {
      spdlog::warn("profile not persisted: {}", s.ToString());
    }
  }
  return profile;
}

absl::StatusOr<v1::ModelProfile> ProfileModel(const v1::JobSpec& spec, WorkerRegistry& registry,
                                              StageWorkerClientFactory& clients,
                                              ProfileStore& store, absl::Duration timeout,
                                              bool refresh, RendezvousStore* rendezvous) {
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
  // Two workers when two are idle, so that the link between them is measured too.
  absl::StatusOr<std::vector<WorkerRecord>> held = registry.Allocate(kind, 2, holder);
  if (!held.ok()) held = registry.Allocate(kind, 1, holder);
  if (!held.ok()) {
    return absl::UnavailableError(absl::StrCat("no idle ", kind,
                                               " worker to profile the model on (",
                                               held.status().message(), "); try again later"));
  }
  const WorkerRecord w = (*held)[0];
  std::unique_ptr<StageWorkerClient> client = clients.Connect(w.address);
  std::unique_ptr<StageWorkerClient> peer_client;
  LinkPeer peer;
  if (held->size() >= 2) {
    peer_client = clients.Connect((*held)[1].address);
    peer =
        LinkPeer{&(*held)[1], peer_client.get(), absl::StrCat(holder, "/link-probe/"), rendezvous};
  }
  absl::StatusOr<v1::ModelProfile> profile =
      MeasureProfile(spec, w, *client, timeout, &store, peer_client != nullptr ? &peer : nullptr);
  registry.Release(holder);
  return profile;
}

}  // namespace tandem::coordinator
