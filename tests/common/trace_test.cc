#include "common/trace.h"

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/schedule.h"
#include "common/schedule_check.h"
#include "gmock/gmock.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr int64_t kT0 = 1'700'000'000'000'000;  // a Unix time in microseconds

Schedule Lowered(const char* name, int ranks, int micro_batches) {
  absl::StatusOr<Schedule> s = GenerateSchedule(name, ranks, micro_batches);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? LowerWithTransfers(*s) : Schedule{};
}

void AddTiming(v1::StepReport* report, int index, int64_t start, int64_t end) {
  v1::ActionTiming* t = report->add_timings();
  t->set_index(index);
  t->set_start_us(start);
  t->set_end_us(end);
}

// 2-stage 1F1B over 2 micro-batches, timed by hand (microseconds after kT0 on rank 0's clock):
//   rank 0: 0F0 0SEND_F0 0F1 0SEND_F1 0RECV_B0 0B0 0RECV_B1 0B1
//   rank 1: 1RECV_F0 1F0 1B0 1SEND_B0 1RECV_F1 1F1 1B1 1SEND_B1
// Rank 1's clock runs 5 ms behind rank 0's, so its offset is +5000.
constexpr int64_t kRank1Behind = 5000;
std::vector<v1::StepReport> TwoStageReports() {
  std::vector<v1::StepReport> reports(2);
  reports[0].set_step(7);
  reports[0].set_rank(0);
  const int64_t r0[][2] = {{0, 100},   {100, 105}, {105, 205}, {205, 210},
                           {210, 420}, {420, 620}, {620, 725}, {725, 925}};
  for (int i = 0; i < 8; ++i) AddTiming(&reports[0], i, kT0 + r0[i][0], kT0 + r0[i][1]);
  // Reported in an order other than rank order: reports are matched by their rank field.
  reports[1].set_step(7);
  reports[1].set_rank(1);
  const int64_t r1[][2] = {{0, 110},   {110, 210}, {210, 410}, {410, 415},
                           {415, 416}, {416, 516}, {516, 716}, {716, 720}};
  for (int i = 0; i < 8; ++i) {
    AddTiming(&reports[1], i, kT0 + r1[i][0] - kRank1Behind, kT0 + r1[i][1] - kRank1Behind);
  }
  std::swap(reports[0], reports[1]);
  return reports;
}

// 4-stage 1F1B over 8 micro-batches, timed by the simulator with hand-chosen per-stage costs
// (the last stage, which holds the head, is the slowest), 150 us per message. Rank 2's clock runs
// 2.5 ms ahead (offset -2500).
constexpr int64_t kRank2Ahead = 2500;
std::vector<v1::StepReport> FourStageReports(const Schedule& lowered, int64_t step = 3) {
  const std::vector<ActionCosts> costs = {{0.0010, 0.0021, 0, 0, 0.00015},
                                          {0.0012, 0.0024, 0, 0, 0.00015},
                                          {0.0011, 0.0022, 0, 0, 0.00015},
                                          {0.0016, 0.0030, 0, 0, 0.00015}};
  absl::StatusOr<SimulationResult> sim = SimulateSchedule(lowered, ActionCosts{}, costs);
  EXPECT_TRUE(sim.ok()) << sim.status();
  std::vector<v1::StepReport> reports(lowered.placement.num_ranks);
  if (!sim.ok()) return reports;
  for (int r = 0; r < lowered.placement.num_ranks; ++r) {
    reports[r].set_step(step);
    reports[r].set_rank(r);
    const int64_t skew = r == 2 ? kRank2Ahead : 0;
    for (size_t i = 0; i < lowered.program[r].size(); ++i) {
      AddTiming(&reports[r], static_cast<int>(i), kT0 + std::llround(sim->start[r][i] * 1e6) + skew,
                kT0 + std::llround(sim->end[r][i] * 1e6) + skew);
    }
  }
  return reports;
}

