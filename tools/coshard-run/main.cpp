// coshard-run: a torchrun-like launcher for coshard programs.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <stdexcept>
#include <string>

#include "coordinator_internal.hpp"
#include "coshard/runtime/error.hpp"
#include "launcher.hpp"
#include "options.hpp"

int main(int argc, char** argv) {
  // A closed stdin, stdout or stderr (`coshard-run >&-`) would be the number of the next file
  // opened (the signalfd, a pipe to a rank), and the ranks' lines would go there: /dev/null then.
  for (int fd = 0; fd <= 2; ++fd) {
    if (::fcntl(fd, F_GETFD) < 0 && errno == EBADF) {
      const int null = ::open("/dev/null", fd == 0 ? O_RDONLY : O_WRONLY);
      if (null >= 0 && null != fd) ::close(null);  // lower numbers are open: it took `fd`, or failed
    }
  }
  auto parsed = coshard::run::parse_options(argc, argv, coshard::launch::process_env());
  if (!parsed.options) {
    if (!parsed.message.empty() && parsed.message.back() != '\n') parsed.message += '\n';
    std::fputs(parsed.message.c_str(), parsed.exit_code == 0 ? stdout : stderr);
    return parsed.exit_code;
  }
  const coshard::run::Options& options = *parsed.options;
  try {
    return coshard::run::launch(options);
  } catch (const coshard::Error& e) {
    std::fprintf(stderr, "coshard-run: %s\n", e.what());
    // SIGINT or SIGTERM ended a join (they stay pending, blocked): 128 + the signal, as after ranks ran.
    const int sig = e.code() == coshard::Errc::cancelled ? coshard::run::coord::pending_stop() : 0;
    return sig ? 128 + sig : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "coshard-run: %s\n", e.what());
    return 1;
  }
}
