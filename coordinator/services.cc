#include "coordinator/services.h"

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/clock.h"
#include "common/limits.h"
#include "common/rpc.h"
#include "common/spec.h"
#include "coordinator/hf_export.h"
#include "coordinator/model_profiler.h"
#include "coordinator/plan_search.h"
#include "coordinator/step_timings.h"
#include "spdlog/spdlog.h"
#include "tandem/v1/coordinator.grpc.pb.h"

namespace tandem::coordinator {
namespace {

v1::WorkerInfo InfoOf(const WorkerRecord& w, Clock::time_point now) {
  v1::WorkerInfo info;
  info.set_worker_id(w.id);
  info.set_address(w.address);
  info.set_device(w.device);
  info.set_threads(w.threads);
  info.set_state(w.state);
  info.set_job_id(w.job_id);
  info.set_stage(w.stage);
  info.set_heartbeat_age_seconds(std::chrono::duration<double>(now - w.last_heartbeat).count());
  info.set_version(w.version);
  info.set_hostname(w.hostname);
  info.set_node(w.node);
  info.set_peak_flops(w.peak_flops);
  info.set_peak_method(w.peak_method);
  info.set_peak_measured_unix_ms(w.peak_measured_unix_ms);
  info.set_device_uuid(w.device_uuid);
  info.set_device_name(w.device_name);
  info.set_clock_offset_us(w.clock_offset_us);
  info.set_clock_uncertainty_us(w.clock_uncertainty_us);
  return info;
}

constexpr const char* kServer = "coordinator";

#define TANDEM_RETURN_IF_BAD_VERSION(req)                                                     \
  do {                                                                                        \
    if (absl::Status _s = CheckProtocolVersion((req)->protocol_version(), kServer); !_s.ok()) \
      return ToGrpcStatus(_s);                                                                \
  } while (0)

// The shortest time between two writes to one WatchJob stream (see WatchJob).
constexpr absl::Duration kWatchBatchInterval = absl::Milliseconds(100);

class CoordinatorServiceImpl final : public v1::Coordinator::Service {
 public:
  explicit CoordinatorServiceImpl(const ServiceEnv& env) : env_(env) {}

  grpc::Status SubmitJob(grpc::ServerContext*, const v1::SubmitJobRequest* req,
                         v1::SubmitJobResponse* resp) override {
    TANDEM_RETURN_IF_BAD_VERSION(req);
    absl::StatusOr<v1::JobSpec> spec;
    switch (req->spec_source_case()) {
      case v1::SubmitJobRequest::kSpecYaml:
        if (req->spec_yaml().size() > kMaxSpecBytes) {
          return ToGrpcStatus(absl::InvalidArgumentError(
              absl::StrCat("spec_yaml is ", req->spec_yaml().size(), " bytes; at most ",
                           kMaxSpecBytes, " allowed")));
        }
        spec = LoadJobSpecYaml(req->spec_yaml());
        break;
      case v1::SubmitJobRequest::kSpec: {
        v1::JobSpec full = WithDefaults(req->spec());
        if (absl::Status s = ValidateJobSpec(full); !s.ok()) {
          spec = s;
        } else {
          spec = std::move(full);
        }
        break;
      }
      default:
        spec = absl::InvalidArgumentError("spec_source: give spec_yaml or spec");
    }
    if (!spec.ok()) return ToGrpcStatus(spec.status());
    if (const std::string& from = spec->init().from_job(); !from.empty()) {
      if (env_.checkpoints == nullptr || !env_.checkpoints->enabled()) {
        return ToGrpcStatus(absl::InvalidArgumentError(
            "init.from_job: this coordinator keeps no checkpoints (start it with --data-root)"));
      }
      if (!env_.store->Get(from, /*with_history=*/false).ok()) {
        return ToGrpcStatus(
            absl::InvalidArgumentError(absl::StrCat("init.from_job: no job '", from, "'")));
      }
    }
    auto id = env_.store->Add(*spec);
    if (!id.ok()) return ToGrpcStatus(id.status());
    spdlog::info("{}: submitted '{}' ({} stages, {} micro-batches of {}, {} steps)", *id,
                 spec->name(), spec->pipeline().stages(), spec->pipeline().micro_batches(),
                 spec->pipeline().micro_batch_size(), spec->steps());
    env_.scheduler->Notify();
    resp->set_job_id(*id);
    return grpc::Status::OK;
  }

