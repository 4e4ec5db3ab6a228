#pragma once
// What the parts of the Coordinator share: coordinator_store.cpp keeps the launcher's connection
// to node 0's store (joining, beating), coordinator_cut.cpp reaches it again after a cut or gives
// it up, and coordinator.cpp runs the attempts over it (failures, the verdict).
#include <signal.h>

#include <chrono>
#include <cstddef>
#include <sstream>
#include <string>
#include <vector>

namespace coshard::run::coord {

using Clock = std::chrono::steady_clock;

// A node whose launcher stopped beating for this long is lost (its host crashed, or it was cut off).
// Well above a store call's own limit (kStoreCall), so one slow call never passes for silence.
inline constexpr auto kSilentFor = std::chrono::seconds(15);
inline constexpr auto kStoreCall = std::chrono::seconds(5);
inline constexpr auto kPoll = std::chrono::milliseconds(200);

// SIGINT or SIGTERM waiting for the launcher (they stay blocked, for its signalfd), or 0: the
// waits outside the supervisor honour them too.
inline int pending_stop() {
  sigset_t pending;
  if (::sigpending(&pending) != 0) return 0;
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT}) {
    if (sigismember(&pending, sig) == 1) return sig;
  }
  return 0;
}

// Whether SIGUSR2 waits for the launcher (its supervisor takes it while ranks run): a stop request
// that came between attempts still ends the job rather than letting it restart.
inline bool stop_pending() {
  sigset_t pending;
  return ::sigpending(&pending) == 0 && sigismember(&pending, SIGUSR2) == 1;
}

// The store key of `what` in `attempt` (coordinator.hpp lists them).
inline std::string attempt_key(int attempt, const std::string& what) {
  return "attempt/" + std::to_string(attempt) + "/" + what;
}

// "0, 1, 3-7, 9", for people: a run of three or more in a row is a range, so that a message about
// 65535 nodes stays a line (--nnodes MIN:MAX).
inline std::string node_list(const std::vector<int>& nodes) {
  std::string out;
  for (std::size_t i = 0; i < nodes.size();) {
    std::size_t j = i;
    while (j + 1 < nodes.size() && nodes[j + 1] == nodes[j] + 1) ++j;
    out += (out.empty() ? "" : ", ") + std::to_string(nodes[i]);
    if (j >= i + 2) {
      out += "-" + std::to_string(nodes[j]);
    } else if (j == i + 1) {
      out += ", " + std::to_string(nodes[j]);
    }
    i = j + 1;
  }
  return out;
}

// Nodes 0..n-1.
inline std::vector<int> every_node(int n) {
  std::vector<int> out(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) out[static_cast<std::size_t>(i)] = i;
  return out;
}

// "0 1 3", the store's form of a list of nodes (parse_nodes reads it back).
inline std::string node_words(const std::vector<int>& nodes) {
  std::string out;
  for (int n : nodes) out += (out.empty() ? "" : " ") + std::to_string(n);
  return out;
}

inline std::vector<int> parse_nodes(const std::string& s) {
  std::vector<int> out;
  std::istringstream in(s);
  for (int n; in >> n;) out.push_back(n);
  return out;
}

inline long long seconds_since(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::seconds>(Clock::now() - t).count();
}

// The shape and meaning of the launchers' records in the store. Raise it whenever one changes (a
// claim, a failure, a done string, a verdict), so that launchers of different builds refuse to
// run one job together rather than misread each other: a joining node compares it with node 0's,
// and node 0 with every other node's (a build from before it checks nothing), so every node
// agrees with every other. Claims made before it existed carry none (0).
inline constexpr int kProtocol = 3;  // 3: the claim gained --nnodes

// A claim is "<nproc> <max restarts> <min nodes> <host> <pid> <protocol> <take-in timeout s>
// <nodes>" (--nnodes N, or MAX of MIN:MAX);
// the fields after the pid are read as absent (0) from a build that did not write them. The
// protocol stays the sixth field in every version, so that any build can tell another's.
struct Claim {
  int nproc = 0, max_restarts = 0, min_nodes = 0;
  std::string host, pid;
  int protocol = 0, take_in_timeout = 0, nodes = 0;
  std::string describe() const { return "coshard-run pid " + pid + " on " + host; }
};

inline Claim parse_claim(const std::string& s) {
  Claim c;
  std::istringstream in(s);
  in >> c.nproc >> c.max_restarts >> c.min_nodes >> c.host >> c.pid;
  if (!(in >> c.protocol)) c.protocol = 0;
  if (!(in >> c.take_in_timeout)) c.take_in_timeout = 0;
  if (!(in >> c.nodes)) c.nodes = 0;
  return c;
}

// Why `who_there`'s launcher (its claim `there`) cannot run in one job with this one, `who_here`'s:
// it speaks another launcher protocol. Empty when it can.
inline std::string foreign_protocol(const std::string& who_there, const Claim& there, const std::string& who_here) {
  if (there.protocol == kProtocol) return "";
  return who_there + "'s launcher (" + there.describe() + ") speaks launcher protocol " +
         std::to_string(there.protocol) + (there.protocol == 0 ? " (a build from before protocol versions)" : "") +
         ", " + who_here + "'s protocol " + std::to_string(kProtocol) +
         ": launchers of different builds misread each other's records in the store. Start every node's coshard-run "
         "from the same coshard build";
}

}  // namespace coshard::run::coord