const std::vector<int64_t> kFourStageOffsets = {0, 0, -kRank2Ahead, 0};

StepTimeline FourStageTimeline(int64_t step = 3) {
  const Schedule lowered = Lowered("1f1b", 4, 8);
  absl::StatusOr<StepTimeline> t =
      BuildStepTimeline(lowered, FourStageReports(lowered, step), kFourStageOffsets,
                        {"10.0.0.1:7001", "10.0.0.2:7001", "10.0.0.3:7001", "10.0.0.4:7001"});
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? *t : StepTimeline{};
}

// ---------------------------------------------------------------------------------------------
// BuildStepTimeline

TEST(BuildStepTimeline, PutsEveryRankOnOneClockFromTheStepStart) {
  absl::StatusOr<StepTimeline> t =
      BuildStepTimeline(Lowered("1f1b", 2, 2), TwoStageReports(), {0, kRank1Behind});
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->step, 7);
  EXPECT_EQ(t->schedule, "1f1b");
  EXPECT_EQ(t->origin_us, kT0);
  EXPECT_EQ(t->span_us, 925);
  ASSERT_EQ(t->slices.size(), 16u);
  // By rank, then action index, whatever the order of the reports.
  EXPECT_EQ(t->slices[0].rank, 0);
  EXPECT_EQ(t->slices[0].index, 0);
  const TimelineSlice& f1 = t->slices[9];  // rank 1: 1F0
  EXPECT_EQ(f1.rank, 1);
  EXPECT_EQ(f1.stage, 1);
  EXPECT_EQ(f1.kind, v1::ACTION_F);
  EXPECT_EQ(f1.micro_batch, 0);
  EXPECT_EQ(f1.start_us, 110);
  EXPECT_EQ(f1.end_us, 210);
}

TEST(BuildStepTimeline, MeasuresBusyCommunicationIdleAndBubblePerStage) {
  absl::StatusOr<StepTimeline> t =
      BuildStepTimeline(Lowered("1f1b", 2, 2), TwoStageReports(), {0, kRank1Behind},
                        {"127.0.0.1:5001", "127.0.0.1:5002"});
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ(t->stages.size(), 2u);
  const StageTimes& s0 = t->stages[0];
  EXPECT_EQ(s0.rank, 0);
  EXPECT_EQ(s0.label, "127.0.0.1:5001");
  EXPECT_EQ(s0.busy_us, 600);
  EXPECT_EQ(s0.comm_us, 5 + 5 + 210 + 105);
  EXPECT_EQ(s0.idle_us, 0);
  EXPECT_NEAR(s0.bubble, 1.0 - 600.0 / 925.0, 1e-12);
  const StageTimes& s1 = t->stages[1];
  EXPECT_EQ(s1.busy_us, 600);
  EXPECT_EQ(s1.comm_us, 110 + 5 + 1 + 4);
  EXPECT_EQ(s1.idle_us, 925 - 600 - 120);
  EXPECT_NEAR(s1.bubble, 1.0 - 600.0 / 925.0, 1e-12);
}

