#include "common/schedule.h"

#include <algorithm>
#include <cctype>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace tandem {
namespace {

struct KindName {
  ActionKind kind;
  const char* name;
};
// Longest names first so that parsing "SEND_F" is not mistaken for "F"-prefixed text.
constexpr KindName kKindNames[] = {
    {v1::ACTION_SEND_F, "SEND_F"}, {v1::ACTION_RECV_F, "RECV_F"}, {v1::ACTION_SEND_B, "SEND_B"},
    {v1::ACTION_RECV_B, "RECV_B"}, {v1::ACTION_F, "F"},           {v1::ACTION_B, "B"},
    {v1::ACTION_I, "I"},           {v1::ACTION_W, "W"},
};

const char* KindName(ActionKind kind) {
  for (const auto& k : kKindNames) {
    if (k.kind == kind) return k.name;
  }
  return "?";
}

absl::Status CheckSizes(int num_stages, int num_micro_batches) {
  if (num_stages < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("number of stages must be at least 1, got ", num_stages));
  }
  if (num_micro_batches < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("number of micro-batches must be at least 1, got ", num_micro_batches));
  }
  return absl::OkStatus();
}

}  // namespace

std::string ActionToString(const Action& a) {
  return absl::StrCat(a.stage, KindName(a.kind), a.micro_batch);
}

absl::StatusOr<Action> ParseAction(absl::string_view text) {
  absl::string_view s = absl::StripAsciiWhitespace(text);
  size_t i = 0;
  while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) ++i;
  Action a;
  if (i == 0 || !absl::SimpleAtoi(s.substr(0, i), &a.stage)) {
    return absl::InvalidArgumentError(
        absl::StrCat("action '", s, "': expected <stage><kind><micro_batch>, e.g. 2F0"));
  }
  absl::string_view rest = s.substr(i);
  for (const auto& k : kKindNames) {
    absl::string_view name(k.name);
    if (rest.substr(0, name.size()) == name) {
      absl::string_view mb = rest.substr(name.size());
      if (mb.empty() ||
          !std::all_of(mb.begin(), mb.end(),
                       [](char c) { return std::isdigit(static_cast<unsigned char>(c)); }) ||
          !absl::SimpleAtoi(mb, &a.micro_batch)) {
        return absl::InvalidArgumentError(
            absl::StrCat("action '", s, "': expected a micro-batch number after ", name));
      }
      a.kind = k.kind;
      return a;
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "action '", s, "': unknown kind; expected F, B, I, W, SEND_F, RECV_F, SEND_B or RECV_B"));
}

std::string ActionsToString(const std::vector<Action>& actions) {
  return absl::StrJoin(actions, " ",
                       [](std::string* out, const Action& a) { out->append(ActionToString(a)); });
}

absl::StatusOr<Program> GenerateGPipe(int num_stages, int num_micro_batches) {
  if (absl::Status s = CheckSizes(num_stages, num_micro_batches); !s.ok()) return s;
  Program program(num_stages);
  for (int r = 0; r < num_stages; ++r) {
    for (int m = 0; m < num_micro_batches; ++m) program[r].push_back({r, v1::ACTION_F, m});
    for (int m = num_micro_batches - 1; m >= 0; --m) program[r].push_back({r, v1::ACTION_B, m});
  }
  return program;
}

absl::StatusOr<Program> Generate1F1B(int num_stages, int num_micro_batches) {
  if (absl::Status s = CheckSizes(num_stages, num_micro_batches); !s.ok()) return s;
  if (num_micro_batches < num_stages) {
    return absl::InvalidArgumentError(absl::StrCat(
        "1f1b needs at least as many micro-batches as stages (M >= P); got M=", num_micro_batches,
        ", P=", num_stages, ". Raise pipeline.micro_batches or use schedule: gpipe"));
  }
  Program program(num_stages);
  for (int r = 0; r < num_stages; ++r) {
    auto& list = program[r];
    const int warmup = std::min(num_stages - r - 1, num_micro_batches);
    int next_f = 0;
    int next_b = 0;
    for (; next_f < warmup; ++next_f) list.push_back({r, v1::ACTION_F, next_f});
    // Steady state: one forward, then one backward.
    while (next_f < num_micro_batches) {
      list.push_back({r, v1::ACTION_F, next_f++});
      list.push_back({r, v1::ACTION_B, next_b++});
    }
    // Cool-down: drain the backwards of the warm-up forwards.
    while (next_b < num_micro_batches) list.push_back({r, v1::ACTION_B, next_b++});
  }
  return program;
}

