#include "coordinator/model_profiler.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "common/link_model.h"
#include "common/pipeline_plan.h"
#include "common/spec.h"
#include "common/status_macros.h"
#include "coordinator/profile_speed_check.h"
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

// The answers of one round, and who gave them.
struct RoundAnswers {
  std::vector<std::vector<v1::LayerProfile>> layers;
  std::vector<const ProfiledWorker*> answered;
};

// One round: ProfileLayers on every chosen worker at once. The answers of those that
// answered; the first failure goes to *first_error (and the log).
RoundAnswers ProfileRound(const std::vector<const ProfiledWorker*>& chosen,
                          const v1::ProfileLayersRequest& req, absl::Duration timeout,
                          absl::Status* first_error) {
  const size_t n = chosen.size();
  std::vector<absl::StatusOr<v1::ProfileLayersResponse>> responses(n,
                                                                   absl::UnknownError("not asked"));
  {
    std::vector<std::thread> calls;
    calls.reserve(n);
    const auto call = [&](size_t i) {
      responses[i] = chosen[i]->client->ProfileLayers(req, timeout);
    };
    for (size_t i = 0; i < n; ++i) {
      try {
        calls.emplace_back(call, i);
      } catch (const std::system_error& e) {
        // No thread to spare (the process is at its limit): this worker's call runs here,
        // beside those already started and before the rest, and the coordinator lives on.
        spdlog::warn("profiling on {}: no thread ({}); calling it from this one",
                     Named(*chosen[i]->worker), e.what());
        call(i);
      }
    }
    for (std::thread& t : calls) t.join();
  }
  RoundAnswers answers;
  for (size_t i = 0; i < n; ++i) {
    const absl::Status s =
        WithPrefix(responses[i].status(), absl::StrCat("profiling on ", Named(*chosen[i]->worker)));
    if (!s.ok()) {
      spdlog::warn("{}", s.ToString());
      if (first_error->ok()) *first_error = s;
      continue;
    }
    answers.layers.emplace_back(responses[i]->layers().begin(), responses[i]->layers().end());
    answers.answered.push_back(chosen[i]);
  }
  return answers;
}

// The first worker, and those like it (the same key: device kind, threads and hardware) that
// do not share a GPU with one already chosen (two on one GPU would time each other), up to
// kMaxProfiledWorkers. `workers` is not empty.
std::vector<const ProfiledWorker*> ChooseProfiledWorkers(
    const v1::JobSpec& spec, const std::vector<ProfiledWorker>& workers) {
  const std::string key = ProfileKeyFor(spec, *workers[0].worker);
  std::vector<const ProfiledWorker*> chosen = {&workers[0]};
  for (size_t i = 1; i < workers.size() && chosen.size() < kMaxProfiledWorkers; ++i) {
    const WorkerRecord& w = *workers[i].worker;
    if (ProfileKeyFor(spec, w) != key) continue;
    if (std::any_of(chosen.begin(), chosen.end(),
                    [&](const ProfiledWorker* c) { return ShareDevice(*c->worker, w); })) {
      continue;
    }
    chosen.push_back(&workers[i]);
  }
  return chosen;
}

// What rounds of one request gave.
struct TimedRounds {
  std::vector<std::vector<v1::LayerProfile>> answers;  // every answer of every round
  std::vector<std::vector<v1::LayerProfile>> rounds;   // each round's answers merged
  std::vector<const ProfiledWorker*> answered;         // those that answered the last round
  absl::Status first_error;                            // the first worker's failure (named), if any
};

