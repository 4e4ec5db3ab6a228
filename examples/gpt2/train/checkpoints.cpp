#include "checkpoints.hpp"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>

#include "coshard/runtime/error.hpp"
#include "coshard/runtime/file_io.hpp"

namespace coshard::train {
namespace fs = std::filesystem;

namespace {

constexpr const char* kLatest = "latest";
constexpr const char* kLock = ".lock";

std::string hostname() {
  char h[256] = {};
  ::gethostname(h, sizeof h - 1);
  return h;
}

std::optional<int> step_of(const fs::path& dir) {
  const std::string name = dir.filename().string();
  if (name.size() != 13 || !name.starts_with("step-")) return std::nullopt;
  for (char c : name.substr(5)) {
    if (c < '0' || c > '9') return std::nullopt;
  }
  return std::stoi(name.substr(5));
}

// The lock's holder ("pid host"); empty when it cannot be read.
std::pair<long, std::string> holder(const fs::path& lock) {
  std::ifstream f(lock);
  long pid = 0;
  std::string host;
  f >> pid >> host;
  return {pid, host};
}

}  // namespace

CheckpointDir::~CheckpointDir() {
  if (locked_) {
    std::error_code ec;
    fs::remove(root_ / kLock, ec);
  }
}

void CheckpointDir::lock() {
  fs::create_directories(root_);
  const fs::path path = root_ / kLock;
  const std::string me = std::to_string(::getpid()) + " " + hostname() + "\n";
  for (int attempt = 0; attempt < 2; ++attempt) {
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd >= 0) {
      const bool ok = ::write(fd, me.data(), me.size()) == static_cast<ssize_t>(me.size());
      ::close(fd);
      if (!ok) throw Error(Errc::io, "cannot write the lock " + path.string() + ": " + std::strerror(errno));
      locked_ = true;
      return;
    }
    if (errno != EEXIST) throw Error(Errc::io, "cannot create the lock " + path.string() + ": " + std::strerror(errno));
    const auto [pid, host] = holder(path);
    const bool gone = host == hostname() && pid > 0 && ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH;
    if (!gone) {
      throw Error(Errc::bad_config, "--checkpoint-dir " + root_.string() + " is in use by another job (pid " +
                                        std::to_string(pid) + " on host " + host + ", see " + path.string() +
                                        "): give another directory, or remove the lock if that job is gone");
    }
    std::fprintf(stderr, "gpt2-train: taking over %s from pid %ld, which is gone\n", path.c_str(), pid);
    fs::remove(path);
  }
  throw Error(Errc::io, "cannot take the lock " + path.string() + ": another job keeps taking it");
}

fs::path CheckpointDir::step_dir(int step) const {
  char name[32];
  std::snprintf(name, sizeof name, "step-%08d", step);
  return root_ / name;
}

std::map<int, fs::path> CheckpointDir::complete() const {
  std::map<int, fs::path> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(root_, ec)) {
    if (auto s = step_of(e.path()); s && fsdp::is_checkpoint(e.path())) out[*s] = e.path();
  }
  return out;
}

std::optional<fs::path> CheckpointDir::latest() const {
  std::ifstream f(root_ / kLatest);
  std::string name;
  if (f >> name && step_of(root_ / name) && fsdp::is_checkpoint(root_ / name)) return root_ / name;
  const auto all = complete();  // the pointer is missing or stale (a crash between save and pointer)
  if (all.empty()) return std::nullopt;
  return all.rbegin()->second;
}

void CheckpointDir::commit(int step, int keep) {
  write_atomic(root_ / kLatest, step_dir(step).filename().string() + "\n");
  const auto all = complete();
  int kept = 0;
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    if (it->first <= step && ++kept > keep) fs::remove_all(it->second);
  }
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(root_, ec)) {
    if (auto s = step_of(e.path()); s && *s < step && !fsdp::is_checkpoint(e.path())) fs::remove_all(e.path());
  }
}

