#include "coshard/transport/rendezvous.hpp"

#include <unistd.h>

#include "coshard/runtime/error.hpp"

namespace coshard::transport {
namespace {

std::string whoami(const LaunchEnv& env) {
  char host[256] = "?";
  ::gethostname(host, sizeof host - 1);
  return std::to_string(env.world_size) + " " + host + " " + std::to_string(::getpid());
}

std::string describe(const std::string& claim) {  // "<world> <host> <pid>" -> "pid P on H"
  auto a = claim.find(' '), b = claim.rfind(' ');
  if (a == std::string::npos || b == a) return claim;
  return "pid " + claim.substr(b + 1) + " on " + claim.substr(a + 1, b - a - 1);
}

}  // namespace

Task<Rendezvous> rendezvous(LaunchEnv env, RendezvousOptions options) {
  Rendezvous r;
  r.env = env;
  if (env.world_size <= 1) co_return r;
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
  // coshard-run's store lives as long as the job: each attempt has keys of its own.
  if (env.store_hosted) co.key_prefix = "coshard/attempt/" + std::to_string(env.restart_count) + "/";
  r.store = co_await StoreClient::connect(co);

  const std::string me = whoami(env);
  const std::string prefix = "coshard/rendezvous/";
  auto holder = co_await r.store->compare_set(prefix + "rank/" + std::to_string(env.rank), "", me);
  if (holder != me) {
    throw Error(Errc::bad_config, "rank " + std::to_string(env.rank) + " was started twice: " + describe(holder) +
                                      " already holds it (this is " + describe(me) +
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
  for (int i = 0; i < env.world_size; ++i) {
    const auto& c = claims[static_cast<std::size_t>(i)];
    if (c.substr(0, c.find(' ')) != std::to_string(env.world_size)) {
      throw Error(Errc::bad_config, "world size mismatch: rank " + std::to_string(i) + " (" + describe(c) +
                                        ") was started with WORLD_SIZE=" + c.substr(0, c.find(' ')) +
                                        " but this rank has " + std::to_string(env.world_size) +
                                        ". Start every rank with the same world size",
                  ErrorContext{.rank = env.rank, .op = "rendezvous", .unit = {}});
    }
  }
  co_return r;
}

}  // namespace coshard::transport
