#include "worker/link_probe.h"

#include <algorithm>
#include <memory>
#include <new>
#include <system_error>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/median.h"
#include "worker/transport/ring_allreduce.h"

namespace tandem::worker {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

}  // namespace

absl::StatusOr<LinkProbeOptions> LinkProbeOptionsFrom(const v1::ProbeLinkRequest& request) {
  if (request.rendezvous_prefix().empty()) {
    return absl::InvalidArgumentError("probe link: rendezvous_prefix is empty");
  }
  if (request.rank() != 0 && request.rank() != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("probe link: rank is ", request.rank(), "; a link has ranks 0 and 1"));
  }
  if (request.sizes_size() == 0 || request.sizes_size() > kMaxProbeSizes) {
    return absl::InvalidArgumentError(absl::StrCat("probe link: sizes has ", request.sizes_size(),
                                                   " entries; expected 1 to ", kMaxProbeSizes));
  }
  LinkProbeOptions o;
  o.rank = request.rank();
  for (int i = 0; i < request.sizes_size(); ++i) {
    const int64_t bytes = request.sizes(i);
    if (bytes <= 0 || bytes > kMaxProbeBytes) {
      return absl::InvalidArgumentError(absl::StrCat("probe link: sizes[", i, "] is ", bytes,
                                                     " bytes; expected 1 to ", kMaxProbeBytes,
                                                     " (1 GiB)"));
    }
    o.sizes.push_back(bytes);
  }
  if (request.repeats() < 0 || request.repeats() > kMaxProbeRepeats) {
    return absl::InvalidArgumentError(absl::StrCat("probe link: repeats is ", request.repeats(),
                                                   "; expected 0 (default ", kDefaultProbeRepeats,
                                                   ") to ", kMaxProbeRepeats));
  }
  if (request.repeats() > 0) o.repeats = request.repeats();
  if (request.timeout_ms() < 0 || request.timeout_ms() > kMaxProbeTimeout.count()) {
    return absl::InvalidArgumentError(
        absl::StrCat("probe link: timeout_ms is ", request.timeout_ms(), "; expected 0 (default ",
                     kDefaultProbeTimeout.count(), ") to ", kMaxProbeTimeout.count()));
  }
  if (request.timeout_ms() > 0) o.timeout = std::chrono::milliseconds(request.timeout_ms());
  if (!request.device().empty()) {
    if (request.device() != "cpu" && request.device() != "cuda") {
      return absl::InvalidArgumentError(absl::StrCat("probe link: device is \"", request.device(),
                                                     "\"; expected \"cpu\" or \"cuda\""));
    }
    o.device = request.device();
  }
  if (!request.transport().empty()) {
    if (request.transport() != "nccl" && request.transport() != "gloo") {
      return absl::InvalidArgumentError(absl::StrCat(
          "probe link: transport is \"", request.transport(), "\"; expected \"nccl\" or \"gloo\""));
    }
    if (o.device != "cuda") {
      return absl::InvalidArgumentError(
          absl::StrCat("probe link: transport \"", request.transport(),
                       "\" applies to device \"cuda\" only (a cpu probe is Gloo)"));
    }
    o.transport = request.transport();
  }
  if (request.allreduce_bytes() != 0) {
    if (request.allreduce_bytes() < 0 || request.allreduce_bytes() > kMaxProbeBytes) {
      return absl::InvalidArgumentError(absl::StrCat("probe link: allreduce_bytes is ",
                                                     request.allreduce_bytes(), "; expected 0 to ",
                                                     kMaxProbeBytes, " (1 GiB)"));
    }
    if (o.device != "cpu") {
      return absl::InvalidArgumentError(
          "probe link: allreduce_bytes applies to device \"cpu\" only (the data-parallel ring "
          "runs on host buffers)");
    }
    o.allreduce_bytes = request.allreduce_bytes() / 4 * 4;
  }
  return o;
}

LinkProbe::LinkProbe(LinkProbeOptions options) : options_(std::move(options)) {}

void LinkProbe::Cancel() {
  absl::MutexLock lock(&mu_);
  StopLocked(Stop::kCancelled);
}

