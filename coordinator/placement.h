// Placement: which idle workers a gang of stages x replicas takes, and which (stage, replica)
// each one plays, from the node (machine) each worker runs on (RegisterRequest.node).
//
// The cost model is the node: workers of one node share its cheapest links (loopback, shared
// memory, NVLink), links between nodes are the expensive ones. Of a job's traffic the
// data-parallel reduction is the heavy part (every step, every gradient, 2 (R - 1) / R of it
// each way) while a pipeline hop carries one activation per micro-batch, so:
//   1. the gang is packed onto as few nodes as it can: nodes with more idle workers first
//      (registration order breaks ties), a node's workers in registration order;
//   2. the chosen workers are dealt out stage-major (stage 0's R replicas, then stage 1's ...)
//      node by node, so that each stage's data-parallel group shares a node whenever a node
//      holds R of them, and consecutive stages share one too when it holds 2R; a pipeline
//      crosses nodes only where a node runs out.
// All on one node, the workers keep their registration order (gang rank = index), as before
// placement existed.
//
// Pure functions: the registry calls them under its lock; tests call them directly.
#ifndef TANDEM_COORDINATOR_PLACEMENT_H_
#define TANDEM_COORDINATOR_PLACEMENT_H_

#include <string>
#include <vector>

namespace tandem::coordinator {

// `nodes`: each idle candidate's node, in registration order. Returns stages x replicas
// candidate indices by gang rank (replica-major: gang rank = replica x stages + stage), or
// empty when there are fewer candidates.
std::vector<int> PlaceGang(const std::vector<std::string>& nodes, int stages, int replicas);

// How a placed gang (its workers' nodes by gang rank) uses the nodes, for the log: "8 workers
// on 2 nodes; 4 of 4 stages' 2 replicas share a node; 2 of 6 pipeline hops cross nodes".
std::string DescribePlacement(const std::vector<std::string>& gang_nodes, int stages, int replicas);

}  // namespace tandem::coordinator

#endif  // TANDEM_COORDINATOR_PLACEMENT_H_
