// A StageWorkerClient that answers from memory, and the factory that makes them: the
// coordinator's tests run job runners, gangs and profilers on these in place of the network.
#ifndef TANDEM_TESTS_COORDINATOR_FAKE_WORKER_CLIENT_H_
#define TANDEM_TESTS_COORDINATOR_FAKE_WORKER_CLIENT_H_

#include <atomic>
#include <chrono>
#include <cmath>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/relayed_rank.h"
#include "coordinator/worker_client.h"

namespace tandem::coordinator {

// A worker that answers from memory; counts RunStep calls and can be told to fail (its
// configure, a step) or hang.
class FakeWorker final : public StageWorkerClient {
 public:
  explicit FakeWorker(int rank) : rank_(rank) {}
  void Configure(const v1::ConfigureRequest& request, v1::ConfigureResponse*, absl::Duration,
                 Done done) override {
    program_ = request.program();
    done(configure_error);
  }
  void RunStep(const v1::RunStepRequest& request, v1::RunStepResponse* response, absl::Duration,
               Done done) override {
    ++run_steps;
    // The step relay, as a worker forwards it (worker/step_relay.h): each relayed worker is
    // called with its own subtree, its report comes back under its rank, and the first failure
    // fails this call with that worker's rank attached. (Synchronous: relayed fakes must not
    // hang.)
    std::vector<v1::RelayedStep> relayed;
    if (request.relay_size() > 0) {
      ++relay_requests;
      for (const v1::StepRelay& child : request.relay()) {
        v1::RunStepRequest forwarded = request;
        *forwarded.mutable_relay() = child.children();
        v1::RunStepResponse answer;
        absl::Status status = absl::InternalError("no answer");
        (*peers)[child.rank()]->RunStep(forwarded, &answer, absl::Seconds(10),
                                        [&](absl::Status s) { status = std::move(s); });
        if (!status.ok()) {
          const int at = RelayedRank(status) >= 0 ? RelayedRank(status) : child.rank();
          done(WithRelayedRank(status, at));
          return;
        }
        relayed.emplace_back().set_rank(child.rank());
        *relayed.back().mutable_report() = answer.report();
        for (const v1::RelayedStep& r : answer.relayed()) relayed.push_back(r);
      }
    }
    for (v1::RelayedStep& r : relayed) *response->add_relayed() = std::move(r);
    // The previous step's update, folded into this call (RunStepRequest.apply_first).
    if (request.has_apply_first()) applies.push_back(request.apply_first());
    if (request.step() == fail_at_step) {
      done(absl::InternalError("boom"));
      return;
    }
    if (request.step() == hang_at_step) {
      std::thread([this, done] {
        while (!aborted.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
        done(absl::AbortedError("aborted"));
      }).detach();
      return;
    }
    v1::StepReport* rep = response->mutable_report();
    rep->set_step(request.step());
    rep->set_exec_us(100);
    rep->set_grad_norm_sq(request.step() == nan_at_step ? NAN : 4.0);  // norm 2 per stage
    rep->set_grads_finite(request.step() != nan_at_step);
    if (program_.rank() == program_.num_ranks() - 1) {
      rep->set_has_loss(true);
      rep->set_loss(5.0 / (1 + request.step()));
    }
    if (timed) {  // every action 10 us, 1 us apart, on a clock of its own
      const int64_t base = 1'700'000'000'000'000 + request.step() * 1'000'000 + rank_ * 333;
      for (int i = 0; i < program_.actions_size(); ++i) {
        v1::ActionTiming* t = rep->add_timings();
        t->set_index(i);
        t->set_start_us(base + i * 11);
        t->set_end_us(base + i * 11 + 10);
      }
    }
    done(absl::OkStatus());
  }
  void ApplyStep(const v1::ApplyStepRequest& request, v1::ApplyStepResponse*, absl::Duration,
                 Done done) override {
    applies.push_back(request);
    done(absl::OkStatus());
  }
  // The stage's state as a worker streams it: the index (one F32 tensor of 4 elements, named
  // after the rank), then its 16 bytes in two chunks; `checkpoint_error` instead of the end.
  absl::Status SaveCheckpoint(
      const v1::SaveCheckpointRequest&, absl::Duration,
      const std::function<absl::Status(const v1::TensorChunk&)>& on_chunk) override {
    ++checkpoints;
    v1::TensorChunk index;
    v1::TensorMeta* meta = index.add_index();
    meta->set_name("w" + std::to_string(program_.rank()));
    meta->set_dtype("F32");
    meta->add_shape(4);
    std::vector<v1::TensorChunk> chunks = {index, {}, {}};
    chunks[1].set_data(std::string(8, '\1'));
    chunks[2].set_data(std::string(8, '\2'));
    for (const v1::TensorChunk& chunk : chunks) {
      if (absl::Status s = on_chunk(chunk); !s.ok()) return s;  // as the gRPC client cancels
      ++checkpoint_chunks_taken;
    }
    return checkpoint_error;
  }
  absl::Status Abort(const v1::AbortRequest& request, absl::Duration) override {
    aborted.store(true);
    ++aborts;
    std::lock_guard<std::mutex> lock(abort_mu);
    abort_requests.push_back(request);
    return absl::OkStatus();
  }
  absl::Status Probe(absl::Duration) override { return liveness_error; }
  // Layer g costs layer_seconds(g) forward + backward (1 ms each by default).
  absl::StatusOr<v1::ProfileLayersResponse> ProfileLayers(const v1::ProfileLayersRequest& request,
                                                          absl::Duration) override {
    ++profiles;
    {
      std::lock_guard<std::mutex> lock(profile_mu);
      profile_requests.push_back(request);
    }
    if (on_profile) on_profile();
    if (profile_delay > absl::ZeroDuration()) absl::SleepFor(profile_delay);
    if (!profile_error.ok()) return profile_error;
    v1::ProfileLayersResponse resp;
    for (int g : request.layers()) {
      v1::LayerProfile* p = resp.add_layers();
      p->set_layer(g);
      const double s = layer_seconds_by_size
                           ? layer_seconds_by_size(g, request.spec().pipeline().micro_batch_size())
                       : layer_seconds ? layer_seconds(g)
                                       : 0.001;
      p->set_forward_seconds(s / 3);
      p->set_backward_seconds(2 * s / 3);
      // A speed check's request: the split backward is not timed.
      p->set_backward_input_seconds(request.forward_backward_only() ? 0 : s / 3);
      p->set_backward_weight_seconds(request.forward_backward_only() ? 0 : s / 3);
      p->set_static_bytes(1000);
      p->set_activation_bytes(100);
      p->set_output_bytes(10);
    }
    return resp;
  }
  // One way = link_latency + bytes x link_seconds_per_byte, exactly.
  void ProbeLink(const v1::ProbeLinkRequest& request, v1::ProbeLinkResponse* response,
                 absl::Duration, Done done) override {
    probe_requests.push_back(request);
    if (!probe_error.ok()) {
      done(probe_error);
      return;
    }
    for (int64_t bytes : request.sizes()) {
      v1::LinkSample* s = response->add_samples();
      s->set_bytes(bytes);
      s->set_one_way_seconds(link_latency + static_cast<double>(bytes) * link_seconds_per_byte);
      s->set_rank(request.rank());
    }
    // The ring as the fit would price it, plus the per-byte sum cost `allreduce_extra_per_byte`.
    if (request.allreduce_bytes() > 0) {
      const double half = static_cast<double>(request.allreduce_bytes()) / 2;
      for (int k = 0; k < std::max(1, request.repeats()); ++k) {
        response->add_allreduce_seconds(2 * (link_latency + half * link_seconds_per_byte) +
                                        static_cast<double>(request.allreduce_bytes()) *
                                            allreduce_extra_per_byte);
      }
    }
    done(absl::OkStatus());
  }
  // As the gRPC client cancels its calls: a hanging step returns.
  void CancelPending() override { aborted.store(true); }

  double link_latency = 20e-6;
  double link_seconds_per_byte = 1e-9;
  double allreduce_extra_per_byte = 0.0;        // the ring's sums and copies, beyond the messages
  absl::Status configure_error;                 // what Configure answers
  absl::Status probe_error;                     // what ProbeLink answers
  absl::Status liveness_error;                  // what Probe answers
  absl::Status checkpoint_error;                // what SaveCheckpoint ends with, its chunks sent
  std::atomic<int> checkpoints{0};              // SaveCheckpoint calls
  std::atomic<int> checkpoint_chunks_taken{0};  // chunks the coordinator's sink took
  std::vector<v1::ProbeLinkRequest> probe_requests;
  std::function<double(int)> layer_seconds;
  std::function<double(int, int)> layer_seconds_by_size;  // (layer, micro_batch_size)
  absl::Duration profile_delay;
  std::function<void()> on_profile;  // called as ProfileLayers starts
  absl::Status profile_error;
  std::atomic<int> profiles{0};
  std::mutex profile_mu;
  std::vector<v1::ProfileLayersRequest> profile_requests;  // under profile_mu

  int rank_;
  v1::StageProgram program_;
  std::atomic<int> run_steps{0};
  std::atomic<int> relay_requests{0};         // RunSteps that carried a relay list
  std::vector<FakeWorker*>* peers = nullptr;  // the factory's workers, by rank (the relay's)
  std::atomic<int> aborts{0};
  std::mutex abort_mu;
  std::vector<v1::AbortRequest> abort_requests;  // under abort_mu
  std::atomic<bool> aborted{false};
  int64_t fail_at_step = -1;
  int64_t hang_at_step = -1;
  int64_t nan_at_step = -1;
  bool timed = false;  // report per-action timings
  std::vector<v1::ApplyStepRequest> applies;
};

// What the code under test holds for a FakeWorker: it forwards every call, and on destruction
// cancels what is pending, as the gRPC client does. The FakeWorker itself stays with the factory,
// so that a test reads its counters after the job, gang or profiler that held it has gone.
class FakeWorkerHandle final : public StageWorkerClient {
 public:
  explicit FakeWorkerHandle(FakeWorker* w) : w_(w) {}
  ~FakeWorkerHandle() override { w_->CancelPending(); }
  void Configure(const v1::ConfigureRequest& request, v1::ConfigureResponse* response,
                 absl::Duration timeout, Done done) override {
    w_->Configure(request, response, timeout, std::move(done));
  }
  void RunStep(const v1::RunStepRequest& request, v1::RunStepResponse* response,
               absl::Duration timeout, Done done) override {
    w_->RunStep(request, response, timeout, std::move(done));
  }
  void ApplyStep(const v1::ApplyStepRequest& request, v1::ApplyStepResponse* response,
                 absl::Duration timeout, Done done) override {
    w_->ApplyStep(request, response, timeout, std::move(done));
  }
  absl::Status SaveCheckpoint(
      const v1::SaveCheckpointRequest& request, absl::Duration timeout,
      const std::function<absl::Status(const v1::TensorChunk&)>& on_chunk) override {
    return w_->SaveCheckpoint(request, timeout, on_chunk);
  }
  absl::Status Abort(const v1::AbortRequest& request, absl::Duration timeout) override {
    return w_->Abort(request, timeout);
  }
  absl::StatusOr<v1::ProfileLayersResponse> ProfileLayers(const v1::ProfileLayersRequest& request,
                                                          absl::Duration timeout) override {
    return w_->ProfileLayers(request, timeout);
  }
  void ProbeLink(const v1::ProbeLinkRequest& request, v1::ProbeLinkResponse* response,
                 absl::Duration timeout, Done done) override {
    w_->ProbeLink(request, response, timeout, std::move(done));
  }
  absl::Status Probe(absl::Duration timeout) override { return w_->Probe(timeout); }
  void CancelPending() override { w_->CancelPending(); }

 private:
  FakeWorker* w_;
};

// Makes a FakeWorker per Connect and keeps it for the factory's life (`made`, in order).
class FakeFactory final : public StageWorkerClientFactory {
 public:
  std::unique_ptr<StageWorkerClient> Connect(const std::string& address) override {
    auto w = std::make_unique<FakeWorker>(static_cast<int>(made.size()));
    FakeWorker* raw = w.get();
    raw->peers = &made;
    if (configure) configure(raw);
    owned_.push_back(std::move(w));
    made.push_back(raw);
    return std::make_unique<FakeWorkerHandle>(raw);
  }
  std::function<void(FakeWorker*)> configure;
  std::vector<FakeWorker*> made;

 private:
  std::vector<std::unique_ptr<FakeWorker>> owned_;
};

}  // namespace tandem::coordinator

#endif  // TANDEM_TESTS_COORDINATOR_FAKE_WORKER_CLIENT_H_
