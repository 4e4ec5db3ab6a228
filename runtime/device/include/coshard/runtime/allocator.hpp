#pragma once
// A caching allocator per device. Freed blocks go back to size-class pools and are reused only
// once every event recorded against them has completed (stream-ordered reuse without
// recordStream). Optional byte cap: beyond it, cached blocks are released, then a clear
// out-of-memory error is raised with the numbers.
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "coshard/runtime/device.hpp"
#include "coshard/runtime/stream.hpp"

namespace coshard {

/// Where raw device memory comes from: aligned host memory, cudaMalloc, ...
class MemoryResource {
 public:
  virtual ~MemoryResource() = default;
  virtual Device device() const noexcept = 0;  ///< the device the memory is on
  virtual void* allocate(std::size_t bytes) = 0;  ///< throws Error(out_of_memory) on failure
  /// Gives back `p`, which allocate(`bytes`) returned, with the same `bytes`.
  virtual void deallocate(void* p, std::size_t bytes) noexcept = 0;
  /// Whether the host may read and write this memory directly: host memory (also pinned), not CUDA
  /// memory nor the cpu-discrete device's, which only stream work reaches.
  virtual bool host_accessible() const noexcept { return device().kind == DeviceKind::cpu; }
};

/// 64-byte aligned host memory.
std::unique_ptr<MemoryResource> cpu_memory(Device device = Device::cpu());

/// Byte and call counters of one Allocator, as a snapshot from Allocator::stats().
struct AllocatorStats {
  std::size_t allocated_bytes = 0;       ///< handed out and not yet freed
  std::size_t reserved_bytes = 0;        ///< held from the memory resource (allocated + cached)
  std::size_t peak_allocated_bytes = 0;  ///< highest allocated_bytes since creation or reset_peak()
  std::size_t peak_reserved_bytes = 0;   ///< highest reserved_bytes since creation or reset_peak()
  std::size_t device_allocations = 0;    ///< calls into the memory resource
  std::size_t cache_hits = 0;            ///< allocations served from a cached block
};

class Allocator;

namespace detail {
struct Block {
  void* ptr = nullptr;
  std::size_t size = 0;  ///< rounded size class
  std::vector<std::shared_ptr<Completion>> uses;  ///< must all be ready before reuse
};
}  // namespace detail

/// A move-only owning handle to an allocated block. The Allocator must outlive it.
class Buffer {
 public:
  Buffer() = default;  ///< empty: owns nothing
  /// Moves the handle; the source is left empty.
  Buffer(Buffer&& o) noexcept : owner_(std::exchange(o.owner_, nullptr)), block_(std::exchange(o.block_, nullptr)),
                                 bytes_(o.bytes_) {}
  /// Frees this handle's block (see reset()), then takes over the one of `o`.
  Buffer& operator=(Buffer&& o) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() { reset(); }

  void* data() const noexcept { return block_ ? block_->ptr : nullptr; }  ///< nullptr when empty
  std::size_t size() const noexcept { return bytes_; }  ///< bytes as requested; the block may be bigger
  explicit operator bool() const noexcept { return block_ != nullptr; }  ///< true while it owns a block

  /// The block may be in use by `stream`'s work until `event`: reuse waits for it after free.
  /// Drops the uses recorded before that have completed, so a long-lived buffer keeps few.
  void record_use(const Event& event);
  /// Uses recorded and kept: at most the ones not yet complete when the last was recorded, plus it.
  std::size_t recorded_uses() const;
  void reset() noexcept;  ///< returns the block to its pool

 private:
  friend class Allocator;
  Buffer(Allocator* owner, detail::Block* block, std::size_t bytes) : owner_(owner), block_(block), bytes_(bytes) {}
  Allocator* owner_ = nullptr;
  detail::Block* block_ = nullptr;
  std::size_t bytes_ = 0;
};

/// The caching, stream-ordered allocator of one device; thread-safe. See Buffer for the handles it returns.
class Allocator {
 public:
  /// Limits of an Allocator.
  struct Options {
    std::size_t cap_bytes = 0;  ///< 0: no cap
  };
  /// An allocator without a cap over `memory`.
  explicit Allocator(std::unique_ptr<MemoryResource> memory);
  /// An allocator over `memory` with `options`.
  Allocator(std::unique_ptr<MemoryResource> memory, Options options);
  Allocator(const Allocator&) = delete;
  Allocator& operator=(const Allocator&) = delete;
  ~Allocator();  ///< every Buffer must be gone by now

  /// A block of at least `bytes` (rounded up to size_class()), from the cache when a free block of a
  /// fitting class has no pending uses. Throws Error(out_of_memory) past the cap, after releasing cached
  /// blocks, with the numbers and what to change.
  Buffer allocate(std::size_t bytes);
  AllocatorStats stats() const;  ///< a consistent snapshot of the counters
  /// Sets the peaks to the current values, e.g. to measure one step.
  void reset_peak();
  /// Returns cached blocks whose uses have completed to the memory resource.
  void release_cached();
  Device device() const noexcept { return memory_->device(); }  ///< the memory resource's device
  /// MemoryResource::host_accessible of the memory it allocates from.
  bool host_accessible() const noexcept { return memory_->host_accessible(); }

  /// The rounded size allocate() reserves for `bytes`: multiples of 512 bytes up to 1 MiB, of 2 MiB above.
  static std::size_t size_class(std::size_t bytes) noexcept;

 private:
  friend class Buffer;
  void free(detail::Block* block) noexcept;
  detail::Block* take_cached(std::size_t size);
  void release_cached_locked();

  std::unique_ptr<MemoryResource> memory_;
  Options options_;
  mutable std::mutex m_;  ///< buffers may be freed from stream threads
  std::multimap<std::size_t, std::unique_ptr<detail::Block>> cached_;
  std::map<detail::Block*, std::unique_ptr<detail::Block>> live_;
  AllocatorStats stats_;
};

}  // namespace coshard
