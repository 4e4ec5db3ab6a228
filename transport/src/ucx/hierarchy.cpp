#include "hierarchy.hpp"

#include <map>
#include <utility>

namespace coshard::transport::detail {

std::optional<Topology> Topology::of(const std::vector<PeerIdentity>& peers) {
  Topology t;
  std::map<std::string, int> host_index;
  std::vector<int> ranks_on;  // per host
  for (const auto& p : peers) {
    auto [it, fresh] = host_index.emplace(p.host, static_cast<int>(ranks_on.size()));
    if (fresh) ranks_on.push_back(0);
    t.host_of.push_back(it->second);
    t.local_of.push_back(ranks_on[static_cast<std::size_t>(it->second)]++);
  }
  t.hosts = static_cast<int>(ranks_on.size());
  t.per_host = ranks_on.empty() ? 0 : ranks_on.front();
  for (int n : ranks_on) {
    if (n != t.per_host) return std::nullopt;  // uneven hosts: the flat ring
  }
  if (t.hosts < 2 || t.per_host < 2) return std::nullopt;
  t.rank_at.assign(peers.size(), 0);
  for (std::size_t r = 0; r < peers.size(); ++r) {
    t.rank_at[static_cast<std::size_t>(t.host_of[r] * t.per_host + t.local_of[r])] = static_cast<int>(r);
  }
  return t;
}

std::vector<int> Topology::ranks_on(int host) const {
  std::vector<int> r;
  for (int l = 0; l < per_host; ++l) r.push_back(rank(host, l));
  return r;
}

std::vector<int> Topology::ranks_at(int local) const {
  std::vector<int> r;
  for (int h = 0; h < hosts; ++h) r.push_back(rank(h, local));
  return r;
}

std::string Topology::describe() const {
  return std::to_string(hosts) + " hosts x " + std::to_string(per_host) + " ranks";
}

Hierarchy::Hierarchy(Topology topology, int rank, std::unique_ptr<Wire> local, std::unique_ptr<Wire> cross)
    : topo_(std::move(topology)),
      host_(topo_.host_of[static_cast<std::size_t>(rank)]),
      local_index_(topo_.local_of[static_cast<std::size_t>(rank)]),
      local_(std::move(local)),
      cross_(std::move(cross)),
      counterparts_(topo_.ranks_at(local_index_)) {
  for (int h = 0; h < topo_.hosts; ++h) host_ranks_.push_back(topo_.ranks_on(h));
}

namespace {

// The blocks of `ranks` (comm ranks, in the wire's rank order) in a buffer of per-rank blocks.
Blocks blocks_of(const std::vector<int>& ranks, std::size_t each) {
  Blocks b;
  for (int r : ranks) {
    b.offset.push_back(static_cast<std::size_t>(r) * each);
    b.count.push_back(each);
  }
  return b;
}

// The reduction of each level: the input factor (premul) once at the start, the result's (avg) once
// at the end.
std::pair<ReduceSpec, ReduceSpec> levels_of(const ReduceSpec& spec) {
  ReduceSpec inner = spec, outer = spec;
  inner.post = 1.0f;
  outer.scale = 1.0f;
  return {inner, outer};
}

}  // namespace

void Hierarchy::all_gather(std::uint64_t seq, std::byte* out, std::size_t block_bytes, std::size_t piece_bytes) {
  ring_all_gather(*cross_, seq, 0, out, blocks_of(counterparts_, block_bytes), piece_bytes);
  // Now this rank holds one block of every host; the host's ranks swap theirs, host by host.
  for (int h = 0; h < topo_.hosts; ++h) {
    ring_all_gather(*local_, seq, h * topo_.per_host, out, blocks_of(host_ranks_[static_cast<std::size_t>(h)], block_bytes),
                    piece_bytes);
  }
}

void Hierarchy::reduce_scatter(std::uint64_t seq, const std::byte* in, std::size_t count, void* out,
                               const ReduceSpec& spec, std::size_t piece_bytes, Scratch& scratch) {
  const int hosts = topo_.hosts;
  const std::size_t esize = size_of(spec.dtype);
  const auto [inner, outer] = levels_of(spec);
  partial_.resize(static_cast<std::size_t>(hosts) * count * esize);
  // partial_ block h: the host's sum of the block of rank (h, my local index). Host h's blocks go
  // to this host's ranks in local order, as its ranks are.
  for (int h = 0; h < hosts; ++h) {
    ring_reduce_scatter(*local_, seq, h * topo_.per_host, in, blocks_of(host_ranks_[static_cast<std::size_t>(h)], count),
                        partial_.data() + static_cast<std::size_t>(h) * count * esize, inner, piece_bytes, scratch);
  }
  ring_reduce_scatter(*cross_, seq, 0, partial_.data(), Blocks::uniform(count, hosts), out, outer, piece_bytes,
                      scratch);
}

void Hierarchy::all_reduce(std::uint64_t seq, std::byte* inout, std::size_t count, const ReduceSpec& spec,
                           std::size_t piece_bytes, Scratch& scratch) {
  const std::size_t esize = size_of(spec.dtype);
  const auto [inner, outer] = levels_of(spec);
  const auto host_blocks = Blocks::balanced(count, topo_.per_host);
  const auto me = static_cast<std::size_t>(local_index_);
  std::byte* mine = inout + host_blocks.offset[me] * esize;
  ring_reduce_scatter(*local_, seq, 0, inout, host_blocks, mine, inner, piece_bytes, scratch);
  // The host's sum of this rank's block, all-reduced with the same block of every other host.
  const auto cross_blocks = Blocks::balanced(host_blocks.count[me], topo_.hosts);
  const auto h = static_cast<std::size_t>(host_);
  ring_reduce_scatter(*cross_, seq, 0, mine, cross_blocks, mine + cross_blocks.offset[h] * esize, outer, piece_bytes,
                      scratch);
  ring_all_gather(*cross_, seq, topo_.hosts, mine, cross_blocks.scaled(esize), piece_bytes);
  ring_all_gather(*local_, seq, topo_.per_host, inout, host_blocks.scaled(esize), piece_bytes);
}

void Hierarchy::begin(const WaitContext& wait) {
  local_->begin(wait);
  cross_->begin(wait);
}

void Hierarchy::abort(const Error& reason) {
  local_->abort(reason);
  cross_->abort(reason);
}

void Hierarchy::cancel_all() noexcept {
  local_->cancel_all();
  cross_->cancel_all();
}

}  // namespace coshard::transport::detail
