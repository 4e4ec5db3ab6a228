#pragma once
// A local rank as the launcher sees it: its process and the pipes of its stdout and stderr.
#include <sys/types.h>
#include <unistd.h>

#include <string>

#include "coshard/runtime/unique_fd.hpp"

namespace coshard::run {

// One stream of a child: buffered so each line is written whole, with its rank in front.
struct Output {
  UniqueFd fd;
  bool to_stderr = false;  // else to stdout
  std::string pending;
};

struct Child {
  int rank = 0;
  pid_t pid = -1;
  bool running = false;
  int status = 0;
  bool takes_stop = false;     // seen taking SIGUSR2 (launch::StopSignal): its exit code 75 is no failure
  bool asked_to_stop = false;  // SIGUSR2 passed on to it
  bool group_gone = false;     // its process group was seen empty after it ended: never signalled again
  Output out, err;
};

}  // namespace coshard::run
