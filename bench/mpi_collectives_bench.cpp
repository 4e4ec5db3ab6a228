// The baseline for bench_collectives: Open MPI's MPI_Allgather (in place), MPI_Reduce_scatter_block
// and MPI_Allreduce on the same sizes, measured the same way (buffers allocated and touched once,
// 5 rounds of back-to-back iterations, the median round of the slowest rank's mean, its spread).
// Rank 0 prints
//   mpi <op> <bytes> <time_us> <algbw_GBps> <busbw_GBps> <spread>
// Usage: mpirun -np N bench_mpi_collectives [--min BYTES] [--max BYTES]
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "flags.hpp"
#include "summary.hpp"

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  std::size_t min = 1024, max = 256u << 20;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string_view k = argv[i];
    using coshard::bench::flag_number;
    if (k == "--min") min = flag_number<std::size_t>("bench_mpi_collectives", k, argv[i + 1], 4, std::size_t{1} << 30);
    if (k == "--max") max = flag_number<std::size_t>("bench_mpi_collectives", k, argv[i + 1], 4, std::size_t{4} << 30);
  }
  int n = 0, r = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  std::vector<float> buf(max / sizeof(float), 1.0f), out(max / sizeof(float), 0.0f);
  std::vector<int> counts(static_cast<std::size_t>(n));
  constexpr int rounds = 5;
  if (r == 0) {
    std::printf("# Open MPI collectives, %d ranks, f32; time = median of %d rounds of the slowest rank's mean\n", n,
                rounds);
  }
  for (std::size_t bytes = min; bytes <= max; bytes *= 4) {
    const int elems = static_cast<int>(bytes / sizeof(float)) / n * n;
    if (elems == 0) continue;
    const std::size_t used = static_cast<std::size_t>(elems) * sizeof(float);
    const int iters = static_cast<int>(std::clamp<std::size_t>((std::size_t{1} << 28) / used, rounds, 2000)) / rounds;
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
      double us[rounds], slowest[rounds];
      for (int round = 0; round < rounds; ++round) {
        double t0 = MPI_Wtime();
        for (int i = 0; i < iters; ++i) issue();
        us[round] = (MPI_Wtime() - t0) * 1e6 / iters;
      }
      MPI_Reduce(us, slowest, rounds, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
      if (r == 0) {
        const auto t = coshard::bench::summarise({slowest, slowest + rounds});
        double algbw = static_cast<double>(used) / (t.median * 1e3);
        double factor = op == "all_reduce" ? 2.0 * (n - 1) / n : static_cast<double>(n - 1) / n;
        std::printf("mpi %-15s %12zu %12.1f %10.3f %10.3f %6.2f\n", op.c_str(), used, t.median, algbw,
                    algbw * factor, t.spread);
        std::fflush(stdout);
      }
    }
  }
  MPI_Finalize();
  return 0;
}
