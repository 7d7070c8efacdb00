// The step relay's forwarding side against real gRPC servers on 127.0.0.1: every relayed
// worker is called once with its own subtree, its report (and what it relayed) comes back under
// its rank; the first failure is reported once, under the rank that failed (a deeper one when
// the failed worker was itself relaying); a worker that does not answer in time is named; and a
// malformed relay list is refused before anything is sent.
#include "worker/step_relay.h"

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/rpc.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem::worker {
namespace {

using ::testing::HasSubstr;
using namespace std::chrono_literals;

// A leaf worker: answers RunStep with a report of its rank, or as told.
class LeafService final : public v1::StageWorker::Service {
 public:
  explicit LeafService(int rank) : rank_(rank) {}
  grpc::Status RunStep(grpc::ServerContext* ctx, const v1::RunStepRequest* req,
                       v1::RunStepResponse* resp) override {
    {
      absl::MutexLock lock(&mu_);
      seen_.push_back(*req);
    }
    if (delay > 0ms) std::this_thread::sleep_for(delay);
    if (!fail.ok()) {
      if (relayed_rank >= 0) ctx->AddTrailingMetadata(kRelayedRankKey, absl::StrCat(relayed_rank));
      return ToGrpcStatus(fail);
    }
    resp->mutable_report()->set_rank(rank_);
    resp->mutable_report()->set_step(req->step());
    for (int r : relays) {
      v1::RelayedStep* s = resp->add_relayed();
      s->set_rank(r);
      s->mutable_report()->set_rank(r);
    }
    return grpc::Status::OK;
  }
  std::vector<v1::RunStepRequest> seen() {
    absl::MutexLock lock(&mu_);
    return seen_;
  }

  absl::Status fail;
  int relayed_rank = -1;    // with `fail`: the rank named in the trailer
  std::vector<int> relays;  // ranks it answers for besides its own
  std::chrono::milliseconds delay{0};

 private:
  const int rank_;
  absl::Mutex mu_;
  std::vector<v1::RunStepRequest> seen_;
};

struct Leaf {
  explicit Leaf(int rank) : service(rank) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&service);
    server = builder.BuildAndStart();
  }
  ~Leaf() { server->Shutdown(std::chrono::system_clock::now() + 1s); }
  std::string address() const { return absl::StrCat("127.0.0.1:", port); }
  LeafService service;
  int port = 0;
  std::unique_ptr<grpc::Server> server;
};

class StepRelayTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (int r = 1; r <= 3; ++r) leaves_.push_back(std::make_unique<Leaf>(r));
    for (auto& l : leaves_) ASSERT_GT(l->port, 0);
  }
  v1::RunStepRequest Request() {
    v1::RunStepRequest req;
    req.set_job_id("job-1");
    req.set_step(7);
    for (int i = 0; i < 3; ++i) {
      v1::StepRelay* node = req.add_relay();
      node->set_rank(i + 1);
      node->set_address(leaves_[i]->address());
    }
    return req;
  }
  struct Result {
    StepRelay::Outcome outcome;
    std::vector<std::pair<absl::Status, int>> failures;
  };
  Result Forward(const v1::RunStepRequest& req, std::chrono::milliseconds timeout = 10s) {
    auto result = std::make_shared<Result>();
    auto mu = std::make_shared<absl::Mutex>();
    absl::Notification done;
    relay_.Forward(
        req, std::chrono::system_clock::now() + timeout,
        [result, mu](const absl::Status& s, int rank) {
          absl::MutexLock lock(mu.get());
          result->failures.push_back({s, rank});
        },
        [&done, result, mu](StepRelay::Outcome o) {
          {
            absl::MutexLock lock(mu.get());
            result->outcome = std::move(o);
          }
          done.Notify();
        });
    EXPECT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(30)));
    absl::MutexLock lock(mu.get());
    return *result;
  }

  std::vector<std::unique_ptr<Leaf>> leaves_;
  StepRelay relay_{[](const std::string& address) { return MakeInsecureChannel(address); }};
};

