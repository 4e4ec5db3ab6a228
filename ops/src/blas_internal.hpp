#pragma once
#include <cstddef>

namespace coshard::ops::detail {

// Sets OpenBLAS to one thread the first time it is called (blas.hpp: coshard's threads split the
// work instead). Called before every OpenBLAS call; after the first it costs one atomic load.
void openblas_one_thread();

// Row-major C[m, n] = alpha op(A) op(B) + beta C, split into blas_threads() single-threaded
// OpenBLAS calls, each on a slice of C's rows or columns (whichever C has more of); one call where
// the product is too small to pay for a thread. Every dimension must fit an int (the callers check).
void sgemm(bool ta, bool tb, std::size_t m, std::size_t n, std::size_t k, float alpha, const float* a,
           std::size_t lda, const float* b, std::size_t ldb, float beta, float* c, std::size_t ldc);

}  // namespace coshard::ops::detail
