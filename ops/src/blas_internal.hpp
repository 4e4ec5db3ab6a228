#pragma once
#include <cstddef>

namespace coshard::ops::detail {

// Sets OpenBLAS to one thread the first time it is called (blas.hpp: coshard's threads split the
// work instead), and, where OpenBLAS is built on OpenMP, whose thread count is a per-thread
// setting, on each new thread that calls it. Called before every OpenBLAS call; after the first
// it costs an atomic load (and a thread-local one).
void openblas_one_thread();

// OpenBLAS's own thread count, as it stands on the calling thread (for the tests).
int openblas_threads();

// Row-major C[m, n] = alpha op(A) op(B) + beta C as one OpenBLAS call on the calling thread: for
// work that is already split (attention's tiles on its heads' threads). Dimensions fit an int.
void sgemm_here(bool ta, bool tb, std::size_t m, std::size_t n, std::size_t k, float alpha, const float* a,
                std::size_t lda, const float* b, std::size_t ldb, float beta, float* c, std::size_t ldc);

// Row-major C[m, n] = alpha op(A) op(B) + beta C, split into blas_threads() single-threaded
// OpenBLAS calls, each on a slice of C's rows or columns (whichever C has more of); one call where
// the product is too small to pay for a thread. Every dimension must fit an int (the callers check).
void sgemm(bool ta, bool tb, std::size_t m, std::size_t n, std::size_t k, float alpha, const float* a,
           std::size_t lda, const float* b, std::size_t ldb, float beta, float* c, std::size_t ldc);

}  // namespace coshard::ops::detail
