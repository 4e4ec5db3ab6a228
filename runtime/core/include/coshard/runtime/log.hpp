#pragma once
/// \file
/// Where the library's own messages go: what it says of its own accord rather than returns as an
/// error (a warning, a note of what it chose, an error it has no caller to throw to, such as a
/// spawned task that failed or a checkpoint that failed while the engine went away).
#include <cstdio>
#include <functional>
#include <string_view>

namespace coshard {

/// How much a message matters: a note, a warning, or an error that has no caller to throw to.
enum class LogLevel { info, warning, error };

/// Receives each such message, one line without its newline. An embedding program routes them to
/// its own logger with Runtime::Options::log (and Scheduler::Options::log for a scheduler it makes
/// itself). Called from any of the library's threads (the scheduler's, a stream's, a
/// communicator's): it must be thread-safe, and must not call back into the library. Messages
/// written just before the process aborts (a CUDA call from a host callback, a host access to
/// discrete memory) go to stderr regardless, so that they are seen.
using LogSink = std::function<void(LogLevel, std::string_view)>;

/// The default: "coshard: <message>" on stderr, "coshard: warning: <message>" for a warning.
inline void log_to_stderr(LogLevel level, std::string_view message) {
  std::fprintf(stderr, "coshard: %s%.*s\n", level == LogLevel::warning ? "warning: " : "",
               static_cast<int>(message.size()), message.data());
}

/// `message` to `sink`, or to stderr when no sink is set.
inline void log(const LogSink& sink, LogLevel level, std::string_view message) {
  if (sink) {
    sink(level, message);
  } else {
    log_to_stderr(level, message);
  }
}

}  // namespace coshard
