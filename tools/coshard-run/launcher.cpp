#include "launcher.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "child.hpp"
#include "coordinator.hpp"
#include "coshard/runtime/error.hpp"
#include "coshard/runtime/scheduler.hpp"
#include "coshard/launch/stop_signal.hpp"
#include "coshard/launch/store.hpp"
#include "coshard/runtime/unique_fd.hpp"
#include "hang_report.hpp"
#include "spawn.hpp"
#include "supervisor.hpp"

namespace coshard::run {
namespace {

namespace fs = std::filesystem;

std::string random_token() {
  std::ifstream urandom("/dev/urandom", std::ios::binary);
  unsigned char bytes[16] = {};
  urandom.read(reinterpret_cast<char*>(bytes), sizeof bytes);
  if (!urandom) throw Error(Errc::io, "cannot read /dev/urandom to make a token; pass --token");
  std::string hex;
  for (auto b : bytes) {
    char buf[3];
    std::snprintf(buf, sizeof buf, "%02x", b);
    hex += buf;
  }
  return hex;
}

// Signals arrive through a descriptor, so the supervision loop sees them in order with child output.
struct BlockedSignals {
  sigset_t old_mask;  // what the ranks get back
  UniqueFd fd;
};

BlockedSignals block_signals() {
  BlockedSignals s;
  sigset_t mask;
  sigemptyset(&mask);
  sigaddset(&mask, SIGINT);
  sigaddset(&mask, SIGTERM);
  sigaddset(&mask, SIGHUP);   // a closed terminal or ssh session: as SIGTERM (torchrun does the same)
  sigaddset(&mask, SIGQUIT);
  sigaddset(&mask, SIGUSR2);  // passed on to the ranks that stop after a checkpoint on it
  sigaddset(&mask, SIGCHLD);
  // A closed stdout (`| head`) would kill the launcher on a rank's next line, and its ranks with it:
  // the write fails with EPIPE instead (Supervisor drops the lines). Blocked, not ignored, as an
  // ignored signal would stay ignored in the ranks.
  sigaddset(&mask, SIGPIPE);
  if (::sigprocmask(SIG_BLOCK, &mask, &s.old_mask) != 0) throw Error(Errc::io, "sigprocmask failed");
  s.fd = UniqueFd(::signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK));
  if (!s.fd) throw Error(Errc::io, std::string("signalfd failed: ") + std::strerror(errno));
  return s;
}

// Node 0 serves the rendezvous store for the whole job, every attempt included.
struct StoreHost {
  std::unique_ptr<Scheduler> sched;
  std::unique_ptr<launch::StoreServer> store;
  std::uint16_t port = 0;

  // Stopped once the job has ended everywhere: every node's ranks ended before node 0 decided, and
  // the other launchers read its decision (Coordinator).
  ~StoreHost() {
    if (store) store->stop();
    if (sched) sched->stop();
  }
};

std::unique_ptr<StoreHost> host_store(const Options& o, const std::string& token) {
  auto h = std::make_unique<StoreHost>();
  h->port = o.master_port;
  if (o.node_rank == 0) {
    h->sched = std::make_unique<Scheduler>(Scheduler::Options{.name = "coshard-run"});
    h->sched->start();
    launch::StoreServer::Options so;
    so.bind_address = launch::StoreServer::bind_address_for(o.master_addr);
    so.port = o.master_port;
    so.token = token;
    h->store = std::make_unique<launch::StoreServer>(*h->sched, so);
    h->port = h->store->port();
  }
  return h;
}

// Where this attempt's ranks write their flight records: a fresh folder under $COSHARD_FLIGHT_DIR
// (or the temp dir), so the report reads only this attempt's; removed when it stayed empty. Fresh
// by mkdtemp: named by the pid alone, a pid the kernel gave again (it wraps at pid_max) reused the
// folder another job had kept, and the report read that job's records as this one's.
struct FlightDir {
  std::string path;
  explicit FlightDir(int attempt) {
    const char* env = std::getenv("COSHARD_FLIGHT_DIR");
    std::error_code ec;
    const fs::path base = env && *env ? fs::path(env) : fs::temp_directory_path(ec);
    fs::create_directories(base, ec);
    std::string name =
        (base / ("coshard-run-" + std::to_string(::getpid()) + "-attempt" + std::to_string(attempt) + "-XXXXXX")).string();
    if (!::mkdtemp(name.data())) {
      throw Error(Errc::io, "cannot make a folder for the ranks' flight records under '" + base.string() +
                                "': " + std::strerror(errno) + "; set COSHARD_FLIGHT_DIR to a folder this user can write");
    }
    path = name;
  }
  ~FlightDir() {
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(path, ec)) {  // markers of killed ranks
      const std::string name = e.path().filename().string();
      if (name.starts_with("coshard-sigusr1-") || name.starts_with("coshard-sigusr2-")) fs::remove(e.path(), ec);
    }
    fs::remove(path, ec);  // only when empty: records of a failure are kept for the user
  }
  FlightDir(const FlightDir&) = delete;
  FlightDir& operator=(const FlightDir&) = delete;
};

