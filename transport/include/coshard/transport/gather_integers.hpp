#pragma once
/// \file
/// Agreeing on a few host integers across the ranks of a communicator (a model's signature, a
/// checkpoint's per-rank report, the step each rank would resume from): one all-gather, in one
/// place.
#include <cstdint>
#include <utility>
#include <vector>

#include "coshard/runtime/allocator.hpp"
#include "coshard/runtime/copy.hpp"
#include "coshard/runtime/task.hpp"
#include "coshard/runtime/tensor.hpp"
#include "coshard/transport/communicator.hpp"

namespace coshard::transport {

/// Every rank's `mine`, rank after rank: rank r's values are [r * n, (r + 1) * n), n being
/// mine.size(), which must be the same on every rank (the all-gather checks it). Gathered on `comm`
/// after the work queued on `stream`, in tensors of `alloc` (the runtime's, on its device); the
/// values go up and come back through `stream`, so this works on every device, memory the host
/// cannot touch included.
inline Task<std::vector<std::int64_t>> gather_integers(Communicator& comm, Stream& stream, Allocator& alloc,
                                                       std::vector<std::int64_t> mine) {
  const auto n = static_cast<std::int64_t>(mine.size());
  Tensor own = Tensor::empty(alloc, DType::i64, {n});
  Tensor all = Tensor::empty(alloc, DType::i64, {n * comm.size()});
  upload(stream, own, std::move(mine));
  stream.wait(comm.all_gather(own, all, stream));
  co_return co_await download<std::int64_t>(stream, all);
}

}  // namespace coshard::transport