// A GPU worker reports each compute action's device time (CUDA events) beside its host
// interval: the stage's busy time is the device's, the host's share of the interval counts as
// idle, and the trace event carries the device time as an argument.
TEST(BuildStepTimeline, DeviceTimesAreTheBusyTimeOfComputeActions) {
  std::vector<v1::StepReport> reports = TwoStageReports();
  v1::StepReport& rank0 = reports[0].rank() == 0 ? reports[0] : reports[1];
  // 0F0 and 0F1 (100 us each) ran 80 us on the device, 0B0 and 0B1 (200 us) 150 us; a device
  // time longer than its interval is clock noise and counts as the interval.
  for (int i : {0, 2}) rank0.mutable_timings(i)->set_device_us(80);
  rank0.mutable_timings(5)->set_device_us(150);
  rank0.mutable_timings(7)->set_device_us(900);
  absl::StatusOr<StepTimeline> t =
      BuildStepTimeline(Lowered("1f1b", 2, 2), reports, {0, kRank1Behind}, {});
  ASSERT_TRUE(t.ok()) << t.status();
  const StageTimes& s0 = t->stages[0];
  EXPECT_EQ(s0.busy_us, 80 + 80 + 150 + 200);
  EXPECT_EQ(s0.comm_us, 5 + 5 + 210 + 105);
  EXPECT_EQ(s0.idle_us, 925 - 510 - 325);
  EXPECT_NEAR(s0.bubble, 1.0 - 510.0 / 925.0, 1e-12);
  EXPECT_EQ(t->stages[1].busy_us, 600);  // no device times: the intervals
  const std::string json = TraceEventJson(*t);
  EXPECT_THAT(json, HasSubstr(R"("device_us":150)"));
  EXPECT_THAT(json, Not(HasSubstr(R"("device_us":0)")));
}

TEST(BuildStepTimeline, LinksEverySendToItsReceive) {
  absl::StatusOr<StepTimeline> t =
      BuildStepTimeline(Lowered("1f1b", 2, 2), TwoStageReports(), {0, kRank1Behind});
  ASSERT_TRUE(t.ok()) << t.status();
  std::set<std::string> pairs;
  for (const TransferLink& l : t->transfers) {
    const TimelineSlice& s = t->slices[l.send];
    const TimelineSlice& r = t->slices[l.recv];
    pairs.insert(absl::StrCat(ActionToString({s.stage, s.kind, s.micro_batch}), "->",
                              ActionToString({r.stage, r.kind, r.micro_batch})));
  }
  EXPECT_EQ(pairs, (std::set<std::string>{"0SEND_F0->1RECV_F0", "0SEND_F1->1RECV_F1",
                                          "1SEND_B0->0RECV_B0", "1SEND_B1->0RECV_B1"}));
}

TEST(BuildStepTimeline, AnUnreportedActionIsLeftOut) {
  std::vector<v1::StepReport> reports = TwoStageReports();
  reports[1].mutable_timings()->RemoveLast();  // rank 0 (reports are swapped): 0B1
  absl::StatusOr<StepTimeline> t =
      BuildStepTimeline(Lowered("1f1b", 2, 2), reports, {0, kRank1Behind});
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->slices.size(), 15u);
  EXPECT_EQ(t->span_us, 725);  // 0RECV_B1 ends last now
  EXPECT_EQ(t->stages[0].busy_us, 400);
}

TEST(BuildStepTimeline, RejectsATimingIndexOutsideTheActions) {
  std::vector<v1::StepReport> reports = TwoStageReports();
  reports[0].mutable_timings(3)->set_index(99);  // rank 1
  absl::Status s = BuildStepTimeline(Lowered("1f1b", 2, 2), reports).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("rank 1 timing index 99 is outside its 8 actions"));
  reports[0].mutable_timings(3)->set_index(-1);
  EXPECT_THAT(BuildStepTimeline(Lowered("1f1b", 2, 2), reports).status().message(),
              HasSubstr("rank 1 timing index -1"));
}

TEST(BuildStepTimeline, RejectsAMissingRank) {
  std::vector<v1::StepReport> reports = TwoStageReports();
  reports.erase(reports.begin());  // rank 1's
  absl::Status s = BuildStepTimeline(Lowered("1f1b", 2, 2), reports).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("no report from rank 1"));
}

TEST(BuildStepTimeline, RejectsAnActionThatEndsBeforeItStarts) {
  std::vector<v1::StepReport> reports = TwoStageReports();
  v1::ActionTiming* t = reports[1].mutable_timings(2);  // rank 0: 0F1
  t->set_end_us(t->start_us() - 1);
  absl::Status s = BuildStepTimeline(Lowered("1f1b", 2, 2), reports).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("rank 0 action 2 (0F1) ends before it starts"));
}