  grpc::Status GetJob(grpc::ServerContext*, const v1::GetJobRequest* req, v1::Job* resp) override {
    TANDEM_RETURN_IF_BAD_VERSION(req);
    JobStore::HistoryWindow window;
    window.limit = req->history_limit();
    if (req->has_history_after_step()) window.after_step = req->history_after_step();
    auto job = env_.store->Get(req->job_id(), window);
    if (!job.ok()) return ToGrpcStatus(job.status());
    *resp = *std::move(job);
    return grpc::Status::OK;
  }

  grpc::Status ListJobs(grpc::ServerContext*, const v1::ListJobsRequest* req,
                        v1::ListJobsResponse* resp) override {
    TANDEM_RETURN_IF_BAD_VERSION(req);
    for (auto& job : env_.store->List()) *resp->add_jobs() = std::move(job);
    return grpc::Status::OK;
  }

  grpc::Status CancelJob(grpc::ServerContext*, const v1::CancelJobRequest* req,
                         v1::Job* resp) override {
    TANDEM_RETURN_IF_BAD_VERSION(req);
    auto job = env_.scheduler->Cancel(req->job_id());
    if (!job.ok()) return ToGrpcStatus(job.status());
    *resp = *std::move(job);
    return grpc::Status::OK;
  }

  grpc::Status WatchJob(grpc::ServerContext* ctx, const v1::WatchJobRequest* req,
                        grpc::ServerWriter<v1::JobEvent>* writer) override {
    TANDEM_RETURN_IF_BAD_VERSION(req);
    // Take the event cursor before the snapshot: an event in between is sent twice at most,
    // never lost.
    auto head = env_.store->WaitEvents(req->job_id(), std::numeric_limits<int64_t>::max(),
                                       absl::ZeroDuration());
    if (!head.ok()) return ToGrpcStatus(head.status());
    auto job = env_.store->Get(req->job_id(), /*with_history=*/false);
    if (!job.ok()) return ToGrpcStatus(job.status());
    v1::JobEvent snapshot;
    snapshot.set_kind(v1::JobEvent::SNAPSHOT);
    snapshot.set_job_id(job->id());
    snapshot.set_state(job->state());
    snapshot.set_reason(job->reason());
    snapshot.set_total_steps(job->total_steps());
    *snapshot.mutable_job() = *job;
    if (!writer->Write(snapshot)) return grpc::Status::OK;
    if (IsTerminal(job->state())) return grpc::Status::OK;
    int64_t cursor = head->cursor;
    absl::Time last_write = absl::InfinitePast();
    while (!ctx->IsCancelled()) {
      // At most one write batch per kWatchBatchInterval per stream: a job that steps many
      // times a second sends its events in batches instead of waking every watcher (and its
      // client) for each step.
      if (absl::Duration wait = last_write + kWatchBatchInterval - absl::Now();
          wait > absl::ZeroDuration()) {
        absl::SleepFor(wait);
        if (ctx->IsCancelled()) break;
      }
      auto batch = env_.store->WaitEvents(req->job_id(), cursor, absl::Milliseconds(500));
      if (!batch.ok()) return ToGrpcStatus(batch.status());
      for (size_t i = 0; i < batch->events.size(); ++i) {
        grpc::WriteOptions options;
        if (i + 1 < batch->events.size()) options.set_buffer_hint();  // one flush per batch
        if (!writer->Write(batch->events[i], options)) return grpc::Status::OK;
      }
      if (!batch->events.empty()) last_write = absl::Now();
      cursor = batch->cursor;
      if (batch->ended) return grpc::Status::OK;
    }
    return grpc::Status(grpc::StatusCode::CANCELLED, "watch cancelled");
  }

