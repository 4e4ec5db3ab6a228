// verify_checkpoint: what coshard-ckpt verify and the tests run over a whole checkpoint.
#include <algorithm>
#include <map>

#include "checkpoint_damage.hpp"
#include "coshard/fsdp/checkpoint.hpp"
#include "coshard/runtime/error.hpp"
#include "coshard/runtime/file_io.hpp"

namespace coshard::fsdp {
namespace {

Error damaged(const std::filesystem::path& file, const std::string& what) {
  return detail::checkpoint_damaged(file, " " + what);
}

std::uint32_t file_crc(const std::filesystem::path& path, std::uint64_t bytes) {
  std::vector<std::byte> block(std::size_t{8} << 20);
  std::uint32_t crc = 0;
  for (std::uint64_t at = 0; at < bytes;) {
    const auto n = static_cast<std::size_t>(std::min<std::uint64_t>(block.size(), bytes - at));
    read_at(path, at, std::span<std::byte>(block.data(), n));
    crc = crc32c(std::span<const std::byte>(block.data(), n), crc);
    at += n;
  }
  return crc;
}

void check_files(const std::filesystem::path& dir, const Manifest& m) {
  for (const auto& f : m.files) {
    const auto path = dir / f.name;
    std::error_code ec;
    if (!std::filesystem::is_regular_file(path, ec)) throw damaged(path, "is missing");
    const auto size = coshard::file_size(path);
    if (size != f.bytes) {
      throw damaged(path, "has " + std::to_string(size) + " bytes where the manifest says " + std::to_string(f.bytes) +
                              " (truncated or replaced)");
    }
    if (file_crc(path, size) != f.crc32c) throw damaged(path, "fails its checksum");
  }
}

// Every (parameter, kind) tiled by its pieces: no gap, no overlap, nothing past the end.
void check_coverage(const std::filesystem::path& dir, const Manifest& m) {
  std::map<std::pair<std::string, std::string>, std::vector<const CheckpointPiece*>> groups;
  for (const auto& p : m.pieces) groups[{p.param, p.kind}].push_back(&p);
  const auto manifest = dir / kManifestName;
  for (auto& [key, pieces] : groups) {
    std::sort(pieces.begin(), pieces.end(), [](auto* a, auto* b) { return a->offset < b->offset; });
    std::int64_t next = 0;
    for (const auto* p : pieces) {
      if (p->offset != next) {
        throw damaged(manifest, std::string(p->offset > next ? "leaves elements " : "stores elements twice from ") +
                                    std::to_string(std::min(next, p->offset)) + " of '" + key.first + "' (" +
                                    key.second + ")" + (p->offset > next ? " unstored" : ""));
      }
      next += p->length;
    }
    if (next != numel(pieces.front()->shape)) {
      throw damaged(manifest, "stores " + std::to_string(next) + " of the " + std::to_string(numel(pieces.front()->shape)) +
                                  " elements of '" + key.first + "' (" + key.second + ")");
    }
  }
}

}  // namespace

void verify_checkpoint(const std::filesystem::path& dir) {
  const Manifest m = read_manifest(dir);
  check_files(dir, m);
  check_coverage(dir, m);
  for (const auto& p : m.pieces) {
    const bool listed = std::any_of(m.files.begin(), m.files.end(), [&](const auto& f) {
      return f.name == p.file && p.byte_offset + static_cast<std::uint64_t>(p.length) * sizeof(float) <= f.bytes;
    });
    if (!listed) throw damaged(dir / kManifestName, "places a piece of '" + p.param + "' outside the files it lists");
    read_piece(dir, p);
  }
}

}  // namespace coshard::fsdp