TEST_F(StepRelayTest, EveryRelayedWorkerAnswersUnderItsRankWithItsOwnSubtree) {
  v1::RunStepRequest req = Request();
  // Leaf 1 relays on to ranks 4 and 5 (its answer carries them).
  v1::StepRelay* sub = req.mutable_relay(0)->add_children();
  sub->set_rank(4);
  sub->set_address("127.0.0.1:1");
  leaves_[0]->service.relays = {4};
  Result r = Forward(req);
  ASSERT_TRUE(r.outcome.status.ok()) << r.outcome.status;
  EXPECT_TRUE(r.failures.empty());
  std::map<int, int> ranks;  // rank -> the rank its report says
  for (const v1::RelayedStep& s : r.outcome.relayed) ranks[s.rank()] = s.report().rank();
  EXPECT_EQ(ranks, (std::map<int, int>{{1, 1}, {2, 2}, {3, 3}, {4, 4}}));
  // Each was called once, with the step and only its own subtree.
  const auto seen1 = leaves_[0]->service.seen();
  ASSERT_EQ(seen1.size(), 1u);
  EXPECT_EQ(seen1[0].step(), 7);
  ASSERT_EQ(seen1[0].relay_size(), 1);
  EXPECT_EQ(seen1[0].relay(0).rank(), 4);
  const auto seen2 = leaves_[1]->service.seen();
  ASSERT_EQ(seen2.size(), 1u);
  EXPECT_EQ(seen2[0].relay_size(), 0);
}

TEST_F(StepRelayTest, TheFirstFailureIsReportedOnceUnderTheRankThatFailed) {
  leaves_[1]->service.fail = absl::NotFoundError("no such job");
  Result r = Forward(Request());
  EXPECT_EQ(r.outcome.status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(r.outcome.status.message(), HasSubstr("no such job"));
  EXPECT_EQ(r.outcome.failed_rank, 2);
  EXPECT_EQ(RelayedRank(r.outcome.status), 2);
  EXPECT_TRUE(r.outcome.relayed.empty());
  ASSERT_EQ(r.failures.size(), 1u);
  EXPECT_EQ(r.failures[0].second, 2);
}

// Leaf 3 was relaying too, and the worker it relayed to (rank 9) failed: rank 9 is named.
TEST_F(StepRelayTest, AFailureRelayedFromDeeperIsTheDeeperWorkers) {
  leaves_[2]->service.fail = absl::AbortedError("peer gone");
  leaves_[2]->service.relayed_rank = 9;
  Result r = Forward(Request());
  EXPECT_EQ(r.outcome.status.code(), absl::StatusCode::kAborted);
  EXPECT_EQ(r.outcome.failed_rank, 9);
  EXPECT_EQ(RelayedRank(r.outcome.status), 9);
}

TEST_F(StepRelayTest, AWorkerThatDoesNotAnswerInTimeIsNamed) {
  leaves_[0]->service.delay = 1500ms;
  Result r = Forward(Request(), 300ms);
  EXPECT_EQ(r.outcome.status.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(r.outcome.failed_rank, 1);
}

TEST_F(StepRelayTest, AnEmptyRelayListIsDoneAtOnce) {
  v1::RunStepRequest req;
  Result r = Forward(req);
  EXPECT_TRUE(r.outcome.status.ok());
  EXPECT_TRUE(r.outcome.relayed.empty());
}

TEST(ValidateRelayTest, RefusesWhatCannotBeForwarded) {
  v1::RunStepRequest req;
  v1::StepRelay* a = req.add_relay();
  a->set_rank(1);
  a->set_address("127.0.0.1:1");
  EXPECT_TRUE(ValidateRelay(req.relay()).ok());
  v1::StepRelay* b = a->add_children();
  b->set_rank(1);
  b->set_address("127.0.0.1:2");
  EXPECT_THAT(ValidateRelay(req.relay()).message(), HasSubstr("rank 1 appears more than once"));
  b->set_rank(-2);
  EXPECT_THAT(ValidateRelay(req.relay()).message(), HasSubstr("rank -2 is negative"));
  b->set_rank(2);
  b->clear_address();
  EXPECT_THAT(ValidateRelay(req.relay()).message(), HasSubstr("rank 2 has no address"));
  b->set_address("127.0.0.1:2");
  EXPECT_TRUE(ValidateRelay(req.relay()).ok());
  EXPECT_THAT(ValidateRelay(req.relay(), 1).message(), HasSubstr("more than 1 workers"));
}

}  // namespace
}  // namespace tandem::worker
