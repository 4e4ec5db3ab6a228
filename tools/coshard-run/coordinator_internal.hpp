#pragma once
// What the two halves of the Coordinator share: coordinator_store.cpp keeps the launcher's
// connection to node 0's store (joining, beating, reaching it again after a cut), and
// coordinator.cpp runs the attempts over it (failures, the verdict).
#include <signal.h>

#include <chrono>
#include <sstream>
#include <string>

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
  for (int sig : {SIGINT, SIGTERM}) {
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

inline long long seconds_since(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::seconds>(Clock::now() - t).count();
}

// A claim is "<nproc> <max restarts> <host> <pid>".
struct Claim {
  int nproc = 0, max_restarts = 0;
  std::string host, pid;
  std::string describe() const { return "coshard-run pid " + pid + " on " + host; }
};

inline Claim parse_claim(const std::string& s) {
  Claim c;
  std::istringstream in(s);
  in >> c.nproc >> c.max_restarts >> c.host >> c.pid;
  return c;
}

}  // namespace coshard::run::coord
