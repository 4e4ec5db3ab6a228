#pragma once
// A rank's CPU ops run on blas_threads() threads (one per rank by default, blas.hpp): coshard's own
// kernels and the OpenBLAS GEMMs, split into single-threaded calls, alike, on the calling thread's
// team of helpers (thread_team.hpp).
#include <algorithm>
#include <cstddef>

#include "blas_internal.hpp"
#include "coshard/ops/blas.hpp"
#include "thread_team.hpp"

namespace coshard::ops::detail {

/// Below this many multiply-adds (about 5 us of one core's GEMM) a call runs on one thread: waking
/// a spinning helper costs well under a microsecond, a sleeping one about 10 us, and the caller
/// takes the parts no helper has (thread_team.hpp).
constexpr double kSplitMacs = 1 << 18;

/// Threads for a call of `macs` multiply-adds that splits into at most `parts` pieces:
/// blas_threads(), fewer where there are fewer pieces, and one below kSplitMacs. Sets OpenBLAS to
/// one thread (blas_internal.hpp), as every caller may call it in the threads.
inline std::size_t threads_for(double macs, std::size_t parts) {
  openblas_one_thread();
  if (macs < kSplitMacs || parts < 2) return 1;
  return std::min(parts, static_cast<std::size_t>(std::max(1, blas_threads())));
}

/// work(0) .. work(parts - 1) on the calling thread and its team's helpers (thread_team.hpp),
/// whichever takes each first; returns when all are done. work must not throw (allocate before).
template <class Work>
void run_parts(std::size_t parts, const Work& work) {
  if (parts == 1) return work(0);
  ThreadTeam::split(parts, work);
}

/// An element of an element-wise loop counted in GEMM multiply-adds for threads_for: a loop splits
/// from about 64 K elements (tens of microseconds of GELU or layernorm), so that layernorm and
/// cross-entropy at GPT-2's sizes split too.
constexpr double kElementMacs = 4;

/// [0, n) in contiguous runs, each a multiple of `grain` long but the last, one per thread of
/// threads_for(n * macs_each): work(begin, end) for each. Each element is computed by the same code
/// whatever the split, so loops without reductions give the same bits on any thread count.
template <class Work>
void split_range(std::size_t n, std::size_t grain, double macs_each, const Work& work) {
  const std::size_t units = (n + grain - 1) / grain;
  const std::size_t parts = threads_for(static_cast<double>(n) * macs_each, units);
  run_parts(parts, [&](std::size_t t) {
    const std::size_t begin = units * t / parts * grain, end = std::min(n, units * (t + 1) / parts * grain);
    if (begin < end) work(begin, end);
  });
}

}  // namespace coshard::ops::detail