// Why the attempt before this one ended, for the ranks' metrics.
struct LastFailure {
  int code = 0, rank = -1;
};

// Where this node's ranks stand in an attempt: the nodes that run ranks in it are numbered afresh
// (the same as node ranks until one is dropped, --nnodes MIN:MAX).
struct Place {
  int group = 0;   // this node's index among the attempt's nodes
  int groups = 1;  // how many nodes run ranks
};

Place place_of(const Options& o, const std::vector<int>& nodes) {
  const auto at = std::find(nodes.begin(), nodes.end(), o.node_rank);
  if (at == nodes.end()) {  // a node outside the attempt asks in instead (Coordinator::ask_in)
    throw Error(Errc::internal, "node " + std::to_string(o.node_rank) + " would start ranks in an attempt that "
                                "does not include it");
  }
  return Place{static_cast<int>(at - nodes.begin()), static_cast<int>(nodes.size())};
}

// What a rank learns from its environment (torchrun's names, and the store's token).
std::vector<std::string> rank_env(const Options& o, const Place& at, int local_rank, std::uint16_t port,
                                  const std::string& token, int restart, const LastFailure& last,
                                  const std::string& flight_dir) {
  return {
      "COSHARD_RESTART_EXIT_CODE=" + std::to_string(last.code),
      "COSHARD_RESTART_FAILED_RANK=" + std::to_string(last.rank),
      "COSHARD_FLIGHT_DIR=" + flight_dir,
      "COSHARD_RESTART_COUNT=" + std::to_string(restart),
      "RANK=" + std::to_string(at.group * o.nproc_per_node + local_rank),
      "WORLD_SIZE=" + std::to_string(at.groups * o.nproc_per_node),
      "LOCAL_RANK=" + std::to_string(local_rank),
      "LOCAL_WORLD_SIZE=" + std::to_string(o.nproc_per_node),
      "GROUP_RANK=" + std::to_string(at.group),
      "MASTER_ADDR=" + o.master_addr,
      "MASTER_PORT=" + std::to_string(port),
      "COSHARD_TOKEN=" + token,
      "COSHARD_STORE_HOSTED=1",
  };
}

// A pipe as its read and write ends, both closed on exec (spawn_child gives a rank its own copies).
std::array<UniqueFd, 2> rank_pipe() {
  auto ends = make_pipe(O_CLOEXEC);
  if (!ends[0]) throw Error(Errc::io, std::string("pipe failed: ") + std::strerror(errno));
  return ends;
}

std::vector<Child> start_ranks(const Options& o, const Place& at, std::uint16_t port, const std::string& token,
                               const sigset_t& old_mask, int restart, const LastFailure& last,
                               const std::string& flight_dir) {
  std::vector<Child> children(static_cast<std::size_t>(o.nproc_per_node));
  try {
    for (int lr = 0; lr < o.nproc_per_node; ++lr) {
      const ChildCommand command(o.command, rank_env(o, at, lr, port, token, restart, last, flight_dir));
      auto [out_read, out_write] = rank_pipe();
      auto [err_read, err_write] = rank_pipe();
      auto& c = children[static_cast<std::size_t>(lr)];
      c.rank = at.group * o.nproc_per_node + lr;
      c.pid = spawn_child(command, out_write.get(), err_write.get(), old_mask);
      c.running = true;
      c.out.fd = std::move(out_read);
      c.err.fd = std::move(err_read);
      c.err.to_stderr = true;
    }
  } catch (...) {
    // The ranks started already would wait for peers that never come.
    for (const auto& c : children) {
      if (!c.running) continue;
      ::kill(-c.pid, SIGKILL);
      while (::waitpid(c.pid, nullptr, 0) < 0 && errno == EINTR) {
      }
    }
    throw;
  }
  return children;
}

