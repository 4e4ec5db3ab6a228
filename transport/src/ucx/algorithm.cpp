#include "algorithm.hpp"

namespace coshard::transport::detail {
namespace {

bool reduces_or_gathers(CollectiveOp op) noexcept {
  return op == CollectiveOp::all_gather || op == CollectiveOp::reduce_scatter || op == CollectiveOp::all_reduce;
}

// What one rank moves on the direct path: its block of an all-gather or reduce-scatter, its part
// of an all-reduce.
std::size_t direct_bytes(const OpInfo& info, int size) noexcept {
  return info.op == CollectiveOp::all_reduce ? info.bytes() / static_cast<std::size_t>(size) : info.bytes();
}

}  // namespace

std::string_view to_string(Algorithm a) noexcept {
  switch (a) {
    case Algorithm::p2p: return "p2p";
    case Algorithm::mesh: return "mesh";
    case Algorithm::direct: return "direct";
    case Algorithm::hierarchical: return "hierarchical";
    case Algorithm::ring: return "ring";
  }
  return "ring";
}

std::size_t buffer_bytes(const OpInfo& info, int size) noexcept {
  const bool per_rank = info.op == CollectiveOp::all_gather || info.op == CollectiveOp::reduce_scatter;
  return info.bytes() * (per_rank ? static_cast<std::size_t>(size) : 1);
}

Algorithm choose(const OpInfo& info, const Paths& paths) noexcept {
  if (info.op == CollectiveOp::send || info.op == CollectiveOp::recv) return Algorithm::p2p;
  if (!reduces_or_gathers(info.op) || paths.size < 2) return Algorithm::ring;
  if (paths.mesh_takes) return Algorithm::mesh;
  if (paths.direct && direct_bytes(info, paths.size) >= paths.direct_min_bytes) return Algorithm::direct;
  if (paths.hierarchy && buffer_bytes(info, paths.size) >= paths.hierarchy_min_bytes) return Algorithm::hierarchical;
  return Algorithm::ring;
}

}  // namespace coshard::transport::detail
