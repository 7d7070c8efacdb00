#include "coordinator/step_timings.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/step_number.h"

namespace tandem::coordinator {

v1::TraceProgram TraceProgramOf(const Schedule& lowered) {
  v1::TraceProgram out;
  out.set_schedule(lowered.name);
  out.set_num_micro_batches(lowered.num_micro_batches);
  for (int r : lowered.placement.rank_of_stage) out.add_stage_ranks(r);
  for (const std::vector<Action>& actions : lowered.program) {
    out.add_rank_actions(ActionsToString(actions));
  }
  return out;
}

absl::StatusOr<Schedule> ScheduleOf(const v1::TraceProgram& program) {
  Schedule out;
  out.name = program.schedule();
  out.num_micro_batches = program.num_micro_batches();
  out.placement.num_ranks = program.rank_actions_size();
  out.placement.rank_of_stage.assign(program.stage_ranks().begin(), program.stage_ranks().end());
  if (absl::Status s = ValidatePlacement(out.placement); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("trace program: ", s.message()));
  }
  for (int r = 0; r < program.rank_actions_size(); ++r) {
    std::vector<Action>& actions = out.program.emplace_back();
    for (absl::string_view text : absl::StrSplit(program.rank_actions(r), ' ', absl::SkipEmpty())) {
      // A cell: one action or an overlapped pair, as ActionsToString wrote it.
      absl::StatusOr<std::vector<Action>> cell = ParseActionCell(text);
      if (!cell.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("trace program: rank ", r, ": ", cell.status().message()));
      }
      actions.insert(actions.end(), cell->begin(), cell->end());
    }
  }
  return out;
}

v1::StepTimings StepTimingsOf(int64_t step, const std::vector<v1::StepReport>& reports,
                              const std::vector<int64_t>& clock_offsets_us) {
  v1::StepTimings out;
  out.set_step(step);
  for (int64_t offset : clock_offsets_us) out.add_clock_offsets_us(offset);
  std::vector<const v1::StepReport*> by_rank;
  for (const v1::StepReport& r : reports) by_rank.push_back(&r);
  std::sort(by_rank.begin(), by_rank.end(),
            [](const v1::StepReport* a, const v1::StepReport* b) { return a->rank() < b->rank(); });
  for (const v1::StepReport* report : by_rank) {
    v1::RankTimings* rank = out.add_ranks();
    rank->set_rank(report->rank());
    rank->set_bytes_sent(report->bytes_sent());
    rank->set_bytes_received(report->bytes_received());
    int64_t origin = std::numeric_limits<int64_t>::max();
    for (const v1::ActionTiming& t : report->timings()) origin = std::min(origin, t.start_us());
    if (report->timings().empty()) origin = 0;
    rank->set_origin_us(origin);
    bool device = false;
    for (const v1::ActionTiming& t : report->timings()) {
      rank->add_index(t.index());
      rank->add_start_us(t.start_us() - origin);
      rank->add_end_us(t.end_us() - origin);
      device = device || t.device_us() > 0;
    }
    if (device) {
      for (const v1::ActionTiming& t : report->timings()) rank->add_device_us(t.device_us());
    }
  }
  return out;
}

std::vector<v1::StepReport> ReportsOf(const v1::StepTimings& step) {
  std::vector<v1::StepReport> out;
  for (const v1::RankTimings& rank : step.ranks()) {
    v1::StepReport& report = out.emplace_back();
    report.set_step(step.step());
    report.set_rank(rank.rank());
    const int n = std::min({rank.index_size(), rank.start_us_size(), rank.end_us_size()});
    for (int i = 0; i < n; ++i) {
      v1::ActionTiming* t = report.add_timings();
      t->set_index(rank.index(i));
      t->set_start_us(rank.origin_us() + rank.start_us(i));
      t->set_end_us(rank.origin_us() + rank.end_us(i));
      if (i < rank.device_us_size()) t->set_device_us(rank.device_us(i));
    }
  }
  return out;
}

size_t TimingCount(const v1::StepTimings& step) {
  size_t n = 0;
  for (const v1::RankTimings& rank : step.ranks()) n += static_cast<size_t>(rank.index_size());
  return n;
}

