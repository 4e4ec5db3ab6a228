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

}  // namespace coshard::run::coord
