// The worker's gRPC side: StageWorker service, registration/heartbeat client and the
// rendezvous store, against an in-process fake coordinator; and the tandem-worker binary
// (registration, health, SIGTERM) as a real process.
#include "worker/stage_service.h"

#include <cblas.h>
#include <gloo/common/error.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/rpc.h"
#include "common/status_macros.h"
#include "common/version.h"
#include "tandem/v1/coordinator.grpc.pb.h"
#include "tests/worker/pipeline_test_util.h"
#include "worker/registration.h"
#include "worker/transport/gloo_transport.h"
#include "worker/transport/grpc_rendezvous_store.h"

namespace tandem::worker {
namespace {

using std::chrono::milliseconds;
using testing::MakePrograms;
using testing::TinyJob;

// The coordinator's worker-facing services, just enough for the worker.
class FakeRegistry final : public v1::WorkerRegistry::Service {
 public:
  grpc::Status Register(grpc::ServerContext*, const v1::RegisterRequest* req,
                        v1::RegisterResponse* resp) override {
    absl::MutexLock lock(&mu_);
    const std::string id = "w-" + std::to_string(++registrations_);
    known_[id] = req->address();
    resp->set_worker_id(id);
    resp->set_heartbeat_interval_ms(50);
    return grpc::Status::OK;
  }
  grpc::Status Heartbeat(grpc::ServerContext*, const v1::HeartbeatRequest* req,
                         v1::HeartbeatResponse* resp) override {
    absl::MutexLock lock(&mu_);
    if (!known_.count(req->worker_id())) return grpc::Status(grpc::StatusCode::NOT_FOUND, "who?");
    ++heartbeats_;
    last_ = *req;
    resp->set_heartbeat_interval_ms(told_interval_ms_);
    return grpc::Status::OK;
  }
  void Forget() {
    absl::MutexLock lock(&mu_);
    known_.clear();
  }
  // Waits until `pred` holds (or 5 s).
  bool WaitFor(std::function<bool(const FakeRegistry&)> pred) {
    for (int i = 0; i < 500; ++i) {
      {
        absl::MutexLock lock(&mu_);
        if (pred(*this)) return true;
      }
      std::this_thread::sleep_for(milliseconds(10));
    }
    return false;
  }

  absl::Mutex mu_;
  int registrations_ = 0;
  int heartbeats_ = 0;
  int told_interval_ms_ = 0;  // HeartbeatResponse.heartbeat_interval_ms (0: keep)
  std::map<std::string, std::string> known_;
  v1::HeartbeatRequest last_;
};

class FakeRendezvous final : public v1::Rendezvous::Service {
 public:
  grpc::Status Set(grpc::ServerContext*, const v1::RendezvousSetRequest* req,
                   v1::RendezvousSetResponse*) override {
    absl::MutexLock lock(&mu_);
    kv_[req->key()] = req->value();
    return grpc::Status::OK;
  }
  grpc::Status Get(grpc::ServerContext*, const v1::RendezvousGetRequest* req,
                   v1::RendezvousGetResponse* resp) override {
    absl::MutexLock lock(&mu_);
    // Called by the Condition with mu_ held (the analysis cannot see that through a lambda).
    auto all = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      for (const auto& k : req->keys()) {
        if (!kv_.count(k)) return false;
      }
      return true;
    };
    mu_.AwaitWithTimeout(absl::Condition(&all), absl::Milliseconds(req->wait_ms()));
    if (!all()) return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "keys missing");
    for (const auto& k : req->keys()) resp->add_values(kv_[k]);
    return grpc::Status::OK;
  }

 private:
  absl::Mutex mu_;
  std::map<std::string, std::string> kv_ ABSL_GUARDED_BY(mu_);
};

struct Server {
  std::unique_ptr<grpc::Server> server;
  int port = 0;
  std::string address() const { return "127.0.0.1:" + std::to_string(port); }
};