TEST(BuildStepTimeline, RejectsReportsThatDoNotFitTheSchedule) {
  const Schedule lowered = Lowered("1f1b", 2, 2);
  auto message = [&](std::vector<v1::StepReport> reports, std::vector<int64_t> offsets = {},
                     std::vector<std::string> labels = {}) {
    absl::Status s = BuildStepTimeline(lowered, reports, offsets, labels).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    return std::string(s.message());
  };
  std::vector<v1::StepReport> reports = TwoStageReports();
  reports[0].set_rank(2);
  EXPECT_THAT(message(reports), HasSubstr("a report names rank 2, but the schedule has 2 ranks"));
  reports[0].set_rank(0);
  EXPECT_THAT(message(reports), HasSubstr("two reports from rank 0"));
  reports = TwoStageReports();
  reports[0].set_step(8);
  EXPECT_THAT(message(reports), HasSubstr("rank 1 reports step 9, rank 0 step 8"));
  reports = TwoStageReports();
  *reports[0].add_timings() = reports[0].timings(1);
  EXPECT_THAT(message(reports), HasSubstr("rank 1 reports action 1 (1F0) twice"));
  EXPECT_THAT(message(TwoStageReports(), {0}), HasSubstr("1 clock offsets for 2 ranks"));
  EXPECT_THAT(message(TwoStageReports(), {}, {"a"}), HasSubstr("1 stage labels for 2 stages"));
}

// ---------------------------------------------------------------------------------------------
// TraceEventJson

using google::protobuf::Struct;
using google::protobuf::Value;

const Value& Field(const Value& v, const std::string& key) {
  static const Value kNull;
  const auto& fields = v.struct_value().fields();
  auto it = fields.find(key);
  return it == fields.end() ? kNull : it->second;
}
std::string Str(const Value& v, const std::string& key) { return Field(v, key).string_value(); }
double Num(const Value& v, const std::string& key) { return Field(v, key).number_value(); }

struct JsonSlice {
  double ts = 0, dur = 0;
  Action action;
  int rank = 0;
  int64_t step = 0;
};

// What a viewer reads from a trace-event file: its slices per (pid, tid) track, the threads'
// names, and each flow id's start and end events.
struct ParsedTrace {
  std::string display_time_unit;
  std::map<int, std::string> process_names;                      // by pid
  std::map<std::pair<int, int>, std::string> thread_names;       // by (pid, tid)
  std::map<std::pair<int, int>, std::vector<JsonSlice>> tracks;  // in file order
  std::map<int64_t, std::vector<Value>> flows;                   // by id: "s" and "f" events
  size_t slice_count = 0;
};

ParsedTrace Parse(const std::string& json) {
  ParsedTrace out;
  Struct root;
  const auto status = google::protobuf::util::JsonStringToMessage(json, &root);
  EXPECT_TRUE(status.ok()) << status.ToString();
  Value v;
  *v.mutable_struct_value() = root;
  out.display_time_unit = Str(v, "displayTimeUnit");
  for (const Value& e : Field(v, "traceEvents").list_value().values()) {
    const std::string ph = Str(e, "ph");
    const int pid = static_cast<int>(Num(e, "pid"));
    const int tid = static_cast<int>(Num(e, "tid"));
    if (ph == "M" && Str(e, "name") == "process_name") {
      out.process_names[pid] = Str(Field(e, "args"), "name");
    } else if (ph == "M" && Str(e, "name") == "thread_name") {
      out.thread_names[{pid, tid}] = Str(Field(e, "args"), "name");
    } else if (ph == "X") {
      const Value& args = Field(e, "args");
      absl::StatusOr<Action> a = ParseAction(
          absl::StrCat(Num(args, "stage"), Str(args, "kind"), Num(args, "micro_batch")));
      EXPECT_TRUE(a.ok()) << a.status();
      EXPECT_EQ(Str(e, "name"), absl::StrCat(Str(args, "kind"), Num(args, "micro_batch")));
      out.tracks[{pid, tid}].push_back({Num(e, "ts"), Num(e, "dur"), a.ok() ? *a : Action{},
                                        static_cast<int>(Num(args, "rank")),
                                        static_cast<int64_t>(Num(args, "step"))});
      ++out.slice_count;
    } else if (ph == "s" || ph == "f") {
      out.flows[static_cast<int64_t>(Num(e, "id"))].push_back(e);
    }
  }
  return out;
}

