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
  virtual Device device() const noexcept = 0;
  virtual void* allocate(std::size_t bytes) = 0;  ///< throws Error(out_of_memory) on failure
  virtual void deallocate(void* p, std::size_t bytes) noexcept = 0;
};

/// 64-byte aligned host memory.
std::unique_ptr<MemoryResource> cpu_memory(Device device = Device::cpu());

struct AllocatorStats {
  std::size_t allocated_bytes = 0;       ///< handed out and not yet freed
  std::size_t reserved_bytes = 0;        ///< held from the memory resource (allocated + cached)
  std::size_t peak_allocated_bytes = 0;
  std::size_t peak_reserved_bytes = 0;
  std::size_t device_allocations = 0;    ///< calls into the memory resource
  std::size_t cache_hits = 0;
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
  Buffer() = default;
  Buffer(Buffer&& o) noexcept : owner_(std::exchange(o.owner_, nullptr)), block_(std::exchange(o.block_, nullptr)),
                                 bytes_(o.bytes_) {}
  Buffer& operator=(Buffer&& o) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() { reset(); }

  void* data() const noexcept { return block_ ? block_->ptr : nullptr; }
  std::size_t size() const noexcept { return bytes_; }  // as requested
  explicit operator bool() const noexcept { return block_ != nullptr; }

  /// The block may be in use by `stream`'s work until `event`: reuse waits for it after free.
  void record_use(const Event& event);
  void reset() noexcept;  ///< returns the block to its pool

 private:
  friend class Allocator;
  Buffer(Allocator* owner, detail::Block* block, std::size_t bytes) : owner_(owner), block_(block), bytes_(bytes) {}
  Allocator* owner_ = nullptr;
  detail::Block* block_ = nullptr;
  std::size_t bytes_ = 0;
};

class Allocator {
 public:
  struct Options {
    std::size_t cap_bytes = 0;  ///< 0: no cap
  };
  explicit Allocator(std::unique_ptr<MemoryResource> memory);
  Allocator(std::unique_ptr<MemoryResource> memory, Options options);
  Allocator(const Allocator&) = delete;
  Allocator& operator=(const Allocator&) = delete;
  ~Allocator();  ///< every Buffer must be gone by now

  Buffer allocate(std::size_t bytes);
  AllocatorStats stats() const;
  void reset_peak();
  /// Returns cached blocks whose uses have completed to the memory resource.
  void release_cached();
  Device device() const noexcept { return memory_->device(); }

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
