#pragma once
// Where a job's ranks run: this host's name, and the layout that one group per host needs
// (hybrid sharding's default shard group), from the hosts the rendezvous found (ProcessGroup::hosts()).
#include <string>
#include <vector>

#include "coshard/runtime/error.hpp"

namespace coshard::launch {

/// This host's name (gethostname), as the rendezvous records it for each rank and as errors name
/// it; "?" when it has none, so that a record of words keeps its fields.
std::string this_host();

/// The ranks each host holds, given each rank's host in rank order, when every host holds the
/// same number of consecutive ranks. Else bad_config saying what breaks that: "the hosts hold
/// different numbers of ranks (node1: 2, node2: 1)", or "the ranks of node1 are not consecutive
/// (rank 0, then rank 2 after rank 1 on node2)". An empty list is bad_config too.
Result<int> ranks_per_host(const std::vector<std::string>& host_of_rank);

}  // namespace coshard::launch
