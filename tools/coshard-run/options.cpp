#include "options.hpp"

#include <CLI/CLI.hpp>
#include <memory>
#include <stdexcept>
#include <string_view>

#include "coshard/runtime/parse_whole.hpp"
#include "coshard/launch/slurm.hpp"
#include "coshard/launch/store.hpp"

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

// Flags that change what others mean when given (rather than left at their defaults).
struct Given {
  bool nnodes = false, node_rank = false, master = false, last_call = false, take_in_timeout = false;
};

// The flags as CLI11 reads them: words, turned into Options by to_options with the ranges and the
// messages that name them (parse_int), once the parse succeeded.
struct Words {
  std::string nproc = "1", nnodes = "1", node_rank = "0", master, token, grace = "5", max_restarts = "0",
              join = "600", rejoin = "60", last_call = "30", take_in = "300", silence = "15";
};

// The usage line says where the program goes: after "--", which parse_options cuts off before
// CLI11 reads the rest.
class Formatter : public CLI::Formatter {
 public:
  std::string make_usage(const CLI::App*, std::string name) const override {
    return "Usage: " + name + " [OPTIONS] -- PROGRAM [ARGS...]\n";
  }
};

void add_flags(CLI::App& app, Words& w) {
  app.add_option("--nproc-per-node", w.nproc, "ranks started on this node, 1 to 1024")->type_name("N")
      ->capture_default_str();
  app.add_option("--nnodes", w.nnodes, "nodes of the job, each running one coshard-run; MIN:M lets it start with and "
                                       "go on with as few as MIN (needs --max-restarts)")
      ->type_name("[MIN:]M")->capture_default_str();
  app.add_option("--node-rank", w.node_rank, "this node's index, 0 to --nnodes - 1; node 0 serves the store")
      ->type_name("K")->capture_default_str();
  app.add_option("--master", w.master, "node 0's store address, the same on every node (default 127.0.0.1:0; port 0 "
                                       "picks a free one, on a single node only)")
      ->type_name("ADDR:PORT");
  app.add_option("--token", w.token, "the job's shared secret, the same on every node (generated on a single node)")
      ->type_name("T");
  app.add_option("--grace", w.grace, "seconds between SIGTERM and SIGKILL when ranks are stopped")
      ->type_name("SECONDS")->capture_default_str();
  app.add_option("--max-restarts", w.max_restarts, "when a rank fails on any node, every node stops its ranks and "
                                                   "starts them again, up to N times")
      ->type_name("N")->capture_default_str();
  app.add_option("--join-timeout", w.join, "how long a node waits for node 0's store, and node 0 for every node")
      ->type_name("SECONDS")->capture_default_str();
  app.add_option("--rejoin-timeout", w.rejoin, "how long a node cut off from node 0's store has to reach it again")
      ->type_name("SECONDS")->capture_default_str();
  app.add_option("--last-call", w.last_call, "with --nnodes MIN:M: how long node 0 waits for more nodes once MIN "
                                             "have joined")
      ->type_name("SECONDS")->capture_default_str();
  app.add_option("--take-in-timeout", w.take_in, "with --nnodes MIN:M: how long ranks that take SIGUSR2 get to stop "
                                                 "after a checkpoint when a node is taken in")
      ->type_name("SECONDS")->capture_default_str();
  app.add_option("--silence-timeout", w.silence, "a node whose coshard-run has not beaten for this long is lost; the "
                                                 "same on every node, at least 3")
      ->type_name("SECONDS")->capture_default_str();
}

// The words as Options; throws std::invalid_argument naming the flag and the range it takes.
Options to_options(const Words& w, const Given& given) {
  Options o;
  o.nproc_per_node = static_cast<int>(parse_int("--nproc-per-node", w.nproc, 1, 1024));
  const auto colon = w.nnodes.find(':');
  o.nnodes = static_cast<int>(parse_int("--nnodes", w.nnodes.substr(colon == std::string::npos ? 0 : colon + 1), 1,
                                        65536));
  o.min_nodes = colon == std::string::npos
                    ? o.nnodes
                    : static_cast<int>(parse_int("--nnodes MIN", w.nnodes.substr(0, colon), 1, o.nnodes));
  o.node_rank = static_cast<int>(parse_int("--node-rank", w.node_rank, 0, 65535));
  if (given.master) {
    const auto at = w.master.rfind(':');
    if (at == std::string::npos || at == 0) throw std::invalid_argument("--master needs ADDR:PORT, got '" + w.master + "'");
    o.master_addr = w.master.substr(0, at);
    o.master_port = static_cast<std::uint16_t>(parse_int("--master port", w.master.substr(at + 1), 0, 65535));
  }
  o.token = w.token;
  o.grace_seconds = static_cast<double>(parse_int("--grace", w.grace, 0, 3600));
  o.max_restarts = static_cast<int>(parse_int("--max-restarts", w.max_restarts, 0, 1000000));
  o.join_timeout = std::chrono::seconds(parse_int("--join-timeout", w.join, 1, 86400));
  o.rejoin_timeout = std::chrono::seconds(parse_int("--rejoin-timeout", w.rejoin, 1, 86400));
  o.last_call = std::chrono::seconds(parse_int("--last-call", w.last_call, 0, 86400));
  o.take_in_timeout = std::chrono::seconds(parse_int("--take-in-timeout", w.take_in, 0, 86400));
  o.silence_timeout = std::chrono::seconds(parse_int("--silence-timeout", w.silence, 3, 3600));
  return o;
}

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
  if (o.token.size() > launch::StoreServer::kMaxTokenBytes) {
    throw std::invalid_argument("--token has " + std::to_string(o.token.size()) + " bytes; at most " +
                                std::to_string(launch::StoreServer::kMaxTokenBytes));
  }
}