  grpc::Status ExportModel(grpc::ServerContext* ctx, const v1::ExportModelRequest* req,
                           grpc::ServerWriter<v1::ExportChunk>* writer) override {
    TANDEM_RETURN_IF_BAD_VERSION(req);
    auto job = env_.store->Get(req->job_id(), /*with_history=*/false);
    if (!job.ok()) return ToGrpcStatus(job.status());
    if (env_.checkpoints == nullptr || !env_.checkpoints->enabled()) {
      return ToGrpcStatus(absl::FailedPreconditionError(
          "export needs checkpoints: start tandem-coordinator with --data-root"));
    }
    auto step = env_.checkpoints->Latest(job->id());
    if (!step.ok()) return ToGrpcStatus(step.status());
    const std::string path = env_.checkpoints->Dir(job->id(), *step) + "/export-hf.safetensors";
    if (!std::filesystem::exists(path)) {
      auto reader = env_.checkpoints->Open(job->id(), *step);
      if (!reader.ok()) return ToGrpcStatus(reader.status());
      if (absl::Status s = ExportHfSafetensors(**reader, job->spec().model(), path); !s.ok()) {
        return ToGrpcStatus(s);
      }
    }
    std::ifstream in(path, std::ios::binary);
    const int64_t total = static_cast<int64_t>(std::filesystem::file_size(path));
    std::vector<char> buffer(1 << 20);
    bool first = true;
    while (in) {
      in.read(buffer.data(), static_cast<std::streamsize>(buffer.size()));
      const std::streamsize n = in.gcount();
      if (n <= 0 && !first) break;
      v1::ExportChunk chunk;
      chunk.set_data(buffer.data(), static_cast<size_t>(std::max<std::streamsize>(n, 0)));
      if (first) {
        chunk.set_total_bytes(total);
        chunk.set_step(*step);
        first = false;
      }
      if (ctx->IsCancelled() || !writer->Write(chunk)) return grpc::Status::OK;
    }
    return grpc::Status::OK;
  }

  grpc::Status ListWorkers(grpc::ServerContext*, const v1::ListWorkersRequest* req,
                           v1::ListWorkersResponse* resp) override {
    TANDEM_RETURN_IF_BAD_VERSION(req);
    const auto now = Clock::now();
    for (const WorkerRecord& w : env_.registry->List()) *resp->add_workers() = InfoOf(w, now);
    return grpc::Status::OK;
  }

  grpc::Status GetWorker(grpc::ServerContext*, const v1::GetWorkerRequest* req,
                         v1::WorkerInfo* resp) override {
    TANDEM_RETURN_IF_BAD_VERSION(req);
    std::vector<std::string> ids;
    for (const WorkerRecord& w : env_.registry->List()) {
      if (w.id == req->worker_id()) {
        *resp = InfoOf(w, Clock::now());
        return grpc::Status::OK;
      }
      ids.push_back(w.id);
    }
    return grpc::Status(grpc::StatusCode::NOT_FOUND,
                        absl::StrCat("no worker '", req->worker_id(), "'; registered: ",
                                     ids.empty() ? "none" : absl::StrJoin(ids, ", ")));
  }

  grpc::Status GetJobTrace(grpc::ServerContext*, const v1::GetJobTraceRequest* req,
                           v1::GetJobTraceResponse* resp) override {
    TANDEM_RETURN_IF_BAD_VERSION(req);
    auto job = env_.store->Get(req->job_id(), /*with_history=*/false);
    if (!job.ok()) return ToGrpcStatus(job.status());
    auto timings = env_.store->GetTimings(req->job_id());
    if (!timings.ok()) return ToGrpcStatus(timings.status());
    auto trace = RenderJobTrace(*job, *timings, *req);
    if (!trace.ok()) return ToGrpcStatus(trace.status());
    *resp = *std::move(trace);
    return grpc::Status::OK;
  }

