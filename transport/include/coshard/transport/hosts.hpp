#pragma once
// Where a job's ranks run, as the rendezvous found them (ProcessGroup::hosts()): the layout that
// one group per host needs (hybrid sharding's default shard group).
#include <string>
#include <vector>

#include "coshard/runtime/error.hpp"

namespace coshard::transport {

/// The ranks each host holds, given each rank's host in rank order, when every host holds the
/// same number of consecutive ranks. Else bad_config saying what breaks that: "the hosts hold
/// different numbers of ranks (node1: 2, node2: 1)", or "the ranks of node1 are not consecutive
/// (rank 0, then rank 2 after rank 1 on node2)". An empty list is bad_config too.
Result<int> ranks_per_host(const std::vector<std::string>& host_of_rank);

}  // namespace coshard::transport
