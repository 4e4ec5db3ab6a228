#include "coshard/ops/blas.hpp"

#include <cblas.h>

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <mutex>
#include <string>

#include "blas_internal.hpp"
#include "check.hpp"

namespace coshard::ops {

namespace {
std::atomic<bool> g_threads_chosen{false};
std::once_flag g_default_once;
}  // namespace

void set_blas_threads(int n) {
  if (n < 1) detail::fail("set_blas_threads", "thread count must be >= 1, got " + std::to_string(n));
  g_threads_chosen.store(true);
  openblas_set_num_threads(n);
}

int blas_threads() { return openblas_get_num_threads(); }

int threads_per_rank(int local_ranks) {
  if (local_ranks < 1) detail::fail("threads_per_rank", "local_ranks must be >= 1, got " + std::to_string(local_ranks));
  cpu_set_t set;
  CPU_ZERO(&set);
  const int cpus = sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : 1;
  return std::max(1, cpus / local_ranks);
}

namespace detail {
void apply_default_blas_threads() {
  std::call_once(g_default_once, [] {
    if (g_threads_chosen.load() || std::getenv("OPENBLAS_NUM_THREADS") != nullptr) return;
    openblas_set_num_threads(1);
  });
}
}  // namespace detail

}  // namespace coshard::ops
