#pragma once
// DIR/.lock of --checkpoint-dir: the job that writes there, as "pid host job beat". Its holder
// raises the beat every kBeat, so that a process on another host can tell a live holder from one
// whose host died: what kill(pid, 0) tells on the holder's own host only.
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <mutex>
#include <stop_token>
#include <string>
#include <thread>

#include "coshard/runtime/unique_fd.hpp"

namespace coshard::train {

class DirLock {
 public:
  static constexpr auto kBeat = std::chrono::seconds(5);
  // A lock of this Slurm job on another host whose beat stood still this long is taken over.
  static constexpr auto kStale = std::chrono::seconds(15);

  // Takes `path`, or throws naming the job that holds it. Taken over: the lock of a process of
  // this host that no longer exists, and that of this Slurm job on another host whose beat stood
  // still for kStale (its host died and Slurm requeued the job elsewhere); a live step of this
  // job on another host is refused as any other job.
  explicit DirLock(std::filesystem::path path);
  // Removes the lock while it is still this process's.
  ~DirLock();
  DirLock(const DirLock&) = delete;
  DirLock& operator=(const DirLock&) = delete;
  // Throws once another process took the lock over (this one stood still for kStale): before
  // anything is removed under DIR.
  void check();

 private:
  void take();
  void set_aside(const std::string& gone);
  void beat(std::stop_token stop);

  std::filesystem::path path_;
  std::string me_;  // "pid host job": the record less its beat
  UniqueFd fd_;     // the lock file this process created, which the beats rewrite
  std::mutex mu_;
  std::string lost_to_;  // who took the lock over (mu_)
  std::condition_variable_any wake_;
  std::jthread beats_;
};

}  // namespace coshard::train
