#pragma once
// gpt2-train's checkpoints under --checkpoint-dir: DIR/step-NNNNNNNN (the engine's sharded
// checkpoints, with the training state that is not a tensor in their metadata), DIR/latest naming
// the newest complete one (replaced atomically), the newest --checkpoint-keep kept, and DIR/.lock
// while a job writes there. Rank 0 does the bookkeeping; every rank reads.
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "coshard/fsdp/checkpoint.hpp"
#include "dir_lock.hpp"
#include "train_options.hpp"

namespace coshard::train {

class CheckpointDir {
 public:
  explicit CheckpointDir(std::filesystem::path root) : root_(std::move(root)) {}
  CheckpointDir(const CheckpointDir&) = delete;
  CheckpointDir& operator=(const CheckpointDir&) = delete;

  // Rank 0: creates DIR and takes DIR/.lock (DirLock), held until this is destroyed.
  void lock();
  std::filesystem::path step_dir(int step) const;
  // Complete checkpoints by step; Errc::io when DIR exists but cannot be listed.
  std::map<int, std::filesystem::path> complete() const;
  // The newest complete checkpoint (DIR/latest names it too, unless a job died in between).
  std::optional<std::filesystem::path> latest() const;
  // Rank 0, once the checkpoint of `step` is complete: DIR/latest names it; older checkpoints
  // beyond the newest `keep`, and unfinished ones older than it, are removed. Throws, removing
  // nothing, once another took the lock over (DirLock::check); other failures here are warnings.
  void commit(int step, int keep);
  // Rank 0: removes the checkpoint of `step`, complete or not (its weights proved bad).
  void discard(int step);
  const std::filesystem::path& root() const noexcept { return root_; }

 private:
  std::filesystem::path root_;
  std::unique_ptr<DirLock> lock_;
};

// What identifies the tokens a run trains and validates on, by content (agreement.hpp:
// token_identity): --data (or the embedded corpus) before the validation split, and --val-data.
struct DataIdentity {
  std::string data;
  std::string val_data;  // empty: no --val-data
};

// A double as the checkpoint records it, exactly (%.17g).
std::string exact_number(double v);

// The training state beside the tensors: the step reached and what the data position, schedule
// and seeds depend on, the data by its identity and its validation split included.
fsdp::CheckpointMetadata training_state(const TrainOptions& o, const DataIdentity& data, int world, int steps_done);
// The step a checkpoint's training state names; Errc::corrupt_file when it names none.
int stored_step(const fsdp::CheckpointMetadata& state, const std::string& where);
// Errc::corrupt_file when a unit's AdamW step count is not `step`: a gpt2-train checkpoint takes
// one optimizer step per training step, so the manifest and its tensors disagree (an imported
// checkpoint, whose optimizer starts afresh, is not checked).
void check_step_counts(const fsdp::Manifest& m, int step, const std::string& where);
// The step a checkpoint resumes at, after checking that this run continues it exactly (same
// global batch, sequence length, seed, data order and schedule); errors name the flag to change.
// A checkpoint of an older build, without the data's identity or the split, is checked on what it
// has (the data's path, lexically normalised).
int resume_step(const fsdp::CheckpointMetadata& state, const TrainOptions& o, const DataIdentity& data, int world,
                const std::string& where);
// Which checkpoint --resume names (nullopt: start fresh), and whether --checkpoint-dir may be
// written: no checkpoint there newer than the one resumed, none at all without --resume.
std::optional<std::filesystem::path> checkpoint_to_resume(const TrainOptions& o);

}  // namespace coshard::train
