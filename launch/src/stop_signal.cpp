#include "coshard/launch/stop_signal.hpp"

#include <signal.h>

#include <atomic>

#include "coshard/runtime/error.hpp"

namespace coshard::launch {
namespace {

// A signal handler can reach nothing but process-wide state. The request lives here rather than in
// the StopSignal, so that a handler still running on another thread while the StopSignal is
// destroyed stores to memory that stays.
std::atomic<bool> g_owned{false};      // a StopSignal exists
std::atomic<bool> g_requested{false};  // SIGUSR2 arrived since it was made
static_assert(std::atomic<bool>::is_always_lock_free, "the handler stores to it");

extern "C" void on_sigusr2(int) { g_requested.store(true); }

void set_action(void (*handler)(int)) {
  struct sigaction sa {};
  sa.sa_handler = handler;
  sa.sa_flags = SA_RESTART;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGUSR2, &sa, nullptr);
}

}  // namespace

StopSignal::StopSignal() {
  bool none = false;
  if (!g_owned.compare_exchange_strong(none, true)) {
    throw Error(Errc::internal, "a second StopSignal: SIGUSR2 already has one in this process");
  }
  g_requested = false;
  set_action(on_sigusr2);
  try {
    marker_.emplace(SIGUSR2);  // last: coshard-run may send SIGUSR2 from now on
  } catch (...) {
    set_action(SIG_IGN);
    g_owned = false;
    throw;
  }
}

StopSignal::~StopSignal() {
  marker_.reset();
  set_action(SIG_IGN);
  g_owned = false;
}

bool StopSignal::requested() const noexcept { return g_requested.load(); }

}  // namespace coshard::launch