void LinkProbe::StopLocked(Stop why) {
  if (stop_ == Stop::kNone) stop_ = why;
  cancelled_.store(true);
  if (transport_ != nullptr) transport_->Abort();
}

absl::Status LinkProbe::Explain(const absl::Status& s, const char* what) {
  const int peer = 1 - options_.rank;
  Stop stop;
  {
    absl::MutexLock lock(&mu_);
    stop = stop_;
  }
  switch (stop) {
    case Stop::kTimedOut:
      return absl::DeadlineExceededError(absl::StrCat(
          "probe link (rank ", options_.rank, "): ", what, " did not finish within the timeout of ",
          options_.timeout.count(), " ms (peer rank ", peer,
          " did not show up or stopped answering): ", s.message()));
    case Stop::kCancelled:
      return absl::AbortedError(
          absl::StrCat("probe link (rank ", options_.rank, "): cancelled while ", what));
    case Stop::kNone:
      break;
  }
  return absl::Status(
      s.code(), absl::StrCat("probe link (rank ", options_.rank, "): ", what, ": ", s.message()));
}

absl::StatusOr<LinkProbeResult> LinkProbe::Run(const LinkConnector& connect,
                                               const ProbeBufferAllocator& allocate) {
  // The watchdog enforces the timeout on the connect and on every transfer: it stops the
  // probe, which makes the connector give up and aborts the transport.
  const absl::Time deadline = absl::Now() + absl::FromChrono(options_.timeout);
  std::thread watchdog;
  try {
    watchdog = std::thread([this, deadline] {
      absl::MutexLock lock(&mu_);
      if (!mu_.AwaitWithDeadline(absl::Condition(&finished_), deadline)) {
        StopLocked(Stop::kTimedOut);
      }
    });
  } catch (const std::system_error& e) {
    // Without its watchdog a probe could wait forever: none runs.
    return Explain(absl::ResourceExhaustedError(e.what()), "starting its timeout's thread");
  }
  absl::StatusOr<LinkProbeResult> result = Probe(connect, allocate);
  {
    absl::MutexLock lock(&mu_);
    finished_ = true;
  }
  watchdog.join();
  return result;
}

absl::StatusOr<LinkProbeResult> LinkProbe::Probe(const LinkConnector& connect,
                                                 const ProbeBufferAllocator& allocate) {
  {
    absl::MutexLock lock(&mu_);
    if (stop_ != Stop::kNone) return Explain(absl::AbortedError("stopped"), "starting");
  }
  // The buffers outlive the transport: after a failure it may still reference them.
  const int64_t max_bytes = *std::max_element(options_.sizes.begin(), options_.sizes.end());
  StageBufferPtr buffers[2];
  for (StageBufferPtr& b : buffers) {
    absl::StatusOr<StageBufferPtr> got = allocate ? allocate(static_cast<size_t>(max_bytes))
                                                  : NewHostBuffer(static_cast<size_t>(max_bytes));
    if (!got.ok()) {
      return absl::Status(got.status().code(),
                          absl::StrCat("probe link (rank ", options_.rank, "): allocating 2 x ",
                                       max_bytes, " bytes: ", got.status().message()));
    }
    b = *std::move(got);
  }
  char* out = static_cast<char*>(buffers[0]->data());
  char* in = static_cast<char*>(buffers[1]->data());
  // The all-reduce's buffer and the ring's scratch outlive the transport too.
  std::vector<float> reduced, scratch;
  try {
    reduced.assign(static_cast<size_t>(options_.allreduce_bytes / 4), 1.0f);
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(absl::StrCat("probe link (rank ", options_.rank,
                                                     "): allocating ", options_.allreduce_bytes,
                                                     " bytes for the all-reduce"));
  }
  absl::StatusOr<std::unique_ptr<Transport>> connected = connect(cancelled_);
  if (!connected.ok()) return Explain(connected.status(), "connecting to the peer");
  std::unique_ptr<Transport> transport = *std::move(connected);
  {
    absl::MutexLock lock(&mu_);
    transport_ = transport.get();
    if (stop_ != Stop::kNone) transport->Abort();
  }
  absl::StatusOr<LinkProbeResult> result;
  if (absl::StatusOr<std::vector<v1::LinkSample>> samples = PingPong(*transport, out, in);
      !samples.ok()) {
    result = samples.status();
  } else if (absl::StatusOr<std::vector<double>> runs = AllReduce(*transport, reduced, scratch);
             !runs.ok()) {
    result = runs.status();
  } else {
    result = LinkProbeResult{*std::move(samples), *std::move(runs)};
  }
  {
    absl::MutexLock lock(&mu_);
    transport_ = nullptr;
  }
  transport.reset();  // torn down before the buffers go
  return result;
}

