#include "coshard/launch/signal_marker.hpp"

#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#include "coshard/runtime/error.hpp"

namespace coshard::launch {

std::string signal_marker_name(int sig, long pid) {
  if (sig != SIGUSR1 && sig != SIGUSR2) {
    throw Error(Errc::internal, "no signal marker for signal " + std::to_string(sig) + " (only SIGUSR1 and SIGUSR2)");
  }
  return std::string(sig == SIGUSR1 ? "coshard-sigusr1-" : "coshard-sigusr2-") + std::to_string(pid);
}

SignalMarker::SignalMarker(int sig) {
  const std::string name = signal_marker_name(sig, static_cast<long>(::getpid()));
  const char* dir = std::getenv("COSHARD_FLIGHT_DIR");
  if (!dir || !*dir) return;
  const std::string path = std::string(dir) + "/" + name;
  if (FILE* f = std::fopen(path.c_str(), "w")) {
    std::fclose(f);
    path_ = path;
  }
}

SignalMarker::~SignalMarker() {
  if (!path_.empty()) std::remove(path_.c_str());
}

}  // namespace coshard::launch
