#pragma once
#include "options.hpp"

namespace coshard::run {

// Starts the local ranks, serves the store on node 0, relays output and signals, and supervises:
// when a rank fails, the others get SIGTERM and, after the grace period, SIGKILL. Returns the
// process exit code: 0 when every rank exited 0.
int launch(const Options& options);

}  // namespace coshard::run
