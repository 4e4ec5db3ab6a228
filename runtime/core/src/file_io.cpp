#include "coshard/runtime/file_io.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "coshard/runtime/error.hpp"
#include "coshard/runtime/unique_fd.hpp"

namespace coshard {
namespace {

Error io_error(const std::string& what, const std::filesystem::path& path, int err) {
  return Error(Errc::io, what + " '" + path.string() + "': " + std::strerror(err));
}

}  // namespace

void write_atomic(const std::filesystem::path& path, std::span<const std::span<const std::byte>> parts) {
  const std::filesystem::path tmp = path.string() + ".tmp." + std::to_string(::getpid());
  UniqueFd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (!fd) throw io_error("cannot create", tmp, errno);
  auto fail = [&](const std::string& what) {
    const int err = errno;
    fd.reset();
    ::unlink(tmp.c_str());
    return io_error(what, tmp, err);
  };
  for (auto part : parts) {
    while (!part.empty()) {
      const ssize_t n = ::write(fd.get(), part.data(), part.size());
      if (n < 0) {
        if (errno == EINTR) continue;
        throw fail("cannot write");
      }
      part = part.subspan(static_cast<std::size_t>(n));
    }
  }
  if (::fsync(fd.get()) != 0) throw fail("cannot fsync");
  if (!fd.close()) {
    const int err = errno;
    ::unlink(tmp.c_str());
    throw io_error("cannot close", tmp, err);
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    throw io_error("cannot rename the temporary file to", path, err);
  }
  sync_directory(path.has_parent_path() ? path.parent_path() : std::filesystem::path("."));
}

void write_atomic(const std::filesystem::path& path, std::string_view text) {
  const std::span<const std::byte> bytes = std::as_bytes(std::span<const char>(text.data(), text.size()));
  write_atomic(path, std::span<const std::span<const std::byte>>(&bytes, 1));
}

void sync_directory(const std::filesystem::path& dir) {
  UniqueFd dfd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (dfd) ::fsync(dfd.get());  // best effort: the rename is durable once the directory is
}

namespace {

// What a reader of whole files needs `st` (of `path`) to be: neither a directory, which reads as
// empty, nor a FIFO, socket or device (/dev/null), which would block or say "Operation not supported".
void require_regular(const std::filesystem::path& path, const struct stat& st) {
  if (S_ISDIR(st.st_mode)) throw Error(Errc::io, "cannot read '" + path.string() + "': it is a directory");
  if (!S_ISREG(st.st_mode)) {
    throw Error(Errc::io, "cannot read '" + path.string() + "': it is not a regular file (a FIFO, socket or device)");
  }
}

}  // namespace

std::uint64_t file_size(const std::filesystem::path& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) throw io_error("cannot read", path, errno);
  require_regular(path, st);
  return static_cast<std::uint64_t>(st.st_size);
}

std::string read_text(const std::filesystem::path& path) {
  // Opened without blocking and judged by the descriptor: a FIFO would block the open itself, and
  // a path checked before opening could be swapped in between.
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC));
  if (!fd) throw io_error("cannot read", path, errno);
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) throw io_error("cannot read", path, errno);
  require_regular(path, st);
  std::string text(static_cast<std::size_t>(st.st_size), '\0');
  for (std::size_t done = 0; done < text.size();) {
    const ssize_t n = ::pread(fd.get(), text.data() + done, text.size() - done, static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw io_error("cannot read", path, errno);
    if (n == 0) throw Error(Errc::corrupt_file, "'" + path.string() + "' shrank while being read");
    done += static_cast<std::size_t>(n);
  }
  return text;
}

std::string read_text(const std::filesystem::path& path, std::string_view role) {
  try {
    return read_text(path);
  } catch (const Error& e) {
    throw Error(e.code(), std::string(role) + ": " + e.message());
  }
}

void read_at(const std::filesystem::path& path, std::uint64_t offset, std::span<std::byte> out) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) throw io_error("cannot open", path, errno);
  std::size_t done = 0;
  while (done < out.size()) {
    const ssize_t n = ::pread(fd.get(), out.data() + done, out.size() - done, static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      throw io_error("cannot read", path, errno);
    }
    if (n == 0) {
      throw Error(Errc::corrupt_file, "'" + path.string() + "' ends at byte " + std::to_string(offset + done) +
                                          " but " + std::to_string(out.size()) + " bytes were expected from byte " +
                                          std::to_string(offset) + " (truncated file?)");
    }
    done += static_cast<std::size_t>(n);
  }
}

}  // namespace coshard
