// The step timings the job store keeps: their compact records, which steps are kept, their
// persistence, and the traces GetJobTrace renders from them.
#include "coordinator/step_timings.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/spec.h"
#include "coordinator/checkpoint_store.h"
#include "coordinator/job_store.h"
#include "gmock/gmock.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"

namespace tandem::coordinator {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

Schedule Lowered1F1B(int ranks, int micro_batches) {
  absl::StatusOr<Schedule> s = Generate1F1B(ranks, micro_batches);
  EXPECT_TRUE(s.ok()) << s.status();
  return LowerWithTransfers(*s);
}

// Every action of every rank, back to back, `us` each, from `base_us[r]` on rank r's clock.
std::vector<v1::StepReport> Reports(const Schedule& lowered, int64_t step,
                                    const std::vector<int64_t>& base_us, int64_t us = 10) {
  std::vector<v1::StepReport> out;
  for (int r = 0; r < lowered.placement.num_ranks; ++r) {
    v1::StepReport& rep = out.emplace_back();
    rep.set_step(step);
    rep.set_rank(r);
    int64_t t = base_us[r];
    for (size_t i = 0; i < lowered.program[r].size(); ++i) {
      v1::ActionTiming* timing = rep.add_timings();
      timing->set_index(static_cast<int>(i));
      timing->set_start_us(t);
      timing->set_end_us(t + us);
      t += us + 1;
    }
  }
  return out;
}

v1::StepTimings Timings(int64_t step, size_t timings = 1) {
  v1::StepTimings s;
  s.set_step(step);
  v1::RankTimings* r = s.add_ranks();
  for (size_t i = 0; i < timings; ++i) {
    r->add_index(static_cast<int>(i));
    r->add_start_us(0);
    r->add_end_us(1);
  }
  return s;
}

TEST(StepTimingsTest, ProgramAndReportsRoundTripThroughTheRecord) {
  const Schedule lowered = Lowered1F1B(2, 4);
  const v1::TraceProgram program = TraceProgramOf(lowered);
  EXPECT_EQ(program.rank_actions(0).substr(0, 14), "0F0 0SEND_F0 0");
  absl::StatusOr<Schedule> back = ScheduleOf(program);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->name, lowered.name);
  EXPECT_EQ(back->placement, lowered.placement);
  EXPECT_EQ(back->program, lowered.program);
  EXPECT_EQ(back->num_micro_batches, 4);

  v1::TraceProgram bad = program;
  bad.set_rank_actions(1, "1F0 1X9");
  EXPECT_THAT(ScheduleOf(bad).status().message(), HasSubstr("rank 1"));

  // Overlapped pairs (dualpipe_v) travel as one "(a;b)OVERLAP_F_B" cell and come back flagged.
  absl::StatusOr<Schedule> dualpipe = GenerateSchedule("dualpipe_v", 2, 4);
  ASSERT_TRUE(dualpipe.ok());
  const Schedule paired = LowerWithTransfers(*dualpipe);
  const v1::TraceProgram paired_program = TraceProgramOf(paired);
  EXPECT_THAT(paired_program.rank_actions(0), HasSubstr("(0F3;3B1)OVERLAP_F_B"));
  absl::StatusOr<Schedule> paired_back = ScheduleOf(paired_program);
  ASSERT_TRUE(paired_back.ok()) << paired_back.status();
  EXPECT_EQ(paired_back->program, paired.program);

