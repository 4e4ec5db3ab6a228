#pragma once
// A job's ranks and their communicators: joins the rendezvous, creates the world communicator and
// more on demand (separate ones for all-gather and reduce-scatter let both run at once), and a
// 2-D DeviceMesh (replicate x shard) for hybrid sharding.
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "coshard/runtime/runtime.hpp"
#include "coshard/transport/communicator.hpp"
#include "coshard/launch/launch_env.hpp"
#include "coshard/transport/nccl_communicator.hpp"
#include "coshard/launch/rendezvous.hpp"
#include "coshard/transport/ucx_communicator.hpp"

namespace coshard::transport {

/// Which library moves the tensors of a ProcessGroup's communicators.
enum class Backend : std::uint8_t {
  automatic,  ///< by the runtime's device: NCCL for CUDA tensors, UCX for host (CPU) tensors
  ucx,        ///< UCX: host memory (the CPU device, cpu-discrete included)
  nccl,       ///< NCCL: CUDA device memory
};
/// "auto", "ucx" or "nccl".
std::string_view to_string(Backend backend) noexcept;

/// How ProcessGroup joins the job and sets up its communicators.
struct ProcessGroupOptions {
  launch::RendezvousOptions rendezvous;  ///< deadline and bind address of the rendezvous
  CommOptions world;  ///< options of the world communicator (its name: "world")
  UcxOptions ucx;     ///< backend settings of the world communicator and of new_communicator()
  Backend backend = Backend::automatic;  ///< see Backend; a backend that cannot move the runtime's tensors is refused
};

/// The backend that `wanted` means on `device`: automatic resolved (NCCL on CUDA, UCX on the
/// CPU). Throws Error(bad_config) for a pair that cannot work (NCCL on the CPU, UCX on CUDA, NCCL
/// missing from this build), naming what to change.
Backend resolve_backend(Backend wanted, Device device);

/// The ranks of a job: the rendezvous store, the "world" communicator over every rank, and further
/// communicators on demand, all of one backend (ProcessGroupOptions::backend, by the runtime's
/// device). Rank 0 may serve the store, so call finish() at the end.
class ProcessGroup {
 public:
  /// Reads the launcher's environment (torchrun, Open MPI, PMI, Slurm, or none: one rank).
  static Task<std::unique_ptr<ProcessGroup>> from_env(Runtime& runtime, ProcessGroupOptions options);
  /// Joins the job described by `env` (rendezvous) and creates the world communicator.
  static Task<std::unique_ptr<ProcessGroup>> create(Runtime& runtime, launch::LaunchEnv env, ProcessGroupOptions options);
  /// from_env() with default options.
  /// No default arguments on coroutines: GCC 12 destroys such temporaries twice inside co_await.
  static Task<std::unique_ptr<ProcessGroup>> from_env(Runtime& runtime) {
    return from_env(runtime, ProcessGroupOptions());
  }

  /// The launch environment this group was created from.
  const launch::LaunchEnv& env() const noexcept { return rv_.env; }
  /// Each rank's host name (gethostname), in rank order, as the rendezvous found them;
  /// ranks_per_host() (hosts.hpp) groups them.
  const std::vector<std::string>& hosts() const noexcept { return rv_.hosts; }
  /// This process's rank in the job.
  int rank() const noexcept { return rv_.env.rank; }
  /// Ranks in the job (the world size).
  int size() const noexcept { return rv_.env.world_size; }
  /// The communicator over every rank, created with ProcessGroupOptions::world.
  Communicator& world() noexcept { return *world_; }
  /// The rendezvous store's client; null for a single rank.
  launch::StoreClient* store() noexcept { return rv_.store.get(); }
  /// The backend of every communicator of this group (never Backend::automatic).
  Backend backend() const noexcept { return backend_; }

  /// A further communicator over every rank; every rank creates the same ones in the same order.
  Task<std::unique_ptr<Communicator>> new_communicator(CommOptions options);

  /// Every rank waits here for all the others before it leaves, so that rank 0, which may serve
  /// the store, outlives everyone's last use of it. Call once, at the end of the job.
  Task<void> finish(std::chrono::milliseconds timeout);
  /// finish() with a 5-minute timeout.
  Task<void> finish() { return finish(std::chrono::minutes(5)); }

 private:
  ProcessGroup(Runtime& runtime, launch::Rendezvous rv, UcxOptions ucx, Backend backend)
      : rt_(runtime), rv_(std::move(rv)), ucx_(ucx), backend_(backend) {}
  Runtime& rt_;
  launch::Rendezvous rv_;
  UcxOptions ucx_;
  Backend backend_;
  std::unique_ptr<Communicator> world_;
};

/// Ranks laid out as rank = replica * shard + s. The shard group holds the ranks of one replica
/// (FSDP shards within it); the replicate group holds the ranks with the same s (gradients of a
/// shard are all-reduced across it).
struct DeviceMesh {
  int replicate = 1;  ///< number of replicas (ranks in a replicate group)
  int shard = 1;      ///< ranks each replica is sharded over (ranks in a shard group)
  std::unique_ptr<Communicator> shard_group;      ///< this rank's replica: `<world>.shard`
  std::unique_ptr<Communicator> replicate_group;  ///< the ranks holding this rank's shard: `<world>.replicate`

  /// Collective over `world`; `replicate * shard` must equal world.size().
  static Task<DeviceMesh> create(Communicator& world, int replicate, int shard);
};

}  // namespace coshard::transport
