#pragma once
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "coshard/launch/launch_env.hpp"

namespace coshard::run {

struct Options {
  int nproc_per_node = 1;
  int nnodes = 1;
  // --nnodes MIN:MAX: the job starts on the MAX nodes once all joined, or on those joined by
  // --last-call after MIN did; while restarts remain it goes on without nodes that fell silent and
  // did not come back within --rejoin-timeout, down to MIN, and takes in nodes that come later.
  int min_nodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  std::uint16_t master_port = 0;  // 0: pick a free port (node 0 only)
  std::string token;              // empty: generated (single node only)
  double grace_seconds = 5;       // SIGTERM, then SIGKILL after this
  int max_restarts = 0;           // when a rank fails: stop all, start all again, up to this many times
  std::chrono::seconds join_timeout{600};  // to reach node 0's store, and for node 0 to hear from every node
  // While restarts remain: how long a node cut off from node 0's store (its link down, its host
  // unreachable) may take to come back before the job ends, on node 0 and on that node alike.
  std::chrono::seconds rejoin_timeout{60};
  // With --nnodes MIN:MAX, how long node 0 waits for more nodes once MIN have joined before the
  // job starts on those (torchrun's last_call_timeout); every MAX node joined starts it at once.
  std::chrono::seconds last_call{30};
  // With --nnodes MIN:MAX, when a node is taken in: how long the ranks that take SIGUSR2 get to
  // stop after a checkpoint (so that the restart loses no step) before they are stopped as after a
  // failure. 0 stops them at once.
  std::chrono::seconds take_in_timeout{300};
  // A node whose coshard-run has not beaten (once a second) for this long is lost: its host
  // crashed, or it is cut off. The same on every node (the join compares it).
  std::chrono::seconds silence_timeout{15};
  std::vector<std::string> command;
};

struct ParseResult {
  std::optional<Options> options;  // empty: exit with `exit_code` (help, or a usage error)
  int exit_code = 0;
  std::string message;  // what to print: the help text, or the usage error naming the flag
};

// Parses argv: coshard-run's flags (CLI11), then after "--" the program and its own arguments.
// Inside a Slurm job step (srun --ntasks-per-node=1 coshard-run ...) the step gives --nnodes,
// --node-rank, --master and --token; flags that contradict the step are errors.
ParseResult parse_options(int argc, char** argv, const launch::EnvLookup& env);

}  // namespace coshard::run
