#pragma once
// Brings the ranks of a job together: rank 0 serves the store unless the launcher already does,
// every rank connects, claims its rank and checks that all ranks agree on the world size and come
// from builds of one wire protocol. A rank started twice, a different WORLD_SIZE somewhere, a rank
// of another build, or ranks that never arrive each fail with an error naming them, within the
// deadline.
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "coshard/runtime/task.hpp"
#include "coshard/launch/launch_env.hpp"
#include "coshard/launch/store.hpp"

namespace coshard::launch {

/// The shape of what ranks exchange (store keys, message headers, collective schedules). Raise it
/// whenever one changes, so that ranks of different coshard builds are refused at the rendezvous
/// rather than misread each other's messages. Claims made before it existed carry none (0).
inline constexpr int kWireProtocol = 1;

/// Deadline and address of a rendezvous.
struct RendezvousOptions {
  std::chrono::milliseconds timeout{120000};  ///< for connecting and for every rank to arrive
  std::string bind_address;                   ///< rank 0's store; empty: MASTER_ADDR if numeric, else 0.0.0.0
};

/// What rendezvous() hands back: the environment and the store, which the ranks' communicators use.
struct Rendezvous {
  LaunchEnv env;                        ///< this rank's environment; all ranks were checked to share its world size
  std::vector<std::string> hosts;       ///< each rank's host name, from its claim (one, this host's, for a single rank)
  std::unique_ptr<StoreServer> server;  ///< on rank 0 when the launcher does not serve the store
  std::unique_ptr<StoreClient> store;   ///< null for a single rank
};

/// Runs on the scheduler of the calling task.
Task<Rendezvous> rendezvous(LaunchEnv env, RendezvousOptions options);
/// rendezvous() with default options.
/// No default arguments on coroutines: GCC 12 destroys such temporaries twice inside co_await.
inline Task<Rendezvous> rendezvous(LaunchEnv env) { return rendezvous(std::move(env), RendezvousOptions()); }

}  // namespace coshard::launch