  const int64_t t0 = 1'700'000'000'000'000;
  std::vector<v1::StepReport> reports = Reports(lowered, 7, {t0, t0 + 5000});
  std::swap(reports[0], reports[1]);  // any order
  const v1::StepTimings rec = StepTimingsOf(7, reports, {0, -5000});
  EXPECT_EQ(rec.ranks(0).rank(), 0);
  EXPECT_EQ(rec.ranks(1).origin_us(), t0 + 5000);
  EXPECT_EQ(rec.ranks(1).start_us(0), 0);  // relative: short in JSON
  EXPECT_EQ(TimingCount(rec), lowered.program[0].size() + lowered.program[1].size());
  const std::vector<v1::StepReport> again = ReportsOf(rec);
  ASSERT_EQ(again.size(), 2u);
  for (const v1::StepReport& r : again) {
    const v1::StepReport& orig = reports[r.rank() == 0 ? 1 : 0];
    ASSERT_EQ(r.timings_size(), orig.timings_size());
    for (int i = 0; i < r.timings_size(); ++i) {
      EXPECT_EQ(r.timings(i).start_us(), orig.timings(i).start_us());
      EXPECT_EQ(r.timings(i).end_us(), orig.timings(i).end_us());
    }
  }
  // Without device times the record carries none; with them they round-trip.
  EXPECT_EQ(rec.ranks(0).device_us_size(), 0);
  std::vector<v1::StepReport> gpu = reports;
  for (v1::StepReport& r : gpu) r.mutable_timings(0)->set_device_us(7 + r.rank());
  const v1::StepTimings gpu_rec = StepTimingsOf(7, gpu, {0, -5000});
  ASSERT_EQ(gpu_rec.ranks(1).device_us_size(), gpu_rec.ranks(1).index_size());
  for (const v1::StepReport& r : ReportsOf(gpu_rec)) {
    EXPECT_EQ(r.timings(0).device_us(), 7 + r.rank());
    EXPECT_EQ(r.timings(1).device_us(), 0);
  }
  // The offsets put both ranks on one clock: both start at the origin.
  absl::StatusOr<StepTimeline> t = TimelineOf(lowered, rec);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->stages.size(), 2u);
  EXPECT_EQ(t->slices.front().start_us, 0);
  EXPECT_EQ(t->stages[0].busy_us, 8 * 10);  // 4 F + 4 B of 10 us
}

// Every step of a long run: the last 20 are kept, and older ones only at multiples of a stride
// that doubles, so that at most 32 of them spread evenly over the run.
TEST(StepTimingsTest, KeepsTheRecentStepsAndASampleAcrossTheRun) {
  v1::JobTimings kept;
  for (int64_t step = 0; step < 5000; ++step) {
    KeepStepTimings(&kept, Timings(step));
    const std::vector<int64_t> steps = KeptSteps(kept);
    ASSERT_TRUE(std::is_sorted(steps.begin(), steps.end()));
    ASSERT_LE(steps.size(), 52u) << "step " << step;
    ASSERT_EQ(steps.back(), step);
  }
  const std::vector<int64_t> steps = KeptSteps(kept);
  const int64_t stride = kept.sample_stride();
  EXPECT_EQ(stride & (stride - 1), 0) << "a power of two: " << stride;
  std::vector<int64_t> older(steps.begin(), steps.end() - 20);
  for (int64_t s = 4980; s < 5000; ++s) {
    EXPECT_NE(std::find(steps.begin(), steps.end(), s), steps.end()) << s;
  }
  ASSERT_GE(older.size(), 16u);
  ASSERT_LE(older.size(), 32u);
  EXPECT_EQ(older.front(), 0);  // the first step stays
  for (size_t i = 0; i < older.size(); ++i) {
    EXPECT_EQ(older[i] % stride, 0);
    if (i > 0) {
      EXPECT_EQ(older[i] - older[i - 1], stride);  // evenly spread
    }
  }
  EXPECT_GE(older.back() + 2 * stride, 4980) << "the sample reaches the recent steps";
  // Numbered from 1 for people.
  EXPECT_THAT(FormatSteps(steps),
              StartsWith(absl::StrCat("1, ", stride + 1, ", ", 2 * stride + 1, ", ")));
}

TEST(StepTimingsTest, BigStepsAreKeptFewerWithinTheBudget) {
  TimingRetention policy;
  policy.max_timings = 1000;
  v1::JobTimings kept;
  for (int64_t step = 0; step < 100; ++step) KeepStepTimings(&kept, Timings(step, 100), policy);
  EXPECT_EQ(KeptSteps(kept).size(), 10u);  // 10 recent, no room for samples
  EXPECT_EQ(KeptSteps(kept).front(), 90);
  // A step bigger than the whole budget: only the latest.
  KeepStepTimings(&kept, Timings(100, 5000), policy);
  EXPECT_EQ(KeptSteps(kept), std::vector<int64_t>{100});
}

TEST(StepTimingsTest, ARerunStepReplacesItsRecordAndTheLaterOnes) {
  v1::JobTimings kept;
  for (int64_t step = 0; step < 5; ++step) KeepStepTimings(&kept, Timings(step));
  KeepStepTimings(&kept, Timings(3, 2));
  EXPECT_EQ(KeptSteps(kept), (std::vector<int64_t>{0, 1, 2, 3}));
  EXPECT_EQ(TimingCount(kept.steps(3)), 2u);
}

