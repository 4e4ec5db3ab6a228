#include "coshard/launch/launch_env.hpp"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <cstdlib>
#include <vector>

#include "coshard/runtime/parse_whole.hpp"
#include "coshard/launch/slurm.hpp"

namespace coshard::launch {
namespace {

struct Names {
  const char* source;
  const char* rank;
  const char* world;
  const char* local_rank;  // may be nullptr
  const char* local_world;
};

constexpr Names kLaunchers[] = {
    {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"},
    {"openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE"},
    {"pmi", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"},
    {"slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"},
};

class Reader {
 public:
  explicit Reader(const EnvLookup& env) : env_(env) {}

  std::optional<long> integer(const char* name, bool required) {
    auto v = env_(name);
    if (!v) {
      if (required) problems_.push_back(std::string(name) + " is not set");
      return std::nullopt;
    }
    const std::optional<long> out = parse_whole<long>(*v);
    if (!out) {
      problems_.push_back(std::string(name) + "='" + *v + "' is not an integer");
      return std::nullopt;
    }
    // Read into an int: 4294967296 was rank 0, 4294967298 a world of 2.
    if (*out < std::numeric_limits<int>::min() || *out > std::numeric_limits<int>::max()) {
      problems_.push_back(std::string(name) + "='" + *v + "' is out of range (at most " +
                          std::to_string(std::numeric_limits<int>::max()) + ")");
      return std::nullopt;
    }
    return out;
  }
  void problem(std::string p) { problems_.push_back(std::move(p)); }
  const std::vector<std::string>& problems() const { return problems_; }
  std::optional<std::string> get(const char* n) const { return env_(n); }

 private:
  const EnvLookup& env_;
  std::vector<std::string> problems_;
};

// Inside a Slurm step the step itself says how many tasks share this host, which host serves the
// store, and on which port: srun needs no MASTER_ADDR, MASTER_PORT or COSHARD_TOKEN.
std::optional<long> apply_slurm_step(const EnvLookup& env, Reader& r, LaunchEnv& out) {
  auto step = read_slurm_step(env);
  if (!step) {
    r.problem(step.error().message());
    return std::nullopt;
  }
  const auto& s = step.value();
  out.master_addr = s.hosts.front();  // MASTER_ADDR and MASTER_PORT, read below, win
  out.master_port = s.port;
  if (!env("COSHARD_TOKEN")) out.token = s.token;
  return s.tasks_per_host[static_cast<std::size_t>(s.node_id)];
}

// Open MPI names the job (PMIX_NAMESPACE) and says which ranks share this host: every rank
// derives the store's port and token from the name, and when the whole job is on this host the
// store is on loopback, so that `mpirun -np 4 gpt2-train` needs no variable of ours. Across hosts
// only MASTER_ADDR (rank 0's host) is left to give. MASTER_ADDR and MASTER_PORT, read later, win.
void apply_open_mpi(const EnvLookup& env, LaunchEnv& out) {
  if (out.local_world_size == out.world_size) out.master_addr = "127.0.0.1";
  const auto job = env("PMIX_NAMESPACE");
  if (!job || job->empty()) return;  // an Open MPI without PMIx: MASTER_PORT is to be given
  std::uint32_t h = 2166136261u;  // FNV-1a: the same on every rank, whatever the name's form
  for (const unsigned char c : *job) h = (h ^ c) * 16777619u;
  out.master_port = static_cast<std::uint16_t>(20000 + h % 12000);  // Slurm's derived range too
  if (!env("COSHARD_TOKEN")) out.token = "openmpi-" + *job;  // ranks of another job are refused
}

}  // namespace

EnvLookup process_env() {
  return [](std::string_view name) -> std::optional<std::string> {
    const char* v = std::getenv(std::string(name).c_str());
    if (!v) return std::nullopt;
    return std::string(v);
  };
}

namespace {

// What coshard-run (or torchrun) tells its ranks beyond their place: the store's token, and
// whether and why this attempt is a restart.
void read_launcher_state(const EnvLookup& env, Reader& r, LaunchEnv& out) {
  if (auto t = env("COSHARD_TOKEN")) out.token = *t;
  if (auto h = env("COSHARD_STORE_HOSTED")) out.store_hosted = *h == "1";
  if (auto n = r.integer("COSHARD_RESTART_EXIT_CODE", false)) out.restart_exit_code = static_cast<int>(*n);
  if (auto n = r.integer("COSHARD_RESTART_FAILED_RANK", false)) out.restart_failed_rank = static_cast<int>(*n);
  for (const char* name : {"COSHARD_RESTART_COUNT", "TORCHELASTIC_RESTART_COUNT"}) {
    if (!env(name)) continue;
    if (auto n = r.integer(name, false); n && *n >= 0) {
      out.restart_count = static_cast<int>(*n);
    } else if (n) {
      r.problem(std::string(name) + "=" + std::to_string(*n) + " must not be negative");
    }
    break;
  }
}

}  // namespace

Result<LaunchEnv> resolve_launch_env(const EnvLookup& env) {
  Reader r(env);
  LaunchEnv out;
  const Names* found = nullptr;
  for (const auto& n : kLaunchers) {
    if (std::string_view(n.source) == "slurm" && !in_slurm_step(env)) continue;  // a batch script is one process
    if (env(n.rank) || env(n.world)) {
      found = &n;
      break;
    }
  }
  read_launcher_state(env, r, out);
  if (!found) return out;  // no launcher: one rank, no store

  out.source = found->source;
  auto rank = r.integer(found->rank, true);
  auto world = r.integer(found->world, true);
  auto local_rank = r.integer(found->local_rank, false);
  auto local_world = std::string_view(found->source) == "slurm" ? apply_slurm_step(env, r, out)
                                                                 : r.integer(found->local_world, false);
  if (world && *world < 1) r.problem(std::string(found->world) + "=" + std::to_string(*world) + " must be at least 1");
  // Far beyond any real job, and the rendezvous would build a key per rank before anything refused.
  constexpr long kMaxWorld = 1L << 20;
  if (world && *world > kMaxWorld) {
    r.problem(std::string(found->world) + "=" + std::to_string(*world) + " is more ranks than coshard runs (at most " +
              std::to_string(kMaxWorld) + ")");
  }
  if (rank && world && (*rank < 0 || *rank >= *world)) {
    r.problem(std::string(found->rank) + "=" + std::to_string(*rank) + " is outside [0, " + std::to_string(*world) +
              ")");
  }
  if (rank) out.rank = static_cast<int>(*rank);
  if (world) out.world_size = static_cast<int>(*world);
  // Without local information every rank is taken to be on its own node.
  out.local_rank = local_rank ? static_cast<int>(*local_rank) : 0;
  out.local_world_size = local_world ? static_cast<int>(*local_world) : 1;
  if (local_rank && !local_world) {
    out.local_world_size = static_cast<int>(std::min<long>(*local_rank + 1, std::numeric_limits<int>::max()));
  }
  if (out.local_rank < 0 || out.local_rank >= out.local_world_size) {
    r.problem("local rank " + std::to_string(out.local_rank) + " is outside [0, " +
              std::to_string(out.local_world_size) + ")");
  }
  if (out.local_world_size > out.world_size) {
    r.problem("local world size " + std::to_string(out.local_world_size) + " exceeds the world size " +
              std::to_string(out.world_size));
  }

  const bool open_mpi = out.source == "openmpi";
  if (open_mpi && out.world_size > 1) apply_open_mpi(env, out);
  if (out.world_size > 1) {  // a Slurm step or Open MPI has filled in what it was not given
    auto addr = env("MASTER_ADDR");
    if (addr && !addr->empty()) {
      out.master_addr = *addr;
    } else if (out.master_addr.empty()) {
      r.problem(open_mpi ? "MASTER_ADDR is not set, and the job spans hosts: give every rank rank 0's host "
                           "(mpirun -x MASTER_ADDR=HOST)"
                         : "MASTER_ADDR is not set (the rendezvous host; coshard-run, torchrun and srun set it)");
    }
    if (auto port = r.integer("MASTER_PORT", out.master_port == 0)) {
      if (*port < 1 || *port > 65535) {
        r.problem("MASTER_PORT=" + std::to_string(*port) + " is not a port number (1-65535)");
      } else {
        out.master_port = static_cast<std::uint16_t>(*port);
      }
    }
  }

  if (!r.problems().empty()) {
    std::string msg = "launch environment from " + out.source + " is incomplete or inconsistent: ";
    for (std::size_t i = 0; i < r.problems().size(); ++i) msg += (i ? "; " : "") + r.problems()[i];
    msg += ". Start ranks with coshard-run, torchrun, mpirun or srun, or set these variables";
    return Error(Errc::bad_config, msg);
  }
  return out;
}

}  // namespace coshard::launch
