#pragma once
// Works out this process's place in the job from the launcher's environment: torchrun (and
// coshard-run), Open MPI, PMI (MPICH/Hydra) or a Slurm job step, torchrun's names winning. A process
// started by none of them (a Slurm batch script outside srun included) is a single rank. Inside a
// Slurm step the step's first host serves the store (coshard/launch/slurm.hpp).
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "coshard/runtime/error.hpp"

namespace coshard::launch {

/// This process's place in the job, as resolve_launch_env() read it from the launcher's variables.
struct LaunchEnv {
  int rank = 0;                ///< this rank, 0 to world_size - 1 (RANK or the launcher's equivalent)
  int world_size = 1;          ///< ranks in the job (WORLD_SIZE or the launcher's equivalent)
  int local_rank = 0;          ///< this rank's index on its host (LOCAL_RANK; 0 when not given)
  int local_world_size = 1;    ///< ranks on this host (LOCAL_WORLD_SIZE or the launcher's equivalent)
  std::string master_addr;     ///< empty for a single rank
  std::uint16_t master_port = 0;  ///< port of the rendezvous store (MASTER_PORT); 0 for a single rank
  std::string token;           ///< COSHARD_TOKEN: required by the rendezvous store when set
  std::string source = "none";  ///< torchrun | openmpi | pmi | slurm | none
  bool store_hosted = false;    ///< COSHARD_STORE_HOSTED=1: the launcher serves the store, not rank 0
  int restart_count = 0;        ///< COSHARD_RESTART_COUNT (coshard-run --max-restarts) or TORCHELASTIC_RESTART_COUNT
  int restart_exit_code = 0;    ///< COSHARD_RESTART_EXIT_CODE: exit code of the failure behind the latest restart
  int restart_failed_rank = -1;  ///< COSHARD_RESTART_FAILED_RANK: the rank that failed then (-1: none, or a launcher)
};

/// Looks up one environment variable: its value, or nothing when it is not set (tests pass a map).
using EnvLookup = std::function<std::optional<std::string>(std::string_view)>;

/// Reads the process environment.
EnvLookup process_env();

/// Every problem found is listed in one bad_config error, with the variables to set.
Result<LaunchEnv> resolve_launch_env(const EnvLookup& env);

}  // namespace coshard::launch
