#include "checkpoints.hpp"

#include <cstdio>

#include "coshard/runtime/error.hpp"
#include "coshard/runtime/file_io.hpp"
#include "coshard/runtime/parse_whole.hpp"

namespace coshard::train {
namespace fs = std::filesystem;

namespace {

constexpr const char* kLatest = "latest";

// step-NNNNNNNN: eight digits, nine from step 100000000 (--steps allows it).
std::optional<int> step_of(const fs::path& dir) {
  const std::string name = dir.filename().string();
  if (name.size() < 13 || name.size() > 14 || !name.starts_with("step-")) return std::nullopt;
  if (name[5] < '0' || name[5] > '9') return std::nullopt;  // no sign
  return parse_whole<int>(std::string_view(name).substr(5));
}

}  // namespace

void CheckpointDir::lock() {
  std::error_code ec;
  fs::create_directories(root_, ec);
  if (ec || !fs::is_directory(root_)) {
    throw Error(Errc::io, "--checkpoint-dir " + root_.string() + " cannot be made a directory for checkpoints (" +
                              (ec ? ec.message() : std::string("a file of that name exists")) +
                              "): give a directory this user can write, or one to create");
  }
  lock_ = std::make_unique<DirLock>(root_ / ".lock");
}

fs::path CheckpointDir::step_dir(int step) const {
  char name[32];
  std::snprintf(name, sizeof name, "step-%08d", step);
  return root_ / name;
}

std::map<int, fs::path> CheckpointDir::complete() const {
  std::map<int, fs::path> out;
  std::error_code ec;
  fs::directory_iterator it(root_, ec);
  if (ec && ec != std::errc::no_such_file_or_directory) {
    // Not "no checkpoints": --resume auto would start afresh and then replace them.
    throw Error(Errc::io, "cannot list --checkpoint-dir " + root_.string() + ": " + ec.message() +
                              "; make it readable (or give another directory)");
  }
  for (const auto& e : it) {
    if (auto s = step_of(e.path()); s && fsdp::is_checkpoint(e.path())) out[*s] = e.path();
  }
  return out;
}

std::optional<fs::path> CheckpointDir::latest() const {
  // A complete manifest is the truth; DIR/latest may lag it (a job killed between the manifest
  // and the pointer), so the newest complete checkpoint wins.
  const auto all = complete();
  if (all.empty()) return std::nullopt;
  return all.rbegin()->second;
}

namespace {
// Unlinks the manifest first, so that an interrupted removal never leaves one over missing files.
void remove_checkpoint(const fs::path& dir) {
  fs::remove(dir / fsdp::kManifestName);
  sync_directory(dir);
  fs::remove_all(dir);
}
}  // namespace

void CheckpointDir::commit(int step, int keep) {
  if (lock_) lock_->check();  // outside the try: a lock lost ends the job, not a warning
  try {
    write_atomic(root_ / kLatest, step_dir(step).filename().string() + "\n");
    const auto all = complete();
    int kept = 0;
    for (auto it = all.rbegin(); it != all.rend(); ++it) {
      if (it->first <= step && ++kept > keep) remove_checkpoint(it->second);
    }
    std::error_code ec;
    // Every rank's files of this checkpoint are written (its manifest is): what a save killed
    // mid-write left in the same directory (NAME.tmp.PID, 65 MB a rank of GPT-2 124M) goes.
    for (const auto& e : fs::directory_iterator(step_dir(step), ec)) {
      if (e.path().filename().string().find(".tmp.") != std::string::npos) fs::remove(e.path(), ec);
    }
    for (const auto& e : fs::directory_iterator(root_, ec)) {
      // Only where the manifest is surely absent: a stat that failed for a moment is no proof.
      std::error_code stat;
      const bool unfinished = fs::status(e.path() / fsdp::kManifestName, stat).type() == fs::file_type::not_found;
      if (auto s = step_of(e.path()); s && *s < step && unfinished) fs::remove_all(e.path());
    }
  } catch (const std::exception& e) {
    // The checkpoint itself is complete; only the bookkeeping around it failed.
    std::fprintf(stderr, "gpt2-train: warning: checkpoint %s is complete, but updating %s failed: %s\n",
                 step_dir(step).c_str(), root_.c_str(), e.what());
  }
}

void CheckpointDir::discard(int step) { remove_checkpoint(step_dir(step)); }

namespace {
}  // namespace

std::string exact_number(double v) {
  char b[40];
  std::snprintf(b, sizeof b, "%.17g", v);
  return b;
}

fsdp::CheckpointMetadata training_state(const TrainOptions& o, const DataIdentity& data, int world, int steps_done) {
  fsdp::CheckpointMetadata m{{"step", std::to_string(steps_done)},
                             {"global_batch", std::to_string(static_cast<long long>(world) * o.batch * o.grad_accum)},
                             {"seq", std::to_string(o.seq)},
                             {"seed", std::to_string(o.seed)},
                             {"shuffle", o.shuffle ? "true" : "false"},
                             {"data", o.data.empty() ? "embedded" : fs::absolute(o.data).lexically_normal().string()},
                             {"data_identity", data.data},
                             {"val_fraction", exact_number(o.val_fraction)},
                             {"lr", exact_number(o.lr)},
                             {"lr_schedule", o.lr_schedule},
                             {"warmup_steps", std::to_string(o.warmup_steps)},
                             {"steps", std::to_string(o.steps)},
                             {"model", o.config.to_string()}};
  if (!data.val_data.empty()) m["val_data_identity"] = data.val_data;
  return m;
}

int stored_step(const fsdp::CheckpointMetadata& state, const std::string& where) {
  const auto it = state.find("step");
  const int step = it == state.end() ? -1 : parse_whole<int>(it->second).value_or(-1);
  if (step < 0) {
    throw Error(Errc::corrupt_file, "checkpoint " + where + " has " +
                                        (it == state.end() ? std::string("no step") : "step '" + it->second + "'") +
                                        " in its training state, not a step number: it is damaged (or not "
                                        "gpt2-train's); resume from an earlier one");
  }
  return step;
}

void check_step_counts(const fsdp::Manifest& m, int step, const std::string& where) {
  if (m.metadata.count("imported_from") || m.optimizer != "adamw") return;
  for (const auto& u : m.units) {
    if (u.optimizer_step == step) continue;
    throw Error(Errc::corrupt_file, "checkpoint " + where + " names step " + std::to_string(step) + ", but unit '" + u.name +
                                        "' has taken " + std::to_string(u.optimizer_step) +
                                        " optimizer steps: its training state and its units' step counts disagree, so it "
                                        "is damaged (or edited); resume from an earlier one");
  }
}

namespace {

// The model a checkpoint names, by meaning: "tiny" and "tiny,tie_head=true" are one model.
bool same_model(const std::string& stored, const TrainOptions& o) {
  if (stored == o.model || stored == o.config.to_string()) return true;
  try {
    return ModelConfig::parse(stored) == o.config;
  } catch (const std::exception&) {
    return false;
  }
}

// What a resume checks beyond the flags of the table: the model by meaning, the data by its
// identity (by its path in a checkpoint that has none), and the validation split where recorded.
void check_model_and_data(const fsdp::CheckpointMetadata& state, const TrainOptions& o, const DataIdentity& data,
                          const fsdp::CheckpointMetadata& now, const std::string& where) {
  const auto refuse = [&](const std::string& what, const std::string& was, const std::string& is, const std::string& fix) {
    return Error(Errc::bad_config, "checkpoint " + where + " was trained with " + what + " " + was + " and this run has " +
                                       is + ": " + fix + " to continue that run exactly");
  };
  const auto model = state.find("model");
  if (model == state.end()) throw Error(Errc::corrupt_file, "checkpoint " + where + " has no 'model' in its training state");
  if (!same_model(model->second, o)) throw refuse("model", model->second, now.at("model"), "set --model as it was");
  if (const auto id = state.find("data_identity"); id != state.end()) {
    if (id->second != data.data) {
      throw refuse("data of", id->second, data.data + " (" + now.at("data") + ")",
                   "give the --data it was trained on (its content, wherever it lies now)");
    }
  } else {
    const auto path = state.find("data");
    if (path == state.end()) throw Error(Errc::corrupt_file, "checkpoint " + where + " has no 'data' in its training state");
    const std::string stored = path->second == "embedded" ? path->second : fs::path(path->second).lexically_normal().string();
    if (stored != now.at("data")) throw refuse("data =", path->second, now.at("data"), "set --data as it was");
  }
  if (const auto f = state.find("val_fraction"); f != state.end() && f->second != now.at("val_fraction")) {
    throw refuse("--val-fraction", f->second, now.at("val_fraction"), "set --val-fraction as it was");
  }
  // --val-data is recorded but not checked: it changes what is validated, never what is trained
  // (the split of --data is --val-fraction's, checked above).
}

}  // namespace

int resume_step(const fsdp::CheckpointMetadata& state, const TrainOptions& o, const DataIdentity& data, int world,
                const std::string& where) {
  const auto now = training_state(o, data, world, 0);
  if (state.count("imported_from")) {  // coshard-ckpt import: a model and a fresh optimizer, no run to continue
    if (state.count("model") && !same_model(state.at("model"), o)) {
      throw Error(Errc::bad_config, "checkpoint " + where + " holds model " + state.at("model") + ", not --model " + o.model);
    }
    return 0;
  }
  static const std::map<std::string, std::string> fix{
      {"global_batch", "ranks x --batch x --grad-accum (or --global-batch)"}, {"seq", "--seq"},     {"seed", "--seed"},
      {"shuffle", "--shuffle"},   {"lr", "--lr"},        {"lr_schedule", "--lr-schedule"},
      {"warmup_steps", "--warmup-steps"}};
  for (const auto& [key, flag] : fix) {
    auto it = state.find(key);
    if (it == state.end()) throw Error(Errc::corrupt_file, "checkpoint " + where + " has no '" + key + "' in its training state");
    if (it->second != now.at(key)) {
      throw Error(Errc::bad_config, "checkpoint " + where + " was trained with " + key + " = " + it->second +
                                        " and this run has " + now.at(key) + ": set " + flag +
                                        " as it was to continue that run exactly");
    }
  }
  check_model_and_data(state, o, data, now, where);
  // --steps shapes only a cosine schedule: a constant one goes on, to a larger --steps or a smaller.
  const auto steps = state.find("steps");
  if (steps == state.end()) throw Error(Errc::corrupt_file, "checkpoint " + where + " has no 'steps' in its training state");
  if (steps->second != now.at("steps") && o.lr_schedule != "constant") {
    throw Error(Errc::bad_config, "checkpoint " + where + " was trained with steps = " + steps->second + " and this run has " +
                                      now.at("steps") + ": its " + o.lr_schedule + " learning-rate schedule decays over " +
                                      "--steps, so set --steps as it was to continue that run exactly (a run with "
                                      "--lr-schedule constant can be extended)");
  }
  const int step = stored_step(state, where);
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
