#pragma once
// OpenBLAS thread count. OpenBLAS's own default is one thread per core, which oversubscribes a
// host running one rank per core (or eight ranks on two cores in the tests). coshard therefore
// defaults to 1 thread per rank: the first GEMM that coshard issues sets 1 unless
// set_blas_threads() was called before or OPENBLAS_NUM_THREADS is set in the environment.
// The setting is process-wide (OpenBLAS has no per-call thread count); change it only while no
// GEMM is running, e.g. before starting the streams.
namespace coshard::ops {

void set_blas_threads(int n);  ///< n >= 1, else Errc::invalid_argument
int blas_threads();            ///< the count OpenBLAS will use now

/// The BLAS threads per rank that fill this host without oversubscribing it: the CPUs this process
/// may run on (its affinity mask, which taskset, cgroup cpusets and Slurm's binding narrow)
/// divided by the ranks on the host, rounded down, at least 1. Nothing is kept back for
/// communication: coshard's progress and store threads sleep in waits, and the reductions of a
/// reduce-scatter are short next to a GEMM. local_ranks >= 1, else Errc::invalid_argument.
int threads_per_rank(int local_ranks);

}  // namespace coshard::ops
