// Sum-all-reduce of host float buffers over a Transport: the gradient reduction of a
// data-parallel group (the same stage of every pipeline replica), as a ring.
//
// Ring (Patarasuk and Yuan; what Gloo's and NCCL's ring all-reduce do): the buffer is cut into
// R segments; in R - 1 reduce-scatter steps each rank sends one segment to its right neighbour
// and adds the one from its left, after which rank k holds the complete sum of segment
// (k + 1) mod R; in R - 1 all-gather steps the sums travel once around the ring. Every rank
// sends and receives 2 (R - 1) / R of the buffer, the bandwidth optimum. Each step's segment
// moves in pieces of at most `piece_bytes`, all posted at once, so that adding one piece
// overlaps the arrival of the next.
//
// Determinism: every rank ends with the same bits (each segment's sum is computed once, by one
// rank, and copied), in an order fixed by R and the segment, so replicas stay bit-identical.
//
// Written on the project's Transport rather than gloo::allreduce so that the reduction has the
// point-to-point links' timeouts, their prompt Abort() from any thread and their error messages
// naming the peer, and so that the same code runs over any Transport.
//
// Thread-safety: one call at a time per transport (the reduction's own thread); the transport's
// Abort() from any thread makes a running call return ABORTED.
#ifndef TANDEM_WORKER_TRANSPORT_RING_ALLREDUCE_H_
#define TANDEM_WORKER_TRANSPORT_RING_ALLREDUCE_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "worker/transport/transport.h"

namespace tandem::worker {

struct RingAllReduceOptions {
  // Distinguishes concurrent or consecutive reductions in the transfer tags (24 bits used).
  uint32_t id = 0;
  size_t piece_bytes = size_t{4} << 20;
};

// Replaces data[0, count) on every rank of `transport` with the element-wise sum over the ranks.
// `scratch` is resized as needed (reuse it across calls). The transport's errors (ABORTED,
// UNAVAILABLE naming the peer, DEADLINE_EXCEEDED), prefixed with the step; INVALID_ARGUMENT for
// a null buffer with count > 0. A transport of one rank leaves the data as it is.
absl::Status RingAllReduce(Transport& transport, float* data, size_t count,
                           std::vector<float>& scratch, const RingAllReduceOptions& options = {});

// The two halves, for sharded optimizer state (optimizer.shard_state): after RingReduceScatter
// this rank's OwnedSegment(count, size, rank) (common/shard_range.h) of data holds the sum over
// the ranks and the rest of data is undefined; RingAllGather copies every rank's owned segment
// to all the others (in place), so that data is the same everywhere. Errors as above.
absl::Status RingReduceScatter(Transport& transport, float* data, size_t count,
                               std::vector<float>& scratch,
                               const RingAllReduceOptions& options = {});
absl::Status RingAllGather(Transport& transport, float* data, size_t count,
                           const RingAllReduceOptions& options = {});

}  // namespace tandem::worker

#endif  // TANDEM_WORKER_TRANSPORT_RING_ALLREDUCE_H_
