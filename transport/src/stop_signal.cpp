#include "coshard/transport/stop_signal.hpp"

#include <signal.h>

#include "coshard/runtime/error.hpp"

namespace coshard::transport {
namespace {

// A signal handler can reach nothing but process-wide state: the flag of the one StopSignal that
// exists (null: none).
std::atomic<std::atomic<bool>*> g_requested{nullptr};
static_assert(std::atomic<bool>::is_always_lock_free, "the handler stores to it");

extern "C" void on_sigusr2(int) {
  if (std::atomic<bool>* flag = g_requested.load()) flag->store(true);
}

void set_action(void (*handler)(int)) {
  struct sigaction sa {};
  sa.sa_handler = handler;
  sa.sa_flags = SA_RESTART;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGUSR2, &sa, nullptr);
}

}  // namespace

StopSignal::StopSignal() {
  std::atomic<bool>* none = nullptr;
  if (!g_requested.compare_exchange_strong(none, &requested_)) {
    throw Error(Errc::internal, "a second StopSignal: SIGUSR2 already has one in this process");
  }
  set_action(on_sigusr2);
  try {
    marker_.emplace(SIGUSR2);  // last: coshard-run may send SIGUSR2 from now on
  } catch (...) {
    set_action(SIG_IGN);
    g_requested = nullptr;
    throw;
  }
}

StopSignal::~StopSignal() {
  marker_.reset();
  set_action(SIG_IGN);
  g_requested = nullptr;
}

}  // namespace coshard::transport