absl::StatusOr<std::vector<double>> LinkProbe::AllReduce(Transport& t, std::vector<float>& data,
                                                         std::vector<float>& scratch) {
  std::vector<double> runs;
  if (data.empty()) return runs;
  // Run 0 is the warm-up; each run sums ones, so the values stay small whatever the repeats.
  for (int k = 0; k <= options_.repeats; ++k) {
    std::fill(data.begin(), data.end(), 1.0f);
    const Clock::time_point t0 = Clock::now();
    absl::Status s =
        RingAllReduce(t, data.data(), data.size(), scratch, {.id = static_cast<uint32_t>(k)});
    const Clock::time_point t1 = Clock::now();
    if (!s.ok()) {
      return Explain(s, absl::StrCat("all-reducing ", data.size() * 4, " bytes").c_str());
    }
    if (data.front() != 2.0f || data.back() != 2.0f) {
      return absl::InternalError(absl::StrCat("probe link (rank ", options_.rank,
                                              "): the all-reduce summed ones to ", data.front(),
                                              "; expected 2 (two ranks)"));
    }
    if (k > 0) runs.push_back(Seconds(t1 - t0));
  }
  return runs;
}

absl::StatusOr<std::vector<v1::LinkSample>> LinkProbe::PingPong(Transport& t, char* out, char* in) {
  const int peer = 1 - options_.rank;
  std::vector<v1::LinkSample> samples;
  for (size_t i = 0; i < options_.sizes.size(); ++i) {
    const size_t bytes = static_cast<size_t>(options_.sizes[i]);
    const std::string what = absl::StrCat("exchanging ", bytes, "-byte messages");
    auto tag = [&](int exchange) {
      return MakeTransferTag(Payload::kLinkProbe, static_cast<int>(i), exchange);
    };
    std::vector<double> trips;
    absl::Status s;
    if (options_.rank == 0) {
      // Exchange 0 is the warm-up.
      for (int k = 0; s.ok() && k <= options_.repeats; ++k) {
        s = t.PostRecv(peer, tag(k), in, bytes);
        const Clock::time_point t0 = Clock::now();
        if (s.ok()) s = t.PostSend(peer, tag(k), out, bytes);
        if (s.ok()) s = t.WaitRecv(peer, tag(k));
        const Clock::time_point t1 = Clock::now();
        if (s.ok()) s = t.WaitSends();
        if (s.ok() && k > 0) trips.push_back(Seconds(t1 - t0));
      }
    } else {
      // The next ping's receive is posted before this pong is sent.
      s = t.PostRecv(peer, tag(0), in, bytes);
      Clock::time_point last;
      for (int k = 0; s.ok() && k <= options_.repeats; ++k) {
        s = t.WaitRecv(peer, tag(k));
        const Clock::time_point arrived = Clock::now();
        if (s.ok() && k > 0) trips.push_back(Seconds(arrived - last));
        last = arrived;
        if (s.ok() && k < options_.repeats) s = t.PostRecv(peer, tag(k + 1), in, bytes);
        if (s.ok()) s = t.PostSend(peer, tag(k), out, bytes);
        if (s.ok()) s = t.WaitSends();
      }
    }
    if (!s.ok()) return Explain(s, what.c_str());
    v1::LinkSample sample;
    sample.set_bytes(options_.sizes[i]);
    sample.set_one_way_seconds(Median(trips) / 2);
    for (double trip : trips) sample.add_round_trip_seconds(trip);
    sample.set_rank(options_.rank);
    samples.push_back(std::move(sample));
  }
  return samples;
}

}  // namespace tandem::worker
