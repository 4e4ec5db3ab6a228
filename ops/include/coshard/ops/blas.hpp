#pragma once
// CPU compute threads per rank. coshard splits a rank's large CPU ops over these threads, which it
// starts itself, a team per calling thread kept from one op to the next: the GEMMs (one
// single-threaded OpenBLAS call per slice of the result), attention (by heads), the bf16 GEMM,
// GELU, layernorm, cross-entropy and AdamW; the small ops stay on the calling thread
// (docs/ops.md). OpenBLAS itself is set to one thread on first use, because its own workers spin
// for up to 2^28 cycles after every threaded call, stealing a core from whatever the rank runs next.
//
// The default is 1 thread per rank (OpenBLAS's own default, a thread per core, oversubscribes a
// host running a rank per core, or eight ranks on two cores in the tests): set_blas_threads(n)
// chooses n; without it, OPENBLAS_NUM_THREADS is the count when set. The setting is
// process-wide; change it only while no op is running, e.g. before starting the streams.
namespace coshard::ops {

void set_blas_threads(int n);  ///< 1 <= n <= 4096, else Errc::invalid_argument
/// The count the CPU ops use now. An OPENBLAS_NUM_THREADS that is not a whole number from 1 to
/// 4096 is Errc::invalid_argument, naming it, when no count was chosen.
int blas_threads();

/// The BLAS threads per rank that fill this host without oversubscribing it: the CPUs this process
/// may run on (its affinity mask, which taskset, cgroup cpusets and Slurm's binding narrow)
/// divided by the ranks on the host, rounded down, at least 1. Nothing is kept back for
/// communication: coshard's progress and store threads sleep in waits, and the reductions of a
/// reduce-scatter are short next to a GEMM. local_ranks >= 1, else Errc::invalid_argument.
int threads_per_rank(int local_ranks);

}  // namespace coshard::ops
