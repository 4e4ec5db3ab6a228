#pragma once
// Files written so that a reader never sees half of one: a temporary file beside the target,
// fsync, rename, fsync of the directory. And checked reads that name the file and say what is
// wrong (missing, truncated). Errors are coshard::Error: Errc::io for the system's refusals
// (with errno's text), Errc::corrupt_file for a file shorter than expected.
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>

namespace coshard {

/// Writes the concatenation of `parts` to `path` atomically.
void write_atomic(const std::filesystem::path& path, std::span<const std::span<const std::byte>> parts);
/// Writes `text` to `path` atomically.
void write_atomic(const std::filesystem::path& path, std::string_view text);

/// Size of a regular file.
std::uint64_t file_size(const std::filesystem::path& path);

/// The whole of `path`, which must be a regular file: a FIFO would block the reader, and a
/// directory reads as empty. Errc::io naming the file and what it is otherwise.
std::string read_text(const std::filesystem::path& path);
/// The same, with what the file is to the caller in front of an error ("tokenizer: cannot read ...").
std::string read_text(const std::filesystem::path& path, std::string_view role);

/// Reads `out.size()` bytes at `offset`.
void read_at(const std::filesystem::path& path, std::uint64_t offset, std::span<std::byte> out);

/// fsync of a directory, so that a rename inside it is durable (best effort where unsupported).
void sync_directory(const std::filesystem::path& dir);

}  // namespace coshard
