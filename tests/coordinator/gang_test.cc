// The gang: a batch of calls to every worker of a job, its failures diagnosed (an unreachable
// worker named and marked lost), its interruption, and the abort of every worker.
#include "coordinator/gang.h"

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/coordinator/fake_worker_client.h"
#include "tests/coordinator/runner_fixture.h"

namespace tandem::coordinator {
namespace {

using ::testing::HasSubstr;
using namespace std::chrono_literals;

struct GangFixture {
  explicit GangFixture(int n) : registry(10s) {
    for (int i = 0; i < n; ++i) {
      EXPECT_TRUE(registry.Register(RegistrationOf(absl::StrCat("127.0.0.1:", 1000 + i))).ok());
    }
    auto allocated = registry.Allocate("cpu", n, "job-1");
    EXPECT_TRUE(allocated.ok());
    workers = *allocated;
  }
  // Made after the fakes are configured (factory.configure).
  std::unique_ptr<Gang> Make() {
    return std::make_unique<Gang>("job-1", workers, factory, &registry, absl::Seconds(1),
                                  [](int rank) { return absl::StrCat("rank ", rank); });
  }
  // One RunStep of `step` to every worker.
  absl::Status Step(Gang& gang, int64_t step, absl::Duration timeout = absl::Seconds(10)) {
    responses.assign(gang.size(), v1::RunStepResponse());
    v1::RunStepRequest req;
    req.set_step(step);
    return gang.CallAll(absl::StrCat("step ", step + 1), timeout, [&](int r, auto done) {
      gang.client(r).RunStep(req, &responses[r], timeout, std::move(done));
    });
  }
  WorkerRegistry registry;
  FakeFactory factory;
  std::vector<WorkerRecord> workers;
  std::vector<v1::RunStepResponse> responses;
};

TEST(GangTest, ABatchThatSucceedsCallsEveryWorkerOnce) {
  GangFixture f(3);
  auto gang = f.Make();
  ASSERT_EQ(gang->size(), 3);
  ASSERT_TRUE(f.Step(*gang, 0).ok());
  for (FakeWorker* w : f.factory.made) {
    EXPECT_EQ(w->run_steps.load(), 1);
    EXPECT_EQ(w->aborts.load(), 0);
  }
  EXPECT_EQ(f.responses[2].report().step(), 0);
  EXPECT_TRUE(gang->InterruptStatus().ok());
}

// The failed call is named; its peers, blocked on it, are aborted so that the batch returns.
TEST(GangTest, AFailedCallIsNamedAndItsPeersAreAborted) {
  GangFixture f(3);
  f.factory.configure = [](FakeWorker* w) {
    if (w->rank_ == 1) w->fail_at_step = 0;
    if (w->rank_ != 1) w->hang_at_step = 0;
  };
  auto gang = f.Make();
  const absl::Status s = f.Step(*gang, 0);
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(s.message(), HasSubstr("step 1: rank 1: INTERNAL: boom"));
  EXPECT_GE(f.factory.made[0]->aborts.load(), 1);
  EXPECT_GE(f.factory.made[2]->aborts.load(), 1);
  EXPECT_FALSE(gang->RankLost(1));
}

// A worker that does not answer its probe is the cause, rather than the one that noticed: it
// is named, marked lost here and in the registry, and no longer aborted.
TEST(GangTest, AnUnreachableWorkerIsNamedAndMarkedLost) {
  GangFixture f(3);
  f.factory.configure = [](FakeWorker* w) {
    if (w->rank_ == 0) w->fail_at_step = 0;
    if (w->rank_ == 2) w->liveness_error = absl::UnavailableError("connection refused");
  };
  auto gang = f.Make();
  const absl::Status s = f.Step(*gang, 0);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(s.message(), HasSubstr("step 1: rank 2 is unreachable ("));
  EXPECT_THAT(s.message(), HasSubstr("connection refused"));
  EXPECT_THAT(s.message(), HasSubstr("first error: rank 0: INTERNAL: boom"));
  EXPECT_TRUE(gang->RankLost(2));
  EXPECT_EQ(f.registry.Get(f.workers[2].id)->state, v1::LOST);
  const int aborts = f.factory.made[2]->aborts.load();
  gang->AbortAll("job finished");
  EXPECT_EQ(f.factory.made[2]->aborts.load(), aborts);
  EXPECT_EQ(f.factory.made[1]->aborts.load(), 1);
}

// An interrupt ends the batch in flight with its status (its workers aborted), and a later
// diagnosis too; the first interrupt wins.
TEST(GangTest, AnInterruptEndsTheBatchInFlight) {
  GangFixture f(2);
  f.factory.configure = [](FakeWorker* w) { w->hang_at_step = 0; };
  auto gang = f.Make();
  std::thread interrupter([&] {
    std::this_thread::sleep_for(50ms);
    EXPECT_TRUE(gang->Interrupt(absl::CancelledError("cancelled by the user"), {1}));
  });
  const absl::Status s = f.Step(*gang, 0);
  interrupter.join();
  EXPECT_EQ(s, absl::CancelledError("cancelled by the user"));
  EXPECT_EQ(f.factory.made[0]->aborts.load(), 1);
  EXPECT_EQ(f.factory.made[1]->aborts.load(), 0) << "a lost rank is not aborted";
  EXPECT_TRUE(gang->RankLost(1));
  EXPECT_FALSE(gang->Interrupt(absl::UnavailableError("later")));
  EXPECT_EQ(gang->InterruptStatus(), absl::CancelledError("cancelled by the user"));
  std::vector<absl::Status> results = {absl::InternalError("x"), absl::OkStatus()};
  EXPECT_EQ(gang->Diagnose("checkpoint", results, absl::Seconds(1)),
            absl::CancelledError("cancelled by the user"));
}

// Calls made outside CallAll are diagnosed the same way; the lowest failed rank is the first
// failure, and a call whose deadline passed says so.
TEST(GangTest, DiagnoseNamesTheLowestFailedRankAndATimeout) {
  GangFixture f(3);
  auto gang = f.Make();
  std::vector<absl::Status> results = {absl::OkStatus(), absl::DeadlineExceededError("late"),
                                       absl::InternalError("later")};
  const absl::Status s = gang->Diagnose("checkpoint after step 3", results, absl::Seconds(3));
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_EQ(s.message(),
            "checkpoint after step 3: rank 1 timed out: no answer within 3s (late); it may be "
            "hung, or waiting on a peer or a link that is down");
}

// The diagnosis of a worker's own error carries that worker's code, so that the runner can
// tell a refused configuration from a fault (issue 26); an unreachable worker's carries none.
TEST(GangTest, TheDiagnosisOfAWorkersErrorCarriesItsCode) {
  GangFixture f(2);
  f.factory.configure = [](FakeWorker* w) {
    if (w->rank_ == 1) w->configure_error = absl::NotFoundError("data.path 'x' does not exist");
  };
  auto gang = f.Make();
  std::vector<v1::ConfigureResponse> responses(2);
  auto configure = [&](int r, StageWorkerClient::Done done) {
    gang->client(r).Configure(v1::ConfigureRequest(), &responses[r], absl::Seconds(1),
                              std::move(done));
  };
  absl::Status s = gang->CallAll("configure", absl::Seconds(1), configure);
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_EQ(s.message(), "configure: rank 1: NOT_FOUND: data.path 'x' does not exist");
  EXPECT_EQ(WorkerErrorCode(s), absl::StatusCode::kNotFound);
  EXPECT_EQ(WorkerErrorCode(WithPrefix(s, "job-1")), absl::StatusCode::kNotFound);

  f.factory.made[0]->liveness_error = absl::UnavailableError("connection refused");
  s = gang->CallAll("configure", absl::Seconds(1), configure);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(WorkerErrorCode(s), std::nullopt);
  EXPECT_EQ(WorkerErrorCode(absl::OkStatus()), std::nullopt);
  EXPECT_EQ(WorkerErrorCode(absl::NotFoundError("the coordinator's own")), std::nullopt);
}

// pipeline.plan: auto may re-deal the ranks before the first call: rank r becomes the worker
// that was rank order[r], its client with it.
TEST(GangTest, AReorderMovesWorkersAndTheirClientsTogether) {
  GangFixture f(3);
  auto gang = f.Make();
  const std::string first = gang->workers()[0].id, last = gang->workers()[2].id;
  ASSERT_TRUE(gang->Reorder({2, 0, 1}).ok());
  EXPECT_EQ(gang->workers()[0].id, last);
  EXPECT_EQ(gang->workers()[1].id, first);
  v1::RunStepRequest req;
  v1::RunStepResponse resp;
  ASSERT_TRUE(gang->CallAll(
                      "step 1", absl::Seconds(5),
                      [&](int r, auto done) {
                        gang->client(r).RunStep(req, &resp, absl::Seconds(5), std::move(done));
                      },
                      1)
                  .ok());
  EXPECT_EQ(f.factory.made[2]->run_steps.load(), 1);  // rank 0 is the worker made third
  EXPECT_EQ(f.factory.made[0]->run_steps.load(), 0);

  EXPECT_EQ(gang->Reorder({0, 1}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(gang->Reorder({0, 0, 1}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(gang->Reorder({0, 1, 3}).code(), absl::StatusCode::kInvalidArgument);
  gang->Interrupt(absl::CancelledError("cancelled"));
  EXPECT_EQ(gang->Reorder({1, 0, 2}).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(gang->workers()[0].id, last);  // unchanged by the refusals
}

}  // namespace
}  // namespace tandem::coordinator
