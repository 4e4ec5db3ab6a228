#pragma once
/// \file
/// The one owner of a POSIX file descriptor (a file being written, a memfd, a pipe's end, a lock
/// file, a socket a test binds): closed when its owner goes, moved but never copied.
#include <unistd.h>

#include <array>
#include <cerrno>
#include <utility>

namespace coshard {

/// An owned file descriptor (-1: none); see the file's comment.
class UniqueFd {
 public:
  UniqueFd() = default;  ///< holds none
  /// Takes `fd`; a negative one (a failed open) is held as none.
  explicit UniqueFd(int fd) noexcept : fd_(fd < 0 ? -1 : fd) {}
  /// Takes what `o` held; `o` holds none.
  UniqueFd(UniqueFd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  /// Closes what this held and takes what `o` held.
  UniqueFd& operator=(UniqueFd&& o) noexcept {
    if (this != &o) {
      reset();
      fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() { reset(); }

  int get() const noexcept { return fd_; }                      ///< the descriptor, -1 for none
  explicit operator bool() const noexcept { return fd_ >= 0; }  ///< whether it holds one
  /// Gives the descriptor up without closing it.
  int release() noexcept { return std::exchange(fd_, -1); }
  /// Closes it now; errno is kept, so that a caller reporting an earlier failure still reads its
  /// cause.
  void reset() noexcept {
    if (fd_ >= 0) {
      const int saved = errno;
      ::close(std::exchange(fd_, -1));
      errno = saved;
    }
  }
  /// Closes it now and says whether close succeeded: for a file whose last write close may still
  /// fail (NFS, a full disk), where the caller must know.
  bool close() noexcept { return fd_ < 0 || ::close(std::exchange(fd_, -1)) == 0; }

 private:
  int fd_ = -1;
};

/// A pipe's two ends, [0] to read and [1] to write, with `flags` of pipe2 (O_CLOEXEC, O_NONBLOCK);
/// both none when pipe2 fails (errno says why).
inline std::array<UniqueFd, 2> make_pipe(int flags) noexcept {
  int ends[2] = {-1, -1};
  if (::pipe2(ends, flags) != 0) return {};
  return {UniqueFd(ends[0]), UniqueFd(ends[1])};
}

}  // namespace coshard
