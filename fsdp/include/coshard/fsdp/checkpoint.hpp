#pragma once
// Sharded checkpoints, torch.distributed.checkpoint's shape: a directory of per-rank data files
// and one manifest (manifest.json) that rank 0 writes last, atomically; a directory without a
// complete manifest is not a checkpoint. The manifest describes every stored piece: which
// parameter and which tensor of it (the parameter, or an optimizer state), its element range in
// the flattened parameter, the file and byte range that hold it, and a CRC-32C. A loader on any
// world size or strategy reads the pieces that intersect what it owns.
//
// Engine::save_sharded / load_sharded write and read them (engine.hpp); this header is the
// format, for tools (coshard-ckpt) and trainers that look for checkpoints.
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "coshard/runtime/tensor.hpp"

namespace coshard::fsdp {

/// The version this build writes and the newest it reads. 2: the manifest carries a CRC-32C of
/// itself (version 1 manifests, which have none, are still read).
inline constexpr int kCheckpointFormatVersion = 2;
/// The manifest's file name in a checkpoint directory; a directory without it is no checkpoint.
inline constexpr const char* kManifestName = "manifest.json";

/// Training state that is not a tensor (step, schedule, data position, seeds), by name, written
/// by the trainer and handed back on load.
using CheckpointMetadata = std::map<std::string, std::string>;

/// One stored range of one tensor of a parameter: where it lies in the flattened tensor and in
/// which file.
struct CheckpointPiece {
  std::string param;           ///< parameter name, e.g. "h.0.attn.c_attn.weight"
  std::string kind;            ///< "param", "exp_avg", "exp_avg_sq" or "momentum_buffer"
  Shape shape;                 ///< the parameter's global shape
  std::int64_t offset = 0;     ///< first element in the flattened parameter
  std::int64_t length = 0;     ///< elements (f32)
  std::string file;            ///< data file in the checkpoint directory
  std::uint64_t byte_offset = 0; ///< where the piece starts in `file`
  std::uint32_t crc32c = 0;    ///< of the piece's bytes
};

/// One rank's data file as the manifest lists it; verify_checkpoint() checks it against the disk.
struct CheckpointFile {
  std::string name;          ///< file name in the checkpoint directory, e.g. "rank-00000.bin"
  int rank = 0;              ///< the rank (of the first replica) that wrote it
  std::uint64_t bytes = 0;   ///< file size
  std::uint32_t crc32c = 0;  ///< of the whole file
};

/// A unit's optimizer progress that is not a tensor, restored on load.
struct CheckpointUnit {
  std::string name;                 ///< the unit's Unit::name()
  std::int64_t optimizer_step = 0;  ///< AdamW's step count (bias correction)
  bool sgd_started = false;         ///< SGD's momentum buffer holds a first value
};

/// The contents of manifest.json: how the checkpoint was saved and where every piece lies.
struct Manifest {
  int version = kCheckpointFormatVersion;  ///< format version that wrote it
  int world_size = 1;       ///< ranks of the job that saved it
  std::string strategy;     ///< to_string() of the saving Strategy, e.g. "full_shard"
  int shard_group_size = 1; ///< ranks per shard group when saved: one data file each
  std::string optimizer;    ///< "adamw" or "sgd"
  std::string param_dtype;  ///< the mixed-precision parameter dtype it trained with (data is f32)
  std::vector<CheckpointUnit> units;    ///< one per unit, with its optimizer step count
  std::vector<CheckpointFile> files;    ///< every data file, with its size and checksum
  std::vector<CheckpointPiece> pieces;  ///< together they cover each (parameter, kind) exactly once
  CheckpointMetadata metadata;          ///< the trainer's, as given to save_sharded
};

/// True when `dir` holds a complete checkpoint (its manifest exists), false when the manifest is
/// absent. Error(io) when it cannot be looked at (permissions, a stale NFS handle): a checkpoint
/// that may be intact is not an absent one.
bool is_checkpoint(const std::filesystem::path& dir);
/// Reads and checks the manifest: Errc::corrupt_file when it is not one, fails its own checksum,
/// or its pieces do not tile every (parameter, kind) exactly once inside the files it lists;
/// Errc::bad_config when a newer format version wrote it. Errors name the file.
Manifest read_manifest(const std::filesystem::path& dir);
/// Writes DIR/manifest.json atomically (temporary name, fsync, rename, fsync of DIR).
void write_manifest(const std::filesystem::path& dir, const Manifest& m);
/// The manifest as JSON text, as write_manifest() writes it.
std::string to_json(const Manifest& m);
/// Parses manifest JSON; `where` names its source in errors (Errc::corrupt_file, or
/// Errc::bad_config for a newer format version).
Manifest manifest_from_json(const std::string& text, const std::string& where);

/// Every file present with its size and checksum, every piece's checksum, and every (parameter,
/// kind) covered by its pieces exactly once. Throws Errc::corrupt_file naming the first problem.
void verify_checkpoint(const std::filesystem::path& dir);
/// The bytes of one piece, checked against its checksum.
std::vector<float> read_piece(const std::filesystem::path& dir, const CheckpointPiece& piece);
/// The whole (flattened) tensor `kind` of parameter `param` from its pieces.
std::vector<float> read_full(const std::filesystem::path& dir, const Manifest& m, const std::string& param,
                             const std::string& kind);

/// CRC-32C (Castagnoli) of `data`, in hardware where the CPU has SSE 4.2; pass an earlier result
/// as `crc` to continue it over more bytes.
std::uint32_t crc32c(std::span<const std::byte> data, std::uint32_t crc = 0) noexcept;

/// A whole (unsharded) parameter, for checkpoints made outside an engine.
struct FullTensor {
  std::string name;           ///< parameter name, as the model's ParamSpec names it
  Shape shape;                ///< the parameter's global shape
  std::vector<float> values;  ///< row-major, numel(shape) of them
};
/// Writes a checkpoint of one file holding `params` whole, with zero AdamW state (a fresh
/// optimizer), as one rank would save it; `dir` must not hold a checkpoint. For importing a model.
void write_checkpoint(const std::filesystem::path& dir, const std::vector<FullTensor>& params,
                      CheckpointMetadata metadata);

}  // namespace coshard::fsdp
