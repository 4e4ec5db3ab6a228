#pragma once
// Host memory that other processes on this host can map: the memory behind a single-copy
// ("direct") collective between ranks of one host.
//
// shared_cpu_memory() backs every allocation of at least `min_bytes` by its own memfd (mapped
// MAP_SHARED) and records it in a process-wide registry; smaller ones come from the ordinary
// 64-byte aligned heap. shared_segment_of() tells, for any pointer, which segment holds it, and
// PeerMapping maps a segment of another process (through /proc/PID/fd/FD, which needs the
// same user and pid namespace: ptrace-read access to that process).
//
// A forked child shares these pages with its parent (MAP_SHARED) instead of getting a copy.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "coshard/runtime/allocator.hpp"

namespace coshard {

/// Where a pointer lives: segment `id` of process `pid`, open there as descriptor `fd`.
struct SegmentRef {
  std::int32_t pid = 0;      ///< owning process
  std::int32_t fd = -1;      ///< the memfd's descriptor number in that process
  std::uint64_t id = 0;      ///< per-process counter: a new segment never reuses an id
  std::uint64_t size = 0;    ///< bytes mapped (a multiple of the page size)
  std::uint64_t inode = 0;   ///< of the memfd: a mapper checks it opened the right file
  std::uint64_t offset = 0;  ///< of the pointer inside the segment
};

/// Default size from which shared_cpu_memory() gives an allocation its own segment (1 MiB).
inline constexpr std::size_t kSharedMinBytes = std::size_t{1} << 20;

/// Host memory on `device`; allocations of at least `min_bytes` are shareable segments. When a
/// memfd cannot be created (descriptor limit, no memfd support) the allocation silently comes from
/// the heap instead: it is then simply not shared. Raises RLIMIT_NOFILE's soft limit to the hard
/// one, once per process.
std::unique_ptr<MemoryResource> shared_cpu_memory(Device device = Device::cpu(),
                                                  std::size_t min_bytes = kSharedMinBytes);

/// True when [p, p + bytes) lies inside one shared segment of this process; fills `out`.
bool shared_segment_of(const void* p, std::size_t bytes, SegmentRef* out) noexcept;
/// The segment holding the byte at `p`.
inline bool shared_segment_of(const void* p, SegmentRef* out) noexcept { return shared_segment_of(p, 1, out); }

/// Segments of this process now alive (for tests and diagnostics).
std::size_t shared_segment_count() noexcept;

/// A read-only mapping of another process's segment. Move-only; unmaps on destruction.
class PeerMapping {
 public:
  PeerMapping() = default;  ///< maps nothing
  PeerMapping(PeerMapping&& o) noexcept;             ///< takes over the mapping; `o` maps nothing after
  PeerMapping& operator=(PeerMapping&& o) noexcept;  ///< unmaps this one, then takes over `o`'s
  PeerMapping(const PeerMapping&) = delete;
  PeerMapping& operator=(const PeerMapping&) = delete;
  ~PeerMapping();  ///< unmaps

  /// Opens /proc/PID/fd/FD, checks it is the memfd named by `ref` (inode, size) and maps all
  /// of it. Throws Error(io) naming the segment and the reason.
  static PeerMapping map(const SegmentRef& ref);

  /// Start of the whole segment (add SegmentRef::offset for the pointer); nullptr when empty.
  const std::byte* data() const noexcept { return static_cast<const std::byte*>(base_); }
  std::size_t size() const noexcept { return size_; }                   ///< bytes mapped: the segment's size
  explicit operator bool() const noexcept { return base_ != nullptr; }  ///< true while something is mapped

 private:
  void* base_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace coshard
