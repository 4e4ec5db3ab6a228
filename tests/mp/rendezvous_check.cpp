// A rank program for the multi-process tests: resolves the launch environment, joins the
// rendezvous, exchanges a value with every other rank through the store and checks them all.
//   --fail-rank R      rank R exits with status 3 after the rendezvous; the others wait on
//                      (a key it never sets), so only the launcher can end them
//   --claim-world W    this process claims WORLD_SIZE=W whatever the environment says (rank 1 only)
//   --timeout-ms T     rendezvous deadline
#include <cstdio>
#include <cstdlib>
#include <string>

#include "coshard/runtime/error.hpp"
#include "coshard/runtime/scheduler.hpp"
#include "coshard/launch/rendezvous.hpp"

using namespace coshard;
using namespace coshard::launch;

int main(int argc, char** argv) {
  int fail_rank = -1, claim_world = 0;
  long timeout_ms = 60000;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string f = argv[i];
    if (f == "--fail-rank") fail_rank = std::atoi(argv[i + 1]);
    if (f == "--claim-world") claim_world = std::atoi(argv[i + 1]);
    if (f == "--timeout-ms") timeout_ms = std::atol(argv[i + 1]);
  }
  auto env = resolve_launch_env(process_env());
  if (!env) {
    std::fprintf(stderr, "%s\n", env.error().what());
    return 2;
  }
  LaunchEnv e = env.value();
  if (claim_world && e.rank == 1) e.world_size = claim_world;
  Scheduler sched;
  sched.start();
  try {
    return sched.sync_wait([](LaunchEnv le, int fail, long ms) -> Task<int> {
      // Named, not a braced temporary: GCC 12 miscompiles those inside a co_await expression.
      RendezvousOptions options;
      options.timeout = std::chrono::milliseconds(ms);
      auto rv = co_await rendezvous(le, std::move(options));
      if (!rv.store) {
        std::printf("rank %d ok world %d (no store)\n", le.rank, le.world_size);
        co_return 0;
      }
      if (le.rank == fail) {
        std::fprintf(stderr, "rank %d failing on purpose\n", le.rank);
        std::fflush(stderr);
        std::_Exit(3);
      }
      co_await rv.store->set("value/" + std::to_string(le.rank), std::to_string(le.rank * le.rank));
      std::vector<std::string> keys;
      for (int r = 0; r < le.world_size; ++r) keys.push_back("value/" + std::to_string(r));
      if (fail >= 0) keys.push_back("never");
      auto values = co_await rv.store->wait(std::move(keys), std::chrono::milliseconds(ms));
      for (int r = 0; r < le.world_size; ++r) {
        if (values[static_cast<std::size_t>(r)] != std::to_string(r * r)) {
          std::fprintf(stderr, "rank %d: wrong value from rank %d\n", le.rank, r);
          co_return 1;
        }
      }
      // Rank 0 may serve the store: leave only once everyone has read.
      std::vector<std::string> done_key{"all-done"};
      if (co_await rv.store->add("left", 1) == le.world_size) co_await rv.store->set("all-done", "1");
      co_await rv.store->wait(std::move(done_key), std::chrono::milliseconds(ms));
      std::printf("rank %d ok world %d\n", le.rank, le.world_size);
      co_return 0;
    }(e, fail_rank, timeout_ms));
  } catch (const std::exception& ex) {
    std::fprintf(stderr, "rank %d: %s\n", e.rank, ex.what());
    return 1;
  }
}
