#pragma once
// The agreement, at communicator creation, on whether the direct path (direct.hpp) is on.
#include <cstddef>
#include <string>

#include "coshard/launch/store.hpp"
#include "coshard/transport/ucx_communicator.hpp"

namespace coshard::transport::detail {

// What the ranks of a communicator agreed on at creation about the direct path.
struct DirectSetup {
  bool on = false;
  std::size_t min_bytes = 0;  // per rank
  std::size_t stream_min_bytes = ~std::size_t{0};  // operations this large write with streaming stores
};

// Decides, with every rank of a communicator whose ranks all run on this host, whether the
// direct path is on: each rank writes a nonce into a probe segment and publishes it; each maps
// every peer's probe (as an operation maps their buffers: /proc/<pid>/fd/<fd>) and checks the
// nonce, which fails across pid namespaces or without ptrace-read access; every rank publishes
// whether it could, and the path is on only when all could, so that all ranks agree. The
// threshold is the largest any rank asked for.
Task<DirectSetup> probe_direct(launch::StoreClient* store, std::string prefix, int rank, int size, UcxOptions ucx);

}  // namespace coshard::transport::detail
