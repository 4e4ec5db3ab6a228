#pragma once
// The kernel's page size: what mmap and mprotect round to (shared and cpu-discrete memory).
#include <unistd.h>

#include <cstddef>

namespace coshard::detail {

inline std::size_t page_size() noexcept {
  static const std::size_t p = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  return p;
}

}  // namespace coshard::detail
