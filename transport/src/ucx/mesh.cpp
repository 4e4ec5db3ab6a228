#include "mesh.hpp"

#include <algorithm>
#include <cstring>
#include <string>

#include "reduce_kernels.hpp"

namespace coshard::transport::detail {
namespace {

// Slots start on cache lines, so payloads (after the 32-byte header) stay aligned for the kernels.
std::size_t slot_of(std::size_t message) noexcept { return (message + 63) / 64 * 64; }

void copy_bytes(std::byte* to, const std::byte* from, std::size_t bytes) noexcept {
  if (to != from && bytes > 0) std::memcpy(to, from, bytes);
}

}  // namespace

const std::byte* MeshRound::received(int q) const noexcept {
  return in_.data() + static_cast<std::size_t>(q) * in_slot_ + sizeof(Header);
}

void MeshRound::run(const OpInfo& info, int round, const std::byte* data, std::size_t payload, std::size_t stride,
                    std::size_t capacity, bool times) {
  Wire& wire = wire_;
  const int n = wire.size(), r = wire.rank();
  if (n == 1) return;
  const auto un = static_cast<std::size_t>(n);
  const Header ours = header_of(info);
  const std::size_t message = sizeof(Header) + payload;
  in_slot_ = slot_of(sizeof(Header) + capacity);
  if (in_.size() < in_slot_ * un) in_.resize(in_slot_ * un);
  const std::size_t out_slot = slot_of(message);
  const std::size_t messages = stride == 0 ? 1 : un;
  if (out_.size() < out_slot * messages) out_.resize(out_slot * messages);
  recvs_.resize(un);
  const int left = (r + n - 1) % n;
  for (int q = 0; q < n; ++q) {
    if (q == r) continue;
    std::byte* slot = in_.data() + static_cast<std::size_t>(q) * in_slot_;
    std::memset(slot, 0, sizeof(Header));  // a message shorter than a header reads as corrupt
    // Only the ring neighbour's arrival times the peer (peer_waits): the series per peer stay few.
    recvs_[static_cast<std::size_t>(q)] = wire.recv_up_to(q, slot, sizeof(Header) + capacity,
                                                         make_tag(false, info.seq, q, kHeaderStep, round),
                                                         times && q == left);
  }
  for (std::size_t m = 0; m < messages; ++m) {
    if (stride != 0 && m == static_cast<std::size_t>(r)) continue;
    std::byte* slot = out_.data() + m * out_slot;
    std::memcpy(slot, &ours, sizeof ours);
    if (payload > 0) std::memcpy(slot + sizeof ours, data + m * stride, payload);
  }
  for (int k = 1; k < n; ++k) {  // starting at different peers spreads the senders
    const int q = (r + k) % n;
    const std::byte* slot = out_.data() + (stride == 0 ? 0 : static_cast<std::size_t>(q) * out_slot);
    wire.send(q, slot, message, make_tag(false, info.seq, r, kHeaderStep, round));
  }
  wire.wait_all();
  for (int q = 0; q < n; ++q) {
    if (q == r) continue;
    Header theirs;
    std::memcpy(&theirs, in_.data() + static_cast<std::size_t>(q) * in_slot_, sizeof theirs);
    check_header(rank_of(r), false, info, ours, theirs, rank_of(q));
    const std::size_t got = wire.received(recvs_[static_cast<std::size_t>(q)]);
    if (got != message) {
      const std::string op = op_name(info);
      throw Error(Errc::invalid_argument,
                  op + ": rank " + std::to_string(rank_of(q)) + " sent " + std::to_string(got) + " bytes where rank " +
                      std::to_string(rank_of(r)) + " expected " + std::to_string(message) +
                      ". Every rank must pass the same sizes to a collective",
                  op_context(op));
    }
  }
}

Mesh::Mesh(Wire& wire, std::size_t max_bytes, Hierarchy* levels)
    : wire_(wire), max_bytes_(max_bytes), levels_(levels), flat_(wire, {}) {
  if (!levels_) return;
  const Topology& t = levels_->topology();
  const auto me = static_cast<std::size_t>(wire.rank());
  local_.emplace(levels_->local(), t.ranks_on(t.host_of[me]));
  cross_.emplace(levels_->cross(), t.ranks_at(t.local_of[me]));
}

bool Mesh::takes(const OpInfo& info) const noexcept {
  const int n = wire_.size();
  if (n < 2 || max_bytes_ == 0) return false;
  if (info.op != CollectiveOp::all_gather && info.op != CollectiveOp::reduce_scatter &&
      info.op != CollectiveOp::all_reduce) {
    return false;
  }
  // One message per peer of the operation's bytes (all-gather, reduce-scatter: per rank).
  return info.bytes() <= max_bytes_ / static_cast<std::size_t>(n - 1);
}

std::size_t Mesh::capacity() const noexcept {
  const std::size_t per_peer = max_bytes_ / static_cast<std::size_t>(wire_.size() - 1);
  if (!levels_) return per_peer;
  // Across hosts a message inside the host carries a block per host (all-gather, reduce-scatter).
  return per_peer * static_cast<std::size_t>(levels_->topology().hosts);
}

std::string Mesh::describe(CollectiveOp op) const {
  if (!levels_) return "mesh (1 round)";
  return "mesh (" + levels_->topology().describe() + ", " + (op == CollectiveOp::all_reduce ? "3" : "2") + " rounds)";
}

void Mesh::all_gather(const OpInfo& info, const std::byte* input, std::size_t bytes, std::byte* output) {
  if (levels_) return two_level_all_gather(info, input, bytes, output);
  const int n = wire_.size(), r = wire_.rank();
  flat_.run(info, 0, input, bytes, 0, capacity(), true);
  copy_bytes(output + static_cast<std::size_t>(r) * bytes, input, bytes);
  for (int q = 0; q < n; ++q) {
    if (q != r) copy_bytes(output + static_cast<std::size_t>(q) * bytes, flat_.received(q), bytes);
  }
}

void Mesh::reduce_scatter(const OpInfo& info, const std::byte* input, std::size_t count, void* output,
                          const ReduceSpec& spec) {
  if (levels_) return two_level_reduce_scatter(info, input, count, output, spec);
  const int n = wire_.size(), r = wire_.rank();
  const std::size_t block = count * size_of(spec.dtype);
  flat_.run(info, 0, input, block, block, capacity(), true);
  inputs_.resize(static_cast<std::size_t>(n));
  for (int q = 0; q < n; ++q) {
    inputs_[static_cast<std::size_t>(q)] = q == r ? input + static_cast<std::size_t>(r) * block : flat_.received(q);
  }
  reduce_inputs(output, inputs_.data(), inputs_.size(), spec.dtype, count, spec.scale, spec.op, spec.post, false);
}

void Mesh::all_reduce(const OpInfo& info, std::byte* buffer, std::size_t count, const ReduceSpec& spec) {
  if (levels_) return two_level_all_reduce(info, buffer, count, spec);
  const int n = wire_.size(), r = wire_.rank();
  flat_.run(info, 0, buffer, count * size_of(spec.dtype), 0, capacity(), true);
  inputs_.resize(static_cast<std::size_t>(n));
  for (int q = 0; q < n; ++q) inputs_[static_cast<std::size_t>(q)] = q == r ? buffer : flat_.received(q);
  reduce_inputs(buffer, inputs_.data(), inputs_.size(), spec.dtype, count, spec.scale, spec.op, spec.post, false);
}

void Mesh::two_level_all_gather(const OpInfo& info, const std::byte* input, std::size_t bytes, std::byte* output) {
  const Topology& t = levels_->topology();
  const int me = wire_.rank(), host = t.host_of[static_cast<std::size_t>(me)];
  const int local = t.local_of[static_cast<std::size_t>(me)];
  const auto hosts = static_cast<std::size_t>(t.hosts);
  auto at = [&](int rank) { return output + static_cast<std::size_t>(rank) * bytes; };
  cross_->run(info, 0, input, bytes, 0, capacity(), true);
  copy_bytes(at(me), input, bytes);
  for (int h = 0; h < t.hosts; ++h) {
    if (h != host) copy_bytes(at(t.rank(h, local)), cross_->received(h), bytes);
  }
  staging_.resize(hosts * bytes);
  for (int h = 0; h < t.hosts; ++h) copy_bytes(staging_.data() + static_cast<std::size_t>(h) * bytes, at(t.rank(h, local)), bytes);
  local_->run(info, 0, staging_.data(), hosts * bytes, 0, capacity(), false);
  for (int j = 0; j < t.per_host; ++j) {
    if (j == local) continue;
    for (int h = 0; h < t.hosts; ++h) copy_bytes(at(t.rank(h, j)), local_->received(j) + static_cast<std::size_t>(h) * bytes, bytes);
  }
}

void Mesh::two_level_reduce_scatter(const OpInfo& info, const std::byte* input, std::size_t count, void* output,
                                    const ReduceSpec& spec) {
  const Topology& t = levels_->topology();
  const int me = wire_.rank(), host = t.host_of[static_cast<std::size_t>(me)];
  const int local = t.local_of[static_cast<std::size_t>(me)];
  const auto hosts = static_cast<std::size_t>(t.hosts), per_host = static_cast<std::size_t>(t.per_host);
  const std::size_t block = count * size_of(spec.dtype);
  auto in = [&](int rank) { return input + static_cast<std::size_t>(rank) * block; };
  // Per host: local rank j gets, of every host h, the block of rank (h, j).
  staging_.resize(per_host * hosts * block);
  for (int j = 0; j < t.per_host; ++j) {
    for (int h = 0; h < t.hosts; ++h) {
      copy_bytes(staging_.data() + (static_cast<std::size_t>(j) * hosts + static_cast<std::size_t>(h)) * block,
                 in(t.rank(h, j)), block);
    }
  }
  local_->run(info, 0, staging_.data(), hosts * block, hosts * block, capacity(), true);
  partial_.resize(hosts * block);
  inputs_.resize(per_host);
  for (int h = 0; h < t.hosts; ++h) {
    for (int j = 0; j < t.per_host; ++j) {
      inputs_[static_cast<std::size_t>(j)] =
          j == local ? in(t.rank(h, local)) : local_->received(j) + static_cast<std::size_t>(h) * block;
    }
    reduce_inputs(partial_.data() + static_cast<std::size_t>(h) * block, inputs_.data(), per_host, spec.dtype, count,
                  spec.scale, spec.op, 1.0f, false);
  }
  // Across: host h's rank of my local index gets my host's sum of its block.
  cross_->run(info, 0, partial_.data(), block, block, capacity(), false);
  inputs_.resize(hosts);
  for (int h = 0; h < t.hosts; ++h) {
    inputs_[static_cast<std::size_t>(h)] =
        h == host ? partial_.data() + static_cast<std::size_t>(host) * block : cross_->received(h);
  }
  reduce_inputs(output, inputs_.data(), hosts, spec.dtype, count, 1.0f, spec.op, spec.post, false);
}

// Three rounds, so that each byte crosses between hosts once: the buffer, padded to a part per
// local rank, is reduced part by part inside the host, each part across hosts by the ranks of its
// local index, and the parts gathered inside the host.
void Mesh::two_level_all_reduce(const OpInfo& info, std::byte* buffer, std::size_t count, const ReduceSpec& spec) {
  const Topology& t = levels_->topology();
  const int me = wire_.rank(), host = t.host_of[static_cast<std::size_t>(me)];
  const int local = t.local_of[static_cast<std::size_t>(me)];
  const auto per_host = static_cast<std::size_t>(t.per_host);
  const std::size_t esize = size_of(spec.dtype), part = (count + per_host - 1) / per_host;
  const std::size_t part_bytes = part * esize;
  staging_.assign(per_host * part_bytes, std::byte{0});
  std::byte* mine = staging_.data() + static_cast<std::size_t>(local) * part_bytes;
  copy_bytes(staging_.data(), buffer, count * esize);
  local_->run(info, 0, staging_.data(), part_bytes, part_bytes, capacity(), true);
  partial_.resize(part_bytes);
  inputs_.resize(per_host);
  for (int j = 0; j < t.per_host; ++j) inputs_[static_cast<std::size_t>(j)] = j == local ? mine : local_->received(j);
  reduce_inputs(partial_.data(), inputs_.data(), per_host, spec.dtype, part, spec.scale, spec.op, 1.0f, false);
  cross_->run(info, 0, partial_.data(), part_bytes, 0, capacity(), false);
  inputs_.resize(static_cast<std::size_t>(t.hosts));
  for (int h = 0; h < t.hosts; ++h) inputs_[static_cast<std::size_t>(h)] = h == host ? partial_.data() : cross_->received(h);
  reduce_inputs(mine, inputs_.data(), inputs_.size(), spec.dtype, part, 1.0f, spec.op, spec.post, false);
  local_->run(info, 1, mine, part_bytes, 0, capacity(), false);
  for (int j = 0; j < t.per_host; ++j) {
    if (j != local) copy_bytes(staging_.data() + static_cast<std::size_t>(j) * part_bytes, local_->received(j), part_bytes);
  }
  copy_bytes(buffer, staging_.data(), count * esize);
}

}  // namespace coshard::transport::detail
