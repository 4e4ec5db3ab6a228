#pragma once
// Sharded checkpoints of the engine's state (format: coshard/fsdp/checkpoint.hpp). Each rank of
// the first replica writes what it owns (master shards and optimizer state, as f32 pieces of
// flattened parameters) to a file of its own; rank 0 writes the manifest last, once every rank
// reported its file. Loading reads, on each rank, the pieces that intersect what it owns, so a
// checkpoint loads on any world size, strategy and shard group.
//
// Ordering it keeps:
//  - staging copies the shards to host memory on the optimizer stream, after every update issued
//    so far: what is saved is the state after the last optimizer step;
//  - files are written on the checkpoint stream (off the scheduler thread); the report of every
//    rank is all-gathered on the checkpoint communicator after its file is durable, and the manifest
//    is written only when every rank succeeded, after which a second all-gather tells every rank;
//  - an asynchronous save is finished (reported, manifest written) at the next optimizer_step(),
//    save or wait_for_checkpoint(), at the same point on every rank; a second save waits for it;
//  - loading waits for every engine stream before it overwrites the shards.
#include <filesystem>
#include <memory>
#include <optional>
#include <vector>

#include "comm_groups.hpp"
#include "sharded_state.hpp"
#include "context.hpp"
#include "coshard/fsdp/checkpoint.hpp"
#include "unit_state.hpp"

namespace coshard::fsdp::detail {

// The pieces the rank at `shard_rank` of the shard group stores, in file order, with byte offsets
// (checksums not filled in).
std::vector<CheckpointPiece> pieces_of(const std::vector<UnitState>& units, const Context& ctx, int shard_rank,
                                       const std::string& file);

class ShardedCheckpoint {
 public:
  ShardedCheckpoint(Context& ctx, std::vector<UnitState>& units, CommGroups& comms);
  ~ShardedCheckpoint();

  // Collective. Stages and writes this rank's file; with `async` returns once staged, else once
  // the manifest is durable.
  Task<void> save(std::filesystem::path dir, CheckpointMetadata metadata, bool async);
  // Collective. Finishes a pending asynchronous save (no-op without one); throws if it failed.
  Task<void> finish();
  // Collective. Loads the shards and optimizer state; returns the trainer's metadata.
  Task<CheckpointMetadata> load(std::filesystem::path dir);
  bool pending() const noexcept { return pending_ != nullptr; }

  struct Pending;

 private:
  Task<void> stage(Pending& p);
  void write(Pending& p);
  Task<void> publish(Pending& p);
  Manifest manifest(const Pending& p, const std::vector<std::int64_t>& reports,
                    std::vector<std::vector<CheckpointPiece>> pieces) const;
  Task<std::string> failures(bool ok);
  void report(const std::filesystem::path& dir, const std::exception_ptr& e) const;
  void check_compatible(const Manifest& m, const std::filesystem::path& dir) const;
  std::vector<std::vector<float>> read_shards(const Manifest& m, const std::filesystem::path& dir) const;
  Task<void> install(Manifest m, std::vector<std::vector<float>> values);

  Context& ctx_;
  std::vector<UnitState>& units_;
  CommGroups& comms_;
  Stream& stream_;  // file I/O, off the scheduler thread
  std::unique_ptr<Pending> pending_;
};

}  // namespace coshard::fsdp::detail