// `req` on `chosen` at once, in rounds: until kProfileRounds agree (no DisagreeingLayer between
// the first round's merge and the latest's), else up to kMaxProfileRounds, all within
// `timeout`: another only when what is left exceeds the last round's time, and none once
// `stop` (optional) says so. A worker that fails is not asked again. `what` names the timing in
// the log. An error only when answers cannot be merged (MergeWorkerProfiles).
absl::StatusOr<TimedRounds> TimeInRounds(std::vector<const ProfiledWorker*> chosen,
                                         const v1::ProfileLayersRequest& req,
                                         absl::Duration timeout, const std::function<bool()>& stop,
                                         const char* what) {
  const absl::Time deadline = absl::Now() + timeout;
  absl::Duration last_round = absl::ZeroDuration();
  TimedRounds t;
  for (int round = 0; round < kMaxProfileRounds; ++round) {
    const absl::Duration left = deadline - absl::Now();
    if (round > 0 && (left <= last_round || (stop && stop()))) {
      spdlog::info("{}: {} round(s) timed, no time or call for another", what, round);
      break;
    }
    const absl::Time round_start = absl::Now();
    RoundAnswers answers = ProfileRound(chosen, req, left, &t.first_error);
    last_round = absl::Now() - round_start;
    if (answers.layers.empty()) break;
    ASSIGN_OR_RETURN(std::vector<v1::LayerProfile> merged, MergeWorkerProfiles(answers.layers));
    t.answers.insert(t.answers.end(), answers.layers.begin(), answers.layers.end());
    t.rounds.push_back(std::move(merged));
    chosen = answers.answered;
    t.answered = std::move(answers.answered);
    if (static_cast<int>(t.rounds.size()) < kProfileRounds) continue;
    const int off = DisagreeingLayer(t.rounds.front(), t.rounds.back());
    if (off < 0) break;
    spdlog::info("{} round {} disagrees with round 1 on layer {} (more than {:.0f}%){}", what,
                 round + 1, off, 100 * kProfileRoundAgreement,
                 round + 1 < kMaxProfileRounds ? ": timing another" : "; taking the median");
  }
  return t;
}

}  // namespace

int DisagreeingLayer(const std::vector<v1::LayerProfile>& first,
                     const std::vector<v1::LayerProfile>& round) {
  const auto passes = [](const v1::LayerProfile& l) {
    return std::pair{l.forward_seconds() + l.backward_seconds(),
                     l.backward_input_seconds() + l.backward_weight_seconds()};
  };
  double total = 0.0;
  for (const v1::LayerProfile& l : first) total += passes(l).first;
  const auto off = [](double a, double b) {
    return std::abs(a - b) > kProfileRoundAgreement * std::max(a, b);
  };
  for (size_t i = 0; i < first.size() && i < round.size(); ++i) {
    const auto [fb, iw] = passes(first[i]);
    if (fb < kProfileNegligibleShare * total) continue;
    const auto [fb2, iw2] = passes(round[i]);
    if (off(fb, fb2) || off(iw, iw2)) return first[i].layer();
  }
  return -1;
}

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

absl::StatusOr<std::vector<v1::LayerProfile>> MergeWorkerProfiles(
    const std::vector<std::vector<v1::LayerProfile>>& per_worker) {
  if (per_worker.empty()) return absl::InvalidArgumentError("no worker's profile to merge");
  std::vector<v1::LayerProfile> merged = per_worker[0];
  for (size_t w = 1; w < per_worker.size(); ++w) {
    if (per_worker[w].size() != merged.size()) {
      return absl::InvalidArgumentError(absl::StrCat("profile ", w, " has ", per_worker[w].size(),
                                                     " layers, profile 0 ", merged.size()));
    }
    for (size_t i = 0; i < merged.size(); ++i) {
      const v1::LayerProfile& a = merged[i];
      const v1::LayerProfile& b = per_worker[w][i];
      if (a.layer() != b.layer() || a.activation_bytes() != b.activation_bytes() ||
          a.output_bytes() != b.output_bytes() || a.static_bytes() != b.static_bytes() ||
          a.workspace_bytes() != b.workspace_bytes() ||
          a.parameter_count() != b.parameter_count()) {
        return absl::InvalidArgumentError(
            absl::StrCat("profile ", w, " disagrees with profile 0 on layer ", a.layer(),
                         " (layer or bytes differ: workers of different builds or kinds?)"));
      }
    }
  }
  // The median over the workers of one time of layer i.
  const auto median = [&](size_t i, double (v1::LayerProfile::*field)() const) {
    std::vector<double> v;
    for (const std::vector<v1::LayerProfile>& p : per_worker) v.push_back((p[i].*field)());
    std::sort(v.begin(), v.end());
    const size_t n = v.size();
    return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
  };
  for (size_t i = 0; i < merged.size(); ++i) {
    v1::LayerProfile& m = merged[i];
    m.set_forward_seconds(median(i, &v1::LayerProfile::forward_seconds));
    m.set_backward_seconds(median(i, &v1::LayerProfile::backward_seconds));
    m.set_backward_input_seconds(median(i, &v1::LayerProfile::backward_input_seconds));
    m.set_backward_weight_seconds(median(i, &v1::LayerProfile::backward_weight_seconds));
    m.set_apply_seconds(median(i, &v1::LayerProfile::apply_seconds));
    m.set_recompute_seconds(median(i, &v1::LayerProfile::recompute_seconds));
  }
  return merged;
}

