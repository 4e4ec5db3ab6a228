#pragma once
// The two-level schedules of a communicator whose ranks span hosts (docs/transport.md, "Across
// hosts"). A flat ring sends every byte through as many host-crossing links as the ring has, and
// in UCX's PEER error mode even the hops inside a host go over TCP. Here each rank also has two
// smaller wires: `local`, the communicator's ranks on its host (shared memory), and `cross`, the
// ranks with its local index on every host (one per host, TCP). Then:
//   all-gather:     cross all-gather of the own block, then one local all-gather per host;
//   reduce-scatter: one local reduce-scatter per host, then a cross reduce-scatter;
//   all-reduce:     local reduce-scatter, cross all-reduce of the own block, local all-gather;
// so each byte leaves its host once, as NCCL's trees and rings across nodes do.
// Low-precision reductions are rounded once per level (twice), not once.
// A large operation is cut into chunks whose phases overlap (stage_pipeline.hpp): the cross-host
// phase of one chunk runs beside the per-host phases of the others, so only one chunk's per-host
// work is exposed instead of all of it.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "coshard/runtime/error.hpp"
#include "ring.hpp"
#include "stage_pipeline.hpp"
#include "wire.hpp"

namespace coshard::transport::detail {

// Which host each rank of a communicator is on. Hosts are numbered in order of their lowest rank,
// and the ranks of a host in rank order.
struct Topology {
  int hosts = 1;     // H
  int per_host = 1;  // L: ranks on every host
  std::vector<int> host_of, local_of;  // per rank
  std::vector<int> rank_at;            // [host * per_host + local] -> rank
  int rank(int host, int local) const { return rank_at[static_cast<std::size_t>(host * per_host + local)]; }
  std::vector<int> ranks_on(int host) const;   // the ranks of `host`: its wire's ranks, in order
  std::vector<int> ranks_at(int local) const;  // local index `local` on every host: the cross wire's
  // The layout of `peers` (indexed by rank) when a two-level schedule pays: more than one host,
  // more than one rank on each and the same number on every host. Nothing otherwise.
  static std::optional<Topology> of(const std::vector<PeerIdentity>& peers);
  std::string describe() const;  // "2 hosts x 2 ranks"
};

class Hierarchy {
 public:
  // `local` holds the ranks of this rank's host, `cross` those with its local index; both connected.
  // Operations over buffers of at least two `chunk_bytes` are cut into chunks of about that size
  // whose phases overlap; 0: never (the phases run one after another).
  Hierarchy(Topology topology, int rank, std::unique_ptr<Wire> local, std::unique_ptr<Wire> cross,
            std::size_t chunk_bytes);

  const Topology& topology() const noexcept { return topo_; }
  // How many chunks an operation over `buffer` bytes (all-gather's output, reduce-scatter's input,
  // all-reduce's buffer) is cut into, the same on every rank: at most kMaxChunks, and few enough
  // that the steps of its rings fit their tags.
  int chunks(std::size_t buffer) const noexcept;
  static constexpr int kMaxChunks = 8;
  // "hierarchical (2 hosts x 2 ranks, 8 chunks overlapped)", for the span of an operation.
  std::string describe(std::size_t buffer) const;
  Wire& local() noexcept { return *local_; }
  Wire& cross() noexcept { return *cross_; }

  // The same contracts as the communicator's operations, on its buffers; `block_bytes` and `count`
  // are per rank (the own block of all-gather, the output of reduce-scatter).
  void all_gather(std::uint64_t seq, std::byte* out, std::size_t block_bytes, std::size_t piece_bytes);
  void reduce_scatter(std::uint64_t seq, const std::byte* in, std::size_t count, void* out, const ReduceSpec& spec,
                      std::size_t piece_bytes, Scratch& scratch);
  void all_reduce(std::uint64_t seq, std::byte* inout, std::size_t count, const ReduceSpec& spec,
                  std::size_t piece_bytes, Scratch& scratch);

  // Both wires at once, as the communicator's own.
  void begin(const WaitContext& wait);
  void abort(const Error& reason);
  void cancel_all() noexcept;

 private:
  Topology topo_;
  int host_ = 0, local_index_ = 0;
  std::unique_ptr<Wire> local_, cross_;
  std::vector<std::vector<int>> host_ranks_;  // per host: Topology::ranks_on
  std::vector<int> counterparts_;             // Topology::ranks_at(this rank's local index)
  std::vector<std::byte> partial_;  // reduce-scatter: this rank's blocks summed over its host
  std::size_t chunk_bytes_ = 0;
  int max_chunks_ = 1;
  Scratch cross_scratch_;  // the cross-host stages' own: they may run beside the per-host ones
  StagePipeline pipeline_;
};

// A communicator's two-level schedules, when it has them, and the smallest message that takes them
// (the whole buffer: all-gather's output, reduce-scatter's input, all-reduce's buffer); below them,
// the most a rank sends in a mesh operation (mesh.hpp; 0: none), agreed like them.
struct Levels {
  std::unique_ptr<Hierarchy> hierarchy;
  std::size_t min_bytes = 0;
  std::size_t mesh_max_bytes = 0;
};

}  // namespace coshard::transport::detail