// The slice a flow event binds to, as Perfetto binds it: the latest slice on its track that
// started at or before the event (slices of equal start are opened before flow events).
const JsonSlice* BoundSlice(const ParsedTrace& trace, const Value& flow) {
  auto it =
      trace.tracks.find({static_cast<int>(Num(flow, "pid")), static_cast<int>(Num(flow, "tid"))});
  if (it == trace.tracks.end()) return nullptr;
  const JsonSlice* bound = nullptr;
  for (const JsonSlice& s : it->second) {
    if (s.ts <= Num(flow, "ts") && (bound == nullptr || s.ts >= bound->ts)) bound = &s;
  }
  return bound;
}

// Everything the trace of `timelines` must satisfy to show them faithfully.
void CheckTrace(const std::vector<StepTimeline>& timelines) {
  const ParsedTrace trace = Parse(TraceEventJson(timelines));
  EXPECT_EQ(trace.display_time_unit, "ms");
  const size_t num_stages = timelines.at(0).stages.size();
  // One process per stage, two named threads in each.
  ASSERT_EQ(trace.process_names.size(), num_stages);
  ASSERT_EQ(trace.thread_names.size(), 2 * num_stages);
  std::map<int, int> compute_tid, comm_tid;
  for (const auto& [track, name] : trace.thread_names) {
    (name == "compute" ? compute_tid : comm_tid)[track.first] = track.second;
    EXPECT_TRUE(name == "compute" || name == "communication") << name;
  }
  for (size_t s = 0; s < num_stages; ++s) {
    const int pid = static_cast<int>(s) + 1;
    EXPECT_THAT(trace.process_names.at(pid), HasSubstr(absl::StrCat("stage ", s, " (rank ")));
    ASSERT_TRUE(compute_tid.count(pid) && comm_tid.count(pid)) << pid;
  }
  size_t total_slices = 0, total_links = 0;
  for (const StepTimeline& t : timelines) {
    total_slices += t.slices.size();
    total_links += t.transfers.size();
  }
  EXPECT_EQ(trace.slice_count, total_slices);

  // Every slice on its stage's track of the right kind; on one track they start strictly one
  // after the other and never overlap.
  size_t sends = 0, recvs = 0;
  for (const auto& [track, slices] : trace.tracks) {
    std::vector<JsonSlice> sorted = slices;
    std::sort(sorted.begin(), sorted.end(),
              [](const JsonSlice& a, const JsonSlice& b) { return a.ts < b.ts; });
    for (size_t i = 0; i < sorted.size(); ++i) {
      const Action& a = sorted[i].action;
      EXPECT_EQ(track.first, a.stage + 1);
      EXPECT_EQ(track.second,
                IsComputeAction(a.kind) ? compute_tid[track.first] : comm_tid[track.first]);
      EXPECT_GE(sorted[i].dur, 0);
      if (i > 0) {
        EXPECT_GT(sorted[i].ts, sorted[i - 1].ts) << ActionToString(a);
        EXPECT_GE(sorted[i].ts, sorted[i - 1].ts + sorted[i - 1].dur) << ActionToString(a);
      }
      sends += a.kind == v1::ACTION_SEND_F || a.kind == v1::ACTION_SEND_B;
      recvs += a.kind == v1::ACTION_RECV_F || a.kind == v1::ACTION_RECV_B;
    }
  }

  // Every send has exactly one flow, and it ends on the receive of the same message.
  EXPECT_EQ(sends, total_links);
  EXPECT_EQ(recvs, total_links);
  EXPECT_EQ(trace.flows.size(), total_links);
  std::set<std::tuple<int64_t, int, int, int>> flowed_sends;  // step, stage, kind, micro-batch
  for (const auto& [id, events] : trace.flows) {
    ASSERT_EQ(events.size(), 2u) << "flow " << id;
    const Value& s = Str(events[0], "ph") == "s" ? events[0] : events[1];
    const Value& f = Str(events[0], "ph") == "s" ? events[1] : events[0];
    ASSERT_EQ(Str(s, "ph"), "s");
    ASSERT_EQ(Str(f, "ph"), "f");
    EXPECT_EQ(Str(f, "bp"), "e");
    EXPECT_EQ(Str(s, "name"), Str(f, "name"));
    EXPECT_EQ(Str(s, "cat"), Str(f, "cat"));
    EXPECT_GE(Num(f, "ts"), Num(s, "ts")) << "flow " << id << " ends before it starts";
    const JsonSlice* from = BoundSlice(trace, s);
    const JsonSlice* to = BoundSlice(trace, f);
    ASSERT_NE(from, nullptr);
    ASSERT_NE(to, nullptr);
    EXPECT_TRUE(from->action.kind == v1::ACTION_SEND_F || from->action.kind == v1::ACTION_SEND_B)
        << ActionToString(from->action);
    EXPECT_LE(Num(f, "ts"), to->ts + std::max(0.0, to->dur)) << ActionToString(to->action);
    EXPECT_EQ(MessageOf(from->action), MessageOf(to->action))
        << ActionToString(from->action) << " -> " << ActionToString(to->action);
    EXPECT_NE(from->action.kind, to->action.kind);
    EXPECT_EQ(from->step, to->step);
    EXPECT_TRUE(
        flowed_sends
            .insert({from->step, from->action.stage, from->action.kind, from->action.micro_batch})
            .second)
        << "two flows from " << ActionToString(from->action);
  }

  // Busy time per stage from the trace equals the timeline's.
  std::map<int, double> busy;
  for (const auto& [track, slices] : trace.tracks) {
    if (track.second != compute_tid[track.first]) continue;
    for (const JsonSlice& s : slices) busy[track.first - 1] += s.dur;
  }
  for (size_t s = 0; s < num_stages; ++s) {
    int64_t expected = 0;
    for (const StepTimeline& t : timelines) expected += t.stages[s].busy_us;
    EXPECT_NEAR(busy[static_cast<int>(s)], static_cast<double>(expected), 1e-6) << "stage " << s;
  }
}

