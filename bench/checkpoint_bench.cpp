// Sharded checkpoint throughput and the step time a save costs, beside the disk's own speed
// measured in the same run. Start with coshard-run:
//   coshard-run --nproc-per-node N -- bench_checkpoint [--config 124M] [--dir DIR] [--steps 4] [--rounds 3]
// Prints (rank 0) one line:
//   checkpoint ranks=N config=124M state_bytes=... disk_write_gbps=... save_gbps=... load_gbps=...
//   steps=S ms=... ms_with_save=... ms_with_async_save=...   (S steps alone, and with one save after the first)
//   <figure>_spread=...   (each figure's (max - min) / median)
// disk_write_gbps is one sequential write of the same bytes by rank 0 (write + fsync), the
// baseline a parallel save competes with. Every figure is the median of --rounds rounds, the
// rounds alternating between what they measure.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "coshard/fsdp/engine.hpp"
#include "coshard/gpt2/units.hpp"
#include "coshard/transport/process_group.hpp"
#include "coshard/transport/rank_main.hpp"
#include "flags.hpp"
#include "summary.hpp"

using namespace coshard;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

struct Flags {
  std::string config = "124M";
  std::string dir = "/tmp/coshard-bench-checkpoint";
  int steps = 4;
  int seq = 32;
  int rounds = 3;
};


double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// One sequential, durable write of `bytes` (the disk's speed for what a save writes).
double disk_write_seconds(const fs::path& file, std::size_t bytes) {
  std::vector<char> block(std::size_t{8} << 20, 1);
  const auto t0 = Clock::now();
  const int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) throw std::runtime_error("cannot create " + file.string());
  for (std::size_t done = 0; done < bytes;) {
    const auto n = std::min(block.size(), bytes - done);
    if (::write(fd, block.data(), n) != static_cast<ssize_t>(n)) throw std::runtime_error("write failed");
    done += n;
  }
  ::fsync(fd);
  ::close(fd);
  const double s = seconds_since(t0);
  fs::remove(file);
  return s;
}

Task<double> barrier_seconds(transport::ProcessGroup& pg, Clock::time_point t0) {
  co_await pg.world().barrier(pg.world().stream());
  co_return seconds_since(t0);
}

Task<int> run(Runtime& rt, Flags f) {
  auto pg = co_await transport::ProcessGroup::from_env(rt);
  gpt2::Gpt2Units model(gpt2::parse_config(f.config), 1337);
  fsdp::Options o;
  o.optimizer = fsdp::AdamW{{.lr = 1e-4, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.0}};
  auto engine = co_await fsdp::Engine::create(rt, *pg, model.units(), o);
  std::vector<std::int32_t> tokens(static_cast<std::size_t>(f.seq), 1), targets(tokens.size(), 2);
  auto step = [&]() -> Task<void> {
    model.set_batch(tokens, targets, 1, static_cast<std::size_t>(f.seq));
    co_await model.forward(*engine);
    co_await model.backward(*engine);
    co_await engine->optimizer_step();
    co_await engine->synchronize();
  };
  const fs::path root = fs::path(f.dir) / std::to_string(::getppid());
  if (pg->rank() == 0) fs::create_directories(root);
  co_await step();  // warm up: pools, pages
  // --steps steps alone, with a blocking save after the first, with an asynchronous one there
  // (which the following steps can hide): the time a save costs is the difference. Then the
  // throughput of one save and one load of the whole state, and the disk's own write.
  std::vector<std::vector<double>> ms(3);  // per round, of each figure
  std::vector<double> save_gbps, load_gbps, disk_gbps;
  std::uint64_t bytes = 0;
  for (int round = 0; round < f.rounds; ++round) {
    for (int mode = 0; mode < 3; ++mode) {
      auto t0 = Clock::now();
      for (int i = 0; i < f.steps; ++i) {
        co_await step();
        const std::string dir = (root / ("m" + std::to_string(mode) + "r" + std::to_string(round))).string();
        if (i == 0 && mode == 1) co_await engine->save_sharded(dir, {});
        if (i == 0 && mode == 2) co_await engine->save_sharded_async(dir, {});
      }
      co_await engine->wait_for_checkpoint();
      ms[static_cast<std::size_t>(mode)].push_back(co_await barrier_seconds(*pg, t0) * 1e3);
    }
    const fs::path dir = root / ("throughput" + std::to_string(round));
    auto t0 = Clock::now();
    co_await engine->save_sharded(dir.string(), {});
    const double save_s = co_await barrier_seconds(*pg, t0);
    t0 = Clock::now();
    co_await engine->load_sharded(dir.string());
    const double load_s = co_await barrier_seconds(*pg, t0);
    if (pg->rank() == 0) {
      bytes = 0;
      for (const auto& file : fsdp::read_manifest(dir).files) bytes += file.bytes;
      // Three saves a round: each round's go before the next, so that the disk holds one.
      for (const auto* name : {"m1r", "m2r", "throughput"}) fs::remove_all(root / (name + std::to_string(round)));
      save_gbps.push_back(static_cast<double>(bytes) / save_s / 1e9);
      load_gbps.push_back(static_cast<double>(bytes) / load_s / 1e9);
      disk_gbps.push_back(static_cast<double>(bytes) / disk_write_seconds(root / "disk.bin", bytes) / 1e9);
    }
    co_await pg->world().barrier(pg->world().stream());  // rank 0's disk write is not under the next round
  }
  if (pg->rank() == 0) {
    using bench::summarise;
    const auto disk = summarise(disk_gbps), save = summarise(save_gbps), load = summarise(load_gbps);
    const auto alone = summarise(ms[0]), with_save = summarise(ms[1]), with_async = summarise(ms[2]);
    std::printf("checkpoint ranks=%d config=%s state_bytes=%llu disk_write_gbps=%.2f save_gbps=%.2f load_gbps=%.2f "
                "steps=%d ms=%.0f ms_with_save=%.0f ms_with_async_save=%.0f disk_write_gbps_spread=%.2f "
                "save_gbps_spread=%.2f load_gbps_spread=%.2f ms_spread=%.2f ms_with_save_spread=%.2f "
                "ms_with_async_save_spread=%.2f\n",
                pg->size(), f.config.c_str(), static_cast<unsigned long long>(bytes), disk.median, save.median,
                load.median, f.steps, alone.median, with_save.median, with_async.median, disk.spread, save.spread,
                load.spread, alone.spread, with_save.spread, with_async.spread);
    std::fflush(stdout);
    fs::remove_all(root);
  }
  co_await pg->finish();
  co_return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Flags f;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--config") f.config = v;
    else if (k == "--dir") f.dir = v;
    else if (k == "--steps") f.steps = bench::flag_number("bench_checkpoint", k, v, 1, 1000000);
    else if (k == "--seq") f.seq = bench::flag_number("bench_checkpoint", k, v, 1, 1 << 16);
    else if (k == "--rounds") f.rounds = bench::flag_number("bench_checkpoint", k, v, 1, 1000);
    else {
      std::fprintf(stderr, "bench_checkpoint: unknown flag %s\n", k.c_str());
      return 2;
    }
  }
  if (f.steps < 1 || f.rounds < 1) {
    std::fprintf(stderr, "bench_checkpoint: --steps and --rounds must be at least 1\n");
    return 2;
  }
  return transport::run_rank("bench_checkpoint", {.name = "bench"},
                             [&](Runtime& rt, const launch::LaunchEnv&) { return run(rt, f); });
}