constexpr const char* kDescription =
    "coshard-run: starts --nproc-per-node ranks of PROGRAM on this node with RANK, WORLD_SIZE, LOCAL_RANK, "
    "LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT and COSHARD_TOKEN set, prefixes their output with the rank, forwards "
    "SIGINT/SIGTERM, and stops every rank when one fails.";

constexpr const char* kFooter =
    "Across nodes, give every node the same --master and --token. With --max-restarts N a restart sets\n"
    "COSHARD_RESTART_COUNT and a fresh set of store keys; a trainer with --resume auto continues from its last\n"
    "checkpoint. A node cut off from node 0's store has --rejoin-timeout to reach it again, and the job restarts\n"
    "once it has (with no restart left, a cut shorter than --silence-timeout is ridden out); with --nnodes MIN:M\n"
    "the others restart without it instead, down to MIN nodes (node 0 serves the store and stays), and it rejoins\n"
    "at the restart its coshard-run causes when it comes back. With MIN:M the job also starts without all M\n"
    "nodes: once MIN have joined, node 0 waits --last-call for more, and a node that joins later is taken in at\n"
    "the restart its arrival causes (each such restart counts against --max-restarts). Ranks that take SIGUSR2\n"
    "(gpt2-train with --checkpoint-dir) stop after a checkpoint for that restart, so that it loses no step; after\n"
    "--take-in-timeout they are stopped as after a failure. Inside a Slurm step (srun --ntasks-per-node=1\n"
    "coshard-run ...) the step gives --nnodes, --node-rank, --master and --token: its first host serves the store.";

}  // namespace

ParseResult parse_options(int argc, char** argv, const launch::EnvLookup& env) {
  // The program and its own flags, which may be coshard-run's too, start after the first "--".
  int end = 1;
  while (end < argc && std::string_view(argv[end]) != "--") ++end;
  CLI::App app{kDescription, "coshard-run"};
  app.formatter(std::make_shared<Formatter>());
  app.get_formatter()->column_width(34);
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);  // before any option is added
  app.footer(kFooter);
  Words w;
  add_flags(app, w);
  const std::string see = " (coshard-run --help shows the usage)";
  try {
    app.parse(end, argv);
  } catch (const CLI::CallForHelp&) {
    return {std::nullopt, 0, app.help()};
  } catch (const CLI::ExtrasError& e) {
    return {std::nullopt, 2, std::string("coshard-run: ") + e.what() + "; coshard-run's flags go before --, the program and its arguments after it" + see};
  } catch (const CLI::ParseError& e) {
    return {std::nullopt, 2, std::string("coshard-run: ") + e.what() + see};
  }
  try {
    const Given given{.nnodes = app.count("--nnodes") > 0, .node_rank = app.count("--node-rank") > 0,
                      .master = app.count("--master") > 0, .last_call = app.count("--last-call") > 0,
                      .take_in_timeout = app.count("--take-in-timeout") > 0};
    if (app.count("--token") > 0 && w.token.empty()) throw std::invalid_argument("--token must not be empty");
    Options o = to_options(w, given);
    for (int i = end + 1; i < argc; ++i) o.command.emplace_back(argv[i]);
    if (o.command.empty()) throw std::invalid_argument("no program given: put it after --");
    apply_slurm_step(o, given, env);
    if (o.node_rank >= o.nnodes) {
      throw std::invalid_argument("--node-rank " + std::to_string(o.node_rank) + " must be below --nnodes " +
                                  std::to_string(o.nnodes) + ": give each of the " + std::to_string(o.nnodes) +
                                  " nodes its own --node-rank from 0 to " + std::to_string(o.nnodes - 1));
    }
    check_combinations(o, given);
    return {std::move(o), 0, {}};
  } catch (const std::invalid_argument& e) {
    return {std::nullopt, 2, std::string("coshard-run: ") + e.what() + see};
  }
}

}  // namespace coshard::run
