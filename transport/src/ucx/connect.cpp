#include "connect.hpp"

#include <algorithm>
#include <cstdlib>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "coshard/runtime/parse_whole.hpp"
#include "direct_probe.hpp"
#include "env.hpp"
#include "hierarchy.hpp"
#include "reduce_kernels.hpp"
#include "ring.hpp"

namespace coshard::transport::detail {
namespace {

// The largest mesh size a rank may propose: far past where it pays (16 KiB by default), and small
// enough that a rank's buffers for it stay small.
constexpr std::size_t kMeshLimit = std::size_t{1} << 20;

bool peer_mode_for(const std::vector<PeerIdentity>& peers, const std::string& my_host, UcxOptions::ErrorMode m) {
  if (const char* env = std::getenv("COSHARD_UCX_ERROR_MODE"); env && *env) {
    std::string v = env;
    if (v == "peer") return true;
    if (v == "none") return false;
    if (v != "auto") {
      throw Error(Errc::bad_config, "COSHARD_UCX_ERROR_MODE='" + v + "' is not one of peer, none, auto");
    }
  }
  if (m != UcxOptions::ErrorMode::automatic) return m == UcxOptions::ErrorMode::peer;
  return !std::all_of(peers.begin(), peers.end(), [&](const auto& p) { return p.host == my_host; });
}

// "host\npid\njob rank\nhierarchy min bytes\nhierarchy chunk bytes\nmesh max bytes\naddress":
// the address is binary and last.
std::string pack(const PeerIdentity& id) {
  return id.host + "\n" + std::to_string(id.pid) + "\n" + std::to_string(id.job_rank) + "\n" +
         std::to_string(id.hierarchy_min_bytes) + "\n" + std::to_string(id.hierarchy_chunk_bytes) + "\n" +
         std::to_string(id.mesh_max_bytes) + "\n" + id.address;
}

PeerIdentity unpack(const std::string& s, const std::string& key) {
  const auto foreign = [&] { return Error(Errc::io, "store key '" + key + "' holds no UCX address: another program uses it"); };
  std::size_t at[6];
  std::size_t from = 0;
  for (auto& p : at) {
    p = s.find('\n', from);
    if (p == std::string::npos) throw foreign();
    from = p + 1;
  }
  // The numbers between the newlines: all of each field, in range (atoi of 2^40 was undefined).
  const auto number = [&](auto& out, int field) {
    const auto read = parse_whole<std::remove_reference_t<decltype(out)>>(
        std::string_view(s).substr(at[field] + 1, at[field + 1] - at[field] - 1));
    if (!read) throw foreign();
    out = *read;
  };
  PeerIdentity id;
  id.host = s.substr(0, at[0]);
  number(id.pid, 0);
  number(id.job_rank, 1);
  number(id.hierarchy_min_bytes, 2);
  number(id.hierarchy_chunk_bytes, 3);
  number(id.mesh_max_bytes, 4);
  id.address = s.substr(at[5] + 1);
  return id;
}

// Publishes `me` under `prefix`/`rank` and reads the identities of `ranks` (indices under the same
// prefix), in their order.
Task<std::vector<PeerIdentity>> exchange(launch::StoreClient& store, std::string prefix, int rank, PeerIdentity me,
                                         std::vector<int> ranks, std::chrono::milliseconds timeout, std::string what) {
  co_await store.set(prefix + std::to_string(rank), pack(me));
  std::vector<std::string> keys;
  for (int r : ranks) keys.push_back(prefix + std::to_string(r));
  std::vector<std::string> values;
  try {
    values = co_await store.wait(keys, timeout);
  } catch (const Error& e) {
    if (e.code() != Errc::timeout) throw;
    throw Error(Errc::timeout, what + ": not every rank published its address: " + e.message(),
                ErrorContext{.rank = rank, .op = "connect " + what, .unit = {}});
  }
  std::vector<PeerIdentity> peers;
  for (std::size_t i = 0; i < keys.size(); ++i) peers.push_back(unpack(values[i], keys[i]));
  co_return peers;
}

// What this rank proposes for the two-level schedules and the mesh: UcxOptions, or
// COSHARD_UCX_HIERARCHY=0|1, COSHARD_UCX_HIERARCHY_MIN_BYTES, COSHARD_UCX_HIERARCHY_CHUNK_BYTES and
// COSHARD_UCX_MESH_MAX_BYTES.
void propose(const UcxOptions& ucx, PeerIdentity& me) {
  bool on = ucx.hierarchy;
  if (auto v = env_switch("COSHARD_UCX_HIERARCHY")) on = *v;
  const auto min_bytes = env_bytes("COSHARD_UCX_HIERARCHY_MIN_BYTES").value_or(ucx.hierarchy_min_bytes);
  me.hierarchy_min_bytes = on ? static_cast<std::int64_t>(min_bytes) : -1;
  me.hierarchy_chunk_bytes =
      static_cast<std::int64_t>(env_bytes("COSHARD_UCX_HIERARCHY_CHUNK_BYTES").value_or(ucx.hierarchy_chunk_bytes));
  const auto env_mesh = env_bytes("COSHARD_UCX_MESH_MAX_BYTES");
  const auto mesh = env_mesh.value_or(ucx.mesh_max_bytes);
  if (mesh > kMeshLimit) {
    const std::string what = env_mesh ? "COSHARD_UCX_MESH_MAX_BYTES='" + std::to_string(mesh) + "'"
                                      : "UcxOptions::mesh_max_bytes = " + std::to_string(mesh);
    throw Error(Errc::bad_config, what + " is above the mesh's limit of " + std::to_string(kMeshLimit) +
                                      " bytes: the mesh pays only where message latency dominates (docs/transport.md)");
  }
  me.mesh_max_bytes = static_cast<std::int64_t>(mesh);
}

// The smallest any rank proposes: a rank that wants the mesh for fewer operations gets its way.
std::size_t agreed_mesh_max(const std::vector<PeerIdentity>& peers) {
  std::int64_t agreed = peers.front().mesh_max_bytes;
  for (const auto& p : peers) agreed = std::min(agreed, p.mesh_max_bytes);
  return static_cast<std::size_t>(std::max<std::int64_t>(0, agreed));
}

// Agreed by every rank from the same identities: the flat ring if any rank wants it, else the
// largest threshold proposed; no overlap if any rank wants none, else the largest chunk.
struct AgreedHierarchy {
  std::int64_t min_bytes = 0;  // -1: the flat ring
  std::size_t chunk_bytes = 0;
};
AgreedHierarchy agreed_hierarchy(const std::vector<PeerIdentity>& peers) {
  AgreedHierarchy agreed;
  bool overlap = true;
  for (const auto& p : peers) {
    if (p.hierarchy_min_bytes < 0) return {-1, 0};
    agreed.min_bytes = std::max(agreed.min_bytes, p.hierarchy_min_bytes);
    overlap = overlap && p.hierarchy_chunk_bytes > 0;
    agreed.chunk_bytes = std::max(agreed.chunk_bytes, static_cast<std::size_t>(std::max<std::int64_t>(0, p.hierarchy_chunk_bytes)));
  }
  if (!overlap) agreed.chunk_bytes = 0;
  return agreed;
}

// The per-host and cross-host wires of a communicator that spans hosts (hierarchy.hpp), connected.
Task<std::unique_ptr<Hierarchy>> connect_hierarchy(Runtime& rt, launch::StoreClient& store, std::shared_ptr<UcxContext> ctx,
                                                   Topology topo, int rank, std::string prefix, UcxOptions ucx,
                                                   std::string name, std::size_t chunk_bytes) {
  const auto me = static_cast<std::size_t>(rank);
  const int host = topo.host_of[me], index = topo.local_of[me];
  const Wire::Options wo{.liveness_interval = ucx.liveness_interval, .name_by_job_rank = true, .log = rt.log_sink()};
  auto local = std::make_unique<Wire>(ctx, index, topo.per_host, wo);
  auto cross = std::make_unique<Wire>(ctx->eager(), host, topo.hosts, wo);
  std::vector<int> host_ranks = topo.ranks_on(host), cross_ranks = topo.ranks_at(index);
  auto local_id = local->self(), cross_id = cross->self();
  local_id.job_rank = cross_id.job_rank = rt.rank();
  // Named arguments: GCC 12 miscompiles temporaries inside a co_await expression.
  std::string local_prefix = prefix + "local/", local_what = "communicator '" + name + "' on this host";
  std::string cross_prefix = prefix + "cross/", cross_what = "communicator '" + name + "' across hosts";
  auto local_peers = co_await exchange(store, std::move(local_prefix), rank, local_id, std::move(host_ranks),
                                       ucx.connect_timeout, std::move(local_what));
  auto cross_peers = co_await exchange(store, std::move(cross_prefix), rank, cross_id, std::move(cross_ranks),
                                       ucx.connect_timeout, std::move(cross_what));
  local->connect(local_peers, peer_mode_for(local_peers, local_id.host, ucx.error_mode));
  cross->connect(cross_peers, peer_mode_for(cross_peers, cross_id.host, ucx.error_mode));
  co_return std::make_unique<Hierarchy>(std::move(topo), rank, std::move(local), std::move(cross), chunk_bytes);
}

}  // namespace

Task<std::unique_ptr<Communicator>> connect(Runtime& rt, launch::StoreClient* store, std::shared_ptr<UcxContext> ctx, int rank,
                                            int size, std::string prefix, CommOptions options, UcxOptions ucx) {
  if (size < 1 || size > kMaxRanks || rank < 0 || rank >= size) {
    throw Error(Errc::bad_config, "communicator '" + options.name + "': rank " + std::to_string(rank) + " of " +
                                      std::to_string(size) + " is out of range (at most " +
                                      std::to_string(kMaxRanks) + " ranks)");
  }
  if (!store && size > 1) {
    throw Error(Errc::bad_config, "communicator '" + options.name + "' of " + std::to_string(size) +
                                      " ranks needs the rendezvous store to exchange addresses");
  }
  auto wire = std::make_unique<Wire>(ctx, rank, size,
                                     Wire::Options{.liveness_interval = ucx.liveness_interval, .log = rt.log_sink()});
  auto me = wire->self();
  me.job_rank = rt.rank();
  propose(ucx, me);
  const std::size_t stream_from = stream_min_bytes();  // a bad value fails here, before peers wait on this rank
  std::vector<PeerIdentity> peers{me};
  if (size > 1) {
    std::vector<int> all(static_cast<std::size_t>(size));
    for (int r = 0; r < size; ++r) all[static_cast<std::size_t>(r)] = r;
    std::string what = "communicator '" + options.name + "'";
    peers = co_await exchange(*store, prefix, rank, me, std::move(all), ucx.connect_timeout, std::move(what));
  }
  std::unique_ptr<Hierarchy> hierarchy;
  const auto agreed = agreed_hierarchy(peers);
  if (auto topo = Topology::of(peers); topo && agreed.min_bytes >= 0) {
    std::string sub = prefix + "h/";
    hierarchy = co_await connect_hierarchy(rt, *store, ctx, std::move(*topo), rank, std::move(sub), ucx, options.name,
                                           agreed.chunk_bytes);
  }
  wire->connect(peers, peer_mode_for(peers, me.host, ucx.error_mode));
  if (size > 1) {
    // Shared-memory endpoints attach to the peer's segments while connecting, so no rank may
    // destroy its worker before every rank has connected to it.
    if (co_await store->add(prefix + "connected", 1) == size) co_await store->set(prefix + "all-connected", "1");
    std::vector<std::string> all{prefix + "all-connected"};
    co_await store->wait(std::move(all), ucx.connect_timeout);
  }
  DirectSetup direct;
  const bool one_host =
      std::all_of(peers.begin(), peers.end(), [&](const PeerIdentity& p) { return p.host == me.host; });
  if (size > 1 && one_host) direct = co_await probe_direct(store, prefix, rank, size, ucx);
  direct.stream_min_bytes = stream_from;
  Levels levels;
  levels.hierarchy = std::move(hierarchy);
  levels.min_bytes = static_cast<std::size_t>(std::max<std::int64_t>(0, agreed.min_bytes));
  levels.mesh_max_bytes = agreed_mesh_max(peers);
  co_return make_ucx_communicator(rt, store, std::move(ctx), std::move(wire), std::move(prefix), std::move(options),
                                  ucx, direct, std::move(levels));
}

}  // namespace coshard::transport::detail

namespace coshard::transport {

Task<std::unique_ptr<Communicator>> create_ucx_communicator(Runtime& runtime, launch::StoreClient* store, int rank, int size,
                                                            CommOptions options, UcxOptions ucx) {
  std::string prefix = "coshard/ucx/" + options.name + "/";
  if (store && size > 1) {
    // A name may be used again in one job (a new communicator after an old one is gone): every
    // rank counts its own uses, and the same call order gives every rank the same generation.
    auto generation = co_await store->add(prefix + "generation/" + std::to_string(rank), 1);
    prefix += std::to_string(generation) + "/";
  }
  auto context = std::make_shared<detail::UcxContext>(detail::UcxContext::Protocols::automatic, ucx.net_devices);
  co_return co_await detail::connect(runtime, store, std::move(context), rank, size,
                                     std::move(prefix), std::move(options), ucx);
}

}  // namespace coshard::transport