TEST(StepTimingsTest, FormatStepsWritesRuns) {
  EXPECT_EQ(FormatSteps({}), "");
  // Indices in, step numbers (from 1) out.
  EXPECT_EQ(FormatSteps({4}), "5");
  EXPECT_EQ(FormatSteps({0, 1, 4, 8, 9, 10, 11}), "1, 2, 5, 9..12");
}

TEST(StepTimingsTest, TheStoreKeepsTimingsApartAndPersistsThemWithTheJob) {
  char dir_template[] = "/tmp/tandem-timings-XXXXXX";
  const std::string dir = mkdtemp(dir_template);
  const Schedule lowered = Lowered1F1B(2, 4);
  auto spec = LoadJobSpecYaml("steps: 30\npipeline:\n  stages: 2\n  micro_batches: 4\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  std::string id;
  TimingRetention policy;
  policy.recent = 3;
  policy.sampled = 2;
  const CheckpointStore checkpoints(dir + "/checkpoints");
  {
    auto store = JobStore::Open(dir, &checkpoints, policy);
    ASSERT_TRUE(store.ok()) << store.status();
    id = *(*store)->Add(*spec);
    EXPECT_EQ((*store)->GetTimings(id)->steps_size(), 0);
    EXPECT_EQ((*store)->GetTimings("job-9").status().code(), absl::StatusCode::kNotFound);
    ASSERT_TRUE((*store)->Transition(id, v1::RUNNING, "").ok());
    (*store)->SetTraceProgram(id, TraceProgramOf(lowered));
    for (int64_t step = 0; step < 10; ++step) {
      (*store)->RecordStepTimings(id, StepTimingsOf(step, Reports(lowered, step, {0, 3}), {0, 0}));
    }
    ASSERT_TRUE((*store)->Transition(id, v1::SUCCEEDED, "").ok());
    // GetJob stays small: no timings in the job.
    EXPECT_THAT((*store)->Get(id)->DebugString(), Not(HasSubstr("origin_us")));
  }
  EXPECT_TRUE(std::filesystem::exists(dir + "/coordinator.db"));
  auto store = JobStore::Open(dir, &checkpoints, policy);
  ASSERT_TRUE(store.ok()) << store.status();
  absl::StatusOr<v1::JobTimings> t = (*store)->GetTimings(id);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(KeptSteps(*t), (std::vector<int64_t>{0, 4, 7, 8, 9}));
  EXPECT_EQ(t->program().rank_actions_size(), 2);
  EXPECT_TRUE(TimelineOf(*ScheduleOf(t->program()), t->steps(4)).ok());
  std::filesystem::remove_all(dir);
}

// Per-rank byte totals count every step recorded, kept or dropped, reruns included.
TEST(StepTimingsTest, ByteTotalsCountEveryStepRecorded) {
  const Schedule lowered = Lowered1F1B(2, 4);
  TimingRetention policy;
  policy.recent = 2;
  policy.sampled = 0;
  v1::JobTimings kept;
  for (int64_t step = 0; step < 5; ++step) {
    std::vector<v1::StepReport> reports = Reports(lowered, step, {0, 0});
    reports[0].set_bytes_sent(100);
    reports[1].set_bytes_sent(7);
    reports[1].set_bytes_received(100);
    const v1::StepTimings t = StepTimingsOf(step, reports, {});
    EXPECT_EQ(t.ranks(0).bytes_sent(), 100);
    EXPECT_EQ(t.ranks(1).bytes_received(), 100);
    KeepStepTimings(&kept, t, policy);
  }
  EXPECT_EQ(KeptSteps(kept), (std::vector<int64_t>{3, 4}));
  EXPECT_THAT(kept.rank_bytes_sent(), ::testing::ElementsAre(500, 35));
  EXPECT_THAT(kept.rank_bytes_received(), ::testing::ElementsAre(0, 500));
  KeepStepTimings(&kept, StepTimingsOf(4, Reports(lowered, 4, {0, 0}), {}), policy);
  EXPECT_THAT(kept.rank_bytes_sent(), ::testing::ElementsAre(500, 35));  // no bytes this time
}

TEST(StepTimingsTest, TheStoreGivesTimingsWithoutStepsOrOnlyTheLatest) {
  auto store = JobStore::Open("", /*checkpoints=*/nullptr);
  ASSERT_TRUE(store.ok()) << store.status();
  auto spec = LoadJobSpecYaml("steps: 30\npipeline:\n  stages: 2\n  micro_batches: 4\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  const std::string id = *(*store)->Add(*spec);
  const Schedule lowered = Lowered1F1B(2, 4);
  (*store)->SetTraceProgram(id, TraceProgramOf(lowered));
  for (int64_t step = 0; step < 3; ++step) {
    std::vector<v1::StepReport> reports = Reports(lowered, step, {0, 0});
    reports[1].set_bytes_sent(10);
    (*store)->RecordStepTimings(id, StepTimingsOf(step, reports, {0, 0}));
  }
  auto none = (*store)->GetTimings(id, JobStore::TimingSteps::kNone);
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ(none->steps_size(), 0);
  EXPECT_EQ(none->program().rank_actions_size(), 2);
  EXPECT_THAT(none->rank_bytes_sent(), ::testing::ElementsAre(0, 30));
  auto latest = (*store)->GetTimings(id, JobStore::TimingSteps::kLatest);
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ(KeptSteps(*latest), (std::vector<int64_t>{2}));
  EXPECT_EQ(KeptSteps(*(*store)->GetTimings(id)), (std::vector<int64_t>{0, 1, 2}));
  EXPECT_EQ((*store)->GetTimings("job-9", JobStore::TimingSteps::kNone).status().code(),
            absl::StatusCode::kNotFound);
}

TEST(JobStoreTest, StepsAfterGivesTheRetainedStepsAfterOne) {
  auto store = JobStore::Open("", /*checkpoints=*/nullptr);
  ASSERT_TRUE(store.ok()) << store.status();
  auto spec = LoadJobSpecYaml("steps: 30\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  const std::string id = *(*store)->Add(*spec);
  auto steps_of = [&](int64_t after) {
    std::vector<int64_t> out;
    // Held here: a range-for over *StepsAfter(...) would read the StatusOr after its end.
    const auto steps = (*store)->StepsAfter(id, after);
    EXPECT_TRUE(steps.ok()) << steps.status();
    if (!steps.ok()) return out;
    for (const v1::StepSummary& s : *steps) out.push_back(s.step());
    return out;
  };
  EXPECT_TRUE(steps_of(-1).empty());
  for (int64_t step = 0; step < 4; ++step) {
    v1::StepSummary s;
    s.set_step(step);
    (*store)->RecordStep(id, s);
  }
  EXPECT_EQ(steps_of(-1), (std::vector<int64_t>{0, 1, 2, 3}));
  EXPECT_EQ(steps_of(1), (std::vector<int64_t>{2, 3}));
  EXPECT_TRUE(steps_of(3).empty());
  EXPECT_EQ((*store)->StepsAfter("job-7", -1).status().code(), absl::StatusCode::kNotFound);
}

class RenderJobTraceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    job_.set_id("job-3");
    job_.set_name("tiny");
    job_.set_state(v1::RUNNING);
    job_.set_steps_done(6);
    for (int s = 0; s < 2; ++s) {
      v1::StageAssignment* a = job_.add_stages();
      a->set_stage(s);
      a->set_rank(s);
      a->set_worker_id(absl::StrCat("w-", s + 1));
      a->set_address(absl::StrCat("127.0.0.1:", 4000 + s));
    }
    *timings_.mutable_program() = TraceProgramOf(lowered_);
    for (int64_t step : {0, 2, 4, 5}) {
      *timings_.add_steps() =
          StepTimingsOf(step, Reports(lowered_, step, {step * 1000, step * 1000 + 7}), {0, -7});
    }
  }
  absl::StatusOr<v1::GetJobTraceResponse> Render(const v1::GetJobTraceRequest& req,
                                                 size_t max_bytes = kMaxTraceBytes) {
    return RenderJobTrace(job_, timings_, req, max_bytes);
  }
  // The X events of a trace-event JSON document.
  static std::vector<google::protobuf::Struct> Slices(const std::string& json) {
    google::protobuf::Struct doc;
    EXPECT_TRUE(google::protobuf::util::JsonStringToMessage(json, &doc).ok());
    std::vector<google::protobuf::Struct> out;
    for (const auto& e : doc.fields().at("traceEvents").list_value().values()) {
      if (e.struct_value().fields().at("ph").string_value() == "X") out.push_back(e.struct_value());
    }
    return out;
  }

  const Schedule lowered_ = Lowered1F1B(2, 4);
  v1::Job job_;
  v1::JobTimings timings_;
};

TEST_F(RenderJobTraceTest, TheLatestKeptStepByDefault) {
  v1::GetJobTraceRequest req;
  auto trace = Render(req);
  ASSERT_TRUE(trace.ok()) << trace.status();
  EXPECT_EQ(std::vector<int64_t>(trace->steps().begin(), trace->steps().end()),
            std::vector<int64_t>{5});
  EXPECT_EQ(trace->kept_steps_size(), 4);
  const auto slices = Slices(trace->content());
  EXPECT_EQ(slices.size(), lowered_.program[0].size() + lowered_.program[1].size());
  EXPECT_THAT(trace->content(), HasSubstr("stage 1 (rank 1, w-2 127.0.0.1:4001)"));
}

TEST_F(RenderJobTraceTest, ARangeOfStepsInOneJsonFile) {
  v1::GetJobTraceRequest req;
  req.set_first_step(1);
  req.set_last_step(4);
  auto trace = Render(req);
  ASSERT_TRUE(trace.ok()) << trace.status();
  EXPECT_EQ(std::vector<int64_t>(trace->steps().begin(), trace->steps().end()),
            (std::vector<int64_t>{2, 4}));
  EXPECT_EQ(Slices(trace->content()).size(),
            2 * (lowered_.program[0].size() + lowered_.program[1].size()));
}

TEST_F(RenderJobTraceTest, AnSvgOfOneStep) {
  v1::GetJobTraceRequest req;
  req.set_step(2);
  req.set_format(v1::TRACE_FORMAT_SVG);
  auto trace = Render(req);
  ASSERT_TRUE(trace.ok()) << trace.status();
  EXPECT_THAT(trace->content(), HasSubstr("<svg xmlns"));
  EXPECT_THAT(trace->content(), HasSubstr("job-3 (tiny) step 3: 1f1b, 2 ranks, 4 micro-batches"));
  req.clear_step();
  req.set_first_step(0);
  req.set_last_step(5);
  EXPECT_THAT(Render(req).status().message(), HasSubstr("an SVG chart shows one step"));
}

TEST_F(RenderJobTraceTest, WhatIsNotKeptIsNotFoundAndNamesWhatIs) {
  v1::GetJobTraceRequest req;
  req.set_step(3);
  auto trace = Render(req);
  EXPECT_EQ(trace.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(trace.status().message(),
            "job job-3 keeps no timings of step 4; kept steps: 1, 3, 5, 6");
  req.clear_step();
  req.set_first_step(6);
  req.set_last_step(9);
  EXPECT_THAT(Render(req).status().message(), HasSubstr("no timings of steps 7..10; kept steps"));
  timings_.clear_steps();
  job_.set_state(v1::QUEUED);
  job_.set_steps_done(0);
  EXPECT_EQ(Render({}).status().message(),
            "job job-3 has no step timings yet (QUEUED, 0 steps done)");
}

TEST_F(RenderJobTraceTest, MalformedSelectionsAndOversizedTraces) {
  v1::GetJobTraceRequest req;
  req.set_step(2);
  req.set_first_step(0);
  EXPECT_EQ(Render(req).status().code(), absl::StatusCode::kInvalidArgument);
  req.clear_step();
  EXPECT_THAT(Render(req).status().message(), HasSubstr("needs both"));
  req.set_first_step(4);
  req.set_last_step(2);
  EXPECT_THAT(Render(req).status().message(), HasSubstr("is empty"));
  EXPECT_EQ(Render({}, /*max_bytes=*/1000).status().code(), absl::StatusCode::kResourceExhausted);
  timings_.mutable_program()->set_rank_actions(0, "0F0");  // fewer actions than timed
  EXPECT_EQ(Render({}).status().code(), absl::StatusCode::kDataLoss);
}

}  // namespace
}  // namespace tandem::coordinator
