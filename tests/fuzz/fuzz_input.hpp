#pragma once
// What the fuzz targets share: the libFuzzer entry point, and a file holding the input for the
// readers that take a path (a memfd: no disk, no clean-up).
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <string>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size);

namespace coshard::fuzz {

// An in-memory file rewritten with each input; path() names it for readers that open paths.
class InputFile {
 public:
  InputFile() : fd_(::memfd_create("coshard-fuzz", MFD_CLOEXEC)) {}
  ~InputFile() { ::close(fd_); }
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;
  // Replaces the content with `size` bytes; false when the write failed.
  bool write(const std::uint8_t* data, std::size_t size) {
    if (::ftruncate(fd_, 0) != 0) return false;
    return size == 0 || ::pwrite(fd_, data, size, 0) == static_cast<ssize_t>(size);
  }
  std::string path() const { return "/proc/self/fd/" + std::to_string(fd_); }

 private:
  int fd_;
};

}  // namespace coshard::fuzz
