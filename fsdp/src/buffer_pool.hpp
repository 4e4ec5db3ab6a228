#pragma once
// Owned unsharded buffers, reused in event order: a slot handed back with the event of its last
// use may be taken again at once, and whoever takes it makes its stream wait for that event. So
// the host never blocks to enforce the in-flight limit, and no buffer is reused while a stream
// still reads it. The pool grows only when every slot is held (strategies that keep units
// unsharded); its size is the peak number of unsharded units.
//
// Slots are sized for their units, not all for the largest: GPT-2 124M's embedding and head is
// 5.5 blocks, and such a pool held 13 x 157 MB under SHARD_GRAD_OP where the units need 500 MB. A
// request takes the smallest free slot that fits; when none fits, a free slot that is too small
// is replaced (its memory goes back to the allocator with the event of its last use).
#include <cstdint>
#include <optional>
#include <vector>

#include "coshard/runtime/runtime.hpp"
#include "coshard/runtime/tensor.hpp"

namespace coshard::fsdp::detail {

class BufferPool {
 public:
  explicit BufferPool(DType dtype) : dtype_(dtype) {}

  struct Lease {
    int slot = -1;
    Tensor buffer;
    std::optional<Event> previous_use;  // the taker's stream must wait for it
  };
  /// A buffer of at least `numel` elements (callers view its first `numel`).
  Lease acquire(Allocator& alloc, std::int64_t numel);
  void release(int slot, const Event& last_use);

  std::size_t slots() const noexcept { return slots_.size(); }
  const Tensor& buffer(int slot) const { return slots_.at(static_cast<std::size_t>(slot)).buffer; }
  std::size_t held() const noexcept;
  /// Elements over all slots.
  std::int64_t numel() const noexcept;
  /// Bytes over all slots, held or free (what the pool keeps allocated).
  std::size_t bytes() const noexcept { return static_cast<std::size_t>(numel()) * size_of(dtype_); }

 private:
  struct Slot {
    Tensor buffer;
    std::optional<Event> last_use;
    bool held = false;
    std::uint64_t released_at = 0;
  };
  DType dtype_;
  std::uint64_t clock_ = 0;
  std::vector<Slot> slots_;
};

}  // namespace coshard::fsdp::detail