  grpc::Status ProfileModel(grpc::ServerContext*, const v1::ProfileModelRequest* req,
                            v1::ModelProfile* resp) override {
    TANDEM_RETURN_IF_BAD_VERSION(req);
    if (env_.profiles == nullptr || env_.clients == nullptr) {
      return ToGrpcStatus(absl::UnimplementedError("this coordinator does not profile models"));
    }
    const v1::JobSpec spec = WithDefaults(req->spec());
    if (absl::Status s = ValidateJobSpec(spec); !s.ok()) return ToGrpcStatus(s);
    absl::StatusOr<v1::ModelProfile> profile = tandem::coordinator::ProfileModel(
        spec, *env_.registry, *env_.clients, *env_.profiles, absl::Seconds(300), req->refresh(),
        env_.rendezvous, env_.speed_checks);
    if (!profile.ok()) return ToGrpcStatus(profile.status());
    *resp = *std::move(profile);
    return grpc::Status::OK;
  }

  grpc::Status PlanJob(grpc::ServerContext*, const v1::PlanJobRequest* req,
                       v1::PlanJobResponse* resp) override {
    TANDEM_RETURN_IF_BAD_VERSION(req);
    if (env_.profiles == nullptr || env_.clients == nullptr) {
      return ToGrpcStatus(absl::UnimplementedError("this coordinator does not profile models"));
    }
    const v1::JobSpec spec = WithDefaults(req->spec());
    if (absl::Status s = ValidateJobSpec(spec); !s.ok()) return ToGrpcStatus(s);
    // Each micro-batch size's profile as ProfileModel gets it: cached, or measured on an idle
    // worker. A size that cannot be measured makes its candidates infeasible, saying why.
    std::string speed_check;
    *resp = SearchPlanJob(spec, [&](const v1::JobSpec& s) {
      absl::StatusOr<v1::ModelProfile> p = tandem::coordinator::ProfileModel(
          s, *env_.registry, *env_.clients, *env_.profiles, absl::Seconds(300),
          /*refresh=*/false, env_.rendezvous, env_.speed_checks);
      if (p.ok() && speed_check.empty()) speed_check = p->speed_check();
      return p;
    });
    resp->set_profile_speed_check(speed_check);
    return grpc::Status::OK;
  }

 private:
  ServiceEnv env_;
};

class WorkerRegistryServiceImpl final : public v1::WorkerRegistry::Service {
 public:
  explicit WorkerRegistryServiceImpl(const ServiceEnv& env) : env_(env) {}

  grpc::Status Register(grpc::ServerContext*, const v1::RegisterRequest* req,
                        v1::RegisterResponse* resp) override {
    TANDEM_RETURN_IF_BAD_VERSION(req);
    auto id = env_.registry->Register(*req);
    if (!id.ok()) return ToGrpcStatus(id.status());
    spdlog::info("worker {} registered: {} device {} threads {} version {}", *id, req->address(),
                 req->device(), req->threads(), req->version());
    resp->set_worker_id(*id);
    resp->set_heartbeat_interval_ms(
        static_cast<int32_t>(env_.registry->heartbeat_interval().count()));
    env_.scheduler->Notify();
    return grpc::Status::OK;
  }

  grpc::Status Heartbeat(grpc::ServerContext*, const v1::HeartbeatRequest* req,
                         v1::HeartbeatResponse* resp) override {
    const int64_t received_us = UnixMicros();
    TANDEM_RETURN_IF_BAD_VERSION(req);
    HeartbeatClock clock;
    clock.worker_send_us = req->worker_unix_us();
    clock.coordinator_receive_us = received_us;
    if (req->has_previous_round()) {
      const v1::ClockSample& p = req->previous_round();
      clock.previous_round =
          ClockRoundTrip{p.worker_send_unix_us(), p.coordinator_receive_unix_us(),
                         p.coordinator_send_unix_us(), p.worker_receive_unix_us()};
    }
    if (absl::Status s = env_.registry->Heartbeat(req->worker_id(), clock); !s.ok()) {
      return ToGrpcStatus(s);
    }
    resp->set_coordinator_receive_unix_us(received_us);
    resp->set_heartbeat_interval_ms(
        static_cast<int32_t>(env_.registry->heartbeat_interval().count()));
    resp->set_coordinator_unix_us(UnixMicros());
    return grpc::Status::OK;
  }

 private:
  ServiceEnv env_;
};

class RendezvousServiceImpl final : public v1::Rendezvous::Service {
 public:
  explicit RendezvousServiceImpl(const ServiceEnv& env) : env_(env) {}

