#include "coshard/transport/process_group.hpp"

namespace coshard::transport {

Task<std::unique_ptr<ProcessGroup>> ProcessGroup::from_env(Runtime& runtime, ProcessGroupOptions options) {
  auto env = resolve_launch_env(process_env());
  if (!env) throw env.error();
  co_return co_await create(runtime, std::move(env).value(), std::move(options));
}

Task<std::unique_ptr<ProcessGroup>> ProcessGroup::create(Runtime& runtime, LaunchEnv env, ProcessGroupOptions options) {
  auto rv = co_await rendezvous(std::move(env), options.rendezvous);
  std::unique_ptr<ProcessGroup> pg(new ProcessGroup(runtime, std::move(rv), options.ucx));
  if (options.world.name.empty()) options.world.name = "world";
  pg->world_ = co_await pg->new_communicator(std::move(options.world));
  co_return pg;
}

Task<std::unique_ptr<Communicator>> ProcessGroup::new_communicator(CommOptions options) {
  co_return co_await create_ucx_communicator(rt_, store(), rank(), size(), std::move(options), ucx_);
}

Task<void> ProcessGroup::finish(std::chrono::milliseconds timeout) {
  if (!store()) co_return;
  const std::string done = "coshard/finish/done";
  if (co_await store()->add("coshard/finish/left", 1) == size()) co_await store()->set(done, "1");
  // Named, not a braced temporary: GCC 12 miscompiles those inside a co_await expression.
  std::vector<std::string> keys{done};
  try {
    co_await store()->wait(std::move(keys), timeout);
  } catch (const Error& e) {
    if (e.code() != Errc::timeout) throw;
    throw Error(Errc::timeout, "not every rank reached the end of the job: " + e.message(),
                ErrorContext{.rank = rank(), .op = "finish", .unit = {}});
  }
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
