// Pipeline schedules as data: pure functions that emit one action list per rank, with no I/O.
//
// In this release a rank holds exactly one stage (stage == rank). A compute-only program
// (F and B actions) is lowered by LowerWithTransfers(), which brackets each compute action with
// the receive it needs and the send it produces. Sends never block the sender (the transport
// posts them and waits at the end of the step), and receives are posted in program order on
// both ends of a link, so both ends derive the same order from the same program.
#ifndef TANDEM_COMMON_SCHEDULE_H_
#define TANDEM_COMMON_SCHEDULE_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "tandem/v1/common.pb.h"

namespace tandem {

using ActionKind = tandem::v1::ActionKind;

struct Action {
  int stage = 0;
  ActionKind kind = tandem::v1::ACTION_F;
  int micro_batch = 0;

  bool operator==(const Action&) const = default;
};

// One action list per rank.
using Program = std::vector<std::vector<Action>>;

// "2F0", "0B3", "3SEND_F1", "1RECV_B0": the notation of torch.distributed.pipelining.
std::string ActionToString(const Action& a);
absl::StatusOr<Action> ParseAction(absl::string_view text);
// Space-separated actions of one rank.
std::string ActionsToString(const std::vector<Action>& actions);

// GPipe: all M forwards, then all M backwards (reverse order). Any P >= 1, M >= 1.
absl::StatusOr<Program> GenerateGPipe(int num_stages, int num_micro_batches);

// 1F1B (PipeDream-Flush): stage r runs min(P-r-1, M) warm-up forwards, then alternates one
// forward and one backward, then drains the remaining backwards. Requires M >= P.
absl::StatusOr<Program> Generate1F1B(int num_stages, int num_micro_batches);

// Forward only (validation): every stage runs F for micro-batches 0..M-1 in order.
absl::StatusOr<Program> GenerateForwardOnly(int num_stages, int num_micro_batches);

// Generates the compute-only program named by `schedule` ("1f1b" or "gpipe").
absl::StatusOr<Program> GenerateSchedule(absl::string_view schedule, int num_stages,
                                         int num_micro_batches);

// Inserts RECV_F before and SEND_F after each forward (except at the pipeline ends), and
// RECV_B before and SEND_B after each backward.
Program LowerWithTransfers(const Program& compute, int num_stages);

// CSV in the format torch.distributed.pipelining reads and writes: one row per rank, one
// action per cell in the notation above ("0F0,0SEND_F0,0F1"). Rows may differ in length.
std::string ProgramToCsv(const Program& program);
// INVALID_ARGUMENT naming the row and column of a bad cell. A compute-only program (no
// SEND/RECV cells at all) is lowered with LowerWithTransfers; a program with any transfer is
// taken as written (and must then be complete: see ValidateProgram).
absl::StatusOr<Program> ProgramFromCsv(absl::string_view csv, int num_stages);

// The ideal bubble fraction (P-1)/(M+P-1) of a flush schedule with equal stage times.
double IdealBubbleFraction(int num_stages, int num_micro_batches);

v1::Action ToProto(const Action& a);
Action FromProto(const v1::Action& a);

}  // namespace tandem

#endif  // TANDEM_COMMON_SCHEDULE_H_
