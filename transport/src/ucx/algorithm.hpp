// Which schedule a UCX operation runs on: one decision, taken from the operation and what the
// ranks agreed when the communicator was made, so every rank that issued the same operation takes
// the same one (docs/transport.md, "UCX backend"). The flight record and the
// coshard_collective_algorithm_total counter name the schedule that ran.
#pragma once

#include <cstddef>
#include <string_view>

#include "coshard/transport/communicator.hpp"

namespace coshard::transport::detail {

enum class Algorithm {
  p2p,           // send, recv
  mesh,          // small collectives: one message per peer (mesh.hpp)
  direct,        // peers' shared buffers read in place (direct.hpp); a try, see choose()
  hierarchical,  // the two-level schedule across hosts (hierarchy.hpp)
  ring,          // everything else
};

std::string_view to_string(Algorithm a) noexcept;

// The schedules a communicator set up; the same on every rank (agreed at creation).
struct Paths {
  int size = 1;
  bool mesh_takes = false;  // the mesh takes this operation (Mesh::takes, which knows its limits)
  bool direct = false;      // the direct path is set up
  std::size_t direct_min_bytes = 1;  // per rank
  bool hierarchy = false;            // the two-level schedule is set up
  std::size_t hierarchy_min_bytes = 0;  // of the whole buffer (buffer_bytes)
};

// All-gather's output, reduce-scatter's input, all-reduce's buffer, in bytes.
std::size_t buffer_bytes(const OpInfo& info, int size) noexcept;

// The schedule `info` takes first, in the order mesh, direct, hierarchical, ring. Direct is a
// try: when a peer's buffers turn out not all shared it gives up, and the operation takes
// choose(info, paths) with paths.direct false.
Algorithm choose(const OpInfo& info, const Paths& paths) noexcept;

}  // namespace coshard::transport::detail
