#pragma once
// The UCX backend: host memory over shared memory, CMA or TCP (whatever UCX picks, or UCX_TLS),
// ring algorithms on tagged messages, one UCX worker and one in-order stream per communicator.
// When every rank is on this host and the buffers are shared segments (Runtime's host memory),
// all-gather, reduce-scatter and all-reduce take the direct path instead: each rank reads its
// peers' buffers itself, one copy (docs/transport.md, "The direct path").
//
// Error mode. In UCX 1.13, endpoints that ask for peer-failure reports (PEER mode) can only use
// TCP (about 1.7 GB/s here), while mode NONE may use shared memory and CMA (7 to 20 GB/s). So when
// every rank is on this host the default is NONE and a dead peer is found by other means: its
// process is checked every `liveness_interval` while an operation waits on it, and every
// operation has a deadline. Across hosts the default is PEER. COSHARD_UCX_ERROR_MODE=peer|none
// overrides the choice.
#include <chrono>
#include <cstddef>
#include <memory>

#include "coshard/runtime/runtime.hpp"
#include "coshard/transport/communicator.hpp"
#include "coshard/launch/store.hpp"

namespace coshard::transport {

/// Settings of the UCX backend, shared by the communicators a ProcessGroup creates.
struct UcxOptions {
  /// How a dead peer is detected: peer (UCX reports it; TCP only), none (shared memory allowed;
  /// liveness checks and deadlines find it), or automatic (none on one host, peer across hosts).
  enum class ErrorMode { automatic, peer, none };
  ErrorMode error_mode = ErrorMode::automatic;  ///< `COSHARD_UCX_ERROR_MODE=peer|none|auto` overrides it
  /// Messages are cut into pieces of this size so that forwarding and reduction of one piece
  /// overlap the transfer of the next.
  std::size_t pipeline_bytes = 1u << 20;
  /// How often a waiting operation checks that the peers it waits on, those on this host, still run.
  std::chrono::milliseconds liveness_interval{250};
  /// Address exchange and connection set-up.
  std::chrono::milliseconds connect_timeout{120000};
  /// The network devices UCX may use (UCX_NET_DEVICES) unless the environment names them: empty,
  /// UCX's choice, which listens on every interface. ProcessGroup::create gives "lo" to a job on
  /// one host (where neither UCX_NET_DEVICES nor UCX_TLS is set), so that its ranks listen on
  /// loopback only.
  std::string net_devices;
  /// Single-copy collectives through shared memory when every rank is on this host (docs/transport.md):
  /// all-gather, reduce-scatter and all-reduce of at least `direct_min_bytes` per rank whose buffers
  /// are shared segments (Runtime::Options::shared_host_memory). COSHARD_UCX_DIRECT=0|1 overrides
  /// `direct`, COSHARD_UCX_DIRECT_MIN_BYTES the threshold.
  bool direct = true;
  /// Smallest message per rank that takes the direct path; the ranks use the largest any of them sets.
  std::size_t direct_min_bytes = std::size_t{32} << 10;
  /// Two-level all-gather, reduce-scatter and all-reduce when the ranks span hosts with the same
  /// number (more than one) on each: shared memory inside a host, each byte crosses between hosts
  /// once (docs/transport.md, "Across hosts"). Off on any rank: the flat ring for all.
  /// COSHARD_UCX_HIERARCHY=0|1 overrides it, COSHARD_UCX_HIERARCHY_MIN_BYTES the threshold.
  bool hierarchy = true;
  /// Smallest buffer (all-gather's output, reduce-scatter's input, all-reduce's buffer) that takes
  /// the two-level schedule; the ranks use the largest any of them sets. Below 16 KiB the flat ring's
  /// fewer steps win (docs/benchmarks.md, "Across hosts").
  std::size_t hierarchy_min_bytes = std::size_t{16} << 10;
  /// Two-level operations over buffers of at least twice this are cut into chunks of about this
  /// size (at most 8) whose phases overlap: one chunk crosses between hosts while the next is
  /// reduced inside its host. 0: the phases run one after another. The ranks use the largest any of
  /// them sets, or 0 if any sets it. COSHARD_UCX_HIERARCHY_CHUNK_BYTES overrides it.
  std::size_t hierarchy_chunk_bytes = std::size_t{4} << 20;
  /// All-gather, reduce-scatter and all-reduce in one round, each rank sending every peer what it
  /// needs in one message, when every rank sends at most this in all: a message latency instead of
  /// the ring's n - 1 or 2(n - 1) (docs/transport.md, "Small messages"). 0: never. The ranks use
  /// the smallest any of them sets. COSHARD_UCX_MESH_MAX_BYTES overrides it.
  std::size_t mesh_max_bytes = std::size_t{16} << 10;
};

/// Collective over the `size` ranks that share `store`: every rank calls it with the same
/// options.name. `store` may be null only when size == 1, and must outlive the communicator (split
/// uses it). Runs on the scheduler of the calling task.
Task<std::unique_ptr<Communicator>> create_ucx_communicator(Runtime& runtime, launch::StoreClient* store, int rank, int size,
                                                            CommOptions options, UcxOptions ucx);

}  // namespace coshard::transport