Server Serve(std::vector<grpc::Service*> services, int max_receive_bytes = 0) {
  grpc::ServerBuilder b;
  Server s;
  if (max_receive_bytes > 0) b.SetMaxReceiveMessageSize(max_receive_bytes);
  b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &s.port);
  for (auto* svc : services) b.RegisterService(svc);
  s.server = b.BuildAndStart();
  return s;
}

TransportFactory GrpcFactory(std::shared_ptr<grpc::Channel> coordinator) {
  return [coordinator](
             const v1::StageProgram& p,
             const std::atomic<bool>& cancelled) -> absl::StatusOr<std::unique_ptr<Transport>> {
    GrpcRendezvousStoreOptions so;
    so.prefix = p.rendezvous_prefix();
    so.cancelled = &cancelled;
    so.wait_timeout = milliseconds(5000);
    GrpcRendezvousStore store(coordinator, so);
    GlooTransportOptions o;
    o.rank = p.rank();
    o.size = p.num_ranks();
    o.connect_timeout = milliseconds(5000);
    ASSIGN_OR_RETURN(auto t, GlooTransport::Connect(o, store));
    return std::unique_ptr<Transport>(std::move(t));
  };
}

class StageServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    openblas_set_num_threads(1);
    coordinator_ = Serve({&registry_, &rendezvous_});
    channel_ = MakeInsecureChannel(coordinator_.address());
  }
  void TearDown() override { coordinator_.server->Shutdown(); }

  FakeRegistry registry_;
  FakeRendezvous rendezvous_;
  Server coordinator_;
  std::shared_ptr<grpc::Channel> channel_;
};

