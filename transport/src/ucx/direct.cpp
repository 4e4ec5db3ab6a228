#include "direct.hpp"

#include <atomic>
#include <cstdint>
#include <cstring>
#include <exception>
#include <string>

#include "reduce_kernels.hpp"

namespace coshard::transport::detail {
namespace {

// What a rank says in step 1.
struct Ready {
  Header header;
  std::uint32_t shared = 0;  // 1: `segment` holds the buffer and this rank can take the direct path
  std::uint32_t pad = 0;
  SegmentRef segment;
};

bool overlaps(const void* a, std::size_t an, const void* b, std::size_t bn) {
  const auto x = reinterpret_cast<std::uintptr_t>(a), y = reinterpret_cast<std::uintptr_t>(b);
  return x < y + bn && y < x + an;
}

}  // namespace

const std::byte* SegmentCache::map(int peer, const SegmentRef& ref) {
  const auto key = std::make_pair(peer, ref.id);
  if (auto it = index_.find(key); it != index_.end()) {
    lru_.splice(lru_.begin(), lru_, it->second);
    return it->second->mapping.data();
  }
  // Descriptor numbers are unique among a process's open files: a cached segment of this peer
  // with the new one's number was closed, so freed.
  for (auto it = lru_.begin(); it != lru_.end();) {
    auto next = std::next(it);
    if (it->peer == peer && it->ref.fd == ref.fd) erase(it);
    it = next;
  }
  PeerMapping mapping = PeerMapping::map(ref);
  bytes_ += mapping.size();
  lru_.push_front(Entry{peer, ref, std::move(mapping)});
  index_[key] = lru_.begin();
  while (lru_.size() > capacity_) erase(std::prev(lru_.end()));
  report();
  return lru_.front().mapping.data();
}

void SegmentCache::erase(std::list<Entry>::iterator it) {
  bytes_ -= it->mapping.size();
  index_.erase(std::make_pair(it->peer, it->ref.id));
  lru_.erase(it);  // unmaps
  report();        // also when the mapping that follows fails
}

void SegmentCache::report() const {
  if (gauge_) gauge_->set(static_cast<double>(bytes_));
}

bool Direct::ready(const OpInfo& info, const void* p, std::size_t bytes, bool usable) {
  const int n = wire_.size(), r = wire_.rank();
  Ready mine;
  mine.header = header_of(info);
  mine.shared = usable && shared_segment_of(p, bytes, &mine.segment) ? 1 : 0;
  std::vector<Ready> theirs(static_cast<std::size_t>(n));
  for (int q = 0; q < n; ++q) {
    if (q != r) {
      wire_.recv(q, &theirs[static_cast<std::size_t>(q)], sizeof(Ready),
                 make_tag(false, info.seq, q, kDirectStep, kReady));
    }
  }
  // The buffer was written before this operation started (stream order); make that visible to
  // the peers before they hear of it.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  for (int k = 1; k < n; ++k) {
    wire_.send((r + k) % n, &mine, sizeof mine, make_tag(false, info.seq, r, kDirectStep, kReady));
  }
  wire_.wait_all();
  bool all = mine.shared != 0;
  for (int q = 0; q < n; ++q) {
    if (q == r) continue;
    const Ready& t = theirs[static_cast<std::size_t>(q)];
    check_header(r, false, info, mine.header, t.header, q);
    all = all && t.shared != 0;
  }
  if (!all) return false;
  refs_.assign(static_cast<std::size_t>(n), SegmentRef{});
  peer_.assign(static_cast<std::size_t>(n), nullptr);
  for (int q = 0; q < n; ++q) {
    if (q != r) refs_[static_cast<std::size_t>(q)] = theirs[static_cast<std::size_t>(q)].segment;
  }
  peer_[static_cast<std::size_t>(r)] = static_cast<const std::byte*>(p);
  return true;
}

void check_segment_ref(const OpInfo& info, int peer, const SegmentRef& ref, std::size_t bytes) {
  if (ref.offset > ref.size || bytes > ref.size - ref.offset) {
    throw Error(Errc::internal, op_name(info) + ": rank " + std::to_string(peer) + " named " + std::to_string(bytes) +
                                    " bytes at offset " + std::to_string(ref.offset) + " of a segment of " +
                                    std::to_string(ref.size) + " bytes");
  }
}

void Direct::map_peers(const OpInfo& info, std::size_t bytes) {
  const int n = wire_.size(), r = wire_.rank();
  for (int q = 0; q < n; ++q) {
    if (q == r) continue;
    const SegmentRef& ref = refs_[static_cast<std::size_t>(q)];
    check_segment_ref(info, q, ref, bytes);
    peer_[static_cast<std::size_t>(q)] = cache_.map(q, ref) + ref.offset;
  }
}

