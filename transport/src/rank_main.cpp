#include "coshard/transport/rank_main.hpp"

#include <cstdio>
#include <string>

#include "coshard/transport/diagnostics_signal.hpp"

namespace coshard::transport {

int run_rank(std::string_view program, Runtime::Options options,
             const std::function<Task<int>(Runtime&, const launch::LaunchEnv&)>& body) {
  const std::string name(program);
  auto env = launch::resolve_launch_env(launch::process_env());
  if (!env) {
    std::fprintf(stderr, "%s: %s\n", name.c_str(), env.error().what());
    return 2;
  }
  const launch::LaunchEnv& e = env.value();
  try {
    options.rank = e.rank;
    DiagnosticsSignal diagnostics;
    Runtime rt(std::move(options));
    auto serving = diagnostics.serve(rt);
    return rt.scheduler().sync_wait(body(rt, e));
  } catch (const std::exception& ex) {
    std::fprintf(stderr, "%s: rank %d: %s\n", name.c_str(), e.rank, ex.what());
    return 1;
  }
}

}  // namespace coshard::transport
