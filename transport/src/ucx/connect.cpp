#include "connect.hpp"

#include <algorithm>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "direct_probe.hpp"
#include "ring.hpp"

namespace coshard::transport::detail {
namespace {

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

// "host\npid\njob rank\naddress": the address is binary and last.
std::string pack(const PeerIdentity& id) {
  return id.host + "\n" + std::to_string(id.pid) + "\n" + std::to_string(id.job_rank) + "\n" + id.address;
}

PeerIdentity unpack(const std::string& s, const std::string& key) {
  auto a = s.find('\n');
  auto b = a == std::string::npos ? a : s.find('\n', a + 1);
  auto c = b == std::string::npos ? b : s.find('\n', b + 1);
  if (c == std::string::npos) throw Error(Errc::io, "store key '" + key + "' holds no UCX address: another program uses it");
  return {s.substr(0, a), std::atoi(s.substr(a + 1, b - a - 1).c_str()), std::atoi(s.substr(b + 1, c - b - 1).c_str()),
          s.substr(c + 1)};
}

}  // namespace

Task<std::unique_ptr<Communicator>> connect(Runtime& rt, StoreClient* store, std::shared_ptr<UcxContext> ctx, int rank,
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
  auto wire = std::make_unique<Wire>(ctx, rank, size, Wire::Options{.liveness_interval = ucx.liveness_interval});
  auto me = wire->self();
  me.job_rank = rt.rank();
  std::vector<PeerIdentity> peers(static_cast<std::size_t>(size));
  peers[static_cast<std::size_t>(rank)] = me;
  if (size > 1) {
    co_await store->set(prefix + std::to_string(rank), pack(me));
    std::vector<std::string> keys;
    for (int r = 0; r < size; ++r) keys.push_back(prefix + std::to_string(r));
    std::vector<std::string> values;
    try {
      values = co_await store->wait(keys, ucx.connect_timeout);
    } catch (const Error& e) {
      if (e.code() != Errc::timeout) throw;
      throw Error(Errc::timeout, "communicator '" + options.name + "': not every rank published its address: " +
                                     e.message(),
                  ErrorContext{.rank = rank, .op = "connect " + options.name, .unit = {}});
    }
    for (int r = 0; r < size; ++r) {
      peers[static_cast<std::size_t>(r)] = unpack(values[static_cast<std::size_t>(r)], keys[static_cast<std::size_t>(r)]);
    }
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
  co_return make_ucx_communicator(rt, store, std::move(ctx), std::move(wire), std::move(prefix), std::move(options),
                                  ucx, direct);
}

}  // namespace coshard::transport::detail
