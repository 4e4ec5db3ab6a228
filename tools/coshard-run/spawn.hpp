#pragma once
// Starting a rank from a process that already runs threads (the store's scheduler).
//
// Why everything is prepared before fork(): the child of a multi-threaded process may only make
// async-signal-safe calls until it execs. A lock that another thread held at the fork stays held
// in the child forever; glibc's malloc re-arms its own locks, but a sanitizer's allocator (GCC 12's
// ASan) does not, and neither does glibc's environment lock. A rank whose child side called
// putenv() (which reallocates environ) therefore hung before exec, alive and never registered,
// when the store thread was allocating at that moment: the flaky 8-rank rendezvous of issue #16.
// The child side below allocates nothing and takes no lock.
#include <signal.h>
#include <sys/types.h>

#include <string>
#include <vector>

#include "coshard/runtime/error.hpp"

namespace coshard::run {

// The program cannot be run at all (missing, a directory, no execute permission, a format exec
// does not know): no restart can help, so the launcher ends the job with exit code 127.
class CannotStart : public Error {
 public:
  explicit CannotStart(std::string message) : Error(Errc::bad_config, std::move(message)) {}
};

// The file that exec would run for `program`: itself when it names a path, else the first
// executable regular file of that name on PATH. Throws CannotStart naming the program and why.
std::string find_program(const std::string& program);

// A program with its arguments and its whole environment, resolved and laid out as the exec
// arrays before any fork.
class ChildCommand {
 public:
  // `command[0]` is found with find_program() (and throws as it does); `extra_env` entries
  // ("NAME=value") replace those of this process's environment with the same name.
  ChildCommand(const std::vector<std::string>& command, const std::vector<std::string>& extra_env);
  ChildCommand(const ChildCommand&) = delete;
  ChildCommand& operator=(const ChildCommand&) = delete;

  const std::string& path() const noexcept { return path_; }

 private:
  friend pid_t spawn_child(const ChildCommand&, int, int, const sigset_t&);
  std::string path_;
  std::vector<std::string> args_, env_;
  std::vector<char*> argv_, envp_;  // point into args_ and env_, null-terminated
};

// Forks and execs `cmd` in a process group of its own, with stdout/stderr on the given
// descriptors, `mask` as its signal mask, and SIGKILL when the launcher dies. Returns once the
// child has exec'd (or after 5 s without a word from it: then it is the supervisor's, as a rank). Throws Error(io) if fork fails, and CannotStart naming the reason when exec
// fails for good (ENOEXEC, EACCES, ...; the child is reaped then). A passing refusal (ETXTBSY,
// ENOMEM) is said on stderr and left to show as the child's exit status 127.
pid_t spawn_child(const ChildCommand& cmd, int out_fd, int err_fd, const sigset_t& mask);

}  // namespace coshard::run
