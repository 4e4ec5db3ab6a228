#pragma once
// The mesh path: small all-gathers, reduce-scatters and all-reduces in one round. Each rank sends
// every peer a single message, the operation's header followed by the data that peer needs (its
// own block for all-gather, the peer's block for reduce-scatter, its whole buffer for all-reduce),
// and receives one from each. The ring pays a header exchange and then n - 1 (all-reduce:
// 2(n - 1)) hops one after another, each a full message latency (30-50 us over TCP); the mesh
// pays one, with the same bytes per rank for all-gather and reduce-scatter and n/2 times the
// ring's for all-reduce. So it takes the operations where every rank sends at most
// UcxOptions::mesh_max_bytes in all (docs/transport.md, "Small messages").
//
// Across hosts (a communicator with a Hierarchy) it takes two rounds, one on each of the
// two-level schedule's wires: over shared memory inside the host and over TCP between hosts, so
// that a rank sends one TCP message per other host instead of one per remote rank, and none to
// the ranks of its own host (which PEER error mode would otherwise also reach over TCP).
//   all-gather:     the blocks of my local index (across), then the host's (per host);
//   reduce-scatter: every host's blocks of each local rank summed over the host (per host), then
//                   my block summed over hosts (across);
//   all-reduce:     a part per local rank summed over the host (per host), over hosts (across),
//                   then the parts gathered (per host): three rounds, each byte crosses once.
// Low-precision reductions are rounded once per round there, as on the two-level schedule.
//
// Every rank reduces the inputs itself, in f32 and in one order (rank order; across hosts over
// the host's ranks, then over hosts): all-reduce gives every rank the same bits.
//
// A message goes out at the header exchange's tag, so a peer that issued something else (another
// size, another operation) is named by the header check instead of leaving a rank waiting: the
// receive takes any message up to the largest a mesh peer may send and reads its header first.
#include <cstddef>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "coshard/transport/communicator.hpp"
#include "hierarchy.hpp"
#include "ring.hpp"
#include "wire.hpp"

namespace coshard::transport::detail {

// One round: every rank of a wire sends every peer one message and receives one from each.
class MeshRound {
 public:
  // `ranks`: the communicator's rank of each of the wire's ranks, for the errors (empty: the same).
  MeshRound(Wire& wire, std::vector<int> ranks) : wire_(wire), ranks_(std::move(ranks)) {}
  // Sends every peer q the header of `info`, then `payload` bytes from data + q x stride (stride
  // 0: the same bytes to all); receives every peer's message, of at most `capacity` bytes after
  // the header; checks each header and size. Peer q's bytes are then at received(q). `round`
  // keeps an operation's rounds on this wire apart; each wire's first is round 0, whose messages
  // meet those of a peer that issued another operation or size (or, on the communicator's own
  // wire, the ring's header, ring.hpp), so that the header check names it. `times`: the round is
  // the operation's first, so its neighbour's message says how late that peer entered it
  // (Wire::peer_waits); a later round's would also carry the lateness of whoever that peer waited on.
  void run(const OpInfo& info, int round, const std::byte* data, std::size_t payload, std::size_t stride,
           std::size_t capacity, bool times);
  const std::byte* received(int q) const noexcept;

 private:
  int rank_of(int q) const noexcept { return ranks_.empty() ? q : ranks_[static_cast<std::size_t>(q)]; }

  Wire& wire_;
  std::vector<int> ranks_;
  std::size_t in_slot_ = 0;     // bytes per rank in in_
  std::vector<std::byte> out_;  // the messages sent: one per rank, or one for all
  std::vector<std::byte> in_;   // one slot per rank, each as large as any peer's message may be
  std::vector<Wire::RequestId> recvs_;
};

class Mesh {
 public:
  // `max_bytes`: what one rank may send in all (agreed by every rank, connect.cpp). `levels`: the
  // communicator's two-level wires when it spans hosts, else null.
  Mesh(Wire& wire, std::size_t max_bytes, Hierarchy* levels);

  // Whether `info` takes the mesh: the same answer on every rank that issued the same operation.
  bool takes(const OpInfo& info) const noexcept;
  // What a rank that took the ring must make room for in its header receive on the communicator's
  // wire (exchange_headers): the largest message a peer on the mesh sends there after its header.
  // 0 across hosts, where the mesh's rounds run on the two-level wires.
  std::size_t room() const noexcept { return levels_ ? 0 : capacity(); }
  // "mesh (1 round)", "mesh (2 hosts x 2 ranks, 3 rounds)", for the span of an operation.
  std::string describe(CollectiveOp op) const;

  // `input` (bytes per rank) may be `output`'s block of this rank (in place).
  void all_gather(const OpInfo& info, const std::byte* input, std::size_t bytes, std::byte* output);
  // `input` holds size() blocks of `count` elements; this rank's reduced block goes to `output`,
  // which may be `input`'s block of this rank.
  void reduce_scatter(const OpInfo& info, const std::byte* input, std::size_t count, void* output,
                      const ReduceSpec& spec);
  // In place over `buffer` of `count` elements.
  void all_reduce(const OpInfo& info, std::byte* buffer, std::size_t count, const ReduceSpec& spec);

 private:
  void two_level_all_gather(const OpInfo& info, const std::byte* input, std::size_t bytes, std::byte* output);
  void two_level_reduce_scatter(const OpInfo& info, const std::byte* input, std::size_t count, void* output,
                                const ReduceSpec& spec);
  void two_level_all_reduce(const OpInfo& info, std::byte* buffer, std::size_t count, const ReduceSpec& spec);
  // The largest payload a peer's message of one round may carry (the flat mesh's, or either
  // two-level wire's).
  std::size_t capacity() const noexcept;

  Wire& wire_;
  std::size_t max_bytes_;
  Hierarchy* levels_;
  MeshRound flat_;
  std::optional<MeshRound> local_, cross_;  // across hosts: on the per-host and cross-host wires
  std::vector<std::byte> staging_;  // across hosts: the blocks one message carries, side by side
  std::vector<std::byte> partial_;  // across hosts: reduce-scatter's sums over the first round
  std::vector<const void*> inputs_;
};

}  // namespace coshard::transport::detail
