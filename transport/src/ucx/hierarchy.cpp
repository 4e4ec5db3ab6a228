#include "hierarchy.hpp"

#include <algorithm>
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

Hierarchy::Hierarchy(Topology topology, int rank, std::unique_ptr<Wire> local, std::unique_ptr<Wire> cross,
                     std::size_t chunk_bytes)
    : topo_(std::move(topology)),
      host_(topo_.host_of[static_cast<std::size_t>(rank)]),
      local_index_(topo_.local_of[static_cast<std::size_t>(rank)]),
      local_(std::move(local)),
      cross_(std::move(cross)),
      counterparts_(topo_.ranks_at(local_index_)),
      chunk_bytes_(chunk_bytes) {
  for (int h = 0; h < topo_.hosts; ++h) host_ranks_.push_back(topo_.ranks_on(h));
  local_->name_on_timeout(cross_.get());
  // Chunk k's rings take steps from k x (hosts x per_host) on the per-host wire and from k x 2 hosts
  // on the cross-host one, and all-reduce's gathers as many again: 2 x world steps per chunk.
  max_chunks_ = std::clamp((kHeaderStep - 2) / (2 * topo_.hosts * topo_.per_host), 1, kMaxChunks);
}

int Hierarchy::chunks(std::size_t buffer) const noexcept {
  if (chunk_bytes_ == 0) return 1;
  return static_cast<int>(std::clamp<std::size_t>(buffer / chunk_bytes_, 1, static_cast<std::size_t>(max_chunks_)));
}

std::string Hierarchy::describe(std::size_t buffer) const {
  const int n = chunks(buffer);
  return "hierarchical (" + topo_.describe() + (n > 1 ? ", " + std::to_string(n) + " chunks overlapped" : "") + ")";
}

namespace {

// The blocks of `ranks` (comm ranks, in the wire's rank order) in a buffer of per-rank blocks of
// `each`: of each block, the part [from, from + n).
Blocks blocks_of(const std::vector<int>& ranks, std::size_t each, std::size_t from, std::size_t n) {
  Blocks b;
  for (int r : ranks) {
    b.offset.push_back(static_cast<std::size_t>(r) * each + from);
    b.count.push_back(n);
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
  const int hosts = topo_.hosts, per_host = topo_.per_host;
  const int n = chunks(block_bytes * static_cast<std::size_t>(hosts * per_host));
  const auto part = Blocks::balanced(block_bytes, n);  // of every rank's block
  StagePipeline::Stages s;
  s.across = [&](int k) {
    const auto c = static_cast<std::size_t>(k);
    ring_all_gather(*cross_, seq, k * hosts, out, blocks_of(counterparts_, block_bytes, part.offset[c], part.count[c]),
                    piece_bytes);
  };
  // Now this rank holds the chunk of one block of every host; the host's ranks swap theirs.
  s.after = [&](int k) {
    const auto c = static_cast<std::size_t>(k);
    for (int h = 0; h < hosts; ++h) {
      ring_all_gather(*local_, seq, (k * hosts + h) * per_host, out,
                      blocks_of(host_ranks_[static_cast<std::size_t>(h)], block_bytes, part.offset[c], part.count[c]),
                      piece_bytes);
    }
  };
  pipeline_.run(*local_, *cross_, n, s);
}

void Hierarchy::reduce_scatter(std::uint64_t seq, const std::byte* in, std::size_t count, void* out,
                               const ReduceSpec& spec, std::size_t piece_bytes, Scratch& scratch) {
  const int hosts = topo_.hosts, per_host = topo_.per_host;
  const std::size_t esize = size_of(spec.dtype);
  const auto levels = levels_of(spec);  // not a structured binding: lambdas capture these
  const ReduceSpec &inner = levels.first, &outer = levels.second;
  partial_.resize(static_cast<std::size_t>(hosts) * count * esize);
  const int n = chunks(count * esize * static_cast<std::size_t>(hosts * per_host));
  const auto part = Blocks::balanced(count, n);  // of every rank's block
  StagePipeline::Stages s;
  // partial_ block h: the host's sum of the block of rank (h, my local index). Host h's blocks go
  // to this host's ranks in local order, as its ranks are.
  s.before = [&](int k) {
    const auto c = static_cast<std::size_t>(k);
    for (int h = 0; h < hosts; ++h) {
      ring_reduce_scatter(*local_, seq, (k * hosts + h) * per_host, in,
                          blocks_of(host_ranks_[static_cast<std::size_t>(h)], count, part.offset[c], part.count[c]),
                          partial_.data() + (static_cast<std::size_t>(h) * count + part.offset[c]) * esize, inner,
                          piece_bytes, scratch);
    }
  };
  s.across = [&](int k) {
    const auto c = static_cast<std::size_t>(k);
    Blocks own = Blocks::uniform(count, hosts);
    for (auto& o : own.offset) o += part.offset[c];
    own.count.assign(own.count.size(), part.count[c]);
    ring_reduce_scatter(*cross_, seq, k * hosts, partial_.data(), own,
                        static_cast<std::byte*>(out) + part.offset[c] * esize, outer, piece_bytes, cross_scratch_);
  };
  pipeline_.run(*local_, *cross_, n, s);
}

void Hierarchy::all_reduce(std::uint64_t seq, std::byte* inout, std::size_t count, const ReduceSpec& spec,
                           std::size_t piece_bytes, Scratch& scratch) {
  const int hosts = topo_.hosts, per_host = topo_.per_host;
  const std::size_t esize = size_of(spec.dtype);
  const auto levels = levels_of(spec);  // not a structured binding: lambdas capture these
  const ReduceSpec &inner = levels.first, &outer = levels.second;
  const int n = chunks(count * esize);
  const auto part = Blocks::balanced(count, n);
  const auto me = static_cast<std::size_t>(local_index_);
  // Each chunk is all-reduced as a whole buffer would be: its blocks over the host's ranks, and
  // this rank's block over the hosts.
  const auto host_blocks = [&](int k) { return Blocks::balanced(part.count[static_cast<std::size_t>(k)], per_host); };
  const auto chunk = [&](int k) { return inout + part.offset[static_cast<std::size_t>(k)] * esize; };
  StagePipeline::Stages s;
  s.before = [&](int k) {
    const auto blocks = host_blocks(k);
    ring_reduce_scatter(*local_, seq, k * per_host, chunk(k), blocks, chunk(k) + blocks.offset[me] * esize, inner,
                        piece_bytes, scratch);
  };
  // The host's sum of this rank's block, all-reduced with the same block of every other host.
  s.across = [&](int k) {
    const auto blocks = host_blocks(k);
    std::byte* mine = chunk(k) + blocks.offset[me] * esize;
    const auto cross_blocks = Blocks::balanced(blocks.count[me], hosts);
    const auto h = static_cast<std::size_t>(host_);
    ring_reduce_scatter(*cross_, seq, 2 * hosts * k, mine, cross_blocks, mine + cross_blocks.offset[h] * esize, outer,
                        piece_bytes, cross_scratch_);
    ring_all_gather(*cross_, seq, 2 * hosts * k + hosts, mine, cross_blocks.scaled(esize), piece_bytes);
  };
  s.after = [&](int k) {
    ring_all_gather(*local_, seq, (n + k) * per_host, chunk(k), host_blocks(k).scaled(esize), piece_bytes);
  };
  pipeline_.run(*local_, *cross_, n, s);
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
