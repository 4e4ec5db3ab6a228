#include "coshard/ops/blas.hpp"

#include <cblas.h>

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <mutex>
#include <string>

#include "blas_internal.hpp"
#include "coshard/runtime/parse_whole.hpp"
#include "check.hpp"
#include "parallel.hpp"

namespace coshard::ops {

namespace {
constexpr int kMaxThreads = 4096;
std::atomic<int> g_threads{0};  // 0: none chosen
std::once_flag g_openblas_once;
bool g_openblas_openmp = false;  // written once, under g_openblas_once

int threads_from_environment() {
  const char* env = std::getenv("OPENBLAS_NUM_THREADS");
  if (env == nullptr || *env == '\0') return 1;
  const std::optional<int> n = parse_whole<int>(env);
  if (!n || *n < 1 || *n > kMaxThreads) {
    detail::fail("OPENBLAS_NUM_THREADS", "'" + std::string(env) +
                                             "' is not a thread count (a whole number from 1 to 4096); set one or "
                                             "unset it for one thread per rank");
  }
  return *n;
}
}  // namespace

void set_blas_threads(int n) {
  if (n < 1 || n > kMaxThreads) {
    detail::fail("set_blas_threads", "thread count must be from 1 to " + std::to_string(kMaxThreads) + ", got " +
                                         std::to_string(n));
  }
  g_threads.store(n);
}

int blas_threads() {
  const int n = g_threads.load();
  return n > 0 ? n : threads_from_environment();
}

int threads_per_rank(int local_ranks) {
  if (local_ranks < 1) detail::fail("threads_per_rank", "local_ranks must be >= 1, got " + std::to_string(local_ranks));
  cpu_set_t set;
  CPU_ZERO(&set);
  const int cpus = sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : 1;
  return std::max(1, cpus / local_ranks);
}

namespace detail {

void openblas_one_thread() {
  std::call_once(g_openblas_once, [] {
    g_openblas_openmp = openblas_get_parallel() == 2;
    openblas_set_num_threads(1);
  });
  if (g_openblas_openmp) {
    thread_local bool set_here = false;
    if (!set_here) openblas_set_num_threads(1), set_here = true;
  }
}

int openblas_threads() { return openblas_get_num_threads(); }

void sgemm_here(bool ta, bool tb, std::size_t m, std::size_t n, std::size_t k, float alpha, const float* a,
                std::size_t lda, const float* b, std::size_t ldb, float beta, float* c, std::size_t ldc) {
  openblas_one_thread();
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, static_cast<int>(m),
              static_cast<int>(n), static_cast<int>(k), alpha, a, static_cast<int>(lda), b, static_cast<int>(ldb), beta,
              c, static_cast<int>(ldc));
}

void sgemm(bool ta, bool tb, std::size_t m, std::size_t n, std::size_t k, float alpha, const float* a,
           std::size_t lda, const float* b, std::size_t ldb, float beta, float* c, std::size_t ldc) {
  openblas_one_thread();
  if (m == 0 || n == 0) return;
  // Slices of rows, or of 16 columns (64 bytes), so that threads share at most a cache line at
  // each slice's edge.
  constexpr std::size_t kColumns = 16;
  const bool by_rows = m > n;
  const std::size_t units = by_rows ? m : (n + kColumns - 1) / kColumns;
  const std::size_t parts =
      threads_for(static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k), units);
  run_parts(parts, [&](std::size_t t) {
    const std::size_t u0 = units * t / parts, u1 = units * (t + 1) / parts;
    std::size_t m0 = 0, m1 = m, n0 = 0, n1 = n;
    if (by_rows) {
      m0 = u0, m1 = u1;
    } else {
      n0 = u0 * kColumns, n1 = std::min(n, u1 * kColumns);
    }
    const float* as = a + (ta ? m0 : m0 * lda);  // A^T is stored [k, m]
    const float* bs = b + (tb ? n0 * ldb : n0);  // B^T is stored [n, k]
    sgemm_here(ta, tb, m1 - m0, n1 - n0, k, alpha, as, lda, bs, ldb, beta, c + m0 * ldc + n0, ldc);
  });
}

}  // namespace detail

}  // namespace coshard::ops
