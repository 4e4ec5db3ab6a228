// The baseline for bench_collectives: Open MPI's MPI_Allgather (in place), MPI_Reduce_scatter_block
// and MPI_Allreduce on the same sizes, measured the same way (buffers allocated and touched once,
// back-to-back iterations, slowest rank's mean). Rank 0 prints
//   mpi <op> <bytes> <time_us> <algbw_GBps> <busbw_GBps>
// Usage: mpirun -np N bench_mpi_collectives [--min BYTES] [--max BYTES]
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  std::size_t min = 1024, max = 256u << 20;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--min") == 0) min = std::strtoull(argv[i + 1], nullptr, 10);
    if (std::strcmp(argv[i], "--max") == 0) max = std::strtoull(argv[i + 1], nullptr, 10);
  }
  int n = 0, r = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  std::vector<float> buf(max / sizeof(float), 1.0f), out(max / sizeof(float), 0.0f);
  std::vector<int> counts(static_cast<std::size_t>(n));
  if (r == 0) std::printf("# Open MPI collectives, %d ranks, f32; time = slowest rank's mean\n", n);
  for (std::size_t bytes = min; bytes <= max; bytes *= 4) {
    const int elems = static_cast<int>(bytes / sizeof(float)) / n * n;
    if (elems == 0) continue;
    const std::size_t used = static_cast<std::size_t>(elems) * sizeof(float);
    const int iters = static_cast<int>(std::clamp<std::size_t>((std::size_t{1} << 28) / used, 5, 2000));
    const int warmup = std::max(2, iters / 10);
    for (std::string op : {"all_gather", "reduce_scatter", "all_reduce"}) {
      auto issue = [&] {
        if (op == "all_gather") {
          MPI_Allgather(MPI_IN_PLACE, 0, MPI_FLOAT, buf.data(), elems / n, MPI_FLOAT, MPI_COMM_WORLD);
        } else if (op == "reduce_scatter") {
          MPI_Reduce_scatter_block(buf.data(), out.data(), elems / n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        } else {
          MPI_Allreduce(MPI_IN_PLACE, buf.data(), elems, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        }
      };
      for (int i = 0; i < warmup; ++i) issue();
      MPI_Barrier(MPI_COMM_WORLD);
      double t0 = MPI_Wtime();
      for (int i = 0; i < iters; ++i) issue();
      double us = (MPI_Wtime() - t0) * 1e6 / iters, slowest = 0;
      MPI_Reduce(&us, &slowest, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
      if (r == 0) {
        double algbw = static_cast<double>(used) / (slowest * 1e3);
        double factor = op == "all_reduce" ? 2.0 * (n - 1) / n : static_cast<double>(n - 1) / n;
        std::printf("mpi %-15s %12zu %12.1f %10.3f %10.3f\n", op.c_str(), used, slowest, algbw, algbw * factor);
        std::fflush(stdout);
      }
    }
  }
  MPI_Finalize();
  return 0;
}
