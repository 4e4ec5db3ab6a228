#include "ring.hpp"

#include <algorithm>
#include <cstring>
#include <optional>
#include <string>

#include "reduce_kernels.hpp"

namespace coshard::transport::detail {

std::uint64_t make_tag(bool p2p, std::uint64_t seq, int src, int step, std::size_t piece) noexcept {
  return (std::uint64_t{p2p} << 63) | ((seq & 0x7FFFFFu) << 40) | (static_cast<std::uint64_t>(src & 0xFFF) << 28) |
         (static_cast<std::uint64_t>(step & 0xFFF) << 16) | (piece & 0xFFFFu);
}

std::size_t Blocks::max_count() const noexcept {
  return count.empty() ? 0 : *std::max_element(count.begin(), count.end());
}

Blocks Blocks::balanced(std::size_t total, int n) {
  Blocks b;
  const auto un = static_cast<std::size_t>(n);
  std::size_t at = 0;
  for (std::size_t i = 0; i < un; ++i) {
    std::size_t c = total / un + (i < total % un ? 1 : 0);
    b.offset.push_back(at);
    b.count.push_back(c);
    at += c;
  }
  return b;
}

Blocks Blocks::uniform(std::size_t each, int n) {
  Blocks b;
  for (std::size_t i = 0; i < static_cast<std::size_t>(n); ++i) {
    b.offset.push_back(i * each);
    b.count.push_back(each);
  }
  return b;
}

Blocks Blocks::scaled(std::size_t factor) const {
  Blocks b = *this;
  for (auto& o : b.offset) o *= factor;
  for (auto& c : b.count) c *= factor;
  return b;
}

void Scratch::reserve(std::size_t n) {
  if (a.size() < n) a.resize(n);
  if (b.size() < n) b.resize(n);
}

namespace {

// Pieces of a block: piece p covers [p * size, min((p + 1) * size, count)), possibly empty.
struct Pieces {
  std::size_t size = 1;
  std::size_t count = 1;
  Pieces(std::size_t max_count, std::size_t piece) {
    size = std::max<std::size_t>({piece, 1, (max_count + kMaxPieces - 1) / kMaxPieces});
    count = std::max<std::size_t>(1, (max_count + size - 1) / size);
  }
  std::size_t begin(std::size_t block_count, std::size_t p) const { return std::min(block_count, p * size); }
  std::size_t end(std::size_t block_count, std::size_t p) const { return std::min(block_count, (p + 1) * size); }
};

int ring_index(int r, int n) { return ((r % n) + n) % n; }

std::string describe(const Header& h, bool p2p) {
  auto op = static_cast<CollectiveOp>(h.op);
  std::string s = std::string(to_string(op)) + "#" + std::to_string(h.seq) + " (" +
                  std::string(to_string(static_cast<DType>(h.dtype))) + " x " + std::to_string(h.count);
  if (op == CollectiveOp::reduce_scatter || op == CollectiveOp::all_reduce) {
    s += ", " + std::string(to_string(static_cast<ReduceOp>(h.reduce)));
  }
  if (op == CollectiveOp::broadcast) s += ", root " + std::to_string(h.root);
  return s + (p2p ? ")" : " per rank)");
}

}  // namespace

std::string op_name(const OpInfo& info) { return std::string(to_string(info.op)) + "#" + std::to_string(info.seq); }

Header header_of(const OpInfo& info) {
  Header h;
  h.op = static_cast<std::uint8_t>(info.op);
  h.dtype = static_cast<std::uint8_t>(info.dtype);
  h.reduce = static_cast<std::uint8_t>(info.reduce);
  h.root = info.peer;
  h.count = info.count;
  h.seq = info.seq;
  return h;
}

void exchange_headers(Wire& wire, bool p2p, const OpInfo& mine, int to, int from, std::vector<std::byte>* room) {
  Header ours = header_of(mine);
  Header theirs{};
  const bool longer = room && room->size() >= sizeof theirs;
  if (to >= 0) wire.send(to, &ours, sizeof ours, make_tag(p2p, mine.seq, wire.rank(), kHeaderStep, 0));
  Wire::RequestId got = 0;
  if (from >= 0) {
    const auto tag = make_tag(p2p, mine.seq, from, kHeaderStep, 0);
    if (longer) std::memset(room->data(), 0, sizeof theirs);  // a shorter message reads as corrupt
    got = longer ? wire.recv_up_to(from, room->data(), room->size(), tag, true)
                 : wire.recv(from, &theirs, sizeof theirs, tag, true);
  }
  wire.wait_all();
  if (from < 0) return;
  if (longer) std::memcpy(&theirs, room->data(), sizeof theirs);
  check_header(wire.rank(), p2p, mine, ours, theirs, from);
  if (longer && wire.received(got) != sizeof theirs) {
    throw Error(Errc::invalid_argument,
                describe(ours, p2p) + ": rank " + std::to_string(from) + " sent " + std::to_string(wire.received(got)) +
                    " bytes where rank " + std::to_string(wire.rank()) + " expected a " +
                    std::to_string(sizeof theirs) +
                    "-byte header: it took the mesh (mesh.hpp) for this operation and this rank did not. Every rank "
                    "must run the same coshard build",
                op_context(op_name(mine)));
  }
}

void check_header(int my_rank, bool p2p, const OpInfo& mine, const Header& ours, const Header& theirs, int from) {
  // A receive pairs with the peer's send to us; a collective with the same operation.
  bool same = theirs.magic == ours.magic && theirs.dtype == ours.dtype && theirs.count == ours.count &&
              theirs.seq == ours.seq;
  if (p2p) {
    same = same && theirs.op == static_cast<std::uint8_t>(CollectiveOp::send) && theirs.root == my_rank;
  } else {
    same = same && theirs.op == ours.op && theirs.reduce == ours.reduce && theirs.root == ours.root;
  }
  if (!same) {
    std::string what = theirs.magic != ours.magic ? std::string("a corrupt operation header")
                                                      : describe(theirs, p2p);
    throw Error(Errc::invalid_argument,
                describe(ours, p2p) + ": rank " + std::to_string(from) + " issued " + what + " where rank " +
                    std::to_string(my_rank) + " issued " + describe(ours, p2p) +
                    ". Every rank must issue the same collectives, with the same sizes and dtypes, in the same order",
                op_context(op_name(mine)));
  }
}

void ring_all_gather(Wire& wire, std::uint64_t seq, int step_base, std::byte* base, const Blocks& bytes,
                     std::size_t piece_bytes) {
  const int n = wire.size();
  if (n == 1) return;
  const int r = wire.rank();
  const int right = ring_index(r + 1, n), left = ring_index(r - 1, n);
  const Pieces pc(bytes.max_count(), piece_bytes);
  const auto steps = static_cast<std::size_t>(n - 1);
  auto block_of_step = [&](std::size_t s) {  // the block that arrives at step s
    return static_cast<std::size_t>(ring_index(r - static_cast<int>(s) - 1, n));
  };
  auto post = [&](bool is_send, std::size_t s, std::size_t block, std::size_t p) {
    const auto b = pc.begin(bytes.count[block], p), e = pc.end(bytes.count[block], p);
    std::byte* at = base + bytes.offset[block] + b;
    const int step = step_base + static_cast<int>(s);
    return is_send ? wire.send(right, at, e - b, make_tag(false, seq, r, step, p))
                   : wire.recv(left, at, e - b, make_tag(false, seq, left, step, p));
  };
  // Every block lands in its own place, so all receives can be posted up front.
  std::vector<Wire::RequestId> recvs(steps * pc.count);
  for (std::size_t s = 0; s < steps; ++s) {
    for (std::size_t p = 0; p < pc.count; ++p) recvs[s * pc.count + p] = post(false, s, block_of_step(s), p);
  }
  for (std::size_t p = 0; p < pc.count; ++p) post(true, 0, static_cast<std::size_t>(r), p);
  // Forward each piece as soon as it arrived; the last step's pieces stay here.
  std::vector<std::size_t> next(pc.count, 0);
  std::size_t remaining = (steps - 1) * pc.count;
  wire.wait_until([&] {
    for (std::size_t p = 0; p < pc.count; ++p) {
      while (next[p] + 1 < steps && wire.done(recvs[next[p] * pc.count + p])) {
        post(true, next[p] + 1, block_of_step(next[p]), p);
        ++next[p];
        --remaining;
      }
    }
    return remaining == 0;
  });
  wire.wait_all();
}

void ring_reduce_scatter(Wire& wire, std::uint64_t seq, int step_base, const std::byte* in, const Blocks& elems, void* out,
                         const ReduceSpec& spec, std::size_t piece_bytes, Scratch& scratch) {
  const int n = wire.size();
  const int r = wire.rank();
  const std::size_t esize = size_of(spec.dtype);
  auto input = [&](std::size_t block, std::size_t at) { return in + (elems.offset[block] + at) * esize; };
  if (n == 1) {
    scratch.reserve(elems.count[0]);
    load_f32(scratch.a.data(), input(0, 0), spec.dtype, elems.count[0], spec.scale);
    store(out, spec.dtype, scratch.a.data(), elems.count[0], spec.post);
    return;
  }
  const int right = ring_index(r + 1, n), left = ring_index(r - 1, n);
  const std::size_t steps = static_cast<std::size_t>(n - 1);
  const Pieces pc(elems.max_count(), std::max<std::size_t>(1, piece_bytes / sizeof(float)));
  scratch.reserve(elems.max_count());
  float* bufs[2] = {scratch.a.data(), scratch.b.data()};
  // At step s a rank sends the partial sum of block (r - s - 1) and receives that of (r - s - 2);
  // partials travel in f32. Sends of step s come from bufs[s % 2], receives go to bufs[(s+1) % 2],
  // so a receive may reuse a buffer only once the send of the step before has completed.
  auto send_block = [&](std::size_t s) { return static_cast<std::size_t>(ring_index(r - static_cast<int>(s) - 1, n)); };
  auto recv_block = [&](std::size_t s) { return static_cast<std::size_t>(ring_index(r - static_cast<int>(s) - 2, n)); };
  const bool send_input_directly = spec.dtype == DType::f32 && spec.scale == 1.0f;

  struct Chain {
    std::size_t step = 0;
    bool recv_posted = false;
    bool finished = false;
    Wire::RequestId recv{};
    std::optional<Wire::RequestId> send, previous_send;  // of this step and of the one before
  };
  std::vector<Chain> chains(pc.count);
  auto post_send = [&](Chain& c, std::size_t p, std::size_t s, const float* from) {
    const auto blk = send_block(s);
    const auto b = pc.begin(elems.count[blk], p), e = pc.end(elems.count[blk], p);
    c.previous_send = c.send;
    c.send = wire.send(right, from + b, (e - b) * sizeof(float), make_tag(false, seq, r, step_base + static_cast<int>(s), p));
  };
  for (std::size_t p = 0; p < pc.count; ++p) {
    const auto blk = send_block(0);
    const auto b = pc.begin(elems.count[blk], p), e = pc.end(elems.count[blk], p);
    if (send_input_directly) {
      chains[p].send = wire.send(right, input(blk, b), (e - b) * sizeof(float), make_tag(false, seq, r, step_base, p));
    } else {
      load_f32(bufs[0] + b, input(blk, b), spec.dtype, e - b, spec.scale);
      post_send(chains[p], p, 0, bufs[0]);
    }
  }
  std::size_t remaining = pc.count;
  wire.wait_until([&] {
    for (std::size_t p = 0; p < pc.count; ++p) {
      Chain& c = chains[p];
      while (!c.finished) {
        const auto blk = recv_block(c.step);
        const auto b = pc.begin(elems.count[blk], p), e = pc.end(elems.count[blk], p);
        float* into = bufs[(c.step + 1) % 2];
        if (!c.recv_posted) {
          // bufs[(s+1) % 2] was the send buffer of step s - 1 (step 0 sent from bufs[0] or input).
          if (c.previous_send && !wire.done(*c.previous_send)) break;
          c.recv = wire.recv(left, into + b, (e - b) * sizeof(float),
                             make_tag(false, seq, left, step_base + static_cast<int>(c.step), p));
          c.recv_posted = true;
        }
        if (!wire.done(c.recv)) break;
        if (c.step + 1 == steps) {  // blk is this rank's own: the result
          finish(static_cast<std::byte*>(out) + b * esize, into + b, input(blk, b), spec.dtype, e - b, spec.scale,
                 spec.op, spec.post);
          c.finished = true;
          --remaining;
          break;
        }
        accumulate(into + b, input(blk, b), spec.dtype, e - b, spec.scale, spec.op);
        ++c.step;
        c.recv_posted = false;
        post_send(c, p, c.step, into);
      }
    }
    return remaining == 0;
  });
  wire.wait_all();
}

void ring_broadcast(Wire& wire, std::uint64_t seq, std::byte* data, std::size_t bytes, int root,
                    std::size_t piece_bytes) {
  const int n = wire.size();
  if (n == 1) return;
  const int r = wire.rank();
  const int right = ring_index(r + 1, n), left = ring_index(r - 1, n);
  const int distance = ring_index(r - root, n);
  const Pieces pc(bytes, piece_bytes);
  auto range = [&](std::size_t p) { return std::pair{pc.begin(bytes, p), pc.end(bytes, p)}; };
  auto forward = [&](std::size_t p) {
    auto [b, e] = range(p);
    wire.send(right, data + b, e - b, make_tag(false, seq, r, 0, p));
  };
  if (distance == 0) {
    for (std::size_t p = 0; p < pc.count; ++p) forward(p);
  } else {
    std::vector<Wire::RequestId> recvs(pc.count);
    for (std::size_t p = 0; p < pc.count; ++p) {
      auto [b, e] = range(p);
      recvs[p] = wire.recv(left, data + b, e - b, make_tag(false, seq, left, 0, p));
    }
    if (distance + 1 < n) {  // the last rank of the chain keeps what it gets
      std::size_t next = 0;
      wire.wait_until([&] {
        while (next < pc.count && wire.done(recvs[next])) forward(next++);
        return next == pc.count;
      });
    }
  }
  wire.wait_all();
}

}  // namespace coshard::transport::detail