  grpc::Status Set(grpc::ServerContext*, const v1::RendezvousSetRequest* req,
                   v1::RendezvousSetResponse*) override {
    TANDEM_RETURN_IF_BAD_VERSION(req);
    return ToGrpcStatus(env_.rendezvous->Set(req->key(), req->value()));
  }

  grpc::Status Get(grpc::ServerContext* ctx, const v1::RendezvousGetRequest* req,
                   v1::RendezvousGetResponse* resp) override {
    TANDEM_RETURN_IF_BAD_VERSION(req);
    if (req->keys().empty()) {
      return ToGrpcStatus(absl::InvalidArgumentError("rendezvous get: keys is empty"));
    }
    // Never wait past the caller's own deadline, nor more than 10 minutes.
    absl::Duration wait = absl::Milliseconds(std::clamp<int64_t>(req->wait_ms(), 0, 600000));
    const auto left = ctx->deadline() - std::chrono::system_clock::now();
    wait = std::min(wait, absl::FromChrono(left));
    std::vector<std::string> keys(req->keys().begin(), req->keys().end());
    auto values = env_.rendezvous->Get(keys, wait);
    if (!values.ok()) return ToGrpcStatus(values.status());
    for (auto& v : *values) resp->add_values(std::move(v));
    return grpc::Status::OK;
  }

 private:
  ServiceEnv env_;
};

class CheckpointsServiceImpl final : public v1::Checkpoints::Service {
 public:
  explicit CheckpointsServiceImpl(const ServiceEnv& env) : env_(env) {}

  grpc::Status ReadTensors(grpc::ServerContext* ctx, const v1::ReadTensorsRequest* req,
                           grpc::ServerWriter<v1::TensorChunk>* writer) override {
    TANDEM_RETURN_IF_BAD_VERSION(req);
    if (env_.checkpoints == nullptr) {
      return ToGrpcStatus(absl::FailedPreconditionError("this coordinator keeps no checkpoints"));
    }
    auto reader = env_.checkpoints->Open(req->checkpoint().job_id(), req->checkpoint().step());
    if (!reader.ok()) return ToGrpcStatus(reader.status());
    v1::TensorChunk index;
    std::vector<absl::Span<const uint8_t>> data;
    for (const std::string& name : req->names()) {
      const TensorInfo* info = (*reader)->Find(name);
      auto bytes = (*reader)->Data(name);
      if (info == nullptr || !bytes.ok()) return ToGrpcStatus(bytes.status());
      v1::TensorMeta* m = index.add_index();
      m->set_name(info->name);
      m->set_dtype(info->dtype);
      for (int64_t d : info->shape) m->add_shape(d);
      data.push_back(*bytes);
    }
    if (!writer->Write(index)) return grpc::Status::OK;
    constexpr size_t kChunkBytes = 1 << 20;
    for (const auto& span : data) {
      for (size_t off = 0; off < span.size(); off += kChunkBytes) {
        v1::TensorChunk chunk;
        chunk.set_data(reinterpret_cast<const char*>(span.data()) + off,
                       std::min(kChunkBytes, span.size() - off));
        if (ctx->IsCancelled() || !writer->Write(chunk)) return grpc::Status::OK;
      }
    }
    return grpc::Status::OK;
  }

 private:
  ServiceEnv env_;
};

}  // namespace

std::unique_ptr<grpc::Service> MakeCheckpointsService(const ServiceEnv& env) {
  return std::make_unique<CheckpointsServiceImpl>(env);
}

std::unique_ptr<grpc::Service> MakeCoordinatorService(const ServiceEnv& env) {
  return std::make_unique<CoordinatorServiceImpl>(env);
}
std::unique_ptr<grpc::Service> MakeWorkerRegistryService(const ServiceEnv& env) {
  return std::make_unique<WorkerRegistryServiceImpl>(env);
}
std::unique_ptr<grpc::Service> MakeRendezvousService(const ServiceEnv& env) {
  return std::make_unique<RendezvousServiceImpl>(env);
}

}  // namespace tandem::coordinator
