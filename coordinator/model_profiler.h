// Getting a model's profile (for partition: profile and for `tandem plan`): from the
// ProfileStore when a profile of the same key exists, else measured on a worker through
// StageWorker.ProfileLayers (the embedding, one block and the head; blocks cost the same) and,
// when a second worker is at hand, the link between the two through StageWorker.ProbeLink;
// then kept in the store. No gRPC here: workers are reached through StageWorkerClient.
#ifndef TANDEM_COORDINATOR_MODEL_PROFILER_H_
#define TANDEM_COORDINATOR_MODEL_PROFILER_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "coordinator/profile_speed_check.h"
#include "coordinator/profile_store.h"
#include "coordinator/rendezvous_store.h"
#include "coordinator/speed_check_memo.h"
#include "coordinator/worker_client.h"
#include "coordinator/worker_registry.h"
#include "tandem/v1/common.pb.h"
#include "tandem/v1/spec.pb.h"

namespace tandem::coordinator {

// Timed round trips per size of a link probe.
inline constexpr int kLinkProbeRepeats = 5;
// The longest a link probe may take (a peer that never shows up ends it).
inline constexpr absl::Duration kLinkProbeTimeout = absl::Seconds(60);

// The data-parallel reduction is timed on all of the model's parameters (fp32 gradients), at
// most this many bytes: enough for the ring's per-byte cost, in about a second on loopback.
inline constexpr int64_t kMaxAllReduceProbeBytes = int64_t{64} << 20;
int64_t AllReduceProbeBytes(const v1::ModelProfile& profile);

// The message sizes a model's link is timed at: 4 KiB, the activation one micro-batch sends
// from stage to stage (the embedding's output bytes) and 4 x that, each at most the workers'
// 1 GiB. `profile` is a measured layer profile of the model.
std::vector<int64_t> LinkProbeSizes(const v1::ModelProfile& profile);

// Times the link between two idle workers: ProbeLink on both at once (a is rank 0, b rank 1)
// under `rendezvous_prefix` (unique to this probe), `repeats` round trips of each size, then
// the fit over the samples of both ends (common/link_model.h). `timeout` bounds the probe on
// the workers; the calls get a little more. An error names the worker whose call failed,
// preferring the cause to its peer's DEADLINE_EXCEEDED. With `rendezvous`, the probe's keys
// are dropped afterwards. Between two cuda workers the probe times `transport` ("nccl", or
// "gloo": the host-staged transport); anything else (empty, "auto"): "gloo" when the two share
// a GPU (ShareDevice; NCCL cannot put both ranks on one device), "nccl" otherwise. Between cpu
// workers, `allreduce_bytes` > 0 also times the data-parallel ring on that many bytes
// (LinkProfile.allreduce_seconds: the median of both ends' runs).
absl::StatusOr<v1::LinkProfile> MeasureLink(const WorkerRecord& a, StageWorkerClient& a_client,
                                            const WorkerRecord& b, StageWorkerClient& b_client,
                                            const std::vector<int64_t>& sizes, int repeats,
                                            const std::string& rendezvous_prefix,
                                            absl::Duration timeout, RendezvousStore* rendezvous,
                                            const std::string& transport = "",
                                            int64_t allreduce_bytes = 0);

// The second worker of a profile, whose link to the first is measured with it.
struct LinkPeer {
  const WorkerRecord* worker = nullptr;
  StageWorkerClient* client = nullptr;
  std::string rendezvous_prefix;          // unique to the probe, e.g. "<job>/link-probe/"
  RendezvousStore* rendezvous = nullptr;  // optional: the probe's keys are dropped afterwards
  // Between cuda workers: the job's resolved pipeline.transport ("nccl" or "gloo"); anything
  // else (empty, "auto"): as ChooseTransport's auto would pick for the two (see MeasureLink).
  std::string transport;
};

// A worker a profile is measured on, and the client that reaches it.
struct ProfiledWorker {
  const WorkerRecord* worker = nullptr;
  StageWorkerClient* client = nullptr;
};

// At most this many workers profile a job's layers at once (its first ones).
inline constexpr int kMaxProfiledWorkers = 8;

// A profile is timed in rounds, one after the other, each on every profiled worker at once:
// kProfileRounds that agree are enough, otherwise more, up to kMaxProfileRounds, and each time
// is the median over every round's workers. A round agrees with the first when each layer's
// forward + backward and input + weight backward are within kProfileRoundAgreement of the
// first round's (layers under kProfileNegligibleShare of the profiled layers' forward +
// backward aside: the embedding, one block and the head, each counted once): a busy spell
// of the host during one round (measured: one round 29% slow on a head layer, the job then run
// at the other rounds' speed) would otherwise price every job planned from the profile.
inline constexpr int kProfileRounds = 2;
inline constexpr int kMaxProfileRounds = 3;
inline constexpr double kProfileRoundAgreement = 0.03;
inline constexpr double kProfileNegligibleShare = 0.01;

// The first layer of `round` whose time is off `first`'s by more than kProfileRoundAgreement
// (relative to the larger), ignoring layers under kProfileNegligibleShare of `first`'s total;
// -1 when they agree. Both list the same layers (MergeWorkerProfiles' output).
int DisagreeingLayer(const std::vector<v1::LayerProfile>& first,
                     const std::vector<v1::LayerProfile>& round);

// One profile from the same layers timed on several workers at once: each time is the median
// over the workers (the mean of the middle two for an even count), the bytes and parameter
// counts those of the first. INVALID_ARGUMENT when the workers did not return the same layers
// in the same order, or returned different bytes (workers of different builds or kinds).
absl::StatusOr<std::vector<v1::LayerProfile>> MergeWorkerProfiles(
    const std::vector<std::vector<v1::LayerProfile>>& per_worker);

// The key under which the profile of `spec` measured on `worker` is kept: its device kind,
// threads and hardware name (ProfileKey).
std::string ProfileKeyFor(const v1::JobSpec& spec, const WorkerRecord& worker);

// Measures the profile of `spec` on `workers` (which must be idle; at least one) and puts it in
// `store` (optional). The first worker and, up to kMaxProfiledWorkers, each other of its
// device kind, threads and hardware (the profile's key) that shares no GPU with one already taken
// time the layers at the same moment (ProfileLayers on all at once), because in a job they compute
// at once too and, where they share a host, its cores and memory bandwidth; in rounds until two
// agree (kProfileRounds above), all within `timeout` (another round only when more is left
// than the last took, and none once `stop`, optional, says so: the job was cancelled); the
// times of those that answer, in every round, are merged by
// MergeWorkerProfiles (one that fails is logged; the error, naming the worker, only when none
// answers). With `peer` (idle too) it
// also measures the link from the first worker to it (MeasureLink, sizes from LinkProbeSizes,
// the all-reduce on AllReduceProbeBytes) into ModelProfile.link; a link that cannot be
// measured is logged and left empty, since the layer timings are still good. Errors name the
// worker.
absl::StatusOr<v1::ModelProfile> MeasureProfile(const v1::JobSpec& spec,
                                                const std::vector<ProfiledWorker>& workers,
                                                absl::Duration timeout, ProfileStore* store,
                                                const LinkPeer* peer = nullptr,
                                                const std::function<bool()>& stop = nullptr);

// The speed check of `profile` (cached for `spec`'s key; coordinator/profile_speed_check.h):
// the forward and backward of each of SpeedCheckLayers timed kSpeedCheckRepeats times on
// `workers` (idle; those MeasureProfile would take, at once), in rounds as MeasureProfile
// times (kProfileRounds that agree, else up to kMaxProfileRounds, all within `timeout`),
// merged as it merges (MergeWorkerProfiles over every answer of every round) and judged by
// JudgeSpeed; each round's own verdict goes to round_ratios. The error of the first worker
// that failed (named) when none answered.
absl::StatusOr<SpeedCheck> CheckProfileSpeed(const v1::JobSpec& spec,
                                             const v1::ModelProfile& profile,
                                             const std::vector<ProfiledWorker>& workers,
                                             absl::Duration timeout);

// For `tandem plan`: a cached profile for any registered worker of the spec's device kind, or
// one measured on an idle such worker, which is held (BUSY, job "profile") meanwhile so that
// the scheduler does not hand it to a job. When two such workers are idle both are held, both
// time the layers at once and the link between them is measured as well; otherwise the link is left
// empty (as it is in a cached profile measured on one worker). `rendezvous` (optional) drops the
// link probe's keys afterwards. A cached profile past the store's max age is measured again;
// when no worker is idle to do so (and `refresh` is false) it is returned as it is, with a
// warning. With `checks`, a cached profile old enough for a speed check (checks->Checks) is
// served as a job's planning would price it: by its family's verdict (SpeedCheckMemo), made now
// on idle workers of its key (held meanwhile, as above) unless one was made within
// checks->after(); scaled to the speed now, as it is, or measured again when the machine
// changed (ModelProfile.speed_check says what the check found, on the profile served, the new
// one included, or why none could be made, when no worker is idle: then as it is).
// FAILED_PRECONDITION when no worker of that kind is registered; UNAVAILABLE when none is idle and
// no profile is cached.
absl::StatusOr<v1::ModelProfile> ProfileModel(const v1::JobSpec& spec, WorkerRegistry& registry,
                                              StageWorkerClientFactory& clients,
                                              ProfileStore& store, absl::Duration timeout,
                                              bool refresh, RendezvousStore* rendezvous = nullptr,
                                              SpeedCheckMemo* checks = nullptr);

}  // namespace tandem::coordinator

#endif  // TANDEM_COORDINATOR_MODEL_PROFILER_H_
