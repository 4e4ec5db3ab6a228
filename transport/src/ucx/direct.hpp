#pragma once
// The direct path: single-copy collectives between ranks of one host. Every rank's buffer is a
// shared segment (coshard/runtime/shared_memory.hpp); each rank maps its peers' segments (kept in
// a small cache) and reads their blocks itself, so data crosses memory once: an all-gather is one
// memcpy per peer block, a reduce-scatter one fused pass that reads n input blocks and writes one.
//
// Protocol of one operation (tags: step kDirectStep, piece = phase, after the ring header check
// has made sure that every rank issued the same operation):
//   1. ready:  every rank sends every peer {header, segment of its buffer or "not shared"} and
//              receives all of theirs. If any rank's buffer is not shared, every rank (they all
//              saw the same n messages) returns false and the caller runs the ring instead.
//   2. data:   all-gather: copy peer q's block into my output block q, for every q.
//              reduce-scatter: out = reduce over q of in_q[block r], fused, tile by tile.
//              all-reduce: phase 1 as reduce-scatter into my own block of the buffer, then
//              "phase-1 done" to and from every peer, then phase 2 copies peer q's block q.
//   3. done:   every rank tells every peer it stopped reading, and waits for all of theirs: no
//              rank completes (and so may reuse or free its buffer) while a peer still reads it.
// A rank that fails in phase 2 (a peer's segment cannot be mapped) still sends "done", marked
// failed, so that its peers fail at once too instead of at their deadline.
#include <cstddef>
#include <cstdint>
#include <exception>
#include <list>
#include <map>
#include <utility>
#include <vector>

#include "coshard/runtime/shared_memory.hpp"
#include "coshard/runtime/telemetry.hpp"
#include "ring.hpp"
#include "wire.hpp"

namespace coshard::transport::detail {

// Peers' segments mapped here, keyed by (peer, segment id); the least recently used is unmapped
// beyond `capacity`. A segment whose descriptor number a newer segment of the same peer now uses
// was freed by that peer: its mapping goes at once (it would pin the freed memory). The bytes
// mapped go to `mapped_bytes` (coshard_peer_segments_mapped_bytes) when given.
class SegmentCache {
 public:
  SegmentCache(std::size_t capacity, Gauge* mapped_bytes)
      : capacity_(capacity == 0 ? 1 : capacity), gauge_(mapped_bytes) {}
  // The segment's base in this process; throws Error(io) when it cannot be mapped.
  const std::byte* map(int peer, const SegmentRef& ref);
  std::size_t size() const noexcept { return lru_.size(); }
  std::size_t bytes() const noexcept { return bytes_; }

 private:
  struct Entry {
    int peer;
    SegmentRef ref;
    PeerMapping mapping;
  };
  void erase(std::list<Entry>::iterator it);
  void report() const;
  std::size_t capacity_;
  Gauge* gauge_;
  std::size_t bytes_ = 0;
  std::list<Entry> lru_;  // most recently used first
  std::map<std::pair<int, std::uint64_t>, std::list<Entry>::iterator> index_;
};

// Throws when `ref` (a peer's message: any bytes) does not hold `bytes` bytes past its offset.
void check_segment_ref(const OpInfo& info, int peer, const SegmentRef& ref, std::size_t bytes);

class Direct {
 public:
  // Operations of at least `stream_min_bytes` write with streaming stores (stream_min_bytes()).
  Direct(Wire& wire, std::size_t cache_entries, Gauge* mapped_bytes, std::size_t stream_min_bytes)
      : wire_(wire), cache_(cache_entries, mapped_bytes), stream_min_bytes_(stream_min_bytes) {}

  // Each returns false, having moved nothing, when some rank cannot take the direct path for this
  // operation (then every rank returns false); true once the operation is complete. Throws like
  // the ring (peer lost, timeout, abort, mismatch).
  // `input` (bytes per rank) may be `output`'s block of this rank (in place).
  bool all_gather(const OpInfo& info, const std::byte* input, std::size_t bytes, std::byte* output);
  // `input` holds size() blocks of `count` elements; this rank's reduced block goes to `output`.
  bool reduce_scatter(const OpInfo& info, const std::byte* input, std::size_t count, void* output,
                      const ReduceSpec& spec);
  // In place over `buffer`, cut into `elems` blocks.
  bool all_reduce(const OpInfo& info, std::byte* buffer, const Blocks& elems, const ReduceSpec& spec);

 private:
  enum Phase : int { kReady = 0, kReduced = 1, kDone = 2 };
  // Step 1: true when every rank's [p, p + bytes) is shared (and `usable` here); then peer_[q] is
  // where peer q's pointer is mapped in this process.
  bool ready(const OpInfo& info, const void* p, std::size_t bytes, bool usable);
  // Step 2's start: maps every peer's [pointer, pointer + bytes) (from the cache when it can).
  void map_peers(const OpInfo& info, std::size_t bytes);
  // Tells every peer this rank finished `phase` (ok or failed) and waits for every peer's word.
  // Throws `local` when set, else a failure some peer reported.
  void signal(const OpInfo& info, Phase phase, const std::exception_ptr& local);

  Wire& wire_;
  SegmentCache cache_;
  std::vector<const std::byte*> peer_;  // per rank; this rank's own entry is its own pointer
  std::vector<SegmentRef> refs_;        // per rank, from the ready messages
  std::size_t stream_min_bytes_;
};

}  // namespace coshard::transport::detail
