#include "buffer_pool.hpp"

namespace coshard::fsdp::detail {

BufferPool::Lease BufferPool::acquire(Allocator& alloc, std::int64_t numel) {
  int best = -1;
  const auto better = [&](const Slot& s, const Slot& b) {
    // The smallest fit; among equals the slot released longest ago, whose last user is the most
    // likely to be done.
    return s.buffer.numel() < b.buffer.numel() || (s.buffer.numel() == b.buffer.numel() && s.released_at < b.released_at);
  };
  int too_small = -1;  // the largest free slot that does not fit
  for (std::size_t i = 0; i < slots_.size(); ++i) {
    const Slot& s = slots_[i];
    if (s.held) continue;
    if (s.buffer.numel() < numel) {
      if (too_small < 0 || s.buffer.numel() > slots_[static_cast<std::size_t>(too_small)].buffer.numel()) {
        too_small = static_cast<int>(i);
      }
    } else if (best < 0 || better(s, slots_[static_cast<std::size_t>(best)])) {
      best = static_cast<int>(i);
    }
  }
  if (best < 0 && too_small >= 0) {
    Slot& s = slots_[static_cast<std::size_t>(too_small)];
    if (s.last_use) s.buffer.record_use(*s.last_use);  // the allocator reuses it only after that
    s = {Tensor::empty(alloc, dtype_, {numel}), std::nullopt, false, s.released_at};
    best = too_small;
  } else if (best < 0) {
    slots_.push_back({Tensor::empty(alloc, dtype_, {numel}), std::nullopt, false, 0});
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

std::int64_t BufferPool::numel() const noexcept {
  std::int64_t n = 0;
  for (const auto& s : slots_) n += s.buffer.numel();
  return n;
}

std::size_t BufferPool::held() const noexcept {
  std::size_t n = 0;
  for (const auto& s : slots_) n += s.held ? 1 : 0;
  return n;
}

}  // namespace coshard::fsdp::detail
