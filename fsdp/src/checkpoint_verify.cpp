// verify_checkpoint: what coshard-ckpt verify and the tests run over a whole checkpoint.
#include <algorithm>

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
    detail::require_piece_file(path);
    const auto size = coshard::file_size(path);
    if (size != f.bytes) {
      throw damaged(path, "has " + std::to_string(size) + " bytes where the manifest says " + std::to_string(f.bytes) +
                              " (truncated or replaced)");
    }
    if (file_crc(path, size) != f.crc32c) throw damaged(path, "fails its checksum");
  }
}

}  // namespace

void verify_checkpoint(const std::filesystem::path& dir) {
  const Manifest m = read_manifest(dir);  // checks that the pieces tile every tensor inside the listed files
  check_files(dir, m);
  for (const auto& p : m.pieces) read_piece(dir, p);
}

}  // namespace coshard::fsdp
