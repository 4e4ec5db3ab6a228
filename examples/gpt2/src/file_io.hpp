#pragma once
// Atomic whole-file writes (temporary file beside the target, fsync, rename, fsync of the
// directory) and small helpers shared by the file formats.
#include <cstddef>
#include <filesystem>
#include <span>
#include <string>

namespace coshard::gpt2::detail {

// Writes the concatenation of `parts` to `path` atomically; Errc::io naming the path and errno.
void write_atomic(const std::filesystem::path& path, std::span<const std::span<const std::byte>> parts);

// Size of a regular file, or Errc::io naming it.
std::uint64_t file_size(const std::filesystem::path& path);

// Reads `n` bytes at `offset`; Errc::corrupt_file when the file ends first.
void read_at(const std::filesystem::path& path, std::uint64_t offset, std::span<std::byte> out);

}  // namespace coshard::gpt2::detail