void KeepStepTimings(v1::JobTimings* timings, v1::StepTimings step, const TimingRetention& policy) {
  auto* steps = timings->mutable_steps();
  if (timings->sample_stride() <= 0) timings->set_sample_stride(1);
  // The byte counters count every step recorded, before retention drops any.
  for (const v1::RankTimings& rank : step.ranks()) {
    if (rank.rank() < 0 || rank.rank() >= (1 << 16)) continue;
    while (timings->rank_bytes_sent_size() <= rank.rank()) timings->add_rank_bytes_sent(0);
    while (timings->rank_bytes_received_size() <= rank.rank()) {
      timings->add_rank_bytes_received(0);
    }
    timings->set_rank_bytes_sent(rank.rank(),
                                 timings->rank_bytes_sent(rank.rank()) + rank.bytes_sent());
    timings->set_rank_bytes_received(
        rank.rank(), timings->rank_bytes_received(rank.rank()) + rank.bytes_received());
  }
  // A step recorded again (rerun after a failure) supersedes what was kept of it and after it.
  int keep = steps->size();
  while (keep > 0 && steps->Get(keep - 1).step() >= step.step()) --keep;
  steps->DeleteSubrange(keep, steps->size() - keep);

  // How many steps the timing budget allows at this step's size.
  const size_t per_step = std::max<size_t>(1, TimingCount(step));
  const size_t fit = std::max<size_t>(1, policy.max_timings / per_step);
  const size_t recent = std::clamp<size_t>(policy.recent, 1, fit);
  const size_t sampled = std::min(policy.sampled, fit - recent);
  *steps->Add() = std::move(step);

  // Older than the `recent` last: kept while a multiple of the stride, which doubles until at
  // most `sampled` of them are.
  const int older = std::max(0, steps->size() - static_cast<int>(recent));
  auto multiples = [&](int64_t stride) {
    size_t n = 0;
    for (int i = 0; i < older; ++i) n += steps->Get(i).step() % stride == 0;
    return n;
  };
  int64_t stride = timings->sample_stride();
  if (sampled > 0) {
    while (multiples(stride) > sampled) stride *= 2;
  }
  timings->set_sample_stride(stride);
  google::protobuf::RepeatedPtrField<v1::StepTimings> kept;
  for (int i = 0; i < steps->size(); ++i) {
    const bool is_recent = i >= older;
    if (is_recent || (sampled > 0 && steps->Get(i).step() % stride == 0)) {
      *kept.Add() = std::move(*steps->Mutable(i));
    }
  }
  steps->Swap(&kept);
}

std::vector<int64_t> KeptSteps(const v1::JobTimings& timings) {
  std::vector<int64_t> out;
  for (const v1::StepTimings& s : timings.steps()) out.push_back(s.step());
  return out;
}

std::string FormatSteps(const std::vector<int64_t>& steps) {
  std::vector<std::string> parts;
  for (size_t i = 0; i < steps.size();) {
    size_t j = i;
    while (j + 1 < steps.size() && steps[j + 1] == steps[j] + 1) ++j;
    if (j - i >= 2) {
      parts.push_back(absl::StrCat(StepNumber(steps[i]), "..", StepNumber(steps[j])));
    } else {
      for (size_t k = i; k <= j; ++k) parts.push_back(absl::StrCat(StepNumber(steps[k])));
    }
    i = j + 1;
  }
  return absl::StrJoin(parts, ", ");
}

absl::StatusOr<StepTimeline> TimelineOf(const Schedule& lowered, const v1::StepTimings& step,
                                        const std::vector<std::string>& stage_labels) {
  const std::vector<int64_t> offsets(step.clock_offsets_us().begin(),
                                     step.clock_offsets_us().end());
  return BuildStepTimeline(lowered, ReportsOf(step), offsets, stage_labels);
}

