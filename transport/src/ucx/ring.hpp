#pragma once
// Ring algorithms over a Wire. Each rank sends to rank+1 and receives from rank-1. Messages are cut
// into pieces so that a piece is forwarded (all-gather, broadcast) or reduced and forwarded
// (reduce-scatter) as soon as it lands, while later pieces are still in flight.
//
// Tags: [p2p 1 bit][sequence 23][source rank 12][step 12][piece 16]. The sequence keeps
// consecutive operations apart, the step and piece keep the messages of one operation apart.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "coshard/runtime/dtype.hpp"
#include "coshard/transport/communicator.hpp"
#include "wire.hpp"

namespace coshard::transport::detail {

inline constexpr int kMaxRanks = 2047;       // two ring phases of steps must fit in 12 bits
inline constexpr int kHeaderStep = 0xFFF;
inline constexpr int kDirectStep = 0xFFE;  // the direct path's messages (direct.hpp); rings use < 0xFFD
inline constexpr std::size_t kMaxPieces = 0xFFFF;

std::uint64_t make_tag(bool p2p, std::uint64_t seq, int src, int step, std::size_t piece) noexcept;

// Per-rank blocks of one buffer: block r is [offset[r], offset[r] + count[r]).
struct Blocks {
  std::vector<std::size_t> offset;
  std::vector<std::size_t> count;
  std::size_t max_count() const noexcept;
  // `total` split as evenly as possible over `n` ranks, the first ones one larger.
  static Blocks balanced(std::size_t total, int n);
  static Blocks uniform(std::size_t each, int n);
  Blocks scaled(std::size_t factor) const;  // elements -> bytes
};

// What every rank says about an operation before moving data, so that a rank that issued
// something else is named instead of hanging.
struct Header {
  std::uint32_t magic = 0xC05AA7D0;
  std::uint8_t op = 0;
  std::uint8_t dtype = 0;
  std::uint8_t reduce = 0;
  std::uint8_t pad = 0;
  std::int32_t root = -1;
  std::int32_t pad2 = 0;
  std::int64_t count = 0;
  std::uint64_t seq = 0;
};
Header header_of(const OpInfo& info);
// "all_gather#12": how errors name an operation.
std::string op_name(const OpInfo& info);
// Sends ours to `to`, receives `from`'s, and throws naming both when they differ. `room`, when
// not empty: where the header is received, as long as the longest message a peer that took the
// mesh instead may send (mesh.hpp), so that its header is read and named too. It must outlive a
// failed operation's cancel_all (the communicator's own).
void exchange_headers(Wire& wire, bool p2p, const OpInfo& mine, int to, int from,
                      std::vector<std::byte>* room = nullptr);
// Throws naming both ranks when `theirs` (from rank `from`) does not match `ours`.
// Throws naming both operations when `theirs` (from rank `from`, as received: any bytes) does not
// match `ours`. `my_rank` is this rank's index in the communicator.
void check_header(int my_rank, bool p2p, const OpInfo& mine, const Header& ours, const Header& theirs, int from);

struct Scratch {
  std::vector<float> a, b;
  void reserve(std::size_t n);
};

// Gathers the blocks (bytes) of `base` in place: every rank's own block must already be there.
// Its steps are tagged from `step_base` on (size() - 1 of them): operations that run several
// rings on one wire keep theirs apart.
void ring_all_gather(Wire& wire, std::uint64_t seq, int step_base, std::byte* base, const Blocks& bytes,
                     std::size_t piece_bytes);

struct ReduceSpec {
  DType dtype = DType::f32;
  ReduceOp op = ReduceOp::sum;
  float scale = 1.0f;  // applied to every input (premul_sum)
  float post = 1.0f;   // applied to the result (avg)
};
// Reduces the blocks (elements) of `in` over ranks; this rank's block lands in `out`, which may
// be `in`'s own block. Its steps are tagged from `step_base` on (size() - 1 of them).
void ring_reduce_scatter(Wire& wire, std::uint64_t seq, int step_base, const std::byte* in, const Blocks& elems, void* out,
                         const ReduceSpec& spec, std::size_t piece_bytes, Scratch& scratch);

void ring_broadcast(Wire& wire, std::uint64_t seq, std::byte* data, std::size_t bytes, int root,
                    std::size_t piece_bytes);

}  // namespace coshard::transport::detail