TEST(TraceEventJson, TwoStageStepHasOneFlowPerSendAndNoOverlaps) {
  absl::StatusOr<StepTimeline> t =
      BuildStepTimeline(Lowered("1f1b", 2, 2), TwoStageReports(), {0, kRank1Behind},
                        {"127.0.0.1:5001", "127.0.0.1:5002"});
  ASSERT_TRUE(t.ok()) << t.status();
  CheckTrace({*t});
  const ParsedTrace trace = Parse(TraceEventJson(*t));
  EXPECT_EQ(trace.process_names.at(1), "stage 0 (rank 0, 127.0.0.1:5001)");
  EXPECT_EQ(trace.process_names.at(2), "stage 1 (rank 1, 127.0.0.1:5002)");
}

TEST(TraceEventJson, FourStageStepHasOneFlowPerSendAndNoOverlaps) {
  const StepTimeline t = FourStageTimeline();
  ASSERT_EQ(t.transfers.size(), 3u * 8 * 2);  // 3 links, 8 micro-batches, both directions
  CheckTrace({t});
}

// Sends take no time in the simulated step, so zero-length slices abut the receives after
// them; on every schedule each flow still binds to its own send and receive.
TEST(TraceEventJson, EveryScheduleHasOneFlowPerSend) {
  for (const char* name : {"gpipe", "1f1b", "interleaved_1f1b", "zb_h1", "zb_v"}) {
    SCOPED_TRACE(name);
    absl::StatusOr<Schedule> compute = GenerateSchedule(name, 2, 4);
    ASSERT_TRUE(compute.ok()) << compute.status();
    const Schedule lowered = LowerWithTransfers(*compute);
    absl::StatusOr<SimulationResult> sim =
        SimulateSchedule(lowered, ActionCosts{0.001, 0.002, 0.001, 0.001, 0.0001});
    ASSERT_TRUE(sim.ok()) << sim.status();
    std::vector<v1::StepReport> reports(2);
    for (int r = 0; r < 2; ++r) {
      reports[r].set_rank(r);
      for (size_t i = 0; i < lowered.program[r].size(); ++i) {
        AddTiming(&reports[r], static_cast<int>(i), kT0 + std::llround(sim->start[r][i] * 1e6),
                  kT0 + std::llround(sim->end[r][i] * 1e6));
      }
    }
    absl::StatusOr<StepTimeline> t = BuildStepTimeline(lowered, reports);
    ASSERT_TRUE(t.ok()) << t.status();
    CheckTrace({*t});
  }
}

