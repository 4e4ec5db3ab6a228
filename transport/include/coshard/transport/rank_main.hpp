#pragma once
// The main() of a program that is one rank of a job (started by coshard-run, torchrun, mpirun or
// srun, or alone as a single rank): resolves the launch environment, runs `body` on a Runtime for
// this rank and returns its exit code. A bad environment prints the problems and gives 2; an
// error escaping `body` prints "<program>: rank R: <error>" and gives 1. SIGUSR1 makes the rank
// write its diagnostics (Runtime::write_diagnostics: every communicator's flight record, into
// $COSHARD_FLIGHT_DIR) from a thread of its own, even when its scheduler is stuck.
#include <functional>
#include <string_view>

#include "coshard/runtime/runtime.hpp"
#include "coshard/runtime/task.hpp"
#include "coshard/launch/launch_env.hpp"

namespace coshard::transport {

/// The main() of one rank: resolves the launch environment, runs `body` on a Runtime for this rank
/// (options.rank set) and returns its exit code; 2 for a bad environment, 1 for an error escaping
/// `body`, each printed with `program`'s name. While it runs, SIGUSR1 writes the rank's diagnostics.
int run_rank(std::string_view program, Runtime::Options options,
             const std::function<Task<int>(Runtime&, const launch::LaunchEnv&)>& body);

}  // namespace coshard::transport
