#include "memory_check.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <vector>

#include "coshard/gpt2/data.hpp"
#include "coshard/runtime/error.hpp"
#include "coshard/runtime/parse_whole.hpp"

namespace coshard::train {
namespace {

namespace fs = std::filesystem;

std::string bytes_text(double bytes) {
  char buf[48];
  if (bytes >= 1024.0 * 1024 * 1024) {
    std::snprintf(buf, sizeof buf, "%.1f GiB", bytes / (1024.0 * 1024 * 1024));
  } else {
    std::snprintf(buf, sizeof buf, "%.0f MiB", std::ceil(bytes / (1024.0 * 1024)));
  }
  return buf;
}

// Before the rendezvous, which tells fsdp the hosts (ranks_per_host), LOCAL_WORLD_SIZE stands for
// the ranks of a host. Where they differ (several coshard-run nodes on one host, which fsdp groups
// as one) the default shard group here is the smaller, so the check counts more, never less.
int shard_group_size(const TrainOptions& o, const launch::LaunchEnv& env) {
  switch (o.strategy) {
    case fsdp::Strategy::no_shard:
      return 1;
    case fsdp::Strategy::hybrid_shard:
    case fsdp::Strategy::hybrid_shard_zero2:
      return std::max(1, std::min(env.world_size, o.shard_group > 0 ? o.shard_group : env.local_world_size));
    default:
      return std::max(1, env.world_size);
  }
}

// What a token file takes loaded: its tokens, 32 bits each whatever the file holds.
double data_bytes(const std::string& path) {
  return path.empty() ? 0 : static_cast<double>(gpt2::tokens_in(path) * sizeof(gpt2::Token));
}

std::optional<double> number_in(const fs::path& file) {
  std::ifstream f(file);
  std::string word;
  if (!(f >> word) || word == "max") return std::nullopt;
  const auto bytes = parse_whole<std::uint64_t>(word);  // cgroup files hold whole bytes
  return bytes ? std::optional<double>(static_cast<double>(*bytes)) : std::nullopt;
}

std::optional<double> stat_value(const fs::path& file, const std::string& key) {
  std::ifstream f(file);
  std::string name;
  for (double value = 0; f >> name >> value;) {
    if (name == key) return value;
  }
  return std::nullopt;
}

// The memory cgroup's directory and its files: v2 (memory.max) or v1 (memory.limit_in_bytes).
struct Cgroup {
  fs::path mount, dir;
  bool v2 = true;
};

std::optional<Cgroup> memory_cgroup() {
  std::ifstream f("/proc/self/cgroup");
  std::optional<Cgroup> found;
  for (std::string line; std::getline(f, line);) {
    const auto a = line.find(':'), b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    const std::string controllers = "," + line.substr(a + 1, b - a - 1) + ",";
    const fs::path rel = fs::path(line.substr(b + 1)).relative_path();
    if (controllers.find(",memory,") != std::string::npos) {
      return Cgroup{"/sys/fs/cgroup/memory", "/sys/fs/cgroup/memory" / rel, false};  // v1 wins: it is the one in force
    }
    if (line.starts_with("0::")) {
      const fs::path mount = fs::exists("/sys/fs/cgroup/cgroup.controllers") ? "/sys/fs/cgroup" : "/sys/fs/cgroup/unified";
      found = Cgroup{mount, mount / rel, true};
    }
  }
  return found;
}

// What the cgroup and those above it leave: the least of limit - (usage - file cache), since the
// kernel takes the cache back before an OOM kill (as MemAvailable counts it free).
std::optional<HostMemory> cgroup_memory() {
  const auto cg = memory_cgroup();
  if (!cg) return std::nullopt;
  const char* limit_file = cg->v2 ? "memory.max" : "memory.limit_in_bytes";
  const char* usage_file = cg->v2 ? "memory.current" : "memory.usage_in_bytes";
  const std::string prefix = cg->v2 ? "" : "total_";
  std::optional<HostMemory> least;
  // Without a cgroup namespace the path may not exist under the mount: the levels that do count.
  for (fs::path d = cg->dir;; d = d.parent_path()) {
    const auto limit = number_in(d / limit_file);
    const auto usage = number_in(d / usage_file);
    if (limit && usage && *limit < 0x1p62) {  // v1 writes "no limit" as a page-rounded 2^63 - 1
      const double cache = stat_value(d / "memory.stat", prefix + "inactive_file").value_or(0) +
                           stat_value(d / "memory.stat", prefix + "active_file").value_or(0);
      const double used = *usage - std::min(*usage, cache);
      const double left = std::max(0.0, *limit - used);
      if (!least || left < least->available) least = HostMemory{left, "the memory cgroup limit of " + d.string()};
    }
    if (d == cg->mount || d == d.parent_path()) break;
  }
  return least;
}

}  // namespace

MemoryNeed memory_need(const TrainOptions& o, const launch::LaunchEnv& env) {
  const auto& c = o.config;
  const double P = static_cast<double>(c.num_params());
  // Units as the plan makes them: the root (embeddings, the final norm, and an untied head kept
  // like it) and the layers; full_shard has the root and two layers open at once (one computes,
  // one is fetched).
  const double root = c.root_params();
  const double block = c.layer_params(), layers = static_cast<double>(c.layers());
  // Without prefetch one block is open at a time; gradients of two are (one computes, one reduces).
  const bool prefetch = o.forward_prefetch > 0 || o.backward_prefetch != fsdp::BackwardPrefetch::none;
  const double open = root + std::min(prefetch ? 2.0 : 1.0, layers) * block;
  const double open_grads = root + std::min(2.0, layers) * block;
  const double p = o.param_dtype == DType::f32 ? 4 : 2;
  const bool keeps_all = o.strategy == fsdp::Strategy::shard_grad_op || o.strategy == fsdp::Strategy::hybrid_shard_zero2;
  double gathered = p * (keeps_all ? P : open);
  if (o.strategy == fsdp::Strategy::no_shard) gathered = o.param_dtype == DType::f32 ? 0 : p * P;  // else the master
  MemoryNeed n;
  n.activations = c.activation_bytes(o.batch, o.seq);
  n.state = 16 * P / shard_group_size(o, env);
  // With --grad-accum every unit's gradient is a lasting accumulator, and the open ones are those.
  n.unsharded = gathered + (o.grad_accum > 1 ? 0 : 4 * open_grads);
  n.accumulators = o.grad_accum > 1 ? 4 * P : 0;
  n.data = data_bytes(o.data) + data_bytes(o.val_data);
  return n;
}

std::optional<HostMemory> host_memory() {
  std::optional<HostMemory> host;
  std::ifstream f("/proc/meminfo");
  for (std::string line; std::getline(f, line);) {
    if (line.starts_with("MemAvailable:")) host = HostMemory{std::stod(line.substr(13)) * 1024, "MemAvailable in /proc/meminfo"};
  }
  const auto cg = cgroup_memory();
  if (cg && (!host || cg->available < host->available)) host = cg;
  return host;
}

double check_memory(const TrainOptions& o, const launch::LaunchEnv& env) {
  const MemoryNeed need = memory_need(o, env);
  // On CUDA the state and the activations are GPU memory, which this check does not read: the
  // device allocator's out-of-memory error names what it could not allocate.
  if (o.skip_memory_check || o.device == "cuda") return need.total();
  const auto host = host_memory();
  if (!host) return need.total();
  const int local = std::max(1, env.local_world_size);
  const double all = need.total() * local;
  // The ranks on a host start together, but one may read the memory after the others loaded their
  // data: each allows for that, so that none refuses what fits.
  const double available = host->available + need.data * (local - 1);
  const std::string ranks = std::to_string(local) + " rank(s) on this host";
  // The need is a floor: scratch, BLAS buffers and rank 0's copies at the end come on top.
  constexpr double kHeadroom = 0.8;
  if (all <= available) {
    if (env.local_rank == 0 && all > kHeadroom * available) {
      std::fprintf(stderr, "gpt2-train: warning: the %s need at least %s of the %s available (%s), and scratch "
                   "comes on top: if the job is killed for memory (exit 137), lower --batch\n",
                   ranks.c_str(), bytes_text(all).c_str(), bytes_text(host->available).c_str(), host->from.c_str());
    }
    return need.total();
  }
  std::string terms = "activations of --batch " + std::to_string(o.batch) + " x --seq " + std::to_string(o.seq) +
                      " " + bytes_text(need.activations) + ", sharded parameters, gradients and AdamW state " +
                      bytes_text(need.state) + ", unsharded units " + bytes_text(need.unsharded);
  if (need.accumulators > 0) terms += ", --grad-accum gradients " + bytes_text(need.accumulators);
  if (need.data > 0) terms += ", token data " + bytes_text(need.data);
  const double per_sequence = o.config.activation_bytes(1, o.seq);
  const double room = kHeadroom * host->available / local - need.fixed();
  const double fits = room > 0 ? std::floor(room / per_sequence) : 0;
  const std::string advice =
      fits >= 1 ? "--batch " + std::to_string(static_cast<long long>(fits)) +
                      " fits (--global-batch or --grad-accum keeps the global batch)"
                : "not even --batch 1 fits: shard the model over more ranks (full_shard), lower --seq, use a "
                  "smaller model, or start fewer ranks on this host";
  throw Error(Errc::out_of_memory,
              "the " + ranks + " need at least " + bytes_text(all) + " (each: " + terms + "), but " +
                  bytes_text(host->available) + " is available (" + host->from + "). " + advice +
                  ". --no-memory-check skips this check");
}

void print_peak_memory(const TrainOptions& o, double counted, std::pair<float, float> least_most) {
  std::printf("memory: the ranks peaked at %.0f-%.0f MiB resident; the memory check counted at least %.0f MiB a "
              "rank (--batch %d x --seq %d)\n", least_most.first, least_most.second, counted / (1024.0 * 1024),
              o.batch, o.seq);
  std::fflush(stdout);
}

}  // namespace coshard::train