TEST(TraceEventJson, LaysSeveralStepsEndToEnd) {
  const StepTimeline a = FourStageTimeline(3);
  const StepTimeline b = FourStageTimeline(4);
  CheckTrace({a, b});
  const ParsedTrace trace = Parse(TraceEventJson({a, b}));
  double first_of_b = 1e18, last_of_a = 0;
  for (const auto& [track, slices] : trace.tracks) {
    for (const JsonSlice& s : slices) {
      // The file numbers steps from 1: indices 3 and 4 are steps 4 and 5.
      if (s.step == 5) first_of_b = std::min(first_of_b, s.ts);
      if (s.step == 4) last_of_a = std::max(last_of_a, s.ts + s.dur);
    }
  }
  EXPECT_DOUBLE_EQ(first_of_b, static_cast<double>(a.span_us));
  EXPECT_DOUBLE_EQ(last_of_a, static_cast<double>(a.span_us));
  EXPECT_EQ(trace.flows.size(), a.transfers.size() + b.transfers.size());
}

TEST(TraceEventJson, EscapesLabels) {
  absl::StatusOr<StepTimeline> t = BuildStepTimeline(
      Lowered("1f1b", 2, 2), TwoStageReports(), {0, kRank1Behind}, {"a \"quoted\"\\name", "b\n"});
  ASSERT_TRUE(t.ok()) << t.status();
  const ParsedTrace trace = Parse(TraceEventJson(*t));
  EXPECT_EQ(trace.process_names.at(1), "stage 0 (rank 0, a \"quoted\"\\name)");
  EXPECT_EQ(trace.process_names.at(2), "stage 1 (rank 1, b\n)");
}

// ---------------------------------------------------------------------------------------------
// GanttSvg

size_t Count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

const char kGolden[] = TANDEM_SOURCE_DIR "/tests/common/testdata/trace_1f1b_4.svg";

TEST(GanttSvg, OneRowPerStageAndOneRectPerComputeAction) {
  const StepTimeline t = FourStageTimeline();
  const std::string svg = GanttSvg(t);
  size_t compute = 0;
  for (const TimelineSlice& s : t.slices) compute += IsComputeAction(s.kind);
  EXPECT_EQ(compute, 4u * 8 * 2);
  EXPECT_EQ(Count(svg, "<g class=\"row\""), 4u);
  EXPECT_EQ(Count(svg, "<rect class=\"act "), compute);
  EXPECT_EQ(Count(svg, "<rect class=\"act F\""), 32u);
  EXPECT_EQ(Count(svg, "<rect class=\"act B\""), 32u);
  EXPECT_EQ(Count(svg, "<rect class=\"xfer "), t.slices.size() - compute);
  // Self-contained: nothing to run or fetch.
  EXPECT_EQ(Count(svg, "<script"), 0u);
  EXPECT_EQ(Count(svg, "href"), 0u);
  EXPECT_EQ(Count(svg, "http"), 1u);  // the SVG namespace only
  EXPECT_EQ(Count(svg, "@import"), 0u);
  for (int s = 0; s < 4; ++s) {
    EXPECT_THAT(svg, HasSubstr(absl::StrCat(">stage ", s, "</text>")));
    EXPECT_THAT(svg, HasSubstr(absl::StrFormat(">%.1f%%</text>", 100 * t.stages[s].bubble)));
  }
  EXPECT_EQ(GanttSvg(t), svg);  // deterministic
}

