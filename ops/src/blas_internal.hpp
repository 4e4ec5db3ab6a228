#pragma once

namespace coshard::ops::detail {

// Sets OpenBLAS to one thread the first time it is called, unless the user chose a count
// (set_blas_threads or OPENBLAS_NUM_THREADS). Called before every GEMM; after the first call it
// costs one atomic load.
void apply_default_blas_threads();

}  // namespace coshard::ops::detail