fsdp::CheckpointMetadata training_state(const TrainOptions& o, int world, int steps_done) {
  return {{"step", std::to_string(steps_done)},
          {"global_batch", std::to_string(static_cast<long long>(world) * o.batch * o.grad_accum)},
          {"seq", std::to_string(o.seq)},
          {"seed", std::to_string(o.seed)},
          {"shuffle", o.shuffle ? "true" : "false"},
          {"data", o.data.empty() ? "embedded" : fs::absolute(o.data).string()},
          {"lr", std::to_string(o.lr)},
          {"lr_schedule", o.lr_schedule},
          {"warmup_steps", std::to_string(o.warmup_steps)},
          {"steps", std::to_string(o.steps)},
          {"model", o.model}};
}

int resume_step(const fsdp::CheckpointMetadata& state, const TrainOptions& o, int world, const std::string& where) {
  const auto now = training_state(o, world, 0);
  if (state.count("imported_from")) {  // coshard-ckpt import: a model and a fresh optimizer, no run to continue
    if (state.count("model") && state.at("model") != o.model) {
      throw Error(Errc::bad_config, "checkpoint " + where + " holds model " + state.at("model") + ", not --model " + o.model);
    }
    return 0;
  }
  static const std::map<std::string, std::string> fix{
      {"global_batch", "ranks x --batch x --grad-accum"}, {"seq", "--seq"},     {"seed", "--seed"},
      {"shuffle", "--shuffle"},   {"data", "--data"},   {"lr", "--lr"},        {"lr_schedule", "--lr-schedule"},
      {"warmup_steps", "--warmup-steps"}, {"steps", "--steps"}, {"model", "--model"}};
  for (const auto& [key, flag] : fix) {
    auto it = state.find(key);
    if (it == state.end()) throw Error(Errc::corrupt_file, "checkpoint " + where + " has no '" + key + "' in its training state");
    if (it->second != now.at(key)) {
      throw Error(Errc::bad_config, "checkpoint " + where + " was trained with " + key + " = " + it->second +
                                        " and this run has " + now.at(key) + ": set " + flag +
                                        " as it was to continue that run exactly");
    }
  }
  const int step = std::stoi(state.at("step"));
  if (step > o.steps) {
    throw Error(Errc::bad_config, "checkpoint " + where + " is at step " + std::to_string(step) + ", past --steps " +
                                      std::to_string(o.steps));
  }
  return step;
}

std::optional<fs::path> checkpoint_to_resume(const TrainOptions& o) {
  std::optional<fs::path> from;
  if (o.resume == "auto") {
    from = CheckpointDir(o.checkpoint_dir).latest();
  } else if (!o.resume.empty()) {
    if (!fsdp::is_checkpoint(o.resume)) {
      throw Error(Errc::bad_config, "--resume " + o.resume + " is not a checkpoint (it has no " + fsdp::kManifestName +
                                        "; an interrupted save leaves none): give a complete one, or --resume auto");
    }
    from = fs::path(o.resume);
  }
  if (o.checkpoint_dir.empty()) return from;
  const auto done = CheckpointDir(o.checkpoint_dir).complete();
  const int resumed = from ? step_of(*from).value_or(-1) : -1;
  if (!done.empty() && !from) {
    throw Error(Errc::bad_config, "--checkpoint-dir " + o.checkpoint_dir + " already holds checkpoints (the newest is " +
                                      done.rbegin()->second.filename().string() +
                                      "): pass --resume auto to continue from it, or give an empty directory");
  }
  if (!done.empty() && done.rbegin()->first > resumed) {
    throw Error(Errc::bad_config, "--checkpoint-dir " + o.checkpoint_dir + " holds " +
                                      done.rbegin()->second.filename().string() + ", newer than the checkpoint resumed: "
                                      "continuing would overwrite it. Move it away or give another --checkpoint-dir");
  }
  return from;
}

}  // namespace coshard::train