std::string ProfileKeyFor(const v1::JobSpec& spec, const WorkerRecord& worker) {
  return ProfileKey(spec, DeviceKind(worker.device), worker.threads, worker.device_name);
}

absl::StatusOr<v1::ModelProfile> MeasureProfile(const v1::JobSpec& spec,
                                                const std::vector<ProfiledWorker>& workers,
                                                absl::Duration timeout, ProfileStore* store,
                                                const LinkPeer* peer,
                                                const std::function<bool()>& stop) {
  if (workers.empty()) return absl::InvalidArgumentError("no worker to profile on");
  const WorkerRecord& first = *workers[0].worker;
  const std::string key = ProfileKeyFor(spec, first);
  std::vector<const ProfiledWorker*> chosen = ChooseProfiledWorkers(spec, workers);
  v1::ProfileLayersRequest req;
  *req.mutable_spec() = spec;
  for (int g : LayersToProfile(spec.model())) req.add_layers(g);
  const auto t0 = std::chrono::steady_clock::now();
  ASSIGN_OR_RETURN(TimedRounds timed, TimeInRounds(chosen, req, timeout, stop, "profile"));
  if (timed.answers.empty()) return timed.first_error;
  chosen = std::move(timed.answered);
  std::vector<std::string> ids;
  for (const ProfiledWorker* c : chosen) ids.push_back(c->worker->id);
  ASSIGN_OR_RETURN(std::vector<v1::LayerProfile> layers, MergeWorkerProfiles(timed.answers));
  ASSIGN_OR_RETURN(v1::ModelProfile profile, ExpandProfile(spec.model(), layers));
  StageWorkerClient& client = *workers[0].client;
  profile.set_key(key);
  profile.set_device(DeviceKind(first.device));
  profile.set_threads(first.threads);
  profile.set_device_name(first.device_name);
  profile.set_created_unix_ms(UnixMicros() / 1000);
  spdlog::info("profiled {} layer kinds on {} at once, {} round(s), in {:.2f} s ({})",
               layers.size(), absl::StrJoin(ids, ", "), timed.rounds.size(),
               std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
               profile.key());
  if (peer != nullptr && peer->worker != nullptr && peer->client != nullptr) {
    absl::StatusOr<v1::LinkProfile> link = MeasureLink(
        first, client, *peer->worker, *peer->client, LinkProbeSizes(profile), kLinkProbeRepeats,
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

absl::StatusOr<SpeedCheck> CheckProfileSpeed(const v1::JobSpec& spec,
                                             const v1::ModelProfile& profile,
                                             const std::vector<ProfiledWorker>& workers,
                                             absl::Duration timeout) {
  if (workers.empty()) return absl::InvalidArgumentError("no worker to check the profile on");
  v1::ProfileLayersRequest req;
  *req.mutable_spec() = spec;
  for (int g : SpeedCheckLayers(spec.model())) req.add_layers(g);
  req.set_repeats(kSpeedCheckRepeats);
  req.set_forward_backward_only(true);
  // In rounds as a profile is timed, and merged as it is: a busy spell of the host (the kernel
  // writing out the last job's checkpoint) in one round does not price the job.
  ASSIGN_OR_RETURN(TimedRounds timed, TimeInRounds(ChooseProfiledWorkers(spec, workers), req,
                                                   timeout, nullptr, "speed check"));
  if (timed.answers.empty()) return timed.first_error;
  ASSIGN_OR_RETURN(const std::vector<v1::LayerProfile> now, MergeWorkerProfiles(timed.answers));
  std::vector<double> round_ratios;
  for (const std::vector<v1::LayerProfile>& round : timed.rounds) {
    ASSIGN_OR_RETURN(const SpeedCheck this_round, JudgeSpeed(spec.model(), profile, round));
    round_ratios.push_back(this_round.ratio);
  }
  return JudgeSpeed(spec.model(), profile, now, round_ratios);
}

namespace {

// The speed check of `cached` (a profile of `spec`) on idle workers of its key, held
// (BUSY, job "speed-check-N") while they time it. UNAVAILABLE when none is idle.
absl::StatusOr<SpeedCheck> CheckOnIdleWorkers(const v1::JobSpec& spec,
                                              const v1::ModelProfile& cached,
                                              WorkerRegistry& registry,
                                              StageWorkerClientFactory& clients,
                                              absl::Duration timeout) {
  const std::string kind = DeviceKind(spec.device());
  static std::atomic<int> counter{0};
  const std::string holder = absl::StrCat("speed-check-", ++counter);
  // Two when two are idle: they time the layers at once, as the profile's workers did.
  absl::StatusOr<std::vector<WorkerRecord>> held = registry.Allocate(kind, 2, holder);
  if (!held.ok()) held = registry.Allocate(kind, 1, holder);
  if (!held.ok()) {
    return absl::UnavailableError(
        absl::StrCat("no idle ", kind, " worker to time it on: ", held.status().message()));
  }
  std::vector<std::unique_ptr<StageWorkerClient>> held_clients;
  std::vector<ProfiledWorker> profiled;
  for (const WorkerRecord& w : *held) {
    if (ProfileKeyFor(spec, w) != cached.key()) continue;  // other hardware than the profile's
    held_clients.push_back(clients.Connect(w.address));
    profiled.push_back({&w, held_clients.back().get()});
  }
  absl::StatusOr<SpeedCheck> check =
      profiled.empty() ? absl::UnavailableError(
                             "no idle worker of the profile's hardware and threads to time it on")
                       : CheckProfileSpeed(spec, cached, profiled, timeout);
  registry.Release(holder);
  return check;
}

// `cached` (old enough for a speed check, `worker` one of its key's) as a plan is priced on it,
// by the verdict of its family's check within checks.after() (the first such call makes it):
// as it is, or scaled, saying so in ModelProfile.speed_check; none when the verdict is to
// measure it again (what the check found then goes to *remeasured, for the new profile). A
// check that cannot be made (no idle worker, a worker's error) leaves the profile as it is,
// saying why.
std::optional<v1::ModelProfile> ServeChecked(const v1::JobSpec& spec, const WorkerRecord& worker,
                                             v1::ModelProfile cached, WorkerRegistry& registry,
                                             StageWorkerClientFactory& clients,
                                             absl::Duration timeout, SpeedCheckMemo& checks,
                                             std::string* remeasured) {
  v1::JobSpec any_size = spec;
  any_size.mutable_pipeline()->set_micro_batch_size(0);
  const std::string family = ProfileKeyFor(any_size, worker);
  const absl::Time asked = absl::Now();
  std::optional<SpeedCheckMemo::Verdict> verdict = checks.Find(family, asked);
  std::string when = "checked now";
  if (verdict.has_value()) {
    when = absl::StrFormat("checked %.0f s ago", absl::ToDoubleSeconds(asked - verdict->made));
  } else {
    absl::StatusOr<SpeedCheck> made = CheckOnIdleWorkers(spec, cached, registry, clients, timeout);
    if (!made.ok()) {
      spdlog::warn("speed check of profile {} (measured {} ago): {}; served as it is", cached.key(),
                   absl::FormatDuration(absl::Trunc(ProfileAge(cached), absl::Seconds(1))),
                   made.status().ToString());
      cached.set_speed_check(
          absl::StrCat("not checked (", made.status().message(), "): as measured"));
      return cached;
    }
    spdlog::info("speed check of profile {} (measured {} ago): {}", cached.key(),
                 absl::FormatDuration(absl::Trunc(ProfileAge(cached), absl::Seconds(1))),
                 DescribeSpeedCheck(*made));
    verdict = SpeedCheckMemo::Verdict{*std::move(made), absl::Now()};
    checks.Put(family, verdict->check, verdict->made);
  }
  const SpeedCheck& check = verdict->check;
  const std::string said = absl::StrCat(when, ": ", DescribeSpeedCheck(check));
  if (check.remeasure) {
    *remeasured = said;
    return std::nullopt;
  }
  if (check.scaled) cached = ScaleProfileCompute(std::move(cached), check.ratio);
  cached.set_speed_check(said);
  return cached;
}

}  // namespace

absl::StatusOr<v1::ModelProfile> ProfileModel(const v1::JobSpec& spec, WorkerRegistry& registry,
                                              StageWorkerClientFactory& clients,
                                              ProfileStore& store, absl::Duration timeout,
                                              bool refresh, RendezvousStore* rendezvous,
                                              SpeedCheckMemo* checks) {
  const std::string kind = DeviceKind(spec.device());
  // The profile keys of the registered workers of that kind, each once (hardware differs
  // between them, but most share one), with a worker of each: looked up below, measured only
  // when none is cached.
  std::vector<std::pair<std::string, WorkerRecord>> keys;
  for (const WorkerRecord& w : registry.List()) {
    if (DeviceKind(w.device) != kind || w.state == v1::LOST) continue;
    std::string key = ProfileKeyFor(spec, w);
    if (std::none_of(keys.begin(), keys.end(), [&](const auto& k) { return k.first == key; })) {
      keys.emplace_back(std::move(key), w);
    }
  }
  if (keys.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("no ", kind, " worker is registered to profile the model on"));
  }
  std::string remeasured;  // the speed check that called for measuring again, if one did
  if (!refresh) {
    for (const auto& [key, worker] : keys) {
      std::optional<v1::ModelProfile> cached = store.Find(key);
      if (!cached.has_value()) continue;
      if (checks == nullptr || !checks->Checks(ProfileAge(*cached))) return *cached;
      std::optional<v1::ModelProfile> served = ServeChecked(
          spec, worker, *std::move(cached), registry, clients, timeout, *checks, &remeasured);
      if (served.has_value()) return *std::move(served);
      break;  // the machine changed since: measured again below
    }
  }
  static std::atomic<int> counter{0};
  const std::string holder = absl::StrCat("profile-", ++counter);
  // Two workers when two are idle, so that the link between them is measured too.
  absl::StatusOr<std::vector<WorkerRecord>> held = registry.Allocate(kind, 2, holder);
  if (!held.ok()) held = registry.Allocate(kind, 1, holder);
  if (!held.ok() && !refresh) {
    // Past its max age (or its speed check called for measuring it again), but none can
    // measure it again now: the old profile is better than unit costs, and the plan prints
    // when it was measured.
    for (const auto& [key, worker] : keys) {
      if (auto old = store.FindAnyAge(key); old.has_value()) {
        spdlog::warn(
            "profile {}: {}, and no idle {} worker to measure it again ({}); planning with it "
            "as it is",
            old->key(), remeasured.empty() ? "past --profile-max-age" : "far off its speed check",
            kind, std::string(held.status().message()));
        if (!remeasured.empty()) {
          old->set_speed_check(absl::StrCat(remeasured, "; no idle worker: as measured"));
        }
        return *old;
      }
    }
  }
  if (!held.ok()) {
    return absl::UnavailableError(absl::StrCat("no idle ", kind,
                                               " worker to profile the model on (",
                                               held.status().message(), "); try again later"));
  }
  std::vector<std::unique_ptr<StageWorkerClient>> held_clients;
  std::vector<ProfiledWorker> profiled;
  for (const WorkerRecord& w : *held) {
    held_clients.push_back(clients.Connect(w.address));
    profiled.push_back({&w, held_clients.back().get()});
  }
  LinkPeer peer;
  if (held->size() >= 2) {
    peer = LinkPeer{&(*held)[1], held_clients[1].get(), absl::StrCat(holder, "/link-probe/"),
                    rendezvous, /*transport=*/""};
  }
  absl::StatusOr<v1::ModelProfile> profile =
      MeasureProfile(spec, profiled, timeout, &store, held->size() >= 2 ? &peer : nullptr);
  registry.Release(holder);
  // Stored as measured; the caller also learns which check sent it to be measured again.
  if (profile.ok() && !remeasured.empty()) profile->set_speed_check(remeasured);
  return profile;
}

}  // namespace tandem::coordinator
