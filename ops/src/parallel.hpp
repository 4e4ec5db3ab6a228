#pragma once
// A rank's CPU ops run on blas_threads() threads (one per rank by default, blas.hpp): coshard's own
// kernels and the OpenBLAS GEMMs, split into single-threaded calls, alike. Threads are started per
// call: the calls worth splitting take milliseconds, a thread's start tens of microseconds.
#include <algorithm>
#include <cstddef>
#include <system_error>
#include <thread>
#include <vector>

#include "blas_internal.hpp"
#include "coshard/ops/blas.hpp"

namespace coshard::ops::detail {

/// Threads for a call of `macs` multiply-adds that splits into at most `parts` pieces:
/// blas_threads(), fewer where there are fewer pieces, and one where the call is too small for a
/// thread's start to pay. Sets OpenBLAS to one thread (blas_internal.hpp), as every caller may
/// call it in the threads.
inline std::size_t threads_for(double macs, std::size_t parts) {
  openblas_one_thread();
  constexpr double kSplitMacs = 1 << 22;
  if (macs < kSplitMacs || parts < 2) return 1;
  return std::min(parts, static_cast<std::size_t>(std::max(1, blas_threads())));
}

/// work(0) .. work(parts - 1), each on its own thread, work(0) on the caller's; returns when all
/// are done. work must not throw (allocate before). A thread that cannot be started (a process or
/// cgroup limit) has its part run on the caller's thread instead.
template <class Work>
void run_parts(std::size_t parts, const Work& work) {
  std::vector<std::jthread> helpers;
  for (std::size_t t = 1; t < parts; ++t) {
    try {
      helpers.emplace_back([&work, t] { work(t); });
    } catch (const std::system_error&) {
      work(t);
    }
  }
  work(0);
}  // the helpers join here

}  // namespace coshard::ops::detail