void Direct::signal(const OpInfo& info, Phase phase, const std::exception_ptr& local) {
  const int n = wire_.size(), r = wire_.rank();
  // Everything this rank read and wrote (streaming stores included) happens before its word.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  const std::uint32_t mine = local ? 1 : 0;
  std::vector<std::uint32_t> theirs(static_cast<std::size_t>(n), 0);
  for (int q = 0; q < n; ++q) {
    if (q != r) {
      wire_.recv(q, &theirs[static_cast<std::size_t>(q)], sizeof(std::uint32_t),
                 make_tag(false, info.seq, q, kDirectStep, phase));
    }
  }
  for (int k = 1; k < n; ++k) {
    wire_.send((r + k) % n, &mine, sizeof mine, make_tag(false, info.seq, r, kDirectStep, phase));
  }
  wire_.wait_all();
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (local) std::rethrow_exception(local);
  for (int q = 0; q < n; ++q) {
    if (theirs[static_cast<std::size_t>(q)] != 0) {
      throw Error(Errc::io,
                  op_name(info) + ": rank " + std::to_string(q) +
                      " could not read its peers' shared buffers (its own error says why); "
                      "COSHARD_UCX_DIRECT=0 turns the direct path off",
                  op_context(op_name(info)));
    }
  }
}

bool Direct::all_gather(const OpInfo& info, const std::byte* input, std::size_t bytes, std::byte* output) {
  const int n = wire_.size(), r = wire_.rank();
  std::byte* own = output + static_cast<std::size_t>(r) * bytes;
  // Peers read only `input`, which nobody writes during the operation: in place it is my own
  // block of `output` (which only I write, and only outside the operation); otherwise it must lie
  // apart from `output`.
  const bool usable = input == own || !overlaps(input, bytes, output, bytes * static_cast<std::size_t>(n));
  if (!ready(info, input, bytes, usable)) return false;
  const bool stream = bytes * static_cast<std::size_t>(n) >= stream_min_bytes_;
  std::exception_ptr failed;
  try {
    map_peers(info, bytes);
    if (input != own) copy_large(own, input, bytes, stream);
    for (int k = 1; k < n; ++k) {  // starting at different peers spreads the readers
      const int q = (r + k) % n;
      copy_large(output + static_cast<std::size_t>(q) * bytes, peer_[static_cast<std::size_t>(q)], bytes, stream);
    }
  } catch (...) {
    failed = std::current_exception();
  }
  signal(info, kDone, failed);
  return true;
}

bool Direct::reduce_scatter(const OpInfo& info, const std::byte* input, std::size_t count, void* output,
                            const ReduceSpec& spec) {
  const int n = wire_.size(), r = wire_.rank();
  const std::size_t block = count * size_of(spec.dtype), total = block * static_cast<std::size_t>(n);
  const std::byte* own = input + static_cast<std::size_t>(r) * block;
  // Peer q reads block q of my input, never block r. So my output may be my own block r of
  // `input` (read and written tile by tile, at the same places, by me alone), and must not
  // overlap `input` anywhere else.
  const bool usable = output == own || !overlaps(output, block, input, total);
  if (!ready(info, input, total, usable)) return false;
  std::exception_ptr failed;
  try {
    map_peers(info, total);
    std::vector<const void*> in(static_cast<std::size_t>(n));
    for (int q = 0; q < n; ++q) in[static_cast<std::size_t>(q)] = peer_[static_cast<std::size_t>(q)] + static_cast<std::size_t>(r) * block;
    reduce_inputs(output, in.data(), in.size(), spec.dtype, count, spec.scale, spec.op, spec.post,
                  total >= stream_min_bytes_);
  } catch (...) {
    failed = std::current_exception();
  }
  signal(info, kDone, failed);
  return true;
}

// Races, with B_q the buffer of rank q and k_q its block:
//  - phase 1: rank r writes only B_r[k_r]; it reads B_q[k_r] for every q. Peer q reads
//    B_r[k_q], never B_r[k_r], and nobody else writes B_r. B_r[k_r] is both read and written by r
//    alone, tile by tile at the same positions (reduce_inputs reads a tile before writing it).
//  - "phase-1 done" from every peer: every B_q[k_q] is final, and every peer stopped reading
//    B_r (it read only B_r[k_q] in phase 1).
//  - phase 2: rank r writes B_r[k_q] for q != r, which nobody reads any more; it reads B_q[k_q],
//    which nobody writes any more. Peers read B_r[k_r], which r no longer writes.
//  - "done" from every peer: nobody reads B_r any more, so the operation may complete and the
//    buffer be reused.
bool Direct::all_reduce(const OpInfo& info, std::byte* buffer, const Blocks& elems, const ReduceSpec& spec) {
  const int n = wire_.size(), r = wire_.rank();
  const std::size_t esize = size_of(spec.dtype);
  const std::size_t total = (elems.offset.back() + elems.count.back()) * esize;
  if (!ready(info, buffer, total, true)) return false;
  const auto own = static_cast<std::size_t>(r);
  const bool stream = total >= stream_min_bytes_;
  std::exception_ptr failed;
  try {
    map_peers(info, total);
    std::vector<const void*> in(static_cast<std::size_t>(n));
    for (std::size_t q = 0; q < in.size(); ++q) in[q] = peer_[q] + elems.offset[own] * esize;
    reduce_inputs(buffer + elems.offset[own] * esize, in.data(), in.size(), spec.dtype, elems.count[own], spec.scale,
                  spec.op, spec.post, stream);
  } catch (...) {
    failed = std::current_exception();
  }
  signal(info, kReduced, failed);  // every rank sees every rank's word: all go on, or all throw
  for (int k = 1; k < n; ++k) {
    const auto q = static_cast<std::size_t>((r + k) % n);
    copy_large(buffer + elems.offset[q] * esize, peer_[q] + elems.offset[q] * esize, elems.count[q] * esize, stream);
  }
  signal(info, kDone, nullptr);
  return true;
}

}  // namespace coshard::transport::detail
