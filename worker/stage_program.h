// Checks of and queries on a stage program (tandem.v1.StageProgram): what one worker runs in a
// step, its stages ("chunks") and their action lists. The executor (worker/executor.h) runs a
// program that ValidateStageProgram accepted; the stage manager and the worker's main read
// the queries before building one.
//
// Thread-safety: pure functions of the program.
#ifndef TANDEM_WORKER_STAGE_PROGRAM_H_
#define TANDEM_WORKER_STAGE_PROGRAM_H_

#include <vector>

#include "absl/status/status.h"
#include "google/protobuf/repeated_ptr_field.h"
#include "tandem/v1/common.pb.h"

namespace tandem::worker {

// Static checks of a stage program (INVALID_ARGUMENT with a message naming the field):
// ranks, stages and their placement, the layer ranges against the model, batch sizes, and
// the action list (every action on a stage of this worker, micro-batches in range, each
// micro-batch's F, its backward (B, or I then W) and the transfers its stages need exactly
// once and in an order that can run). Cheap; call it before building anything.
absl::Status ValidateStageProgram(const v1::StageProgram& program);

// Micro-batches per step: program.micro_batches, or the spec's when the program leaves it 0.
int MicroBatchesOf(const v1::StageProgram& program);

// Whether the worker reads the data (it holds the embedding or the head).
bool StageNeedsCorpus(const v1::StageProgram& program);

// The ranks a worker running `program` exchanges tensors with, ascending, without its own: the
// ranks holding the stages next to each of its stages (activations forward, gradients back)
// and, for a GPT with tied embeddings, the first and the last stage's ranks with each other
// (the tied gradient). Symmetric over a job's programs: a lists b exactly when b lists a, so a
// transport that connects only these pairs (NCCL's) connects each pair from both ends.
std::vector<int> TransferPeers(const v1::StageProgram& program);

// Data parallelism: what a TransportFactory connects for the data-parallel group of `program`
// (num_replicas > 1): the same job and spec, rank = program.replica, num_ranks =
// program.num_replicas, rendezvous_prefix = program.dp_rendezvous_prefix; no stages or actions.
v1::StageProgram DataParallelGroupProgram(const v1::StageProgram& program);

// The receive order of an action list: per action, the index of the first receive (RECV_F or
// RECV_B) after it, or -1. The executor posts that receive before the action's compute, so
// that the transfer overlaps it.
std::vector<int> NextReceives(const google::protobuf::RepeatedPtrField<v1::Action>& actions);

}  // namespace tandem::worker

#endif  // TANDEM_WORKER_STAGE_PROGRAM_H_
