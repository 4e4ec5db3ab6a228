#include "coshard/launch/rendezvous.hpp"

#include <unistd.h>

#include <sstream>
#include <string>
#include <vector>

#include "coshard/runtime/error.hpp"
#include "coshard/launch/hosts.hpp"

namespace coshard::launch {
namespace {

// A claim is "<world> <host> <pid> <wire protocol>"; builds before kWireProtocol wrote no protocol.
// The protocol stays the fourth field in every version, so that any build can tell another's.
struct Claim {
  int world = 0, protocol = 0;
  std::string host = "?", pid = "?";
  std::string describe() const { return "pid " + pid + " on " + host; }
};

Claim parse_claim(const std::string& s) {
  Claim c;
  std::istringstream in(s);
  in >> c.world >> c.host >> c.pid;
  if (!(in >> c.protocol)) c.protocol = 0;
  return c;
}

std::string whoami(const LaunchEnv& env) {
  return std::to_string(env.world_size) + " " + this_host() + " " + std::to_string(::getpid()) + " " +
         std::to_string(kWireProtocol);
}

// Throws unless every rank's claim has this rank's wire protocol and world size. The protocol
// first: a claim of another one may not even hold a world size where this build reads it.
void check_claims(const LaunchEnv& env, const std::vector<std::string>& claims) {
  const ErrorContext at{.rank = env.rank, .op = "rendezvous", .unit = {}};
  for (int i = 0; i < env.world_size; ++i) {
    const Claim c = parse_claim(claims[static_cast<std::size_t>(i)]);
    const std::string who = "rank " + std::to_string(i) + " (" + c.describe() + ")";
    if (c.protocol != kWireProtocol) {
      throw Error(Errc::bad_config, who + " speaks coshard wire protocol " + std::to_string(c.protocol) +
                                        (c.protocol == 0 ? " (a build from before protocol versions)" : "") +
                                        ", this rank speaks protocol " + std::to_string(kWireProtocol) +
                                        ": ranks of different builds misread each other's messages. Start every "
                                        "rank from the same coshard build",
                  at);
    }
    if (c.world != env.world_size) {
      throw Error(Errc::bad_config, "world size mismatch: " + who + " was started with WORLD_SIZE=" +
                                        std::to_string(c.world) + " but this rank has " +
                                        std::to_string(env.world_size) + ". Start every rank with the same world size",
                  at);
    }
  }
}

}  // namespace

Task<Rendezvous> rendezvous(LaunchEnv env, RendezvousOptions options) {
  Rendezvous r;
  r.env = env;
  if (env.world_size <= 1) {
    r.hosts = {this_host()};
    co_return r;
  }
  auto ctx = co_await current_context();
  if (!ctx.scheduler) coshard::detail::throw_no_scheduler("rendezvous");

  if (env.rank == 0 && !env.store_hosted) {
    StoreServer::Options so;
    so.bind_address =
        !options.bind_address.empty() ? options.bind_address : StoreServer::bind_address_for(env.master_addr);
    so.port = env.master_port;
    so.token = env.token;
    r.server = std::make_unique<StoreServer>(*ctx.scheduler, so);
  }
  StoreClient::Options co;
  co.host = env.master_addr;
  co.port = env.master_port;
  co.token = env.token;
  co.connect_timeout = options.timeout;
  co.served_by = env.store_hosted ? "the coshard-run of node 0" : r.server ? "" : "rank 0";
  // coshard-run's store lives as long as the job: each attempt has keys of its own.
  if (env.store_hosted) co.key_prefix = "coshard/attempt/" + std::to_string(env.restart_count) + "/";
  r.store = co_await StoreClient::connect(co);

  const std::string me = whoami(env);
  const std::string prefix = "coshard/rendezvous/";
  auto holder = co_await r.store->compare_set(prefix + "rank/" + std::to_string(env.rank), "", me);
  if (holder != me) {
    throw Error(Errc::bad_config, "rank " + std::to_string(env.rank) + " was started twice: " +
                                      parse_claim(holder).describe() + " already holds it (this is " +
                                      parse_claim(me).describe() +
                                      "). Check RANK or --node-rank on every node",
                ErrorContext{.rank = env.rank, .op = "rendezvous", .unit = {}});
  }
  std::vector<std::string> keys;
  for (int i = 0; i < env.world_size; ++i) keys.push_back(prefix + "rank/" + std::to_string(i));
  std::vector<std::string> claims;
  try {
    claims = co_await r.store->wait(std::move(keys), options.timeout);
  } catch (const Error& e) {
    if (e.code() != Errc::timeout) throw;
    throw Error(Errc::timeout, "rendezvous of " + std::to_string(env.world_size) +
                                   " ranks did not complete: " + e.message(),
                ErrorContext{.rank = env.rank, .op = "rendezvous", .unit = {}});
  }
  check_claims(env, claims);
  for (const auto& c : claims) r.hosts.push_back(parse_claim(c).host);
  co_return r;
}

}  // namespace coshard::launch
