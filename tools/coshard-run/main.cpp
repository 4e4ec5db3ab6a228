// coshard-run: a torchrun-like launcher for coshard programs.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <stdexcept>

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
  coshard::run::Options options;
  try {
    options = coshard::run::parse_options(argc, argv, coshard::launch::process_env());
  } catch (const std::invalid_argument& e) {
    if (!*e.what()) {  // --help
      std::fputs(coshard::run::usage().c_str(), stdout);
      return 0;
    }
    std::fprintf(stderr, "coshard-run: %s (coshard-run --help shows the usage)\n", e.what());
    return 2;
  }
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