absl::StatusOr<v1::GetJobTraceResponse> RenderJobTrace(const v1::Job& job,
                                                       const v1::JobTimings& timings,
                                                       const v1::GetJobTraceRequest& request,
                                                       size_t max_bytes) {
  const bool svg = request.format() == v1::TRACE_FORMAT_SVG;
  if (request.has_step() && (request.has_first_step() || request.has_last_step())) {
    return absl::InvalidArgumentError("give a step or a range of steps, not both");
  }
  if (request.has_first_step() != request.has_last_step()) {
    return absl::InvalidArgumentError("a range of steps needs both first_step and last_step");
  }
  if (request.has_first_step() && request.first_step() > request.last_step()) {
    return absl::InvalidArgumentError(absl::StrCat("the range of steps ",
                                                   StepNumber(request.first_step()), "..",
                                                   StepNumber(request.last_step()), " is empty"));
  }
  const std::vector<int64_t> kept = KeptSteps(timings);
  if (kept.empty()) {
    return absl::NotFoundError(absl::StrCat("job ", job.id(), " has no step timings yet (",
                                            v1::JobState_Name(job.state()), ", ", job.steps_done(),
                                            " steps done)"));
  }
  const std::string kept_text = absl::StrCat("kept steps: ", FormatSteps(kept));
  std::vector<const v1::StepTimings*> chosen;
  if (request.has_step()) {
    for (const v1::StepTimings& s : timings.steps()) {
      if (s.step() == request.step()) chosen.push_back(&s);
    }
    if (chosen.empty()) {
      return absl::NotFoundError(absl::StrCat("job ", job.id(), " keeps no timings of step ",
                                              StepNumber(request.step()), "; ", kept_text));
    }
  } else if (request.has_first_step()) {
    for (const v1::StepTimings& s : timings.steps()) {
      if (s.step() >= request.first_step() && s.step() <= request.last_step()) chosen.push_back(&s);
    }
    if (chosen.empty()) {
      return absl::NotFoundError(absl::StrCat("job ", job.id(), " keeps no timings of steps ",
                                              StepNumber(request.first_step()), "..",
                                              StepNumber(request.last_step()), "; ", kept_text));
    }
  } else {
    chosen.push_back(&timings.steps(timings.steps_size() - 1));
  }
  if (svg && chosen.size() > 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("an SVG chart shows one step, and steps ", StepNumber(request.first_step()),
                     "..", StepNumber(request.last_step()), " hold ", chosen.size(),
                     " kept steps; ask for one "
                     "step, or for JSON"));
  }

  absl::StatusOr<Schedule> lowered = ScheduleOf(timings.program());
  if (!lowered.ok()) {
    return absl::DataLossError(absl::StrCat("job ", job.id(), ": ", lowered.status().message()));
  }
  std::vector<std::string> labels;
  const int replicas = job.stages_size() > 0 ? job.stages(0).replicas_size() : 0;
  if (job.stages_size() == lowered->placement.num_stages()) {
    for (const v1::StageAssignment& a : job.stages()) {
      labels.push_back(a.worker_id().empty() ? a.address()
                                             : absl::StrCat(a.worker_id(), " ", a.address()));
    }
  } else if (replicas > 1 && job.stages_size() * replicas == lowered->placement.num_stages()) {
    // A data-parallel job's trace shows every replica's pipeline: stage r S + s is stage s of
    // replica r.
    for (int r = 0; r < replicas; ++r) {
      for (const v1::StageAssignment& a : job.stages()) {
        const v1::ReplicaWorker& w = a.replicas(r);
        labels.push_back(absl::StrCat("stage ", a.stage(), " of replica ", w.replica(), ": ",
                                      w.worker_id(), " ", w.address()));
      }
    }
  }
  std::vector<StepTimeline> timelines;
  size_t timings_total = 0;
  for (const v1::StepTimings* s : chosen) {
    // A rough size check before rendering: a JSON event takes about 200 bytes.
    timings_total += TimingCount(*s);
    if (timings_total * 200 > max_bytes) {
      return absl::ResourceExhaustedError(absl::StrCat("the trace of ", chosen.size(),
                                                       " steps would pass ", max_bytes >> 20,
                                                       " MiB; ask for fewer steps"));
    }
    absl::StatusOr<StepTimeline> t = TimelineOf(*lowered, *s, labels);
    if (!t.ok()) {
      return absl::DataLossError(absl::StrCat("job ", job.id(), " step ", StepNumber(s->step()),
                                              ": ", t.status().message()));
    }
    timelines.push_back(*std::move(t));
  }

  v1::GetJobTraceResponse out;
  if (svg) {
    const StepTimeline& t = timelines[0];
    GanttOptions options;
    options.title =
        absl::StrFormat("%s (%s) step %d: %s, %d ranks, %d micro-batches, %.3f ms", job.id(),
                        job.name(), StepNumber(t.step), t.schedule, t.num_ranks,
                        t.num_micro_batches, static_cast<double>(t.span_us) / 1000.0);
    out.set_content(GanttSvg(t, options));
  } else {
    out.set_content(TraceEventJson(timelines));
  }
  if (out.content().size() > max_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat("the trace is ", out.content().size() >> 20,
                                                     " MiB, more than ", max_bytes >> 20,
                                                     " MiB; ask for fewer steps"));
  }
  for (const v1::StepTimings* s : chosen) out.add_steps(s->step());
  for (int64_t s : kept) out.add_kept_steps(s);
  return out;
}

}  // namespace tandem::coordinator