absl::StatusOr<Program> GenerateForwardOnly(int num_stages, int num_micro_batches) {
  if (absl::Status s = CheckSizes(num_stages, num_micro_batches); !s.ok()) return s;
  Program program(num_stages);
  for (int r = 0; r < num_stages; ++r) {
    for (int m = 0; m < num_micro_batches; ++m) program[r].push_back({r, v1::ACTION_F, m});
  }
  return program;
}

absl::StatusOr<Program> GenerateSchedule(absl::string_view schedule, int num_stages,
                                         int num_micro_batches) {
  const std::string name = absl::AsciiStrToLower(schedule);
  if (name == "1f1b") return Generate1F1B(num_stages, num_micro_batches);
  if (name == "gpipe") return GenerateGPipe(num_stages, num_micro_batches);
  return absl::InvalidArgumentError(
      absl::StrCat("unknown schedule '", schedule, "'; expected 1f1b or gpipe"));
}

Program LowerWithTransfers(const Program& compute, int num_stages) {
  Program lowered(compute.size());
  for (size_t r = 0; r < compute.size(); ++r) {
    for (const Action& a : compute[r]) {
      const bool first = a.stage == 0;
      const bool last = a.stage == num_stages - 1;
      if (a.kind == v1::ACTION_F) {
        if (!first) lowered[r].push_back({a.stage, v1::ACTION_RECV_F, a.micro_batch});
        lowered[r].push_back(a);
        if (!last) lowered[r].push_back({a.stage, v1::ACTION_SEND_F, a.micro_batch});
      } else if (a.kind == v1::ACTION_B) {
        if (!last) lowered[r].push_back({a.stage, v1::ACTION_RECV_B, a.micro_batch});
        lowered[r].push_back(a);
        if (!first) lowered[r].push_back({a.stage, v1::ACTION_SEND_B, a.micro_batch});
      } else {
        lowered[r].push_back(a);
      }
    }
  }
  return lowered;
}

std::string ProgramToCsv(const Program& program) {
  std::string out;
  for (const auto& rank : program) {
    absl::StrAppend(
        &out,
        absl::StrJoin(rank, ",",
                      [](std::string* o, const Action& a) { o->append(ActionToString(a)); }),
        "\n");
  }
  return out;
}

absl::StatusOr<Program> ProgramFromCsv(absl::string_view csv, int num_stages) {
  Program program;
  bool has_transfers = false;
  int row = 0;
  for (absl::string_view line : absl::StrSplit(csv, '\n')) {
    line = absl::StripAsciiWhitespace(line);
    if (line.empty()) continue;
    ++row;
    program.emplace_back();
    int col = 0;
    for (absl::string_view cell : absl::StrSplit(line, ',')) {
      ++col;
      cell = absl::StripAsciiWhitespace(cell);
      if (cell.empty()) continue;  // trailing commas, padded rows
      absl::StatusOr<Action> a = ParseAction(cell);
      if (!a.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("schedule CSV row ", row, " column ", col, ": ", a.status().message()));
      }
      if (a->stage != row - 1) {
        return absl::InvalidArgumentError(absl::StrCat(
            "schedule CSV row ", row, " column ", col, ": action ", cell, " belongs to stage ",
            a->stage, ", but row ", row, " is rank ", row - 1, " (one stage per rank)"));
      }
      has_transfers = has_transfers || (a->kind != v1::ACTION_F && a->kind != v1::ACTION_B &&
                                        a->kind != v1::ACTION_I && a->kind != v1::ACTION_W);
      program.back().push_back(*a);
    }
  }
  if (static_cast<int>(program.size()) != num_stages) {
    return absl::InvalidArgumentError(absl::StrCat("schedule CSV has ", program.size(),
                                                   " rows, expected one per stage: ", num_stages));
  }
  return has_transfers ? program : LowerWithTransfers(program, num_stages);
}

double IdealBubbleFraction(int num_stages, int num_micro_batches) {
  return static_cast<double>(num_stages - 1) / (num_micro_batches + num_stages - 1);
}

v1::Action ToProto(const Action& a) {
  v1::Action p;
  p.set_stage(a.stage);
  p.set_kind(a.kind);
  p.set_micro_batch(a.micro_batch);
  return p;
}

Action FromProto(const v1::Action& a) { return Action{a.stage(), a.kind(), a.micro_batch()}; }

}  // namespace tandem
