#pragma once
// What a Slurm job step tells its tasks, read without a launcher of ours: the host list, the
// tasks on each host, and from those a rendezvous every task of the step agrees on (the first
// host serves the store, on a port and with a token derived from the job and step ids), so that
// `srun -N2 --ntasks-per-node=2 gpt2-train` needs no MASTER_ADDR, and coshard-run inside an
// allocation needs no --nnodes, --node-rank, --master or --token.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "coshard/runtime/error.hpp"
#include "coshard/launch/launch_env.hpp"

namespace coshard::launch {

/// Expands a Slurm host list, "node[1-3,7],gpu-a[01-02]" or "rack[1-2]-n[1-2]", into host names in
/// Slurm's order (zero padding kept). A malformed list or one of over 65536 hosts is bad_config.
Result<std::vector<std::string>> expand_hostlist(std::string_view list);

/// Expands SLURM_TASKS_PER_NODE's "2(x3),1" into one count per host: {2, 2, 2, 1}.
Result<std::vector<int>> expand_tasks_per_node(std::string_view counts);

/// A job step's shape and its rendezvous, as every task of the step derives it.
struct SlurmStep {
  std::vector<std::string> hosts;   ///< SLURM_STEP_NODELIST expanded; hosts[0] serves the store
  std::vector<int> tasks_per_host;  ///< SLURM_STEP_TASKS_PER_NODE expanded, one per host
  int node_id = 0;                  ///< SLURM_NODEID: this task's host, an index into hosts
  std::string job_id;               ///< SLURM_JOB_ID
  std::string step_id;              ///< SLURM_STEP_ID
  std::uint16_t port = 0;           ///< SLURM_STEP_RESV_PORTS' first port, else derived from the ids
  std::string token;                ///< "slurm-<job>.<step>": a task of another step cannot join
};

/// True inside a job step (srun), where SLURM_STEP_ID is set; a batch script outside any step
/// is not one (its SLURM_PROCID describes the batch shell, not a rank).
bool in_slurm_step(const EnvLookup& env);

/// Reads the step's variables; every problem is listed in one bad_config error.
Result<SlurmStep> read_slurm_step(const EnvLookup& env);

}  // namespace coshard::launch
