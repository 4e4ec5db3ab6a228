// Collective bandwidth of the UCX communicator, one rank per process (start it with coshard-run):
// all-gather (in place, as FSDP uses it), reduce-scatter and all-reduce from 1 KiB to 256 MiB.
// Columns and formulas as nccl-tests: size is the full buffer (all-gather output, reduce-scatter
// input, all-reduce buffer), algbw = size / time, busbw = algbw x (n-1)/n (x 2(n-1)/n for
// all-reduce). Each cell runs 5 rounds of back-to-back iterations; a round's time is the slowest
// rank's mean, and the cell's time is the median round, with spread = (slowest - fastest round) /
// median. Rank 0 prints
//   coshard <op> <bytes> <time_us> <algbw_GBps> <busbw_GBps> <spread>
// one line per cell, the format scripts/bench merges with Open MPI's table.
//   --min BYTES --max BYTES   size range (powers of 4 from min); default 1 KiB .. 256 MiB
//   --ops all_gather,reduce_scatter,all_reduce
//   --pipeline BYTES          piece size of the ring pipeline (UcxOptions::pipeline_bytes)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "coshard/runtime/runtime.hpp"
#include "coshard/transport/process_group.hpp"
#include "coshard/transport/rank_main.hpp"
#include "flags.hpp"
#include "summary.hpp"

using namespace coshard;
using namespace coshard::transport;

namespace {

struct Flags {
  std::size_t min = 1024, max = 256u << 20;
  std::string ops = "all_gather,reduce_scatter,all_reduce";
  std::size_t pipeline = UcxOptions{}.pipeline_bytes;
};

double bus_factor(const std::string& op, int n) {
  return op == "all_reduce" ? 2.0 * (n - 1) / n : static_cast<double>(n - 1) / n;
}

Task<int> run(Runtime& rt, Flags f) {
  ProcessGroupOptions options;
  options.ucx.pipeline_bytes = f.pipeline;
  auto pg = co_await ProcessGroup::from_env(rt, options);
  Communicator& c = pg->world();
  const int n = c.size(), r = c.rank();
  Stream& s = rt.stream("compute");
  // Buffers are allocated and touched once: a fresh page costs about 1.6 us here, which would
  // measure the kernel rather than the collective.
  const std::size_t max_elems = f.max / sizeof(float);
  Tensor big = Tensor::empty(rt.allocator(), DType::f32, {static_cast<std::int64_t>(max_elems)});
  Tensor out = Tensor::empty(rt.allocator(), DType::f32, {static_cast<std::int64_t>(max_elems)});
  std::fill_n(big.data_as<float>(), max_elems, 1.0f);
  std::fill_n(out.data_as<float>(), max_elems, 0.0f);
  constexpr int rounds = 5;
  Tensor slowest = Tensor::empty(rt.allocator(), DType::f32, {rounds});
  if (r == 0) {
    std::printf("# coshard UCX collectives, %d ranks, f32; time = median of %d rounds of the slowest rank's mean\n", n,
                rounds);
    std::printf("# %-15s %12s %12s %10s %10s %6s\n", "op", "bytes", "time_us", "algbw", "busbw", "spread");
  }
  for (std::size_t bytes = f.min; bytes <= f.max; bytes *= 4) {
    const auto elems = static_cast<std::int64_t>(bytes / sizeof(float)) / n * n;
    if (elems == 0) continue;
    const std::size_t used = static_cast<std::size_t>(elems) * sizeof(float);
    const int iters = static_cast<int>(std::clamp<std::size_t>((std::size_t{1} << 28) / used, rounds, 2000)) / rounds;
    const int warmup = std::max(2, iters / 10);
    for (std::string op : {"all_gather", "reduce_scatter", "all_reduce"}) {
      if (f.ops.find(op) == std::string::npos) continue;
      Tensor buf = big.view(0, {elems});
      Tensor shard = out.view(0, {elems / n});
      auto issue = [&]() -> Event {
        if (op == "all_gather") return c.all_gather(buf.view(r * (elems / n), {elems / n}), buf, s);
        if (op == "reduce_scatter") return c.reduce_scatter(buf, shard, Reduction::sum(), s);
        return c.all_reduce(buf, Reduction::sum(), s);
      };
      Event last;
      for (int i = 0; i < warmup; ++i) last = issue();
      co_await last;
      co_await c.barrier(s);
      for (int round = 0; round < rounds; ++round) {
        auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < iters; ++i) last = issue();
        co_await last;
        slowest.data_as<float>()[round] = static_cast<float>(
            std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / iters);
      }
      co_await c.all_reduce(slowest, Reduction::max(), s);
      const auto us = bench::summarise({slowest.data_as<float>(), slowest.data_as<float>() + rounds});
      if (r == 0) {
        double algbw = static_cast<double>(used) / (us.median * 1e3);
        std::printf("coshard %-15s %12zu %12.1f %10.3f %10.3f %6.2f\n", op.c_str(), used, us.median, algbw,
                    algbw * bus_factor(op, n), us.spread);
        std::fflush(stdout);
      }
    }
  }
  co_await pg->finish();
  co_return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Flags f;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i];
    if (k == "--min") f.min = bench::flag_number<std::size_t>("bench_collectives", k, argv[i + 1], 4, std::size_t{1} << 30);
    else if (k == "--max") f.max = bench::flag_number<std::size_t>("bench_collectives", k, argv[i + 1], 4, std::size_t{4} << 30);
    else if (k == "--ops") f.ops = argv[i + 1];
    else if (k == "--pipeline") f.pipeline = bench::flag_number<std::size_t>("bench_collectives", k, argv[i + 1], 0, std::size_t{1} << 30);
    else {
      std::fprintf(stderr, "bench_collectives: unknown flag %s (--min, --max, --ops)\n", k.c_str());
      return 2;
    }
  }
  return transport::run_rank("bench_collectives", {.name = "bench"},
                             [&](Runtime& rt, const launch::LaunchEnv&) { return run(rt, f); });
}