TEST(GanttSvg, MatchesTheGoldenFile) {
  const std::string svg = GanttSvg(FourStageTimeline());
  const char* update = std::getenv("TANDEM_UPDATE_GOLDEN");
  if (update != nullptr && std::string(update) == "1") {
    std::ofstream(kGolden, std::ios::binary) << svg;
    GTEST_SKIP() << "rewrote " << kGolden;
  }
  std::ifstream in(kGolden, std::ios::binary);
  ASSERT_TRUE(in.good()) << "missing " << kGolden << "; run with TANDEM_UPDATE_GOLDEN=1";
  std::stringstream golden;
  golden << in.rdbuf();
  EXPECT_TRUE(golden.str() == svg)
      << "the SVG differs from " << kGolden
      << "; if the change is intended, check the new chart and rerun with TANDEM_UPDATE_GOLDEN=1";
}

TEST(GanttSvg, ShowsOnlyTheKindsPresentAndEscapesText) {
  absl::StatusOr<StepTimeline> t = BuildStepTimeline(Lowered("1f1b", 2, 2), TwoStageReports(),
                                                     {0, kRank1Behind}, {"<a&b>", "x"});
  ASSERT_TRUE(t.ok()) << t.status();
  const std::string svg = GanttSvg(*t, {.title = "job \"j-1\" & co"});
  EXPECT_THAT(svg, HasSubstr(">job &quot;j-1&quot; &amp; co</text>"));
  EXPECT_THAT(svg, HasSubstr("rank 0, &lt;a&amp;b&gt;"));
  EXPECT_THAT(svg, HasSubstr("F forward"));
  EXPECT_THAT(svg, HasSubstr("B backward"));
  EXPECT_EQ(Count(svg, "I input gradient"), 0u);
  EXPECT_EQ(Count(svg, "W weight gradient"), 0u);
}

TEST(GanttSvg, DrawsSplitBackwardsInTheirOwnColours) {
  const Schedule lowered = Lowered("zb_h1", 2, 2);
  absl::StatusOr<SimulationResult> sim = SimulateSchedule(lowered);
  ASSERT_TRUE(sim.ok()) << sim.status();
  std::vector<v1::StepReport> reports(2);
  for (int r = 0; r < 2; ++r) {
    reports[r].set_rank(r);
    for (size_t i = 0; i < lowered.program[r].size(); ++i) {
      AddTiming(&reports[r], static_cast<int>(i), std::llround(sim->start[r][i] * 1000),
                std::llround(sim->end[r][i] * 1000));
    }
  }
  absl::StatusOr<StepTimeline> t = BuildStepTimeline(lowered, reports);
  ASSERT_TRUE(t.ok()) << t.status();
  const std::string svg = GanttSvg(*t);
  EXPECT_EQ(Count(svg, "<rect class=\"act I\""), 4u);
  EXPECT_EQ(Count(svg, "<rect class=\"act W\""), 4u);
  EXPECT_EQ(Count(svg, "<rect class=\"act B\""), 0u);
  EXPECT_THAT(svg, HasSubstr("I input gradient"));
  EXPECT_THAT(svg, HasSubstr("W weight gradient"));
}

}  // namespace
}  // namespace tandem
