#include "coshard/transport/process_group.hpp"

#include <cstdlib>
#include <cstdio>
#include <string>

namespace coshard::transport {

std::string_view to_string(Backend backend) noexcept {
  switch (backend) {
    case Backend::automatic: return "auto";
    case Backend::ucx: return "ucx";
    case Backend::nccl: return "nccl";
  }
  return "unknown";
}

Backend resolve_backend(Backend wanted, Device device) {
  const bool cuda = device.kind == DeviceKind::cuda;
  const Backend b = wanted != Backend::automatic ? wanted : cuda ? Backend::nccl : Backend::ucx;
  if (b == Backend::nccl && !cuda) {
    throw Error(Errc::bad_config, "the NCCL backend moves CUDA device memory, but the runtime is on " +
                                      device.to_string() + ": use the UCX backend (or auto) for CPU tensors");
  }
  if (b == Backend::ucx && cuda) {
    throw Error(Errc::bad_config, "the UCX backend moves host memory, but the runtime is on " + device.to_string() +
                                      ", whose tensors the host cannot read: use the NCCL backend (or auto)");
  }
  if (b == Backend::nccl && !nccl_available()) {
    throw Error(Errc::bad_config, "tensors on " + device.to_string() + " need the NCCL backend, which this build "
                                  "lacks: rebuild with the CUDA toolkit and NCCL (-DCOSHARD_CUDA=ON)");
  }
  return b;
}

Task<std::unique_ptr<ProcessGroup>> ProcessGroup::from_env(Runtime& runtime, ProcessGroupOptions options) {
  auto env = launch::resolve_launch_env(launch::process_env());
  if (!env) throw env.error();
  co_return co_await create(runtime, std::move(env).value(), std::move(options));
}

Task<std::unique_ptr<ProcessGroup>> ProcessGroup::create(Runtime& runtime, launch::LaunchEnv env, ProcessGroupOptions options) {
  const Backend backend = resolve_backend(options.backend, runtime.device());  // before anyone waits on us
  // A job on one host has no use for the other interfaces: its ranks listen on loopback only.
  // Not where the user picks UCX's transports or devices: theirs may need another device.
  if (options.ucx.net_devices.empty() && env.world_size > 1 && env.local_world_size == env.world_size &&
      !std::getenv("UCX_TLS") && !std::getenv("UCX_NET_DEVICES")) {
    options.ucx.net_devices = "lo";
  }
  auto rv = co_await rendezvous(std::move(env), options.rendezvous);
  std::unique_ptr<ProcessGroup> pg(new ProcessGroup(runtime, std::move(rv), options.ucx, backend));
  runtime.telemetry()
      .gauge("coshard_process_group_backend_info", "1 for the backend this rank's communicators use",
             {{"transport", std::string(to_string(backend))}, {"device", runtime.device().to_string()}})
      .set(1);
  if (pg->rank() == 0) {
    runtime.log(LogLevel::info, std::to_string(pg->size()) + " rank(s), communicators on " +
                                    std::string(to_string(backend)) + " (tensors on " + runtime.device().to_string() +
                                    ")");
  }
  if (options.world.name.empty()) options.world.name = "world";
  pg->world_ = co_await pg->new_communicator(std::move(options.world));
  co_return pg;
}

Task<std::unique_ptr<Communicator>> ProcessGroup::new_communicator(CommOptions options) {
  if (backend_ == Backend::nccl) co_return co_await create_nccl_communicator(rt_, store(), rank(), size(), std::move(options));
  co_return co_await create_ucx_communicator(rt_, store(), rank(), size(), std::move(options), ucx_);
}

namespace {

// Counts this rank in on `name`; the rank that makes it `size` sets `name`/all. True for that rank.
// Plain statements and named arguments around co_await: GCC 12 miscompiles temporaries and
// conditions inside a co_await expression.
Task<bool> count_in(launch::StoreClient& store, std::string name, int size) {
  const std::int64_t arrived = co_await store.add(name, 1);
  if (arrived != size) co_return false;
  std::string all = name + "/all", one = "1";
  co_await store.set(std::move(all), std::move(one));
  co_return true;
}

Task<void> wait_all(launch::StoreClient& store, std::string name, std::chrono::milliseconds timeout, int rank,
                    std::string what) {
  // Named, not a braced temporary: GCC 12 miscompiles those inside a co_await expression.
  std::vector<std::string> keys{name + "/all"};
  try {
    co_await store.wait(std::move(keys), timeout);
  } catch (const Error& e) {
    if (e.code() != Errc::timeout) throw;
    throw Error(Errc::timeout, what + ": " + e.message(), ErrorContext{.rank = rank, .op = "finish", .unit = {}});
  }
}

}  // namespace

Task<void> ProcessGroup::finish(std::chrono::milliseconds timeout) {
  if (!store()) co_return;
  const std::string left = "coshard/finish/left", heard = "coshard/finish/heard";
  const bool last_to_arrive = co_await count_in(*store(), left, size());
  if (!last_to_arrive) co_await wait_all(*store(), left, timeout, rank(), "not every rank reached the end of the job");
  // The rank serving the store (rank 0 under srun or torchrun) must outlive every rank's last
  // reply from it: had it left on seeing everyone arrive, a slower rank would lose its connection
  // before hearing so. Every rank counts in once more, and only the server waits for that. (A
  // store that coshard-run serves stays up until every node's ranks have ended.)
  const bool last_to_hear = co_await count_in(*store(), heard, size());
  if (last_to_hear || !rv_.server) co_return;
  co_await wait_all(*store(), heard, timeout, rank(), "not every rank heard that the job ended");
}

Task<DeviceMesh> DeviceMesh::create(Communicator& world, int replicate, int shard) {
  if (replicate < 1 || shard < 1 || replicate * shard != world.size()) {
    throw Error(Errc::bad_config, "a device mesh of " + std::to_string(replicate) + " replicas x " +
                                      std::to_string(shard) + " shards needs " + std::to_string(replicate * shard) +
                                      " ranks, but communicator '" + world.name() + "' has " +
                                      std::to_string(world.size()) + ". Pick a shard group size that divides " +
                                      std::to_string(world.size()));
  }
  DeviceMesh mesh;
  mesh.replicate = replicate;
  mesh.shard = shard;
  const int r = world.rank();
  mesh.shard_group = co_await world.split(r / shard, r, world.name() + ".shard");
  mesh.replicate_group = co_await world.split(r % shard, r, world.name() + ".replicate");
  co_return mesh;
}

}  // namespace coshard::transport
