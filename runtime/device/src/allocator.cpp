#include "coshard/runtime/allocator.hpp"

#include <cstdlib>
#include <new>
#include <string>

#include "coshard/runtime/error.hpp"

namespace coshard {
namespace {

constexpr std::size_t kSmall = 1 << 20;      // below: 512-byte classes
constexpr std::size_t kSmallStep = 512;
constexpr std::size_t kLargeStep = 2 << 20;  // above: 2 MiB classes

class CpuMemory final : public MemoryResource {
 public:
  explicit CpuMemory(Device d) : device_(d) {}
  Device device() const noexcept override { return device_; }
  void* allocate(std::size_t bytes) override {
    void* p = std::aligned_alloc(64, bytes);  // sizes are multiples of 512
    if (!p) {
      throw Error(Errc::out_of_memory, "host allocation of " + std::to_string(bytes) + " bytes failed on " +
                                           device_.to_string());
    }
    return p;
  }
  void deallocate(void* p, std::size_t) noexcept override { std::free(p); }

 private:
  Device device_;
};

bool uses_done(const detail::Block& b) {
  for (const auto& u : b.uses) {
    if (!u->ready()) return false;
  }
  return true;
}

std::string mib(std::size_t bytes) {
  return std::to_string(bytes) + " bytes (" + std::to_string(bytes / (1024.0 * 1024.0)).substr(0, 8) + " MiB)";
}

}  // namespace

std::unique_ptr<MemoryResource> cpu_memory(Device device) { return std::make_unique<CpuMemory>(device); }

Buffer& Buffer::operator=(Buffer&& o) noexcept {
  if (this != &o) {
    reset();
    owner_ = std::exchange(o.owner_, nullptr);
    block_ = std::exchange(o.block_, nullptr);
    bytes_ = o.bytes_;
  }
  return *this;
}

void Buffer::record_use(const Event& event) {
  if (!block_) throw Error(Errc::invalid_argument, "record_use on an empty Buffer");
  if (!event.recorded()) throw Error(Errc::invalid_argument, "record_use with an event that was never recorded");
  std::lock_guard lock(owner_->m_);
  // A buffer that lives for the run (activations, pooled parameters) is used every step: the uses
  // that completed are dropped here, or their events would pile up for as long as it lives.
  std::erase_if(block_->uses, [](const auto& use) { return use->ready(); });
  block_->uses.push_back(event.point());
}

std::size_t Buffer::recorded_uses() const {
  if (!block_) return 0;
  std::lock_guard lock(owner_->m_);
  return block_->uses.size();
}

void Buffer::reset() noexcept {
  if (block_) owner_->free(std::exchange(block_, nullptr));
  owner_ = nullptr;
}

Allocator::Allocator(std::unique_ptr<MemoryResource> memory) : Allocator(std::move(memory), Options{}) {}
Allocator::Allocator(std::unique_ptr<MemoryResource> memory, Options options)
    : memory_(std::move(memory)), options_(options) {}

Allocator::~Allocator() {
  for (auto& [size, b] : cached_) memory_->deallocate(b->ptr, b->size);
  // Live blocks here mean a Buffer outlives its allocator: a bug in the owner. Free them anyway so
  // the process does not leak; their Buffers must not be used again.
  for (auto& [p, b] : live_) memory_->deallocate(b->ptr, b->size);
}

std::size_t Allocator::size_class(std::size_t bytes) noexcept {
  if (bytes == 0) bytes = 1;
  std::size_t step = bytes <= kSmall ? kSmallStep : kLargeStep;
  return (bytes + step - 1) / step * step;
}

detail::Block* Allocator::take_cached(std::size_t size) {
  // Small classes must match exactly; a large request may take a block up to 25% bigger.
  std::size_t limit = size <= kSmall ? size : size + size / 4;
  for (auto it = cached_.lower_bound(size); it != cached_.end() && it->first <= limit; ++it) {
    if (!uses_done(*it->second)) continue;
    auto block = std::move(it->second);
    cached_.erase(it);
    block->uses.clear();
    auto* raw = block.get();
    live_.emplace(raw, std::move(block));
    return raw;
  }
  return nullptr;
}

Buffer Allocator::allocate(std::size_t bytes) {
  const std::size_t size = size_class(bytes);
  std::lock_guard lock(m_);
  detail::Block* block = take_cached(size);
  if (block) {
    ++stats_.cache_hits;
  } else {
    if (options_.cap_bytes && stats_.reserved_bytes + size > options_.cap_bytes) release_cached_locked();
    if (options_.cap_bytes && stats_.reserved_bytes + size > options_.cap_bytes) {
      throw Error(Errc::out_of_memory,
                  "out of memory on " + device().to_string() + ": requested " + mib(bytes) + " exceeds the cap of " +
                      mib(options_.cap_bytes) + ": allocated " + mib(stats_.allocated_bytes) + ", reserved " +
                      mib(stats_.reserved_bytes) +
                      ". Raise the cap, lower the in-flight limit or batch size, or shard over more ranks");
    }
    auto owned = std::make_unique<detail::Block>();
    owned->ptr = memory_->allocate(size);
    owned->size = size;
    block = owned.get();
    live_.emplace(block, std::move(owned));
    ++stats_.device_allocations;
    stats_.reserved_bytes += size;
    stats_.peak_reserved_bytes = std::max(stats_.peak_reserved_bytes, stats_.reserved_bytes);
  }
  stats_.allocated_bytes += block->size;
  stats_.peak_allocated_bytes = std::max(stats_.peak_allocated_bytes, stats_.allocated_bytes);
  return Buffer(this, block, bytes);
}

void Allocator::free(detail::Block* block) noexcept {
  std::lock_guard lock(m_);
  auto it = live_.find(block);
  if (it == live_.end()) return;
  stats_.allocated_bytes -= block->size;
  auto owned = std::move(it->second);
  live_.erase(it);
  std::size_t size = owned->size;
  cached_.emplace(size, std::move(owned));
}

void Allocator::release_cached_locked() {
  for (auto it = cached_.begin(); it != cached_.end();) {
    if (!uses_done(*it->second)) {
      ++it;
      continue;
    }
    memory_->deallocate(it->second->ptr, it->second->size);
    stats_.reserved_bytes -= it->second->size;
    it = cached_.erase(it);
  }
}

void Allocator::release_cached() {
  std::lock_guard lock(m_);
  release_cached_locked();
}

AllocatorStats Allocator::stats() const {
  std::lock_guard lock(m_);
  return stats_;
}

void Allocator::reset_peak() {
  std::lock_guard lock(m_);
  stats_.peak_allocated_bytes = stats_.allocated_bytes;
  stats_.peak_reserved_bytes = stats_.reserved_bytes;
}

}  // namespace coshard
