#include "dir_lock.hpp"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <fstream>
#include <utility>

#include "coshard/runtime/error.hpp"
#include "coshard/launch/hosts.hpp"

namespace coshard::train {
namespace fs = std::filesystem;

namespace {

// The job this process belongs to, when a scheduler says ("-" otherwise).
std::string job_id() {
  const char* slurm = std::getenv("SLURM_JOB_ID");
  return slurm && *slurm ? std::string("slurm:") + slurm : "-";
}

// The beat, of fixed width: a refresh rewrites the record in place, never shorter or empty.
std::string record(const std::string& me, unsigned long long beat) {
  char b[32];
  std::snprintf(b, sizeof b, " %012llu\n", beat % 1000000000000ULL);
  return me + b;
}

struct Holder {
  long pid = 0;
  std::string host, job, beat;  // a lock of a build before the beat has none
  std::string me() const { return std::to_string(pid) + " " + host + " " + job; }
};

// The lock's holder; empty fields when it cannot be read (or is gone).
Holder holder(const fs::path& lock) {
  std::ifstream f(lock);
  Holder h;
  f >> h.pid >> h.host >> h.job >> h.beat;
  return h;
}

enum class Watched { stood_still, beat, changed };

// A lock of this job on another host: whether its holder beats within kStale.
Watched watch(const fs::path& path, const Holder& first) {
  std::fprintf(stderr,
               "gpt2-train: %s is held by pid %ld on host %s of this Slurm job (%s); taking it over unless its "
               "holder refreshes it within %lld s\n",
               path.c_str(), first.pid, first.host.c_str(), first.job.c_str(),
               static_cast<long long>(DirLock::kStale.count()));
  for (const auto until = std::chrono::steady_clock::now() + DirLock::kStale; std::chrono::steady_clock::now() < until;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
    const Holder now = holder(path);
    if (now.me() != first.me()) return Watched::changed;  // released, or taken by another
    if (now.beat != first.beat) return Watched::beat;
  }
  return Watched::stood_still;
}

}  // namespace

DirLock::DirLock(fs::path path)
    : path_(std::move(path)), me_(std::to_string(::getpid()) + " " + launch::this_host() + " " + job_id()) {
  take();
  try {
    beats_ = std::jthread([this](std::stop_token stop) { beat(std::move(stop)); });
  } catch (...) {
    ::unlink(path_.c_str());
    fd_.reset();
    throw;
  }
}

DirLock::~DirLock() {
  beats_.request_stop();
  if (beats_.joinable()) beats_.join();
  // Only a lock that is still ours: another job may have taken it over (and be writing there).
  if (holder(path_).me() == me_) {
    std::error_code ec;
    fs::remove(path_, ec);
  }
}

void DirLock::take() {
  for (int attempt = 0; attempt < 3; ++attempt) {
    UniqueFd fd(::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
    if (fd) {
      const std::string rec = record(me_, 0);
      // Flushed, as every beat is: the file stays open, and NFS sends a write to the server at the
      // latest at close, where a full disk or quota may first show (another host would read an
      // empty lock). A file system that cannot flush (EINVAL, EROFS) keeps the write as it is.
      const bool wrote = ::write(fd.get(), rec.data(), rec.size()) == static_cast<ssize_t>(rec.size()) &&
                         (::fdatasync(fd.get()) == 0 || errno == EINVAL || errno == EROFS || errno == ENOTSUP);
      if (!wrote) {
        const int err = errno;
        fd.reset();
        ::unlink(path_.c_str());  // an empty lock would keep every later run out
        throw Error(Errc::io, "cannot write the lock " + path_.string() + ": " + std::strerror(err));
      }
      fd_ = std::move(fd);
      return;
    }
    if (errno != EEXIST) throw Error(Errc::io, "cannot create the lock " + path_.string() + ": " + std::strerror(errno));
    const Holder h = holder(path_);
    // A number past pid_t's range is no process's: cast, 4294967297 named pid 1, which is always alive.
    if (h.pid <= 0 || h.pid > std::numeric_limits<pid_t>::max() || h.host.empty()) {
      throw Error(Errc::bad_config, "the lock " + path_.string() + " of --checkpoint-dir names no job (it is empty or "
                                    "unreadable, or names no possible pid: a job that died while writing it, a full "
                                    "disk, a damaged file): remove it if no "
                                    "job writes to " + path_.parent_path().string());
    }
    // On this host the process decides: two steps of one allocation share the job id. On another,
    // a lock of this job is gone once its beat stands still (a Slurm requeue may land elsewhere).
    const bool here = h.host == launch::this_host();
    const bool dead =
        here && (h.pid == ::getpid() || (::kill(static_cast<pid_t>(h.pid), 0) != 0 && errno == ESRCH));
    const bool this_job_elsewhere = !here && !h.job.empty() && h.job != "-" && h.job == job_id();
    const Watched seen = this_job_elsewhere ? watch(path_, h) : Watched::beat;
    if (seen == Watched::changed) continue;
    if (!dead && seen != Watched::stood_still) {
      throw Error(Errc::bad_config,
                  "--checkpoint-dir " + path_.parent_path().string() + " is in use by another job (pid " +
                      std::to_string(h.pid) + " on host " + h.host + ", see " + path_.string() + ")" +
                      (this_job_elsewhere ? ", a step of this Slurm job that refreshed the lock within " +
                                                std::to_string(kStale.count()) + " s"
                                          : "") +
                      ": give another directory, or remove the lock if that job is gone");
    }
    std::fprintf(stderr, "gpt2-train: taking over %s from pid %ld on host %s, which is gone\n", path_.c_str(), h.pid,
                 h.host.c_str());
    set_aside(h.me());
  }
  throw Error(Errc::io, "cannot take the lock " + path_.string() + ": another job keeps taking it");
}

// Removes the lock of `gone` ("pid host job"), and only that one: two processes that judged it gone at the same time
// (two steps of a requeued job) would each remove what is there, the other's fresh lock included,
// and both go on. Renamed aside first, which one of them alone can do, and put back when it proved
// to be another's; then take() tries again.
void DirLock::set_aside(const std::string& gone) {
  const fs::path aside = path_.string() + ".gone-" + me_.substr(0, me_.find(' ')) + "-" + launch::this_host();
  if (::rename(path_.c_str(), aside.c_str()) != 0) return;  // another took it aside first
  if (holder(aside).me() != gone && ::link(aside.c_str(), path_.c_str()) != 0) {
    std::fprintf(stderr, "gpt2-train: warning: the lock %s of pid %ld on host %s, taken aside for a moment, could not "
                 "be put back (%s); it is kept as %s\n", path_.c_str(), holder(aside).pid, holder(aside).host.c_str(),
                 std::strerror(errno), aside.c_str());
    return;
  }
  ::unlink(aside.c_str());
}

// Rewrites the record with the next beat while the lock is still this process's. A refresh that
// fails (a passing NFS error) is tried again at the next beat. A lock that another took over (this
// process stood still for kStale, and a step of its job elsewhere judged it gone) ends the beats,
// and check() says so. The beat goes to the file this process created, through the descriptor it
// kept: a takeover puts another file at the path, so a beat that a stall held between the check
// and the write lands in the old file, never over the new holder's record.
void DirLock::beat(std::stop_token stop) {
  std::unique_lock lock(mu_);
  for (unsigned long long n = 1;; ++n) {
    if (wake_.wait_for(lock, stop, kBeat, [] { return false; }) || stop.stop_requested()) return;
    const Holder h = holder(path_);
    if (h.pid > 0 && h.me() != me_) {
      lost_to_ = "pid " + std::to_string(h.pid) + " on host " + h.host;
      return;
    }
    const std::string rec = record(me_, n);
    if (::pwrite(fd_.get(), rec.data(), rec.size(), 0) == static_cast<ssize_t>(rec.size())) ::fdatasync(fd_.get());
  }
}

void DirLock::check() {
  std::lock_guard g(mu_);
  if (lost_to_.empty()) return;
  throw Error(Errc::bad_config, "this job's lock " + path_.string() + " was taken over by " + lost_to_ +
                                    " (this process stood still for longer than " + std::to_string(kStale.count()) +
                                    " s?): two jobs now write to --checkpoint-dir " + path_.parent_path().string() +
                                    "; stopping rather than remove checkpoints that may be the other's");
}

}  // namespace coshard::train
