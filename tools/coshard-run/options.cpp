#include "options.hpp"

#include <stdexcept>

#include "coshard/runtime/parse_whole.hpp"
#include "coshard/launch/slurm.hpp"

namespace coshard::run {
namespace {

long parse_int(const std::string& flag, const std::string& v, long lo, long hi) {
  const std::optional<long> out = parse_whole<long>(v);
  if (!out || *out < lo || *out > hi) {
    throw std::invalid_argument(flag + " needs an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                                "], got '" + v + "'");
  }
  return *out;
}

struct Given {
  bool nnodes = false, node_rank = false, master = false, last_call = false, take_in_timeout = false;
};

// One coshard-run per host of the step, the step's first host serving the store.
void apply_slurm_step(Options& o, const Given& given, const launch::EnvLookup& env) {
  if (!launch::in_slurm_step(env)) return;
  auto step = launch::read_slurm_step(env);
  if (!step) throw std::invalid_argument(step.error().message());
  const auto& s = step.value();
  const auto hosts = static_cast<int>(s.hosts.size());
  const std::string here = s.hosts[static_cast<std::size_t>(s.node_id)];
  if (const int tasks = s.tasks_per_host[static_cast<std::size_t>(s.node_id)]; tasks != 1) {
    throw std::invalid_argument("this Slurm step runs " + std::to_string(tasks) + " coshard-run tasks on " + here +
                                "; coshard-run starts the ranks itself and runs once per host: srun "
                                "--ntasks-per-node=1 coshard-run --nproc-per-node N ...");
  }
  if (given.nnodes && o.nnodes != hosts) {
    throw std::invalid_argument("--nnodes " + std::to_string(o.nnodes) + " but this Slurm step spans " +
                                std::to_string(hosts) + " host(s) (" + s.hosts.front() + (hosts > 1 ? "..." : "") +
                                "): drop --nnodes, or allocate " + std::to_string(o.nnodes) + " nodes (srun -N" +
                                std::to_string(o.nnodes) + ")");
  }
  if (given.node_rank && o.node_rank != s.node_id) {
    throw std::invalid_argument("--node-rank " + std::to_string(o.node_rank) + " but Slurm runs this task on " + here +
                                ", node " + std::to_string(s.node_id) + " of the step: drop --node-rank");
  }
  if (!given.nnodes) o.min_nodes = hosts;
  o.nnodes = hosts;
  o.node_rank = s.node_id;
  if (!given.master) {
    o.master_addr = s.hosts.front();
    o.master_port = s.port;
  }
  if (o.token.empty()) o.token = s.token;
}

// Flags that each parse but do not go together.
void check_combinations(const Options& o, const Given& given) {
  if (o.min_nodes < o.nnodes && o.max_restarts == 0) {
    throw std::invalid_argument("--nnodes " + std::to_string(o.min_nodes) + ":" + std::to_string(o.nnodes) +
                                " goes on without a lost node by restarting the others: give --max-restarts N (N >= 1)");
  }
  if (given.last_call && o.min_nodes == o.nnodes) {
    throw std::invalid_argument("--last-call is how long a job of --nnodes MIN:MAX waits for more nodes once MIN "
                                "have joined; with --nnodes " + std::to_string(o.nnodes) +
                                " every node must join: drop --last-call, or give --nnodes MIN:" +
                                std::to_string(o.nnodes));
  }
  if (given.take_in_timeout && o.min_nodes == o.nnodes) {
    throw std::invalid_argument("--take-in-timeout bounds the stop after a checkpoint when a job of --nnodes MIN:MAX "
                                "takes a node in; with --nnodes " + std::to_string(o.nnodes) +
                                " no node is taken in: drop --take-in-timeout, or give --nnodes MIN:" +
                                std::to_string(o.nnodes));
  }
  if (o.nnodes > 1) {
    if (o.master_port == 0) {
      throw std::invalid_argument("--nnodes > 1 needs --master ADDR:PORT with a fixed port, the same on every node");
    }
    if (o.token.empty()) throw std::invalid_argument("--nnodes > 1 needs --token T, the same on every node");
  }
}

}  // namespace

std::string usage() {
  return "usage: coshard-run --nproc-per-node N [--nnodes [MIN:]M --node-rank K] [--master ADDR:PORT] [--token T]\n"
         "                   [--grace SECONDS] [--max-restarts N] [--join-timeout SECONDS] [--rejoin-timeout SECONDS]\n"
         "                   [--last-call SECONDS] [--take-in-timeout SECONDS] [--silence-timeout SECONDS]\n"
         "                   -- PROGRAM [ARGS...]\n"
         "  Starts N local ranks of PROGRAM with RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,\n"
         "  MASTER_PORT and COSHARD_TOKEN set, prefixes their output with the rank, forwards SIGINT/SIGTERM,\n"
         "  and stops every rank when one fails. Node 0 serves the rendezvous store at --master\n"
         "  (default 127.0.0.1:0, port 0 picks a free one). Across nodes give every node the same --master\n"
         "  and --token; the other nodes wait --join-timeout (600 s) for node 0. --max-restarts N: when a rank\n"
         "  fails on any node, every node stops its ranks and starts them again (COSHARD_RESTART_COUNT set, a\n"
         "  fresh set of store keys), up to N times; a trainer with --resume auto continues from its last\n"
         "  checkpoint. A node whose coshard-run stops beating for --silence-timeout (15 s, the same on every\n"
         "  node) is taken for lost. A node cut off from node 0's store has --rejoin-timeout (60 s) to reach\n"
         "  it again, and the job restarts once it has (with no restart left, a cut shorter than the silence\n"
         "  timeout is ridden out); with --nnodes MIN:M the others restart without it instead,\n"
         "  down to MIN nodes (node 0 serves the store and stays), and it rejoins at the restart that its\n"
         "  coshard-run causes when it comes back. With MIN:M the job also starts without all M nodes: once\n"
         "  MIN have joined, node 0 waits --last-call (30 s) for more, and a node that joins later is taken\n"
         "  in at the restart its arrival causes (each such restart counts against --max-restarts). Ranks that\n"
         "  take SIGUSR2 (gpt2-train with --checkpoint-dir) stop after a checkpoint for that restart, so that\n"
         "  it loses no step; after --take-in-timeout (300 s) they are stopped as after a failure.\n"
         "  Inside a Slurm step (srun --ntasks-per-node=1 coshard-run ...) the step gives --nnodes,\n"
         "  --node-rank, --master and --token: its first host serves the store.\n";
}

Options parse_options(int argc, char** argv, const launch::EnvLookup& env) {
  Options o;
  Given given;
  int i = 1;
  auto value = [&](const std::string& flag) -> std::string {
    if (i + 1 >= argc) throw std::invalid_argument(flag + " needs a value");
    return argv[++i];
  };
  for (; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--") {
      ++i;
      break;
    }
    if (a == "--help" || a == "-h") throw std::invalid_argument("");
    if (a == "--nproc-per-node") {
      o.nproc_per_node = static_cast<int>(parse_int(a, value(a), 1, 1024));
    } else if (a == "--nnodes") {
      const std::string v = value(a);
      const auto colon = v.find(':');
      o.nnodes = static_cast<int>(parse_int(a, v.substr(colon == std::string::npos ? 0 : colon + 1), 1, 65536));
      o.min_nodes = colon == std::string::npos ? o.nnodes
                                               : static_cast<int>(parse_int("--nnodes MIN", v.substr(0, colon), 1, o.nnodes));
      given.nnodes = true;
    } else if (a == "--node-rank") {
      o.node_rank = static_cast<int>(parse_int(a, value(a), 0, 65535));
      given.node_rank = true;
    } else if (a == "--master") {
      auto v = value(a);
      auto colon = v.rfind(':');
      if (colon == std::string::npos || colon == 0) throw std::invalid_argument("--master needs ADDR:PORT, got '" + v + "'");
      o.master_addr = v.substr(0, colon);
      o.master_port = static_cast<std::uint16_t>(parse_int("--master port", v.substr(colon + 1), 0, 65535));
      given.master = true;
    } else if (a == "--token") {
      o.token = value(a);
      if (o.token.empty()) throw std::invalid_argument("--token must not be empty");
    } else if (a == "--max-restarts") {
      o.max_restarts = static_cast<int>(parse_int(a, value(a), 0, 1000000));
    } else if (a == "--join-timeout") {
      o.join_timeout = std::chrono::seconds(parse_int(a, value(a), 1, 86400));
    } else if (a == "--rejoin-timeout") {
      o.rejoin_timeout = std::chrono::seconds(parse_int(a, value(a), 1, 86400));
    } else if (a == "--last-call") {
      o.last_call = std::chrono::seconds(parse_int(a, value(a), 0, 86400));
      given.last_call = true;
    } else if (a == "--take-in-timeout") {
      o.take_in_timeout = std::chrono::seconds(parse_int(a, value(a), 0, 86400));
      given.take_in_timeout = true;
    } else if (a == "--silence-timeout") {
      o.silence_timeout = std::chrono::seconds(parse_int(a, value(a), 3, 3600));
    } else if (a == "--grace") {
      o.grace_seconds = static_cast<double>(parse_int(a, value(a), 0, 3600));
    } else {
      throw std::invalid_argument("unknown flag '" + a + "' (put the program after --)");
    }
  }
  for (; i < argc; ++i) o.command.emplace_back(argv[i]);
  if (o.command.empty()) throw std::invalid_argument("no program given: put it after --");
  apply_slurm_step(o, given, env);
  if (o.node_rank >= o.nnodes) {
    throw std::invalid_argument("--node-rank " + std::to_string(o.node_rank) + " must be below --nnodes " +
                                std::to_string(o.nnodes) + ": give each of the " + std::to_string(o.nnodes) +
                                " nodes its own --node-rank from 0 to " + std::to_string(o.nnodes - 1));
  }
  check_combinations(o, given);
  return o;
}

}  // namespace coshard::run
