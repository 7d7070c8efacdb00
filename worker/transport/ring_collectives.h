// The host-memory GroupCollectives (group_collectives.h): the ring of ring_allreduce.h over the
// group's Transport (Gloo between CPU workers). Tensors of at least 1 MiB are reduced in place,
// one ring each; the smaller ones of a call (biases, norm gains) travel coalesced in one ring
// all-reduce, which for kReduceScatter is a superset of it and for kAllGather a sum in which
// only the owner's segment is non-zero (exact: x + 0 = x), so every rank still ends
// bit-identical.
//
// Thread-safety: as GroupCollectives.
#ifndef TANDEM_WORKER_TRANSPORT_RING_COLLECTIVES_H_
#define TANDEM_WORKER_TRANSPORT_RING_COLLECTIVES_H_

#include <memory>

#include "worker/transport/group_collectives.h"
#include "worker/transport/transport.h"

namespace tandem::worker {

std::unique_ptr<GroupCollectives> NewRingCollectives(std::unique_ptr<Transport> group);

}  // namespace tandem::worker

#endif  // TANDEM_WORKER_TRANSPORT_RING_COLLECTIVES_H_