// One attempt of every local rank.
AttemptEnd run_ranks(const Options& o, std::uint16_t port, const std::string& token, BlockedSignals& signals,
                     Coordinator& coordinator, int attempt, const LastFailure& last, Console& console) {
  coordinator.begin(attempt);
  // No restart mends either reason the ranks cannot start: the job ends on every node, and the
  // verdict names the reason.
  const auto cannot_start = [&](const Error& e) {
    coordinator.report(attempt, Failure{.node = o.node_rank, .code = 127, .restartable = false,
                                        .what = "coshard-run on " + this_host() + ": " + e.message()});
    return AttemptEnd{.rc = 127};
  };
  std::optional<FlightDir> flight;
  try {
    flight.emplace(attempt);
  } catch (const Error& e) {
    return cannot_start(e);
  }
  const Place at = place_of(o, coordinator.nodes());
  std::vector<Child> children;
  try {
    children = start_ranks(o, at, port, token, signals.old_mask, attempt, last, flight->path);
  } catch (const CannotStart& e) {
    // launch() checked the program before the store, but only exec can tell some reasons (a
    // format it does not run), and the file may have changed since.
    return cannot_start(e);
  }
  console.say("coshard-run: started %d rank(s) of %d; store at %s:%u\n", o.nproc_per_node,
              at.groups * o.nproc_per_node, o.master_addr.c_str(), static_cast<unsigned>(port));
  Supervisor supervisor(o, children, flight->path, coordinator, attempt, console);
  supervisor.watch(signals.fd.get());
  const int rc = supervisor.result();
  if (rc != 0) {
    std::vector<int> local;
    for (const auto& c : children) local.push_back(c.rank);
    const auto report = flight_report(flight->path, local);
    if (!report.empty()) console.say("coshard-run: flight records (in %s):\n", flight->path.c_str());
    for (const auto& line : report) console.say("coshard-run:   %s\n", line.c_str());
  }
  return AttemptEnd{.rc = rc, .interrupted = supervisor.interrupted(), .stop_requested = supervisor.stop_requested()};
}

// The job on this node, attempt after attempt; returns the exit code.
int run_job(const Options& o, BlockedSignals& signals, Console& console) {
  const std::string token = o.token.empty() ? random_token() : o.token;
  const auto store = host_store(o, token);
  auto coordinator = std::make_unique<Coordinator>(o, store->port, token, console);
  LastFailure last;
  for (int attempt = coordinator->first_attempt();; ++attempt) {
    AttemptEnd end;
    if (!coordinator->runs_ranks(attempt)) {
      coordinator->begin(attempt);  // no ranks of this node run in it: it ends now
    } else {
      end = run_ranks(o, store->port, token, signals, *coordinator, attempt, last, console);
    }
    const Verdict v = coordinator->finish(attempt, end);
    if (!v.restart && !end.interrupted && !end.stop_requested && coordinator->may_rejoin(attempt)) {
      // Node 0 goes on without this node: it joins again, as a launcher that comes late, once
      // the store answers (--join-timeout), and is taken in at the restart that this causes.
      console.say("coshard-run: node %d %s; trying to reach the store for up to %lld s (--join-timeout) to "
                  "be taken back in\n", o.node_rank, v.reason.c_str(), static_cast<long long>(o.join_timeout.count()));
      coordinator.reset();
      coordinator = std::make_unique<Coordinator>(o, store->port, token, console, attempt);
      attempt = coordinator->first_attempt() - 1;
      continue;
    }
    if (!v.restart) {
      if (v.code != 0) {
        console.say("coshard-run: the job %s (exit code %d): %s\n", v.stopped ? "stopped" : "failed", v.code,
                    v.reason.c_str());
      }
      return v.code;
    }
    const auto& nodes = coordinator->nodes();
    if (std::find(nodes.begin(), nodes.end(), o.node_rank) == nodes.end()) {
      // It was dropped, having been silent (frozen, or cut off) for longer than --rejoin-timeout,
      // or it asked in too late for this restart: the next one takes it in.
      if (attempt + 1 >= o.max_restarts) {
        console.say("coshard-run: node %d is left out of the job, which restarts without it: %s; no restart "
                    "is left to take it back in (--max-restarts %d)\n", o.node_rank, v.reason.c_str(),
                    o.max_restarts);
        return 1;
      }
      console.say("coshard-run: node %d is left out of restart %d: %s\n", o.node_rank, attempt + 1,
                  v.reason.c_str());
      // The restart's ranks have only just resumed from a checkpoint: nothing to save yet.
      coordinator->ask_in(attempt + 1, "its coshard-run was left out of restart " + std::to_string(attempt + 1) +
                                          " and asks to rejoin", false);
      continue;
    }
    console.say("coshard-run: restart %d of %d: %s; starting every rank again\n", attempt + 1,
                o.max_restarts, v.reason.c_str());
    last = LastFailure{.code = v.code, .rank = v.failed_rank};
  }
}

}  // namespace

int launch(const Options& o) {
  try {
    (void)find_program(o.command.at(0));  // before any store or rank exists
  } catch (const CannotStart& e) {
    std::fprintf(stderr, "coshard-run: %s\n", e.message().c_str());
    return 127;  // what a shell returns for a command it cannot run
  }
  BlockedSignals signals = block_signals();
  Console console(signals.fd.get());  // on the way out by an error, it waits 10 s at most for a stalled reader
  const int rc = run_job(o, signals, console);
  console.finish();
  return rc;
}

}  // namespace coshard::run