TEST_F(StageServiceTest, TwoStageJobOverGrpc) {
  StageManager m0({}, GrpcFactory(channel_)), m1({}, GrpcFactory(channel_));
  StageWorkerService s0(&m0), s1(&m1);
  Server w0 = Serve({&s0}), w1 = Serve({&s1});
  auto stub0 = v1::StageWorker::NewStub(MakeInsecureChannel(w0.address()));
  auto stub1 = v1::StageWorker::NewStub(MakeInsecureChannel(w1.address()));
  const auto programs = MakePrograms(TinyJob(), 2, "1f1b");

  auto configure = [](v1::StageWorker::Stub* stub, const v1::StageProgram& p) {
    grpc::ClientContext ctx;
    SetDeadline(ctx, milliseconds(20000));
    v1::ConfigureRequest req;
    req.set_protocol_version(kProtocolVersion);
    *req.mutable_program() = p;
    v1::ConfigureResponse resp;
    return stub->Configure(&ctx, req, &resp);
  };
  auto c1 = std::async(std::launch::async, configure, stub1.get(), programs[1]);
  grpc::Status st0 = configure(stub0.get(), programs[0]);
  grpc::Status st1 = c1.get();
  ASSERT_TRUE(st0.ok()) << st0.error_message();
  ASSERT_TRUE(st1.ok()) << st1.error_message();

  auto run = [](v1::StageWorker::Stub* stub, int64_t step, v1::RunStepResponse* resp) {
    grpc::ClientContext ctx;
    SetDeadline(ctx, milliseconds(20000));
    v1::RunStepRequest req;
    req.set_protocol_version(kProtocolVersion);
    req.set_job_id("job-1");
    req.set_step(step);
    return stub->RunStep(&ctx, req, resp);
  };
  v1::RunStepResponse r0, r1;
  auto f1 = std::async(std::launch::async, run, stub1.get(), 0, &r1);
  ASSERT_TRUE(run(stub0.get(), 0, &r0).ok());
  ASSERT_TRUE(f1.get().ok());
  EXPECT_TRUE(r1.report().has_loss());
  EXPECT_NEAR(r1.report().loss(), std::log(256.0), 0.1);
  EXPECT_FALSE(r0.report().has_loss());
  EXPECT_TRUE(r0.report().grads_finite());
  EXPECT_GT(r0.report().grad_norm_sq(), 0.0);
  for (v1::StageWorker::Stub* stub : {stub0.get(), stub1.get()}) {
    grpc::ClientContext ctx;
    SetDeadline(ctx, milliseconds(5000));
    v1::ApplyStepRequest req;
    req.set_protocol_version(kProtocolVersion);
    req.set_job_id("job-1");
    req.set_step(0);
    req.set_learning_rate(0.01f);
    req.set_grad_scale(1.0f);
    v1::ApplyStepResponse resp;
    ASSERT_TRUE(stub->ApplyStep(&ctx, req, &resp).ok());
  }

  // Status, then Abort while stage 1 blocks, over RPC.
  {
    grpc::ClientContext ctx;
    SetDeadline(ctx, milliseconds(5000));
    v1::GetStatusRequest req;
    req.set_protocol_version(kProtocolVersion);
    v1::WorkerStatus ws;
    ASSERT_TRUE(stub1->GetStatus(&ctx, req, &ws).ok());
    EXPECT_EQ(ws.state(), v1::BUSY);
    EXPECT_EQ(ws.stage(), 1);
    EXPECT_EQ(ws.last_step(), 0);
  }
  v1::RunStepResponse blocked_resp;
  auto blocked = std::async(std::launch::async, run, stub1.get(), 1, &blocked_resp);
  std::this_thread::sleep_for(milliseconds(100));
  {
    grpc::ClientContext ctx;
    SetDeadline(ctx, milliseconds(5000));
    v1::AbortRequest req;
    req.set_protocol_version(kProtocolVersion);
    req.set_job_id("job-1");
    v1::AbortResponse resp;
    ASSERT_TRUE(stub1->Abort(&ctx, req, &resp).ok());
  }
  EXPECT_EQ(blocked.get().error_code(), grpc::StatusCode::ABORTED);

  // Protocol version and bad input are refused, and the worker stays up.
  {
    grpc::ClientContext ctx;
    SetDeadline(ctx, milliseconds(5000));
    v1::ConfigureRequest req;  // protocol_version 0
    v1::ConfigureResponse resp;
    EXPECT_EQ(stub1->Configure(&ctx, req, &resp).error_code(),
              grpc::StatusCode::FAILED_PRECONDITION);
  }
  v1::StageProgram bad = programs[1];
  bad.mutable_chunks(0)->set_layer_begin(-3);
  EXPECT_EQ(configure(stub1.get(), bad).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  v1::RunStepResponse none;
  EXPECT_EQ(run(stub1.get(), 2, &none).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  m0.Shutdown();
  w0.server->Shutdown();
  w1.server->Shutdown();
}

// ProbeLink over gRPC, through the real rendezvous store: both ends time every size; a peer
// that never shows up ends in DEADLINE_EXCEEDED soon after the timeout; bad input is refused;
// the workers keep serving.
TEST_F(StageServiceTest, ProbeLinkOverGrpc) {
  StageManager m0({}, GrpcFactory(channel_)), m1({}, GrpcFactory(channel_));
  StageWorkerService s0(&m0), s1(&m1);
  Server w0 = Serve({&s0}), w1 = Serve({&s1});
  auto stub0 = v1::StageWorker::NewStub(MakeInsecureChannel(w0.address()));
  auto stub1 = v1::StageWorker::NewStub(MakeInsecureChannel(w1.address()));
  auto probe = [](v1::StageWorker::Stub* stub, const std::string& prefix, int rank,
                  int64_t timeout_ms, v1::ProbeLinkResponse* resp) {
    grpc::ClientContext ctx;
    SetDeadline(ctx, milliseconds(timeout_ms + 10000));
    v1::ProbeLinkRequest req;
    req.set_protocol_version(kProtocolVersion);
    req.set_rendezvous_prefix(prefix);
    req.set_rank(rank);
    for (int64_t bytes : {4096, 1 << 20}) req.add_sizes(bytes);
    req.set_repeats(3);
    req.set_timeout_ms(timeout_ms);
    return stub->ProbeLink(&ctx, req, resp);
  };
  v1::ProbeLinkResponse r0, r1;
  auto f1 = std::async(std::launch::async, probe, stub1.get(), "probe-1/", 1, 10000, &r1);
  grpc::Status st0 = probe(stub0.get(), "probe-1/", 0, 10000, &r0);
  grpc::Status st1 = f1.get();
  ASSERT_TRUE(st0.ok()) << st0.error_message();
  ASSERT_TRUE(st1.ok()) << st1.error_message();
  for (const v1::ProbeLinkResponse* r : {&r0, &r1}) {
    ASSERT_EQ(r->samples_size(), 2);
    EXPECT_EQ(r->samples(0).bytes(), 4096);
    EXPECT_EQ(r->samples(1).bytes(), 1 << 20);
    EXPECT_EQ(r->samples(1).round_trip_seconds_size(), 3);
    EXPECT_GT(r->samples(0).one_way_seconds(), 0.0);
  }
  EXPECT_EQ(r1.samples(0).rank(), 1);

  v1::ProbeLinkResponse none;
  const auto t0 = std::chrono::steady_clock::now();
  grpc::Status alone = probe(stub0.get(), "probe-2/", 0, 1000, &none);
  EXPECT_EQ(alone.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << alone.error_message();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, milliseconds(3500));
  {
    grpc::ClientContext ctx;
    SetDeadline(ctx, milliseconds(5000));
    v1::ProbeLinkRequest req;  // protocol_version 0
    EXPECT_EQ(stub0->ProbeLink(&ctx, req, &none).error_code(),
              grpc::StatusCode::FAILED_PRECONDITION);
  }
  {
    grpc::ClientContext ctx;
    SetDeadline(ctx, milliseconds(5000));
    v1::ProbeLinkRequest req;
    req.set_protocol_version(kProtocolVersion);
    req.set_rendezvous_prefix("probe-3/");
    req.set_rank(3);
    req.add_sizes(64);
    grpc::Status bad = stub0->ProbeLink(&ctx, req, &none);
    EXPECT_EQ(bad.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_NE(bad.error_message().find("rank"), std::string::npos) << bad.error_message();
  }
  // Still serving: another probe between the same workers.
  auto f2 = std::async(std::launch::async, probe, stub1.get(), "probe-4/", 1, 10000, &r1);
  EXPECT_TRUE(probe(stub0.get(), "probe-4/", 0, 10000, &r0).ok());
  EXPECT_TRUE(f2.get().ok());
  w0.server->Shutdown();
  w1.server->Shutdown();
}

TEST_F(StageServiceTest, RendezvousStoreWaitsAndCancels) {
  std::atomic<bool> cancelled{false};
  GrpcRendezvousStoreOptions o;
  o.prefix = "p/";
  o.cancelled = &cancelled;
  GrpcRendezvousStore store(channel_, o);
  store.set("a", {'x', 'y'});
  EXPECT_EQ(store.get("a"), (std::vector<char>{'x', 'y'}));
  EXPECT_THROW(store.wait({"missing"}, milliseconds(300)), gloo::IoException);
  auto waiting = std::async(std::launch::async, [&] {
    try {
      store.wait({"never"}, milliseconds(20000));
      return std::string("returned");
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
  });
  std::this_thread::sleep_for(milliseconds(100));
  cancelled = true;
  ASSERT_EQ(waiting.wait_for(std::chrono::seconds(3)), std::future_status::ready);
  EXPECT_NE(waiting.get().find("cancelled"), std::string::npos);
}

TEST_F(StageServiceTest, RegistersHeartbeatsAndReRegisters) {
  StageManager manager({}, nullptr);
  RegistrationOptions ro;
  ro.address = "127.0.0.1:1";
  ro.device = "cpu";
  RegistrationClient client(channel_, ro, &manager);
  client.Start();
  ASSERT_TRUE(registry_.WaitFor([](const FakeRegistry& r) { return r.heartbeats_ >= 2; }));
  EXPECT_EQ(client.worker_id(), "w-1");
  EXPECT_EQ(manager.GetStatus().worker_id(), "w-1");
  {
    absl::MutexLock lock(&registry_.mu_);
    EXPECT_EQ(registry_.last_.state(), v1::IDLE);
    EXPECT_EQ(registry_.known_["w-1"], "127.0.0.1:1");
  }
  registry_.Forget();  // the coordinator restarted
  ASSERT_TRUE(registry_.WaitFor([](const FakeRegistry& r) { return r.registrations_ >= 2; }));
  ASSERT_TRUE(
      registry_.WaitFor([](const FakeRegistry& r) { return r.last_.worker_id() == "w-2"; }));
  client.Stop();
}

// The coordinator stretches the heartbeat interval as its gang grows (HeartbeatResponse): the
// worker follows it from the next heartbeat on.
TEST_F(StageServiceTest, HeartbeatsFollowTheIntervalTheCoordinatorTells) {
  StageManager manager({}, nullptr);
  RegistrationOptions ro;
  ro.address = "127.0.0.1:1";
  ro.device = "cpu";
  RegistrationClient client(channel_, ro, &manager);
  client.Start();
  // Every 50 ms (the Register answer's interval) at first.
  ASSERT_TRUE(registry_.WaitFor([](const FakeRegistry& r) { return r.heartbeats_ >= 3; }));
  int told_at = 0;
  {
    absl::MutexLock lock(&registry_.mu_);
    registry_.told_interval_ms_ = 5000;
    told_at = registry_.heartbeats_;
  }
  // The next heartbeat learns 5 s; after it (and at most one already on its way) none come for
  // 0.8 s, where 50 ms would have sent 16.
  ASSERT_TRUE(
      registry_.WaitFor([told_at](const FakeRegistry& r) { return r.heartbeats_ >= told_at + 1; }));
  std::this_thread::sleep_for(milliseconds(100));
  int before = 0;
  {
    absl::MutexLock lock(&registry_.mu_);
    before = registry_.heartbeats_;
  }
  std::this_thread::sleep_for(milliseconds(800));
  {
    absl::MutexLock lock(&registry_.mu_);
    EXPECT_LE(registry_.heartbeats_, before + 1);
  }
  client.Stop();
}

// Sends `bytes` as the raw request of `method` (e.g. "/tandem.v1.StageWorker/Configure").
grpc::Status RawCall(const std::shared_ptr<grpc::Channel>& channel, const std::string& method,
                     const std::string& bytes) {
  grpc::GenericStub generic(channel);
  grpc::ClientContext ctx;
  SetDeadline(ctx, milliseconds(10000));
  grpc::Slice slice(bytes);
  grpc::ByteBuffer request(&slice, 1), response;
  std::promise<grpc::Status> done;
  generic.UnaryCall(&ctx, method, grpc::StubOptions(), &request, &response,
                    [&](grpc::Status st) { done.set_value(st); });
  return done.get_future().get();
}

grpc::Status CallGetStatus(v1::StageWorker::Stub* stub, v1::WorkerStatus* ws) {
  grpc::ClientContext ctx;
  SetDeadline(ctx, milliseconds(5000));
  v1::GetStatusRequest req;
  req.set_protocol_version(kProtocolVersion);
  return stub->GetStatus(&ctx, req, ws);
}

// Every kind of bad request a worker can get over gRPC, each answered with its code while the
// worker keeps serving: the next valid call succeeds.
void ExpectBadRequestsRefused(const std::shared_ptr<grpc::Channel>& channel, size_t oversized,
                              bool check_malformed_program) {
  auto stub = v1::StageWorker::NewStub(channel);
  auto still_serving = [&](const char* after) {
    v1::WorkerStatus ws;
    grpc::Status st = CallGetStatus(stub.get(), &ws);
    EXPECT_TRUE(st.ok()) << "after " << after << ": " << st.error_message();
  };
  auto run = [&](const std::string& job, int64_t step, uint32_t version) {
    grpc::ClientContext ctx;
    SetDeadline(ctx, milliseconds(10000));
    v1::RunStepRequest req;
    req.set_protocol_version(version);
    req.set_job_id(job);
    req.set_step(step);
    v1::RunStepResponse resp;
    return stub->RunStep(&ctx, req, &resp);
  };
  // A RunStep and an ApplyStep before any Configure.
  grpc::Status st = run("job-1", 0, kProtocolVersion);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << st.error_message();
  EXPECT_NE(st.error_message().find("not configured"), std::string::npos) << st.error_message();
  still_serving("RunStep before Configure");
  {
    grpc::ClientContext ctx;
    SetDeadline(ctx, milliseconds(5000));
    v1::ApplyStepRequest req;
    req.set_protocol_version(kProtocolVersion);
    req.set_job_id("job-1");
    v1::ApplyStepResponse resp;
    EXPECT_EQ(stub->ApplyStep(&ctx, req, &resp).error_code(),
              grpc::StatusCode::FAILED_PRECONDITION);
  }
  still_serving("ApplyStep before Configure");
  // Wrong protocol versions, named both ways.
  st = run("job-1", 0, kProtocolVersion + 7);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(st.error_message().find("protocol version " + std::to_string(kProtocolVersion + 7)),
            std::string::npos)
      << st.error_message();
  EXPECT_NE(
      st.error_message().find("speaks tandem.v1 protocol " + std::to_string(kProtocolVersion)),
      std::string::npos)
      << st.error_message();
  st = run("job-1", 0, 0);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(st.error_message().find("no protocol_version"), std::string::npos);
  still_serving("a wrong protocol version");
  // Bytes that are no protobuf message at all.
  for (const char* method : {"/tandem.v1.StageWorker/Configure", "/tandem.v1.StageWorker/RunStep",
                             "/tandem.v1.StageWorker/ApplyStep"}) {
    st = RawCall(channel, method, std::string("\xff\xff\xff\xff\x0f garbage", 14));
    EXPECT_FALSE(st.ok()) << method;
    EXPECT_NE(st.error_code(), grpc::StatusCode::UNAVAILABLE) << method << st.error_message();
    still_serving(method);
  }
  // An unknown method.
  st = RawCall(channel, "/tandem.v1.StageWorker/Explode", "");
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNIMPLEMENTED);
  // Oversized: over the server's receive limit.
  st = run(std::string(oversized, 'j'), 0, kProtocolVersion);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << st.error_message();
  still_serving("an oversized request");
  if (check_malformed_program) {
    v1::StageProgram bad = MakePrograms(TinyJob(), 1, "gpipe")[0];
    bad.set_rank(3);
    grpc::ClientContext ctx;
    SetDeadline(ctx, milliseconds(5000));
    v1::ConfigureRequest req;
    req.set_protocol_version(kProtocolVersion);
    *req.mutable_program() = bad;
    v1::ConfigureResponse resp;
    st = stub->Configure(&ctx, req, &resp);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << st.error_message();
    EXPECT_NE(st.error_message().find("program.rank 3"), std::string::npos) << st.error_message();
    still_serving("a malformed program");
  }
}

// In process, with an explicit receive limit as the daemon sets one: then a configured job's
// misdirected and out-of-order calls.
TEST_F(StageServiceTest, BadRequestsGetTheirCodesAndTheWorkerKeepsServing) {
  StageManager m({}, GrpcFactory(channel_));
  StageWorkerService service(&m);
  constexpr int kLimit = 1 << 20;
  Server w = Serve({&service}, kLimit);
  auto channel = MakeInsecureChannel(w.address());
  ExpectBadRequestsRefused(channel, kLimit + 1024, /*check_malformed_program=*/true);

  auto stub = v1::StageWorker::NewStub(channel);
  {
    grpc::ClientContext ctx;
    SetDeadline(ctx, milliseconds(20000));
    v1::ConfigureRequest req;
    req.set_protocol_version(kProtocolVersion);
    *req.mutable_program() = MakePrograms(TinyJob(), 1, "gpipe")[0];
    v1::ConfigureResponse resp;
    grpc::Status st = stub->Configure(&ctx, req, &resp);
    ASSERT_TRUE(st.ok()) << st.error_message();
  }
  auto run = [&](const std::string& job, int64_t step) {
    grpc::ClientContext ctx;
    SetDeadline(ctx, milliseconds(20000));
    v1::RunStepRequest req;
    req.set_protocol_version(kProtocolVersion);
    req.set_job_id(job);
    req.set_step(step);
    v1::RunStepResponse resp;
    return stub->RunStep(&ctx, req, &resp);
  };
  auto apply = [&](const std::string& job, int64_t step) {
    grpc::ClientContext ctx;
    SetDeadline(ctx, milliseconds(5000));
    v1::ApplyStepRequest req;
    req.set_protocol_version(kProtocolVersion);
    req.set_job_id(job);
    req.set_step(step);
    req.set_learning_rate(0.01f);
    req.set_grad_scale(1.0f);
    v1::ApplyStepResponse resp;
    return stub->ApplyStep(&ctx, req, &resp);
  };
  // A step for another job: FAILED_PRECONDITION naming the job this worker holds.
  grpc::Status st = run("job-2", 0);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(st.error_message().find("it holds job job-1"), std::string::npos);
  EXPECT_EQ(apply("job-2", 0).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  // Negative, then a step, a duplicate and an earlier one.
  EXPECT_EQ(run("job-1", -4).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  ASSERT_TRUE(run("job-1", 2).ok());
  EXPECT_EQ(apply("job-1", 1).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  ASSERT_TRUE(apply("job-1", 2).ok());
  EXPECT_EQ(apply("job-1", 2).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(run("job-1", 2).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(run("job-1", 0).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  // The job goes on.
  st = run("job-1", 3);
  EXPECT_TRUE(st.ok()) << st.error_message();
  m.Shutdown();
  w.server->Shutdown();
}

// The real binary: registers, serves health, exits cleanly on SIGTERM.
TEST_F(StageServiceTest, BinaryRegistersAndStopsOnSigterm) {
  const std::string bin = std::string(TANDEM_BIN_DIR) + "/tandem-worker";
  if (!std::filesystem::exists(bin)) GTEST_SKIP() << bin << " not built";
  const std::string port_file =
      std::filesystem::temp_directory_path() / ("tandem_worker_port_" + std::to_string(getpid()));
  std::filesystem::remove(port_file);
  const std::string coord = "--coordinator=" + coordinator_.address();
  const std::string pf = "--port-file=" + port_file;
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    execl(bin.c_str(), bin.c_str(), coord.c_str(), pf.c_str(), "--log-level=warn",
          static_cast<char*>(nullptr));
    _exit(127);
  }
  ASSERT_TRUE(registry_.WaitFor([](const FakeRegistry& r) { return r.heartbeats_ >= 1; }));
  int port = 0;
  std::ifstream(port_file) >> port;
  ASSERT_GT(port, 0);
  {
    absl::MutexLock lock(&registry_.mu_);
    EXPECT_EQ(registry_.known_["w-1"], "127.0.0.1:" + std::to_string(port));
  }
  auto channel = MakeInsecureChannel("127.0.0.1:" + std::to_string(port));
  {
    // grpc.health.v1.Health/Check with an empty HealthCheckRequest; SERVING is 08 01.
    grpc::GenericStub generic(channel);
    grpc::ClientContext ctx;
    SetDeadline(ctx, milliseconds(5000));
    grpc::ByteBuffer request, response;
    grpc::Slice empty("", 0);
    request = grpc::ByteBuffer(&empty, 1);
    std::promise<grpc::Status> done;
    generic.UnaryCall(&ctx, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request,
                      &response, [&](grpc::Status st) { done.set_value(st); });
    grpc::Status st = done.get_future().get();
    ASSERT_TRUE(st.ok()) << st.error_message();
    std::vector<grpc::Slice> slices;
    ASSERT_TRUE(response.Dump(&slices).ok());
    std::string bytes;
    for (const auto& sl : slices)
      bytes.append(reinterpret_cast<const char*>(sl.begin()), sl.size());
    EXPECT_EQ(bytes, std::string("\x08\x01", 2));
  }
  {
    grpc::ClientContext ctx;
    SetDeadline(ctx, milliseconds(5000));
    v1::GetStatusRequest req;
    req.set_protocol_version(kProtocolVersion);
    v1::WorkerStatus ws;
    auto stub = v1::StageWorker::NewStub(channel);
    ASSERT_TRUE(stub->GetStatus(&ctx, req, &ws).ok());
    EXPECT_EQ(ws.worker_id(), "w-1");
    EXPECT_EQ(ws.state(), v1::IDLE);
    EXPECT_EQ(ws.device(), "cpu");
  }
  kill(pid, SIGTERM);
  int status = 0;
  pid_t waited = 0;
  for (int i = 0; i < 100 && waited == 0; ++i) {
    waited = waitpid(pid, &status, WNOHANG);
    if (waited == 0) std::this_thread::sleep_for(milliseconds(50));
  }
  if (waited != pid) {
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    FAIL() << "tandem-worker did not exit within 5 s of SIGTERM";
  }
  EXPECT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  std::filesystem::remove(port_file);
}

// The real daemon answers the same bad requests (its receive limit is 64 MiB) and keeps
// serving; it is still alive and exits cleanly afterwards.
TEST_F(StageServiceTest, BinaryRefusesBadRequestsAndKeepsServing) {
  const std::string bin = std::string(TANDEM_BIN_DIR) + "/tandem-worker";
  if (!std::filesystem::exists(bin)) GTEST_SKIP() << bin << " not built";
  const std::string port_file = std::filesystem::temp_directory_path() /
                                ("tandem_worker_bad_port_" + std::to_string(getpid()));
  std::filesystem::remove(port_file);
  const std::string coord = "--coordinator=" + coordinator_.address();
  const std::string pf = "--port-file=" + port_file;
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    execl(bin.c_str(), bin.c_str(), coord.c_str(), pf.c_str(), "--log-level=error",
          static_cast<char*>(nullptr));
    _exit(127);
  }
  ASSERT_TRUE(registry_.WaitFor([](const FakeRegistry& r) { return r.heartbeats_ >= 1; }));
  int port = 0;
  std::ifstream(port_file) >> port;
  ASSERT_GT(port, 0);
  auto channel = MakeInsecureChannel("127.0.0.1:" + std::to_string(port));
  ExpectBadRequestsRefused(channel, (64 << 20) + 4096, /*check_malformed_program=*/true);
  EXPECT_EQ(waitpid(pid, nullptr, WNOHANG), 0) << "tandem-worker died";
  kill(pid, SIGTERM);
  int status = 0;
  pid_t waited = 0;
  for (int i = 0; i < 100 && waited == 0; ++i) {
    waited = waitpid(pid, &status, WNOHANG);
    if (waited == 0) std::this_thread::sleep_for(milliseconds(50));
  }
  if (waited != pid) {
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    FAIL() << "tandem-worker did not exit within 5 s of SIGTERM";
  }
  EXPECT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  std::filesystem::remove(port_file);
}

}  // namespace
}  // namespace tandem::worker
