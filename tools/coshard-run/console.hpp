#pragma once
// The launcher's stdout and stderr, written without ever blocking its loop. A reader that stops
// reading (a paused pager or terminal, a stalled log shipper) would otherwise stop the loop in a
// write: no heartbeat to the other nodes, which then take this one for lost; no reaping, no
// signals passed on, no deadline kept. Lines wait in a queue instead. While it is full the
// launcher stops reading the ranks' pipes, so the ranks wait to write, as they would writing to
// that reader directly, and no line is dropped.
#include <poll.h>

#include <chrono>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

#include "child.hpp"

namespace coshard::run {

class LineSink {
 public:
  using Clock = std::chrono::steady_clock;
  // Past this much queued, the ranks' pipes to this stream are not read while ranks run.
  static constexpr std::size_t kRoom = std::size_t{4} << 20;

  // A pipe, FIFO or terminal gets a non-blocking description of its own (setting O_NONBLOCK on the
  // inherited one would set it for the shell and whoever else shares it); a socket is sent to
  // with MSG_DONTWAIT; anything else (a file), or one that cannot be opened again (no /proc, or
  // another user's terminal), is written a page at a time once it polls writable, which a pipe
  // takes without blocking and a terminal nearly always does.
  LineSink(int fd, const char* name);

  // Queues `text` and writes what the stream takes now. A stream that failed (EPIPE: its reader
  // ended) takes nothing more: the text is dropped.
  void add(std::string_view text);
  // Writes what the stream takes without blocking. Returns, once, what went wrong with it: the
  // caller says so on the other stream.
  std::optional<std::string> write_ready();
  bool has_room() const noexcept { return queued() < kRoom; }
  bool idle() const noexcept { return queued() == 0; }
  std::size_t queued() const noexcept { return text_.size() - head_; }
  // For poll: POLLOUT on the stream while text waits (fd -1, which poll skips, otherwise).
  pollfd want() const noexcept { return {idle() ? -1 : target(), POLLOUT, 0}; }
  // How long text has waited with none of it taken.
  Clock::duration stalled_for() const noexcept { return idle() ? Clock::duration{} : Clock::now() - progress_at_; }
  // Drops what waits; returns how many bytes that was.
  std::size_t drop() noexcept;
  const char* name() const noexcept { return name_; }

 private:
  int target() const noexcept { return own_.get() >= 0 ? own_.get() : fd_; }
  ssize_t write_some(std::size_t n);

  int fd_;
  UniqueFd own_;               // the non-blocking description, where one could be opened
  bool socket_ = false;
  const char* name_;
  std::string text_;
  std::size_t head_ = 0;  // text_ before it is written
  Clock::time_point progress_at_{};
  bool closed_ = false;       // EPIPE: its reader ended, nothing more is written
  bool said_failure_ = false;
};

// The two streams, for the launcher's loop and its own messages (which queue behind the ranks'
// lines, so they keep their order and never block either).
class Console {
 public:
  using Clock = LineSink::Clock;
  // `stop_fd`: the launcher's signalfd; SIGINT, SIGTERM, SIGHUP or SIGQUIT on it ends finish().
  explicit Console(int stop_fd) : stop_fd_(stop_fd) {}
  Console(const Console&) = delete;
  Console& operator=(const Console&) = delete;
  // Writes what waits (finish), giving a stalled reader 10 s: an error is on its way out.
  ~Console() { finish(std::chrono::seconds(10)); }

  LineSink out{1, "stdout"};
  LineSink err{2, "stderr"};

  // A launcher message on stderr, as printf: "coshard-run: " is not added.
  [[gnu::format(printf, 2, 3)]] void say(const char* format, ...);
  // Writes what each stream takes now; says on the other stream what failed, and once when one
  // has taken nothing for kStallWarning while text waits.
  void write_ready();
  // Waits `d` for the streams to take what waits, writing it as they do: the coordinator's waits
  // between attempts, which would otherwise hold back the end of the ranks' output.
  void wait(Clock::duration d);
  // Waits for what is queued to be written, as long as the readers take bytes; a stream that
  // has taken nothing for `stall` (counted from its last progress, maybe before this call) is given
  // up on: the rest is dropped, and that is said on the other one if it can take it. A stop
  // signal drops what waits at once; one that came before (pending: the job ended on it) leaves
  // it 10 s, and pending for the exit code.
  void finish(Clock::duration stall = std::chrono::minutes(5)) noexcept;

  static constexpr std::chrono::seconds kStallWarning{30};

 private:
  void note(LineSink& broken, const std::string& what);
  bool stop_signalled() const noexcept;

  int stop_fd_;
  bool warned_[2] = {false, false};
};

}  // namespace coshard::run
