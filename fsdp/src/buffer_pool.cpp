#include "buffer_pool.hpp"

namespace coshard::fsdp::detail {

BufferPool::Lease BufferPool::acquire(Allocator& alloc) {
  int best = -1;
  for (std::size_t i = 0; i < slots_.size(); ++i) {
    // The slot released longest ago: its last user is the most likely to be done.
    if (!slots_[i].held && (best < 0 || slots_[i].released_at < slots_[static_cast<std::size_t>(best)].released_at)) {
      best = static_cast<int>(i);
    }
  }
  if (best < 0) {
    slots_.push_back({Tensor::empty(alloc, dtype_, {numel_}), std::nullopt, false, 0});
    best = static_cast<int>(slots_.size() - 1);
  }
  auto& s = slots_[static_cast<std::size_t>(best)];
  s.held = true;
  return {best, s.buffer, s.last_use};
}

void BufferPool::release(int slot, const Event& last_use) {
  auto& s = slots_.at(static_cast<std::size_t>(slot));
  s.held = false;
  s.last_use = last_use;
  s.released_at = ++clock_;
}

std::size_t BufferPool::held() const noexcept {
  std::size_t n = 0;
  for (const auto& s : slots_) n += s.held ? 1 : 0;
  return n;
}

}  // namespace coshard::fsdp::detail
