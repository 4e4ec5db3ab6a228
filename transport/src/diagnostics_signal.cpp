#include "coshard/transport/diagnostics_signal.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

#include "coshard/runtime/error.hpp"
#include "coshard/transport/flight_recorder.hpp"

namespace coshard::transport {
namespace {

// A signal handler can reach nothing but process-wide state: the write end of the pipe of the one
// DiagnosticsSignal that exists (-1: none).
std::atomic<int> g_wake_fd{-1};

extern "C" void on_sigusr1(int) {
  const int saved = errno;
  const int fd = g_wake_fd.load();
  if (fd >= 0) {
    const char byte = 1;
    ssize_t ignored = ::write(fd, &byte, 1);  // a full pipe already holds a wake-up
    (void)ignored;
  }
  errno = saved;
}

}  // namespace

DiagnosticsSignal::DiagnosticsSignal() {
  wake_ = make_pipe(O_CLOEXEC | O_NONBLOCK);
  if (!wake_[0]) {
    throw Error(Errc::io, "cannot make the SIGUSR1 pipe: " + std::string(std::strerror(errno)));
  }
  int none = -1;
  if (!g_wake_fd.compare_exchange_strong(none, wake_[1].get())) {
    throw Error(Errc::internal, "a second DiagnosticsSignal: SIGUSR1 already has one in this process");
  }
  struct sigaction sa {};
  sa.sa_handler = on_sigusr1;
  sa.sa_flags = SA_RESTART;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGUSR1, &sa, nullptr);
  marker_.emplace(SIGUSR1);  // last: coshard-run may send SIGUSR1 from now on
}

DiagnosticsSignal::~DiagnosticsSignal() {
  stop();
  marker_.reset();
  struct sigaction sa {};
  sa.sa_handler = SIG_IGN;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGUSR1, &sa, nullptr);
  g_wake_fd = -1;  // before wake_ closes: the handler must not write to a descriptor reused since
}

DiagnosticsSignal::Serving DiagnosticsSignal::serve(Runtime& rt) {
  stop();
  stop_ = false;
  // Registered before the thread starts: nothing may throw once it runs without a Serving to stop it.
  const auto suspended = rt.add_diagnostic([&rt] { dump_suspended(rt.scheduler(), rt.rank()); });
  thread_ = std::thread([this, &rt] {
    while (!stop_.load()) {
      pollfd p{wake_[0].get(), POLLIN, 0};
      if (::poll(&p, 1, 200) <= 0) continue;  // 200 ms: how soon stop() is seen
      char drain[64];
      while (::read(wake_[0].get(), drain, sizeof drain) > 0) {
      }
      rt.write_diagnostics();
      rt.log(LogLevel::info, "rank " + std::to_string(rt.rank()) + ": flight records written (SIGUSR1)");
    }
  });
  return Serving(*this, rt, suspended);
}

void DiagnosticsSignal::stop() noexcept {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

}  // namespace coshard::transport
